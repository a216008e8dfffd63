"""`klsweep plan` of a local sweep gives its wall time scaled from the tiny study's measured one (it said `at most
0.0 GPU-hours`, then nothing), and the study's time is one number from one place (`planner.walltime.MEASURED`):
the README quoted ~20 min, INSTALL.md ~10 min, tiny.yaml 13-21 minutes, starter.yaml about 10 minutes for 24
runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from clitools import cli

from klsweep import grid
from klsweep.planner import walltime

REPO = Path(__file__).resolve().parents[2]


def test_the_calibration_gives_back_the_study_it_was_measured_on():
    plan = grid.load_plan("tiny")
    assert len(plan.runs) == walltime.MEASURED.runs
    wall = walltime.estimate(plan, plan.runs, workers=walltime.MEASURED.workers)
    assert wall is not None
    assert wall.train_s == pytest.approx(walltime.MEASURED.train_s)
    assert wall.eval_s == pytest.approx(walltime.MEASURED.eval_s, rel=0.02)  # 128 runs + baseline of 129
    assert wall.total_s == pytest.approx(walltime.MEASURED.total_s, rel=0.01)
    # fewer steps, completions, problems or more cores: less time
    small = grid.load_plan("tiny", ["seed=0", "train.steps=30", "eval.limit=10"])
    less = walltime.estimate(small, small.runs, workers=2)
    assert less is not None and less.total_s < wall.total_s / 5
    four = walltime.estimate(plan, plan.runs, workers=4)
    assert four is not None and four.train_s < wall.train_s * 0.55
    # the exact numerics path: its step as measured against the fast one's (STEP_COST)
    exact = grid.load_plan("tiny", ["train.numerics=exact"])
    slower = walltime.estimate(exact, exact.runs, workers=2)
    assert slower is not None
    steps = wall.train_s - walltime.MEASURED.worker_start_s
    assert slower.train_s - walltime.MEASURED.worker_start_s == pytest.approx(steps * 809 / 538)


def test_plan_says_a_local_sweeps_wall_time_and_where_it_is_from(monkeypatch, capsys):
    monkeypatch.setattr("klsweep.environment.usable_cores", lambda: 2)
    code, out, _ = cli(["plan", "tiny"], monkeypatch, capsys)
    flat = " ".join(out.split())
    assert code == 0, out
    assert "about 11 min here on 2 workers (training 10 min, eval 77 s, report 4 s)" in flat, flat
    assert "scaled from study v6's time measured on an idle 2-core Intel Xeon VM" in flat
    assert "GPU-hours" not in flat
    code, out, _ = cli(["plan", "tiny", "--json"], monkeypatch, capsys)
    assert '"total_s": 669' in out and '"workers": 2' in out


def test_no_time_for_a_model_it_was_not_measured_on():
    plan = grid.load_plan("paper")
    assert walltime.estimate(plan, plan.runs) is None


def test_the_study_time_is_one_number_from_one_place():
    said = walltime.study_minutes()
    assert said == "about 11 min"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"report ({said})" in readme
    readme = "\n".join(line for line in readme.splitlines() if "dev.sh test" not in line)  # the tests' time
    # no other time for a shipped grid's study: `klsweep plan NAME` says it
    texts = {
        "README.md": readme,
        "docs/INSTALL.md": (REPO / "docs" / "INSTALL.md").read_text(encoding="utf-8"),
        **{
            f"sweeps/{p.name}": "\n".join(
                line for line in p.read_text().splitlines()[:12] if line.startswith("#")
            )
            for p in (REPO / "sweeps").glob("*.yaml")
            if p.name != "tiny-regime.yaml"  # an exploration's own time, not a study's
        },
    }
    pattern = re.compile(r"(~|about |in )\d+(-\d+)?\s*(min|minutes)\b")
    quoted = {name: pattern.findall(text) for name, text in texts.items()}
    assert {n: q for n, q in quoted.items() if q} == {"README.md": [("about ", "", "min")]}


def test_a_plan_of_one_run_says_one_run(monkeypatch, capsys, tmp_path):
    """`klsweep plan` of one run read `1 runs, 0 excluded`."""
    overrides = [
        "seed=0",
        "kl.estimator=k1",
        "kl.placement=reward",
        "offpolicy.lag=0",
        "--out",
        str(tmp_path),
    ]
    code, out, _ = cli(["plan", "starter", *overrides], monkeypatch, capsys)
    assert code == 0 and "1 run, 0 excluded" in out, out
