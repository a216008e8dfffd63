"""Fetching what the caches lack from the hub (``fetch``: ``snapshot_download``, ``datasets.load_dataset``),
after one look at whether the hub answers (``hub_unreachable``); a failure explained by its error's type."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from klsweep.errors import Problem, UserError, describe
from klsweep.fetch.caches import Found, check, datasets_cache, hub_cache
from klsweep.fetch.needs import Need

# weights in other formats than the loaders read (Llama's original/ consolidated .pth, GGUF, ...)
IGNORED_FILES = ["original/*", "*.pth", "*.gguf", "*.onnx", "*.h5", "*.msgpack", "*.ot", "*.tflite"]


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
