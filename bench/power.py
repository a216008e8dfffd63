"""What each claim of a grid file can detect with N seeds per configuration, from a committed study's spread.

    python bench/power.py sweeps/tiny.yaml results/tiny/report/runs.csv --seeds 5,6,7,8

For every claim (``claims:`` of the grid file; the report's own filters, ``unbiased`` included, applied to the
committed runs) and every N: Welch: the smallest true difference detected with power ``POWER`` at level
ALPHA/m (m claims: the strictest level Holm may ask of a claim); TOST: the largest true difference still shown
equivalent within the margin at that level (as a fraction of the margin); Fisher: the fewest unstable runs of
the riskier side (the other side having none) that reach p < ALPHA/m. The committed runs' standard deviation
over seeds stands for the new runs'; each side's size scales from the committed seeds to N. Prints a
Markdown table (docs/STUDY.md, "Seeds per arm"), with what the committed runs showed for each claim.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klsweep.config import LEGACY_VALUES  # noqa: E402
from klsweep.grid.claims import read_claims_file  # noqa: E402
from klsweep.report.audit_table import SAMPLING, SETTINGS, audit_table, run_unbiased  # noqa: E402
from klsweep.report.claims import METRIC_COLUMNS, claim_side, claim_size, finished, unstable  # noqa: E402
from klsweep.report.statistics import ALPHA, POWER, Welch, rate_test, welch_power  # noqa: E402


def detectable_difference(sd_a: float, n_a: int, sd_b: float, n_b: int, level: float) -> float:
    """The smallest true |mean(a) - mean(b)| that one-sided Welch detects with power ``POWER`` at ``level``."""
    from scipy import optimize

    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
    w = Welch(0.0, math.nan, 0.0, df, math.nan, n_a, n_b, se)
    return float(optimize.brentq(lambda e: welch_power(w, e, level) - POWER, 1e-9 * se, 100 * se))


def equivalence_reach(sd_a: float, n_a: int, sd_b: float, n_b: int, margin: float, level: float) -> float:
    """The largest observed |difference| that TOST still calls equivalent at ``level``, over the margin."""
    from scipy import stats

    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
    return max(0.0, margin - float(stats.t.ppf(1 - level, df)) * se) / margin


def fewest_events(n_a: int, n_b: int, level: float) -> int | None:
    """The fewest events of n_a (none of n_b) with Fisher's one-sided p < ``level``; None: none can."""
    return next((k for k in range(1, n_a + 1) if rate_test(k, n_a, 0, n_b)[0] < level), None)


def power_table(grid: str | Path, runs_csv: str | Path, seeds: list[int]) -> list[dict[str, object]]:
    """One row per claim and N: the claim, the sides' sizes, and what it can detect (module docstring)."""
    import pandas as pd

    claims = read_claims_file(grid)
    runs = pd.read_csv(runs_csv)
    for key in (*SETTINGS, *SAMPLING):  # runs written before a key existed trained with its legacy value
        if key not in runs:
            runs[key] = LEGACY_VALUES.get(key)
    runs = runs.assign(unbiased=run_unbiased(runs, audit_table(runs)))
    done = runs[finished(runs)]
    committed = int(runs.groupby("config").size().max())
    level = ALPHA / len(claims)
    rows = []
    for c in claims:
        a, b = claim_side(done, {}, c.a), claim_side(done, {}, c.b)
        col = METRIC_COLUMNS.get(c.metric, c.metric)
        if c.test == "fisher":
            seen = f"{int(unstable(a).sum())}/{len(a)} vs {int(unstable(b).sum())}/{len(b)} unstable"
        else:
            seen = f"difference {a[col].mean() - b[col].mean():.3g}"
        for n in seeds:
            na, nb = round(len(a) * n / committed), round(len(b) * n / committed)
            if c.test == "fisher":
                k = fewest_events(na, nb, level)
                what = f"{k}/{na} unstable vs 0/{nb}" if k else "nothing (too few runs)"
            elif c.test == "tost":
                margin = claim_size(c.margin, b[col])
                reach = equivalence_reach(a[col].std(), na, b[col].std(), nb, margin, level)
                what = f"difference within {reach:.0%} of the margin {margin:.3g}"
            else:
                what = f"difference {detectable_difference(a[col].std(), na, b[col].std(), nb, level):.3g}"
            rows.append(
                {"claim": c.name, "committed": seen, "N": n, "runs a/b": f"{na}/{nb}", "detects": what}
            )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("grid")
    p.add_argument("runs_csv")
    p.add_argument("--seeds", default="5,6,7,8")
    args = p.parse_args()
    rows = power_table(args.grid, args.runs_csv, [int(s) for s in args.seeds.split(",")])
    ns = sorted({r["N"] for r in rows})
    print("| claim | committed runs | " + " | ".join(f"N = {n}" for n in ns) + " |")
    print("|---|---|" + "---|" * len(ns))
    for claim in dict.fromkeys(r["claim"] for r in rows):
        mine = [r for r in rows if r["claim"] == claim]
        cells = [f"{r['detects']} ({r['runs a/b']})" for r in mine]
        print(f"| {claim} | {mine[0]['committed']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
