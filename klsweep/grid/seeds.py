"""The seed rule's keys: a grid's ``seeds:`` section read into a ``SeedRule`` and checked up front against the
expanded grid, and the pilot it names. The rule itself (how many seeds each claim needs): ``klsweep.report.seedrule``;
what ``klsweep study`` does with it: docs/STUDY.md, "The seed rule".

    seeds:
      pilot: 3      # seeds each configuration trains first: its smallest 3 seeds in the grid
      target: 0.9   # the power each claim is sized to reach at its effect (default 0.9)

The grid's own seeds (``seed: range(10)``) are the budget: ``klsweep study`` trains the pilot, then, for each
claim, its configurations' next seeds up to what the claim needs, never past the seeds the grid lists. The
runs it adds are the grid's own runs (the same ids, folder and grid text), so ``--max-runs`` and ``klsweep plan``
count the budget. ``klsweep run`` trains the whole grid (the rule is the study's).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from klsweep.errors import Problem
from klsweep.printable import counted

if TYPE_CHECKING:
    from klsweep.grid.claims import Claim
    from klsweep.grid.plan import PlannedRun

KEYS = ("pilot", "target")
TARGET = 0.9  # the power a claim is sized to reach at its effect, unless the grid says
EXAMPLE = "seeds: {pilot: 3, target: 0.9}"


@dataclass(frozen=True)
class SeedRule:
    """``pilot``: seeds each configuration trains before the rule decides; ``target``: the power at each
    claim's effect (at level ALPHA over the claims) the rule sizes its configurations to reach."""

    pilot: int
    target: float = TARGET


def parse_seed_rule(value: Any, where: str, problems: list[Problem]) -> SeedRule | None:
    """``seeds:`` as a ``SeedRule`` (None when the grid has none); every problem recorded, key by key."""
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.append(Problem(where, f"{value!r}: must be a mapping", EXAMPLE))
        return None
    before = len(problems)
    for key in value:
        if key not in KEYS:
            from klsweep.grid.schema import unknown

            problems.append(unknown(f"{where}.{key}", str(key), KEYS, "seeds key"))
    pilot = value.get("pilot")
    if "pilot" not in value:
        problems.append(Problem(f"{where}.pilot", "missing: the seeds every configuration trains first", "3"))
    elif isinstance(pilot, bool) or not isinstance(pilot, int) or pilot < 2:
        problems.append(Problem(f"{where}.pilot", f"{pilot!r}", "an integer >= 2 (a spread needs two seeds)"))
    target = value.get("target", TARGET)
    if isinstance(target, bool) or not isinstance(target, int | float) or not (0.5 <= target < 1):
        problems.append(Problem(f"{where}.target", f"{target!r}", "a power in [0.5, 1), e.g. 0.9"))
    if len(problems) > before:
        return None
    return SeedRule(int(pilot), float(target))


def configuration(run: PlannedRun) -> str:
    """A run's configuration: its axes' values but the seed (the no-KL runs' KL-only keys as one), as text."""
    from klsweep.config import without_kl_when_off

    params = {k: v for k, v in without_kl_when_off(run.params).items() if k != "seed"}
    return json.dumps(params, sort_keys=True, default=str)


def seed_lists(runs: list[PlannedRun]) -> dict[str, list[PlannedRun]]:
    """Configuration (``configuration``) -> its runs, by seed (the grid's seeds in order: the budget)."""
    out: dict[str, list[PlannedRun]] = {}
    for r in runs:
        out.setdefault(configuration(r), []).append(r)
    return {c: sorted(rs, key=lambda r: (_seed(r), r.id)) for c, rs in out.items()}


def _seed(run: PlannedRun) -> float:
    seed = run.config.get("seed", 0)
    return float(seed) if isinstance(seed, int | float) and not isinstance(seed, bool) else math.inf


def pilot_ids(runs: list[PlannedRun], rule: SeedRule) -> set[str]:
    """The pilot's runs: each configuration's ``rule.pilot`` smallest seeds."""
    return {r.id for rs in seed_lists(runs).values() for r in rs[: rule.pilot]}


def check_seed_rule(
    rule: SeedRule, runs: list[PlannedRun], claims: list[Claim], where: str, problems: list[Problem]
) -> None:
    """The rule against the expanded grid (``runs``) and its ``claims``: every configuration has the pilot's
    seeds, there are claims to size, and each Welch claim has an effect to size it at (``effect:``, or its
    metric's default)."""
    short = {c: len(rs) for c, rs in seed_lists(runs).items() if len(rs) < rule.pilot}
    if short:
        listed = "; ".join(f"{shown(c)} ({counted(n, 'seed')})" for c, n in list(short.items())[:4])
        more = f" and {len(short) - 4} more" if len(short) > 4 else ""
        problems.append(
            Problem(
                f"{where}.pilot",
                f"{rule.pilot}, but {counted(len(short), 'configuration')} of the grid "
                f"{'has' if len(short) == 1 else 'have'} fewer seeds: {listed}{more}",
                f"seed: range(N) with N >= {rule.pilot} for every configuration (the grid's seeds are the "
                "budget), or a smaller pilot",
            )
        )
    if not claims:
        problems.append(
            Problem(
                where, "the grid states no claims: the rule sizes claims' configurations", "claims: [...]"
            )
        )
    file = where.rsplit(": ", 1)[0]
    for c in claims:
        if c.test == "welch" and c.effect is None and c.metric not in ("in_domain", "ood", "peak_kl"):
            problems.append(
                Problem(
                    f"{file}: claims ({c.name}).effect",
                    f"missing: the seed rule sizes a claim at its effect, and {c.metric!r} has no default",
                    "effect: 0.1 (absolute), or 50% (of b's mean)",
                )
            )


def shown(config: str) -> str:
    """A configuration (``configuration``) as the plan shows it: ``kl.estimator=k1, offpolicy.lag=0``."""
    params = json.loads(config)
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "the one configuration"
