"""What each claim of a grid file can detect with N seeds per configuration, from a committed study's spread.

    python bench/power.py sweeps/tiny.yaml results/tiny/report/runs.csv --seeds 6,10 --fresh 200

For every claim (``claims:`` of the grid file; the report's own filters, ``unbiased`` included, applied to the
committed runs) and every N: Welch: the smallest true difference detected with power ``POWER`` at level
ALPHA/m (m claims: the strictest level Holm may ask of a claim); TOST: the largest true difference still shown
equivalent within the margin at that level (as a fraction of the margin); Fisher: the power at that level at
the claim's effect (the report's rule for "not supported": a's rate ``RATE_EFFECT``, or the claim's
``effect:``, from b's observed rate), and at the observed rates (the chance of "supported" if they are the
truth). The committed runs' standard deviation over seeds stands for the new runs', over the stable runs only
(``klsweep.report.seedrule.side_spread``: a collapse left out of the SD, as the study's seed rule reads it);
each side has N runs a configuration. The rule that decides a study's seeds lives in klsweep
(``klsweep.report.seedrule``; the grid's ``seeds:``); this script is the what-if table. ``--fresh K``: also K simulated studies of N seeds a configuration
(``--keep KEY=VALUE:N``: the configurations with that value keep N seeds in every column), each
configuration's runs drawn from its committed ones as the report's replication column draws them
(``claims.replication``: twice with replacement; events at a rate drawn from the configuration's Jeffreys
posterior), every claim decided by the report's own rule (``claims_table``, Holm included): the share of them
reaching each verdict, "S/N/I/T" (supported, not supported, inconclusive, too few seeds). Prints a Markdown table
(docs/STUDY.md, "Study v4"), with what the committed runs showed for each claim.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klsweep.config import LEGACY_VALUES  # noqa: E402
from klsweep.grid.claims import Claim, read_claims_file  # noqa: E402
from klsweep.report.audit_table import SAMPLING, SETTINGS, audit_table, run_unbiased  # noqa: E402
from klsweep.report.claims import (  # noqa: E402
    METRIC_COLUMNS,
    REWARD_DROP,
    claim_side,
    claim_size,
    claims_table,
    finished,
    rate_at_effect,
    rate_power_args,
    unstable,
)
from klsweep.report.seedrule import side_spread  # noqa: E402
from klsweep.report.stability import reward_drop  # noqa: E402
from klsweep.report.statistics import (  # noqa: E402
    ALPHA,
    POWER,
    VERDICTS,
    Welch,
    rate_power,
    welch_power,
)
from klsweep.report.tables import fmt_value  # noqa: E402


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


def fisher_power(c: Claim, n_a: int, n_b: int, rate_a: float, rate_b: float, level: float) -> float:
    """The power of the claim's Fisher test with ``n_a`` and ``n_b`` runs at true rates ``rate_a``, ``rate_b``."""
    return rate_power(*rate_power_args(c, n_a, n_b, rate_a, rate_b), level)


def committed_runs(runs_csv: str | Path) -> Any:
    """A report's runs.csv as the report's claims read it: keys it predates at their legacy values, the
    ``reward drop`` (``stability.reward_drop``) where it predates that column, ``unbiased`` from the audit."""
    import pandas as pd

    runs = pd.read_csv(runs_csv)
    for key in (*SETTINGS, *SAMPLING):  # runs written before a key existed trained with its legacy value
        if key not in runs:
            runs[key] = LEGACY_VALUES.get(key)
    if REWARD_DROP not in runs:
        runs[REWARD_DROP] = reward_drop(runs)
    return runs.assign(unbiased=run_unbiased(runs, audit_table(runs)))


def simulated_verdicts(
    runs: Any, claims: list[Claim], sizes: dict[str, int], fresh: int, seed: int = 0
) -> list[dict[str, float]]:
    """Per claim (then group) of ``claims_table``: the share of ``fresh`` simulated studies, ``sizes[config]``
    runs a configuration drawn from its committed ones (module docstring), reaching each verdict."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    groups = {c: g for c, g in runs.groupby("config") if c in sizes}
    counts: list[dict[str, float]] = []
    for _ in range(fresh):
        parts = []
        for config, g in groups.items():
            n = sizes[config]
            picked = g.iloc[rng.integers(0, len(g), len(g))]  # the truth: this seed set give or take
            new = picked.iloc[rng.integers(0, len(g), n)].copy()
            k = int(unstable(g).sum())
            new["collapsed"] = rng.random(n) < rng.beta(k + 0.5, len(g) - k + 0.5)
            new["state"] = "done"
            parts.append(new)
        study = pd.concat(parts, ignore_index=True)
        study["run"] = [f"sim{i}" for i in range(len(study))]
        table = claims_table(study.drop(columns="unbiased"), audit_table(study), claims, resamples=0)
        if not counts:
            counts = [dict.fromkeys(VERDICTS, 0.0) for _ in range(len(table))]
        for tally, verdict in zip(counts, table["verdict"], strict=True):
            tally[verdict] += 1 / fresh
    return counts


def power_table(
    grid: str | Path,
    runs_csv: str | Path,
    seeds: list[int],
    fresh: int = 0,
    keep: dict[tuple[str, str], int] | None = None,
) -> list[dict[str, object]]:
    """One row per claim and N: the claim, the sides' sizes, and what it can detect; with ``fresh``, the share
    of simulated studies reaching each verdict, and a row per group of claims (module docstring). ``keep``:
    (key, value) -> the seeds the configurations with that value keep whatever N."""
    claims = read_claims_file(grid)
    runs = committed_runs(runs_csv)
    done = runs[finished(runs)]
    level = ALPHA / len(claims)
    sims = {n: simulated_verdicts(done, claims, _sizes(done, n, keep or {}), fresh) for n in seeds if fresh}
    rows = []
    for i, c in enumerate(claims):
        a, b = claim_side(done, {}, c.a), claim_side(done, {}, c.b)
        col = METRIC_COLUMNS.get(c.metric, c.metric)
        if not len(a) or not len(b):  # a pilot of some arms only (the v5 exploration: no lag 16)
            for n in seeds:
                row = {
                    "claim": c.name,
                    "committed": "no runs of a side",
                    "N": n,
                    "runs a/b": "—",
                    "detects": "—",
                }
                rows.append(row | ({"verdicts": "—"} if fresh else {}))
            continue
        if c.test == "fisher":
            seen = f"{int(unstable(a).sum())}/{len(a)} vs {int(unstable(b).sum())}/{len(b)} unstable"
        else:
            seen = f"difference {a[col].mean() - b[col].mean():.3g}"
        for n in seeds:
            sizes = _sizes(done, n, keep or {})
            na, nb = (sum(sizes[x] for x in dict.fromkeys(side["config"])) for side in (a, b))
            if c.test == "fisher":
                rb, ra_seen = unstable(b).mean(), unstable(a).mean()
                ra = rate_at_effect(c, rb)
                at_effect, at_seen = (
                    fisher_power(c, na, nb, ra, rb, level),
                    fisher_power(c, na, nb, ra_seen, rb, level),
                )
                what = f"power {at_effect:.2f} at a's rate {ra:.3g}, {at_seen:.2f} at the observed rates"
            elif c.test == "tost":
                margin = claim_size(c.margin, b[col])
                reach = equivalence_reach(side_spread(a, col), na, side_spread(b, col), nb, margin, level)
                what = f"difference within {reach:.0%} of the margin {margin:.3g}"
            else:
                sd_a, sd_b = side_spread(a, col), side_spread(b, col)
                what = f"difference {detectable_difference(sd_a, na, sd_b, nb, level):.3g}"
            row = {"claim": c.name, "committed": seen, "N": n, "runs a/b": f"{na}/{nb}", "detects": what}
            rows.append(row | ({"verdicts": _shares(sims[n][i])} if fresh else {}))
    for n in sims:  # the groups ("any of"): their verdicts only
        groups = list(dict.fromkeys(c.group for c in claims if c.group))
        for j, g in enumerate(groups):
            row = {"claim": g, "committed": "", "N": n, "runs a/b": "", "detects": "any of its claims"}
            rows.append(row | {"verdicts": _shares(sims[n][len(claims) + j])})
    return rows


def _sizes(done: Any, n: int, keep: dict[tuple[str, str], int]) -> dict[str, int]:
    """Configuration -> its runs in a study of ``n`` seeds, but ``keep``'s configurations (``power_table``)."""
    sizes = {}
    for config, g in done.groupby("config"):
        kept = [v for (key, value), v in keep.items() if fmt_value(g[key].iloc[0]) == value]
        sizes[config] = kept[0] if kept else n
    return sizes


def _shares(tally: dict[str, float]) -> str:
    return "/".join(f"{tally[v]:.2f}" for v in VERDICTS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("grid")
    p.add_argument("runs_csv")
    p.add_argument("--seeds", default="5,6,7,8")
    p.add_argument("--fresh", type=int, default=0, help="simulated studies per N (0: none)")
    p.add_argument("--keep", action="append", default=[], help="KEY=VALUE:N, e.g. offpolicy.lag=16:6")
    args = p.parse_args()
    keep = {}
    for k in args.keep:
        key, _, rest = k.partition("=")
        value, _, n = rest.rpartition(":")
        if not (key and value and n.isdigit()):
            p.error(f"--keep {k!r}: expected KEY=VALUE:N, e.g. offpolicy.lag=16:6")
        keep[(key, value)] = int(n)
    import pandas as pd

    columns = set(pd.read_csv(args.runs_csv, nrows=0).columns)
    for key in sorted({key for key, _ in keep} - columns):
        p.error(f"--keep: {key!r} is not a column of {args.runs_csv}")
    rows = power_table(args.grid, args.runs_csv, [int(s) for s in args.seeds.split(",")], args.fresh, keep)
    ns = sorted({r["N"] for r in rows})
    print("| claim | committed runs | " + " | ".join(f"N = {n}" for n in ns) + " |")
    print("|---|---|" + "---|" * len(ns))
    for claim in dict.fromkeys(r["claim"] for r in rows):
        mine = [r for r in rows if r["claim"] == claim]
        cells = [
            f"{r['detects']} ({r['runs a/b']})" + (f"; S/N/I/T {r['verdicts']}" if "verdicts" in r else "")
            for r in mine
        ]
        print(f"| {claim} | {mine[0]['committed']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
