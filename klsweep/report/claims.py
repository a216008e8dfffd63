"""The tests of a report: each configuration against its references, and the study's claims with a verdict.

``comparisons_table``: each configuration against no KL and k1 in the reward (Welch over seeds).
``claims_table``: the claims of a grid file or a claims file (``klsweep.grid.claims``: data, e.g. the paper's
(a)-(d) in sweeps/tiny.yaml), each tested on this sweep's runs, Holm-adjusted over the table and given a
verdict (supported, not supported, inconclusive) by ``statistics.RULE``; ``read_verdicts``/``verdict_changes``
compare them with a committed ``claims.csv`` (``read_expected``/``split_changes``: changes of its fragile verdicts
apart). Each verdict's replication: ``replication``. The claims, their tests and the decision rule: docs/REPORT.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.errors import Problem, UserError
from klsweep.grid.claims import UNBIASED, Claim, overlap_problem
from klsweep.report.audit_table import run_unbiased
from klsweep.report.data import D_ID, ID_AVG, OOD_AVG
from klsweep.report.names import KL_KEYS, kl_on, matches
from klsweep.report.statistics import (
    ALPHA,
    EFFECT,
    INCONCLUSIVE,
    MAX_RESAMPLES,
    MIN_SEEDS,
    NOT_SUPPORTED,
    POWER,
    RATE_EFFECT,
    RESAMPLE_WORK,
    RESAMPLES,
    SUPPORTED,
    TOO_FEW,
    Welch,
    fragile,
    holm,
    mc_error,
    paired_problems,
    rate_power,
    rate_test,
    replication_resolved,
    tost_of,
    welch,
    welch_power,
    welch_summary,
)
from klsweep.report.tables import DASH, SPANS, csv_cell, difference_words, fmt_value

if TYPE_CHECKING:
    import pandas as pd

    from klsweep.report.problems import Outcomes

PEAK_KL = "peak KL k3"
REWARD_DROP = "reward drop"  # stability.reward_drop
REFERENCES = ("no KL", "k1 in reward")
CLAIM_COLUMNS = [
    "claim", "group", "verdict", "replication", "replication se", "resamples", "to decide", "test", "statistic",
    "p_value", "p_holm", "n", "detail",
]  # fmt: skip
DECIDE_POWER = 0.9  # "N' would decide it": the seeds a configuration at which the claim's test has this power
# looked for up to this many seeds a configuration (a rate: RATE_DECIDE_CAP); more: "more than ... would"
DECIDE_CAP = 1000
RATE_DECIDE_CAP = 100
MISSING = "missing"
APOSTROPHE = "'"
PAIRED = "paired on the problems (seeds x problems)"


def _non_kl_axes(axes: list[str]) -> list[str]:
    return [a for a in axes if a not in (*KL_KEYS, "kl.reward_mode")]


def _is(runs: pd.DataFrame, estimator: str, placement: str) -> pd.Series:
    return kl_on(runs) & (runs["kl.estimator"] == estimator) & (runs["kl.placement"] == placement)


def comparisons_table(
    runs: pd.DataFrame, axes: list[str], metrics: Sequence[str], outcomes: Outcomes | None = None
) -> pd.DataFrame:
    """One row per configuration, reference (``REFERENCES``) and metric with data on both sides: Welch's test
    over seeds, or, for an average whose runs on both sides all have per-problem outcomes (``outcomes``), the
    test paired on the problems (``statistics.paired_problems``); ``test`` says which."""
    import pandas as pd

    shared = _non_kl_axes(axes)
    configs = runs.groupby("config", sort=True)
    first = configs.first()
    stats = {m: configs[m].agg(["mean", "var", "count"]).to_dict("index") for m in metrics}
    outcomes = outcomes or {}
    scored = {
        m: {c: list(names) for c, names in runs[runs[m].notna()].groupby("config")["run"]}
        for m in metrics
        if m in outcomes
    }
    with_kl = kl_on(first)
    k1_reward = _is(first, "k1", "reward")
    text = {a: first[a].map(fmt_value).to_dict() for a in {*shared, "kl.beta"}}
    refs_by_key = []  # per reference: its configurations by their shared axes' values
    for is_ref, keys in zip((~with_kl, k1_reward), (shared, [*shared, "kl.beta"]), strict=True):
        by_key: dict[tuple[str, ...], list[Any]] = {}
        for j in first.index[is_ref.to_numpy()]:
            by_key.setdefault(tuple(text[a][j] for a in keys), []).append(j)
        refs_by_key.append((is_ref, keys, by_key))
    rows = []
    for i in first.index:
        for ref_name, (is_ref, keys, by_key) in zip(REFERENCES, refs_by_key, strict=True):
            refs = by_key.get(tuple(text[a][i] for a in keys), [])
            if is_ref[i] or len(refs) != 1:
                continue
            j = refs[0]
            for m in metrics:
                a, b = stats[m][i], stats[m][j]
                if not (a["count"] and b["count"]):
                    continue
                w, test = (
                    welch_summary(a["mean"], b["mean"], a["var"], b["var"], a["count"], b["count"]),
                    "Welch",
                )
                if m in scored and all(outcomes[m].complete(scored[m][k]) for k in (i, j)):
                    w = paired_problems(*(outcomes[m].rows(scored[m][k]) for k in (i, j)), outcomes[m].task)
                    test = PAIRED
                words = difference_words(w.half_width, w.n_a, w.n_b, SPANS[D_ID])
                rows.append(
                    {
                        "configuration": first.at[i, "label"],
                        "reference": ref_name,
                        "reference configuration": first.at[j, "label"],
                        "metric": m,
                        "difference": w.diff,
                        "difference ci": math.nan if words else w.half_width,
                        "difference ci method": words or test,
                        "t": w.t,
                        "df": w.df,
                        "p": w.p,
                        "n": w.n_a,
                        "n reference": w.n_b,
                        "test": test,
                    }
                )
    cols = ["configuration", "reference", "reference configuration", "metric", "difference", "difference ci",
            "difference ci method"]  # fmt: skip
    return pd.DataFrame(rows, columns=[*cols, "t", "df", "p", "n", "n reference", "test"])


def finished(runs: pd.DataFrame) -> pd.Series:
    return runs["state"].isin(["done", "diverged"])


def unstable(runs: pd.DataFrame) -> pd.Series:
    return (runs["state"] == "diverged") | runs["collapsed"].astype(bool)


METRIC_COLUMNS = {"in_domain": ID_AVG, "ood": OOD_AVG, "peak_kl": PEAK_KL, "reward_drop": REWARD_DROP}
DEFAULT_EFFECT = {ID_AVG: (EFFECT["accuracy"], False), OOD_AVG: (EFFECT["accuracy"], False)}
DEFAULT_EFFECT[PEAK_KL] = (EFFECT["peak KL"], True)


def claim_side(runs: pd.DataFrame, configs: dict[str, dict], filters: dict[str, list[Any]]) -> pd.DataFrame:
    """The finished runs matching every filter (a key: one of its values); keys not in runs.csv are read from
    the runs' configs; ``unbiased``: the audit's verdict at the run's own lag."""
    return _Sides(runs, configs).side(filters)


class _Sides:
    """The runs each side of a table's claims selects: each (key, value) of their filters compared with the
    runs once, as a mask, whatever the number of claims that use it; a side is the masks combined (2,000
    claims of 200 runs: each run compared with the few distinct values, not once per claim)."""

    def __init__(self, runs: pd.DataFrame, configs: dict[str, dict]) -> None:
        self.runs, self.configs = runs, configs
        self.columns: dict[str, list[Any]] = {}
        self.masks: dict[tuple[str, str, str], Any] = {}

    def _column(self, key: str) -> list[Any]:
        if key not in self.columns:
            if key == UNBIASED:
                column = [{"yes": True, "no": False}.get(v) for v in self.runs["unbiased"]]
            elif key in self.runs.columns:
                column = list(self.runs[key])
            else:
                column = [self.configs.get(run, {}).get(key) for run in self.runs["run"]]
            self.columns[key] = column
        return self.columns[key]

    def mask(self, key: str, wanted: Any) -> Any:
        """Which runs have ``wanted`` at ``key`` (``names.matches``), computed once."""
        import numpy as np

        k = (key, type(wanted).__name__, repr(wanted))
        if k not in self.masks:
            self.masks[k] = np.array([matches(v, wanted) for v in self._column(key)], dtype=bool)
        return self.masks[k]

    def side(self, filters: dict[str, list[Any]]) -> pd.DataFrame:
        import numpy as np

        keep = np.ones(len(self.runs), dtype=bool)
        for key, values in filters.items():
            keep &= np.logical_or.reduce([self.mask(key, w) for w in values]) if values else False
        return self.runs[keep]


def _describe(filters: dict[str, list[Any]]) -> str:
    return ", ".join(f"{k}={'|'.join(fmt_value(v) for v in vs)}" for k, vs in filters.items())


def claim_size(size: tuple[float, bool] | None, b: Sequence[float]) -> float:
    if size is None:
        return math.nan
    value, relative = size
    return value * abs(_mean(b)) if relative else value


def _values(c: Claim, side: pd.DataFrame, outcomes: Outcomes | None = None) -> Any:
    """Per run of a side, what the claim's test reads (a float array, NaN where a run has no value): its
    metric, or for a Fisher claim 1 where the run has the event (unstable, or a yes/no column true), else 0.
    An accuracy with per-problem outcomes (``outcomes``, ``problems.load_outcomes``): one row per run, its
    accuracy then its outcomes (NaN where it has none)."""
    import numpy as np
    import pandas as pd

    if c.test != "fisher":
        column = METRIC_COLUMNS.get(c.metric, c.metric)
        x = pd.to_numeric(side[column], errors="coerce").to_numpy(float)
        if outcomes and column in outcomes:
            return np.column_stack([x, outcomes[column].rows(side["run"])])
        return x
    if c.metric == "unstable":
        return unstable(side).to_numpy(float)
    return np.array([str(v).lower() in ("true", "1", "1.0", "yes") for v in side[c.metric]], dtype=float)


def _test(c: Claim, a: Any, b: Any, outcomes: Outcomes | None = None) -> dict[str, Any]:
    """The claim's test on its two sides' values (``_values``): the row of ``claims_table`` before Holm
    (``verdict`` then decided by ``_verdict`` from ``p_value`` and the private ``_*`` entries). An accuracy
    whose runs all have per-problem outcomes on both sides is tested paired on the problems
    (``statistics.paired_problems``), else over seeds (Welch)."""
    row: dict[str, Any] = {"claim": c.name, "group": c.group or ""}
    if c.test == "fisher":
        first, second = (a, b) if c.direction == "greater" else (b, a)
        ua, ub = int(a.sum()), int(b.sum())
        ea, eb = (ua, ub) if c.direction == "greater" else (ub, ua)
        p, _ = rate_test(ea, len(first), eb, len(second))
        rb = ub / len(b) if len(b) else math.nan
        ra = rate_at_effect(c, rb)
        row |= {
            "test": f"Fisher's exact test, one-sided ({c.direction}); statistic: difference of {c.metric} rates",
            "statistic": ua / len(a) - ub / len(b) if len(a) and len(b) else math.nan,
            "p_value": p,
            "n": len(a) + len(b),
            "detail": f"{c.metric}: a {ua}/{len(a)}, b {ub}/{len(b)}",
            "_rates": rate_power_args(c, len(a), len(b), ra, rb),
            "_rates_ab": (ra, rb),
            "_sizes": (len(a), len(b)),
            "_at": f"a's rate {_num(ra)} against b's {_num(rb)}",
        }
        return row
    column = METRIC_COLUMNS.get(c.metric, c.metric)
    pa, pb = (_with_outcomes(x) for x in (a, b))
    paired = pa is not None and pb is not None and outcomes is not None
    a, b = (x[:, 0] if x.ndim == 2 else x for x in (a, b))
    xa, xb = (x[x == x] for x in (a, b))  # NaN left out
    what = f"{c.metric}: a {_num(_mean(xa))} (n={len(xa)}) vs b {_num(_mean(xb))} (n={len(xb)})"
    if paired:
        task = outcomes[column].task
        what += f"; paired on {len(task)} problems"

    def test(alternative: str) -> Welch:
        if paired:
            return paired_problems(pa, pb, task, alternative)
        return welch(list(xa), list(xb), alternative=alternative)

    how = PAIRED if paired else "Welch"
    if c.test == "tost":
        margin = claim_size(c.margin, xb)
        p, w = tost_of(test("two-sided"), margin)
        row |= {
            "test": f"equivalence: two one-sided {'t-tests, ' + how if paired else 'Welch tests'} (TOST); "
            "statistic: difference of means",
            "statistic": w.diff,
            "p_value": p,
            "n": w.n_a + w.n_b,
            "detail": f"{what}; difference {_pm(w, column)}, margin ±{_num(margin)}",
            "_two_sided": w.p,
            "_sizes": (len(xa), len(xb)),
            "_w": w,
            "_margin": margin,
        }
        return row
    w = test(c.direction)
    effect = claim_size(c.effect or DEFAULT_EFFECT.get(column), xb)
    row |= {
        "test": f"{'t-test, ' + how if paired else 'Welch' + APOSTROPHE + 's t-test'}, one-sided ({c.direction}); "
        "statistic: t",
        "statistic": w.t,
        "p_value": w.p,
        "n": w.n_a + w.n_b,
        "detail": f"{what}; difference {_pm(w, column)}",
        "_w": w,
        "_effect": effect,
        "_sizes": (len(xa), len(xb)),
    }
    return row


def rate_at_effect(c: Claim, rate_b: float) -> float:
    """A Fisher claim's side a rate at its effect (``effect``, default ``RATE_EFFECT``): that far from side b's
    ``rate_b``, in the claim's direction, within [0, 1]; where its power decides "not supported"."""
    effect = claim_size(c.effect or (RATE_EFFECT, False), [rate_b])
    return min(1.0, rate_b + effect) if c.direction == "greater" else max(0.0, rate_b - effect)


def rate_power_args(
    c: Claim, n_a: int, n_b: int, rate_a: float, rate_b: float
) -> tuple[int, int, float, float]:
    """``statistics.rate_power``'s sizes and rates for a Fisher claim with sides of ``n_a`` and ``n_b`` runs at
    true rates ``rate_a`` and ``rate_b``: the side the claim expects more events of first."""
    return (n_a, n_b, rate_a, rate_b) if c.direction == "greater" else (n_b, n_a, rate_b, rate_a)


def _with_outcomes(x: Any) -> Any:
    """The outcomes of a side's runs with an accuracy (``_values``' rows), or None: not an accuracy with
    outcomes, or one of those runs has none."""
    import numpy as np

    if x.ndim != 2:
        return None
    rows = x[x[:, 0] == x[:, 0], 1:]
    return rows if rows.size and np.isfinite(rows).all() else None


def _verdict(row: dict[str, Any], test: str, m: int) -> tuple[str, str]:
    """(verdict, why) of a tested claim from its Holm-adjusted p (``RULE``); ``m``: the claims tested. A side
    with 1 or 2 runs (``MIN_SEEDS``): ``TOO_FEW``, whatever its test says."""
    p, adj = row["p_value"], row["p_holm"]
    few = [f"{side} {n}" for side, n in zip("ab", row["_sizes"], strict=True) if n < MIN_SEEDS]
    if all(row["_sizes"]) and few:
        return TOO_FEW, f"fewer than {MIN_SEEDS} runs a side with a value ({', '.join(few)}): no verdict"
    if math.isnan(p):
        return INCONCLUSIVE, "a group has no finished run or no spread"
    if adj < ALPHA:
        return SUPPORTED, "equivalent within the margin" if test == "tost" else ""
    if test == "fisher":
        power = rate_power(*row["_rates"], ALPHA / m)
        at = f"power {power:.2f} at {row['_at']} (level {ALPHA:g}/{m})"
        return (NOT_SUPPORTED, at) if power >= POWER else (INCONCLUSIVE, f"underpowered: {at}")
    if test == "tost":
        if row["_two_sided"] < ALPHA:
            return NOT_SUPPORTED, f"they differ (two-sided p = {row['_two_sided']:.3g})"
        return INCONCLUSIVE, "not different, but not shown equivalent (underpowered)"
    if p > 1 - ALPHA:
        return NOT_SUPPORTED, "significant in the other direction"
    effect = row["_effect"]
    power = welch_power(row["_w"], effect, ALPHA / m) if not math.isnan(effect) else math.nan
    if math.isnan(power):
        return INCONCLUSIVE, "no smallest effect of interest for this metric (effect:)"
    at = f"power {power:.2f} at an effect of {_num(effect)} (level {ALPHA:g}/{m})"
    return (NOT_SUPPORTED, at) if power >= POWER else (INCONCLUSIVE, f"underpowered: {at}")


def _group_row(name: str, members: list[dict[str, Any]]) -> dict[str, Any]:
    """An "any of" claim: supported when a member is, not supported when every member is not, too few seeds when
    every member has too few, else inconclusive; its p_holm the smallest of its members'."""
    verdicts = [r["verdict"] for r in members]
    if SUPPORTED in verdicts:
        verdict = SUPPORTED
    elif all(v == NOT_SUPPORTED for v in verdicts):
        verdict = NOT_SUPPORTED
    elif all(v == TOO_FEW for v in verdicts):
        verdict = TOO_FEW
    else:
        verdict = INCONCLUSIVE
    n_sup = verdicts.count(SUPPORTED)
    adjusted = [r["p_holm"] for r in members if not math.isnan(r["p_holm"])]
    return {
        "claim": name,
        "group": name,
        "verdict": verdict,
        "test": f"any of {len(members)} claims (supported when at least one member is, after Holm)",
        "statistic": math.nan,
        "p_value": math.nan,
        "p_holm": min(adjusted) if adjusted else math.nan,
        "n": max(r["n"] for r in members),
        "detail": f"{n_sup} of {len(members)} members supported",
    }


def claims_table(
    runs: pd.DataFrame,
    audit: pd.DataFrame,
    claims: Sequence[Claim],
    configs: dict[str, dict] | None = None,
    problems: Sequence[Problem] = (),
    resamples: int = MAX_RESAMPLES,
    outcomes: Outcomes | None = None,
) -> pd.DataFrame:
    """One row per claim (``klsweep.grid.claims``), tested on the finished runs, then one per group of claims
    ("any of"): ``CLAIM_COLUMNS``. p_holm: Holm's adjustment over every claim tested; verdicts by ``RULE``;
    replication: ``replication``, at most ``resamples`` bootstrap resamples (0: NaN), with its Monte Carlo
    standard error (``replication se``) and the resamples drawn (``resamples``).
    ``configs``: run -> its flattened config, for filters on keys runs.csv does not hold. UserError when a
    claim's metric or filter key is neither a column of the runs nor a config key, with ``problems`` (those
    found reading the claims: every problem in one error). ``outcomes``: the runs' per-problem outcomes
    (``problems.load_outcomes``): an accuracy claim whose runs all have them is tested paired on the problems."""
    import pandas as pd

    if not claims and not problems:
        return pd.DataFrame(columns=CLAIM_COLUMNS)
    configs = configs or {}
    r = runs.assign(unbiased=run_unbiased(runs, audit))
    done = r[finished(r)]
    known = set(r.columns) | {k for c in configs.values() for k in c}
    problems = list(problems) + [
        Problem(f"claim {c.name!r}: metric", f"{c.metric!r} is not a column of runs.csv",
                f"{', '.join(METRIC_COLUMNS)}, unstable, or a column of runs.csv")
        for c in claims
        if c.metric != "unstable" and METRIC_COLUMNS.get(c.metric, c.metric) not in r.columns
    ] + [
        Problem(f"claim {c.name!r}: {side}.{k}", f"no run of this sweep has {k!r}", "a key of the runs' configs")
        for c in claims
        for side, f in (("a", c.a), ("b", c.b))
        for k in f
        if k != UNBIASED and k not in known
    ]  # fmt: skip
    # a run on both sides of a claim, whatever its state (the plan checked the grid's runs before, where it could)
    every = _Sides(r, configs)
    for c in claims:
        shared = every.side(c.a).index.intersection(every.side(c.b).index)
        if len(shared):
            names = r.loc[shared, "run"] if "run" in r.columns else shared
            problems.append(overlap_problem(c, "claims", [str(n) for n in names]))
    if problems:
        raise UserError(problems, title="invalid claims")
    chosen = _Sides(done, configs)
    sides = [(chosen.side(c.a), chosen.side(c.b)) for c in claims]
    values = [
        (_values(c, a, outcomes), _values(c, b, outcomes)) for c, (a, b) in zip(claims, sides, strict=True)
    ]
    rows = _decide(claims, values, outcomes)
    shares = replication(done, claims, sides, rows, resamples, outcomes=outcomes)
    rows = [
        {**row, "replication": share, "replication se": se, "resamples": drawn}
        for row, (share, se, drawn) in zip(rows, shares, strict=True)
    ]
    tested = max(sum(not math.isnan(row["p_value"]) for row in rows[: len(claims)]), 1)
    for c, row, pair in zip(claims, rows, sides, strict=False):
        row["to decide"] = to_decide(c, row, [_configurations(s) for s in pair], ALPHA / tested)
    return pd.DataFrame(rows).reindex(columns=CLAIM_COLUMNS).fillna({"to decide": ""})


def _configurations(side: pd.DataFrame) -> int:
    """How many configurations a claim's side holds (its runs' ``config``)."""
    return max(int(side["config"].nunique()), 1) if "config" in side.columns and len(side) else 1


def to_decide(c: Claim, row: dict[str, Any], configurations: list[int], level: float) -> str:
    """What a claim's verdict lacks, in words, or "" where it is decided: an inconclusive verdict, or one whose
    replication is fragile (``statistics.fragile``), reads "inconclusive at N seeds; N' would decide it". N: the
    seeds a configuration of its sides has now; N': the fewest at which the claim's own test, its spread scaled
    by the seeds (the same runs, more of them), has power ``DECIDE_POWER`` at level ``level`` (ALPHA / m, the
    strictest Holm asks) at the claim's effect (TOST: equivalence when the true difference is 0), or, where it
    has that power already and the verdict is still fragile, at the difference observed (in the claim's
    direction; TOST: the true difference the observed one): the seeds at which it, if true, would read
    supported. "more than DECIDE_CAP would" where none up to the cap does (the observed difference against the
    claim's direction or outside the margin: no number of seeds shows it). A side with fewer than MIN_SEEDS runs
    reads TOO_FEW's own words instead."""
    verdict, share, se = row["verdict"], row.get("replication", math.nan), row.get("replication se", math.nan)
    if verdict == TOO_FEW or (verdict != INCONCLUSIVE and not fragile(share, se)) or "_sizes" not in row:
        return ""
    n_a, n_b = row["_sizes"]
    if not (n_a and n_b):
        return ""
    now = max(round(n_a / configurations[0]), round(n_b / configurations[1]))
    cap = RATE_DECIDE_CAP if c.test == "fisher" else DECIDE_CAP

    def first(power: Any) -> int | None:
        """The fewest seeds from now up to the cap with the power (it grows with the seeds)."""
        if power(now) >= DECIDE_POWER:
            return now
        if not power(cap) >= DECIDE_POWER:
            return None
        lo, hi = now, cap  # power(lo) short of it, power(hi) enough
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if power(mid) >= DECIDE_POWER else (mid, hi)
        return hi

    if c.test == "fisher":
        ra, rb = row["_rates_ab"]
        # powered at the effect and still fragile (needed == now): a rate's observed difference is not sized
        needed = first(
            lambda n: rate_power(
                *rate_power_args(c, n * configurations[0], n * configurations[1], ra, rb), level
            )
        )
    else:
        w: Welch = row["_w"]
        if not (w.se > 0 and w.df > 0):
            return f"inconclusive at {now} seeds: no spread to size it"

        def at(n: int) -> Welch:  # the test on n seeds a configuration: its spread scaled, its df with it
            f = n / now
            return Welch(
                w.diff,
                math.nan,
                math.nan,
                w.df * f,
                math.nan,
                round(w.n_a * f),
                round(w.n_b * f),
                w.se / math.sqrt(f),
            )

        if c.test == "tost":
            margin = row["_margin"]
            needed = first(lambda n: _tost_power_at(at(n), margin, 0.0, level))
            if needed == now:
                needed = first(lambda n: _tost_power_at(at(n), margin, w.diff, level))
        else:
            effect = row["_effect"]
            needed = first(lambda n: welch_power(at(n), effect, level)) if effect == effect else None
            sign = 1 if c.direction == "greater" else -1
            if needed == now:
                observed = sign * w.diff
                needed = first(lambda n: welch_power(at(n), observed, level)) if observed > 0 else None
    if needed == now:
        needed = None
    more = f"{needed} would decide it" if needed else f"more than {cap} would"
    return f"inconclusive at {now} seeds; {more}"


def _tost_power_at(w: Welch, margin: float, true: float, level: float) -> float:
    """TOST's power at ``level`` to show |difference| < ``margin`` when the true difference is ``true``, for a
    difference estimated with ``w``'s spread: P(-margin + t se < estimate < margin - t se)."""
    from scipy.special import stdtr, stdtrit

    t = float(stdtrit(w.df, 1 - level))
    hi, lo = (margin - true) / w.se - t, (-margin - true) / w.se + t
    return max(0.0, float(stdtr(w.df, hi)) - float(stdtr(w.df, lo))) if hi > lo else 0.0


def _decide(
    claims: Sequence[Claim], sides: list[tuple[Any, Any]], outcomes: Outcomes | None = None
) -> list[dict[str, Any]]:
    """The rows of ``claims_table`` from each claim's two sides (their ``_values``): tested, Holm-adjusted, given a verdict by
    ``RULE``, then one row per group of claims."""
    rows = [_test(c, a, b, outcomes) for c, (a, b) in zip(claims, sides, strict=True)]
    for row, adj in zip(rows, holm([row["p_value"] for row in rows]), strict=True):
        row["p_holm"] = adj
    tested = sum(not math.isnan(row["p_value"]) for row in rows)
    for c, row in zip(claims, rows, strict=True):
        verdict, why = _verdict(row, c.test, max(tested, 1))
        sides_text = f"a: {_describe(c.a)}; b: {_describe(c.b)}"
        row["verdict"], row["detail"] = verdict, f"{row['detail']}{f'; {why}' if why else ''} ({sides_text})"
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["group"]:
            groups.setdefault(row["group"], []).append(row)
    return rows + [_group_row(g, members) for g, members in groups.items()]


def replication(
    done: pd.DataFrame,
    claims: Sequence[Claim],
    sides: list[tuple[pd.DataFrame, pd.DataFrame]],
    rows: list[dict[str, Any]],
    resamples: int = MAX_RESAMPLES,
    seed: int = 0,
    outcomes: Outcomes | None = None,
) -> list[tuple[float, float, int]]:
    """Per row of ``_decide`` (claims, then groups): (share, its Monte Carlo standard error, resamples drawn).
    Resamples are drawn ``RESAMPLES`` at a time until every row's share is known to lie on one side of
    ``FRAGILE`` (``statistics.replication_resolved``), at most ``resamples`` and ``RESAMPLE_WORK`` draws of a
    run in all (no fewer than one batch: 786 finished runs draw 200, as before issue 49; the report's time stays
    within bench/bench_report.py's), a share then still near the line fragile (a row reading ``TOO_FEW``: NaN, not
    resampled: its sizes, not its data, decide it). The share: of those bootstrap resamples of the
    finished runs ``done`` (each configuration's runs drawn with replacement, as many as it has, twice over; a
    Fisher claim's events drawn per configuration at a rate from its Jeffreys posterior, Beta(k + 1/2,
    n - k + 1/2), so that 0 of 6 is not taken for a certain 0; the seed is fixed: a report is reproducible) whose verdict, through the whole rule (every claim retested, Holm over the
    table, the groups), is ``rows``' verdict. Under ``FRAGILE``: a verdict that fresh seed sets may well not
    reproduce (docs/REPORT.md, "Replication")."""
    import numpy as np

    rng = np.random.default_rng(seed)
    configs = [np.flatnonzero(done["config"].to_numpy() == c) for c in dict.fromkeys(done["config"])]
    position = {label: i for i, label in enumerate(done.index)}
    members = [[np.array([position[i] for i in side.index], dtype=int) for side in pair] for pair in sides]
    # of every finished run (an accuracy with outcomes: a row per run): a drawn run replaces a side's member
    values = [_values(c, done, outcomes) for c in claims]
    events = [c.test == "fisher" for c in claims]
    same = np.zeros(len(rows))
    drawn_so_far = 0
    resamples = min(resamples, max(RESAMPLES, RESAMPLE_WORK // max(len(done), 1)))  # a large sweep: its time
    measured = [r["verdict"] != TOO_FEW for r in rows]
    while drawn_so_far < resamples:
        batch = min(RESAMPLES, resamples - drawn_so_far)
        _resample(rng, batch, len(done), configs, values, members, events, claims, rows, same, outcomes)
        drawn_so_far += batch
        shares = same / drawn_so_far
        if all(
            replication_resolved(float(x), mc_error(float(x), drawn_so_far))
            for x, m in zip(shares, measured, strict=True)
            if m
        ):
            break
    if not drawn_so_far:
        return [(math.nan, math.nan, 0)] * len(rows)
    return [
        (float(x), mc_error(float(x), drawn_so_far), drawn_so_far) if m else (math.nan, math.nan, 0)
        for x, m in zip(same / drawn_so_far, measured, strict=True)
    ]


def _resample(
    rng: Any,
    resamples: int,
    n_runs: int,
    configs: list[Any],
    values: list[Any],
    members: list[list[Any]],
    events: list[bool],
    claims: Sequence[Claim],
    rows: list[dict[str, Any]],
    same: Any,
    outcomes: Outcomes | None,
) -> None:
    """``resamples`` draws of ``replication``: each row's count of verdicts like its own added to ``same``."""
    import numpy as np

    for _ in range(resamples):
        drawn = np.arange(n_runs)
        for runs in configs:
            # twice: a fresh seed set varies around the truth as much as this one did, and the truth
            # itself is this set's estimate give or take as much (a predictive resample, not a plain one)
            drawn[runs] = runs[rng.integers(0, len(runs), len(runs))][rng.integers(0, len(runs), len(runs))]
        redrawn = []
        for v, (a, b), rate in zip(values, members, events, strict=True):
            if rate:  # events: the configuration's rate drawn from its Jeffreys posterior, then its runs'
                v = v.copy()
                for runs in configs:
                    k = v[runs].sum()
                    v[runs] = rng.random(len(runs)) < rng.beta(k + 0.5, len(runs) - k + 0.5)
                redrawn.append((v[a], v[b]))
            else:
                redrawn.append((v[drawn[a]], v[drawn[b]]))
        verdicts = [r["verdict"] for r in _decide(claims, redrawn, outcomes)]
        same += [v == r["verdict"] for v, r in zip(verdicts, rows, strict=True)]


def _mean(s: Sequence[float]) -> float:
    x = [float(v) for v in s if v == v]  # NaN left out
    return sum(x) / len(x) if x else math.nan


def _pm(w: Welch, column: str) -> str:
    """A difference and its CI: "-0.107 ± 0.0652"; an accuracy's CI wider than its range (-1 to 1): "-0.11
    (interval not informative with 2 vs 2 seeds)"."""
    words = difference_words(w.half_width, w.n_a, w.n_b, SPANS[D_ID]) if column in (ID_AVG, OOD_AVG) else None
    return f"{_num(w.diff)} (interval {words})" if words else f"{_num(w.diff)} ± {_num(w.half_width)}"


def _num(v: float) -> str:
    return DASH if v is None or math.isnan(v) else f"{v:.3g}"


def read_verdicts(path: str | Path) -> dict[str, str]:
    """Claim -> verdict of a ``claims.csv`` written by ``klsweep report``."""
    return {c: v for c, (v, *_) in read_expected(path).items()}


def read_expected(path: str | Path) -> dict[str, tuple[str, float, float]]:
    """Claim -> (verdict, replication, its Monte Carlo standard error) of a ``claims.csv`` written by
    ``klsweep report``; replication NaN where the file has no such column (written before it) or no number
    there: such a verdict counts as robust; the error NaN where the file predates it (the share alone
    decides)."""
    import pandas as pd

    try:
        old = pd.read_csv(path, dtype=str, keep_default_na=False)
        nan = [math.nan] * len(old)
        shares, ses = (
            pd.to_numeric(old[col], errors="coerce") if col in old else nan
            for col in ("replication", "replication se")
        )
        return {
            c: (v, float(r), float(e))
            for c, v, r, e in zip(old["claim"], old["verdict"], shares, ses, strict=True)
        }
    except (OSError, UnicodeDecodeError, ValueError, KeyError, pd.errors.ParserError) as e:
        raise UserError(
            Problem(str(path), f"not a readable claims.csv ({e})", "a claims.csv written by klsweep report"),
            title="invalid claims file",
        ) from e


def verdict_changes(expected: dict[str, str], claims: pd.DataFrame | None) -> list[tuple[str, str, str]]:
    """(claim, expected verdict, this sweep's verdict) for every claim whose verdict is not the ``expected``
    one (``read_verdicts``), in ``expected``'s order then this sweep's; a claim on one side only reads
    ``MISSING`` on the other (a sweep without claims, ``claims`` None: every expected one). Empty: every verdict
    reproduced."""
    # names as claims.csv writes them (``csv_cell``): a name "=x" is read back "'=x"
    got = {} if claims is None else dict(zip(claims["claim"].map(csv_cell), claims["verdict"], strict=True))
    return [
        (c, expected.get(c, MISSING), got.get(c, MISSING))
        for c in dict.fromkeys([*expected, *got])
        if expected.get(c, MISSING) != got.get(c, MISSING)
    ]


def split_changes(
    changes: list[tuple[str, str, str]], expected: dict[str, tuple[str, float, float]]
) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """``verdict_changes`` split by the expected verdict's replication (``read_expected``): (the changes of
    robust verdicts, a failure to replicate; those of fragile ones, expected to change on other seeds or
    CPUs). An expected verdict without a replication, or a claim the expected table lacks, counts as robust."""
    robust = [c for c in changes if not fragile(*expected.get(c[0], ("", math.nan, math.nan))[1:])]
    return robust, [c for c in changes if c not in robust]
