"""The report's summary of vLLM against the trainer (klsweep.report.engine): per-run means of the logged
per-step metrics, the lowest step's kept fraction, and a flag under the floor; runs without vLLM are left blank."""

from __future__ import annotations

import math

import pandas as pd

from klsweep.report.engine import KEPT_FLOOR, attach_engine_agreement


def test_runs_under_the_kept_floor_are_flagged():
    runs = pd.DataFrame({"run": ["low", "high", "hf"]})
    low = [KEPT_FLOOR - 0.3, KEPT_FLOOR + 0.05]  # mean under the floor
    high = [1.0, KEPT_FLOOR]
    metrics = pd.DataFrame(
        {
            "run": ["low", "low", "high", "high", "hf"],
            "step": [1, 2, 1, 2, 1],
            "vllm/kept_fraction": [*low, *high, math.nan],
            "vllm/ratio_mean": [0.9, 1.1, 1.0, 1.0, math.nan],
            "vllm/logp_mismatch": [0.02, 0.04, 0.01, 0.01, math.nan],
        }
    )
    flags = attach_engine_agreement(runs, metrics)
    assert list(runs["vllm flagged"]) == [True, False, False]
    assert runs["vllm kept"].tolist()[:2] == [sum(low) / 2, sum(high) / 2] and math.isnan(
        runs["vllm kept"][2]
    )
    assert runs["vllm min kept"].tolist()[:2] == [min(low), min(high)]
    assert runs["vllm mismatch"][0] == 0.03 and runs["vllm ratio"][0] == 1.0
    assert len(flags) == 1 and flags[0].startswith("low: ") and f"under the floor {KEPT_FLOOR}" in flags[0]


def test_a_sweep_without_vllm_gets_blank_columns():
    runs = pd.DataFrame({"run": ["a"]})
    assert attach_engine_agreement(runs, pd.DataFrame({"run": ["a"], "step": [1], "loss": [0.1]})) == []
    assert math.isnan(runs["vllm kept"][0]) and not runs["vllm flagged"][0]


def test_a_kl_panels_title_names_the_scale_its_ticks_are_on():
    """A KL panel of positive estimates is on a log scale, titled so, no 0 tick; one where an estimate is not
    positive (k1) is on a symlog scale with a 0 tick, titled "symlog (linear within ±t)" (both were titled
    "log scale", a 0 tick on a log-titled axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from klsweep.report import curves

    for values, scale in (([0.01, 0.02, 0.5], "log"), ([-0.003, 0.0, 0.02, 0.4], "symlog")):
        fig, ax = plt.subplots()
        mean = [np.array(values)]
        ax.plot(range(len(values)), values)
        thresh = curves._log_scale(ax, mean, mean, mean, [0], [])
        title = curves.scale_name([thresh])
        ticks = list(ax.yaxis.get_major_locator().tick_values(*ax.get_ylim()))
        plt.close(fig)
        assert ax.get_yscale() == scale
        if scale == "log":
            assert title == "log scale" and 0.0 not in ticks, (title, ticks)
        else:
            assert title.startswith("symlog (linear within ±") and 0.0 in ticks, (title, ticks)
    assert curves.scale_name([0.0, None]) == "log scale"
    assert curves.scale_name([0.001, 0.0]) == "symlog (linear within ±0.001)"
    assert curves.scale_name([0.001, 0.01]) == "symlog (linear near 0)"
