"""Claims as data: the ``claims:`` list of a grid file (or of a claims file, ``klsweep report --claims``) read
into ``Claim``s and checked up front, every problem located (``claims[i].key``) and reported at once. Each
claim is a named hypothesis: a metric, a test, a direction and two groups of runs (filters on any config key,
plus ``unbiased``). The report tests them (``klsweep.report.claims``); format and decision rule: docs/REPORT.md.
"""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klsweep.config import KL_ONLY_KEYS as KL_ONLY
from klsweep.errors import Problem
from klsweep.grid.schema import Schema, did_you_mean, lookup, unknown

METRICS = ("in_domain", "ood", "unstable", "peak_kl", "reward_drop")  # or any column of the report's runs.csv
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


def read_claims_file(path: str | Path, problems: list[Problem] | None = None) -> list[Claim]:
    """The ``claims:`` list of a YAML file (a grid file, or a file holding only ``claims:``). ``problems``: where
    to record what is wrong (the good claims returned), for the caller to report with its own checks at once
    (the report: metrics, keys of the runs); None: raised here."""
    from klsweep.grid.parse import read_section

    example = "claims: [- name: ..., metric: ...]"
    return read_section(Path(path), str(path), "claims", _parse, problems, "invalid claims", example)


def grid_claims(grid_text: str, where: str, problems: list[Problem] | None = None) -> list[Claim]:
    """The claims of a grid file's text (as a sweep's sweep.yaml keeps it); none when it has none.
    ``problems``: as ``read_claims_file``'s."""
    from klsweep.grid.parse import read_section

    return read_section(grid_text, where, "claims", _parse, problems, "invalid claims")


def _parse(value: Any, where: str, problems: list[Problem]) -> list[Claim]:
    return parse_claims(value, where, Schema(), problems)


def parse_claims(value: Any, where: str, schema: Schema, problems: list[Problem]) -> list[Claim]:
    """``claims:`` as ``Claim``s; a problem recorded (not raised) for each bad claim, key by key."""
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(Problem(where, "must be a list of claims", "- {name: ..., metric: ..., test: ...}"))
        return []
    out, names = [], set()
    for i, raw in enumerate(value):
        if not isinstance(raw, dict):
            problems.append(
                Problem(
                    f"{where}[{i}]",
                    f"{reprlib.repr(raw)} ({type(raw).__name__}): a claim must be a mapping",
                    "- {name: ..., metric: ..., test: ..., direction: ..., a: {...}, b: {...}}",
                )
            )
            continue
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
    a = parse_filters(raw.get("a"), f"{where}.a", schema, problems)
    b = parse_filters(raw.get("b"), f"{where}.b", schema, problems)
    if a and {k: sorted(map(repr, v)) for k, v in a.items()} == {
        k: sorted(map(repr, v)) for k, v in b.items()
    }:
        problems.append(
            Problem(f"{where}.b", "the same filters as a: it tests a group against itself", "two groups")
        )
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


def parse_filters(
    value: Any, where: str, schema: Schema, problems: list[Problem], unbiased: bool = True
) -> dict[str, list[Any]]:
    """A group's filters: key -> the values it accepts (a value or a list); keys of RunConfig, or ``unbiased``
    (when ``unbiased``: a claim's side; a label's filters select by config keys only)."""
    if not isinstance(value, dict) or not value:
        problems.append(Problem(where, "missing: the runs of this side", "{kl.beta: 0, offpolicy.lag: 16}"))
        return {}
    out = {}
    for key, raw in value.items():
        w = f"{where}.{key}"
        values = raw if isinstance(raw, list) else [raw]
        if key == UNBIASED and unbiased:
            if not all(isinstance(v, bool) for v in values):
                problems.append(Problem(w, f"{raw!r}", "true or false (the KL gradient audit's verdict)"))
        elif (p := schema.key_problem(str(key), w, allow_name=False)) is not None:
            problems.append(p)
        elif not values or not all(isinstance(v, str | int | float | bool) for v in values):
            problems.append(Problem(w, f"{raw!r}", "a value or a list of values"))
        else:
            values = _converted(schema, str(key), values, w, problems)
        out[str(key)] = values
    return out


def _converted(schema: Schema, key: str, values: list[Any], where: str, problems: list[Problem]) -> list[Any]:
    """The filter's values as the grid converts them (``check_leaf``: "1e-5", a string in YAML, is the float
    1e-05 of ``train.learning_rate``); a value the key cannot take (``kl.estimator: k9`` or ``K1``) recorded."""
    from klsweep.grid.schema import GROUPS
    from klsweep.grid.validate import check_leaf

    if key in GROUPS:  # a config group's option: its keys (model.name, ...) are what runs hold
        return values
    out = []
    for v in values:
        ok, value, error = check_leaf(schema, key, v)
        if ok:
            out.append(value)
        else:
            for e in error if isinstance(error, list) else [error]:
                problems.append(Problem(where, *e) if isinstance(e, tuple) else Problem(where, str(e)))
    return out


def check_grid_values(
    claims: list[Claim], configs: list[dict[str, Any]], where: str, problems: list[Problem], skip: set[str]
) -> None:
    """Each filter value of ``claims`` against the values the grid gives its key (``configs``: the runs' nested
    configs): a value no run has (``kl.beta: 0.2`` in a grid of 0.1) is a problem, with the grid's values.
    ``skip``: keys the command line set or removed (it may narrow the file's grid: a claim then reads
    inconclusive)."""
    missing = object()
    grid: dict[str, dict[Any, Any]] = {}  # key -> its values in the grid, by how filters compare them
    for c in claims:
        for side, filters in (("a", c.a), ("b", c.b)):
            for key, values in filters.items():
                if key == UNBIASED or key in skip or any(key.startswith(f"{k}.") for k in skip):
                    continue
                if key not in grid:
                    found = (lookup(r, key, missing) for r in configs)
                    grid[key] = {comparable(g): g for g in found if g is not missing}
                for v in values:
                    if comparable(v) not in grid[key]:
                        shown = ", ".join(sorted(map(repr, grid[key].values()))) or "none: no run sets it"
                        problems.append(
                            Problem(
                                f"{where} ({c.name}).{side}.{key}",
                                f"{v!r}: no run of this grid has it",
                                shown,
                            )
                        )


def check_overlap(
    claims: list[Claim], configs: list[dict[str, Any]], where: str, problems: list[Problem], ids: list[str]
) -> None:
    """Each claim's two sides against the grid's runs (``configs``: nested; ``ids``: theirs): a run both select
    is a problem (``overlap_problem``). A side filtering on ``unbiased`` (the audit's verdict, not known before
    the report) is checked by the report (``klsweep.report.claims``), unless both sides filter on it and no
    value is on both; so is one on a config group's option."""
    from klsweep.grid.schema import GROUPS

    index: dict[str, dict[Any, set[int]]] = {}  # key -> comparable value -> the runs that have it

    def runs_with(key: str, values: list[Any]) -> set[int]:
        if key not in index:
            index[key] = {}
            for i, config in enumerate(configs):
                if not _kl_off(config) or key not in KL_ONLY:
                    index[key].setdefault(comparable(lookup(config, key, None)), set()).add(i)
        return set().union(*(index[key].get(comparable(v), set()) for v in values))

    for c in claims:
        if _apart_by_unbiased(c):
            continue
        if any(k == UNBIASED or k in GROUPS for k in (*c.a, *c.b)):
            continue
        shared = set(range(len(configs)))
        for key in dict.fromkeys([*c.a, *c.b]):
            values = [v for v in c.a.get(key, c.b.get(key, [])) if key not in c.b or _accepts(c.b[key], v)]
            shared &= runs_with(key, values)
            if not shared:
                break
        if shared:
            problems.append(overlap_problem(c, where, [ids[i] for i in sorted(shared)]))


def overlap_problem(c: Claim, where: str, runs: list[str]) -> Problem:
    """What to say of a claim whose sides both select ``runs``: how many, which (the first few), and the
    filters both sides accept, which select them."""
    both = {k: [v for v in c.a[k] if _accepts(c.b[k], v)] if k in c.b else c.a[k] for k in c.a}
    both.update({k: v for k, v in c.b.items() if k not in c.a})
    selectors = ", ".join(f"{k}: {'|'.join(map(str, v))}" for k, v in both.items())
    runs = sorted(runs)  # one order whatever the caller's (a set, a frame's index)
    named = ", ".join(runs[:5]) + (", ..." if len(runs) > 5 else "")
    return Problem(
        f"{where} ({c.name}).b",
        f"a and b overlap: {len(runs)} run(s) on both sides ({named}), those with {selectors}",
        "sides with no run in common (a value of a key on one side that the other side does not accept)",
    )


def _apart_by_unbiased(c: Claim) -> bool:
    """Whether both sides filter on ``unbiased`` and no value is on both (no run can be on both sides)."""
    a, b = c.a.get(UNBIASED), c.b.get(UNBIASED)
    return a is not None and b is not None and not any(_accepts(b, v) for v in a)


def _accepts(values: list[Any], v: Any) -> bool:
    return comparable(v) in {comparable(w) for w in values}


def _kl_off(config: dict[str, Any]) -> bool:
    """Whether a run (nested config) trains without KL: its KL-only keys then read as "no KL", which no filter
    value matches (``config.without_kl_when_off``, as the report reads them)."""
    return lookup(config, "kl.beta", None) == 0 and not lookup(config, "kl.beta_final", None)


def comparable(v: Any) -> Any:
    """A value as filters compare it: a number by value (0 == 0.0), a bool apart from the numbers."""
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, int | float):
        return float(v)
    return v if isinstance(v, str) or v is None else repr(v)
