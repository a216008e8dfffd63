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
