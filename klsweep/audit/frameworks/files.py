"""A framework's config file as settings: a YAML/JSON mapping's dotted keys (interpolations resolved where
OmegaConf can), a launch script's Hydra overrides ``key=value`` (Hydra's own override grammar) or its
``--flag value`` pairs; the script's own ``NAME=value`` assignments replace ``$NAME``."""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from klsweep import store
from klsweep.audit.frameworks import shell
from klsweep.errors import Problem, UserError

MAX_BYTES = (
    1_000_000  # a config, a parent in its defaults chain or a launch script larger than this is not one
)
MAX_VALUES = 100_000  # values a config may hold with its YAML aliases expanded (an alias bomb: more)
MAX_DEPTH = 100  # levels a config may nest (5,000 overflow every recursive walk of the data)
MAX_PARENTS = 64  # parent files one config's defaults: may read in all, its parents' parents included
TREE_MARKERS = (".git", "pyproject.toml", "setup.py")


def tree_of(path: Path) -> Path:
    """The config tree a config's parents must lie in: the nearest folder above the file (its links resolved)
    holding ``.git``, ``pyproject.toml`` or ``setup.py`` (the repository it belongs to), else its own folder."""
    folder = Path(os.path.realpath(path)).parent
    for above in (folder, *folder.parents):
        if any((above / marker).exists() for marker in TREE_MARKERS):
            return above
    return folder


def text_of(
    path: Path, tree: Path | None = None, what: str = "a framework's config or launch-command file"
) -> str:
    """The text of a file the audit reads: a regular file (a FIFO would block for ever, /dev/zero never end), at
    most ``MAX_BYTES``, UTF-8; with ``tree``, one whose real path (links resolved) lies under it. ``UserError``
    (exit 2) otherwise, at once."""
    if tree is not None:
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(tree):
            raise UserError(
                Problem(
                    str(path),
                    f"outside the config tree {tree}"
                    + (f" (a link to {real})" if real != path.absolute() else ""),
                    "a parent under the folder of the repository holding the config (the nearest folder above "
                    f"it with {', '.join(TREE_MARKERS)}; else the config's own folder)",
                )
            )
    try:
        with store.open_regular(path) as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError as e:
        raise UserError(Problem(str(path), "no such file", what)) from e
    except store.UnreadableFile as e:
        raise UserError(Problem(str(path), e.what, what)) from e
    except OSError as e:
        raise UserError(Problem(str(path), f"cannot be read ({e.strerror or e})", what)) from e
    if len(data) > MAX_BYTES:
        raise UserError(Problem(str(path), "too large for a config", f"at most {MAX_BYTES:,} bytes"))
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise UserError(Problem(str(path), f"not a text file (byte {e.start} is not UTF-8)", what)) from e


def parent_mapping(
    parent: Path,
    tree: Path,
    where: str,
    count: int,
    not_mapping: str = "not a YAML mapping",
    empty: bool = False,
) -> dict[str, Any]:
    """The ``count``-th parent config a ``defaults:`` (in ``where``) names: more than ``MAX_PARENTS`` refused,
    else read by ``text_of`` within ``tree`` as a YAML mapping (``empty``: an empty file is {})."""
    if count > MAX_PARENTS:
        raise UserError(
            Problem(f"{where}: defaults", f"more than {MAX_PARENTS} parent files", f"at most {MAX_PARENTS}")
        )
    data = yaml_data(text_of(parent, tree, "a parent config named by defaults:"), str(parent))
    if data is None and empty:
        return {}
    if not isinstance(data, dict):
        raise UserError(Problem(str(parent), not_mapping, "a YAML mapping"))
    return data


def yaml_data(text: str, where: str) -> Any:
    """The text as YAML data, or None when it is not YAML (a launch command). Measured before it is built: a file
    whose aliases expand to more than ``MAX_VALUES`` values, a recursive alias, or nesting deeper than
    ``MAX_DEPTH`` is refused (``UserError``), quickly and in little memory."""
    import yaml

    from klsweep.store.yamlnodes import measure

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        values, depth = measure(node)
        if values == math.inf:
            what = "a YAML alias (*name) inside the node it names: it expands without end"
            raise UserError(Problem(where, what, "a config without recursive aliases"))
        if values > MAX_VALUES:
            what = f"{values:,.0f} values with its YAML aliases (*name) expanded (an alias bomb?)"
            raise UserError(Problem(where, what, f"at most {MAX_VALUES:,} values"))
        if depth > MAX_DEPTH:
            raise UserError(Problem(where, f"nested {depth:.0f} levels deep", f"at most {MAX_DEPTH}"))
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        if "nesting depth" in str(getattr(e, "problem", "")):  # libyaml's own bound (1000 levels)
            raise UserError(Problem(where, "nested over 1,000 levels deep", f"at most {MAX_DEPTH}")) from e
        return None
    finally:
        loader.dispose()


def _yaml_mapping(text: str, where: str = "the config") -> dict[str, Any] | None:
    """The file as a YAML (or JSON) mapping, or None when it is not one (a launch command)."""
    data = yaml_data(text, where)
    return data if isinstance(data, dict) else None


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out |= _flatten(v, f"{name}.")
        else:
            out[name] = v
    return out


def _resolved(data: dict[str, Any], flat: dict[str, Any]) -> dict[str, Any]:
    """Interpolations (``${a.b}``, ``${..rl.kl_coef}``) resolved where OmegaConf can; the rest left as text."""
    if not any(isinstance(v, str) and "${" in v for v in flat.values()):
        return flat
    from omegaconf import OmegaConf

    config = OmegaConf.create(data)
    out = dict(flat)
    for key, value in flat.items():
        if isinstance(value, str) and "${" in value:
            # a missing target: left as written (read as the default, said)
            with contextlib.suppress(Exception):
                out[key] = OmegaConf.select(config, key, throw_on_resolution_failure=True)
    return out


def _overrides(text: str) -> dict[str, Any]:
    """Hydra overrides ``key=value`` (``+key``/``++key`` too) from a launch command, parsed by Hydra's own
    override grammar; kept on disk by the words parsed and Hydra's version (``_kept``), so a second audit of a
    script needs no Hydra."""
    every = shell.words(text)
    words = [w for w in every if "=" in w and not w.startswith("-") and "." in w.split("=", 1)[0]]
    # Hydra's --config-name / --config-path (verl's ppo_megatron_trainer): which config's keys the file overrides
    for flag in ("--config-name", "--config-path"):
        for i, word in enumerate(every):
            if word.split("=", 1)[0] == flag:
                name = word.partition("=")[2] if "=" in word else (every[i + 1] if i + 1 < len(every) else "")
                words.append(f"{flag}={name}")
                break
    kept = _kept(words)
    if kept is not None:
        return kept
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    out: dict[str, Any] = {}
    for word in words:
        if word.startswith(("--config-name=", "--config-path=")):
            flag, _, value = word.partition("=")
            out[flag] = value
            continue
        try:
            (override,) = parser.parse_overrides([word])
        except Exception:  # noqa: BLE001 (not an override: a shell assignment, a path)
            key, _, value = word.partition("=")
            if shell.unreadable(value) and re.fullmatch(r"\+{0,2}[\w.-]+", key):  # key=$(command): unreadable
                out[key] = value  # +key kept: an addition (Reading.added)
            continue
        if not override.is_delete():  # +key / ++key kept as written: an addition (Reading.added)
            add = "++" if override.is_force_add() else "+" if override.is_add() else ""
            out[add + override.key_or_group] = override.value()
    _keep(words, out)
    return out


def _kept_path(words: list[str]) -> tuple[Any, dict[str, Any]]:
    import hashlib
    from importlib.metadata import version

    key = {"hydra": version("hydra-core"), "words": words, "form": 3}  # 3: +key kept, --config-name
    digest = hashlib.sha256(repr(sorted(key.items())).encode()).hexdigest()[:16]
    return store.cache_dir() / "audit" / f"overrides-{digest}.json", key


def _kept(words: list[str]) -> dict[str, Any] | None:
    """The overrides parsed before from exactly these words by this Hydra, or None: a missing, unreadable or
    damaged file, or one kept for other words or another Hydra (then parsed again)."""
    path, key = _kept_path(words)
    try:
        data = store.read_json(path)
    except (OSError, ValueError, store.UnreadableFile):
        return None
    if (
        not isinstance(data, dict)
        or {k: data.get(k) for k in key} != key
        or not isinstance(data.get("settings"), dict)
    ):
        return None
    return data["settings"]


def _keep(words: list[str], settings: dict[str, Any]) -> None:
    """Keep the parsed overrides where each value is plain JSON (a Hydra sweep object is not: parsed again)."""
    import json

    try:
        if json.loads(json.dumps(settings)) != settings or any(
            isinstance(v, tuple | float) and v != v for v in settings.values()
        ):
            return
        path, key = _kept_path(words)
        store.write_json(path, key | {"settings": settings})
    except (OSError, TypeError, ValueError):  # not JSON, or a read-only cache: parsed again next time
        return


def flags(text: str) -> dict[str, Any]:
    """A launch command's ``--flag value`` / ``--flag=value`` / ``--flag`` (true) pairs, values parsed as YAML
    scalars."""
    import yaml

    words = shell.words(text)
    out: dict[str, Any] = {}
    for i, word in enumerate(words):
        if not word.startswith("--"):
            continue
        name, eq, value = word[2:].partition("=")
        if not eq:
            nxt = words[i + 1] if i + 1 < len(words) else None
            value = nxt if nxt is not None and not nxt.startswith("--") else "true"
        try:
            out[name] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[name] = value
    return out


def settings(
    text: str, where: str = "the config", path: Path | None = None, compose: Any = None
) -> dict[str, Any]:
    """A YAML/JSON mapping's dotted keys (as ``compose(path, data)`` composes it where the framework composes
    configs: NeMo-RL's ``defaults:``), else a launch command's Hydra overrides."""
    data = _yaml_mapping(text, where)
    if data is not None:
        if compose is not None and path is not None:
            data = compose(path, data)
        return _resolved(data, _flatten(data))
    return _overrides(text)
