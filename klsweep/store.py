"""The results store: where every run's files live and how they are read and written.

Layout (one sweep)::

    results/<sweep>/
        sweep.yaml                 the grid as planned (written by `klsweep run`)
        jobs.jsonl                 one line per submission: run id, kind (train|eval), cluster, job id, folder
        submitit/<stamp>/          submitit's own job files and logs, one folder per submission
        baseline/<model-id>/       the initial model, evaluated once per sweep (step 0)
            config.yaml
            eval/<eval-hash>/step-0/results.json, samples_<task>.jsonl
        <run-id>/
            config.yaml            the resolved RunConfig (what `klsweep train` reads)
            status.json            {"state", "step", "total_steps", "reason", "started_at", "updated_at", ...}
            metrics.jsonl          one JSON object per optimiser step (the report's source of truth)
            checkpoints/checkpoint-<step>/   Hugging Face format (lm-eval loads it) + trainer state; the newest
                                     train.keep_checkpoints; the last holds FINAL_MARKER (done|diverged)
            eval/<eval-hash>/<checkpoint-name>/results.json, samples_<task>.jsonl, results_<date>.json
                                   (lm-eval's own results file)
            wandb/offline-run-*/   W&B's files (offline; `wandb sync` uploads them), or run-*/ (online)
            logs/                  stdout/stderr of the jobs that ran it (links or copies)
        report/                    tables and plots (`klsweep report`)

Every write goes through a temporary file and an atomic rename, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

STATES = ("pending", "running", "done", "failed", "diverged", "cancelled")
FINAL_STATES = ("done", "failed", "diverged", "cancelled")

CONFIG_FILE = "config.yaml"
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_DIR = "checkpoints"
EVAL_DIR = "eval"
JOBS_FILE = "jobs.jsonl"
SWEEP_FILE = "sweep.yaml"
BASELINE_DIR = "baseline"
REPORT_DIR = "report"
FINAL_MARKER = "klsweep_final.json"  # in the checkpoint where a run ended: {"state", "step", "reason"}


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as f:
        return json.load(f)


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_status(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The run's status; a folder with no status file is 'pending'."""
    p = Path(run_dir) / STATUS_FILE
    if not p.exists():
        return {"state": "pending", "step": 0}
    return read_json(p)


def write_status(run_dir: str | os.PathLike, state: str, **fields: Any) -> dict[str, Any]:
    """Update the status file, keeping the fields not given; stamps updated_at."""
    if state not in STATES:
        raise ValueError(f"state {state!r} is not one of {', '.join(STATES)}")
    status = read_status(run_dir) if (Path(run_dir) / STATUS_FILE).exists() else {}
    status.update(fields)
    status["state"] = state
    status["updated_at"] = time.time()
    write_json(Path(run_dir) / STATUS_FILE, status)
    return status


def append_jsonl(path: str | os.PathLike, row: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row, default=_json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete lines of a JSONL file (a torn last line from a killed writer is ignored)."""
    p = Path(path)
    if not p.exists():
        return []
    rows = []
    with open(p) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    return read_jsonl(Path(run_dir) / METRICS_FILE)


def checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run, oldest first (a checkpoint counts once its config.json exists)."""
    d = Path(run_dir) / CHECKPOINTS_DIR
    if not d.exists():
        return []
    found = [p for p in d.glob("checkpoint-*") if p.is_dir() and (p / "config.json").exists()]
    return sorted(found, key=checkpoint_step)


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    """The optimiser step of a ``checkpoint-<step>`` folder."""
    return int(Path(checkpoint).name.rsplit("-", 1)[1])


def run_dirs(sweep_dir: str | os.PathLike) -> list[Path]:
    """The run folders of a sweep: every child holding a config.yaml, except baseline/ and report/."""
    d = Path(sweep_dir)
    if not d.exists():
        return []
    return sorted(
        p
        for p in d.iterdir()
        if p.is_dir() and p.name not in (BASELINE_DIR, REPORT_DIR) and (p / CONFIG_FILE).exists()
    )


def resolve_sweep(sweep: str | os.PathLike, results_root: str | os.PathLike = "results") -> Path:
    """A sweep folder, or the name of one under ``results_root``; UserError if neither exists."""
    from klsweep.errors import Problem, UserError

    p, q = Path(sweep), Path(results_root) / str(sweep)
    for candidate in (p, q):
        if candidate.is_dir():
            return candidate
    root = Path(results_root)
    known = sorted(d.name for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
    raise UserError(
        Problem(
            str(sweep),
            f"no such sweep folder (neither {p} nor {q} exists)",
            ", ".join(known) if known else "a sweep folder made by `klsweep run`",
        ),
        title="no such sweep",
    )


def cache_dir() -> Path:
    """klsweep's cache of derived, rebuildable files: ``$KLSWEEP_CACHE``, default ``~/.cache/klsweep``."""
    return Path(os.environ.get("KLSWEEP_CACHE", "~/.cache/klsweep")).expanduser()
