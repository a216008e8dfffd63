"""How a run's config is made: Hydra composes ``klsweep/conf`` (after the user's folders: a grid's
``searchpath:`` and ``--config-dir``, whose files win over the shipped ones of the same name, ``shadowed``
says which) once per distinct combination of config-group choices, the composed values are checked, and each run's own values are set
as plain data on a copy of the composed config that copies only the sections the run changes (the others are
shared: a plan of 100,000 runs holds one copy of each unchanged section). Also the options of each config
group (for value checks and ``glob(...)``)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from klsweep import __version__, store
from klsweep import config as config_mod
from klsweep.errors import Problem
from klsweep.grid.schema import GROUPS, Schema, lookup
from klsweep.grid.validate import CHECKS, TRL, check_leaf

CONF_DIR = Path(__file__).parents[1] / "conf"
SCHEMA_NODE = "klsweep_schema.yaml"  # RunConfig in Hydra's ConfigStore (conf/config.yaml's defaults list)
# The primary config (CONF_DIR/config.yaml: the schema and the default group choices), composed from Hydra's
# ConfigStore under this name so that every config folder, the shipped one included, is on the search path in
# order: the user's first (Hydra searches its primary config folder before ``hydra.searchpath``)
PRIMARY = "klsweep_primary"


class _Reset:
    """The value of a key removed by ``~key`` inside an open mapping: ``build`` removes the entry."""

    def __repr__(self) -> str:
        return "RESET"


RESET = _Reset()


class Composer:
    """Composes configs (once per group choice) and lists group options, from ``CONF_DIR`` and the search
    path, recording problems."""

    def __init__(self, searchpath: list[str], schema: Schema, problems: list[Problem]):
        self.searchpath = searchpath
        self.schema = schema
        self.problems = problems
        self.options: dict[str, list[str]] = {}
        self.composed: dict[tuple, tuple[str, dict[str, Any]] | None] = {}
        self.bases: dict[tuple, dict[str, Any]] = {}  # group choices -> the composed config, parsed once
        self.inputs: str | None = None  # the hash of what composing reads (``_cache_file``)
        self.paths: dict[str, tuple[list[str], str]] = {}  # a dotted key -> (its parents, its leaf)

    def group_options(self, group: str) -> list[str]:
        """The options of a config group: its YAML files in ``CONF_DIR`` and the search path, sorted (what
        Hydra's ``get_group_options`` lists, without composing the primary config to find them)."""
        if group not in self.options:
            folders = [CONF_DIR, *map(Path, self.searchpath)]
            self.options[group] = sorted({p.stem for d in folders for p in (d / group).glob("*.yaml")})
        return self.options[group]

    def _sp(self) -> list[str]:
        """The search path: the user's folders, then the shipped groups (the first folder holding a file wins)."""
        return ["hydra.searchpath=[" + ",".join(f"'file://{p}'" for p in [*self.searchpath, CONF_DIR]) + "]"]

    def _hydra(self):
        from contextlib import contextmanager

        from hydra import initialize
        from hydra.core.config_store import ConfigStore
        from hydra.core.global_hydra import GlobalHydra
        from omegaconf import OmegaConf

        @contextmanager
        def ctx():
            store = ConfigStore.instance()
            if SCHEMA_NODE not in store.repo:  # once a process: OmegaConf.structured of RunConfig is slow
                store.store(name=SCHEMA_NODE, node=config_mod.RunConfig)
            if f"{PRIMARY}.yaml" not in store.repo:
                store.store(name=PRIMARY, node=OmegaConf.load(CONF_DIR / "config.yaml"))
            with initialize(config_path=None, version_base="1.3", job_name="klsweep"):
                yield GlobalHydra.instance()

        return ctx()

    def compose(self, choices: tuple[tuple[str, Any], ...]) -> tuple[str, dict[str, Any]] | None:
        """The composed config (as JSON text: json.loads is the fastest deep copy) and the group choices."""
        if choices in self.composed:
            return self.composed[choices]
        overrides = [f"{g}={'null' if o is None else o}" for g, o in choices] + self._sp()
        where = self._cache_file(overrides)
        kept = _composed(store.kept.read(*where)) if where is not None else None
        result, composed = kept if kept is not None else (None, None)
        if result is None:
            result = self._hydra_compose(overrides)
            if result is not None:
                composed = json.loads(result[0])
                if where is not None:  # not kept (a read-only cache): composed again next time
                    store.kept.keep(*where, {"config": result[0], "choices": result[1]})
        if composed is not None:
            for key in [*CHECKS, TRL]:
                ok, _, err = check_leaf(self.schema, key, lookup(composed, key))
                for e in [] if ok else err if isinstance(err, list) else [err]:
                    self.problems.append(Problem(f"config groups {' '.join(overrides)}: {key}", e[0], e[1]))
        self.composed[choices] = result
        return result

    def _cache_file(self, overrides: list[str]) -> tuple[Path, str] | None:
        """Where the config composed with ``overrides`` is kept (``store.cache_dir()/compose/``), and its key
        (``store.kept``: read back only when it is what was kept for this key): a hash of everything that decides
        it: what Hydra may read below ``CONF_DIR`` and the search path (``_config_files``), the config package's
        source (the schema's defaults), this module's, Hydra's, OmegaConf's and klsweep's versions and the
        overrides. None (composed every time) when the config folders cannot be keyed (``_config_files``)."""
        if self.inputs is None:
            self.inputs = _inputs(self.searchpath)
        if not self.inputs:
            return None
        key = store.kept.key_of(self.inputs, json.dumps(overrides))
        return store.cache_dir() / "compose" / f"{key[:32]}.json", key

    def _hydra_compose(self, overrides: list[str]) -> tuple[str, dict[str, Any]] | None:
        from hydra import compose
        from hydra.errors import HydraException
        from omegaconf import OmegaConf, open_dict
        from omegaconf.errors import OmegaConfBaseException

        try:
            with self._hydra():
                cfg = compose(config_name=PRIMARY, overrides=overrides, return_hydra_config=True)
            picked = {g: cfg.hydra.runtime.choices.get(g) for g in GROUPS}
            with open_dict(cfg):
                del cfg["hydra"]
            return json.dumps(OmegaConf.to_container(cfg, resolve=True)), picked
        except (HydraException, OmegaConfBaseException) as e:
            text = " ".join(str(e).split())
            self.problems.append(
                Problem(f"config groups {' '.join(overrides)}", f"cannot be composed: {text}")
            )
            return None

    def build(self, name: str, assignment: dict[str, Any]) -> tuple[dict, dict[str, Any]] | None:
        """One run's resolved config and group choices. The config shares the sections it does not change
        with the composed config (and so with the other runs): read-only."""
        choices = tuple((g, assignment[g]) for g in GROUPS if g in assignment)
        composed = self.compose(choices)
        if composed is None:
            return None
        if choices not in self.bases:
            self.bases[choices] = json.loads(composed[0])
        config = dict(self.bases[choices])
        config["name"] = name
        owned: set[int] = set()  # the sections copied for this run
        paths = self.paths
        for key, value in assignment.items():  # in order: a RESET removes what came before it
            if key in GROUPS or (value is RESET and not _has(config, key)):
                continue
            node = config
            path = paths.get(key)
            if path is None:
                *head, tail = key.split(".")
                path = paths[key] = (head, tail)
            parents, leaf = path
            for p in parents:
                child = node.get(p)
                if not isinstance(child, dict) or id(child) not in owned:
                    child = dict(child) if isinstance(child, dict) else {}
                    owned.add(id(child))
                    node[p] = child
                node = child
            if value is RESET:
                node.pop(leaf, None)
            else:
                node[leaf] = json.loads(json.dumps(value)) if isinstance(value, list | dict) else value
        return config, composed[1]


def shadowed(searchpath: list[str]) -> list[str]:
    """The shipped config-group files a user's folder replaces (a file of the same group and name: the first
    folder holding it wins), one line each, for ``klsweep plan`` to say."""
    out, seen = [], set()
    for folder in searchpath:
        for group in GROUPS:
            for path in sorted(Path(folder, group).glob("*.yaml")):
                if (group, path.stem) in seen or not (CONF_DIR / group / path.name).is_file():
                    continue
                seen.add((group, path.stem))
                out.append(
                    f"{path} replaces the shipped {group} {path.stem} (klsweep/conf/{group}/{path.name}): "
                    f"{group}={path.stem} is yours"
                )
    return out


def _composed(kept: Any) -> tuple[tuple[str, dict[str, Any]], dict[str, Any]] | None:
    """A kept composed config (its JSON text and group choices) and the config it parses to, or None when it is
    not one (``store.kept`` has checked that it is what was kept; this checks what it holds)."""
    if not isinstance(kept, dict) or not isinstance(kept.get("config"), str):
        return None
    choices = kept.get("choices")
    if not isinstance(choices, dict) or set(choices) != set(GROUPS):
        return None
    if not all(c is None or isinstance(c, str) for c in choices.values()):
        return None
    try:
        config = json.loads(kept["config"])
    except (ValueError, RecursionError):
        return None
    return ((kept["config"], choices), config) if isinstance(config, dict) else None


CONFIG_BYTES = 1 << 20  # the largest config file keyed by its content (a larger one: composed every time)
CONFIG_FILES = 5_000  # the most *.yaml files keyed below the config folders (more: composed every time)
CONFIG_ENTRIES = 50_000  # the most folder entries looked at (more: composed every time)
CONFIG_DEPTH = 32  # the deepest folder looked into (deeper: composed every time)


def _inputs(searchpath: list[str]) -> str:
    """The hash of what composing may read: Hydra's, OmegaConf's and klsweep's versions, the config package's
    source (the schema's defaults) and this module's, and the config folders' files (``_config_files``); ""
    when they cannot be keyed."""
    from importlib import metadata

    try:
        parts: list[str | bytes] = [
            f"{name}={metadata.version(name)}" for name in ("hydra-core", "omegaconf")
        ]
    except metadata.PackageNotFoundError:  # not installed as a distribution: nothing kept
        return ""
    parts.append(f"klsweep={__version__}")
    parts += [p.read_bytes() for p in sorted(Path(config_mod.__file__).parent.glob("*.py"))]
    parts.append(Path(__file__).read_bytes())
    for folder in [*map(Path, searchpath), CONF_DIR]:  # in the search path's order
        files = _config_files(folder)
        if files is None:
            return ""
        parts += [os.fsencode(folder), files]
    return store.kept.key_of(*parts)


def _config_files(folder: Path) -> bytes | None:
    """What Hydra may read below ``folder``, as bytes to hash: every folder's name and every ``*.yaml`` file's
    name and content, through symbolic links (Hydra opens ``folder/group/option.yaml`` and follows a linked
    group folder or file; a folder reached twice, as through a link back up, is looked into once). Only regular
    files are read, and at most ``CONFIG_BYTES`` of each: a FIFO, a device or a dangling link is keyed by its
    name and kind, never opened. None (composed every time) when a file interpolates (``${...}``: an environment
    variable may change its value), is larger than ``CONFIG_BYTES``, or there are more than ``CONFIG_FILES``
    files, ``CONFIG_ENTRIES`` entries or ``CONFIG_DEPTH`` levels."""
    out: list[bytes] = []
    seen: set[tuple[int, int]] = set()
    budget = {"files": CONFIG_FILES, "entries": CONFIG_ENTRIES}

    def walk(path: Path, rel: bytes, depth: int) -> bool:
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) in seen:
                out.append(b"\0seen\0" + rel)
                return True
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(path) as it:
                names = sorted(os.fsencode(e.name) for e in it)
        except OSError as e:
            out.append(f"\0unreadable folder {e.errno}\0".encode() + rel)
            return True
        if depth > CONFIG_DEPTH:
            return False
        for name in names:
            budget["entries"] -= 1
            if budget["entries"] < 0:
                return False
            child, child_rel = path / os.fsdecode(name), rel + b"/" + name
            try:
                st = os.stat(child)  # through a link, as Hydra's open does
            except OSError as e:
                out.append(f"\0missing {e.errno}\0".encode() + child_rel)  # a dangling link
                continue
            if stat.S_ISDIR(st.st_mode):
                out.append(b"\0folder\0" + child_rel)
                if not walk(child, child_rel, depth + 1):
                    return False
            elif name.endswith(b".yaml") and not stat.S_ISREG(st.st_mode):  # a FIFO, a device: never opened
                out.append(f"\0special {stat.S_IFMT(st.st_mode)}\0".encode() + child_rel)
            elif name.endswith(b".yaml"):
                budget["files"] -= 1
                text = _config_text(child, st) if budget["files"] >= 0 else None
                if text is None or b"${" in text:
                    return False
                out.append(f"\0file {len(text)}\0".encode() + child_rel + b"\0" + text)
        return True

    return b"".join(out) if walk(folder, b"", 0) else None


def _config_text(path: Path, st: os.stat_result) -> bytes | None:
    """The bytes of a regular config file of at most ``CONFIG_BYTES``; None when larger or unreadable."""
    if st.st_size > CONFIG_BYTES:
        return None
    try:
        with store.open_regular(path) as f:  # replaced by a FIFO or a device since: refused at once
            text = f.read(CONFIG_BYTES + 1)
    except (OSError, store.UnreadableFile):
        return None
    return text if len(text) <= CONFIG_BYTES else None


def _has(config: dict, key: str) -> bool:
    try:
        lookup(config, key)
    except (KeyError, TypeError):
        return False
    return True
