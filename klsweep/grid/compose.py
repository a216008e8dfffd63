"""How a run's config is made: Hydra composes ``klsweep/conf`` (after the user's folders: a grid's
``searchpath:`` and ``--config-dir``, whose files win over the shipped ones of the same name, ``shadowed``
says which) once per distinct combination of config-group choices, the composed values are checked, and each run's own values are set
as plain data on a copy of the composed config that copies only the sections the run changes (the others are
shared: a plan of 100,000 runs holds one copy of each unchanged section). Also the options of each config
group (for value checks and ``glob(...)``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from klsweep import config as config_mod
from klsweep import store
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
        cached = self._cache_file(overrides)
        result = _read_cached(cached) if cached is not None else None
        if result is None:
            result = self._hydra_compose(overrides)
            if result is not None and cached is not None:
                with contextlib.suppress(OSError):  # a read-only cache: composed again next time
                    store.atomic_write_text(cached, json.dumps({"config": result[0], "choices": result[1]}))
        if result is not None:
            composed = json.loads(result[0])
            for key in [*CHECKS, TRL]:
                ok, _, err = check_leaf(self.schema, key, lookup(composed, key))
                for e in [] if ok else err if isinstance(err, list) else [err]:
                    self.problems.append(Problem(f"config groups {' '.join(overrides)}: {key}", e[0], e[1]))
        self.composed[choices] = result
        return result

    def _cache_file(self, overrides: list[str]) -> Path | None:
        """Where the config composed with ``overrides`` is kept (``store.cache_dir()/compose/``), named by a hash
        of everything Hydra reads to compose it: the YAML files of ``CONF_DIR`` and the search path, the config
        package's source (the schema's defaults), Hydra's and OmegaConf's versions and the overrides. None (composed every
        time) when a file interpolates (``${...}``: an environment variable may change its value)."""
        if self.inputs is None:
            from importlib import metadata

            h = hashlib.sha256()
            for name in ("hydra-core", "omegaconf"):
                h.update(f"{name}={metadata.version(name)}\n".encode())
            for source in sorted(Path(config_mod.__file__).parent.glob("*.py")):  # the schema's defaults
                h.update(source.read_bytes())
            for folder in [*map(Path, self.searchpath), CONF_DIR]:  # in the search path's order
                for path in sorted(folder.rglob("*.yaml")):
                    text = path.read_bytes()
                    if b"${" in text:
                        self.inputs = ""
                        return None
                    h.update(f"\0{folder}\0{path.relative_to(folder)}\0".encode() + text)
            self.inputs = h.hexdigest()
        if not self.inputs:
            return None
        key = hashlib.sha256(json.dumps([self.inputs, overrides]).encode()).hexdigest()[:32]
        return store.cache_dir() / "compose" / f"{key}.json"

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


def _read_cached(path: Path) -> tuple[str, dict[str, Any]] | None:
    """A composed config kept by ``Composer.compose``, or None (absent, or not one)."""
    try:
        data = json.loads(path.read_text())
        return (data["config"], data["choices"]) if isinstance(data["config"], str) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _has(config: dict, key: str) -> bool:
    try:
        lookup(config, key)
    except (KeyError, TypeError):
        return False
    return True
