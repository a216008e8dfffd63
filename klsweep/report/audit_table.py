"""The KL gradient audit table: for each KL configuration in the sweep (estimator, placement, level, and for
off-policy runs the importance weighting), whether its expected gradient is the reverse-KL gradient, from the
exact enumeration of ``klsweep.audit`` (computed once per process)."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from klsweep.report.tables import DASH, _sort_key

if TYPE_CHECKING:
    import pandas as pd


def _audit_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per KL configuration in the sweep (estimator, placement, level, and for off-policy runs the
    importance weighting), with the exact on-policy or off-policy audit of its expected gradient."""
    import pandas as pd

    off = (runs["offpolicy.lag"].fillna(0).astype(float) > 0) | (
        runs["offpolicy.num_iterations"].fillna(1).astype(float) > 1
    )
    no_kl = runs["kl.beta"].fillna(0).astype(float) == 0
    keys = [
        ("none",) * 4 if nk else (est, plc, lvl, imp if o else "on-policy")
        for nk, o, est, plc, lvl, imp in zip(
            no_kl,
            off,
            runs["kl.estimator"],
            runs["kl.placement"],
            runs["kl.level"],
            runs["kl.importance"],
            strict=True,
        )
    ]
    counts: dict[tuple[Any, ...], list[int]] = {}
    for k, c in zip(keys, runs["config"], strict=True):
        counts.setdefault(k, []).append(c)
    on_policy = (
        {(r.estimator, r.placement, r.level): r for r in _audit(0.0, "none")}
        if any(k[3] == "on-policy" for k in counts)
        else {}
    )
    off_policy = (
        {(r.estimator, r.placement, r.level, r.importance): r for r in _audit(0.5, "all")}
        if any(k[3] != "on-policy" and k[0] != "none" for k in counts)
        else {}
    )
    rows = []
    for k in sorted(counts, key=_sort_key):
        est, plc, lvl, imp = k
        row = {
            "estimator": est,
            "placement": plc,
            "level": lvl,
            "sampling": {"on-policy": "on-policy", "none": "off-policy, no importance weights"}.get(
                imp, f"off-policy, importance={imp}"
            )
            if est != "none"
            else DASH,
            "configurations": len(set(counts[k])),
            "runs": len(counts[k]),
        }
        a = on_policy.get((est, plc, lvl)) if imp == "on-policy" else off_policy.get((est, plc, lvl, imp))
        if est == "none" or a is None:
            row |= {
                "rel. err. reverse": math.nan,
                "rel. err. forward": math.nan,
                "grad variance": math.nan,
                "verdict": "no KL term (beta = 0)" if est == "none" else "not audited",
                "unbiased": DASH,
            }
        else:
            row |= {
                "rel. err. reverse": a.rel_err_reverse,
                "rel. err. forward": a.rel_err_forward,
                "grad variance": a.grad_variance,
                "verdict": a.verdict,
                "unbiased": "yes" if a.verdict == "unbiased reverse KL" else "no",
            }
        rows.append(row)
    return pd.DataFrame(rows)


@functools.cache
def _audit(behavior_shift: float, importance: str) -> tuple[Any, ...]:
    """``klsweep.audit.audit`` with its default policy (deterministic: computed once per process)."""
    from klsweep import audit

    return tuple(audit.cached_audit(behavior_shift=behavior_shift, importance=importance))
