"""Which keys a grid may set: the dotted leaves and sections of ``klsweep.config.RunConfig`` and the config
groups (folders of ``klsweep/conf``); the check of one key, with a did-you-mean for a misspelt one."""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Iterator
from dataclasses import Field, fields, is_dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints

from klsweep import config as config_mod
from klsweep.errors import Problem

GROUPS = ("model", "task", "cluster", "eval", "preset")


class Schema:
    """RunConfig's key vocabulary, and a typed scratch RunConfig that converts a raw value to its key's type."""

    def __init__(self) -> None:
        self.leaves, self.sections = _schema_leaves()
        self.dict_leaves = {k for k, t in self.leaves.items() if str(t).startswith("dict")}
        self._scratch: Any = None

    @property
    def scratch(self) -> Any:
        """RunConfig as an OmegaConf structured config, built on first use (a tenth of a second)."""
        if self._scratch is None:
            from omegaconf import OmegaConf

            self._scratch = OmegaConf.structured(config_mod.RunConfig)
        return self._scratch

    def valid_keys(self) -> list[str]:
        return [*GROUPS, *self.leaves]

    def key_problem(self, key: str, where: str, allow_name: bool = True) -> Problem | None:
        """What is wrong with ``key`` as the key of a run's value; None when nothing is."""
        if key == "name" and not allow_name:
            return Problem(
                where, "the sweep's name is the grid file's top-level `name:`", "a top-level name: key"
            )
        if key in GROUPS or key in self.leaves:
            return None
        head = key.rsplit(".", 1)[0]
        if head in self.dict_leaves or any(key.startswith(d + ".") for d in self.dict_leaves):
            return None
        if key.startswith("train.") and key.count(".") == 1:
            return trl_name_problem(where, key)
        return unknown(where, key, self.valid_keys())

    def open_mapping(self, key: str) -> bool:
        """Whether ``key`` is an entry inside an open mapping (a dict-typed key such as ``train.trl``), where keys
        are added (Hydra's ``+key``), not a key of the closed schema."""
        return any(key.startswith(d + ".") for d in self.dict_leaves)

    def is_section(self, key: str) -> bool:
        """Whether a mapping under ``key`` holds further keys (a section or a group), not one dict value."""
        return (key in self.sections or key in GROUPS) and key not in self.dict_leaves

    def convert(self, key: str, raw: Any) -> Any:
        """``raw`` as the value of ``key`` in a RunConfig (OmegaConf's typed conversion). Raises OmegaConf's
        errors (or ValueError) for a value the key's type does not take. A value already of the key's scalar
        type is what OmegaConf would make of it (an int of a float key: that float), without OmegaConf."""
        same = _as_scalar(self.leaves.get(key), raw)
        if same is not _OTHER:
            return same
        from omegaconf import OmegaConf

        OmegaConf.update(self.scratch, key, raw, merge=False, force_add=key not in self.leaves)
        value = OmegaConf.select(self.scratch, key)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        return value

    def type_name(self, key: str) -> str:
        t = self.leaves.get(key)
        return getattr(t, "__name__", None) or str(t).replace("typing.", "")


_OTHER = object()


def _as_scalar(tp: Any, raw: Any) -> Any:
    """``raw`` as a value of the scalar annotation ``tp`` (``int``, ``float | None``, ...) when it already is one
    (an int for a float: the float), else ``_OTHER``: OmegaConf converts it (or refuses it). A string that
    OmegaConf reads as an interpolation (``${...}``) or as missing (``???``) is left to it."""
    args = set(get_args(tp)) if get_origin(tp) in (Union, types.UnionType) else {tp}
    if raw is None:
        return None if type(None) in args else _OTHER
    kind = type(raw)
    if kind is bool:
        return raw if bool in args else _OTHER
    if kind is int and int in args:
        return raw
    if kind in (int, float) and float in args:
        return float(raw)
    if kind is str and str in args and "${" not in raw and raw != "???":
        return raw
    return _OTHER


def walk_fields(cls: type = config_mod.RunConfig, prefix: str = "") -> Iterator[tuple[str, Any, Field]]:
    """Every field of RunConfig in order, sections before their keys: (dotted key, annotation, field)."""
    hints = get_type_hints(cls)
    for f in fields(cls):
        t = hints[f.name]
        yield prefix + f.name, t, f
        if is_dataclass(t):
            yield from walk_fields(t, prefix + f.name + ".")


def _schema_leaves() -> tuple[dict[str, type], set[str]]:
    """Dotted leaf keys of RunConfig -> their annotation, and the dotted keys of its sections."""
    leaves: dict[str, Any] = {}
    sections: set[str] = set()
    for key, t, _ in walk_fields():
        if is_dataclass(t):
            sections.add(key)
        else:
            leaves[key] = t
    return leaves, sections


def trl_name_problem(where: str, key: str) -> Problem:
    """An unknown ``train.NAME``: TRL's name of a klsweep key ("use train.group_size"), a GRPOConfig option
    (passed through ``train.trl.NAME``), or a misspelt key."""
    from klsweep import trlargs

    name = key.split(".", 1)[1]
    owned = trlargs.owner(name)
    if owned is not None and not trlargs.KLSWEEP_SETS[name].startswith("("):
        source = trlargs.KLSWEEP_SETS[name]
        return Problem(
            where, f"{key!r} is not a klsweep key: TRL's {name!r} is set from {source}", f"use {source}"
        )
    if owned is None and name in trlargs.grpo_fields():
        return Problem(
            where,
            f"{key!r} is not a klsweep key: TRL's GRPOConfig option {name!r} is passed through train.trl",
            f"use train.trl.{name} (or +train.trl.{name})",
        )
    leaves, _ = _schema_leaves()
    return unknown(where, key, [*GROUPS, *leaves])


def under(key: str, keys: Iterable[str]) -> bool:
    """Whether dotted ``key`` is one of ``keys`` or inside one of them."""
    return any(key == k or key.startswith(k + ".") for k in keys)


_RAISE = object()


def lookup(config: dict, key: str, default: Any = _RAISE) -> Any:
    """The value at dotted ``key`` of a plain config; ``default`` where it has none (KeyError without one)."""
    node: Any = config
    for part in key.split("."):
        if default is not _RAISE and (not isinstance(node, dict) or part not in node):
            return default
        node = node[part]
    return node


def did_you_mean(word: str, options: Iterable[str]) -> str:
    nearest = difflib.get_close_matches(word, list(options), n=1)
    return f"; did you mean {nearest[0]!r}?" if nearest else ""


def unknown(where: str, key: str, valid: Any, kind: str = "key") -> Problem:
    hint = did_you_mean(key, valid)
    allowed = (
        f"{', '.join(valid)}"
        if len(valid) <= 12
        else f"{len(valid)} keys of klsweep.config.RunConfig, or a config group ({', '.join(GROUPS)})"
    )
    return Problem(where, f"unknown {kind} {key!r}{hint}", allowed)
