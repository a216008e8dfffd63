"""Is the claims' replication column calibrated? A simulation on synthetic studies whose truth is known.

    python bench/replication.py --studies 300 --fresh 40 --resamples 200

Each simulated study has one Welch claim ("in-domain accuracy of a is greater than b's", two configurations
of ``--seeds`` seeds each, the seeds' spread ``SD``) and one Fisher claim ("a has more unstable runs than b",
two configurations per side), with true effects drawn at random around the decision thresholds. The report's
own ``claims_table`` gives each claim its verdict and its replication (the share of bootstrap resamples of
the runs that reach the same verdict, Holm included); then ``--fresh`` new seed sets are drawn from the same
truth and the share of them that reach the original verdict is counted. Calibrated: in each bin of the
replication column, the fresh share is about the column's mean. Prints one Markdown row per bin
(docs/REPORT.md, "Replication"); ``calibration`` is what tests/unit/test_statistics.py runs, smaller.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klsweep.grid.claims import Claim  # noqa: E402
from klsweep.report.audit_table import SAMPLING, SETTINGS  # noqa: E402
from klsweep.report.claims import claims_table  # noqa: E402
from klsweep.report.data import ID_AVG  # noqa: E402

SD = 0.05  # the seeds' spread of an accuracy (the tiny study's is 0.03-0.08)
CLAIMS = [
    Claim("accuracy", "in_domain", "welch", "greater", {"arm": ["a"]}, {"arm": ["b"]}),
    Claim("unstable", "unstable", "fisher", "greater", {"arm": ["a"]}, {"arm": ["b"]}),
]
BINS = (0.0, 0.5, 0.8, 0.9, 1.01)


def runs_frame(rng: Any, truth: dict[str, float], seeds: int) -> Any:
    """Synthetic finished runs: per arm (a, b) two configurations of ``seeds`` runs; accuracy normal around
    the arm's mean (``truth``: ``mean_a``, ``mean_b``), unstable with the arm's rate (``rate_a``, ``rate_b``)."""
    import pandas as pd

    rows = []
    for arm in ("a", "b"):
        for config in (0, 1):
            for _ in range(seeds):
                rows.append(
                    {
                        "config": f"{arm}{config}",
                        "arm": arm,
                        "state": "done",
                        "collapsed": bool(rng.random() < truth[f"rate_{arm}"]),
                        ID_AVG: rng.normal(truth[f"mean_{arm}"], SD),
                    }
                )
    runs = pd.DataFrame(rows)
    for key in (*SETTINGS, *SAMPLING):
        runs[key] = None
    return runs.assign(**{"kl.beta": 0.0, "offpolicy.lag": 0, "offpolicy.num_iterations": 1})


def verdicts(runs: Any, resamples: int) -> tuple[list[str], list[float]]:
    import pandas as pd

    table = claims_table(runs, pd.DataFrame({"unbiased": []}), CLAIMS, resamples=resamples)
    return list(table["verdict"]), list(table["replication"])


def calibration(studies: int, fresh: int, resamples: int, seeds: int = 6, seed: int = 0) -> list[dict]:
    """Per simulated study and claim: its replication and the share of ``fresh`` seed sets (the same truth)
    whose verdict is the study's."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(studies):
        truth = {
            "mean_a": 0.5 + rng.uniform(-0.02, 0.12),
            "mean_b": 0.5,
            "rate_a": rng.uniform(0.0, 0.8),
            "rate_b": rng.uniform(0.0, 0.3),
        }
        got, shares = verdicts(runs_frame(rng, truth, seeds), resamples)
        again = [verdicts(runs_frame(rng, truth, seeds), 0)[0] for _ in range(fresh)]
        for i, claim in enumerate(CLAIMS):
            same = sum(v[i] == got[i] for v in again) / fresh
            out.append({"claim": claim.name, "verdict": got[i], "replication": shares[i], "fresh": same})
    return out


def by_bin(rows: list[dict]) -> list[dict]:
    """Per bin of the replication column: how many verdicts, their mean replication, their mean fresh share."""
    table = []
    for low, high in zip(BINS, BINS[1:], strict=False):
        inside = [r for r in rows if low <= r["replication"] < high]
        if inside:
            table.append(
                {
                    "bin": f"[{low:g}, {min(high, 1):g}{']' if high > 1 else ')'}",
                    "verdicts": len(inside),
                    "replication": sum(r["replication"] for r in inside) / len(inside),
                    "fresh": sum(r["fresh"] for r in inside) / len(inside),
                }
            )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", type=int, default=300)
    parser.add_argument("--fresh", type=int, default=40)
    parser.add_argument("--resamples", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1, help="of the simulation (docs/REPORT.md's table: 1)")
    args = parser.parse_args()
    rows = calibration(args.studies, args.fresh, args.resamples, args.seeds, args.seed)
    print("| replication | verdicts | mean replication | same verdict on fresh seeds |")
    print("|---|---|---|---|")
    for b in by_bin(rows):
        print(f"| {b['bin']} | {b['verdicts']} | {b['replication']:.2f} | {b['fresh']:.2f} |")


if __name__ == "__main__":
    main()
