"""Claims whose two sides share runs (issue #47 item 11): a side that is a subset of the other, or two sides that
cross (k3 against the loss placement: k3 in the loss on both), were accepted and tested a group against part of
itself. The plan refuses them with the grid's other problems, at once, naming the claim, the runs and the
filters that select them; sides kept apart by the no-KL runs (their KL-only keys read as "no KL") or by the
audit's verdict are not refused."""

from __future__ import annotations

from clitools import cli
from gridfiles import nothing_under, write

GRID = """\
name: c
base: {model: tiny, task: tiny}
grid:
  kl.estimator: k1,k3
  kl.placement: reward,loss
  kl.beta: 0,0.1
  seed: range(2)
exclude:
  - {kl.estimator: k2}
claims:
"""
CLAIM = "  - {{name: {}, metric: in_domain, test: welch, direction: greater, a: {}, b: {}}}\n"


def test_overlapping_claim_sides_are_refused_with_the_grid_s_other_problems(tmp_path, monkeypatch, capsys):
    text = GRID + "".join(
        CLAIM.format(*claim)
        for claim in [
            ("subset", "{kl.estimator: k3}", "{kl.estimator: [k1, k3]}"),
            ("crossing", "{kl.estimator: k3}", "{kl.placement: loss}"),
            ("beta", "{kl.beta: 0.2}", "{kl.beta: 0}"),
            ("no KL", "{kl.estimator: k1, kl.placement: loss}", "{kl.beta: 0}"),
            ("verdicts", "{unbiased: true}", "{unbiased: false}"),
        ]
    )
    out = tmp_path / "results"
    code, _, err = cli(["plan", write(tmp_path, text), "--out", out], monkeypatch, capsys)
    said = " ".join(err.split())
    assert code == 2 and "Traceback" not in err, err
    assert "invalid grid: 4 problems" in said, said  # the overlaps with the grid's other problems, at once
    assert "exclude[0]: {kl.estimator: k2} matches no run" in said
    assert "claims (beta).a.kl.beta: 0.2: no run of this grid has it" in said
    for name, runs, selectors in [
        ("subset", 4, "kl.estimator: k3"),
        ("crossing", 2, "kl.estimator: k3, kl.placement: loss"),
    ]:
        assert f"claims ({name}).b: a and b overlap: {runs} run(s) on both sides (" in said, (name, said)
        assert f"), those with {selectors} (allowed: sides with no run in common" in said, (name, said)
    assert "(no KL)" not in said and "(verdicts)" not in said
    assert nothing_under(out)
    fixed = GRID.replace("exclude:\n  - {kl.estimator: k2}\n", "") + CLAIM.format(
        "crossing", "{kl.estimator: k3, kl.placement: loss}", "{kl.estimator: k1, kl.placement: loss}"
    )
    code, _, err = cli(["plan", write(tmp_path, fixed, "fixed.yaml"), "--out", out], monkeypatch, capsys)
    assert code == 0, err
