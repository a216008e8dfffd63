"""Metrics rows that must be set aside (issue #47 item 7): a duplicated or backwards step, a step that is not a
whole number from 1 to the run's steps, a line nested 1000 deep, a 3 GB NUL tail. Every reader of metrics.jsonl
goes through one validator (``klsweep.store.metrics``): the report's numbers are those of the clean file and its
"Set aside" names each line and why; ``klsweep status`` and a resume read the same rows. The hostile files are
read by ``klsweep`` in a subprocess under a timeout and an address-space limit."""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import sweepgen

from klsweep import report as rp
from klsweep import store

STEPS = 20
BAD = {"reward_mean": 1.0, "kl_k1": 9.0, "kl_k3": 9.0, "entropy": 0.0}  # a row that would move every number
COLUMNS = ["final reward", "peak reward", "peak KL k1", "peak KL k3", "min entropy", "last logged step"]

# case -> (where the row goes: after the row of this step, or None: at the end; its step; what "Set aside" says)
CASES = {
    "duplicated step": (10, 10, "line 11 (step 10 again)"),
    "duplicated last step": (None, 20, "line 21 (step 20 again)"),
    "backwards step": (12, 3, "line 13 (step 3 after step 12)"),
    "step 8.5": (5, 8.5, "line 6 (step 8.5)"),
    "step true": (5, True, "line 6 (step true)"),
    "step -3": (5, -3, "line 6 (step -3)"),
    "step 1e30": (5, 1e30, "line 6 (step 1e+30)"),
    "step 10**30": (5, 10**30, f"line 6 (step {10**30})"),
    "step six": (5, "six", 'line 6 (step "six")'),
    "step null": (5, None, "line 6 (step null)"),
    "step NaN": (5, math.nan, "line 6 (step NaN)"),
    "past the run's steps": (None, 21, "line 21 (step 21)"),
}
ORDER = (
    "their step not after the step before (a step written again, or going backwards; the earlier row is kept)"
)
WHOLE = f"their step not a whole number from 1 to {STEPS} (the run's steps)"


def _lines(run: Path) -> list[str]:
    return (run / store.METRICS_FILE).read_text().splitlines(keepends=True)


def _insert(run: Path, after: int | None, line: str) -> None:
    lines = _lines(run)
    lines.insert(len(lines) if after is None else after, line)
    (run / store.METRICS_FILE).write_text("".join(lines))


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """A sweep whose runs each hold one case (run -> case), its report before and after the damage."""
    tmp = tmp_path_factory.mktemp("rows")
    grid = [
        {"kl.estimator": e, "kl.placement": p, "kl.beta": 0.1}
        for e in ("k1", "k2")
        for p in ("reward", "loss", "both")
    ]
    sweep = sweepgen.write_sweep(tmp / "s", grid, seeds=2, steps=STEPS)
    clean = rp.build_report(sweep, tmp / "clean", formats=("csv",), wandb=False).runs.set_index("run")
    runs = dict(zip(sorted(store.run_dirs(sweep)), CASES, strict=False))
    for run, case in runs.items():
        after, step, _ = CASES[case]
        _insert(run, after, json.dumps({"step": step, **BAD}) + "\n")
    report = rp.build_report(sweep, tmp / "r", formats=("md",), wandb=False)
    cached = rp.build_report(sweep, tmp / "r", formats=("md",), wandb=False)  # from the report's cache
    return {case: run for run, case in runs.items()}, clean, report, cached


@pytest.mark.parametrize("case", list(CASES))
def test_a_row_set_aside_changes_no_number_and_is_listed(damaged, case):
    """The run's final and peak reward, peak KLs, lowest entropy and last step are the clean file's (a
    duplicated step moved the final reward and peak KL, a step going backwards the peak reward; 8.5, true, -3
    and 1e30 counted; "six", null, NaN were a ValueError), and "Set aside" names the line, its step and why."""
    runs, clean, report, cached = damaged
    run = runs[case]
    got = report.runs.set_index("run").loc[run.name, COLUMNS]
    pd.testing.assert_series_equal(got, clean.loc[run.name, COLUMNS], check_dtype=False)
    why = ORDER if "duplicated" in case or "backwards" in case else WHOLE
    _, _, said = CASES[case]
    (note,) = [s for s in report.set_aside if str(run) in s]
    assert (
        note == f"{run / store.METRICS_FILE}: 1 row(s) set aside, {why}: {said}; the other rows are reported"
    )
    assert [s for s in cached.set_aside if str(run) in s] == [note]


def test_status_shows_the_rows_kept(damaged):
    """``klsweep status`` shows the reward of the last row kept: not that of a step written again at the end."""
    from klsweep import submit

    runs, clean, _, _ = damaged
    shown = {s.run_id: s for s in submit.status(runs["duplicated last step"].parent)}
    for case in ("duplicated last step", "past the run's steps"):
        run = runs[case]
        last = json.loads(_lines(run)[STEPS - 1])
        assert shown[run.name].reward == last["reward_mean"] != BAD["reward_mean"], case


def _limited(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def _klsweep(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """``klsweep ARGS`` in a subprocess with 2.5 GiB of address space (a report drawing its figures needs ~2 GiB; less than the 3 GB file), under ``timeout``."""
    env = {**os.environ, "COLUMNS": "400"}
    return subprocess.run(
        [sys.executable, "-m", "klsweep.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        preexec_fn=_limited(5 << 29),
    )


def _nested(run: Path) -> str:
    _insert(run, None, "[" * 1000 + "]" * 1000 + "\n")  # the last line
    return "1 unreadable line(s) skipped (line 21): nested too deep"


def _nul_tail(run: Path) -> str:
    path = run / store.METRICS_FILE
    with path.open("r+b") as f:  # 3 GB of NUL bytes, sparse: a file system's hole after a crash
        f.truncate(path.stat().st_size + (3 << 30))
    return "1 unreadable line(s) skipped (line 21): longer than 1 MiB"


def _sweep(tmp_path: Path) -> tuple[Path, Path]:
    grid = [{"kl.estimator": e, "kl.placement": "loss", "kl.beta": 0.1} for e in ("k1", "k3")]
    sweep = sweepgen.write_sweep(tmp_path / "s", grid, seeds=1, steps=STEPS)
    return sweep, sorted(store.run_dirs(sweep))[0]


@pytest.mark.parametrize("damage", [_nested, _nul_tail], ids=["nested 1000 deep", "3 GB NUL tail"])
def test_a_hostile_line_is_set_aside_by_report(tmp_path, damage):
    """A line nested 1000 deep was a RecursionError in `report`, a 3 GB NUL tail a MemoryError. Each is one
    unreadable line, listed; the numbers are the clean file's."""
    sweep, run = _sweep(tmp_path)
    rp.build_report(sweep, tmp_path / "clean", formats=("csv",), wandb=False)
    clean = pd.read_csv(tmp_path / "clean" / "runs.csv").set_index("run")  # as written: 4 significant digits
    said = damage(run)
    done = _klsweep(["report", sweep, "--out", tmp_path / "r", "-f", "csv"])
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"{run / store.METRICS_FILE}: {said}; the other rows are reported" in " ".join(done.stderr.split())
    got = pd.read_csv(tmp_path / "r" / "runs.csv").set_index("run").loc[run.name, COLUMNS]
    pd.testing.assert_series_equal(got, clean.loc[run.name, COLUMNS], check_dtype=False, check_names=False)


def test_a_last_line_nested_1000_deep_is_no_traceback_in_status(tmp_path):
    """As the last line, a line nested 1000 deep was a RecursionError in `status` (``_last_line`` caught only
    JSONDecodeError): `status` shows the reward of the last row kept before it."""
    sweep, run = _sweep(tmp_path)
    reward = f"{json.loads(_lines(run)[STEPS - 1])['reward_mean']:.3f}"
    _nested(run)
    shown = _klsweep(["status", sweep])
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr[-3000:]
    (line,) = [line for line in shown.stdout.splitlines() if line.startswith(run.name)]
    assert f"{STEPS}/{STEPS}" in line.split() and reward in line.split(), line


def test_a_resume_cuts_after_the_rows_kept_and_goes_on_from_them(tmp_path):
    """A resume from checkpoint-4 of a file with a step going backwards, a duplicated step and a step "six"
    before it (a TypeError before: `"six" > 4`) and a 10**30 step after step 4 (once taken as the first row
    past the checkpoint: the rows after it cut): the cut is just before step 5, every line before it stays,
    and the rows the resumed run goes on from (its collapse rule's) are those every reader keeps."""
    rows = [{"step": s, "reward_mean": 0.5} for s in (1, 2, 1, 3, "six", 3, 4)]
    rows.insert(6, {"step": 10**30, "reward_mean": 1.0})
    lines = [json.dumps(r) + "\n" for r in rows] + [json.dumps({"step": s}) + "\n" for s in (5, 6)]
    path = tmp_path / store.METRICS_FILE
    path.write_text("".join(lines) + '{"step": 7, "rew')
    kept = store.cut_metrics(tmp_path, 4, max_step=6)
    assert [r["step"] for r in kept.rows] == [1, 2, 3, 4]
    assert [(a.line, a.kind) for a in kept.aside] == [(3, "order"), (5, "step"), (6, "order"), (7, "step")]
    assert path.read_text() == "".join(lines[:8])  # cut before step 5's row
    store.append_jsonl(path, {"step": 5})
    assert [r["step"] for r in store.read_metrics(tmp_path, 6)] == [1, 2, 3, 4, 5]
    assert store.metrics.last_row(path, 6) == {"step": 5}


def test_long_lines_are_skipped_and_the_rows_after_them_kept(tmp_path):
    """A line longer than the bound (here 2 MiB of NUL bytes, then a newline) is skipped without being held
    whole, and the rows after it are read; a blank line is nothing."""
    path = tmp_path / store.METRICS_FILE
    with path.open("wb") as f:
        f.write(b'{"step": 1}\n' + b"\0" * (2 << 20) + b'\n\n{"step": 2, "kl_k1": "x"}\n{"step": 3}')
    found = store.metrics.read(path, 3)
    assert [r for r in found.rows] == [{"step": 1}, {"step": 2}, {"step": 3}]
    assert found.notes() == [
        f"{path}: 1 unreadable line(s) skipped (line 2): longer than 1 MiB; the other rows are reported",
        f"{path}: 'kl_k1' not a number in 1 row(s) (step 2): left out as not logged there; the curves, peaks "
        "and finals are of the other rows",
    ]
