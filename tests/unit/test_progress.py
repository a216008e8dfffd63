"""`klsweep status --watch` and the study's progress: the runs per state, running first, and the time left
(the steps left over the steps a second the running runs make together)."""

from __future__ import annotations

import dataclasses

import pytest
from clitools import render

from klsweep.console import progress_line, watch_view
from klsweep.submit import RunStatus, progress


def _run(rid: str, seed: int, state: str, step: int, elapsed: float) -> RunStatus:
    return RunStatus(rid, {"seed": seed}, state, step, 100, None, elapsed, 0.0, None, "local", None, [])


RUNS = [
    _run("a000000000", 0, "done", 100, 100.0),
    _run("b000000000", 1, "pending", 0, 0.0),
    _run("c000000000", 2, "running", 50, 50.0),  # 1 step/s
    _run("d000000000", 3, "running", 20, 10.0),  # 2 steps/s
]


def test_progress_counts_running_first_and_estimates_the_time_left():
    counts, left = progress(RUNS)
    assert list(counts.items()) == [("running", 2), ("pending", 1), ("done", 1)]
    assert left == pytest.approx((50 + 80 + 100) / 3.0)  # steps left over 3 steps/s
    assert progress([r for r in RUNS if r.state != "running"])[1] is None  # nothing running: no estimate
    assert progress_line(RUNS) == "2 running, 1 pending, 1 done; about 77 s left"
    assert progress_line(RUNS, eta=False) == "2 running, 1 pending, 1 done"
    # a pending run's status.json is the submission's, without total_steps: as many as the others' (the study
    # said "about 7 s left" with 35 runs of 300 steps pending)
    unsaid = [dataclasses.replace(r, total_steps=None) if r.state == "pending" else r for r in RUNS]
    assert progress(unsaid)[1] == pytest.approx(left)


def test_watch_lists_the_running_runs_first_under_the_counts():
    lines = render(watch_view(RUNS, "s", width=100), width=100).splitlines()
    assert lines[0] == "2 running, 1 pending, 1 done; about 77 s left"
    ids = [line.split()[0] for line in lines if line[:1] in "abcd" and line[1:3] == "00"]
    assert ids == ["c000000000", "d000000000", "a000000000", "b000000000"]
