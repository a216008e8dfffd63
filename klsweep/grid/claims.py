"""Claims as data: the ``claims:`` list of a grid file (or of a claims file, ``klsweep report --claims``) read
into ``Claim``s and checked up front, every problem located (``claims[i].key``) and reported at once. Each
claim is a named hypothesis: a metric, a test, a direction and two groups of runs (filters on any config key,
plus ``unbiased``). The report tests them (``klsweep.report.claims``); format and decision rule: docs/REPORT.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klsweep.errors import Problem, UserError
from klsweep.grid.schema import Schema, did_you_mean, unknown

METRICS = ("in_domain", "ood", "unstable", "peak_kl")  # or any column of the report's runs.csv
TESTS = ("welch", "fisher", "tost")
DIRECTIONS = ("greater", "less", "equivalent")
KEYS = ("name", "metric", "test", "direction", "a", "b", "margin", "effect", "group")
UNBIASED = "unbiased"  # the filter on the KL gradient audit's verdict at the run's own lag


@dataclass(frozen=True)
class Claim:
    """One hypothesis: ``metric`` of the runs matching ``a`` is ``direction`` than (or equivalent to) that of
    ``b``, by ``test``. A filter maps a key to the values it accepts. ``margin`` (tost) and ``effect`` (the
    smallest effect of interest, for the power of welch and fisher: a difference of rates for fisher) are
    absolute, or relative to b's mean when ``relative`` (written "50%"). Claims with the same ``group`` also form one "any of" claim."""

    name: str
    metric: str
    test: str
    direction: str
    a: dict[str, list[Any]]
    b: dict[str, list[Any]]
    margin: tuple[float, bool] | None = None  # (size, relative)
    effect: tuple[float, bool] | None = None
    group: str | None = None


def read_claims_file(path: str | Path) -> list[Claim]:
    """The ``claims:`` list of a YAML file (a grid file, or a file holding only ``claims:``)."""
    from klsweep.grid.parse import load_yaml, read_text

    where = str(path)
    problems: list[Problem] = []
    data = load_yaml(read_text(Path(path), where, "claims file"), where, problems)
    if not isinstance(data, dict) or "claims" not in data:
        problems.append(Problem(where, "no top-level `claims:` list", "claims: [- name: ..., metric: ...]"))
        raise UserError(problems, title="invalid claims")
    claims = parse_claims(data["claims"], f"{where}: claims", Schema(), problems)
    if problems:
        raise UserError(problems, title="invalid claims")
    return claims


def grid_claims(grid_text: str, where: str) -> list[Claim]:
    """The claims of a grid file's text (as a sweep's sweep.yaml keeps it); none when it has none."""
    problems: list[Problem] = []
    from klsweep.grid.parse import load_yaml

    data = load_yaml(grid_text, where, problems)
    if not isinstance(data, dict) or not data.get("claims"):
        return []
    claims = parse_claims(data["claims"], f"{where}: claims", Schema(), problems)
    if problems:
        raise UserError(problems, title="invalid claims")
    return claims


def parse_claims(value: Any, where: str, schema: Schema, problems: list[Problem]) -> list[Claim]:
    """``claims:`` as ``Claim``s; a problem recorded (not raised) for each bad claim, key by key."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        problems.append(Problem(where, "must be a list of claims", "- {name: ..., metric: ..., test: ...}"))
        return []
    out, names = [], set()
    for i, raw in enumerate(value):
        name = raw.get("name")
        if isinstance(name, str) and name in names:
            problems.append(Problem(f"{where}[{i}].name", f"{name!r} twice", "a name per claim"))
        names.add(name)
        claim = _claim(raw, f"{where}[{i}]", schema, problems)
        if claim is not None:
            out.append(claim)
    groups = {c.group for c in out if c.group}
    for g in sorted(groups & names):
        problems.append(Problem(f"{where}: group {g!r}", "is also a claim's name", "a name of its own"))
    return out


def _claim(raw: dict, where: str, schema: Schema, problems: list[Problem]) -> Claim | None:
    before = len(problems)
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append(Problem(f"{where}.name", "missing or empty", "the hypothesis in words"))
    else:
        where = f"{where} ({name})"
    for key in raw:
        if key not in KEYS:
            problems.append(unknown(f"{where}.{key}", str(key), KEYS, "claim key"))
    metric = raw.get("metric")
    if not isinstance(metric, str) or not metric:
        problems.append(
            Problem(f"{where}.metric", f"{metric!r}", f"{', '.join(METRICS)}, or a column of runs.csv")
        )
    test = _choice(raw, "test", TESTS, where, problems)
    direction = _choice(raw, "direction", DIRECTIONS, where, problems)
    if test and direction and (test == "tost") != (direction == "equivalent"):
        what = "tost tests equivalence" if test == "tost" else f"{test} tests a direction"
        allowed = "direction: equivalent" if test == "tost" else "direction: greater or less"
        problems.append(Problem(f"{where}.direction", f"{direction!r}: {what}", allowed))
    if (
        test == "fisher"
        and metric not in (None, "unstable")
        and isinstance(metric, str)
        and metric in METRICS
    ):
        problems.append(Problem(f"{where}.metric", f"fisher tests a rate, not {metric!r}", "unstable"))
    if test in ("welch", "tost") and metric == "unstable":
        problems.append(
            Problem(f"{where}.test", f"{test} on a rate", "fisher (unstable is a yes/no per run)")
        )
    margin = _size(raw, "margin", where, problems)
    if test == "tost" and margin is None and "margin" not in raw:
        problems.append(
            Problem(f"{where}.margin", "missing: tost needs the margin of equivalence", "0.05, 50%")
        )
    if test != "tost" and "margin" in raw:
        problems.append(Problem(f"{where}.margin", "only tost takes a margin", "effect: (welch's power)"))
    effect = _size(raw, "effect", where, problems)
    if "effect" in raw and test == "tost":
        problems.append(
            Problem(f"{where}.effect", f"{test} takes no effect size", "effect: with welch or fisher")
        )
    group = raw.get("group")
    if group is not None and (not isinstance(group, str) or not group.strip()):
        problems.append(Problem(f"{where}.group", f"{group!r}", "the name of an any-of claim"))
    a = _filters(raw.get("a"), f"{where}.a", schema, problems)
    b = _filters(raw.get("b"), f"{where}.b", schema, problems)
    if len(problems) > before:
        return None
    return Claim(str(name), str(metric), str(test), str(direction), a, b, margin, effect, group)


def _choice(raw: dict, key: str, options: tuple[str, ...], where: str, problems: list[Problem]) -> str | None:
    v = raw.get(key)
    if v in options:
        return str(v)
    hint = did_you_mean(str(v), options) if isinstance(v, str) else ""
    problems.append(
        Problem(f"{where}.{key}", f"{v!r}{hint}" if v is not None else "missing", " | ".join(options))
    )
    return None


def _size(raw: dict, key: str, where: str, problems: list[Problem]) -> tuple[float, bool] | None:
    """A positive number, or "N%" (of b's mean)."""
    if key not in raw:
        return None
    v = raw[key]
    relative = isinstance(v, str) and v.strip().endswith("%")
    try:
        size = float(v.strip()[:-1]) / 100 if relative else float(v)
        if isinstance(v, bool) or not (size > 0 and math.isfinite(size)):
            raise ValueError(v)
    except (TypeError, ValueError):
        problems.append(
            Problem(f"{where}.{key}", f"{v!r}", "a number > 0, or a percentage of b's mean (50%)")
        )
        return None
    return size, relative


def _filters(value: Any, where: str, schema: Schema, problems: list[Problem]) -> dict[str, list[Any]]:
    """A group's filters: key -> the values it accepts (a value or a list); keys of RunConfig or ``unbiased``."""
    if not isinstance(value, dict) or not value:
        problems.append(Problem(where, "missing: the runs of this side", "{kl.beta: 0, offpolicy.lag: 16}"))
        return {}
    out = {}
    for key, raw in value.items():
        w = f"{where}.{key}"
        values = raw if isinstance(raw, list) else [raw]
        if key == UNBIASED:
            if not all(isinstance(v, bool) for v in values):
                problems.append(Problem(w, f"{raw!r}", "true or false (the KL gradient audit's verdict)"))
        elif (p := schema.key_problem(str(key), w, allow_name=False)) is not None:
            problems.append(p)
        elif not values or not all(isinstance(v, str | int | float | bool) for v in values):
            problems.append(Problem(w, f"{raw!r}", "a value or a list of values"))
        out[str(key)] = values
    return out
