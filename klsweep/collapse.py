"""The reward-collapse rule: the one definition used by the training job (``klsweep.job`` stops a run at the
step it collapses and marks it diverged) and by the report (``klsweep.report.stability`` counts collapsed runs),
each with the run's own ``Rule`` (``train.collapse_window``, ``collapse_fraction``, ``collapse_z`` and the
completions a step). Statement, derivation and measured false-collapse rates: docs/COLLAPSE.md.

In short: the window of the last ``window`` logged steps has a mean task reward ``m`` (a window judged only when
full: every one of its ``window`` steps logged a reward; never a partial one, at the start or after a gap); the
variance of a step's mean is the window's logged ``reward_std``^2 / ``completions``, scaled up by how much more
the run's step means change from step to step than that says (or, without ``reward_std``, that change alone).
The peak window is the one with the best ``m - z se`` so far. The run collapses at the first step whose window's
mean is below ``fraction`` x the peak's and below it by more than ``z`` pooled standard errors. Pure Python, one
pass; ``false_collapses`` simulates the rule's false-collapse rate on a stationary reward.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MEANS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)  # the stationary rewards of ``false_collapses``
REASON = "reward collapse"  # how a collapse's reason starts (status.json, the report, klsweep status)
# the words for an unstable outcome, said beside every table that uses them (status, the report, its claims)
OUTCOME_WORDS = (
    "diverged: stopped early (non-finite values, or a reward collapse); collapsed: its reward collapsed "
    "(klsweep docs collapse); unstable (claims): diverged or collapsed"
)


@dataclass(frozen=True)
class Rule:
    """A run's collapse settings: its ``train.collapse_*`` keys and the completions of one step."""

    window: int  # steps in a window
    fraction: float  # of the peak window's mean
    z: float  # standard errors between the two windows' means
    completions: int  # per step: train.prompts_per_step x train.group_size

    @classmethod
    def of(cls, train: Any) -> Rule:
        """A run's rule from its train section (``config.TrainSection``, or anything with its keys)."""
        completions = int(train.prompts_per_step) * int(train.group_size)
        return cls(
            int(train.collapse_window), float(train.collapse_fraction), float(train.collapse_z), completions
        )

    def text(self) -> str:
        return f"window {self.window} steps, fraction {self.fraction:g}, z {self.z:g}"


@dataclass(frozen=True)
class Collapse:
    """Where and how a run's reward collapsed."""

    step: int  # the first step where the rule holds
    mean: float  # the mean task reward of the window ending there
    peak: float  # the peak window's mean
    peak_step: int  # the last step of the peak window
    se: float  # the standard error of peak - mean
    rule: Rule

    @property
    def reason(self) -> str:
        return (
            f"{REASON}: mean task reward over the last {self.rule.window} steps {self.mean:.4g} < "
            f"{self.rule.fraction:g} x peak {self.peak:.4g} (the window to step {self.peak_step}), "
            f"{(self.peak - self.mean) / self.se if self.se > 0 else math.inf:.3g} standard errors below it "
            f"(z {self.rule.z:g})"
        )


def _number(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


def find_collapse(
    steps: Sequence[int],
    rewards: Sequence[float | None],
    stds: Sequence[float | None],
    rule: Rule,
) -> Collapse | None:
    """The collapse of a run whose step ``steps[i]`` logged the mean task reward ``rewards[i]`` and its standard
    deviation over the step's completions ``stds[i]`` (a missing or non-finite value is ignored), or None. Only
    full windows are compared: the peak window and the falling one each hold ``rule.window`` logged rewards."""
    scan = CollapseScan(rule)
    for step, reward, std in zip(steps, rewards, stds, strict=True):
        if (found := scan.add(step, reward, std)) is not None:
            return found
    return None


class CollapseScan:
    """``find_collapse`` one logged step at a time, for a run that is training (``klsweep.monitor``): ``add``
    returns the collapse at the step it is first found, else None; the same arithmetic in the same order, so the
    same answer as ``find_collapse`` over the steps so far, at one step's cost instead of the whole run's."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.n = max(rule.completions, 1)
        self.r: collections.deque[float | None] = collections.deque()  # the window's rewards, oldest first
        self.v: collections.deque[float | None] = collections.deque()  # and their variances of a step's mean
        self.total = self.count = self.var_total = self.var_count = 0.0  # the window's
        # the run's: sum of v, of squared step-to-step changes
        self.run_var = self.run_var_count = self.diff2 = self.diff_count = 0.0
        self.last: float | None = None
        self.peak: tuple[float, float, float, float, int] | None = None  # m - z se, m, count, var, step

    def add(self, step: int, reward: float | None, std: float | None) -> Collapse | None:
        rule = self.rule
        if rule.window < 1:
            return None
        window, z = rule.window, rule.z
        x = _number(reward)
        vi = None if x is None or (s := _number(std)) is None else s * s / self.n
        self.r.append(x)
        self.v.append(vi)
        if x is not None:
            self.total, self.count = self.total + x, self.count + 1
            if vi is not None:
                self.var_total, self.var_count = self.var_total + vi, self.var_count + 1
                self.run_var, self.run_var_count = self.run_var + vi, self.run_var_count + 1
            if self.last is not None:
                self.diff2, self.diff_count = self.diff2 + (x - self.last) ** 2, self.diff_count + 1
            self.last = x
        if len(self.r) > window:
            old, old_v = self.r.popleft(), self.v.popleft()
            if old is not None:
                self.total, self.count = self.total - old, self.count - 1
                if old_v is not None:
                    self.var_total, self.var_count = self.var_total - old_v, self.var_count - 1
        count = self.count
        if (
            count < window
        ):  # a partial window (the run's first steps, or a reward missing in it): never judged
            return None
        m = self.total / count
        # the variance of one step's mean: the window's logged spread over the completions, scaled up by how much
        # more the run's step means change from step to step than that spread says (prompt groups) ...
        spread = max(self.var_total, 0.0) / self.var_count if self.var_count else None
        steady = self.diff2 / self.diff_count / 2 if self.diff_count else 0.0
        if spread is not None and self.run_var > 0:
            var = spread * max(1.0, steady / (self.run_var / self.run_var_count))
        else:  # ... or, without a logged spread, the step-to-step change alone
            var = spread if spread is not None else steady
        peak = self.peak
        if peak is not None and peak[1] > 0 and m < rule.fraction * peak[1]:
            _, pm, pc, pv, pstep = peak
            se = math.sqrt((pv * pc + var * count) / (pc + count) * (1 / pc + 1 / count))
            if pm - m > z * se:
                return Collapse(int(step), m, pm, pstep, se, rule)
        lower = m - z * math.sqrt(var / count)
        if peak is None or lower > peak[0]:
            self.peak = (lower, m, count, var, int(step))
        return None


@functools.lru_cache(maxsize=32)
def false_collapses(
    rule: Rule, steps: int, runs_per_mean: int = 100, seed: int = 0, means: tuple[float, ...] = MEANS
) -> tuple[int, int]:
    """How many of ``runs_per_mean`` simulated runs at each of ``means`` collapse under ``rule``, and how many runs
    there were: a stationary reward of ``steps`` steps, each step's ``rule.completions`` rewards independent
    Bernoulli draws (their mean and sample standard deviation logged, as the trainer does). Seeded."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n, fired = max(rule.completions, 1), 0
    for p in means:
        hits = rng.binomial(n, p, size=(runs_per_mean, steps))
        rewards = hits / n
        stds = np.sqrt(hits * (n - hits) / (n * (n - 1))) if n > 1 else np.zeros_like(rewards)
        for m, sd in zip(rewards.tolist(), stds.tolist(), strict=True):
            fired += find_collapse(range(1, steps + 1), m, sd, rule) is not None
    return fired, runs_per_mean * len(means)


def false_collapse_rate(rule: Rule, steps: int) -> tuple[int, int]:
    """``false_collapses(rule, steps)`` (its defaults), kept on disk under ``$KLSWEEP_CACHE/collapse/`` (the
    simulation takes seconds; a report states it for every rule of its runs): keyed by the rule, the steps and
    this module's source, so a change of the rule is simulated afresh."""
    import hashlib
    import json
    from dataclasses import asdict
    from pathlib import Path

    from klsweep import store

    key = json.dumps([asdict(rule), steps, Path(__file__).read_text()], sort_keys=True)
    path = store.cache_dir() / "collapse" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    try:
        fired, runs = json.loads(path.read_text())
        return int(fired), int(runs)
    except (OSError, ValueError, TypeError):
        pass
    result = false_collapses(rule, steps)
    with contextlib.suppress(OSError):  # a read-only cache: simulated again next time
        store.atomic_write_text(path, json.dumps(list(result)))
    return result
