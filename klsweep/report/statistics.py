"""The statistics of a report: confidence intervals over seeds, tests between configurations, and their power.

``t_interval`` (t-based 95% CI over seeds), ``welch`` (and ``welch_power``), ``tost`` (equivalence),
``rate_test`` (Fisher's exact test, and ``rate_power``), ``holm`` (p-values adjusted for several tests); scipy does the arithmetic
(the t distribution from ``scipy.special``, as scipy.stats computes it, at a third of its import time), this module owns the
definitions the tables and the claims print, and the claims' decision rule (``RULE``). Definitions and
reasoning: docs/REPORT.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LEVEL = 0.95  # confidence level of every interval
ALPHA = 0.05  # significance level of every test
POWER = 0.8  # a test with less power at the claim's smallest effect is underpowered


def _clean(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, int]:
    """(mean, CI half-width, n) of the non-NaN values; half-width NaN when n < 2."""
    x = _clean(values)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(x) / n
    if n < 2:
        return mean, math.nan, n
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1))
    return mean, float(t_half_width(sd, n, level)), n


def t_half_width(sd: Any, n: Any, level: float = LEVEL) -> Any:
    """The half-width of the t-based CI of a mean from its sample sd and n (scalars or arrays: one scipy call
    for a whole column); NaN where n < 2."""
    import numpy as np

    n = np.asarray(n, dtype=float)
    df = np.where(n >= 2, n - 1, np.nan)
    return _t_ppf(0.5 + level / 2, df) * np.asarray(sd, dtype=float) / np.sqrt(np.where(n > 0, n, np.nan))


def _t_ppf(q: float, df: Any) -> Any:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (an array: one call; a scalar: cached,
    as a report asks for the same few degrees of freedom hundreds of times and each call costs some 0.1 ms)."""
    import numpy as np

    if np.ndim(df) == 0:
        return _t_ppf_scalar(q, float(df))
    from scipy.special import stdtrit

    return stdtrit(df, q)


@functools.cache
def _t_ppf_scalar(q: float, df: float) -> float:
    from scipy.special import stdtrit

    return float(stdtrit(df, q))


def _t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    from scipy.special import stdtr

    return float(stdtr(df, -t))


@dataclass(frozen=True)
class Welch:
    """Welch's test of mean(a) - mean(b)."""

    diff: float
    half_width: float  # of the LEVEL CI of the difference (Welch-Satterthwaite df)
    t: float
    df: float
    p: float
    n_a: int
    n_b: int
    se: float


def welch(a: Sequence[float], b: Sequence[float], alternative: str = "two-sided") -> Welch:
    """Welch's t-test of ``a`` against ``b`` (``alternative``: "two-sided", "greater": mean(a) > mean(b),
    "less")."""
    x, y = _clean(a), _clean(b)
    return welch_summary(
        *(_mean(v) if v else math.nan for v in (x, y)),
        *(_var(v) if len(v) > 1 else math.nan for v in (x, y)),
        len(x),
        len(y),
        alternative,
    )


def welch_summary(
    mean_a: float,
    mean_b: float,
    var_a: float,
    var_b: float,
    n_a: int,
    n_b: int,
    alternative: str = "two-sided",
) -> Welch:
    """``welch`` from each side's mean, sample variance and size (the NaN-free values'): what a table that has
    already aggregated its seeds (``tables.main_table``) tests without going back to the runs."""
    n_a, n_b = int(n_a), int(n_b)
    if n_a < 2 or n_b < 2:
        diff = mean_a - mean_b if n_a and n_b else math.nan
        return Welch(diff, math.nan, math.nan, math.nan, math.nan, n_a, n_b, math.nan)
    vx, vy = var_a / n_a, var_b / n_b
    se = math.sqrt(vx + vy)
    diff = mean_a - mean_b
    if se <= 1e-9 * max(1.0, abs(mean_a), abs(mean_b)):  # no spread on either side: undefined
        return Welch(diff, math.nan, math.nan, math.nan, math.nan, n_a, n_b, se)
    df = (vx + vy) ** 2 / (vx**2 / (n_a - 1) + vy**2 / (n_b - 1))
    return _t_result(diff, vx + vy, df, n_a, n_b, alternative)


def _mean(x: list[float]) -> float:
    return sum(x) / len(x)


def _var(x: list[float]) -> float:
    m = _mean(x)
    return sum((v - m) ** 2 for v in x) / (len(x) - 1)


def welch_power(w: Welch, effect: float, alpha: float = ALPHA) -> float:
    """Power of the one-sided Welch test (``w``'s spread and sizes) to detect a true difference ``effect``."""
    from scipy import stats  # scipy.special's nctdtr is NaN in places (df ~ 38, nc ~ 40) where this is not

    if not (w.se > 0 and w.df > 0):
        return math.nan
    crit = float(_t_ppf(1 - alpha, w.df))
    return float(stats.nct.sf(crit, w.df, abs(effect) / w.se))


def tost(a: Sequence[float], b: Sequence[float], margin: float) -> tuple[float, Welch]:
    """Two one-sided tests that |mean(a) - mean(b)| < ``margin``: (p, the two-sided Welch test). The p is the
    larger of the two one-sided Welch p-values against -margin and +margin (NaN where Welch is undefined)."""
    return tost_of(welch(a, b), margin)


def tost_of(w: Welch, margin: float) -> tuple[float, Welch]:
    """``tost`` from a two-sided test of the difference (Welch's, or ``paired_problems``)."""
    if not (w.se > 0) or math.isnan(w.df):
        return math.nan, w
    p_low = _t_sf((w.diff + margin) / w.se, w.df)  # H0: diff <= -margin
    p_high = _t_sf(-(w.diff - margin) / w.se, w.df)  # H0: diff >= +margin
    return max(p_low, p_high), w


@functools.cache  # a report's bootstrap (``claims.replication``) asks for the same few tables many times
def rate_test(events_a: int, n_a: int, events_b: int, n_b: int) -> tuple[float, float]:
    """Fisher's exact one-sided test that the event rate of a exceeds that of b: (p, smallest p possible with
    these group sizes: every run of a with the event, none of b). NaN when a group is empty."""
    from scipy import stats

    if n_a == 0 or n_b == 0:
        return math.nan, math.nan
    # Fisher's one-sided p, P(X >= events_a) for X hypergeometric given the margins, as scipy's fisher_exact
    # computes it (to the last bits), without its checks: a report's replication asks for a hundred tables of
    # hundreds of runs, 0.08 s each through fisher_exact
    p = float(stats.hypergeom.sf(events_a - 1, n_a + n_b, events_a + events_b, n_a))
    best = float(stats.hypergeom.sf(n_a - 1, n_a + n_b, n_a, n_a))
    return min(1.0, p), best


@functools.cache
def rate_power(n_a: int, n_b: int, rate_a: float, rate_b: float, alpha: float = ALPHA) -> float:
    """Power of ``rate_test`` (Fisher's exact one-sided test, a's rate above b's) at level ``alpha`` when the
    true event rates are ``rate_a`` and ``rate_b``: the probability, over every outcome (events of a, events of
    b: independent binomials), of p < ``alpha``. Exact (no simulation); NaN when a group is empty."""
    import numpy as np
    from scipy import stats

    if n_a == 0 or n_b == 0:
        return math.nan
    ea, eb = np.meshgrid(np.arange(n_a + 1), np.arange(n_b + 1), indexing="ij")
    # Fisher's one-sided p: P(X >= ea), X the events of a given the margins (hypergeometric)
    p = stats.hypergeom.sf(ea - 1, n_a + n_b, ea + eb, n_a)
    prob = np.outer(
        stats.binom.pmf(np.arange(n_a + 1), n_a, rate_a), stats.binom.pmf(np.arange(n_b + 1), n_b, rate_b)
    )
    return float(prob[p < alpha].sum())


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (one family; NaN ones are not tests and stay NaN): sorted
    ascending, the i-th (from 0) of m becomes max over j <= i of min(1, (m - j) p_(j)). A test is significant at
    ALPHA after adjustment when its adjusted p < ALPHA; the family-wise error rate is then at most ALPHA."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m = len(tested)
    out = [math.nan] * len(p_values)
    running = 0.0
    for j, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - j) * p))
        out[i] = running
    return out


def fragile(share: float, se: float = math.nan) -> bool:
    """Whether a verdict's replication (``claims.replication``: a share of resamples, NaN when not computed)
    marks it fragile: under ``FRAGILE`` widened by its Monte Carlo error (``share - MC_Z se``; ``se``: its
    standard error, NaN when not known, as in a claims.csv written before it: the share alone)."""
    if math.isnan(share):
        return False
    return share - (MC_Z * se if se == se else 0.0) < FRAGILE


def replication_resolved(share: float, se: float) -> bool:
    """Whether a replication is known to lie on one side of ``FRAGILE``: more than ``MC_Z`` Monte Carlo
    standard errors from it (NaN: nothing to resolve)."""
    return math.isnan(share) or abs(share - FRAGILE) > MC_Z * se


def mc_error(share: float, resamples: int) -> float:
    """The Monte Carlo standard error of a share of ``resamples`` independent resamples."""
    return math.sqrt(share * (1 - share) / resamples) if resamples and share == share else math.nan


# The claims' decision rule (applied in claims.py, stated in the report).
SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
TOO_FEW = "too few seeds"  # a side with 1 or 2 runs (fewer than MIN_SEEDS): no verdict is drawn from it
VERDICTS = (SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE, TOO_FEW)
MIN_SEEDS = 3  # runs a side (values, for a t-test) below which a claim reads TOO_FEW
EFFECT = {"accuracy": 0.05, "peak KL": 0.5}  # smallest effect of interest: absolute; peak KL: x the reference
RATE_EFFECT = (
    0.5  # a rate claim's default effect: a difference of 0.5 in the rate, from side b's observed one
)
FRAGILE = 0.9  # a verdict that bootstrap resamples of the runs reproduce less often than this is fragile
RESAMPLES = (
    200  # bootstrap resamples of the runs behind the replication column: a batch, drawn until resolved
)
MAX_RESAMPLES = 1000  # at most this many (a share of 0.9 +- 0.019 is then still unresolved: fragile)
RESAMPLE_WORK = 100_000  # and at most this many run-resamples (786 finished runs: 200): a report's time
MC_Z = 2.0  # Monte Carlo standard errors between a replication and FRAGILE for it to read on one side
RULE = (
    f"Verdicts at significance level {ALPHA:g} after Holm's adjustment over all the claims of the table (p_holm; "
    f"the family-wise error rate is at most {ALPHA:g}): supported = the test in the claim's direction has "
    f"p_holm < {ALPHA:g} (equivalence: two one-sided Welch tests within the claim's margin); not supported = not "
    f"significant although the test had power >= {POWER:g} at the claim's effect, at level {ALPHA:g}/m for m "
    f"claims tested (Fisher: default a rate {RATE_EFFECT:g} from b's observed one, in the claim's direction; "
    f"Welch: default {EFFECT['accuracy']:g} accuracy or {EFFECT['peak KL']:.0%} of b's peak KL), or significant the "
    "other way (equivalence: the two differ, two-sided Welch); inconclusive = data missing (no run in a group) "
    f"or a test without that power (equivalence: neither equivalent nor different); {TOO_FEW} = a side with 1 or "
    f"2 runs with a value (fewer than {MIN_SEEDS}): no verdict is drawn from so few, whatever the test says. A "
    'group of claims ("any of") is supported when at least one member is, not supported when every member is not '
    f"supported, {TOO_FEW} when every member is, else inconclusive. Unstable = diverged or collapsed; unbiased = the KL gradient audit's verdict "
    "at the run's own lag; finished runs only; a side pools the runs of every configuration its filters match. "
    "An accuracy claim whose runs all have per-problem outcomes is tested paired on the problems (a t-test "
    "whose variance is the seeds' and the problems' under a crossed random-effects model, Satterthwaite's df) "
    "instead of Welch's test over seeds. "
    "Replication: the share of bootstrap resamples of the finished runs (each configuration's runs resampled "
    "with replacement) whose verdict, through this whole rule (Holm included), is the same, ± its Monte Carlo "
    f"standard error: resamples drawn {RESAMPLES} at a time until every share is more than {MC_Z:g} such errors "
    f"from {FRAGILE:g}, at most {MAX_RESAMPLES} (and {RESAMPLE_WORK:,} draws of a run in all); fragile: below {FRAGILE:g} by that margin or within it "
    f"(share - {MC_Z:g} x error < {FRAGILE:g})."
)


# Problem-level statistics: per-problem outcomes of the runs of a configuration, a matrix of seeds x problems
# (``problems.py`` reads it: each column a problem of one task, its outcomes weighted by 1 / (tasks x that
# task's problems), so that a row sums to the run's average accuracy). Seeds and problems are crossed: every
# seed answers the same problems. Definitions and the simulation that checks them: docs/REPORT.md.
BOOTSTRAP = 1000  # resamples of a configuration's hierarchical bootstrap interval


def problem_bootstrap(
    values: Any,
    task: Any,
    resamples: int = BOOTSTRAP,
    level: float = LEVEL,
    seed: int = 0,
    counts: Any = None,
    projected: Any = None,
) -> tuple[float, float, float]:
    """(mean, low, high): the mean of a configuration's runs (``values``: seeds x problems, a row's sum its
    average accuracy; ``task``: each column's task index) and its ``level`` percentile interval by a
    hierarchical bootstrap over the two sources of its noise: the seeds drawn with replacement, then the
    problems, within each task, drawn with replacement, one draw for all the seeds (the problems are shared,
    not nested in a seed). ``counts``: the problems' draws (``problem_counts``), to share them between the
    configurations of a table; ``projected``: ``values @ counts.T`` (each seed's total on each resample's
    problems), computed for a whole table at once. NaN bounds under 2 seeds (one seed says nothing of another's
    spread)."""
    import numpy as np

    m = np.asarray(values, dtype=float)
    mean = float(m.sum(axis=1).mean()) if len(m) else math.nan
    if len(m) < 2:
        return mean, math.nan, math.nan
    rng = np.random.default_rng(seed)
    if projected is None:
        counts = problem_counts(np.asarray(task), resamples, seed + 1) if counts is None else counts
        projected = m @ counts.T
    seeds = rng.multinomial(len(m), np.full(len(m), 1 / len(m)), size=projected.shape[1]) / len(m)
    # resample b: the drawn seeds' mean of their totals on the drawn problems
    drawn = (seeds * projected.T).sum(axis=1)
    low, high = np.quantile(drawn, [0.5 - level / 2, 0.5 + level / 2])
    return mean, float(low), float(high)


def problem_counts(task: Any, resamples: int = BOOTSTRAP, seed: int = 0) -> Any:
    """Per resample and column, how many times the problem is drawn: within each task, as many draws as it
    has problems, with replacement."""
    import numpy as np

    rng = np.random.default_rng(seed)
    counts = np.empty((resamples, len(task)))
    for t in np.unique(task):
        cols = np.flatnonzero(task == t)
        counts[:, cols] = rng.multinomial(len(cols), np.full(len(cols), 1 / len(cols)), size=resamples)
    return counts


def paired_problems(a: Any, b: Any, task: Any, alternative: str = "two-sided") -> Welch:
    """The test of mean(a) - mean(b), two configurations' runs on the same problems (``a``, ``b``: seeds x
    problems as ``problem_bootstrap`` reads them), paired on the problems: a t-test whose variance comes from
    the crossed random-effects model outcome = config + seed + problem + config x problem + noise, by the
    method of moments (each side's seed variance; the variance, over the problems of each task, of the paired
    difference of the two sides' mean outcomes: each problem's own difficulty cancels; less the noise counted
    by both), with Satterthwaite's degrees of freedom. Returned as a ``Welch`` (its CI, power: ``welch_power``).
    NaN where a side has fewer than 2 runs."""
    import numpy as np

    xa, xb, task = np.asarray(a, dtype=float), np.asarray(b, dtype=float), np.asarray(task)
    n_a, n_b = len(xa), len(xb)
    diff = float(xa.sum(axis=1).mean() - xb.sum(axis=1).mean()) if n_a and n_b else math.nan
    if n_a < 2 or n_b < 2:
        return Welch(diff, math.nan, math.nan, math.nan, math.nan, n_a, n_b, math.nan)
    parts: list[tuple[float, float]] = [  # (variance, degrees of freedom), added with their signs
        (float(np.var(x.sum(axis=1), ddof=1)) / len(x), len(x) - 1) for x in (xa, xb)
    ]
    noise: list[tuple[float, float]] = []
    pairs = xa.mean(axis=0) - xb.mean(axis=0)
    for t in np.unique(task):
        cols = task == t
        c = int(cols.sum())
        if c < 2:
            continue
        parts.append((c * float(np.var(pairs[cols], ddof=1)), c - 1))
        for x in (xa, xb):
            noise.append((c * _residual_mean_square(x[:, cols]) / len(x), (len(x) - 1) * (c - 1)))
    total = sum(v for v, _ in parts) - sum(v for v, _ in noise)
    floor = sum(v for v, _ in noise)  # pure outcome noise: no seed, no problem effect
    var = max(total, floor)
    df = var**2 / sum(v**2 / d for v, d in (*parts, *noise) if d > 0 and v > 0) if var > 0 else math.nan
    return _t_result(diff, var, df, n_a, n_b, alternative)


def _residual_mean_square(x: Any) -> float:
    """The two-way ANOVA's residual mean square of a seeds x problems matrix (no replication)."""

    r, c = x.shape
    if r < 2 or c < 2:
        return 0.0
    e = x - x.mean(axis=0) - x.mean(axis=1, keepdims=True) + x.mean()
    return float((e**2).sum() / ((r - 1) * (c - 1)))


def _t_result(diff: float, var: float, df: float, n_a: int, n_b: int, alternative: str) -> Welch:
    """The t-test of a difference from its variance and degrees of freedom (undefined without either)."""
    se = math.sqrt(var) if var > 0 else 0.0
    if not se > 1e-12 or math.isnan(df):
        return Welch(diff, math.nan, math.nan, math.nan, math.nan, n_a, n_b, se)
    t = diff / se
    p = {
        "two-sided": lambda: 2 * _t_sf(abs(t), df),
        "greater": lambda: _t_sf(t, df),
        "less": lambda: _t_sf(-t, df),
    }[alternative]()
    return Welch(diff, float(_t_ppf(0.5 + LEVEL / 2, df)) * se, t, df, float(p), n_a, n_b, se)
