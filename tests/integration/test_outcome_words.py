"""One vocabulary for an unstable outcome: status, the report's stability table and its claims say what
diverged, collapsed and unstable mean wherever they use them."""

from __future__ import annotations

import shutil
from pathlib import Path

from clitools import cli

from klsweep.collapse import OUTCOME_WORDS

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sweep_tiny"


def test_status_and_report_say_what_the_words_mean(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep_tiny"
    shutil.copytree(FIXTURE, sweep)
    claims = tmp_path / "claims.yaml"
    claims.write_text(
        "claims:\n  - {name: k3 less stable, metric: unstable, test: fisher, direction: greater,\n"
        "     a: {kl.estimator: k3}, b: {kl.estimator: k1}}\n"
    )
    words = " ".join(OUTCOME_WORDS.split())
    code, out, _ = cli(["status", sweep], monkeypatch, capsys, columns=100)
    assert "diverged" in out and words in " ".join(out.split())  # the fixture has a diverged run
    code, out, err = cli(["report", sweep, "--out", tmp_path / "r", "--claims", claims], monkeypatch, capsys)
    assert code == 0, err
    flat = " ".join(out.split())
    stability, claims_table = flat.split("The study's claims")
    assert words in stability and words in claims_table
