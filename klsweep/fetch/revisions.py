"""The commit each run loads: ``pin_revisions`` records the commit each hub model resolved to in the runs'
configs (the one ``klsweep fetch`` put in the cache); ``recorded_revisions`` reads them back from the run
folders, for the checks (``plan_configs``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from klsweep.fetch.caches import check_model
from klsweep.fetch.needs import COMMIT, Need


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
        hub = model.get("path", "tiny") != "tiny" and not (revision and COMMIT.match(revision))
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
        if need.repo == "tiny" or need.local or (need.revision and COMMIT.match(need.revision)):
            out.append(cfg)
            continue
        key = (need.repo, need.revision)
        if key not in commits:
            commits[key] = check_model(need).commit
        pinned = commits[key]
        out.append(cfg if pinned is None else {**cfg, "model": {**model, "revision": pinned}})
    return out
