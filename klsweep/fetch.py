"""What a sweep needs from the Hugging Face hub, whether the local caches hold it, and fetching it.

``needs(configs)`` lists every model (a hub id at ``model.revision``), training set (``task.dataset``) and eval
set (the ``dataset_path``/``dataset_name`` of each lm-eval task of the suite) that runs need; ``check`` looks
for each in the caches without the network (huggingface_hub's cache under ``HF_HUB_CACHE``, datasets' Arrow
cache under ``HF_DATASETS_CACHE``: what the loaders read under ``HF_HUB_OFFLINE=1``/``HF_DATASETS_OFFLINE=1``)
and calls it cached only when what a run loads is there whole (``model_problems``, ``dataset_problems``);
``fetch`` downloads what is missing or incomplete (``snapshot_download``, ``datasets.load_dataset``), after
one look at whether the hub answers (``hub_unreachable``). ``require_cached`` is the offline clusters' check
(``cluster.offline`` or ``HF_HUB_OFFLINE=1``): a ``UserError`` naming everything missing or incomplete and
the ``klsweep fetch`` command. ``pin_revisions`` records the commit each hub model resolved to in the runs'
configs; ``recorded_revisions`` reads them back, for the checks. See
docs/CLUSTER.md and slurm/README.md.
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

OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
# weights in other formats than the loaders read (Llama's original/ consolidated .pth, GGUF, ...)
IGNORED_FILES = ["original/*", "*.pth", "*.gguf", "*.onnx", "*.h5", "*.msgpack", "*.ot", "*.tflite"]
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# a hub id: "name" or "namespace/name" (transformers and datasets read a local folder of that name first)
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
# the files a tokenizer's vocabulary is read from, one set of them suffices (fast; sentencepiece; BPE; WordPiece)
_VOCAB_FILES = [("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",)]


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
        return Path(self.repo).expanduser().exists() or not _HF_ID.match(self.repo)

    @property
    def reading(self) -> str:
        """How ``repo`` is read, said where it could be taken for the other (a hub id without a namespace)."""
        if self.local or "/" in self.repo:
            return ""
        return f"{self.repo!r} read as a hub id: there is no local path {self.repo!r} here"


@dataclass
class Found:
    """A need and what the caches (or the hub) say about it."""

    need: Need
    cached: bool
    where: str | None = None  # the cache folder
    commit: str | None = None  # models: the snapshot's commit
    size: int | None = None  # bytes: in the cache, or on the hub (--dry-run)
    state: str = ""  # cached | missing | incomplete | fetched | would fetch | failed
    message: str = ""  # incomplete: what keeps it from loading; failed: what went wrong and what to do
    broken: tuple[str, ...] = ()  # incomplete: files (folders) there but broken, to be fetched again


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
                "set HF_HOME to a shared file system (klsweep docs slurm)"
            )
    return out


def check(items: Iterable[Need]) -> list[Found]:
    """What the local caches hold of each need, checked to load (``model_problems``, ``dataset_problems``);
    no network."""
    return [_check_model(n) if n.kind == "model" else _check_dataset(n) for n in items]


def hub_folder(repo: str) -> str:
    """The folder of the hub cache that holds a model repo (huggingface_hub's layout, ``repo_folder_name``:
    ``models--<org>--<name>``), named without importing huggingface_hub's download code (a second)."""
    return "models--" + repo.replace("/", "--")


def _check_model(need: Need) -> Found:
    if need.local:
        path = Path(need.repo).expanduser()
        if not path.is_dir():
            return Found(need, False, str(path), state="missing", message=f"no such folder: {path}")
        problems, _ = model_problems(path, need.chat)
        return _found(need, path, problems, [])
    if not (
        hub_cache() / hub_folder(need.repo)
    ).is_dir():  # missing, said without importing snapshot_download
        return Found(need, False, state="missing")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(
            snapshot_download(need.repo, revision=need.revision, local_files_only=True, cache_dir=hub_cache())
        )
    except (LocalEntryNotFoundError, OSError, ValueError):
        return Found(need, False, state="missing")
    problems, broken = model_problems(folder, need.chat)
    found = _found(need, folder, problems, [folder / b for b in broken])
    found.commit = folder.name
    return found


def _found(need: Need, folder: Path, problems: list[str], broken: list[Path]) -> Found:
    """The ``Found`` of a cache folder: cached when nothing keeps it from loading, else incomplete, saying
    what (``problems``) and the files to be fetched again (``broken``)."""
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    if not problems:
        return Found(need, True, str(folder), size=size, state="cached")
    return Found(need, False, str(folder), size=size, state="incomplete", message="; ".join(problems),
                 broken=tuple(str(b) for b in broken))  # fmt: skip


def _read_json(path: Path) -> tuple[Any, str | None]:
    """``path``'s JSON, or None and why not ("is missing", "is not JSON")."""
    import json

    if not path.is_file():
        return None, "is missing"
    try:
        return json.loads(path.read_bytes()), None
    except (OSError, ValueError) as e:
        return None, f"is not JSON ({describe(e, max_lines=1, max_chars=80)})"


def model_problems(folder: Path, chat: bool = False) -> tuple[list[str], list[str]]:
    """What keeps the model folder ``folder`` from loading as a run loads it, one line each, and the files in
    it that are there but broken (to be fetched again), relative to it: config.json parses and names its
    ``model_type``; the tokenizer's vocabulary is there (tokenizer.json, which parses, or the slow tokenizers'
    files) and its tokenizer_config.json parses; a chat template when ``chat`` (model.chat_template applies
    it); every weight file the index names, or the single one, is whole (safetensors: its header parses and
    covers the file, and it holds the tensors the index maps to it; a .bin: its zip directory reads)."""
    problems: list[str] = []
    broken: list[str] = []

    def bad(name: str, why: str) -> None:
        problems.append(f"{name} {why}")
        if (folder / name).is_file():
            broken.append(name)

    config, why = _read_json(folder / "config.json")
    if why is not None:
        bad("config.json", why)
    elif not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        bad("config.json", "names no model_type")
    tok_config, why = _read_json(folder / "tokenizer_config.json")
    if why == "is missing":
        tok_config = {}
    elif why is not None or not isinstance(tok_config, dict):
        bad("tokenizer_config.json", why or "is not a JSON object")
        tok_config = {}
    if not any(all((folder / f).is_file() for f in files) for files in _VOCAB_FILES):
        problems.append("tokenizer.json is missing (nor tokenizer.model, vocab.json + merges.txt, vocab.txt)")
    elif (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as e:  # the tokenizers library's own parse error
            bad("tokenizer.json", f"does not load ({describe(e, max_lines=1, max_chars=80)})")
    if chat:
        template, why = _read_json(folder / "chat_template.json")
        if why not in (None, "is missing"):
            bad("chat_template.json", why)
        elif (
            not (folder / "chat_template.jinja").is_file()
            and not template
            and not tok_config.get("chat_template")
        ):
            problems.append("chat_template.jinja is missing (model.chat_template is true; nor chat_template.json, "
                            "nor a chat_template in tokenizer_config.json)")  # fmt: skip
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            data, why = _read_json(folder / index)
            weight_map = data.get("weight_map") if isinstance(data, dict) else None
            if why is not None or not isinstance(weight_map, dict) or not weight_map:
                bad(index, why or "maps no weights (weight_map)")
                break
            shards: dict[str, set[str]] = {}
            for tensor, shard in weight_map.items():
                shards.setdefault(str(shard), set()).add(tensor)
            for shard, tensors in shards.items():
                if (why := _weights_problem(folder / shard, tensors)) is not None:
                    bad(shard, why)
            break
    else:
        single = next((f for f in ("model.safetensors", "pytorch_model.bin") if (folder / f).is_file()), None)
        if single is None:
            problems.append("model.safetensors is missing (nor pytorch_model.bin, nor a weight index)")
        elif (why := _weights_problem(folder / single, set())) is not None:
            bad(single, why)
    return problems, broken


def _weights_problem(path: Path, tensors: set[str]) -> str | None:
    """Why the weight file ``path`` does not load whole with ``tensors`` in it (None: it does)."""
    if not path.is_file():
        return "is missing"
    if path.suffix != ".safetensors":
        import zipfile

        try:  # torch.save's format: a zip whose directory, at the end, a truncated file lacks
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (OSError, zipfile.BadZipFile) as e:
            return f"does not load ({describe(e, max_lines=1, max_chars=80)})"
        return None if names else "is empty"
    from safetensors import safe_open

    try:  # the header is parsed and checked to cover the whole file (a truncated one does not)
        with safe_open(str(path), "np") as f:
            held = set(f.keys())
    except Exception as e:  # safetensors' SafetensorError
        return f"does not load ({describe(e, max_lines=1, max_chars=80)})"
    lacking = sorted(tensors - held)
    return f"lacks {len(lacking)} tensors its index maps to it ({lacking[0]}, ...)" if lacking else None


def _check_dataset(need: Need) -> Found:
    """The folder of datasets' Arrow cache (``<ns>___<name>/<config>/<version>/<hash>/``) that ``load_dataset``
    reads offline (datasets' own choice: the newest), checked to hold the split whole (``dataset_problems``)."""
    if need.local:
        path = Path(need.repo).expanduser()
        return Found(need, path.exists(), str(path), state="cached" if path.exists() else "missing")
    if not _may_be_cached(need.repo):  # missing, said without importing datasets (a second: pandas, pyarrow)
        return Found(need, False, state="missing")
    from datasets.naming import camelcase_to_snakecase
    from datasets.packaged_modules.cache.cache import _find_hash_in_cache

    *ns, name = need.repo.split("/")
    root = datasets_cache() / "___".join([*ns, camelcase_to_snakecase(name)])
    try:
        config, version, commit = _find_hash_in_cache(need.repo, need.config, str(datasets_cache()), {}, None)
    except ValueError as e:  # none cached, or ... a dataset_info.json that is not JSON
        unreadable = [p.parent for p in root.glob("*/*/*/dataset_info.json") if _read_json(p)[1] is not None]
        if not unreadable:
            return Found(need, False, state="missing")
        why = f"{unreadable[0] / 'dataset_info.json'} is not JSON ({describe(e, max_lines=1, max_chars=80)})"
        return Found(need, False, str(root), state="incomplete", message=why,
                     broken=tuple(str(p) for p in unreadable))  # fmt: skip
    folder = root / config / version / commit
    problems = dataset_problems(folder, need.split)
    return _found(need, folder, problems, [folder] if problems else [])


def _may_be_cached(repo: str) -> bool:
    """Whether the datasets cache holds a folder that may be ``repo``'s: datasets names it ``<ns>___<name>``
    with the name in snake case (``camelcase_to_snakecase``: lower case, underscores inserted), so a folder
    whose name, lower-cased and without underscores, is not the repo's so written is none of its."""

    def bare(text: str) -> str:
        return text.replace("_", "").replace("/", "").lower()

    folder = datasets_cache()
    return folder.is_dir() and any(bare(p.name) == bare(repo) for p in folder.iterdir())


def dataset_problems(folder: Path, split: str | None) -> list[str]:
    """What keeps ``split`` (None: every split) of the prepared dataset ``folder`` from loading: its
    dataset_info.json parses and lists the split, and the split's Arrow files (as datasets names them from
    the info's shard lengths) are there and hold the rows the info counts."""
    import pyarrow as pa
    from datasets.naming import filenames_for_dataset_split

    info, why = _read_json(folder / "dataset_info.json")
    splits = info.get("splits") if isinstance(info, dict) else None
    if why is not None or not isinstance(splits, dict):
        return [f"dataset_info.json {why or 'lists no splits'}"]
    if split is not None and split not in splits:
        return [f"has no split {split!r} (it has {', '.join(splits) or 'none'})"]
    problems = []
    for name in [split] if split is not None else list(splits):
        entry = splits[name] if isinstance(splits[name], dict) else {}
        files = filenames_for_dataset_split(
            str(folder), entry.get("dataset_name") or info.get("dataset_name"), name, "arrow",
            entry.get("shard_lengths"),
        )  # fmt: skip
        rows = 0
        for file in map(Path, files):
            if not file.is_file():
                problems.append(f"{file.name} is missing")
                continue
            try:
                with pa.memory_map(str(file)) as source:
                    rows += pa.ipc.open_stream(source).read_all().num_rows
            except (OSError, pa.ArrowException) as e:
                problems.append(f"{file.name} does not load ({describe(e, max_lines=1, max_chars=80)})")
        expected = entry.get("num_examples")
        if not problems and isinstance(expected, int) and rows != expected:
            problems.append(f"split {name} has {rows} rows, dataset_info.json counts {expected}")
    return problems


def fetch_command(grid: str | Path, overrides: list[str] | None, out: Path = Path("results")) -> str:
    """The ``klsweep fetch`` command that gets what a grid's runs load (``out``: where their folders, with
    the commits they recorded, live)."""
    import shlex

    where = [] if Path(out) == Path("results") else ["--out", str(out)]  # the runs' recorded commits
    return shlex.join(["klsweep", "fetch", str(grid), *(overrides or []), *where])


def require_cached(configs: list[Mapping[str, Any]], command: str) -> None:
    """Offline (``offline(configs)``): a ``UserError`` listing every model and dataset the caches lack, with
    the ``klsweep fetch`` command that gets them (``command``: the grid and overrides). A no-op online."""
    if not offline(configs):
        return
    missing = [f for f in check(n for n in needs(configs) if not n.local) if not f.cached]  # the hub's only
    if not missing:
        return
    problems = [Problem(f"{f.need.kind} {f.need.label}", _not_loadable(f)) for f in missing]
    problems.append(
        Problem(
            "offline (cluster.offline or HF_HUB_OFFLINE=1)",
            "jobs would fail loading these",
            f"fetch them first, where the hub can be reached, into the same HF_HOME: {command}",
        )
    )
    raise UserError(problems, title="missing from the local caches")


def _not_loadable(found: Found) -> str:
    """Why a need the caches lack would not load: not in the cache, or what is incomplete there."""
    need = found.need
    where = hub_cache() if need.kind == "model" else datasets_cache()
    said = "; ".join(s for s in (need.used_by, need.reading) if s)
    said = f" ({said})" if said else ""
    if found.state == "incomplete":
        return f"incomplete in the cache {found.where}: {found.message}{said}"
    return f"not in the cache {where}{said}"


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


def plan_configs(plan: Any) -> list[dict[str, Any]]:
    """What a plan's runs load (``grid.Plan``): their configs at the commits their folders recorded
    (``recorded_revisions``), for the offline check and ``klsweep fetch``."""
    return recorded_revisions([r.config for r in plan.runs], [r.run_dir for r in plan.runs])


def recorded_revisions(configs: list[dict[str, Any]], run_dirs: list[Path]) -> list[dict[str, Any]]:
    """``configs`` with ``model.revision`` as each run folder's config.yaml recorded it at submission (the
    commit its job loads: see ``pin_revisions``) unless the config names a commit itself; the others are
    returned as they are, the changed ones copied, never modified."""
    from klsweep.config import read_run_file

    out = []
    for cfg, run_dir in zip(configs, run_dirs, strict=True):
        model = cfg.get("model", {})
        pinned, revision = None, model.get("revision")
        hub = model.get("path", "tiny") != "tiny" and not (revision and _COMMIT.match(revision))
        if hub and (Path(run_dir) / "config.yaml").is_file():
            try:
                pinned = read_run_file(Path(run_dir)).get("model", {}).get("revision")
            except Exception:  # an unreadable config is the submission's to report
                pinned = None
        same = pinned is None or pinned == revision
        out.append(cfg if same else {**cfg, "model": {**model, "revision": pinned}})
    return out


def pin_revisions(configs: list[dict[str, Any]], run_dirs: list[Path] | None = None) -> list[dict[str, Any]]:
    """``configs`` with ``model.revision`` set, for a hub model whose revision is null, to the commit the
    cache holds (``klsweep fetch`` put it there); a run folder whose config.yaml pins one already keeps it
    (a run resumes on the weights it started with: ``recorded_revisions``). Configs are copied where changed,
    never modified."""
    if run_dirs is not None:
        configs = recorded_revisions(configs, run_dirs)
    commits: dict[tuple[str, str | None], str | None] = {}
    out = []
    for cfg in configs:
        model = cfg.get("model", {})
        need = Need("model", model.get("path", "tiny"), model.get("revision"))
        if need.repo == "tiny" or need.local or (need.revision and _COMMIT.match(need.revision)):
            out.append(cfg)
            continue
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
    """What went wrong fetching ``need``, and what to do, told by the type of ``error`` or of an error it was
    raised from or while handling (datasets raises its own from huggingface_hub's), never by its text."""
    import httpx
    from datasets.exceptions import DatasetNotFoundError
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__
    first = chain[0]

    def raised(*types: type[BaseException]) -> BaseException | None:
        return next((e for e in chain if isinstance(e, types)), None)

    if raised(GatedRepoError):
        return (
            f"gated: log in (`hf auth login`, or HF_TOKEN) with an account that accepted the licence at "
            f"{hub_page(need)}"
        )
    if raised(RevisionNotFoundError):
        return f"no revision {need.revision!r} (model.revision): see {hub_page(need)}/tree/main"
    if raised(RepositoryNotFoundError, DatasetNotFoundError):
        return "no such repository on the hub, or a private one: check the id, or log in (`hf auth login`)"
    if raised(OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set here: run klsweep fetch where the hub can be reached, with the same HF_HOME"
    if raised(httpx.TransportError, ConnectionError):
        return f"the hub cannot be reached ({describe(first, max_lines=1, max_chars=120)}): {_NO_NETWORK}"
    http = raised(HfHubHTTPError)
    status = getattr(getattr(http, "response", None), "status_code", None)
    if status in (401, 403):
        return (
            f"refused (HTTP {status}): log in (`hf auth login`, or HF_TOKEN) with an account that may read it"
        )
    if status == 429:
        return "rate limited by the hub (HTTP 429): wait a few minutes and run klsweep fetch again"
    if isinstance(status, int) and status >= 500:
        return f"the hub failed (HTTP {status}): run klsweep fetch again later"
    return describe(first)


_NO_NETWORK = (
    "run klsweep fetch where the hub can be reached (a login node), into the same HF_HOME; behind a proxy, "
    "set HTTPS_PROXY"
)


def hub_unreachable() -> str | None:
    """None when the hub (``HF_ENDPOINT``) answers this machine, else why not, in one line: one request, no
    retries, a few seconds at most (huggingface_hub retries a connection five times per file)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set here"
    try:  # any HTTP answer, an error status included, says the network is there
        get_session().head(constants.ENDPOINT, timeout=5, follow_redirects=False)
    except Exception as e:  # httpx's ConnectError, ConnectTimeout, ProxyError; OfflineModeIsEnabled
        return f"{constants.ENDPOINT} cannot be reached ({describe(e, max_lines=1, max_chars=120)})"
    return None


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
    """Download every need the caches lack, or hold incomplete, into them (models: ``snapshot_download`` of
    the config, tokenizer and weights at ``revision``; datasets: ``load_dataset`` of the config and split,
    which prepares the Arrow cache), or with ``dry_run`` only say what would be fetched (with the hub's sizes
    where it gives them). What is cached (``check``: it loads) is not downloaded again; what is there but
    broken (a truncated weight file, a config that does not parse, a dataset's missing Arrow files) is
    removed from the cache and fetched again. A failure (gated, missing) is recorded in its ``Found`` and the
    others go on; ``on_item`` sees each as it is done. When something is to be downloaded and the hub cannot
    be reached, a ``UserError`` says so once, naming each of them, before any is tried."""
    found = check(items)
    todo = [f for f in found if not f.cached and not f.need.local]
    unreachable = hub_unreachable() if todo else None
    if unreachable is not None and not dry_run:
        problems = [
            Problem(
                f"{f.need.kind} {f.need.label}", f"incomplete: {f.message}" if f.message else "not cached"
            )
            for f in todo
        ]
        problems.append(Problem("the hub", unreachable, _NO_NETWORK))
        raise UserError(problems, title="nothing fetched")
    out = []
    for f in found:
        need = f.need
        if not f.cached:
            if need.local:
                f.state, f.message = "failed", f.message or f"no such local path: {need.repo}"
            elif dry_run:
                f.state, f.size = "would fetch", None if unreachable else _hub_size(need)
            else:
                try:
                    _discard(f)
                    _download(need)
                    f = dataclasses.replace(check([need])[0], state="fetched")
                    if not f.cached:
                        f.state, f.message = "failed", f"downloaded, but still incomplete: {f.message}"
                except Exception as e:
                    f.state, f.message = "failed", _failure(need, e)
        out.append(f)
        if on_item is not None:
            on_item(f)
    return out


def _discard(found: Found) -> None:
    """Remove from the cache what ``found`` says is there but broken, for the download to fetch it again: a
    snapshot's file and the blob it links to (huggingface_hub reuses a blob it finds), a prepared dataset's
    folder (datasets reuses a folder with a dataset_info.json)."""
    import shutil

    for name in found.broken:
        path = Path(name)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            continue
        blob = path.resolve() if path.is_symlink() else None
        path.unlink(missing_ok=True)
        if blob is not None and blob.parent.name == "blobs":
            blob.unlink(missing_ok=True)


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
