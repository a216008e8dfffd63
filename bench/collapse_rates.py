"""The collapse rule's false-collapse rate on a stationary reward, per batch and rule (docs/COLLAPSE.md).

    python bench/collapse_rates.py --batch 4x4 --batch 4x8 --runs 1000

For every batch (prompts x completions per prompt), every rule (the defaults, and the tiny study's window 20 and
fraction 0.3) and every mean reward of ``klsweep.collapse.MEANS``: ``--runs`` simulated runs of ``--steps``
steps whose reward does not change, and the per cent of them the rule (``klsweep.collapse.find_collapse``, z
``train.collapse_z``'s default) stops. Two kinds of run: *independent*, each step's completions Bernoulli
draws at the mean (``collapse.false_collapses``, what the report states beside its stability table);
*grouped*, each prompt's success rate drawn from Beta(5 mean, 5 (1 - mean)), its completions Bernoulli draws at
that rate (a step's mean varies more than independent completions say: the tiny task's does, 1.3-1.5 x at 4 x 4).
Prints a Markdown table, one row per batch, kind and rule.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klsweep.collapse import MEANS, Rule, false_collapses, find_collapse  # noqa: E402
from klsweep.config import COLLAPSE_Z, TrainSection  # noqa: E402

RULES = {
    "defaults": (TrainSection().collapse_window, TrainSection().collapse_fraction),
    "tiny.yaml": (20, 0.3),
}


def grouped(rule: Rule, prompts: int, group: int, steps: int, runs: int, mean: float, seed: int) -> int:
    """How many of ``runs`` grouped runs at ``mean`` the rule stops."""
    import numpy as np

    rng = np.random.default_rng(seed)
    fired = 0
    for _ in range(runs):
        p = rng.beta(5 * mean, 5 * (1 - mean), size=(steps, prompts))
        x = (rng.random((steps, prompts, group)) < p[..., None]).reshape(steps, prompts * group)
        means, stds = x.mean(1).tolist(), x.std(1, ddof=1).tolist()
        fired += find_collapse(range(1, steps + 1), means, stds, rule) is not None
    return fired


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", action="append", default=[], help="PROMPTSxGROUP, e.g. 4x8 (repeatable)")
    parser.add_argument("--runs", type=int, default=1000, help="simulated runs per mean and cell")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    batches = [tuple(int(x) for x in b.split("x")) for b in args.batch or ["4x4", "4x8"]]
    print(f"| n, rewards | W, f | {' | '.join(f'{m:g}' for m in MEANS)} |")
    print("|---|---|" + "---|" * len(MEANS))
    for prompts, group in batches:
        n = prompts * group
        for kind in ("independent", "grouped"):
            for name, (window, fraction) in RULES.items():
                rule = Rule(window, fraction, COLLAPSE_Z, n)
                cells = []
                for i, mean in enumerate(MEANS):
                    if kind == "independent":
                        fired, _ = false_collapses(rule, args.steps, args.runs, args.seed + i, (mean,))
                    else:
                        fired = grouped(rule, prompts, group, args.steps, args.runs, mean, args.seed + i)
                    cells.append(f"{100 * fired / args.runs:.1f}".rstrip("0").rstrip("."))
                label = f"{n} ({prompts} x {group}), {kind}"
                print(f"| {label} | {window}, {fraction:g} ({name}) | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
