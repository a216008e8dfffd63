"""A run's W&B identity and its eval scores there: one W&B run per run folder, for training and evaluation.

- id: ``<sweep name>-<run id>`` (the run's hash, so a rerun resumes the same W&B run);
- name: readable, from the sweep's varying axes (``<sweep>/sweep.yaml``: ``estimator=k1 placement=reward lag=4
  seed=1``; a run without KL: ``no-KL lag=4 seed=1``), else from the run's KL settings;
- files: under ``<run>/wandb/``: ``offline-run-<time>-<id>/`` (offline) or ``run-<time>-<id>/`` (online);
- eval scores (``log_eval``): each evaluated checkpoint's scores, logged to the run's W&B run (resumed by id, in
  the mode training used) as ``eval/<task>``, ``eval/in_domain_avg``, ``eval/ood_avg`` against ``eval/step``.
  Nothing is logged for a run that trained without W&B.

Offline runs (no W&B login on the machine, the default) are uploaded afterwards with W&B's own command, training
and eval of each run in order::

    wandb sync results/<sweep>/*/wandb/offline-run-*
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from klsweep import store
from klsweep.errors import describe

WANDB_DIR = "wandb"  # <run>/wandb/: W&B's own folder (wandb.init(dir=<run>) creates it)
_KL_KEYS = ("kl.estimator", "kl.placement", "kl.level", "kl.importance")


def wandb_id(sweep_name: str, run_dir: Path) -> str:
    """The W&B run id of a run folder: ``<sweep>-<run id>``, in W&B's alphabet."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{sweep_name}-{Path(run_dir).name}")


def _get(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def wandb_name(config: dict[str, Any], run_dir: Path) -> str:
    """A readable W&B run name: the run's values of the sweep's varying axes (``sweep.yaml``: ``runs``), or
    where the sweep file does not list the run, its KL settings, lag and seed; "no-KL" for beta = 0."""
    run_dir = Path(run_dir)
    sweep_file = run_dir.parent / store.SWEEP_FILE
    params: dict[str, Any] | None = None
    if sweep_file.is_file():
        import yaml

        runs = (yaml.safe_load(sweep_file.read_text()) or {}).get("runs") or {}
        params = runs.get(run_dir.name)
    if not params:
        keys = ("kl.estimator", "kl.placement", "kl.beta", "offpolicy.lag", "seed")
        params = {k: _get(config, k) for k in keys}
    no_kl = float(_get(config, "kl.beta") or 0) == 0
    parts = ["no-KL"] if no_kl else []
    for key, value in params.items():
        if no_kl and (key in _KL_KEYS or key == "kl.beta"):
            continue
        parts.append(f"{key.rsplit('.', 1)[-1]}={_fmt(value)}")
    return " ".join(parts) or Path(run_dir).name


def training_mode(run_dir: Path) -> str | None:
    """The mode the run's training logged to W&B in: "offline", "online", or None (no W&B run)."""
    folder = Path(run_dir) / WANDB_DIR
    if any(folder.glob("offline-run-*")):
        return "offline"
    if any(folder.glob("run-*")):
        return "online"
    return None


def log_eval(run_dir: Path, config: dict[str, Any], results: dict[str, Any]) -> str | None:
    """Log one evaluated checkpoint's scores (``evaluate``'s results.json) to the run's W&B run, resumed by id in
    the mode its training used; nothing when it trained without W&B. Returns None, or why it could not log
    (W&B mirrors the results files: a failure here does not fail the evaluation)."""
    mode = training_mode(run_dir)
    if mode is None:
        return None
    try:
        import wandb

        metrics = results.get("metrics", {})
        row: dict[str, float] = {"eval/step": float(results.get("step", 0))}
        for kind, avg in (("in_domain", "eval/in_domain_avg"), ("ood", "eval/ood_avg")):
            values = {t: float(v) for t, v in (metrics.get(kind) or {}).items() if v is not None}
            row |= {f"eval/{t}": v for t, v in values.items()}
            if values:
                row[avg] = math.fsum(values.values()) / len(values)
        run = wandb.init(
            project=_get(config, "wandb.project") or "klsweep",
            entity=_get(config, "wandb.entity"),
            group=_get(config, "name"),
            id=wandb_id(str(_get(config, "name")), run_dir),
            name=wandb_name(config, run_dir),
            resume="allow",
            dir=str(run_dir),
            mode=mode,
        )
        try:
            run.define_metric("eval/step")
            run.define_metric("eval/*", step_metric="eval/step")
            run.log(row)
            run.summary.update({**row, "eval/checkpoint": results.get("checkpoint")})
        finally:
            run.finish()
    except Exception as e:  # the scores are on disk: say why W&B lacks them
        return describe(e)
    return None
