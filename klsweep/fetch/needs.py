"""What runs load from the hub: every model (a hub id at ``model.revision``), training set (``task.dataset``)
and eval set (the ``dataset_path``/``dataset_name`` of each lm-eval task of the suite) of a sweep's runs, as
``Need``s; whether runs must load from the caches alone (``offline``)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# a hub id: "name" or "namespace/name" (transformers and datasets read a local folder of that name first)
HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


@dataclass(frozen=True)
class Need:
    """One thing runs load: a model (``kind`` "model") or a dataset ("train data", "eval data")."""

    kind: str
    repo: str  # hub id (or a local path, checked for existence only)
    revision: str | None = None  # models: model.revision (None: the default branch)
    config: str | None = None  # datasets: the config (subset) name
    split: str | None = None  # datasets: the split read
    used_by: str = ""  # the key or task that asks for it
    chat: bool = False  # models: a run applies its chat template (model.chat_template)

    @property
    def label(self) -> str:
        if self.kind == "model":
            return f"{self.repo}@{self.revision}" if self.revision else self.repo
        return " ".join(p for p in (self.repo, self.config, self.split) if p)

    @property
    def local(self) -> bool:
        """A path here: one that exists (as the loaders read it first), or one that cannot be a hub id."""
        return Path(self.repo).expanduser().exists() or not HF_ID.match(self.repo)

    @property
    def reading(self) -> str:
        """How ``repo`` is read, said where it could be taken for the other (a hub id without a namespace)."""
        if self.local or "/" in self.repo:
            return ""
        return f"{self.repo!r} read as a hub id: there is no local path {self.repo!r} here"


def offline(configs: Iterable[Mapping[str, Any]] = ()) -> bool:
    """Whether runs must load from the caches alone: ``HF_HUB_OFFLINE`` set here, or ``cluster.offline``."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    return any(bool(c.get("cluster", {}).get("offline")) for c in configs)


def needs(configs: Iterable[Mapping[str, Any]]) -> list[Need]:
    """Every model, training set and eval set the runs of ``configs`` (resolved RunConfig dicts) load, once
    each, in a stable order (models, then training, then eval data)."""
    from klsweep import tasks

    found: dict[Need, None] = {}
    chats: set[Need] = set()  # models some run applies the chat template of
    suites: dict[str, Mapping[str, Any]] = {}
    for cfg in configs:
        model = cfg.get("model", {})
        if model.get("path", "tiny") != "tiny":
            rev = model.get("revision")
            need = Need("model", model["path"], rev, used_by=f"model {model.get('name', '')}")
            found[need] = None
            if model.get("chat_template"):
                chats.add(need)
        task = cfg.get("task", {})
        if task.get("name") == "math":
            dataset = task.get("dataset") or tasks.MATH_DEFAULT_DATASET
            configs_of = tasks.math_configs(dataset)
            for sub in configs_of:
                found[Need("train data", dataset, None, sub, task.get("split"), "task.dataset")] = None
        ev = cfg.get("eval", {})
        if ev.get("suite", "none") not in ("none", "", None):
            suites.setdefault(repr(sorted(ev.items())), ev)
    for ev in suites.values():
        for need in _eval_needs(ev):
            found[need] = None
    order = {"model": 0, "train data": 1, "eval data": 2}
    return [dataclasses.replace(n, chat=n in chats) for n in sorted(found, key=lambda n: order[n.kind])]


def _eval_needs(ev: Mapping[str, Any]) -> list[Need]:
    """The datasets of a suite's lm-eval tasks: ``dataset_path``/``dataset_name``/``test_split`` of each task's
    YAML (following ``include:``); local builders (json, parquet, csv with data files) need nothing."""
    from klsweep.evaluate import include_dir, resolve_tasks

    folder = include_dir(ev.get("include_path"))
    names = [*ev.get("in_domain", []), *ev.get("ood", [])]
    files = {}
    if folder is not None:
        for path in sorted(folder.rglob("*.yaml")):
            task = task_yaml(path).get("task")
            if isinstance(task, str):
                files[task] = path
    if any(n not in files for n in names):  # lm-eval's own tasks: its index (a few seconds)
        files.update({k: Path(v) for k, v in resolve_tasks(dict(ev)).items() if k not in files})
    out = []
    for name in names:
        cfg = task_yaml(files[name])
        path = cfg.get("dataset_path")
        if not path or path in ("json", "csv", "parquet", "text", "arrow") or cfg.get("custom_dataset"):
            continue
        split = cfg.get("test_split") or cfg.get("validation_split")
        out.append(Need("eval data", path, None, cfg.get("dataset_name"), split, f"eval task {name}"))
    return out


def task_yaml(path: Path) -> dict[str, Any]:
    """An lm-eval task YAML as data (its ``!function`` tags as None), ``include:`` merged underneath."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    data = yaml.load(path.read_text(), Loader=Loader) or {}
    if not isinstance(data, dict):
        return {}
    base = data.get("include")
    if isinstance(base, str):
        return {**task_yaml(path.parent / base), **data}
    return data
