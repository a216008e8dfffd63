"""Do the problem-level intervals cover at their level? A simulation on synthetic studies whose truth is known.

    python bench/problem_intervals.py [--studies 400] [--seeds 3] [--problems 500] [--seed-sd 0.2]

Each study: two configurations, ``--seeds`` seeds each, answering the same ``--problems`` problems of one task
(and, with ``--tasks 2``, of a second task averaged with it). An outcome is 1 with probability
logistic(config + seed + problem + config x problem): a problem's difficulty normal (sd ``PROBLEM_SD`` on the
logit scale, MATH-500-like: some problems almost always solved, some never), a seed's effect normal
(``--seed-sd``), the config x problem interaction normal (``INTERACTION_SD``), one sample per problem. The
truth (a configuration's accuracy: over the seeds and the problems such a benchmark draws from, and the
difference of the two) is computed on a million draws. Counted: how often the hierarchical bootstrap's 95%
interval of each configuration (``statistics.problem_bootstrap``) and the paired test's 95% interval of the
difference (``statistics.paired_problems``) hold the truth; beside them, the per-run method (t over seeds,
Welch), and a nested bootstrap (problems drawn afresh for each seed, as if not shared), which is too narrow.
Prints one Markdown row per method (docs/REPORT.md, "Problem-level statistics"); ``coverage`` is what
tests/unit/test_statistics.py runs, smaller.

    python bench/problem_intervals.py --replication 250 [--seeds 3]

checks instead the claims' replication column (bench/replication.py's calibration) on an accuracy claim tested
paired on the problems, and by Welch over seeds, at 3 seeds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klsweep.report import statistics as st  # noqa: E402

PROBLEM_SD = 2.0  # logit scale: problems from ~always to ~never solved
INTERACTION_SD = 0.5  # a configuration helps some problems more than others
EFFECTS = (0.0, 0.3)  # the two configurations' logit shifts


def _logistic(x: Any) -> Any:
    import numpy as np

    return 1 / (1 + np.exp(-x))


def truth(seed_sd: float, rng: Any, draws: int = 1_000_000) -> tuple[float, float]:
    """The two configurations' true accuracies (over seeds, problems and the interaction)."""
    problem = rng.normal(0, PROBLEM_SD, draws)
    seed = rng.normal(0, seed_sd, draws)
    return tuple(
        float(_logistic(e + seed + problem + rng.normal(0, INTERACTION_SD, draws)).mean()) for e in EFFECTS
    )


def study(rng: Any, seeds: int, problems: int, tasks: int, seed_sd: float) -> tuple[list[Any], Any]:
    """Two configurations' matrices (seeds x problems, weighted as ``problems.py`` writes them) and each
    column's task."""
    import numpy as np

    task = np.repeat(np.arange(tasks), problems)
    difficulty = rng.normal(0, PROBLEM_SD, len(task))
    out = []
    for e in EFFECTS:
        logit = e + rng.normal(0, seed_sd, (seeds, 1)) + difficulty + rng.normal(0, INTERACTION_SD, len(task))
        out.append((rng.random(logit.shape) < _logistic(logit)) / (tasks * problems))
    return out, task


def _nested(m: Any, task: Any, rng: Any, resamples: int) -> tuple[float, float]:
    """The nested bootstrap: seeds drawn, then each drawn seed's problems drawn afresh (wrong here)."""
    import numpy as np

    rows = m[rng.integers(0, len(m), (resamples, len(m)))]  # resamples x seeds x problems
    cols = rng.integers(0, m.shape[1], rows.shape)
    totals = np.take_along_axis(rows, cols, axis=2).sum(axis=2).mean(axis=1)
    return tuple(np.quantile(totals, [0.025, 0.975]))


def coverage(
    studies: int, seeds: int = 3, problems: int = 500, tasks: int = 1, seed_sd: float = 0.2, seed: int = 0,
    resamples: int = st.BOOTSTRAP,
) -> dict[str, float]:  # fmt: skip
    """Per method, the share of ``studies`` whose 95% interval holds the truth (the configurations' intervals:
    both counted; the differences: one per study) and, for the differences, the mean half-width."""
    import numpy as np

    rng = np.random.default_rng(seed)
    true = truth(seed_sd, rng)
    hits = dict.fromkeys(["bootstrap", "nested bootstrap", "t over seeds", "union", "paired", "Welch"], 0)
    width = {"paired": 0.0, "Welch": 0.0}
    for _ in range(studies):
        (a, b), task = study(rng, seeds, problems, tasks, seed_sd)
        for m, t in zip((a, b), true, strict=True):
            _, low, high = st.problem_bootstrap(m, task, resamples, seed=int(rng.integers(1 << 31)))
            hits["bootstrap"] += low <= t <= high
            mean, half, _ = st.t_interval(m.sum(axis=1))
            hits["t over seeds"] += abs(mean - t) <= half
            hits["union"] += min(low, mean - half) <= t <= max(high, mean + half)  # the report's (tables.py)
            low, high = _nested(m, task, rng, resamples)
            hits["nested bootstrap"] += low <= t <= high
        diff = true[0] - true[1]
        for name, w in (("paired", st.paired_problems(a, b, task)), ("Welch", st.welch(a.sum(1), b.sum(1)))):
            hits[name] += abs(w.diff - diff) <= w.half_width
            width[name] += w.half_width / studies
    out = {k: v / (2 * studies if k in ("bootstrap", "nested bootstrap", "t over seeds", "union") else studies)
           for k, v in hits.items()}  # fmt: skip
    return out | {f"{k} half-width": v for k, v in width.items()}


def replication(
    studies: int, fresh: int, paired: bool, seeds: int = 3, problems: int = 300, seed: int = 5
) -> Any:
    """The replication column of an accuracy claim ("a greater than b", two configurations of ``seeds`` seeds
    a side, one task of ``problems`` shared problems, a's logit shift uniform in [0, 0.4]) tested ``paired``
    on the problems or (False) by Welch over seeds: per study its verdict, replication (100 resamples) and the
    share of ``fresh`` seed sets (the same problems, new seeds) reaching that verdict; one row per bin of the
    column (as bench/replication.py prints it)."""
    import numpy as np
    import pandas as pd
    import replication as calibration

    from klsweep.grid.claims import Claim
    from klsweep.report.claims import claims_table
    from klsweep.report.data import ID_AVG
    from klsweep.report.problems import ProblemMatrix

    claim = [Claim("acc", "in_domain", "welch", "greater", {"arm": ["a"]}, {"arm": ["b"]})]
    audit = pd.DataFrame({"unbiased": []})
    rng = np.random.default_rng(seed)

    def draw(shift: float, difficulty: Any) -> tuple[Any, Any]:
        runs = calibration.runs_frame(rng, {"mean_a": 0, "mean_b": 0, "rate_a": 0, "rate_b": 0}, seeds)
        runs["run"] = [f"r{i}" for i in range(len(runs))]
        logit = np.where(runs["arm"].to_numpy()[:, None] == "a", shift, 0.0) + difficulty
        logit = logit + rng.normal(0, 0.1, (len(runs), 1))
        values = (rng.random(logit.shape) < _logistic(logit)) / problems
        runs[ID_AVG] = values.sum(axis=1)
        matrix = ProblemMatrix(list(runs["run"]), ["t"], np.zeros(problems, dtype=int), values)
        return runs, {ID_AVG: matrix} if paired else None

    rows = []
    for _ in range(studies):
        shift, difficulty = rng.uniform(0, 0.4), rng.normal(0, PROBLEM_SD, problems)
        runs, outcomes = draw(shift, difficulty)
        got = claims_table(runs, audit, claim, resamples=100, outcomes=outcomes).iloc[0]
        same = [
            claims_table(r, audit, claim, resamples=0, outcomes=o).iloc[0]["verdict"] == got["verdict"]
            for r, o in (draw(shift, difficulty) for _ in range(fresh))
        ]
        rows.append({"replication": got["replication"], "fresh": sum(same) / fresh})
    return calibration.by_bin(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--studies", type=int, default=400)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--problems", type=int, default=500)
    p.add_argument("--tasks", type=int, default=1)
    p.add_argument("--seed-sd", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replication", type=int, default=0, help="studies of the replication check (0: none)")
    args = p.parse_args()
    for paired in (True, False) if args.replication else ():
        print(
            f"replication column, accuracy claim tested {'paired on the problems' if paired else 'by Welch'}:"
        )
        print(
            "| replication | verdicts | mean replication | same verdict on fresh seeds |\n|---|---|---|---|"
        )
        for b in replication(args.replication, 30, paired, args.seeds):
            print(f"| {b['bin']} | {b['verdicts']} | {b['replication']:.2f} | {b['fresh']:.2f} |")
    if args.replication:
        return
    res = coverage(args.studies, args.seeds, args.problems, args.tasks, args.seed_sd, args.seed)
    print(f"| seeds | problems x tasks | seed sd | {' | '.join(res)} |")
    print("|---" * (3 + len(res)) + "|")
    cells = " | ".join(f"{v:.3f}" for v in res.values())
    print(f"| {args.seeds} | {args.problems} x {args.tasks} | {args.seed_sd:g} | {cells} |")


if __name__ == "__main__":
    main()
