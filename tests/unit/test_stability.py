"""The per-run stability columns of a report (``klsweep.report.stability.attach_stability``): the reward drop,
the continuous instability endpoint of the tiny study's claim (a) (docs/STUDY.md, "Study v4")."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from klsweep.collapse import REASON
from klsweep.report import stability


def test_the_reward_drop_is_the_share_of_the_peak_lost_by_the_end():
    """1 - final / peak of the smoothed reward; a run that diverged (not a collapse stop) lost everything; a
    run stopped for a collapse has the drop its curve shows; no positive peak: no drop to speak of (NaN)."""
    curves = {
        "rises": [0.1, 0.2, 0.3, 0.4],  # smoothed (window 2): 0.1 0.15 0.25 0.35: ends at its peak
        "falls": [0.5, 0.5, 0.1, 0.1],  # 0.5 0.5 0.3 0.1: 0.1 of a peak 0.5 left
        "broken": [0.4, 0.4, 0.4, 0.4],  # diverged (a NaN loss) after a steady reward
        "stopped": [0.4, 0.4, 0.1, 0.1],  # stopped for a collapse: 0.4 0.4 0.25 0.1
        "zero": [0.0, 0.0, 0.0, 0.0],
    }
    runs = pd.DataFrame(
        {
            "run": list(curves),
            "state": ["done", "done", "diverged", "diverged", "done"],
            "reason": [None, None, "loss is nan", f"{REASON}: mean task reward ...", None],
            "diverged_step": [None, None, 3, 3, None],
        }
    )
    metrics = pd.DataFrame(
        [{"run": r, "step": s + 1, "reward_mean": v} for r, c in curves.items() for s, v in enumerate(c)]
    )
    stability.attach_stability(runs, metrics, 2, {})
    drop = dict(zip(runs["run"], runs["reward drop"], strict=True))
    assert drop["rises"] == pytest.approx(0.0)
    assert drop["falls"] == pytest.approx(0.8)
    assert drop["broken"] == 1.0
    assert drop["stopped"] == pytest.approx(0.75)
    assert math.isnan(drop["zero"])
    assert "reward drop" in stability.STABILITY_STATS  # a column of the stability table, mean and CI


def test_collapse_steps_are_kept_per_metrics_file_and_rule(tmp_path, monkeypatch):
    """Each run's collapse step is kept beside the report (``COLLAPSE_CACHE``), keyed by its metrics file and
    its rule: the next report of the same files takes it from there, a changed file or rule finds it again."""
    from klsweep.collapse import Rule

    rewards = [0.6] * 30 + [
        0.05
    ] * 20  # collapses at window 5, not at a window of 40 (the drop comes too late)
    folders = {"r0": tmp_path / "r0"}
    folders["r0"].mkdir()
    (folders["r0"] / "metrics.jsonl").write_text("{}\n")
    cache = tmp_path / "report" / stability.COLLAPSE_CACHE
    cache.parent.mkdir()

    def collapse(rule: Rule) -> object:
        runs = pd.DataFrame({"run": ["r0"], "state": ["done"], "reason": [None], "diverged_step": [None]})
        metrics = pd.DataFrame(
            {"run": "r0", "step": range(1, 51), "reward_mean": rewards, "reward_std": [0.3] * 50}
        )
        stability.attach_stability(runs, metrics, 2, {"r0": rule}, folders, cache)
        return runs["collapse_step"][0]

    short, long = Rule(5, 0.5, 3.0, 16), Rule(40, 0.5, 3.0, 16)
    found = collapse(short)
    assert found is not None and 31 <= found <= 40 and cache.is_file()
    real = stability.collapse_step
    monkeypatch.setattr(stability, "collapse_step", lambda *a: pytest.fail("found again, not kept"))
    assert collapse(short) == found
    monkeypatch.setattr(stability, "collapse_step", real)
    assert collapse(long) is None  # another rule: found again
    (folders["r0"] / "metrics.jsonl").write_text("{}\n{}\n")  # another file: found again
    monkeypatch.setattr(stability, "collapse_step", lambda *a: -1)
    assert collapse(short) == -1
