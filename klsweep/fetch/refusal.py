"""The offline clusters' check (``cluster.offline`` or ``HF_HUB_OFFLINE=1``): ``require_cached`` refuses while
the caches lack what runs load, naming each and the ``klsweep fetch`` command (``cache_refusals``: the same as
data, for ``klsweep plan`` to show beside the plan); the environment of an offline
job (``job_environment``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from klsweep.errors import Problem, UserError
from klsweep.fetch.caches import Found, check, datasets_cache, hub_cache
from klsweep.fetch.needs import HF_ID, OFFLINE_ENV, needs, offline

FETCH_FIRST = "fetch them first, where the hub can be reached, into the same HF_HOME"


def fetch_command(grid: str | Path, overrides: list[str] | None, out: Path = Path("results")) -> str:
    """The ``klsweep fetch`` command that gets what a grid's runs load (``out``: where their folders, with
    the commits they recorded, live)."""
    import shlex

    where = [] if Path(out) == Path("results") else ["--out", str(out)]  # the runs' recorded commits
    return shlex.join(["klsweep", "fetch", str(grid), *(overrides or []), *where])


def cache_refusals(configs: list[Mapping[str, Any]], command: str) -> list[Problem]:
    """Offline (``offline(configs)``): what ``require_cached`` refuses, one ``Problem`` per model and dataset
    the runs load that the caches lack or hold incomplete (a hub model whose weights do not cover its
    parameters among them), and a local ``model.path`` (or dataset) that is no folder here, then one saying
    to fetch them with ``command`` (the ``klsweep fetch`` of the grid and overrides). Empty online or when
    every one is there."""
    if not offline(configs):
        return []
    missing = [f for f in check(needs(configs)) if not f.cached]
    if not missing:
        return []
    problems = [Problem(f"{f.need.kind} {f.need.label}", _not_loadable(f)) for f in missing]
    problems.append(
        Problem(
            "offline (cluster.offline or HF_HUB_OFFLINE=1)",
            "jobs would fail loading these",
            f"{FETCH_FIRST}: {command}",
        )
    )
    return problems


def require_cached(configs: list[Mapping[str, Any]], command: str) -> None:
    """Offline (``offline(configs)``): a ``UserError`` listing every model and dataset the caches lack
    (``cache_refusals``), with the ``klsweep fetch`` command that gets them (``command``: the grid and
    overrides). A no-op online."""
    problems = cache_refusals(configs, command)
    if problems:
        raise UserError(problems, title="missing from the local caches")


def _not_loadable(found: Found) -> str:
    """Why a need the caches lack would not load: not in the cache, what is incomplete there, or (a local
    path) no such folder."""
    need = found.need
    said = "; ".join(s for s in (need.used_by, need.reading) if s)
    said = f" ({said})" if said else ""
    if need.local and found.state == "missing":
        hub = (
            ""
            if HF_ID.match(need.repo) or need.repo.startswith(("/", ".", "~"))
            else (f", and {need.repo!r} is no hub id (namespace/name)")
        )
        what = "folder" if need.kind == "model" else "file or folder"
        return f"no such {what} here: {Path(need.repo).expanduser().absolute()}{hub}{said}"
    if found.state == "incomplete":
        place = "the folder" if need.local else "the cache"
        return f"incomplete in {place} {found.where}: {found.message}{said}"
    where = hub_cache() if need.kind == "model" else datasets_cache()
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


def job_environment(config: Mapping[str, Any]) -> dict[str, str]:
    """The environment variables a job of this run sets before anything loads: the offline switches on an
    offline cluster (the caches are the ones inherited: HF_HOME)."""
    return dict.fromkeys(OFFLINE_ENV, "1") if offline([config]) else {}
