"""Training stability of a run, from its logged curves: smoothing, collapse, and the per-run stability columns of
the report (``attach_stability``).

Definitions (also printed in the report: ``DEFINITIONS``):

- Smoothing: every curve is a trailing mean over ``window`` steps (default 10), for the curves and the table.
- Collapse: the trainer's rule, ``klsweep.collapse.find_collapse``, applied to each run with its own rule
  (``run_rule``: its ``train.collapse_*`` keys and batch), so a run the trainer stopped for a collapse is
  collapsed here, at the same step (one stopped by an earlier version's rule: at the step it was stopped).
- Divergence: what the trainer recorded: ``status.json`` state ``diverged`` with ``diverged_step`` and ``reason``.
- Reward drop: how much of its peak smoothed reward a run has lost by its end, 1 - final / peak (0: it ends
  at its peak; a run the trainer stopped for a collapse: at least the collapse fraction's complement; one that
  diverged (not stopped for a collapse): 1, all of it; NaN when the peak is not positive). A continuous
  measure of instability: ``reward_drop``, the endpoint of the tiny study's claim (a) (docs/STUDY.md).

``smooth`` needs numpy only, imported when called: no pandas or matplotlib here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import astuple
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from klsweep import collapse as collapse_module
from klsweep.collapse import REASON, Rule, false_collapse_rate, find_collapse
from klsweep.config import TrainSection
from klsweep.report.filecache import FileCache, Value, stat_key
from klsweep.store import METRICS_FILE

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

COLLAPSE_CACHE = ".collapses.npz"  # in the report's folder: each run's collapse step under its rule
WINDOW = 10  # the report's smoothing of curves and stability columns (``--window``), not the collapse rule's
CURVES = (("reward_mean", "task reward"), ("kl_k1", "KL (k1)"), ("kl_k3", "KL (k3)"), ("entropy", "entropy"))
SMOOTHED = (*(m for m, _ in CURVES), "kl_forward")  # the curves, and the forward KL (KL(ref||pi), a column)
# Per run, then mean ± std per configuration in the stability table.
STABILITY_STATS = (
    "final reward",
    "peak reward",
    "reward drop",
    "peak KL k1",
    "peak KL k3",
    "peak KL forward",
    "min entropy",
)

DEFINITIONS = (
    "Curves are smoothed by a trailing mean over {window} steps. "
    "Collapse (the trainer's rule, with each run's train.collapse_* keys; docs/COLLAPSE.md): the mean task "
    "reward over the last window steps falls below that fraction of the peak window's mean and below it by "
    "more than z standard errors (from the logged per-step reward spread over the completions of a step, "
    "scaled up when the step means vary more than that); collapse step = the first such step, where the "
    "trainer stops the run. {rule} "
    "Divergence: the trainer stopped the run and marked it diverged (status.json), at the step shown. "
    "Reward drop: 1 - final / peak smoothed reward (1 for a run that diverged, not stopped for a collapse)."
)


def run_rule(config: Mapping[str, Any]) -> Rule:
    """A run's collapse rule from its flattened config (``train.collapse_*``, its completions a step); a key it
    lacks (a run written before the key existed) reads as today's default."""
    default = TrainSection()
    keys = ("collapse_window", "collapse_fraction", "collapse_z", "prompts_per_step", "group_size")
    given = {key: config.get(f"train.{key}") for key in keys}
    return Rule.of(SimpleNamespace(**{k: getattr(default, k) if v is None else v for k, v in given.items()}))


def rule_text(configs: Sequence[Mapping[str, Any]]) -> str:
    """The collapse rules of a report's runs (flattened configs) and, for each, its false-collapse rate on a
    stationary reward as long as its longest run (``klsweep.collapse.false_collapses``), for ``DEFINITIONS``."""
    rules: dict[Rule, int] = {}
    for c in configs:
        rule = run_rule(c)
        rules[rule] = max(rules.get(rule, 0), int(c.get("train.steps") or TrainSection().steps))
    if not rules:
        return "No run has a collapse rule."
    parts = []
    for rule, steps in sorted(rules.items(), key=lambda kv: (kv[0].window, kv[0].fraction, kv[0].z)):
        fired, runs = false_collapse_rate(rule, steps)
        parts.append(
            f"{rule.text()}, {rule.completions} completions a step: {fired} of {runs} simulated {steps}-step "
            f"runs of a stationary reward (Bernoulli, means 0.05-0.9) collapsed ({100 * fired / runs:.2g}%)"
        )
    head = "Here: " if len(parts) == 1 else "The runs' rules differ: "
    return head + "; ".join(parts) + "."


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

    def in_window(v: np.ndarray) -> np.ndarray:  # the sum of v over each element's window
        total = np.concatenate([[0], np.cumsum(v)])
        return total[idx + 1] - total[lo]

    # an infinite value (a diverged KL) makes its windows infinite, and only those: never summed, as it would
    # turn every later difference of the cumulative sums, the other runs' too, into NaN
    finite = np.isfinite(x)
    n = in_window(~np.isnan(x))
    up, down = in_window(x == np.inf), in_window(x == -np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = in_window(np.where(finite, x, 0.0)) / n
    mean = np.where(up > 0, np.where(down > 0, np.nan, np.inf), np.where(down > 0, -np.inf, mean))
    return np.where(n > 0, mean, np.nan)


def collapse_step(
    steps: Sequence[int],
    rewards: Sequence[float],
    stds: Sequence[float | None] | None = None,
    rule: Rule | None = None,
) -> int | None:
    """The step at which the run collapsed, or None (``klsweep.collapse.find_collapse``; ``stds``: the logged
    ``reward_std``, none by default; ``rule``: the default settings and batch by default)."""
    found = find_collapse(
        steps, rewards, [None] * len(rewards) if stds is None else stds, rule or run_rule({})
    )
    return None if found is None else found.step


def attach_stability(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    window: int,
    rules: dict[str, Rule],
    run_dirs: Mapping[str, Path] | None = None,
    cache: Path | None = None,
) -> None:
    """Per run: final/peak smoothed reward and the reward drop (``reward_drop``), peak smoothed KL k1/k3/forward,
    lowest smoothed entropy (smoothed over ``window`` steps), and the collapse step under the run's own rule
    (``rules``: run -> its ``Rule``), or the step the trainer stopped it for a collapse. Adds ``<metric>
    smoothed`` columns to ``metrics`` (sorted by run and step). ``cache``: a file keeping each run's collapse
    step under its rule, keyed by its metrics file (``run_dirs``: run -> its folder; ``FileCache``)."""
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
        stds = (
            metrics["reward_std"].to_numpy(dtype=float)
            if "reward_std" in metrics
            else np.full(len(steps), np.nan)
        )
        indices = g.indices
        names = list(indices)
        rule_of = {n: rules.get(n) or run_rule({}) for n in names}
        folders = [Path(run_dirs[n]) if run_dirs else Path(n) for n in names]
        name_of = dict(zip(folders, names, strict=True))

        def read(folder: Path) -> Value:
            idx, rule = indices[name_of[folder]], rule_of[name_of[folder]]
            return collapse_step(steps[idx].tolist(), rewards[idx].tolist(), stds[idx].tolist(), rule), {}

        # kept under its metrics file and its rule; not kept without run folders or a metrics file to stat
        files = [stat_key(f / METRICS_FILE) if run_dirs else None for f in folders]
        keys = [[k, *astuple(rule_of[n])] if k else None for k, n in zip(files, names, strict=True)]
        with FileCache(cache if run_dirs else None, _collapse_version()) as cached:
            found = cached.read(folders, keys, read, valid=_is_step, child_share=0)()
        collapse = {n: step for n, (step, _) in zip(names, found, strict=True)}
    stopped = (runs["state"] == "diverged") & runs["reason"].fillna("").astype(str).str.startswith(REASON)
    for name, step in zip(runs["run"][stopped], runs["diverged_step"][stopped], strict=True):
        if name in collapse and collapse[name] is None and step is not None and step == step:
            collapse[name] = int(step)  # stopped by the trainer's rule of its time (an earlier version's)
    for col in [c for c in STABILITY_STATS if c != "reward drop"] + ["last logged step"]:
        runs[col] = runs["run"].map(stats[col]).astype(float) if stats is not None else np.nan
    runs["reward drop"] = reward_drop(runs)
    runs["has_metrics"] = runs["run"].isin(collapse)
    runs["collapse_step"] = object_series([collapse.get(r) for r in runs["run"]])
    runs["collapsed"] = runs["collapse_step"].notna()


def _is_step(value: Value) -> bool:
    return value[0] is None or (isinstance(value[0], int) and not isinstance(value[0], bool))


def _collapse_version() -> str:
    """What a cached collapse step was found with: the rule's code (klsweep.collapse)."""
    import hashlib

    return hashlib.sha256(Path(collapse_module.__file__).read_bytes()).hexdigest()[:16]


def reward_drop(runs: pd.DataFrame) -> np.ndarray:
    """Per run (``final reward``, ``peak reward``, ``state``, ``reason``), the share of its peak smoothed reward
    lost by its end: 1 - final / peak; 1 where the run diverged other than by a collapse stop (a broken model
    keeps nothing), NaN where the peak is not positive (nothing to lose)."""
    import numpy as np

    final, peak = runs["final reward"].to_numpy(dtype=float), runs["peak reward"].to_numpy(dtype=float)
    broken = (runs["state"] == "diverged") & ~runs["reason"].fillna("").astype(str).str.startswith(REASON)
    with np.errstate(divide="ignore", invalid="ignore"):
        drop = np.where(peak > 0, 1 - final / peak, np.nan)
    return np.where(broken.to_numpy(dtype=bool), 1.0, drop)


def object_series(values: list[Any]) -> pd.Series:
    import pandas as pd

    return pd.Series(values, dtype=object)
