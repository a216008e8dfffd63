"""Which runs a grid holds: the cartesian product of each sub-grid's axes, minus the runs an exclude
matches, each built into its resolved config and deduplicated by run id (first one wins, in order); then
the axes whose value varies across the runs and each run's values of them (``PlannedRun.params``)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from klsweep import config as config_mod
from klsweep.errors import Problem
from klsweep.grid.plan import PlannedRun, run_id
from klsweep.grid.schema import lookup
from klsweep.grid.validate import hashable

# an assignment of keys -> (the resolved config, the group choices), or None when it cannot be built
Build = Callable[[dict[str, Any]], tuple[dict, dict[str, Any]] | None]


@dataclass
class Expansion:
    runs: dict[str, PlannedRun]  # run id -> run, in plan order (params not yet set: see ``varying_axes``)
    axes: list[str]  # every axis of every product, in order of first appearance
    values: dict[str, list[Any]]  # run id -> its values of ``axes`` (group axes: the option picked)
    matched: list[int]  # per exclude: the runs it dropped
    excluded: int  # runs dropped by any exclude
    merged: int  # runs that train the same thing as an earlier one (the same id), kept once
    swept: list[str]  # the axes written with several values (over every product)


def expand(
    products: list[dict[str, list[Any]]],
    base: dict[str, Any],
    excludes: list[dict[str, list[Any]]],
    build: Build,
    sweep_dir: Path,
) -> Expansion:
    """Every run of the products (axis key -> values) on top of ``base``, without the excluded ones."""
    all_axes = list(dict.fromkeys(k for axes in products for k in axes))
    runs: dict[str, PlannedRun] = {}
    matched = [0] * len(excludes)
    excluded = merged = 0
    effective: dict[str, list[Any]] = {}
    memo: dict[tuple, Any] = {}  # run_id's JSON of the sections runs share, and their rules
    for axes in products:
        keys = list(axes)
        for combo in itertools.product(*(axes[k] for k in keys)):
            assigned = dict(zip(keys, combo, strict=True))
            hit = False
            for i, ex in enumerate(excludes):
                if all(k in assigned and hashable(assigned[k]) in allowed for k, allowed in ex.items()):
                    matched[i] += 1
                    hit = True
            if hit:
                excluded += 1
                continue
            built = build(base | assigned)
            if built is None:
                continue
            config, choices = built
            rid = run_id(config, memo)
            if rid not in runs:
                runs[rid] = PlannedRun(rid, {}, config, sweep_dir / rid)
                effective[rid] = [choices[k] if k in choices else lookup(config, k) for k in all_axes]
            else:
                merged += 1
            if config_mod.kl_off_hashed_at(config):
                old = run_id(config, memo, legacy=True)
                if old != rid and old not in runs[rid].aliases:
                    runs[rid].aliases.append(old)
    written: dict[str, set[Any]] = {}
    for axes in products:
        for k, vs in axes.items():
            written.setdefault(k, set()).update(hashable(v) for v in vs)
    swept = [k for k in all_axes if len(written[k]) > 1]
    return Expansion(runs, all_axes, effective, matched, excluded, merged, swept)


def unmatched_excludes(
    excludes: list[dict[str, list[Any]]], matched: list[int], cmd_keys: set[str], where: str
) -> list[Problem]:
    """An exclude that dropped no run is a mistake, unless the command line set one of its keys."""
    problems = []
    for i, (ex, n) in enumerate(zip(excludes, matched, strict=True)):
        if n == 0 and not (set(ex) & cmd_keys):
            shown = ", ".join(f"{k}: {_show(v)}" for k, v in ex.items())
            problems.append(
                Problem(
                    f"{where}: exclude[{i}]",
                    f"{{{shown}}} matches no run",
                    "a partial assignment of axis values",
                )
            )
    return problems


def varying_axes(expansion: Expansion) -> list[str]:
    """The plan's axes: the axes whose value varies across the runs, then the KL fields that vary though
    no axis names them (e.g. set by a preset). Sets each run's ``params`` to its values of them."""
    runs, all_axes, effective = expansion.runs, expansion.axes, expansion.values
    columns = list(zip(*effective.values(), strict=True)) if effective else []
    varying = [k for k, col in zip(all_axes, columns, strict=True) if len({hashable(v) for v in col}) > 1]
    kl_extra = [
        f"kl.{f}"
        for f in (fld.name for fld in fields(config_mod.KLSection))
        if f"kl.{f}" not in varying and len({r.config["kl"][f] for r in runs.values()}) > 1
    ]
    axes_out = varying + kl_extra
    index = {k: i for i, k in enumerate(all_axes)}
    for rid, run in runs.items():
        vals = effective[rid]
        run.params = {k: vals[index[k]] if k in index else lookup(run.config, k) for k in axes_out}
    return axes_out


def _show(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, list) else str(v)
