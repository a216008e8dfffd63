"""A run folder's ``config.yaml``: written by ``write_run`` (its one writer), read as plain data by
``read_run_file`` and typed by ``load_run`` (the one reader: train, eval, report, W&B; old folders through
``LEGACY_VALUES``); whether a folder holds the same run as a config (``run_differences``)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from klsweep import store
from klsweep.config.identity import (
    ID_HASHED_AT,
    LEGACY_VALUES,
    id_omitted_at,
    is_cosmetic,
    kl_off_hashed_at,
)
from klsweep.config.schema import RunConfig
from klsweep.errors import Problem, UserError


def run_file_text(config: Mapping[str, Any]) -> str:
    """A resolved RunConfig (plain data) as a run folder's ``config.yaml`` holds it: what every writer of the
    file and ``klsweep config`` print."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(dict(config)))


CONFIG_TODO = "rerun `klsweep run` with the sweep's grid (it rewrites config.yaml), or restore the file"


def read_run_file(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A run folder's ``config.yaml`` as plain data (what every reader of a run's config calls).
    ``store.UnreadableFile`` when it is not YAML, not a mapping, or cut short: no final newline, or the
    sections of a file klsweep wrote (every section, in RunConfig's order) stopping before the last one. A
    hand-written file may leave sections out (their defaults apply)."""
    import yaml

    path = Path(run_dir) / store.CONFIG_FILE
    try:
        text = store.read_text(path)  # a FIFO there: UnreadableFile, not a wait for ever
    except UnicodeDecodeError as e:
        raise store.UnreadableFile(path, "not a text file", CONFIG_TODO) from e
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        raise store.UnreadableFile(path, f"not valid YAML: {' '.join(str(e).split())}", CONFIG_TODO) from e
    if not isinstance(data, dict):
        raise store.UnreadableFile(path, "not a mapping of config keys", CONFIG_TODO)
    if not text.endswith("\n"):
        raise store.UnreadableFile(path, "cut short (no final newline)", CONFIG_TODO)
    sections = [f.name for f in fields(RunConfig)]
    present = list(data)
    if 2 <= len(present) < len(sections) and present == sections[: len(present)]:
        missing = ", ".join(sections[len(present) :])
        raise store.UnreadableFile(path, f"cut short (it stops before {missing})", CONFIG_TODO)
    return data


@functools.cache
def _schema() -> Any:
    """RunConfig as an OmegaConf structured config, built once (half the cost of a ``load_run``)."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(RunConfig)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(cls)


_NOT_EXACT = object()


def _exact(tp: Any, value: Any) -> Any:
    """``value`` as type ``tp`` of RunConfig's annotations when it is exactly of that shape (a section: every
    field present, no other key; a float field may hold an int, as OmegaConf reads it), else ``_NOT_EXACT``.
    The fast path of ``load_run`` (some 20x cheaper than OmegaConf's merge); anything else (a key missing, a
    string for an int, an interpolation) takes OmegaConf's path, which converts, fills in or says what is
    wrong."""
    import types
    import typing

    if dataclasses.is_dataclass(tp):
        hints = _field_types(tp)
        if not isinstance(value, dict) or value.keys() != hints.keys():
            return _NOT_EXACT
        out = {name: _exact(sub, value[name]) for name, sub in hints.items()}
        return _NOT_EXACT if _NOT_EXACT in out.values() else tp(**out)
    origin = typing.get_origin(tp)
    if origin is types.UnionType:  # X | None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _exact(inner, value)
    if origin in (list, dict):
        return copy.deepcopy(value) if type(value) is origin and _plain(value) else _NOT_EXACT
    if tp is float and type(value) in (int, float):
        return float(value)
    if tp in (int, bool, str) and type(value) is tp and _plain(value):
        return value
    return _NOT_EXACT


def _plain(value: Any) -> bool:
    """Data OmegaConf keeps as it is: no interpolation or missing-value marker in a string, string keys."""
    if isinstance(value, str):
        return "${" not in value and value != "???"
    if isinstance(value, list):
        return all(map(_plain, value))
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return value is None or type(value) in (int, float, bool)


def load_run(run_dir: str | os.PathLike) -> RunConfig:
    """The RunConfig of a run folder: its ``config.yaml`` over the schema's defaults, a key the folder predates
    read with ``LEGACY_VALUES``. The one reader of a run's config (train, eval, report, W&B).
    ``UserError`` when the folder has no config.yaml, ``store.UnreadableFile`` when it cannot be read or does
    not fit the schema."""
    path = Path(run_dir) / store.CONFIG_FILE
    if not path.exists():  # anything else there (a FIFO, a folder): read_run_file says what
        raise UserError(Problem(str(path), "no run config", "write it with `klsweep train` or `klsweep run`"))
    data = read_run_file(run_dir)
    exact = _exact(RunConfig, data)
    if exact is not _NOT_EXACT:  # every key there, every value of its field's type: what OmegaConf builds
        return exact
    from omegaconf import OmegaConf  # some 0.2 s to import: not on the fast path

    try:
        loaded = OmegaConf.create(data)
        for dotted, value in LEGACY_VALUES.items():  # a folder written before the key existed
            if OmegaConf.select(loaded, dotted, default=None) is None:
                OmegaConf.update(loaded, dotted, value, force_add=True)
        merged = OmegaConf.merge(_schema(), loaded)  # merge copies the schema: never changed
    except Exception as e:  # omegaconf's validation errors
        raise store.UnreadableFile(path, str(e).splitlines()[0], CONFIG_TODO) from e
    return OmegaConf.to_object(merged)


def write_run(run_dir: str | os.PathLike, config: Mapping[str, Any]) -> Path:
    """Write a resolved RunConfig (plain data) to ``run_dir/config.yaml``. A folder that already holds a config
    is the same run when the two differ only in keys its run id does not see (``run_differences``): its
    config.yaml is then rewritten with ``config``'s values, as ``klsweep run`` does on a resume. Any other
    difference is an error naming the keys (the folder's checkpoints belong to its own config)."""
    path = Path(run_dir) / store.CONFIG_FILE
    if path.is_file():
        seen = [k for k, _, _ in run_differences(run_dir, config)]
        if seen:
            raise UserError(
                Problem(
                    str(path),
                    f"the run folder holds a different config ({', '.join(seen)} differ): another run",
                    "another --run-dir, or the same config (keys the run id does not see, such as "
                    "train.use_vllm or train.micro_batch_size, may differ)",
                )
            )
    store.atomic_write_text(path, run_file_text(config))
    return path


def run_differences(run_dir: str | os.PathLike, config: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Where the run folder's ``config.yaml`` and ``config`` (a resolved RunConfig, plain data) are not the same
    run: (dotted key, the folder's value, ``config``'s) for each key the run id sees (``_id_blind``); [] when
    they are (a key one of them lacks: None). A key the folder predates reads as what it trained with
    (``LEGACY_VALUES``), else as ``config``'s where the id leaves it out (``id_omitted_at``).
    ``store.UnreadableFile`` when the file cannot be read."""
    from omegaconf import OmegaConf

    read_run_file(run_dir)  # UnreadableFile when it was cut short
    loaded = OmegaConf.load(Path(run_dir) / store.CONFIG_FILE)
    for dotted, value in {**id_omitted_at(config), **LEGACY_VALUES}.items():  # a folder from before the key
        if OmegaConf.select(loaded, dotted, default=None) is None:
            OmegaConf.update(loaded, dotted, value, force_add=True)
    held: Any = OmegaConf.to_container(loaded, resolve=True)
    seen = [d for d in _differences(held, dict(config)) if not _id_blind(*d, held, config)]
    return [(key, None if was is _ABSENT else was, None if now is _ABSENT else now) for key, was, now in seen]


_ABSENT = object()


def _differences(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, value in ``a``, value in ``b``) for each leaf where two nested configs differ (a mapping
    present on one side only counts as one key)."""
    out = []
    for k in sorted({*a, *b}, key=str):
        was, now = a.get(k, _ABSENT), b.get(k, _ABSENT)
        if isinstance(was, Mapping) and isinstance(now, Mapping):
            out += _differences(was, now, f"{prefix}{k}.")
        elif was != now:
            out.append((f"{prefix}{k}", was, now))
    return out


def _id_blind(key: str, was: Any, now: Any, held: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    """Whether the run id (``grid.run_id``) does not see ``key`` changing from ``was`` (in the folder's config
    ``held``) to ``now`` (in ``config``): a key hashed at its default, a cosmetic key (or one inside), a KL-only
    key of two runs without KL, or one left out of both ids at the values both hold."""
    if key in ID_HASHED_AT or is_cosmetic(key):
        return True
    no_kl = kl_off_hashed_at(held), kl_off_hashed_at(config)  # no KL in either: a KL-only key does nothing
    if key in no_kl[0] and key in no_kl[1]:
        return True
    before, after = id_omitted_at(held), id_omitted_at(config)
    return key in before and key in after and before[key] == was and after[key] == now
