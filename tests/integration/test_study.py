"""The tiny study end to end, shortened: `klsweep study sweeps/tiny.yaml` on the local executor and on the
real local Slurm cluster (train -> eval -> report)."""

from __future__ import annotations

from pathlib import Path

import pytest

from klsweep import store
from klsweep.study import run_study

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "sweeps" / "tiny.yaml"
# k1 in the reward, the loss and both, plus the no-KL baseline, and the beta arm's k1 in the reward, the loss
# and both at beta 2 and 3 (its k3 in both is k1 in both under kl.estimator=k1): 10 runs of 3 steps, 8 eval
# problems per task (on-policy: the lag arm's k1 runs, without their importance weights, are the on-policy arm's).
SHORT = [
    "seed=0",
    "offpolicy.lag=0",
    "kl.estimator=k1",
    "kl.importance=none",
    "train.steps=3",
    "train.save_steps=3",
    "eval.limit=8",
]


def _check_study(res, out: Path) -> None:
    sweep = out / "tiny"
    assert res.sweep_dir == sweep
    assert len(res.runs) == 10
    assert {r.state for r in res.runs} <= {"done", "diverged"}, [(r.run_id, r.state) for r in res.runs]
    # the status the study ends with is taken after the eval: its eval column is filled
    assert {r.eval_state for r in res.runs} == {"done"}, [(r.run_id, r.eval_state) for r in res.runs]
    for run_dir in store.run_dirs(sweep):
        assert [m["step"] for m in store.read_metrics(run_dir)] == [1, 2, 3]
        results = list(run_dir.glob("eval/*/checkpoint-3/results.json"))
        assert len(results) == 1, run_dir
        metrics = store.read_json(results[0])["metrics"]
        # the grid's eval settings (eval.limit=8), not the suite file's defaults (64 problems)
        assert store.read_json(results[0])["settings"]["limit"] == 8
        assert len((results[0].parent / "samples_tiny_add.jsonl").read_text().splitlines()) == 8
        assert set(metrics["in_domain"]) == {"tiny_add"} and set(metrics["ood"]) == {"tiny_sub", "tiny_rev"}
        # the run's logs/: its training job's output and its part of the eval job's
        logs = {p.name.split("-")[0] + p.suffix for p in (run_dir / "logs").iterdir()}
        assert logs == {"train.out", "train.err", "eval.out", "eval.err"}, run_dir
    assert list(sweep.glob("baseline/*/eval/*/step-0/results.json"))
    report = (sweep / "report" / "report.md").read_text()
    for placement in ("reward", "loss", "both", "no KL"):
        assert placement in report
    assert "step-0" in report
    assert (sweep / "report" / "curves.png").stat().st_size > 10_000
    assert (sweep / "report" / "main.tex").exists()
    assert not res.eval.errors
    # the runs mirrored to W&B offline: the report writes no offline W&B run unless asked (publish.py)
    assert list(sweep.glob("*/wandb/offline-run-*"))
    assert res.report.wandb_run is None and not (sweep / "report" / "wandb").exists()


@pytest.mark.slow
def test_tiny_study_shortened_local(tmp_path: Path) -> None:
    seen = []  # the eval's progress (it was silent for a minute: lm-eval's start, then every checkpoint)
    res = run_study(
        TINY, SHORT, cluster="local", out=tmp_path, formats=("md", "latex"), on_eval_progress=seen.append
    )
    _check_study(res, tmp_path)
    assert seen[0].scored == 0 and seen[0].left_s is None  # nothing scored yet: no time left said
    assert (seen[-1].scored, seen[-1].total, seen[-1].jobs) == (11, 11, 0)  # 10 runs and the step-0 baseline
    assert [p.scored for p in seen] == sorted(p.scored for p in seen)
    assert all(p.left_s is not None for p in seen if 0 < p.scored < p.total and p.jobs)
    # Rerunning submits nothing and evaluates nothing again.
    mtimes = {p: p.stat().st_mtime for p in tmp_path.glob("tiny/*/eval/*/*/results.json")}
    # ... and, told to expect the verdicts of a report whose runs trained on another CPU, compares them and
    # says that the CPUs differ
    expected = tmp_path / "expected" / "claims.csv"
    expected.parent.mkdir()
    res.report.claims.to_csv(expected, index=False)  # the verdicts as this study's: none differs
    (expected.parent / "environment.csv").write_text("cpu,cpu kernels,runs\nAnother CPU,AVX2,4\n")
    again = run_study(TINY, SHORT, cluster="local", out=tmp_path, formats=("md",), expect_claims=expected)
    assert {p: p.stat().st_mtime for p in tmp_path.glob("tiny/*/eval/*/*/results.json")} == mtimes
    assert len(again.runs) == 10
    assert again.claim_changes == []
    assert again.cpu_note and "trained on Another CPU, these on " in again.cpu_note


@pytest.mark.slow
@pytest.mark.slurm
def test_tiny_study_shortened_on_slurm(tmp_path: Path) -> None:
    res = run_study(TINY, SHORT, cluster="slurm", out=tmp_path, formats=("md", "latex"))
    _check_study(res, tmp_path)
    jobs = store.read_jsonl(tmp_path / "tiny" / store.JOBS_FILE)
    assert {j["cluster"] for j in jobs} == {"slurm"}
    assert {j["kind"] for j in jobs} == {"train", "eval"}


CANCELLED = (  # two runs of the tiny model, a few steps: never trained here (their folders say cancelled)
    "name: {name}\nbase: {{model: tiny, task: tiny, eval: tiny, eval.limit: 4, train.steps: 2,\n"
    "  train.save_steps: 2, wandb.mode: disabled}}\ngrid: {{seed: range(2)}}\n"
)


def test_a_rerun_after_a_cancel_says_so_and_exits_1(tmp_path: Path, monkeypatch, capsys) -> None:
    """Issue 51: after Ctrl-C and `klsweep cancel`, rerunning `klsweep study` printed `2 cancelled ... eval ...
    report ... study done` and exited 0, training nothing (and its report's hint, `klsweep eval` scores them,
    could not apply). It says what it does with the cancelled runs before waiting, evaluates and reports
    nothing when no run trained to its end, ends with `0 of 2 runs done: 2 cancelled (... --retry-failed)` and
    exits 1."""
    from clitools import cli

    from klsweep import grid
    from klsweep.config import run_file_text

    grid_file = tmp_path / "mine.yaml"
    grid_file.write_text(CANCELLED.format(name="mine"))
    out = tmp_path / "res"
    for run in grid.load_plan(grid_file, out=out).runs:  # as `klsweep cancel` leaves them
        Path(run.run_dir).mkdir(parents=True)
        (Path(run.run_dir) / store.CONFIG_FILE).write_text(run_file_text(run.config))
        store.write_status(run.run_dir, "cancelled")
    code, stdout, _ = cli(["study", grid_file, "--out", out], monkeypatch, capsys)
    assert code == 1, stdout
    flat = " ".join(stdout.split())
    assert "2 cancelled before: not trained again" in flat, stdout
    assert flat.index("2 cancelled before") < flat.index("0 of 2 runs done")  # said first, then the summary
    assert f"0 of 2 runs done: 2 cancelled (klsweep study {grid_file} --out {out} --retry-failed)" in flat
    assert "study done" not in flat and "klsweep eval" not in flat
    assert not (out / "mine" / "report").exists() and not (out / "mine" / store.BASELINE_DIR).exists()
    assert {store.read_status(d)["state"] for d in store.run_dirs(out / "mine")} == {"cancelled"}


GROWN = """\
name: grown
base: {model: tiny, task: tiny, eval: tiny, eval.limit: 4, train.steps: 3, train.save_steps: 3, kl.beta: 1,
  kl.estimator: k1, kl.placement: loss, wandb.mode: disabled}
grid:
  - seed: range(3)
  - kl.beta: 0.0
    seed: range(3)
seeds: {pilot: 2}
claims:
  - name: k1 in the loss has a higher peak KL than no KL
    metric: peak_kl
    test: welch
    direction: greater
    effect: 1.0e-9  # no 3 seeds can power it: the rule spends the budget
    a: {kl.beta: 1}
    b: {kl.beta: 0}
"""


@pytest.mark.slow
def test_a_study_with_a_seed_rule_trains_the_pilot_then_the_seeds_it_decides(tmp_path: Path) -> None:
    """Issue 49, item 2: the grid's seeds: rule. The study trains the pilot (2 seeds of each configuration),
    decides from it (the claim cannot be powered at 3 seeds: the budget, 3, is spent), adds the third seeds in
    the same grid (same folder and grid text, not refused as another grid's), and the report states the rule
    and what it chose; the decision is reproducible from the report's runs.csv."""
    import pandas as pd

    from klsweep import grid
    from klsweep.grid import seeds
    from klsweep.grid.claims import read_claims_file
    from klsweep.report.seedrule import DECISION_FILE, decide

    grid_file = tmp_path / "grown.yaml"
    grid_file.write_text(GROWN)
    stages: list[str] = []
    res = run_study(grid_file, out=tmp_path, formats=("md", "csv"), on_stage=stages.append)
    said = "\n".join(stages)
    assert "pilot: 4 runs, the first 2 seeds of each configuration" in said, said
    assert "train: 4 runs (the pilot) on local" in said
    assert "inconclusive at 3 seeds; more than 1000 would" in said
    assert "train: 6 runs (the pilot and the 2 runs the rule adds: the same grid) on local" in said
    sweep = tmp_path / "grown"
    assert len(res.runs) == 6 and {r.state for r in res.runs} <= {"done", "diverged"}
    (d,) = res.seeds
    assert (d.seeds, d.budget, d.decided, d.needed) == (3, 3, False, None)
    assert 0 <= d.false_positive <= 0.1
    sweep_file = store.read_sweep_file(sweep)
    assert sweep_file["grid"] == GROWN and "earlier_grids" not in sweep_file
    report = (sweep / "report" / "report.md").read_text()
    assert "## Seeds: the rule fixed in advance, and what it chose" in report
    assert "k1 in the loss has a higher peak KL than no KL: inconclusive at 3 seeds" in report
    table = pd.read_csv(sweep / "report" / "seeds.csv")
    assert list(table["seeds"]) == [3] and (sweep / DECISION_FILE).exists()
    # reproducible: the rule on the report's runs.csv (the pilot's runs: the first 2 seeds) decides the same
    plan = grid.load_plan(grid_file, out=tmp_path)
    lists = seeds.seed_lists(plan.runs)
    runs = pd.read_csv(sweep / "report" / "runs.csv")
    again = decide(
        runs,
        None,
        read_claims_file(grid_file),
        plan.seed_rule,
        {r.id: c for c, rs in lists.items() for r in rs},
        {c: len(rs) for c, rs in lists.items()},
        pilot=seeds.pilot_ids(plan.runs, plan.seed_rule),
    )
    assert again[0].line() == d.line()
