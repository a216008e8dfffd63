"""How values are written: Hydra's override grammar (``key=a,b``, ``range(3)``, ``choice(...)``,
``glob(...)``) in axes and command-line overrides, YAML lists and scalars in axes, and base-style mappings
(group choices; dotted or nested values). Each is read into validated keys and values."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from klsweep import __version__, store, trlargs
from klsweep.errors import Problem
from klsweep.grid.compose import RESET
from klsweep.grid.schema import GROUPS, Schema, under
from klsweep.grid.validate import TRL, Values, hashable

KEPT_VALUES = 10_000  # the longest value list kept (range(10**6) is read again each time)


class Reader:
    """Reads keys and their values as grid files, run files and the command line write them, recording
    problems."""

    def __init__(
        self,
        schema: Schema,
        values: Values,
        group_options: Callable[[str], list[str]],
        problems: list[Problem],
    ):
        self.schema = schema
        self.values = values
        self.group_options = group_options
        self.problems = problems
        self.parser: Any = None  # Hydra's OverridesParser, made at the first text not in the cache

    def _key_ok(self, key: str, where: str, allow_name: bool = True) -> bool:
        problem = self.schema.key_problem(key, where, allow_name)
        if problem is not None:
            self.problems.append(problem)
        return problem is None

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
                if isinstance(v, dict) and self.schema.is_section(key):
                    walk(v, key + ".")
                elif self._key_ok(key, w, allow_name):
                    ok, value = self.values.value(key, v, w)
                    if ok:
                        out[key] = value

        walk(data, "")
        return out

    def axis(self, key: str, raw: Any, where: str) -> list[Any]:
        """The values of one axis: a YAML list, or a string in Hydra's override grammar, or one scalar."""
        if not self._key_ok(key, where, allow_name=False):
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
            ok, value = self.values.value(key, v, where)
            if ok and hashable(value) not in seen:
                seen.add(hashable(value))
                out.append(value)
        return out

    def count(self, key: str, raw: Any) -> int:
        """How many values the axis ``key: raw`` has, without reading or checking them (``range(10**6)`` is not
        listed). A value the grammar refuses counts as one: ``axis`` reports it."""
        if isinstance(raw, list):
            return len(raw)
        if isinstance(raw, str):
            return self._count(f"{key}={raw}")[1]
        return 1

    def count_override(self, arg: str) -> tuple[str, int, bool]:
        """A command-line override's key, how many values it has and whether it is a sweep (as ``count``)."""
        return self._count(arg)

    def _count(self, text: str) -> tuple[str, int, bool]:
        kept = _kept("count", text)
        if kept is not None:
            return kept[0], kept[1], kept[2]
        from hydra.core.override_parser.types import ChoiceSweep, Glob, RangeSweep
        from hydra.errors import HydraException

        try:
            o = self._parse_override(text)
            v = o.value()
        except HydraException:
            return text.split("=", 1)[0], 1, False
        if isinstance(v, ChoiceSweep):
            return _keep("count", text, (o.key_or_group, len(v.list), True))
        if isinstance(v, RangeSweep):
            start, stop, step = v.start, v.stop, v.step
            n = math.ceil((stop - start) / step) if step else 0
            return _keep("count", text, (o.key_or_group, max(0, n), True))
        if isinstance(v, Glob):
            if o.key_or_group not in GROUPS:
                return o.key_or_group, 1, True
            return o.key_or_group, len(v.filter(self.group_options(o.key_or_group))), True
        return _keep("count", text, (o.key_or_group, 1, o.is_sweep_override()))

    def override(self, arg: str) -> tuple[str, list[Any], bool] | None:
        """A command-line override ``key=value`` (or ``key=a,b``; ``+key=value`` adds a key inside an open
        mapping, ``++key=value`` sets or adds): its key, values, and whether a sweep. ``~key``: its key and
        ``[RESET]`` (see ``command_line``)."""
        where = f"command line: {arg}"
        parsed = self._parse(arg, where, prefixed=True)
        if parsed is None:
            return None
        key, raw_values, is_sweep = parsed
        problem = self.schema.key_problem(key, where)
        if problem is not None and arg.startswith("~") and key in self.schema.sections:
            problem = None  # ~section: every key of it back to its default
        if problem is not None:
            if arg.startswith("+"):
                problem = Problem(where, f"{problem.what}; {self._closed()}", problem.allowed)
            self.problems.append(problem)
            return None
        if not self._prefix_ok(arg, key, raw_values, where):
            return None
        if arg.startswith("~"):
            return key, [RESET], False
        values = []
        for v in raw_values:
            ok, value = self.values.value(key, v, where)
            if ok:
                values.append(value)
        return (key, values, is_sweep) if len(values) == len(raw_values) else None

    def _prefix_ok(self, arg: str, key: str, raw_values: list[Any], where: str) -> bool:
        """Hydra's ``+key`` (add a key), ``++key`` (set or add) and ``~key`` (remove) where klsweep's schema
        allows them: it is closed (RunConfig's keys exist already) except the open mappings (``train.trl``,
        ``cluster.additional_parameters``), where keys are added."""
        inside = self.schema.open_mapping(key)
        if arg.startswith("~"):
            if "=" in arg:
                self.problems.append(
                    Problem(where, "~key takes no value: it resets the key to its default", f"~{key}")
                )
                return False
            if key == "name":
                self.problems.append(Problem(where, "the sweep's name cannot be removed", "name=NAME"))
                return False
            if key.startswith(TRL + ".") and key.split(".")[2] not in trlargs.grpo_fields():
                self.problems.append(Problem(where, *trlargs.unknown(key.split(".")[2])))
                return False
            return True
        if arg.startswith("+") and not arg.startswith("++") and not inside:
            what = (
                f"config group {key!r} is in the defaults already"
                if key in GROUPS
                else f"{key!r} exists already"
            )
            self.problems.append(
                Problem(
                    where, f"+{key} adds a key, but {what}; {self._closed()}", f"{key}={_shown(raw_values)}"
                )
            )
            return False
        return True

    def _closed(self) -> str:
        return f"klsweep's schema is closed: + adds keys only inside {', '.join(sorted(self.schema.dict_leaves))}"

    def command_line(self, args: list[str]) -> tuple[dict[str, Any], dict[str, list[Any]], set[str]]:
        """The command line's overrides of a grid: values set for every run (in command-line order), axes (the
        last word on a key wins), and the keys ``~key`` removed: the grid's values of them (and of the keys
        under them) are dropped, so the config groups' value, the default, applies. Inside an open mapping a
        removed key is ``RESET`` among the values: the composed config's entry is removed too."""
        single: dict[str, Any] = {}
        sweep: dict[str, list[Any]] = {}
        removed: set[str] = set()
        for arg in args:
            parsed = self.override(arg)
            if parsed is None:
                continue
            key, values, is_sweep = parsed
            if values == [RESET]:
                removed.add(key)
                for d in (single, sweep):
                    for k in [k for k in d if under(k, {key})]:
                        del d[k]
                if self.schema.open_mapping(key):
                    single[key] = RESET
                continue
            single.pop(key, None)  # set again: last in command-line order
            if is_sweep:
                sweep[key] = values
            else:
                single[key] = values[0]
                sweep.pop(key, None)
        return single, sweep, removed

    def _parse_override(self, text: str) -> Any:
        """Hydra's ``Override`` of ``key=value`` (its ANTLR parser, made at the first use)."""
        if self.parser is None:
            from hydra.core.override_parser.overrides_parser import OverridesParser

            self.parser = OverridesParser.create()
        return self.parser.parse_override(text)

    def _parse(self, text: str, where: str, prefixed: bool = False) -> tuple[str, list[Any], bool] | None:
        """The key, values and whether a sweep of ``key=value`` in Hydra's grammar (None: a problem recorded).
        What Hydra's grammar alone decides is kept (``_keep``): a later plan reads it without Hydra."""
        kind = "parse+" if prefixed else "parse"
        kept = _kept(kind, text)
        if kept is not None:
            return kept[0], kept[1], kept[2]
        return self._parse_text(text, where, prefixed, kind)

    def _parse_text(
        self, text: str, where: str, prefixed: bool, kind: str
    ) -> tuple[str, list[Any], bool] | None:
        from hydra.core.override_parser.types import ChoiceSweep, Glob, RangeSweep, ValueType
        from hydra.errors import HydraException

        try:
            o = self._parse_override(text)
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
        if o.package is not None:
            self.problems.append(Problem(where, "key@package is not used by klsweep", "key=value"))
            return None
        if (o.is_add() or o.is_delete() or o.is_force_add()) and not prefixed:
            self.problems.append(
                Problem(where, "+key, ++key and ~key are command-line overrides", "key: value")
            )
            return None
        if o.is_delete():
            return _keep(kind, text, (key, [], False))
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
            if not self._key_ok(key, where):
                return None
            return key, v.filter(self.group_options(key)), True
        if isinstance(v, ChoiceSweep):
            return _keep(kind, text, (key, [_plain(x) for x in v.list], True))
        if isinstance(v, RangeSweep):
            return _keep(kind, text, (key, list(v.range()), True))
        return _keep(kind, text, (key, [_plain(v)], False))


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


def _shown(values: list[Any]) -> str:
    return ",".join(map(str, values)) if values else "VALUE"


@functools.cache
def _code() -> str | None:
    """What decides a kept reading besides its text: Hydra's and its ANTLR runtime's versions (the grammar),
    klsweep's version and this module's source (what is made of Hydra's values). None without Hydra: nothing
    is kept."""
    from importlib import metadata

    try:
        versions = [metadata.version(name) for name in ("hydra-core", "antlr4-python3-runtime")]
    except metadata.PackageNotFoundError:
        return None
    return store.kept.key_of(*versions, f"klsweep={__version__}", Path(__file__).read_bytes())


def _kept_file(kind: str, text: str) -> tuple[Path, str] | None:
    """Where the reading of ``text`` is kept, and its key; None when nothing is kept for it (no Hydra, or a text
    that is not UTF-8, such as a surrogate-escaped byte of argv: Hydra's grammar reads it, and refuses it)."""
    code = _code()
    if code is None:
        return None
    try:
        key = store.kept.key_of(code, kind, text)
    except UnicodeEncodeError:
        return None
    return store.cache_dir() / "compose" / f"override-{key[:32]}.json", key


# The shape of each kind of kept reading: (the key, its values or their count, whether a sweep)
_SHAPES = {"parse": list, "parse+": list, "count": int}


def _kept(kind: str, text: str) -> list[Any] | None:
    """What ``_keep`` kept of ``text`` (None: nothing, or a file that is not what was kept for this text by
    this Hydra and this klsweep: ``store.kept.read``)."""
    where = _kept_file(kind, text)
    result = store.kept.read(*where) if where is not None else None
    if not (isinstance(result, list) and len(result) == 3):
        return None
    key, values, is_sweep = result
    shape = _SHAPES[kind]
    if not isinstance(key, str) or not isinstance(is_sweep, bool) or not isinstance(values, shape):
        return None
    if isinstance(values, bool) or (shape is int and values < 0):
        return None
    return result


def _keep(kind: str, text: str, result: tuple[Any, ...]) -> Any:
    """``result`` of reading ``text``, kept under ``store.cache_dir()/compose/`` by a key of Hydra's version,
    klsweep's code and the text (``store.kept``: read back only when it is what was kept for them), and
    returned. Hydra's ANTLR parser (and its import) is most of a small plan's own time: a later plan of the same
    grid reads this instead. Only what the grammar alone decides is kept (no glob, whose values are the config
    folders' options), and no value list of over ``KEPT_VALUES``."""
    where = _kept_file(kind, text)
    values = result[1]
    if where is not None and not (isinstance(values, list) and len(values) > KEPT_VALUES):
        store.kept.keep(*where, list(result))  # not kept (a read-only cache): read with Hydra again next time
    return result
