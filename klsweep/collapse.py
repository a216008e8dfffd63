"""The reward-collapse rule: the one definition used by the training job (``klsweep.job`` stops a run at the
step it collapses and marks it diverged) and by the report (``klsweep.report.stability`` counts collapsed runs),
each driven by the run's own ``train.collapse_window`` and ``train.collapse_fraction``.

With ``r_t`` the mean task reward logged at step ``t`` (a missing or non-finite value is ignored):

- ``s_t``, the smoothed reward: the mean of the finite ``r`` over the last ``window`` logged steps, over fewer
  at the start (step 1 counts on its own), so that a collapse inside the first window is caught;
- ``p_t``, the peak so far: the largest ``s_u`` for ``u <= t``;
- the run collapses at the first step ``t`` where ``p_t >= MIN_PEAK`` and ``s_t < fraction * p_t``.

A reward that falls from 0.19 to 0 at step 2 (window 10, fraction 0.5) collapses at step 3: ``s`` = 0.19,
0.095, 0.063. The first steps average fewer values, so a lucky first step weighs more: ``MIN_PEAK`` and the
fraction keep a run whose reward merely wobbles from collapsing.

Pure Python, one pass: the job calls it after every step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MIN_PEAK = 0.1  # a collapse needs a smoothed task reward at least this high to fall from


@dataclass(frozen=True)
class Collapse:
    """Where and how a run's reward collapsed."""

    step: int  # the first step below the threshold
    smoothed: float  # s_t at that step
    peak: float  # p_t at that step
    window: int
    fraction: float

    @property
    def reason(self) -> str:
        return (
            f"reward collapse: mean task reward over the last {self.window} steps {self.smoothed:.4g} "
            f"< {self.fraction:g} x peak {self.peak:.4g}"
        )


def find_collapse(
    steps: Sequence[int], rewards: Sequence[float | None], window: int, fraction: float
) -> Collapse | None:
    """The collapse of a run whose step ``steps[i]`` logged ``rewards[i]``, or None (see the module docstring)."""
    if window < 1:
        return None
    finite = [r if isinstance(r, int | float) and math.isfinite(r) else None for r in rewards]
    total, count, peak = 0.0, 0, -math.inf
    for i, r in enumerate(finite):
        if r is not None:
            total, count = total + r, count + 1
        if i >= window and finite[i - window] is not None:
            total, count = total - finite[i - window], count - 1
        if count == 0:
            continue
        s = total / count
        peak = max(peak, s)
        if peak >= MIN_PEAK and s < fraction * peak:
            return Collapse(int(steps[i]), s, peak, window, fraction)
    return None
