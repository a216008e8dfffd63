"""The generation engine against the trainer, per run, for runs that generated with vLLM (``train.use_vllm``):
the trainer logs, each step, the fraction of units TRL's importance-sampling correction keeps
(``vllm/kept_fraction``), their mean ratio pi_trainer/pi_vllm (``vllm/ratio_mean``) and the mean absolute
per-token log-prob difference (``vllm/logp_mismatch``) (``klsweep.grpo.engine_agreement``). A run whose mean
kept fraction is under ``KEPT_FLOOR`` is flagged: its policy loss was computed on few of its samples, and its arm
no longer compares what the others compare (docs/DESIGN.md, "vLLM on a CPU")."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

KEPT_FLOOR = 0.9  # a run whose steps kept, on average, fewer of their units than this is flagged
# runs column <- metrics.jsonl key, averaged over the run's steps
COLUMNS = {
    "vllm kept": "vllm/kept_fraction",
    "vllm ratio": "vllm/ratio_mean",
    "vllm mismatch": "vllm/logp_mismatch",
}


def attach_engine_agreement(runs: pd.DataFrame, metrics: pd.DataFrame) -> list[str]:
    """Adds the ``COLUMNS`` (means over each run's steps; NaN for a run that logged none), ``vllm min kept`` (its
    lowest step) and ``vllm flagged`` to ``runs``; returns one line per flagged run."""
    import numpy as np

    present = [c for c in COLUMNS.values() if c in metrics]
    means = metrics.groupby("run")[present].mean() if present and len(metrics) else None
    for column, key in COLUMNS.items():
        runs[column] = (
            runs["run"].map(means[key]).astype(float) if means is not None and key in means else np.nan
        )
    lowest = (
        metrics.groupby("run")[COLUMNS["vllm kept"]].min()
        if means is not None and COLUMNS["vllm kept"] in means
        else None
    )
    runs["vllm min kept"] = runs["run"].map(lowest).astype(float) if lowest is not None else np.nan
    runs["vllm flagged"] = runs["vllm kept"] < KEPT_FLOOR
    return [
        f"{run}: vLLM's samples kept by the importance-sampling correction: {kept:.2f} on average (lowest "
        f"step {low:.2f}), under the floor {KEPT_FLOOR}; mean ratio {ratio:.3f}, mean |log-prob difference| "
        f"{gap:.2g}"
        for run, kept, low, ratio, gap in zip(
            runs["run"][runs["vllm flagged"]],
            runs["vllm kept"][runs["vllm flagged"]],
            runs["vllm min kept"][runs["vllm flagged"]],
            runs["vllm ratio"][runs["vllm flagged"]],
            runs["vllm mismatch"][runs["vllm flagged"]],
            strict=True,
        )
    ]
