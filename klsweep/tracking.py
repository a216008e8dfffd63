"""W&B, all of it: one opener for training, eval and report runs (``open_run``), one fallback rule, names.

- ``open_run``: online within ``wandb.init_timeout_s``, else offline with a warning, else nothing with a
  warning: W&B never fails a run, an eval or a report (metrics.jsonl and results files stay the truth);
- a run folder's W&B run: id ``<sweep>-<run id>``, a readable name from the sweep's axes, files under
  ``<run>/wandb/``; training mirrors its metrics (``open_training_run``, ``guarded_callback``), eval logs
  each checkpoint's scores into the same run (``log_eval``), the report logs beside the runs (report/publish).

When what goes where, the modes and ``wandb sync``: docs/DESIGN.md (W&B).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import store
from klsweep.errors import describe

if TYPE_CHECKING:
    from klsweep.config import RunConfig

WANDB_DIR = "wandb"  # <run>/wandb/: W&B's own folder (wandb.init(dir=<run>) creates it)
_KL_KEYS = ("kl.estimator", "kl.placement", "kl.level", "kl.importance")


def open_run(config: RunConfig, folder: Path, mode: str, warn: Callable[[str], None], /, **run: Any) -> Any:
    """A W&B run in ``config``'s project, entity and group (the sweep's name), its files under
    ``folder/wandb/``; ``run``: wandb.init's other arguments (id, name, job_type, tags ...). The one rule: mode
    ``online`` gives up after ``wandb.init_timeout_s`` (no network, a refused key) and goes ``offline``, with a
    warning; when even that fails, None, with a warning. ``disabled``: None. Never raises."""
    if mode == "disabled":
        return None
    try:
        import wandb
    except ImportError as e:
        warn(f"W&B: not logged ({describe(e)})")
        return None
    kwargs = dict(
        project=config.wandb.project, entity=config.wandb.entity, group=config.name, dir=str(folder)
    )
    kwargs |= run
    if mode == "online":
        try:
            settings = wandb.Settings(init_timeout=float(config.wandb.init_timeout_s))
            return wandb.init(**kwargs, mode="online", settings=settings)
        except Exception as e:
            warn(
                f"W&B online failed ({describe(e)}): offline to {Path(folder) / WANDB_DIR} instead (`wandb sync`)"
            )
            with contextlib.suppress(Exception):  # the failed run still holds its id in wandb's service
                wandb.teardown()
    try:
        # no console capture offline: W&B's copy of the process's output (TRL's log line and progress bar of every
        # step) cost its service ~1 s CPU a 300-step tiny run, a tenth of the run; the job's log is the run's
        # logs/ (docs/FAULTS.md), the metrics are metrics.jsonl
        return wandb.init(**kwargs, mode="offline", settings=wandb.Settings(console="off"))
    except Exception as e:
        warn(f"W&B offline failed too ({describe(e)}): not logged")
        return None


def resolve_mode(mode: str) -> str:
    """``wandb.mode`` ``auto``: online when W&B is configured on this machine (WANDB_API_KEY, or a netrc entry),
    else offline; any other mode as it is."""
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    import netrc

    try:
        return "online" if netrc.netrc().authenticators("api.wandb.ai") else "offline"
    except (OSError, netrc.NetrcParseError):
        return "offline"


def tags(config: RunConfig) -> list[str]:
    """The configuration axes of a run, as W&B tags."""
    return [
        f"estimator={config.kl.estimator}",
        f"placement={config.kl.placement}",
        f"level={config.kl.level}",
        f"beta={config.kl.beta:g}",
        f"lag={config.offpolicy.lag}",
        f"seed={config.seed}",
        f"model={config.model.name}",
    ]


def open_training_run(config: RunConfig, run_dir: Path, warn: Callable[[str], None]) -> Any:
    """The W&B run a training run mirrors its metrics to (``config.wandb``; resumed by id), or None."""
    import dataclasses

    resolved = dataclasses.asdict(config)
    return open_run(
        config,
        run_dir,
        resolve_mode(config.wandb.mode),
        lambda text: warn(f"{text}; metrics.jsonl is complete"),
        name=wandb_name(resolved, run_dir),
        id=wandb_id(config.name, run_dir),
        resume="allow",
        tags=tags(config),
        config=resolved,
    )


_CALLBACK_EVENTS = (
    "setup",
    "on_train_begin",
    "on_train_end",
    "on_log",
    "on_save",
    "on_evaluate",
    "on_predict",
)


def guarded_callback(warn: Callable[[str], None]) -> Any:
    """transformers' W&B callback, except that its first failure (W&B gone mid-run, e.g. its service process
    killed by a preemption's SIGTERM) ends the mirroring with a warning instead of the run."""
    from transformers.integrations import WandbCallback

    class GuardedWandbCallback(WandbCallback):
        broken = False

    def guard(name: str) -> Callable[..., Any]:
        method = getattr(WandbCallback, name)

        def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.broken:
                return None
            try:
                return method(self, *args, **kwargs)
            except Exception as e:
                self.broken = True
                warn(f"W&B mirroring stopped ({describe(e)}); metrics.jsonl is complete")
                return None

        return guarded

    for name in _CALLBACK_EVENTS:
        if hasattr(WandbCallback, name):
            setattr(GuardedWandbCallback, name, guard(name))
    return GuardedWandbCallback()


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
    params = (store.read_sweep_file(run_dir.parent).get("runs") or {}).get(run_dir.name)
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


def log_eval(run_dir: Path, config: RunConfig, results: dict[str, Any]) -> str | None:
    """Log one evaluated checkpoint's scores (``evaluate``'s results.json) to the run's W&B run, resumed by id in
    the mode its training used; nothing when it trained without W&B. Returns None, or why it could not log
    (W&B mirrors the results files: a failure here does not fail the evaluation)."""
    import dataclasses

    mode = training_mode(run_dir)
    if mode is None:
        return None
    problems: list[str] = []
    metrics = results.get("metrics", {})
    row: dict[str, float] = {"eval/step": float(results.get("step", 0))}
    for kind, avg in (("in_domain", "eval/in_domain_avg"), ("ood", "eval/ood_avg")):
        values = {t: float(v) for t, v in (metrics.get(kind) or {}).items() if v is not None}
        row |= {f"eval/{t}": v for t, v in values.items()}
        if values:
            row[avg] = math.fsum(values.values()) / len(values)
    name = wandb_name(dataclasses.asdict(config), run_dir)
    run = open_run(
        config, run_dir, mode, problems.append, id=wandb_id(config.name, run_dir), name=name, resume="allow"
    )
    if run is None:
        return "; ".join(problems)
    try:
        run.define_metric("eval/step")
        run.define_metric("eval/*", step_metric="eval/step")
        run.log(row)
        run.summary.update({**row, "eval/checkpoint": results.get("checkpoint")})
        run.finish()
    except Exception as e:  # the scores are on disk: say why W&B lacks them
        with contextlib.suppress(Exception):
            run.finish(exit_code=1)
        problems.append(describe(e))
    return "; ".join(problems) or None
