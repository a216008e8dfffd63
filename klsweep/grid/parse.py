"""The file as written: YAML text -> data (with duplicate keys reported), and the shape of a grid file's
top-level keys: ``name``, ``searchpath``, ``grid`` (its sub-grids), ``exclude``, ``claims`` (``claims.py``) and
``labels`` (``labels.py``) and ``seeds`` (``seeds.py``). The keys and values
inside them are read by ``overrides`` and checked by ``schema`` and ``validate``."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from klsweep import store
from klsweep.errors import Problem, UserError
from klsweep.grid.schema import did_you_mean, unknown
from klsweep.grid.validate import NAME_ALLOWED, hashable, name_problem

TOP_LEVEL_KEYS = ("name", "searchpath", "base", "grid", "exclude", "claims", "labels", "seeds")
MAX_FILE_BYTES = 16 << 20  # a grid, claims or run file larger than this is not one (read no further)
MAX_YAML_VALUES = 1_000_000  # values a YAML file may hold once its aliases are expanded (an alias bomb: more)


def read_text(path: Path, where: str, what: str) -> str:
    """A grid, claims or run file's text; ``UserError`` when it cannot be read, is not a regular file (a FIFO
    would block for ever, /dev/zero never end), is larger than ``MAX_FILE_BYTES`` or is not UTF-8 text."""
    try:
        with store.open_regular(path) as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise UserError(
                [
                    Problem(
                        where, f"larger than {MAX_FILE_BYTES >> 20} MiB: is this the {what}?", "a YAML file"
                    )
                ]
            )
        return data.decode()
    except store.UnreadableFile as e:
        raise UserError([Problem(where, f"{e.what}: is this the {what}?", "a YAML file")]) from e
    except UnicodeDecodeError as e:
        raise UserError(
            [
                Problem(
                    where,
                    f"not a text file (byte {e.start} is not UTF-8): is this the {what}?",
                    "a YAML file",
                )
            ]
        ) from e
    except OSError as e:
        raise UserError([Problem(where, f"cannot read the {what}: {e.strerror or e}")]) from e


def read_section(
    source: Path | str,
    where: str,
    key: str,
    parse: Callable[[Any, str, list[Problem]], list[Any]],
    problems: list[Problem] | None,
    title: str,
    example: str = "",
) -> list[Any]:
    """The top-level ``key:`` list (``claims``, ``labels``) of a YAML file (``source`` a Path: a grid file or a
    file holding only that list; one without it is a problem, ``example`` the fix) or of a grid file's text
    (``source`` a str, as a sweep's sweep.yaml keeps it: none when it has none), read by ``parse(value, where,
    problems)``. ``problems``: where to record what is wrong (the good entries returned), for the caller to
    report with its own checks at once; None: raised here (``UserError`` titled ``title``)."""
    found: list[Problem] = []
    if isinstance(source, Path):
        data = load_yaml(read_text(source, where, f"{key} file"), where, found)
        if not isinstance(data, dict) or key not in data:
            found.append(Problem(where, f"no top-level `{key}:` list", example))
    else:
        data = load_yaml(source, where, found)
    value = data.get(key) if isinstance(data, dict) else None
    items = parse(value, f"{where}: {key}", found) if value else []
    if problems is not None:
        problems += found
    elif found:
        raise UserError(found, title=title)
    return items


def read_grid_file(path: Path, where: str, problems: list[Problem]) -> tuple[str, dict]:
    """The grid file's text and its top-level mapping; raises ``UserError`` when there is none."""
    text = read_text(path, where, "grid file")
    data = load_yaml(text, where, problems)
    if not isinstance(data, dict):
        raise UserError(
            problems or [Problem(where, "a grid file is a mapping", "keys " + ", ".join(TOP_LEVEL_KEYS))]
        )
    return text, data


def load_yaml(text: str, where: str, problems: list[Problem]) -> Any:
    """Parse YAML, recording duplicate keys (which YAML loaders silently resolve to the last one). A file whose
    aliases expand to more than ``MAX_YAML_VALUES`` values (an alias bomb) is refused before it is built."""
    import yaml

    class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser where PyYAML has it
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
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node)
        if size > MAX_YAML_VALUES:
            raise UserError(
                [
                    *problems,
                    Problem(
                        where,
                        f"its YAML aliases (*name) expand to {size:,} values (an alias bomb?)"
                        if size < math.inf
                        else "a YAML alias (*name) inside the node it names: it expands without end",
                        f"at most {MAX_YAML_VALUES:,} values",
                    ),
                ],
                title="invalid grid",
            )
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise UserError(
            [*problems, Problem(f"{where}{line}", f"YAML syntax error: {problem}")], title="invalid grid"
        ) from e
    finally:
        loader.dispose()


def _expanded_size(root: Any) -> float:
    """How many nodes a YAML node graph holds with every alias expanded (inf for a recursive alias):
    ``store.yamlnodes.measure``."""
    from klsweep.store.yamlnodes import measure

    return measure(root)[0]


def sweep_name(data: dict, where: str, problems: list[Problem]) -> Any:
    """The sweep's name, after checking the top-level keys; problems recorded for unknown keys and for a
    missing or invalid name."""
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            problems.append(unknown(f"{where}: {key}", str(key), TOP_LEVEL_KEYS, "top-level key"))
    name = data.get("name")
    if name is None:
        problems.append(Problem(f"{where}: name", "missing: every grid file names its sweep", NAME_ALLOWED))
    elif (problem := name_problem(name)) is not None:
        problems.append(Problem(f"{where}: name", problem, NAME_ALLOWED))
    return name


def searchpath(
    value: Any, base_dir: Path, where: str, config_dirs: list[str] | None, problems: list[Problem]
) -> list[str]:
    """The extra config folders: the grid's ``searchpath:`` (relative to it), then ``--config-dir``s."""
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


def sub_grids(value: Any, where: str, problems: list[Problem]) -> list[tuple[str, dict]]:
    """The sub-grids of ``grid:`` (a mapping, or a list of them), each with its label for messages."""
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
    out = []
    for label, g in items:
        if not g:
            problems.append(Problem(f"{where}: {label}", "empty: no axis", "key: a,b | key: [a, b]"))
        for key in [k for k in g if not isinstance(k, str)]:
            problems.append(
                Problem(
                    f"{where}: {label}: {key!r}",
                    f"a key YAML reads as {type(key).__name__} {key!r}, not a config key (inside {{...}} a "
                    "comma ends an entry: {seed: 0,1} is seed: 0 and a key 1)",
                    "a config key (klsweep keys); inside {...} quote a sweep: {seed: '0,1'}",
                )
            )
        out.append((label, {k: v for k, v in g.items() if isinstance(k, str)}))
    return out


def excludes(
    value: Any,
    where: str,
    axis: Callable[[str, Any, str], list[Any]],
    axes: set[str],
    problems: list[Problem],
) -> list[dict[str, list[Any]]]:
    """``exclude:`` as partial assignments: axis key -> its excluded values (hashable), read by ``axis``."""
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
                hint = did_you_mean(str(key), sorted(axes))
                problems.append(
                    Problem(
                        w, f"{key!r} is not an axis of the grid{hint}", ", ".join(sorted(axes)) or "no axes"
                    )
                )
                continue
            entry[key] = [hashable(v) for v in axis(key, raw, w)]
        out.append(entry)
    return out
