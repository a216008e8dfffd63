"""What the local caches hold, without the network: huggingface_hub's cache under ``HF_HUB_CACHE`` and datasets'
Arrow cache under ``HF_DATASETS_CACHE`` (what the loaders read under ``HF_HUB_OFFLINE=1``/``HF_DATASETS_OFFLINE=1``);
``check`` calls a need cached only when what a run loads is there whole (``model_problems``,
``dataset_problems``). Also where the caches are node-local (``node_local_warnings``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klsweep.errors import describe
from klsweep.fetch.needs import Need

# the files a tokenizer's vocabulary is read from, one set of them suffices (fast; sentencepiece; BPE; WordPiece)
_VOCAB_FILES = [("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",)]


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
    return [check_model(n) if n.kind == "model" else check_dataset(n) for n in items]


def hub_folder(repo: str) -> str:
    """The folder of the hub cache that holds a model repo (huggingface_hub's layout, ``repo_folder_name``:
    ``models--<org>--<name>``), named without importing huggingface_hub's download code (a second)."""
    return "models--" + repo.replace("/", "--")


def check_model(need: Need) -> Found:
    if need.local:
        path = Path(need.repo).expanduser()
        if not path.is_dir():
            return Found(need, False, str(path), state="missing", message=f"no such folder: {path}")
        problems, _ = model_problems(path, need.chat, covered=False)  # a folder of the user's own
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


def read_json(path: Path) -> tuple[Any, str | None]:
    """``path``'s JSON, or None and why not ("is missing", "is not JSON")."""
    import json

    if not path.is_file():
        return None, "is missing"
    try:
        return json.loads(path.read_bytes()), None
    except (OSError, ValueError) as e:
        return None, f"is not JSON ({describe(e, max_lines=1, max_chars=80)})"


def model_problems(folder: Path, chat: bool = False, covered: bool = True) -> tuple[list[str], list[str]]:
    """What keeps the model folder ``folder`` from loading as a run loads it, one line each, and the files in
    it that are there but broken (to be fetched again), relative to it: config.json parses and names its
    ``model_type``; the tokenizer's vocabulary is there (tokenizer.json, which parses, or the slow tokenizers'
    files) and its tokenizer_config.json parses; a chat template when ``chat`` (model.chat_template applies
    it); every weight file the index names, or the single one, is whole (safetensors: its header parses and
    covers the file, and it holds the tensors the index maps to it; a .bin: its zip directory reads); and the
    weights cover the parameters of the model config.json describes (``coverage.uncovered``: what transformers
    would initialise at random is missing), unless not ``covered`` (a local folder: the user's own, which the
    job's loading report checks)."""
    problems: list[str] = []
    broken: list[str] = []

    def bad(name: str, why: str) -> None:
        problems.append(f"{name} {why}")
        if (folder / name).is_file():
            broken.append(name)

    config, why = read_json(folder / "config.json")
    if why is not None:
        bad("config.json", why)
    elif not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        bad("config.json", "names no model_type")
    configured = not problems
    tok_config, why = read_json(folder / "tokenizer_config.json")
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
        template, why = read_json(folder / "chat_template.json")
        if why not in (None, "is missing"):
            bad("chat_template.json", why)
        elif (
            not (folder / "chat_template.jinja").is_file()
            and not template
            and not tok_config.get("chat_template")
        ):
            problems.append("chat_template.jinja is missing (model.chat_template is true; nor chat_template.json, "
                            "nor a chat_template in tokenizer_config.json)")  # fmt: skip
    before = len(problems)
    weights: list[str] = []  # the weight files a run loads: an index and its shards, or the single file
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            data, why = read_json(folder / index)
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
            weights = [index, *shards]
            break
    else:
        single = next((f for f in ("model.safetensors", "pytorch_model.bin") if (folder / f).is_file()), None)
        if single is None:
            problems.append("model.safetensors is missing (nor pytorch_model.bin, nor a weight index)")
        elif (why := _weights_problem(folder / single, set())) is not None:
            bad(single, why)
        weights = [single] if single else []
    if (
        covered and configured and len(problems) == before and weights
    ):  # whole: do they cover the model's parameters?
        from klsweep.fetch.coverage import uncovered

        verdict = uncovered(folder, weights)
        if verdict is not None and verdict[1]:  # it loads, without some of its parameters
            named = weights[0] if len(weights) == 1 else f"{weights[0]} and its {len(weights) - 1} shard(s)"
            problems.append(f"{named}: {verdict[0]}")
            broken += [w for w in weights if (folder / w).is_file()]
        elif verdict is not None:  # config.json or the weights: fetched again, both
            problems.append(f"the model {verdict[0]}")
            broken += [w for w in ["config.json", *weights] if (folder / w).is_file()]
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


def check_dataset(need: Need) -> Found:
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
        unreadable = [p.parent for p in root.glob("*/*/*/dataset_info.json") if read_json(p)[1] is not None]
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

    info, why = read_json(folder / "dataset_info.json")
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
