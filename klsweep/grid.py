"""A grid file -> a validated ``Plan`` of runs, each with a stable id.

A grid file (see ``sweeps/*.yaml``)::

    name: tiny                  # the sweep: results/<name>/
    searchpath: [my_conf]       # optional: more config folders (model/, task/, ... options), relative to this file
    base:                       # what every run starts from: config-group choices and values (dotted or nested)
      model: tiny
      train.steps: 50
    grid:                       # every key is an axis: Hydra's override grammar, or a YAML list
      kl.estimator: k1,k3
      kl.beta: 0.05,0.1
      seed: range(3)
    exclude:                    # partial assignments of axis values; the runs matching one are dropped
      - {kl.estimator: k1, kl.beta: 0.1}

``grid:`` may also be a list of such mappings: the plan is the union of their products, deduplicated by run
id (e.g. the full product plus a no-KL baseline ``{kl.beta: 0, seed: range(3)}``). Precedence, lowest first:
the config groups' contents, ``base:``, the grid's axes, command-line overrides. A command-line ``key=a,b``
makes ``key`` an axis of every sub-grid (replacing it where it was one); ``key=a`` sets it for every run.
An exclude applies to the runs of the sub-grids that have all its keys as axes (so a no-KL baseline
sub-grid without the estimator axis is never dropped by ``{kl.estimator: k3}``).

Keys are the dotted keys of ``klsweep.config.RunConfig`` plus the config groups (``model``, ``task``,
``cluster``, ``eval``, ``preset``: folders of ``klsweep/conf``). Composition is Hydra's: once per distinct
combination of group choices; values are then set on plain dicts, each distinct value validated once.
Every problem found is reported at once (``UserError``); nothing is written here.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from klsweep import config as config_mod
from klsweep.errors import Problem, UserError

CONF_DIR = Path(__file__).parent / "conf"
GROUPS = ("model", "task", "cluster", "eval", "preset")
TOP_LEVEL_KEYS = ("name", "searchpath", "base", "grid", "exclude")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
DEFAULT_OUT = "results"

# Bounds of numeric values and choices of string values (KL values are checked by klsweep.kl.KLConfig).
_POSITIVE = (lambda v: v > 0, "> 0")
_NON_NEGATIVE = (lambda v: v >= 0, ">= 0")
CHECKS: dict[str, tuple[Any, str]] = {
    "seed": _NON_NEGATIVE,
    "train.steps": _POSITIVE,
    "train.learning_rate": _POSITIVE,
    "train.prompts_per_step": _POSITIVE,
    "train.group_size": (lambda v: v >= 2, ">= 2 (GRPO compares completions within a group)"),
    "train.max_prompt_length": _POSITIVE,
    "train.max_completion_length": _POSITIVE,
    "train.temperature": _POSITIVE,
    "train.epsilon": _NON_NEGATIVE,
    "train.max_grad_norm": _POSITIVE,
    "train.warmup_steps": _NON_NEGATIVE,
    "train.save_steps": _POSITIVE,
    "train.keep_checkpoints": (lambda v: v is None or v > 0, "null or > 0"),
    "train.collapse_window": _POSITIVE,
    "train.collapse_fraction": (lambda v: 0 <= v <= 1, "between 0 and 1"),
    "offpolicy.lag": _NON_NEGATIVE,
    "offpolicy.num_iterations": (lambda v: v >= 1, ">= 1"),
    "task.num_train": (lambda v: v is None or v > 0, "null or > 0"),
    "model.dtype": (
        lambda v: v in ("auto", "float32", "bfloat16", "float16"),
        "auto, float32, bfloat16, float16",
    ),
    "model.resources.nodes": _POSITIVE,
    "model.resources.gpus_per_node": _NON_NEGATIVE,
    "model.resources.tasks_per_node": _POSITIVE,
    "model.resources.cpus_per_task": _POSITIVE,
    "model.resources.mem_gb": _POSITIVE,
    "model.resources.timeout_min": _POSITIVE,
    "model.resources.eval_timeout_min": _POSITIVE,
    "cluster.kind": (lambda v: v in ("local", "slurm", "debug"), "local, slurm, debug"),
    "wandb.mode": (
        lambda v: v in ("auto", "online", "offline", "disabled"),
        "auto, online, offline, disabled",
    ),
    "eval.backend": (lambda v: v in ("hf", "vllm"), "hf, vllm"),
}


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


def load_plan(
    grid_path: str | Path,
    overrides: list[str] | None = None,
    out: str | Path | None = None,
    config_dirs: list[str] | None = None,
) -> Plan:
    """Read, compose and validate a grid file; raise ``UserError`` listing every problem."""
    path = Path(grid_path)
    where = str(grid_path)
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError([Problem(where, f"cannot read the grid file: {e.strerror or e}")]) from e
    problems: list[Problem] = []
    data = _load_yaml(text, where, problems)
    if not isinstance(data, dict):
        raise UserError(
            problems or [Problem(where, "a grid file is a mapping", "keys " + ", ".join(TOP_LEVEL_KEYS))]
        )

    for key in data:
        if key not in TOP_LEVEL_KEYS:
            problems.append(_unknown(f"{where}: {key}", str(key), TOP_LEVEL_KEYS, "top-level key"))
    name = data.get("name")
    if name is None:
        problems.append(
            Problem(f"{where}: name", "missing: every grid file names its sweep", "letters, digits, . _ -")
        )
    elif not isinstance(name, str) or not NAME_PATTERN.match(name):
        problems.append(
            Problem(
                f"{where}: name", f"{name!r} is not a valid sweep name", "letters, digits, . _ - (not first)"
            )
        )

    before = len(problems)
    searchpath = _searchpath(data.get("searchpath"), path.parent, where, config_dirs, problems)
    if len(problems) > before:  # the config groups' options depend on it
        raise UserError(problems, title="invalid grid")
    b = _Builder(searchpath, problems)

    base = b.assignments(data.get("base"), f"{where}: base", allow_name=False)
    grids = _sub_grids(data.get("grid"), where, problems)
    axes_by_grid = [{k: b.axis(k, v, f"{where}: {label}.{k}") for k, v in g.items()} for label, g in grids]
    file_axes = {k for axes in axes_by_grid for k in axes}

    cmd_single: dict[str, Any] = {}
    cmd_sweep: dict[str, list[Any]] = {}
    for arg in overrides or []:
        parsed = b.override(arg)
        if parsed is not None:
            key, values, is_sweep = parsed
            if is_sweep:
                cmd_sweep[key] = values
                cmd_single.pop(key, None)
            else:
                cmd_single[key] = values[0]
                cmd_sweep.pop(key, None)
    cmd_keys = set(cmd_single) | set(cmd_sweep)

    excludes = _excludes(data.get("exclude"), where, b, file_axes | set(cmd_sweep), problems)
    if problems:
        raise UserError(problems, title="invalid grid")

    assert isinstance(name, str)
    base = {k: v for k, v in base.items() if k not in cmd_keys} | cmd_single
    products = [
        {k: v for k, v in axes.items() if k not in cmd_keys} | cmd_sweep for axes in axes_by_grid or [{}]
    ]
    all_axes = list(dict.fromkeys(k for axes in products for k in axes))

    sweep_dir = Path(out if out is not None else DEFAULT_OUT).absolute() / name
    runs: dict[str, PlannedRun] = {}
    matched = [0] * len(excludes)
    excluded = 0
    effective: dict[str, list[Any]] = {}  # run id -> values of all_axes (then of the varying kl keys)
    for axes in products:
        keys = list(axes)
        for combo in itertools.product(*(axes[k] for k in keys)):
            assigned = dict(zip(keys, combo, strict=True))
            hit = False
            for i, ex in enumerate(excludes):
                if all(k in assigned and _hashable(assigned[k]) in allowed for k, allowed in ex.items()):
                    matched[i] += 1
                    hit = True
            if hit:
                excluded += 1
                continue
            built = b.build(name, base | assigned)
            if built is None:
                continue
            config, choices = built
            values = [choices[k] if k in choices else _get(config, k) for k in all_axes]
            rid = run_id(config)
            if rid not in runs:
                runs[rid] = PlannedRun(rid, {}, config, sweep_dir / rid)
                effective[rid] = values
    b.check_kl(r.config for r in runs.values())

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
    if not runs and not problems:
        what = "every run is excluded" if excluded else "the grid has no run"
        problems.append(Problem(f"{where}: grid", what))
    if problems:
        raise UserError(problems, title="invalid grid")

    columns = list(zip(*effective.values(), strict=True)) if effective else []
    varying = [k for k, col in zip(all_axes, columns, strict=True) if len({_hashable(v) for v in col}) > 1]
    kl_extra = [
        f"kl.{f}"
        for f in (fld.name for fld in fields(config_mod.KLSection))
        if f"kl.{f}" not in varying and len({r.config["kl"][f] for r in runs.values()}) > 1
    ]
    axes_out = varying + kl_extra
    index = {k: i for i, k in enumerate(all_axes)}
    for rid, run in runs.items():
        vals = effective[rid]
        run.params = {k: vals[index[k]] if k in index else _get(run.config, k) for k in axes_out}
    return Plan(name, sweep_dir, list(runs.values()), axes_out, excluded, text)


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
        data = _load_yaml(text, where, problems)
        if data is None:
            data = {}
    b = _Builder([], problems)
    assignment = b.assignments(data, where, allow_name=True)
    for arg in overrides:
        parsed = b.override(arg)
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
    built = b.build(assignment.get("name", "run"), assignment)
    if built is not None:
        b.check_kl([built[0]])
    if problems or built is None:
        raise UserError(problems, title="invalid run config")
    return built[0]


# --------------------------------------------------------------------------------------------------------
# Reading the grid file
# --------------------------------------------------------------------------------------------------------


def _load_yaml(text: str, where: str, problems: list[Problem]) -> Any:
    """Parse YAML, recording duplicate keys (which YAML loaders silently resolve to the last one)."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):  # type: ignore[override]
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str | int | float | bool):
                    continue
                if key in seen:
                    line = key_node.start_mark.line + 1
                    problems.append(
                        Problem(
                            f"{where}:{line}: {key}",
                            "duplicate key (a YAML loader keeps only the last)",
                            "each key once",
                        )
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    loader = Loader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise UserError(
            [*problems, Problem(f"{where}{line}", f"YAML syntax error: {problem}")], title="invalid grid"
        ) from e
    finally:
        loader.dispose()


def _searchpath(
    value: Any, base_dir: Path, where: str, config_dirs: list[str] | None, problems: list[Problem]
) -> list[str]:
    entries: list[tuple[str, Path]] = []
    if value is not None:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
            problems.append(
                Problem(
                    f"{where}: searchpath",
                    "must be a folder or a list of folders",
                    "paths relative to the grid file",
                )
            )
            items = []
        entries += [(f"{where}: searchpath", base_dir / v) for v in items]
    entries += [(f"--config-dir {d}", Path(d)) for d in config_dirs or []]
    out = []
    for w, p in entries:
        if not p.is_dir():
            problems.append(
                Problem(w, f"{p} is not a folder", "a folder holding config groups (model/, task/, ...)")
            )
        else:
            out.append(str(p.absolute()))
    return out


def _sub_grids(value: Any, where: str, problems: list[Problem]) -> list[tuple[str, dict]]:
    if value is None:
        problems.append(
            Problem(f"{where}: grid", "missing: no axis to sweep", "a mapping of axes, or a list of them")
        )
        return []
    if isinstance(value, dict):
        items = [("grid", value)]
    elif isinstance(value, list):
        items = [(f"grid[{i}]", g) for i, g in enumerate(value)]
    else:
        items = []
    if not items or not all(isinstance(g, dict) for _, g in items):
        problems.append(
            Problem(
                f"{where}: grid",
                "must be a mapping of axes or a non-empty list of them",
                "key: a,b | key: [a, b]",
            )
        )
        return []
    for label, g in items:
        if not g:
            problems.append(Problem(f"{where}: {label}", "empty: no axis", "key: a,b | key: [a, b]"))
    return items


def _excludes(
    value: Any, where: str, b: _Builder, axes: set[str], problems: list[Problem]
) -> list[dict[str, list[Any]]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(e, dict) and e for e in value):
        problems.append(
            Problem(f"{where}: exclude", "must be a list of partial assignments", "- {axis: value, ...}")
        )
        return []
    out = []
    for i, ex in enumerate(value):
        entry = {}
        for key, raw in ex.items():
            w = f"{where}: exclude[{i}].{key}"
            if key not in axes:
                hint = _did_you_mean(str(key), sorted(axes))
                problems.append(
                    Problem(
                        w, f"{key!r} is not an axis of the grid{hint}", ", ".join(sorted(axes)) or "no axes"
                    )
                )
                continue
            entry[key] = [_hashable(v) for v in b.axis(key, raw, w)]
        out.append(entry)
    return out


# --------------------------------------------------------------------------------------------------------
# Keys, values, composition
# --------------------------------------------------------------------------------------------------------


def _schema_leaves() -> tuple[dict[str, type], set[str]]:
    """Dotted leaf keys of RunConfig -> their annotation, and the dotted keys of its sections."""
    leaves: dict[str, Any] = {}
    sections: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        hints = get_type_hints(cls)
        for f in fields(cls):
            t = hints[f.name]
            if is_dataclass(t):
                sections.add(prefix + f.name)
                walk(t, prefix + f.name + ".")
            else:
                leaves[prefix + f.name] = t

    walk(config_mod.RunConfig, "")
    return leaves, sections


def _did_you_mean(word: str, options: Iterable[str]) -> str:
    nearest = difflib.get_close_matches(word, list(options), n=1)
    return f"; did you mean {nearest[0]!r}?" if nearest else ""


def _unknown(where: str, key: str, valid: Any, kind: str = "key") -> Problem:
    hint = _did_you_mean(key, valid)
    allowed = (
        f"{', '.join(valid)}"
        if len(valid) <= 12
        else f"{len(valid)} keys of klsweep.config.RunConfig, or a config group ({', '.join(GROUPS)})"
    )
    return Problem(where, f"unknown {kind} {key!r}{hint}", allowed)


def _plain(v: Any) -> Any:
    """Parser values as plain data (quoted strings become str)."""
    from hydra.core.override_parser.types import QuotedString

    if isinstance(v, QuotedString):
        return v.text
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


def _hashable(v: Any) -> Any:
    return json.dumps(v, sort_keys=True) if isinstance(v, list | dict) else v


def _show(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, list) else str(v)


def _get(config: dict, key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        node = node[part]
    return node


class _Builder:
    """Validates keys and values (each distinct value once) and composes configs (once per group choice)."""

    def __init__(self, searchpath: list[str], problems: list[Problem]):
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf

        self.problems = problems
        self.searchpath = searchpath
        self.leaves, self.sections = _schema_leaves()
        self.dict_leaves = {k for k, t in self.leaves.items() if str(t).startswith("dict")}
        self.scratch = OmegaConf.structured(config_mod.RunConfig)
        self.parser = OverridesParser.create()
        self.value_cache: dict[tuple[str, str], tuple[bool, Any, Any]] = {}
        self.options: dict[str, list[str]] = {}
        self.composed: dict[tuple, tuple[str, dict[str, Any]] | None] = {}
        self.sources: dict[tuple[str, Any], str] = {}  # (key, value) -> where it was first given

    # keys ----------------------------------------------------------------------------------------------
    def valid_keys(self) -> list[str]:
        return [*GROUPS, *self.leaves]

    def check_key(self, key: str, where: str, allow_name: bool = True) -> bool:
        if key == "name" and not allow_name:
            self.problems.append(
                Problem(
                    where, "the sweep's name is the grid file's top-level `name:`", "a top-level name: key"
                )
            )
            return False
        if key in GROUPS or key in self.leaves:
            return True
        head = key.rsplit(".", 1)[0]
        if head in self.dict_leaves or any(key.startswith(d + ".") for d in self.dict_leaves):
            return True
        self.problems.append(_unknown(where, key, self.valid_keys()))
        return False

    def group_options(self, group: str) -> list[str]:
        if group not in self.options:
            with self._hydra() as gh:
                self.options[group] = gh.config_loader().get_group_options(
                    group, config_name="config", overrides=self._sp()
                )
        return self.options[group]

    # values --------------------------------------------------------------------------------------------
    def value(self, key: str, raw: Any, where: str) -> tuple[bool, Any]:
        """Validate (once per distinct value) and convert one value of ``key``."""
        cache_key = (key, json.dumps(raw, sort_keys=True, default=repr) + type(raw).__name__)
        hit = self.value_cache.get(cache_key)
        if hit is None:
            hit = self._check_value(key, raw)
            self.value_cache[cache_key] = hit
        ok, value, error = hit
        if not ok:
            self.problems.append(
                Problem(where, error[0], error[1]) if isinstance(error, tuple) else Problem(where, error)
            )
            return False, None
        self.sources.setdefault((key, _hashable(value)), where)
        return True, value

    def _check_value(self, key: str, raw: Any) -> tuple[bool, Any, Any]:
        if key in GROUPS:
            options = self.group_options(key)
            if key == "preset" and raw is None:
                return True, None, ""
            if not isinstance(raw, str) or raw not in options:
                hint = _did_you_mean(str(raw), options)
                return (
                    False,
                    None,
                    (f"{raw!r} is not an option of config group {key!r}{hint}", ", ".join(options)),
                )
            return True, raw, ""
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        try:
            OmegaConf.update(self.scratch, key, raw, merge=False, force_add=key not in self.leaves)
            value = OmegaConf.select(self.scratch, key)
            if OmegaConf.is_config(value):
                value = OmegaConf.to_container(value, resolve=True)
        except (OmegaConfBaseException, ValueError) as e:
            t = self.leaves.get(key)
            allowed = getattr(t, "__name__", None) or str(t).replace("typing.", "")
            msg = str(e).splitlines()[0]
            return False, None, (f"{raw!r} is not a valid value: {msg}", allowed)
        if key.startswith("kl."):  # klsweep.kl.KLConfig judges KL values: this one, with valid defaults
            from klsweep.kl import KLConfig

            probe = dict(vars(config_mod.KLSection()), **{key[3:]: value})
            try:
                KLConfig(**probe)
            except UserError as e:
                return False, None, (f"{value!r} is not valid", e.problems[0].allowed)
        check = CHECKS.get(key)
        if check is not None:
            predicate, allowed = check
            try:
                good = predicate(value)
            except TypeError:
                good = False
            if not good:
                return False, None, (f"{value!r} is out of range", allowed)
        return True, value, ""

    def assignments(self, data: Any, where: str, allow_name: bool) -> dict[str, Any]:
        """Flatten a base-style mapping (group choices; dotted or nested values) and validate it."""
        out: dict[str, Any] = {}
        if data is None:
            return out
        if not isinstance(data, dict):
            self.problems.append(
                Problem(where, "must be a mapping", "group: option | key: value | section: {key: value}")
            )
            return out

        def walk(d: dict, prefix: str) -> None:
            for k, v in d.items():
                key = prefix + str(k)
                w = f"{where}.{key}"
                if (
                    isinstance(v, dict)
                    and (key in self.sections or key in GROUPS)
                    and key not in self.dict_leaves
                ):
                    walk(v, key + ".")
                elif self.check_key(key, w, allow_name):
                    ok, value = self.value(key, v, w)
                    if ok:
                        out[key] = value

        walk(data, "")
        return out

    def axis(self, key: str, raw: Any, where: str) -> list[Any]:
        """The values of one axis: a YAML list, or a string in Hydra's override grammar, or one scalar."""
        if not self.check_key(key, where, allow_name=False):
            return []
        if isinstance(raw, list):
            values = raw
        elif isinstance(raw, str):
            parsed = self._parse(f"{key}={raw}", where)
            if parsed is None:
                return []
            values = parsed[1]
        elif isinstance(raw, dict):
            self.problems.append(
                Problem(
                    where, "an axis is a list of values or a sweep", "key: a,b | key: [a, b] | key: range(3)"
                )
            )
            return []
        else:
            values = [raw]
        if not values:
            self.problems.append(Problem(where, "an axis with no value", "at least one value"))
        out = []
        seen = set()
        for v in values:
            ok, value = self.value(key, v, where)
            if ok and _hashable(value) not in seen:
                seen.add(_hashable(value))
                out.append(value)
        return out

    def override(self, arg: str) -> tuple[str, list[Any], bool] | None:
        """A command-line override ``key=value`` (or ``key=a,b``): its key, values, and whether a sweep."""
        where = f"command line: {arg}"
        parsed = self._parse(arg, where)
        if parsed is None:
            return None
        key, raw_values, is_sweep = parsed
        if not self.check_key(key, where):
            return None
        values = []
        for v in raw_values:
            ok, value = self.value(key, v, where)
            if ok:
                values.append(value)
        return (key, values, is_sweep) if len(values) == len(raw_values) else None

    def _parse(self, text: str, where: str) -> tuple[str, list[Any], bool] | None:
        from hydra.core.override_parser.types import ChoiceSweep, Glob, RangeSweep, ValueType
        from hydra.errors import HydraException

        try:
            o = self.parser.parse_override(text)
        except HydraException as e:
            msg = str(e).splitlines()[0]
            self.problems.append(
                Problem(
                    where,
                    f"bad override grammar in {text!r}: {msg}",
                    "key=value | key=a,b | key=range(3) | key=choice(a,b) | key=glob(*)",
                )
            )
            return None
        key = o.key_or_group
        if o.is_add() or o.is_delete() or o.is_force_add() or o.package is not None:
            self.problems.append(
                Problem(where, "+key, ++key, ~key and key@package are not used by klsweep", "key=value")
            )
            return None
        if o.value_type == ValueType.INTERVAL_SWEEP:
            self.problems.append(
                Problem(
                    where,
                    "interval(...) is not enumerable",
                    "a list a,b,c | range(start,stop,step) | choice(...)",
                )
            )
            return None
        v = o.value()
        if isinstance(v, Glob):
            if key not in GROUPS:
                self.problems.append(
                    Problem(where, "glob(...) selects config-group options", f"only for {', '.join(GROUPS)}")
                )
                return None
            if not self.check_key(key, where):
                return None
            return key, v.filter(self.group_options(key)), True
        if isinstance(v, ChoiceSweep):
            return key, [_plain(x) for x in v.list], True
        if isinstance(v, RangeSweep):
            return key, list(v.range()), True
        return key, [_plain(v)], False

    # composition ---------------------------------------------------------------------------------------
    def _sp(self) -> list[str]:
        if not self.searchpath:
            return []
        return ["hydra.searchpath=[" + ",".join(f"'file://{p}'" for p in self.searchpath) + "]"]

    def _hydra(self):
        from contextlib import contextmanager

        from hydra import initialize_config_dir
        from hydra.core.config_store import ConfigStore
        from hydra.core.global_hydra import GlobalHydra

        @contextmanager
        def ctx():
            ConfigStore.instance().store(name="klsweep_schema", node=config_mod.RunConfig)
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="klsweep"):
                yield GlobalHydra.instance()

        return ctx()

    def compose(self, choices: tuple[tuple[str, Any], ...]) -> tuple[str, dict[str, Any]] | None:
        """The composed config (as JSON text: json.loads is the fastest deep copy) and the group choices."""
        if choices in self.composed:
            return self.composed[choices]
        from hydra import compose
        from hydra.errors import HydraException
        from omegaconf import OmegaConf, open_dict
        from omegaconf.errors import OmegaConfBaseException

        overrides = [f"{g}={'null' if o is None else o}" for g, o in choices] + self._sp()
        result: tuple[str, dict[str, Any]] | None
        try:
            with self._hydra():
                cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
            picked = {g: cfg.hydra.runtime.choices.get(g) for g in GROUPS}
            with open_dict(cfg):
                del cfg["hydra"]
            plain = OmegaConf.to_container(cfg, resolve=True)
            result = json.dumps(plain), picked
        except (HydraException, OmegaConfBaseException) as e:
            text = " ".join(str(e).split())
            self.problems.append(
                Problem(f"config groups {' '.join(overrides)}", f"cannot be composed: {text}")
            )
            result = None
        if result is not None:
            composed = json.loads(result[0])
            for key in CHECKS:
                value = _get(composed, key)
                ok, _, err = self._check_value(key, value)
                if not ok:
                    self.problems.append(
                        Problem(f"config groups {' '.join(overrides)}: {key}", err[0], err[1])
                    )
        self.composed[choices] = result
        return result

    def build(self, name: str, assignment: dict[str, Any]) -> tuple[dict, dict[str, Any]] | None:
        """One run's resolved config and group choices."""
        choices = tuple((g, assignment[g]) for g in GROUPS if g in assignment)
        composed = self.compose(choices)
        if composed is None:
            return None
        base, picked = composed
        config = json.loads(base)
        config["name"] = name
        for key, value in assignment.items():
            if key in GROUPS:
                continue
            node = config
            *parents, leaf = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = json.loads(json.dumps(value)) if isinstance(value, list | dict) else value
        return config, picked

    def check_kl(self, configs: Iterable[dict]) -> None:
        """Validate each distinct KL section once with klsweep.kl.KLConfig."""
        from klsweep.kl import KLConfig

        seen: set[tuple] = set()
        reported: set[tuple[str, str]] = set()
        for config in configs:
            kl = config["kl"]
            key = tuple(sorted(kl.items()))
            if key in seen:
                continue
            seen.add(key)
            try:
                KLConfig(**kl)
            except UserError as e:
                for p in e.problems:
                    k = f"kl.{p.where}"
                    where = self.sources.get((k, _hashable(kl.get(p.where))), f"{k} (set by a config group)")
                    if (where, p.what) not in reported:
                        reported.add((where, p.what))
                        self.problems.append(Problem(where, f"{k}: {p.what}", p.allowed))
