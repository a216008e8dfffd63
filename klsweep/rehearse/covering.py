"""Which runs a rehearsal trains: ``covering_runs``, a few runs of the plan that hold every value of ``COVERED``
at least once (seeds and beta collapse; a run without KL counts as its own value)."""

from __future__ import annotations

import json
from typing import Any

from klsweep.config import without_kl_when_off

COVERED = ("model.name", "kl.estimator", "kl.placement", "kl.level", "kl.reward_mode", "offpolicy.lag")


def covered_values(config: dict[str, Any]) -> dict[str, Any]:
    """The covered keys' values of a resolved config, the KL-only ones ``no KL`` without KL."""
    from klsweep.grid.schema import lookup

    values = without_kl_when_off({key: lookup(config, key) for key in (*COVERED, "kl.beta")})
    return {key: values[key] for key in COVERED}  # beta collapses


def covering_runs(runs: list[Any]) -> list[Any]:
    """A small subset of ``runs`` (planned runs) holding every value of ``COVERED`` at least once: greedy set
    cover, in plan order on ties."""
    values = [{(k, json.dumps(v)) for k, v in covered_values(r.config).items()} for r in runs]
    left = set().union(*values) if values else set()
    chosen = []
    while left:
        best = max(range(len(runs)), key=lambda i: (len(values[i] & left), -i))
        chosen.append(runs[best])
        left -= values[best]
    return chosen
