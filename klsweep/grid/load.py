"""The entry points: ``load_plan`` (a grid file and command-line overrides -> a ``Plan``) and
``compose_run_config`` (one run's file and overrides -> its resolved config). They only orchestrate:
``parse`` reads the file, a ``_Builder`` reads and checks keys and values and composes configs, ``expand``
makes the runs; every problem is collected before one ``UserError`` is raised.

A grid's size is counted before anything is expanded or checked (the product of its axis sizes, per sub-grid,
before excludes: ``range(10**6)`` is never listed): above ``max_runs`` (``--max-runs``, ``$KLSWEEP_MAX_RUNS``,
default ``DEFAULT_MAX_RUNS``) it is refused at once."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from klsweep import store
from klsweep.config import KL_ONLY_KEYS
from klsweep.errors import Problem, UserError
from klsweep.grid import claims, expand, labels, parse, seeds, shipped
from klsweep.grid.compose import RESET, Composer, shadowed
from klsweep.grid.overrides import Reader
from klsweep.grid.plan import Plan
from klsweep.grid.schema import Schema, under
from klsweep.grid.validate import Values

DEFAULT_OUT = "results"
DEFAULT_MAX_RUNS = 100_000
MAX_RUNS_ENV = "KLSWEEP_MAX_RUNS"


class _Builder:
    """The pieces that read, check and compose, sharing one list of problems (and one typed scratch config):
    ``reader`` (written keys and values), ``values`` (their checks), ``composer`` (Hydra composition)."""

    def __init__(self, searchpath: list[str], problems: list[Problem]):
        schema = Schema()
        self.composer = Composer(searchpath, schema, problems)
        self.values = Values(schema, self.composer.group_options, problems)
        self.reader = Reader(schema, self.values, self.composer.group_options, problems)


def load_plan(
    grid_path: str | Path,
    overrides: list[str] | None = None,
    out: str | Path | None = None,
    config_dirs: list[str] | None = None,
    max_runs: int | None = None,
) -> Plan:
    """Read, compose and validate a grid file; raise ``UserError`` listing every problem. A grid of more than
    ``max_runs`` runs (default: ``$KLSWEEP_MAX_RUNS``, else ``DEFAULT_MAX_RUNS``) is refused before it is
    expanded. ``grid_path`` may be a shipped grid's bare name (``tiny``: ``shipped.grid_file``)."""
    path = shipped.grid_file(grid_path)
    where = str(grid_path)
    problems: list[Problem] = []
    if not path.exists() and (hint := shipped.missing_hint(grid_path)) is not None:
        raise UserError(Problem(where, "no such file, nor a shipped grid", hint), title="no grid")
    if (name := shipped.resembled(grid_path)) is not None:
        what = f"no file {grid_path} here; the shipped grid `{name}` is `klsweep plan {name}`"
        raise UserError(
            Problem(where, what, "a grid file, or a shipped grid's name (klsweep grids)"), title="no grid"
        )
    limit = _limit(max_runs, problems)
    if out is not None and (what := store.not_a_folder(out)) is not None:
        problems.append(Problem("--out", what, "a folder (made if missing) to hold the sweep folders"))
    text, data = parse.read_grid_file(path, where, problems)
    name = parse.sweep_name(data, where, problems)

    before = len(problems)
    searchpath = parse.searchpath(data.get("searchpath"), path.parent, where, config_dirs, problems)
    if len(problems) > before:  # the config groups' options depend on it
        raise UserError(problems, title="invalid grid")
    b = _Builder(searchpath, problems)

    grids = parse.sub_grids(data.get("grid"), where, problems)
    count = _count_runs(b.reader, grids, overrides or [])
    if count > limit:
        problems.append(
            Problem(
                f"{where}: grid",
                f"{count:,} runs (the product of the axis sizes, before excludes) is more than the limit of "
                f"{limit:,}",
                f"at most {limit:,} runs: split the grid, or raise the limit with --max-runs N "
                f"(or {MAX_RUNS_ENV}=N)",
            )
        )
        raise UserError(problems, title="grid too large")
    base = b.reader.assignments(data.get("base"), f"{where}: base", allow_name=False)
    axes_by_grid = [
        {k: b.reader.axis(k, v, f"{where}: {label}.{k}") for k, v in g.items()} for label, g in grids
    ]
    file_axes = {k for axes in axes_by_grid for k in axes}
    cmd_single, cmd_sweep, removed = b.reader.command_line(overrides or [])
    if "name" in cmd_sweep:
        problems.append(Problem("command line: name", "a sweep has one name", "name=NAME"))
    name = cmd_single.pop("name", name)  # name=NAME renames the sweep: results/NAME/
    # the keys the command line sets or removes (a removed section: every axis inside it)
    cmd_keys = set(cmd_single) | set(cmd_sweep) | removed | {k for k in file_axes if under(k, removed)}
    excludes = parse.excludes(data.get("exclude"), where, b.reader.axis, file_axes | set(cmd_sweep), problems)
    claim_problems: list[Problem] = []  # with those of the claims' values against the expanded grid's
    tested = claims.parse_claims(data.get("claims"), f"{where}: claims", b.reader.schema, claim_problems)
    named = labels.parse_labels(data.get("labels"), f"{where}: labels", b.reader.schema, claim_problems)
    rule = seeds.parse_seed_rule(data.get("seeds"), f"{where}: seeds", claim_problems)
    if problems:
        raise UserError(problems + claim_problems, title="invalid grid")

    assert isinstance(name, str)
    base = {k: v for k, v in base.items() if k not in cmd_keys and not under(k, removed)}
    products = [
        {k: v for k, v in axes.items() if k not in cmd_keys and not under(k, removed)} | cmd_sweep
        for axes in axes_by_grid or [{}]
    ]
    sweep_dir = Path(out if out is not None else DEFAULT_OUT).absolute() / name
    # the command line's values last, in its order (a ~key inside a mapping removes what came before it)
    expansion = expand.expand(
        products, base, excludes, lambda a: b.composer.build(name, a | cmd_single), sweep_dir
    )
    b.values.check_kl(r.config for r in expansion.runs.values())
    problems.extend(expand.unmatched_excludes(excludes, expansion.matched, cmd_keys, where))
    configs = [r.config for r in expansion.runs.values()]
    # a beta the command line set may make the KL-only keys inert: its runs merged into one (grid.plan), their
    # values gone with the others
    narrowed = cmd_keys | (set(KL_ONLY_KEYS) if "kl.beta" in cmd_keys else set())
    claims.check_grid_values(tested, configs, f"{where}: claims", claim_problems, skip=narrowed)
    claims.check_overlap(tested, configs, f"{where}: claims", claim_problems, list(expansion.runs))
    labels.check_grid_values(named, configs, f"{where}: labels", claim_problems, skip=narrowed)
    if rule is not None and "seed" in cmd_keys:  # the command line chose the seeds: the rule is off
        rule = None
    if rule is not None and expansion.runs:
        expand.varying_axes(expansion)  # each run's params: the configurations the rule counts seeds of
        runs = list(expansion.runs.values())
        seeds.check_seed_rule(rule, runs, tested, f"{where}: seeds", claim_problems)
    problems += claim_problems
    if not expansion.runs and not problems:
        what = "every run is excluded" if expansion.excluded else "the grid has no run"
        problems.append(Problem(f"{where}: grid", what))
    if problems:
        raise UserError(problems, title="invalid grid")
    axes = expand.varying_axes(expansion)
    return Plan(
        name,
        sweep_dir,
        list(expansion.runs.values()),
        axes,
        expansion.excluded,
        text,
        expansion.merged,
        shadowed=shadowed(searchpath),
        swept=expansion.swept,
        seed_rule=rule,
    )


def _limit(max_runs: int | None, problems: list[Problem]) -> int:
    """The largest grid allowed: ``max_runs``, else ``$KLSWEEP_MAX_RUNS``, else ``DEFAULT_MAX_RUNS``."""
    if max_runs is not None:
        if max_runs < 1:
            problems.append(Problem("--max-runs", f"{max_runs}", "an integer >= 1"))
        return max(1, max_runs)
    raw = os.environ.get(MAX_RUNS_ENV)
    if raw is None:
        return DEFAULT_MAX_RUNS
    try:
        value = int(raw)
        if value < 1:
            raise ValueError(raw)
    except ValueError:
        problems.append(Problem(f"${MAX_RUNS_ENV}", f"{raw!r}", "an integer >= 1"))
        return DEFAULT_MAX_RUNS
    return value


def _count_runs(reader: Any, grids: list[tuple[str, dict]], overrides: list[str]) -> int:
    """The runs of the grid before excludes and deduplication: per sub-grid the product of its axis sizes (the
    command line's axes replace the file's), summed. Counts values without reading them."""
    cmd: dict[str, tuple[int, bool]] = {}  # key -> (size, is a sweep); the last word on a key wins
    for arg in overrides:
        key, n, is_sweep = reader.count_override(arg)
        cmd[key] = (n, is_sweep)
    sweeps = [n for n, is_sweep in cmd.values() if is_sweep]
    total = 0
    for _, g in grids or [("grid", {})]:
        sizes = [reader.count(k, v) for k, v in g.items() if str(k) not in cmd]
        total += math.prod(sizes) * math.prod(sweeps)
    return total


def compose_run_config(config_file: str | Path | None, overrides: list[str]) -> dict:
    """The resolved, validated config of one run: a run YAML (group choices and dotted or nested values, e.g.
    a run folder's ``config.yaml``) plus ``key=value`` overrides. Raises ``UserError`` listing every problem."""
    problems: list[Problem] = []
    data: Any = {}
    where = str(config_file)
    if config_file is not None:
        text = parse.read_text(Path(config_file), where, "run config")
        data = parse.load_yaml(text, where, problems)
        if data is None:
            data = {}
    b = _Builder([], problems)
    assignment = b.reader.assignments(data, where, allow_name=True)
    for arg in overrides:
        parsed = b.reader.override(arg)
        if parsed is not None:
            key, values, is_sweep = parsed
            if is_sweep:
                problems.append(
                    Problem(f"command line: {arg}", "a sweep, but one run takes one value", "key=value")
                )
                continue
            assignment.pop(key, None)  # last in order
            if values == [RESET]:  # ~key: the file's values of it (and inside it) are dropped
                assignment = {k: v for k, v in assignment.items() if not under(k, {key})}
                if b.reader.schema.open_mapping(key):
                    assignment[key] = RESET
            else:
                assignment[key] = values[0]
    if problems:
        raise UserError(problems, title="invalid run config")
    built = b.composer.build(assignment.get("name", "run"), assignment)
    if built is not None:
        b.values.check_kl([built[0]])
    if problems or built is None:
        raise UserError(problems, title="invalid run config")
    return built[0]
