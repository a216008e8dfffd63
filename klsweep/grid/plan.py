"""What a grid becomes: a ``Plan`` whose runs (``PlannedRun``) are each identified by the ``run_id`` of their
resolved config."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klsweep import config as config_mod


@dataclass
class PlannedRun:
    id: str
    params: dict[str, Any]  # dotted axis key -> this run's value (group axes: the option's name)
    config: dict[str, Any]  # the complete, resolved RunConfig as plain (JSON-able) data
    run_dir: Path


@dataclass
class Plan:
    name: str
    sweep_dir: Path
    runs: list[PlannedRun]
    axes: list[str]  # dotted keys whose value varies across runs
    excluded: int  # runs dropped by `exclude:`
    grid_text: str  # the grid file as written


def run_id(config: dict) -> str:
    """First 10 hex chars of sha256 over the canonical JSON of ``config`` without ``config.COSMETIC_KEYS``."""
    kept = dict(config)
    for key in config_mod.COSMETIC_KEYS:
        *parents, leaf = key.split(".")
        node = kept
        for part in parents:  # copy each section on the way down: the caller's dict is never touched
            if not isinstance(node.get(part), dict):
                break
            node[part] = dict(node[part])
            node = node[part]
        else:
            node.pop(leaf, None)
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]
