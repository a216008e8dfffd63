"""The tests of a report: each configuration against its references, and the study's claims with a verdict.

``comparisons_table``: each configuration against no KL and k1 in the reward (Welch over seeds).
``claims_table``: the claims of arXiv 2512.21852 (a)-(d), each tested on this sweep's runs and given a verdict
(supported, not supported, inconclusive) by ``statistics.RULE``; ``read_verdicts``/``verdict_changes``
compare them with a committed ``claims.csv``. The claims, their tests and the decision rule:
docs/REPORT.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.errors import Problem, UserError
from klsweep.report.audit_table import run_unbiased
from klsweep.report.data import ID_AVG, OOD_AVG, nan_to_none
from klsweep.report.statistics import (
    ALPHA,
    EFFECT,
    EQUIVALENCE,
    INCONCLUSIVE,
    NOT_SUPPORTED,
    POWER,
    SUPPORTED,
    rate_test,
    tost,
    welch,
    welch_power,
)
from klsweep.report.tables import DASH, KL_KEYS, fmt_value, kl_on

if TYPE_CHECKING:
    import pandas as pd

PEAK_KL = "peak KL k3"
REFERENCES = ("no KL", "k1 in reward")
CLAIM_COLUMNS = ["claim", "verdict", "test", "statistic", "p_value", "n", "detail"]
MISSING = "missing"


def _non_kl_axes(axes: list[str]) -> list[str]:
    return [a for a in axes if a not in (*KL_KEYS, "kl.reward_mode")]


def _is(runs: pd.DataFrame, estimator: str, placement: str) -> pd.Series:
    return kl_on(runs) & (runs["kl.estimator"] == estimator) & (runs["kl.placement"] == placement)


def comparisons_table(runs: pd.DataFrame, axes: list[str], metrics: Sequence[str]) -> pd.DataFrame:
    """One row per configuration, reference (``REFERENCES``) and metric with data on both sides."""
    import pandas as pd

    shared = _non_kl_axes(axes)
    configs = runs.groupby("config", sort=True)
    first = configs.first()
    with_kl = kl_on(first)
    k1_reward = _is(first, "k1", "reward")

    def same(i: int, j: int, keys: list[str]) -> bool:
        return all(fmt_value(first.at[i, a]) == fmt_value(first.at[j, a]) for a in keys)

    rows = []
    for i in first.index:
        for ref_name, is_ref, keys in zip(
            REFERENCES, (~with_kl, k1_reward), (shared, [*shared, "kl.beta"]), strict=True
        ):
            if is_ref[i]:
                continue
            refs = [j for j in first.index if is_ref[j] and same(i, j, keys)]
            if len(refs) != 1:
                continue
            j = refs[0]
            for m in metrics:
                a, b = configs.get_group(i)[m].dropna(), configs.get_group(j)[m].dropna()
                if a.empty or b.empty:
                    continue
                w = welch(list(a), list(b))
                rows.append(
                    {
                        "configuration": first.at[i, "label"],
                        "reference": ref_name,
                        "reference configuration": first.at[j, "label"],
                        "metric": m,
                        "difference": w.diff,
                        "difference ci": w.half_width,
                        "t": w.t,
                        "df": w.df,
                        "p": w.p,
                        "n": w.n_a,
                        "n reference": w.n_b,
                    }
                )
    cols = ["configuration", "reference", "reference configuration", "metric", "difference", "difference ci"]
    return pd.DataFrame(rows, columns=[*cols, "t", "df", "p", "n", "n reference"])


def _finished(runs: pd.DataFrame) -> pd.Series:
    return runs["state"].isin(["done", "diverged"])


def _unstable(runs: pd.DataFrame) -> pd.Series:
    return (runs["state"] == "diverged") | runs["collapsed"].astype(bool)


def _on_policy(runs: pd.DataFrame) -> pd.Series:
    lag = runs["offpolicy.lag"].map(lambda v: float(nan_to_none(v) or 0))
    its = runs["offpolicy.num_iterations"].map(lambda v: float(nan_to_none(v) or 1))
    return (lag == 0) & (its <= 1)


def _rate_claim(claim: str, a: pd.DataFrame, b: pd.DataFrame, names: tuple[str, str]) -> dict[str, Any]:
    """Fisher's exact test that group a is unstable more often than group b."""
    ua, ub = int(_unstable(a).sum()), int(_unstable(b).sum())
    p, best = rate_test(ua, len(a), ub, len(b))
    detail = f"unstable: {names[0]} {ua}/{len(a)}, {names[1]} {ub}/{len(b)}"
    if math.isnan(p):
        verdict, why = INCONCLUSIVE, "a group has no finished run"
    elif p < ALPHA:
        verdict, why = SUPPORTED, ""
    elif not best < ALPHA:
        verdict, why = INCONCLUSIVE, f"underpowered: no outcome with these group sizes gives p < {ALPHA:g}"
    else:
        verdict, why = NOT_SUPPORTED, ""
    diff = ua / len(a) - ub / len(b) if len(a) and len(b) else math.nan
    return {
        "claim": claim,
        "verdict": verdict,
        "test": "Fisher's exact test, one-sided; statistic: difference of unstable rates",
        "statistic": diff,
        "p_value": p,
        "n": len(a) + len(b),
        "detail": detail + (f"; {why}" if why else ""),
    }


def _welch_claim(
    claim: str, a: pd.Series, b: pd.Series, names: tuple[str, str], effect: float, what: str
) -> dict[str, Any]:
    """Welch's one-sided test that mean(a) > mean(b); power at ``effect``."""
    w = welch(list(a.dropna()), list(b.dropna()), alternative="greater")
    detail = (
        f"{what}: {names[0]} {_num(w.diff + _mean(b))} (n={w.n_a}) vs {names[1]} {_num(_mean(b))} (n={w.n_b}); "
        f"difference {_num(w.diff)} ± {_num(w.half_width)}"
    )
    power = welch_power(w, effect)
    if math.isnan(w.p):
        verdict, why = INCONCLUSIVE, "fewer than 2 values in a group, or no spread"
    elif w.p < ALPHA:
        verdict, why = SUPPORTED, ""
    elif w.p > 1 - ALPHA:
        verdict, why = NOT_SUPPORTED, "significant in the other direction"
    elif power >= POWER:
        verdict, why = NOT_SUPPORTED, f"power {power:.2f} at an effect of {_num(effect)}"
    else:
        verdict, why = INCONCLUSIVE, f"underpowered: power {power:.2f} at an effect of {_num(effect)}"
    return {
        "claim": claim,
        "verdict": verdict,
        "test": "Welch's t-test, one-sided; statistic: t",
        "statistic": w.t,
        "p_value": w.p,
        "n": w.n_a + w.n_b,
        "detail": detail + (f"; {why}" if why else ""),
    }


def _equivalence_claim(
    claim: str, a: pd.Series, b: pd.Series, names: tuple[str, str], margin: float, what: str
) -> dict[str, Any]:
    """TOST: mean(a) equals mean(b) within ± margin."""
    p, w = tost(list(a.dropna()), list(b.dropna()), margin)
    detail = (
        f"{what}: {names[0]} {_num(w.diff + _mean(b))} (n={w.n_a}) vs {names[1]} {_num(_mean(b))} (n={w.n_b}); "
        f"difference {_num(w.diff)} ± {_num(w.half_width)}, margin ±{_num(margin)}"
    )
    if math.isnan(p) or math.isnan(margin):
        verdict, why = INCONCLUSIVE, "fewer than 2 values in a group, or no spread"
    elif p < ALPHA:
        verdict, why = SUPPORTED, "equivalent within the margin"
    elif w.p < ALPHA:
        verdict, why = NOT_SUPPORTED, f"they differ (two-sided Welch p = {w.p:.3g})"
    else:
        verdict, why = INCONCLUSIVE, "not different, but not shown equivalent (underpowered)"
    return {
        "claim": claim,
        "verdict": verdict,
        "test": "equivalence: two one-sided Welch tests (TOST); statistic: difference of means",
        "statistic": w.diff,
        "p_value": p,
        "n": w.n_a + w.n_b,
        "detail": detail + f"; {why}",
    }


def _mean(s: pd.Series) -> float:
    s = s.dropna()
    return float(s.mean()) if len(s) else math.nan


def _num(v: float) -> str:
    return DASH if v is None or math.isnan(v) else f"{v:.3g}"


def claims_table(runs: pd.DataFrame, audit: pd.DataFrame) -> pd.DataFrame:
    """One row per claim (see the module docstring): ``CLAIM_COLUMNS``."""
    import pandas as pd

    r = runs.assign(unbiased=run_unbiased(runs, audit))
    done = r[_finished(r)]
    kl, on = kl_on(done), _on_policy(done)
    biased, unbiased = done[kl & (done["unbiased"] == "no")], done[kl & (done["unbiased"] == "yes")]
    no_kl = done[~kl]
    acc, kl_eff = EFFECT["accuracy"], EFFECT["peak KL"]
    k1_loss_on = done[_is(done, "k1", "loss") & on]
    no_kl_on = no_kl[_on_policy(no_kl)]
    rows = [
        _rate_claim(
            "(a) biased KL configurations are unstable on-policy",
            biased[_on_policy(biased)],
            unbiased[_on_policy(unbiased)],
            ("biased", "unbiased"),
        ),
        _equivalence_claim(
            "(b) k1 in the loss behaves like no KL: peak KL",
            k1_loss_on[PEAK_KL],
            no_kl_on[PEAK_KL],
            ("k1 in loss", "no KL"),
            EQUIVALENCE["peak KL"] * abs(_mean(no_kl_on[PEAK_KL])),
            "peak KL (k3), on-policy",
        ),
        _equivalence_claim(
            "(b) k1 in the loss behaves like no KL: in-domain accuracy",
            k1_loss_on[ID_AVG],
            no_kl_on[ID_AVG],
            ("k1 in loss", "no KL"),
            EQUIVALENCE["accuracy"],
            "in-domain average, on-policy",
        ),
        _welch_claim(
            "(c) unbiased KL configurations are better in-domain",
            unbiased[ID_AVG],
            biased[ID_AVG],
            ("unbiased", "biased"),
            acc,
            "in-domain average",
        ),
        _welch_claim(
            "(c) unbiased KL configurations are better out of domain",
            unbiased[OOD_AVG],
            biased[OOD_AVG],
            ("unbiased", "biased"),
            acc,
            "OOD average",
        ),
        _rate_claim(
            "(d) KL stabilises off-policy training: fewer unstable runs",
            no_kl[~_on_policy(no_kl)],
            done[kl & ~on],
            ("no KL", "KL"),
        ),
        _welch_claim(
            "(d) KL stabilises off-policy training: lower peak KL",
            no_kl[~_on_policy(no_kl)][PEAK_KL],
            done[kl & ~on][PEAK_KL],
            ("no KL", "KL"),
            kl_eff * abs(_mean(no_kl[~_on_policy(no_kl)][PEAK_KL])),
            "peak KL (k3), off-policy",
        ),
    ]
    return pd.DataFrame(rows, columns=CLAIM_COLUMNS)


def read_verdicts(path: str | Path) -> dict[str, str]:
    """Claim -> verdict of a ``claims.csv`` written by ``klsweep report``."""
    import pandas as pd

    try:
        old = pd.read_csv(path, dtype=str, keep_default_na=False)
        return dict(zip(old["claim"], old["verdict"], strict=True))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, pd.errors.ParserError) as e:
        raise UserError(
            Problem(str(path), f"not a readable claims.csv ({e})", "a claims.csv written by klsweep report"),
            title="invalid claims file",
        ) from e


def verdict_changes(expected: dict[str, str], claims: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(claim, expected verdict, this sweep's verdict) for every claim whose verdict is not the ``expected``
    one (``read_verdicts``), in ``expected``'s order then this sweep's; a claim on one side only reads
    ``MISSING`` on the other. Empty: every verdict reproduced."""
    got = dict(zip(claims["claim"], claims["verdict"], strict=True))
    return [
        (c, expected.get(c, MISSING), got.get(c, MISSING))
        for c in dict.fromkeys([*expected, *got])
        if expected.get(c, MISSING) != got.get(c, MISSING)
    ]
