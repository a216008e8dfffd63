"""An evaluation waited for says how far it has come (`klsweep study` and `klsweep eval --wait` were silent for
a minute while lm-eval started and scored): the checkpoints scored of those it scores and the time left at
their pace, the one estimate training's time left uses (``submit.time_left``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from klsweep.console import eval_progress_line
from klsweep.submit import EvalProgress, progress, time_left
from klsweep.submit.evals import _follow


def test_the_time_left_of_training_and_of_eval_is_one_estimate():
    assert time_left(100.0, 50, 150, 2) == pytest.approx(150.0)  # 2 s a unit, over 2 workers
    assert time_left(100.0, 0, 150, 2) is None and time_left(100.0, 5, 5, 0) is None
    assert progress.__module__ == time_left.__module__


def test_the_eval_line_says_what_is_scored_and_the_time_left():
    assert eval_progress_line(EvalProgress(0, 3, None, 2)) == "eval: 0 of 3 checkpoints scored"
    assert (
        eval_progress_line(EvalProgress(1, 3, 50.0, 2)) == "eval: 1 of 3 checkpoints scored; about 50 s left"
    )
    assert eval_progress_line(EvalProgress(1, 1, 0.0, 0)) == "eval: 1 of 1 checkpoint scored"


class _Job:
    """A submitit job at its boundary: done once its results are written."""

    def __init__(self, results: list[Path]):
        self.results = results

    def done(self) -> bool:
        return all(p.is_file() for p in self.results)


def test_following_the_jobs_reports_each_checkpoint_scored(tmp_path, monkeypatch):
    """Two jobs scoring three checkpoints: a report every poll, the count rising, the time left once one is
    scored, the last report when every job has ended."""
    results = [tmp_path / f"c{i}" / "results.json" for i in range(3)]
    jobs = [_Job(results[:2]), _Job(results[2:])]
    seen: list[EvalProgress] = []
    clock = [1000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])

    def sleep(s: float) -> None:  # each poll, a checkpoint is scored 10 s later
        clock[0] += 10
        left = [p for p in results if not p.is_file()]
        left[0].parent.mkdir()
        left[0].write_text("{}")

    monkeypatch.setattr(time, "sleep", sleep)
    _follow(jobs, results, seen.append)
    assert [(p.scored, p.total, p.jobs) for p in seen] == [(0, 3, 2), (1, 3, 2), (2, 3, 1), (3, 3, 0)]
    assert seen[0].left_s is None
    # 1 scored in 2 jobs x 10 s: 20 s a checkpoint, 2 left over 2 jobs
    assert seen[1].left_s == pytest.approx(20.0)
