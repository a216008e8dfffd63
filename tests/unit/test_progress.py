"""`klsweep status --watch` and the study's progress: the runs per state, running first, and the time left
(the steps left times a step's time so far, every run's, over the runs side by side), which moves little as
runs start and finish."""

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
    # steps left, times the 160 s the runs took for their 170 steps, over the 2 runs side by side
    assert left == pytest.approx((50 + 80 + 100) * 160 / 170 / 2)
    assert progress([r for r in RUNS if r.state != "running"])[1] is None  # nothing running: no estimate
    assert progress_line(RUNS) == "2 running, 1 pending, 1 done; about 2 min left"
    assert progress_line(RUNS, eta=False) == "2 running, 1 pending, 1 done"
    # a pending run's status.json is the submission's, without total_steps: as many as the others' (the study
    # said "about 7 s left" with 35 runs of 300 steps pending)
    unsaid = [dataclasses.replace(r, total_steps=None) if r.state == "pending" else r for r in RUNS]
    assert progress(unsaid)[1] == pytest.approx(left)


def test_watch_lists_the_running_runs_first_under_the_counts():
    lines = render(watch_view(RUNS, "s", width=100), width=100).splitlines()
    assert lines[0] == "2 running, 1 pending, 1 done; about 2 min left"
    ids = [line.split()[0] for line in lines if line[:1] in "abcd" and line[1:3] == "00"]
    assert ids == ["c000000000", "d000000000", "a000000000", "b000000000"]


def _sweep_at(t: float, starts: list[float], startup: float, steps: int, step_s: float) -> list[RunStatus]:
    """The statuses at time ``t`` of runs started at ``starts``: each running ``startup`` seconds at step 0
    (its job builds the trainer; its elapsed time counts from the job's start, as ``klsweep.job`` records it),
    then ``steps`` steps of ``step_s`` seconds."""
    out = []
    for i, s in enumerate(starts):
        end = s + startup + steps * step_s
        if t < s:
            out.append(_run(f"r{i:09d}", i, "pending", 0, 0.0))
        elif t >= end:
            out.append(_run(f"r{i:09d}", i, "done", steps, end - s))
        else:
            step = max(0, int((t - s - startup) / step_s))
            out.append(_run(f"r{i:09d}", i, "running", step, t - s))
    return [dataclasses.replace(r, total_steps=steps) for r in out]


def test_the_time_left_moves_little_as_runs_start_and_finish():
    """12 runs of 60 steps on 2 slots, each 6 s starting up: once a run has finished, the end the estimate
    gives (now + time left) stays within 25% of the true end, and within 25% of itself over any 30 s (it jumped
    13 -> 6 -> 8 -> 7 -> 9 min within 30 s while each new run's first steps, start-up included, set the rate)."""
    startup, steps, step_s, slots = 6.0, 60, 0.5, 2
    free, starts = [0.0] * slots, []
    for _ in range(12):
        k = min(range(slots), key=free.__getitem__)
        starts.append(free[k])
        free[k] += startup + steps * step_s
    true_end, first_done = max(free), startup + steps * step_s
    ends = []
    t = first_done
    while t < true_end:
        left = progress(_sweep_at(t, starts, startup, steps, step_s))[1]
        assert left is not None
        ends.append((t, t + left))
        t += 2.0
    assert max(abs(end - true_end) / true_end for _, end in ends) < 0.25
    for t, _ in ends:
        window = [end for u, end in ends if t <= u <= t + 30]
        assert max(window) / min(window) < 1.25


def test_a_runs_elapsed_is_its_training_loop_and_its_start_up_is_apart(monkeypatch):
    """status.json's times (``klsweep.job``): elapsed counts the training loop only (two identical 60-step runs
    read 0.7 and 0.2 min when the first counted its worker's start-up); the start-up is its own column."""
    import time

    from klsweep.submit.state import run_times

    monkeypatch.setattr(time, "time", lambda: 1000.0)
    done = {"elapsed_s": 12.0, "startup_s": 30.0, "attempt_started_at": 900.0, "trained_from": 930.0}
    assert run_times(done, running=False) == (12.0, 30.0)
    # starting up (its loop not begun): no elapsed yet, the start-up grows
    starting = {"elapsed_s": 0.0, "startup_s": 0.0, "attempt_started_at": 990.0, "trained_from": None}
    assert run_times(starting, running=True) == (0.0, 10.0)
    # training: from its loop's start (an earlier attempt's 5 s in trained_from), start-up as recorded
    training = {"elapsed_s": 4.0, "startup_s": 7.0, "attempt_started_at": 900.0, "trained_from": 985.0}
    assert run_times(training, running=True) == (15.0, 7.0)
    # an older status.json (no start-up recorded): as before, from the run's start
    assert run_times({"elapsed_s": 1.0, "started_at": 940.0}, running=True) == (60.0, 0.0)
    runs = [dataclasses.replace(r, startup_s=30.0 if r.state == "done" else 0.0) for r in RUNS]
    lines = render(watch_view(runs, "s", width=160), width=160).splitlines()
    header = next(line for line in lines if line.startswith("run "))
    assert header.split()[-3:-1] == ["elapsed", "start-up"]
    done_row = next(line for line in lines if line.startswith("a000000000"))
    assert done_row.split()[-2:] == ["1.7m", "0.5m"]  # no job id
    # the time left spreads the start-up over the steps, as before
    assert progress(runs)[1] == pytest.approx((50 + 80 + 100) * 190 / 170 / 2)
