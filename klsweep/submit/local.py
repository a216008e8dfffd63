"""The local and debug back ends.

Local: ``submit_local`` writes the queue (the job callables, their dependencies and submitit parameters) and
starts a detached supervisor process (``python -m klsweep.submit supervise QUEUE``, ``supervise`` below) that
starts submitit ``LocalExecutor`` jobs in waves, at most ``cluster.max_local_jobs`` (default: the core count)
at once, and each run's eval after its training job succeeded; the CLI returns at once. The supervisor
records every job it starts (or skips) in ``jobs.jsonl``.

Debug: ``submit_debug`` runs every job in this process with submitit's ``DebugExecutor`` (for pdb).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from klsweep import store
from klsweep.config import tasks_per_node
from klsweep.submit.jobs import EvalJob, TrainJob, cluster_settings, resources, wants_eval
from klsweep.submit.scheduler import LOCK_FILE, SUPERVISOR_MODULE, job_row, submission_folder

SUPERVISE = "supervise"


def submit_debug(sweep_dir: Path, train: list, evals: list, train_fn: Any, eval_fn: Any) -> tuple[list, int]:
    """Run the jobs one after the other in this process; a run's eval is skipped when its training failed."""
    import submitit

    folder = submission_folder(sweep_dir)
    rows: list[dict[str, Any]] = []
    todo = [(r, ["train", "eval"] if wants_eval(r) else ["train"]) for r in train] + [
        (r, ["eval"]) for r in evals
    ]
    for run, kinds in todo:
        for kind in kinds:
            ex = submitit.DebugExecutor(folder=folder)
            fn = (
                TrainJob(str(run.run_dir), train_fn)
                if kind == "train"
                else EvalJob(str(run.run_dir), dict(run.config.get("eval", {})), eval_fn)
            )
            job = ex.submit(fn)
            state = "COMPLETED"
            try:
                job.result()
            except Exception:
                state = "FAILED"
            rows.append(job_row(run.id, kind, "debug", job.job_id, folder, state=state))
            if state == "FAILED":
                break
    return rows, 0


def _local_params(res: dict[str, Any], cl: dict[str, Any], eval_job: bool) -> dict[str, Any]:
    timeout_min = float(res.get("eval_timeout_min" if eval_job else "timeout_min", 60))
    p: dict[str, Any] = {
        "timeout_min": timeout_min,
        "tasks_per_node": 1 if eval_job else tasks_per_node(res) * int(res.get("nodes", 1)),
        "gpus_per_node": int(res.get("gpus_per_node", 0)),
        # USR2 (checkpoint and requeue) this long before the timeout: 10% of it, within [5 s, 120 s]
        "signal_delay_s": int(min(120, max(5, 6 * timeout_min))),
    }
    if cl.get("setup"):
        p["setup"] = list(cl["setup"])
    return p


def submit_local(sweep_dir: Path, train: list, evals: list, train_fn: Any, eval_fn: Any) -> tuple[list, int]:
    """Queue the jobs for a new supervisor process; returns rows recording them as waiting in its queue."""
    import cloudpickle

    folder = submission_folder(sweep_dir)
    items: list[dict[str, Any]] = []

    def add(run: Any, kind: str, after: int | None = None) -> None:
        fn = (
            TrainJob(str(run.run_dir), train_fn)
            if kind == "train"
            else EvalJob(str(run.run_dir), dict(run.config["eval"]), eval_fn)
        )
        params = _local_params(resources(run), cluster_settings(run), kind == "eval")
        items.append(
            {
                "run_id": run.id,
                "kind": kind,
                "run_dir": str(run.run_dir),
                "after": after,
                "fn": fn,
                "params": params,
            }
        )

    for run in train:
        add(run, "train")
        if wants_eval(run):
            add(run, "eval", after=len(items) - 1)
    for run in evals:
        add(run, "eval")
    first = (train or evals)[0]
    cl = cluster_settings(first)
    queue = {
        "sweep_dir": str(sweep_dir),
        "folder": str(folder),
        "max_jobs": int(cl.get("max_local_jobs") or os.cpu_count() or 1),
        "max_requeues": int(cl.get("max_requeues", 3)),
        "items": items,
    }
    queue_path = folder / "queue.pkl"
    queue_path.write_bytes(cloudpickle.dumps(queue))
    with open(folder / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", SUPERVISOR_MODULE, SUPERVISE, str(queue_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
    rows = [job_row(it["run_id"], it["kind"], "local", None, folder, supervisor=proc.pid) for it in items]
    return rows, 0


def supervise(queue_path: str | Path) -> None:
    """The local supervisor: start queued jobs, at most ``max_jobs`` at once; evals after a successful train."""
    import pickle

    import submitit
    from filelock import FileLock

    queue = pickle.loads(Path(queue_path).read_bytes())
    sweep_dir, folder = Path(queue["sweep_dir"]), Path(queue["folder"])
    items: list[dict[str, Any]] = queue["items"]
    ex = submitit.LocalExecutor(folder=folder, max_num_timeout=queue["max_requeues"])
    state = ["waiting"] * len(items)
    jobs: dict[int, Any] = {}

    def record(i: int, job_id: str | None, **extra: Any) -> None:
        with FileLock(str(sweep_dir / LOCK_FILE)):
            it = items[i]
            store.append_jsonl(
                sweep_dir / store.JOBS_FILE,
                job_row(it["run_id"], it["kind"], "local", job_id, folder, **extra),
            )

    while "waiting" in state or "running" in state:
        for i, job in list(jobs.items()):
            if job.done():
                ok = job.paths.result_pickle.exists() and job.exception() is None
                state[i] = "ok" if ok else "failed"
                del jobs[i]
        for i, it in enumerate(items):
            if state[i] != "waiting" or len(jobs) >= queue["max_jobs"]:
                continue
            dep = it["after"]
            if dep is not None and state[dep] in ("waiting", "running"):
                continue
            if (dep is not None and state[dep] != "ok") or (
                it["kind"] == "train" and _state(it["run_dir"]) == "cancelled"
            ):
                state[i] = "skipped"
                record(i, None, state="SKIPPED")
                continue
            ex.update_parameters(**it["params"])
            jobs[i] = ex.submit(it["fn"])
            state[i] = "running"
            record(i, jobs[i].job_id)
        time.sleep(0.2)


def _state(run_dir: str) -> str | None:
    """The run's state, None when its status.json cannot be read (the job will say so)."""
    try:
        return store.read_status(run_dir).get("state")
    except store.UnreadableFile:
        return None
