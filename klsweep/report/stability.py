"""Training stability of a run, from its logged curves: smoothing, collapse, and the per-run stability columns of
the report (``attach_stability``).

Definitions (also printed in the report: ``DEFINITIONS``):

- Smoothing: every curve is a trailing mean over ``window`` steps (default 10), for the curves and the table.
- Collapse: the trainer's rule, ``klsweep.collapse.find_collapse``, applied to each run with its own
  ``train.collapse_window`` and ``train.collapse_fraction`` (so a run the trainer stopped for a collapse is
  collapsed here, at the same step).
- Divergence: what the trainer recorded: ``status.json`` state ``diverged`` with ``diverged_step`` and ``reason``.

``smooth`` needs numpy only, imported when called: no pandas or matplotlib here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from klsweep.collapse import find_collapse
from klsweep.config import TrainSection

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

WINDOW = 10  # the report's smoothing of curves and stability columns (``--window``), not the collapse rule's
# a run's collapse rule where none is known: RunConfig's defaults (``train.collapse_window``, ``collapse_fraction``)
DEFAULT_RULE: tuple[int, float] = (TrainSection.collapse_window, TrainSection.collapse_fraction)
CURVES = (("reward_mean", "task reward"), ("kl_k1", "KL (k1)"), ("kl_k3", "KL (k3)"), ("entropy", "entropy"))
SMOOTHED = (*(m for m, _ in CURVES), "kl_forward")  # the curves, and the forward KL (KL(ref||pi), a column)
# Per run, then mean ± std per configuration in the stability table.
STABILITY_STATS = (
    "final reward",
    "peak reward",
    "peak KL k1",
    "peak KL k3",
    "peak KL forward",
    "min entropy",
)

DEFINITIONS = (
    "Curves are smoothed by a trailing mean over {window} steps. "
    "Collapse (the trainer's rule, with each run's train.collapse_window and collapse_fraction: {rule}): "
    "the task reward averaged over the last window steps (fewer at the start) falls below that fraction of its "
    "peak so far (a peak of at least {min_peak:g}); collapse step = the first such step, where the trainer "
    "stops the run. "
    "Divergence: the trainer stopped the run and marked it diverged (status.json), at the step shown."
)


def rule_text(rules: set[tuple[int, float]]) -> str:
    """The collapse settings of a report's runs, for ``DEFINITIONS``."""
    if len(rules) == 1:
        ((window, fraction),) = rules
        return f"here {window} steps and {100 * fraction:g}% of that peak"
    return "they differ between runs" if rules else "no run"


def smooth(
    values: Sequence[float] | np.ndarray, window: int = WINDOW, starts: np.ndarray | None = None
) -> np.ndarray:
    """Trailing mean over ``window`` steps (fewer at the start), ignoring NaN (NaN where a window has no value).
    ``starts``: per element, the index where its series begins (several runs concatenated); default one series.
    Vectorised with cumulative sums: one pass for every run of a sweep."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    idx = np.arange(len(x))
    lo = np.maximum(idx - window + 1, 0 if starts is None else starts)
    ok = ~np.isnan(x)
    total = np.concatenate([[0.0], np.cumsum(np.where(ok, x, 0.0))])
    count = np.concatenate([[0], np.cumsum(ok)])
    n = count[idx + 1] - count[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (total[idx + 1] - total[lo]) / n, np.nan)


def collapse_step(
    steps: Sequence[int],
    rewards: Sequence[float],
    window: int = DEFAULT_RULE[0],
    fraction: float = DEFAULT_RULE[1],
) -> int | None:
    """The step at which the run collapsed, or None (``klsweep.collapse.find_collapse``)."""
    found = find_collapse(steps, rewards, window, fraction)
    return None if found is None else found.step


def attach_stability(
    runs: pd.DataFrame, metrics: pd.DataFrame, window: int, rules: dict[str, tuple[int, float]]
) -> None:
    """Per run: final/peak smoothed reward, peak smoothed KL k1/k3/forward, lowest smoothed entropy (smoothed over
    ``window`` steps), and the collapse step under the run's own rule (``rules``: run -> (collapse window,
    fraction)). Adds ``<metric> smoothed`` columns to ``metrics`` (sorted by run and step)."""
    import numpy as np

    names = list(SMOOTHED)
    for m in names:
        if m not in metrics:
            metrics[m] = np.nan
    stats = None
    collapse: dict[str, int | None] = {}
    if len(metrics):
        metrics.sort_values(["run", "step"], inplace=True, kind="stable")
        metrics.reset_index(drop=True, inplace=True)
        run = metrics["run"].to_numpy()
        first = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
        starts = np.repeat(first, np.diff(np.r_[first, len(run)]))
        for m in names:
            metrics[f"{m} smoothed"] = smooth(metrics[m].to_numpy(dtype=float), window, starts)
        g = metrics.groupby("run", sort=False)
        stats = g.agg(
            **{
                "final reward": ("reward_mean smoothed", "last"),
                "peak reward": ("reward_mean smoothed", "max"),
                "peak KL k1": ("kl_k1 smoothed", "max"),
                "peak KL k3": ("kl_k3 smoothed", "max"),
                "peak KL forward": ("kl_forward smoothed", "max"),
                "min entropy": ("entropy smoothed", "min"),
                "last logged step": ("step", "last"),
            }
        )
        steps, rewards = metrics["step"].to_numpy(), metrics["reward_mean"].to_numpy(dtype=float)
        for name, idx in g.indices.items():
            w, f = rules.get(name, DEFAULT_RULE)
            collapse[name] = collapse_step(steps[idx].tolist(), rewards[idx].tolist(), w, f)
    for col in (*STABILITY_STATS, "last logged step"):
        runs[col] = runs["run"].map(stats[col]).astype(float) if stats is not None else np.nan
    runs["has_metrics"] = runs["run"].isin(collapse)
    runs["collapse_step"] = object_series([collapse.get(r) for r in runs["run"]])
    runs["collapsed"] = runs["collapse_step"].notna()


def object_series(values: list[Any]) -> pd.Series:
    import pandas as pd

    return pd.Series(values, dtype=object)
