"""The entry points: ``load_plan`` (a grid file and command-line overrides -> a ``Plan``) and
``compose_run_config`` (one run's file and overrides -> its resolved config). They only orchestrate:
``parse`` reads the file, a ``_Builder`` reads and checks keys and values and composes configs, ``expand``
makes the runs; every problem is collected before one ``UserError`` is raised."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from klsweep.errors import Problem, UserError
from klsweep.grid import expand, parse
from klsweep.grid.compose import Composer
from klsweep.grid.overrides import Reader
from klsweep.grid.plan import Plan
from klsweep.grid.schema import Schema
from klsweep.grid.validate import Values

DEFAULT_OUT = "results"


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
) -> Plan:
    """Read, compose and validate a grid file; raise ``UserError`` listing every problem."""
    path = Path(grid_path)
    where = str(grid_path)
    problems: list[Problem] = []
    text, data = parse.read_grid_file(path, where, problems)
    name = parse.sweep_name(data, where, problems)

    before = len(problems)
    searchpath = parse.searchpath(data.get("searchpath"), path.parent, where, config_dirs, problems)
    if len(problems) > before:  # the config groups' options depend on it
        raise UserError(problems, title="invalid grid")
    b = _Builder(searchpath, problems)

    base = b.reader.assignments(data.get("base"), f"{where}: base", allow_name=False)
    grids = parse.sub_grids(data.get("grid"), where, problems)
    axes_by_grid = [
        {k: b.reader.axis(k, v, f"{where}: {label}.{k}") for k, v in g.items()} for label, g in grids
    ]
    file_axes = {k for axes in axes_by_grid for k in axes}
    cmd_single, cmd_sweep = b.reader.command_line(overrides or [])
    cmd_keys = set(cmd_single) | set(cmd_sweep)
    excludes = parse.excludes(data.get("exclude"), where, b.reader.axis, file_axes | set(cmd_sweep), problems)
    if problems:
        raise UserError(problems, title="invalid grid")

    assert isinstance(name, str)
    base = {k: v for k, v in base.items() if k not in cmd_keys} | cmd_single
    products = [
        {k: v for k, v in axes.items() if k not in cmd_keys} | cmd_sweep for axes in axes_by_grid or [{}]
    ]
    sweep_dir = Path(out if out is not None else DEFAULT_OUT).absolute() / name
    expansion = expand.expand(products, base, excludes, lambda a: b.composer.build(name, a), sweep_dir)
    b.values.check_kl(r.config for r in expansion.runs.values())
    problems.extend(expand.unmatched_excludes(excludes, expansion.matched, cmd_keys, where))
    if not expansion.runs and not problems:
        what = "every run is excluded" if expansion.excluded else "the grid has no run"
        problems.append(Problem(f"{where}: grid", what))
    if problems:
        raise UserError(problems, title="invalid grid")
    axes = expand.varying_axes(expansion)
    return Plan(name, sweep_dir, list(expansion.runs.values()), axes, expansion.excluded, text)


def compose_run_config(config_file: str | Path | None, overrides: list[str]) -> dict:
    """The resolved, validated config of one run: a run YAML (group choices and dotted or nested values, e.g.
    a run folder's ``config.yaml``) plus ``key=value`` overrides. Raises ``UserError`` listing every problem."""
    problems: list[Problem] = []
    data: Any = {}
    where = str(config_file)
    if config_file is not None:
        try:
            text = Path(config_file).read_text()
        except OSError as e:
            raise UserError([Problem(where, f"cannot read the run config: {e.strerror or e}")]) from e
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
