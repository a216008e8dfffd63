"""What a sweep needs from the Hugging Face hub, whether the local caches hold it, and fetching it.

``needs(configs)`` lists every model (a hub id at ``model.revision``), training set (``task.dataset``) and eval
set (the ``dataset_path``/``dataset_name`` of each lm-eval task of the suite) that runs need; ``check`` looks
for each in the caches without the network (huggingface_hub's cache under ``HF_HUB_CACHE``, datasets' Arrow
cache under ``HF_DATASETS_CACHE``: what the loaders read under ``HF_HUB_OFFLINE=1``/``HF_DATASETS_OFFLINE=1``);
``fetch`` downloads what is missing (``snapshot_download``, ``datasets.load_dataset``). ``require_cached``
is the offline clusters' check (``cluster.offline`` or ``HF_HUB_OFFLINE=1``): a ``UserError`` naming
everything missing and the ``klsweep fetch`` command. ``pin_revisions`` records the commit each hub model
resolved to in the runs' configs. See README.md ("Models and datasets") and slurm/README.md.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klsweep.errors import Problem, UserError, describe
from klsweep.evaluate import include_dir, resolve_tasks

OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
# weights in other formats than the loaders read (Llama's original/ consolidated .pth, GGUF, ...)
IGNORED_FILES = ["original/*", "*.pth", "*.gguf", "*.onnx", "*.h5", "*.msgpack", "*.ot", "*.tflite"]
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_HF_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Need:
    """One thing runs load: a model (``kind`` "model") or a dataset ("train data", "eval data")."""

    kind: str
    repo: str  # hub id (or a local path, checked for existence only)
    revision: str | None = None  # models: model.revision (None: the default branch)
    config: str | None = None  # datasets: the config (subset) name
    split: str | None = None  # datasets: the split read
    used_by: str = ""  # the key or task that asks for it

    @property
    def label(self) -> str:
        if self.kind == "model":
            return f"{self.repo}@{self.revision}" if self.revision else self.repo
        return " ".join(p for p in (self.repo, self.config, self.split) if p)

    @property
    def local(self) -> bool:
        return not _HF_NAME.match(self.repo) or Path(self.repo).expanduser().exists()


@dataclass
class Found:
    """A need and what the caches (or the hub) say about it."""

    need: Need
    cached: bool
    where: str | None = None  # the cache folder
    commit: str | None = None  # models: the snapshot's commit
    size: int | None = None  # bytes: in the cache, or on the hub (--dry-run)
    state: str = ""  # cached | missing | fetched | would fetch | failed
    message: str = ""  # failed: what went wrong and what to do


# ------------------------------------------------------------------------------------------------ needs


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
    suites: dict[str, Mapping[str, Any]] = {}
    for cfg in configs:
        model = cfg.get("model", {})
        if model.get("path", "tiny") != "tiny":
            rev = model.get("revision")
            found[Need("model", model["path"], rev, used_by=f"model {model.get('name', '')}")] = None
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
    return sorted(found, key=lambda n: order[n.kind])


def _eval_needs(ev: Mapping[str, Any]) -> list[Need]:
    """The datasets of a suite's lm-eval tasks: ``dataset_path``/``dataset_name``/``test_split`` of each task's
    YAML (following ``include:``); local builders (json, parquet, csv with data files) need nothing."""
    folder = include_dir(ev.get("include_path"))
    names = [*ev.get("in_domain", []), *ev.get("ood", [])]
    files = {}
    if folder is not None:
        for path in sorted(folder.rglob("*.yaml")):
            task = _task_yaml(path).get("task")
            if isinstance(task, str):
                files[task] = path
    if any(n not in files for n in names):  # lm-eval's own tasks: its index (a few seconds)
        files.update({k: Path(v) for k, v in resolve_tasks(dict(ev)).items() if k not in files})
    out = []
    for name in names:
        cfg = _task_yaml(files[name])
        path = cfg.get("dataset_path")
        if not path or path in ("json", "csv", "parquet", "text", "arrow") or cfg.get("custom_dataset"):
            continue
        split = cfg.get("test_split") or cfg.get("validation_split")
        out.append(Need("eval data", path, None, cfg.get("dataset_name"), split, f"eval task {name}"))
    return out


def _task_yaml(path: Path) -> dict[str, Any]:
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
        return {**_task_yaml(path.parent / base), **data}
    return data


# ------------------------------------------------------------------------------------------------ the caches


def hub_cache() -> Path:
    """huggingface_hub's cache as the environment says now (``HF_HUB_CACHE``, else ``$HF_HOME/hub``)."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def datasets_cache() -> Path:
    """datasets' Arrow cache as the environment says now (``HF_DATASETS_CACHE``, else ``$HF_HOME/datasets``)."""
    from huggingface_hub import constants

    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME") or constants.HF_HOME).expanduser() / "datasets"


# Where a path is node-local (each compute node sees its own, empty one): under one of these roots, or under
# the TMPDIR / SLURM_TMPDIR of the environment klsweep runs in (slurm/README.md, "Compute nodes without internet")
NODE_LOCAL_ROOTS = (
    "/tmp",
    "/var/tmp",
    "/dev/shm",
    "/run",
    "/scratch-local",
    "/scratch/local",
    "/localscratch",
    "/local_scratch",
    "/lscratch",
)
NODE_LOCAL_ENV = ("TMPDIR", "SLURM_TMPDIR")


def node_local_root(path: Path) -> str | None:
    """The node-local root ``path`` is under (``NODE_LOCAL_ROOTS``, ``$TMPDIR``, ``$SLURM_TMPDIR``), or None."""
    roots = [*NODE_LOCAL_ROOTS, *(os.environ[v] for v in NODE_LOCAL_ENV if os.environ.get(v, "/") != "/")]
    absolute = Path(os.path.abspath(path.expanduser()))
    for candidate in dict.fromkeys((absolute, absolute.resolve())):
        for root in roots:
            if candidate.is_relative_to(root) or candidate.is_relative_to(Path(root).resolve()):
                return root
    return None


def node_local_warnings(configs: Iterable[Mapping[str, Any]]) -> list[str]:
    """For runs on a Slurm cluster: a warning for each Hugging Face cache (``hub_cache``, ``datasets_cache``)
    on node-local storage, where the compute nodes do not see what was fetched on the login node."""
    if not any(c.get("cluster", {}).get("kind") == "slurm" for c in configs):
        return []
    out = []
    home = os.environ.get("HF_HOME")
    for name, path in (("the hub cache", hub_cache()), ("the datasets cache", datasets_cache())):
        root = node_local_root(path)
        if root is not None:
            out.append(
                f"{name} {path} (HF_HOME {home or 'unset'}) is on node-local storage (under {root}): the jobs "
                "on the Slurm nodes would not see what is cached here and load from the hub, or fail offline: "
                "set HF_HOME to a shared file system (slurm/README.md)"
            )
    return out


def check(items: Iterable[Need]) -> list[Found]:
    """What the local caches hold of each need; no network."""
    return [_check_model(n) if n.kind == "model" else _check_dataset(n) for n in items]


def _check_model(need: Need) -> Found:
    if need.local:
        path = Path(need.repo).expanduser()
        ok = (path / "config.json").is_file()
        return Found(need, ok, str(path), state="cached" if ok else "missing")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(
            snapshot_download(need.repo, revision=need.revision, local_files_only=True, cache_dir=hub_cache())
        )
    except (LocalEntryNotFoundError, OSError, ValueError):
        return Found(need, False, state="missing")
    complete = _complete_model(folder)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    state = "cached" if complete else "missing"
    return Found(need, complete, str(folder), commit=folder.name, size=size, state=state)


def _complete_model(folder: Path) -> bool:
    """A snapshot with a config, a tokenizer and every weight file its index names."""
    import json

    if not (folder / "config.json").is_file():
        return False
    if not any(
        (folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    ):
        return False
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            shards = set(json.loads((folder / index).read_text()).get("weight_map", {}).values())
            return all((folder / s).is_file() for s in shards)
    return any((folder / f).is_file() for f in ("model.safetensors", "pytorch_model.bin"))


def _check_dataset(need: Need) -> Found:
    """Found in datasets' Arrow cache (``<ns>___<name>/<config>/<version>/<hash>/``) with the split, as
    ``load_dataset`` finds it offline."""
    import json

    if need.local:
        path = Path(need.repo).expanduser()
        return Found(need, path.exists(), str(path), state="cached" if path.exists() else "missing")
    from datasets.naming import camelcase_to_snakecase

    *ns, name = need.repo.split("/")
    root = datasets_cache() / "___".join([*ns, camelcase_to_snakecase(name)])
    config = need.config or "default"
    for info in sorted(root.glob(f"{config}/*/*/dataset_info.json"), key=lambda p: p.stat().st_mtime):
        try:
            splits = json.loads(info.read_text()).get("splits") or {}
        except (OSError, ValueError):
            continue
        if need.split is None or need.split in splits:
            size = sum(p.stat().st_size for p in info.parent.glob("*.arrow"))
            return Found(need, True, str(info.parent), size=size, state="cached")
    return Found(need, False, state="missing")


def require_cached(configs: list[Mapping[str, Any]], command: str) -> None:
    """Offline (``offline(configs)``): a ``UserError`` listing every model and dataset the caches lack, with
    the ``klsweep fetch`` command that gets them (``command``: the grid and overrides). A no-op online."""
    if not offline(configs):
        return
    missing = [f for f in check(n for n in needs(configs) if not n.local) if not f.cached]  # the hub's only
    if not missing:
        return
    where = {
        "model": str(hub_cache()),
        "train data": str(datasets_cache()),
        "eval data": str(datasets_cache()),
    }
    problems = [
        Problem(f"{f.need.kind} {f.need.label}", f"not in the cache {where[f.need.kind]} ({f.need.used_by})")
        for f in missing
    ]
    problems.append(
        Problem(
            "offline (cluster.offline or HF_HUB_OFFLINE=1)",
            "jobs would fail loading these",
            f"fetch them first, where the hub can be reached, into the same HF_HOME: {command}",
        )
    )
    raise UserError(problems, title="missing from the local caches")


def require_cached_for_eval(request: Any, target: Path) -> None:
    """``require_cached`` for ``klsweep eval``'s ``request`` (``klsweep.submit.evals.eval_request``): the suite's
    datasets and the step-0 baselines' models."""
    from klsweep import evaluate, store

    clusters = [dataclasses.asdict(evaluate.run_config(r).cluster) for r in request.runs]
    configs = [{"eval": request.eval_cfg, "cluster": c} for c in clusters]
    configs += [{"model": dataclasses.asdict(m), "eval": request.eval_cfg} for _, m in request.baselines]
    sweep = Path(target) if not (Path(target) / store.CONFIG_FILE).is_file() else Path(target).parent
    require_cached(
        configs, f"klsweep fetch GRID (the sweep's grid file: its text is in {sweep / store.SWEEP_FILE})"
    )


def pin_revisions(configs: list[dict[str, Any]], run_dirs: list[Path] | None = None) -> list[dict[str, Any]]:
    """``configs`` with ``model.revision`` set, for a hub model whose revision is null, to the commit the
    cache holds (``klsweep fetch`` put it there); a run folder whose config.yaml pins one already keeps it
    (a run resumes on the weights it started with). Configs are copied where changed, never modified."""
    from klsweep.config import read_run_file

    commits: dict[tuple[str, str | None], str | None] = {}
    out = []
    for i, cfg in enumerate(configs):
        model = cfg.get("model", {})
        need = Need("model", model.get("path", "tiny"), model.get("revision"))
        if need.repo == "tiny" or need.local or (need.revision and _COMMIT.match(need.revision)):
            out.append(cfg)
            continue
        pinned = None
        if run_dirs is not None and (run_dirs[i] / "config.yaml").is_file():
            try:
                pinned = read_run_file(run_dirs[i]).get("model", {}).get("revision")
            except Exception:  # an unreadable config is the submission's to report
                pinned = None
        if pinned is None:
            key = (need.repo, need.revision)
            if key not in commits:
                commits[key] = _check_model(need).commit
            pinned = commits[key]
        out.append(cfg if pinned is None else {**cfg, "model": {**model, "revision": pinned}})
    return out


def job_environment(config: Mapping[str, Any]) -> dict[str, str]:
    """The environment variables a job of this run sets before anything loads: the offline switches on an
    offline cluster (the caches are the ones inherited: HF_HOME)."""
    return dict.fromkeys(OFFLINE_ENV, "1") if offline([config]) else {}


# ------------------------------------------------------------------------------------------------ fetching


def hub_page(need: Need) -> str:
    prefix = "" if need.kind == "model" else "datasets/"
    return f"https://huggingface.co/{prefix}{need.repo}"


def _failure(need: Need, error: BaseException) -> str:
    """What went wrong fetching ``need``, and what to do."""
    from huggingface_hub.errors import (
        GatedRepoError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    text = str(error)
    if isinstance(error, GatedRepoError) or "gated" in text.lower():
        return (
            f"gated: log in (`hf auth login`, or HF_TOKEN) with an account that accepted the licence at "
            f"{hub_page(need)}"
        )
    if isinstance(error, RevisionNotFoundError):
        return f"no revision {need.revision!r} (model.revision): see {hub_page(need)}/tree/main"
    if isinstance(error, RepositoryNotFoundError) or "doesn't exist on the hub" in text.lower():
        return "no such repository on the hub, or a private one: check the id, or log in (`hf auth login`)"
    if isinstance(error, OfflineModeIsEnabled) or "offline" in text.lower():
        return "HF_HUB_OFFLINE is set here: run klsweep fetch where the hub can be reached, with the same HF_HOME"
    return describe(error)


def _hub_size(need: Need) -> int | None:
    """The bytes a fetch would download, as the hub lists them (None when it cannot be asked)."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects

    api = HfApi()
    try:
        if need.kind == "model":
            info = api.model_info(need.repo, revision=need.revision, files_metadata=True, timeout=10)
            files = list(filter_repo_objects(info.siblings or [], ignore_patterns=IGNORED_FILES,
                                             key=lambda s: s.rfilename))  # fmt: skip
            return sum(s.size or 0 for s in files) or None
        info = api.dataset_info(need.repo, timeout=10)
        for entry in (info.card_data or {}).get("dataset_info") or []:
            if isinstance(entry, dict) and entry.get("config_name", "default") == (need.config or "default"):
                return entry.get("download_size")
    except Exception:
        return None
    return None


def fetch(
    items: list[Need],
    dry_run: bool = False,
    on_item: Callable[[Found], None] | None = None,
) -> list[Found]:
    """Download every need the caches lack into them (models: ``snapshot_download`` of the config, tokenizer
    and weights at ``revision``; datasets: ``load_dataset`` of the config and split, which prepares the Arrow
    cache), or with ``dry_run`` only say what would be fetched (with the hub's sizes where it gives them). What
    is cached is not downloaded again. A failure (gated, missing, no network) is recorded in its ``Found`` and
    the others go on; ``on_item`` sees each as it is done."""
    out = []
    for found in check(items):
        need = found.need
        if not found.cached:
            if need.local:
                found.state, found.message = "failed", f"no such local path: {need.repo}"
            elif dry_run:
                found.state, found.size = "would fetch", _hub_size(need)
            else:
                try:
                    _download(need)
                    found = dataclasses.replace(check([need])[0], state="fetched")
                    if not found.cached:
                        found.state, found.message = "failed", "downloaded, but incomplete in the cache"
                except Exception as e:
                    found.state, found.message = "failed", _failure(need, e)
        out.append(found)
        if on_item is not None:
            on_item(found)
    return out


def _download(need: Need) -> None:
    if need.kind == "model":
        from huggingface_hub import snapshot_download

        snapshot_download(
            need.repo, revision=need.revision, ignore_patterns=IGNORED_FILES, cache_dir=hub_cache()
        )
        return
    import datasets

    datasets.load_dataset(need.repo, need.config, split=need.split, cache_dir=str(datasets_cache()))


def size_text(size: int | None) -> str:
    if size is None:
        return "?"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return "?"
