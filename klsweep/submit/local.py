"""The local and debug back ends.

Local: ``submit_local`` writes the queue and starts a detached supervisor (``python -m klsweep.submit
supervise QUEUE``, ``supervise``); it keeps up to ``cluster.max_local_jobs`` submitit worker jobs
(``LocalWorker``), each claiming queued jobs one after the other in one process (torch, TRL and lm-eval
imported once per worker), under the sweep's lock (``pool.json``, ``jobs.jsonl``). A dead worker's job is
recorded as failed and a new worker takes what is left; a worker dies with its job's controller and with the
supervisor (``_die_with_parents``). Debug: ``submit_debug`` runs every job in this process
with submitit's ``DebugExecutor`` (for pdb). How the pool works: docs/DESIGN.md (Submission).
"""

from __future__ import annotations

import contextlib
import copy
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klsweep import store
from klsweep.config import tasks_per_node
from klsweep.environment import usable_cores
from klsweep.printable import visible_lines
from klsweep.submit import joblogs
from klsweep.submit.jobs import EvalJob, TrainJob, cluster_settings, resources, wants_eval
from klsweep.submit.scheduler import (
    LOCK_FILE,
    SUPERVISOR_MODULE,
    job_row,
    pid_alive,
    process_start,
    submission_folder,
)

SUPERVISE = "supervise"
POOL_FILE = "pool.json"  # in the submission folder: the state of each queued job
_POLL_S = 0.3
# Workers in a row that may die before taking any job (while jobs wait) before the supervisor gives up on those
# jobs (recorded failed: `klsweep status` shows the worker log's last line) instead of starting workers for ever.
MAX_WORKER_DEATHS = 3


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


def _local_params(timeout_min: float, tasks: int, gpus: int, setup: list[str]) -> dict[str, Any]:
    p: dict[str, Any] = {
        "timeout_min": timeout_min,
        "tasks_per_node": tasks,
        "gpus_per_node": gpus,
        # USR2 (checkpoint and requeue) this long before the timeout: 10% of it, within [5 s, 120 s]
        "signal_delay_s": int(min(120, max(5, 6 * timeout_min))),
    }
    if setup:
        p["setup"] = list(setup)
    return p


def submit_local(sweep_dir: Path, train: list, evals: list, train_fn: Any, eval_fn: Any) -> tuple[list, int]:
    """Queue the jobs for a new supervisor process; returns rows recording them as waiting in its queue."""
    import cloudpickle

    folder = submission_folder(sweep_dir)
    items: list[dict[str, Any]] = []

    def add(run: Any, kind: str, after: int | None = None) -> None:
        fn = (  # a worker runs several jobs: each run keeps its part of the worker's log
            TrainJob(str(run.run_dir), train_fn, shared_log=True)
            if kind == "train"
            else EvalJob(str(run.run_dir), dict(run.config["eval"]), eval_fn, shared_log=True)
        )
        res = resources(run)
        items.append(
            {
                "run_id": run.id,
                "kind": kind,
                "run_dir": str(run.run_dir),
                "after": after,
                "fn": fn,
                "timeout_min": float(res.get("eval_timeout_min" if kind == "eval" else "timeout_min", 60)),
                "tasks": 1 if kind == "eval" else tasks_per_node(res) * int(res.get("nodes", 1)),
                "gpus": int(res.get("gpus_per_node", 0)),
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
        "max_jobs": int(cl.get("max_local_jobs") or usable_cores()),
        "max_requeues": int(cl.get("max_requeues", 3)),
        "jobs_per_worker": int(cl.get("local_jobs_per_worker") or 0),
        "setup": list(cl.get("setup") or []),
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
    # the supervisor is known by its pid and start (its command line is empty until its program is loaded)
    sup = {"supervisor": proc.pid, "supervisor_start": process_start(proc.pid)}
    rows = [job_row(it["run_id"], it["kind"], "local", None, folder, **sup) for it in items]
    return rows, 0


# --- the pool ------------------------------------------------------------------------------------------------


@dataclass
class _Pool:
    """The queue of one local submission and its ``pool.json``; every change under the sweep's lock."""

    queue: dict[str, Any]
    lock: Any = field(init=False)

    def __post_init__(self) -> None:
        from filelock import FileLock

        self.lock = FileLock(str(Path(self.queue["sweep_dir"]) / LOCK_FILE))

    @classmethod
    def load(cls, queue_path: str | Path) -> _Pool:
        import pickle

        return cls(pickle.loads(Path(queue_path).read_bytes()))

    @property
    def items(self) -> list[dict[str, Any]]:
        return self.queue["items"]

    @property
    def path(self) -> Path:
        return Path(self.queue["folder"]) / POOL_FILE

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return [{"state": "waiting", "worker": None} for _ in self.items]
        return store.read_json(self.path)

    def record(self, i: int, job_id: str | None, **extra: Any) -> None:
        """A ``jobs.jsonl`` row for queued job ``i`` (call under the lock)."""
        it = self.items[i]
        row = job_row(it["run_id"], it["kind"], "local", job_id, Path(self.queue["folder"]), **extra)
        store.append_jsonl(Path(self.queue["sweep_dir"]) / store.JOBS_FILE, row)

    def ready(self, states: list[dict[str, Any]]) -> list[int]:
        """The waiting jobs that can start now, in queue order; marks ``skipped`` (and records) those that never
        will: the eval of a run whose training did not succeed, the training of a cancelled run (call under
        the lock, then ``write``)."""
        out = []
        for i, it in enumerate(self.items):
            if states[i]["state"] != "waiting":
                continue
            dep = it["after"]
            if dep is not None and states[dep]["state"] in ("waiting", "claimed"):
                continue
            if (dep is not None and states[dep]["state"] != "ok") or (
                it["kind"] == "train" and _state(it["run_dir"]) == "cancelled"
            ):
                states[i]["state"] = "skipped"
                self.record(i, None, state="SKIPPED")
                continue
            out.append(i)
        return out

    def claim(self, states: list[dict[str, Any]], i: int, job_id: str, supervisor: int) -> None:
        """Queued job ``i`` is the worker's (``log``: where its part of the worker's log files begins)."""
        states[i] = {"state": "claimed", "worker": job_id, "log": joblogs.log_offsets()}
        self.record(
            i,
            job_id,
            worker=True,
            supervisor=supervisor,
            supervisor_start=process_start(supervisor),
            job_start=process_start(int(job_id)),
        )

    def finish(self, states: list[dict[str, Any]], i: int, ok: bool, state: str | None = None) -> None:
        job_id = states[i]["worker"]
        states[i] = {"state": "ok" if ok else "failed", "worker": job_id}
        self.record(i, job_id, worker=True, state=state or ("COMPLETED" if ok else "FAILED"))

    def write(self, states: list[dict[str, Any]]) -> None:
        store.write_json(self.path, states)

    def solo(self, i: int) -> bool:
        """Whether queued job ``i`` needs a worker of its own (a training job of several processes)."""
        return self.items[i]["tasks"] > 1


def supervise(queue_path: str | Path) -> None:
    """The local supervisor: keep up to ``max_jobs`` workers busy until every queued job ended."""
    import submitit

    pool = _Pool.load(queue_path)
    queue, items = pool.queue, pool.items
    folder = Path(queue["folder"])
    ex = submitit.LocalExecutor(folder=folder, max_num_timeout=queue["max_requeues"])
    shared = [i for i in range(len(items)) if not pool.solo(i)]
    worker_params = _local_params(
        sum(items[i]["timeout_min"] for i in shared),
        1,
        max((items[i]["gpus"] for i in shared), default=0),
        queue["setup"],
    )
    workers: dict[str, Any] = {}  # job id -> submitit job
    states: list[dict[str, Any]] = []
    deaths = 0  # workers in a row that ended without ever holding a job while jobs were waiting
    while True:
        if not Path(queue_path).exists():  # its folder was deleted or unmounted: nothing left to supervise
            return
        ended = [job_id for job_id, job in workers.items() if job.done()]
        if not ended and len(workers) >= queue["max_jobs"]:
            time.sleep(_POLL_S)  # every worker busy: they claim the next jobs themselves
            continue
        with pool.lock:
            states = pool.read()
            before = copy.deepcopy(states)
            for job_id in ended:
                del workers[job_id]
                held = any(s.get("worker") == job_id for s in states)
                waiting = any(s["state"] == "waiting" for s in states)
                deaths = deaths + 1 if waiting and not held else 0
                _settle_dead_worker(pool, states, job_id)
            if deaths >= MAX_WORKER_DEATHS:  # a worker cannot even start (a full disk, a broken setup)
                _fail_waiting(pool, states, ended[-1])
                pool.write(states)
                return
            ready = pool.ready(states)
            solo = [i for i in ready if pool.solo(i)]  # a training job of several processes: its own worker
            for i in solo:
                if len(workers) >= queue["max_jobs"]:
                    break
                it = items[i]
                ex.update_parameters(
                    **_local_params(it["timeout_min"], it["tasks"], it["gpus"], queue["setup"])
                )
                job = ex.submit(LocalWorker(str(queue_path), os.getpid(), only=i))
                workers[job.job_id] = job
                pool.claim(states, i, job.job_id, os.getpid())
            ready = [i for i in ready if not pool.solo(i) and states[i]["state"] == "waiting"]
            busy = {s["worker"] for s in states if s["state"] == "claimed"}
            idle = len(set(workers) - busy)
            starts = max(0, min(queue["max_jobs"] - len(workers), len(ready) - idle))
            if starts:
                ex.update_parameters(**worker_params)
            for _ in range(starts):
                job = ex.submit(LocalWorker(str(queue_path), os.getpid()))
                workers[job.job_id] = job
            if states != before:
                pool.write(states)
        if not workers and all(s["state"] not in ("waiting", "claimed") for s in states):
            return
        time.sleep(_POLL_S)


def _fail_waiting(pool: _Pool, states: list[dict[str, Any]], job_id: str) -> None:
    """Record every waiting job as failed, with the last worker's id (its log says why workers die), under the
    lock: rather than start workers for ever that die before they take a job."""
    for i, s in enumerate(states):
        if s["state"] == "waiting":
            states[i] = {"state": "waiting", "worker": job_id}
            pool.finish(states, i, False, "FAILED")


def _settle_dead_worker(pool: _Pool, states: list[dict[str, Any]], job_id: str) -> None:
    """The jobs a worker that ended held when it ended (it died: killed, out of memory, cancelled), under the
    lock: each run gets its part of the worker's log, and the job is recorded as it ended: a training that had
    finished as done, a cancelled run's as cancelled, any other as failed (the run's status stays as the job
    left it, as for any process killed without a word: ``klsweep status`` says so, a rerun resumes it)."""
    for i, s in enumerate(states):
        if s["state"] != "claimed" or s["worker"] != job_id:
            continue
        it = pool.items[i]
        joblogs.copy_part(it["run_dir"], it["kind"], job_id, s.get("log") or {})
        run_state = _state(it["run_dir"])
        if it["kind"] == "train" and run_state in ("done", "diverged"):
            pool.finish(states, i, True)
        else:
            pool.finish(states, i, False, "CANCELLED" if run_state == "cancelled" else "FAILED")


@dataclass
class LocalWorker:
    """A local worker job: claims queued jobs and runs them in this process (``only``: that queued job alone).
    Checkpointable: on its time limit it saves the run it trains, puts it back in the queue and requeues."""

    queue_path: str
    supervisor: int  # the supervisor's pid (in the worker's jobs.jsonl rows)
    only: int | None = None
    _current: int | None = field(default=None, init=False, repr=False)  # the queued job running now

    def __call__(self) -> None:
        import submitit

        _die_with_parents(self.supervisor)
        env = submitit.JobEnvironment()
        pool = _Pool.load(self.queue_path)
        limit = pool.queue["jobs_per_worker"]
        ran = 0
        while self.only is None and (limit == 0 or ran < limit):
            with pool.lock:
                states = pool.read()
                ready = [i for i in pool.ready(states) if not pool.solo(i)]
                if ready:
                    pool.claim(states, ready[0], env.job_id, self.supervisor)
                pool.write(states)
            if not ready:
                return
            ok = self._run(pool, ready[0], env.job_id)
            with pool.lock:
                states = pool.read()
                pool.finish(states, ready[0], ok)
                pool.write(states)
            ran += 1
        if self.only is not None:
            ok = self._run(pool, self.only, env.job_id)
            if env.global_rank == 0:
                with pool.lock:
                    states = pool.read()
                    pool.finish(states, self.only, ok)
                    pool.write(states)

    def _run(self, pool: _Pool, i: int, job_id: str) -> bool:
        """Run queued job ``i`` here; whether it succeeded (a failure is in its run's status and this log)."""
        it = pool.items[i]
        self._current = i
        print(visible_lines(f"klsweep worker: {it['kind']} {it['run_id']}"), file=sys.stderr, flush=True)
        try:
            it["fn"]()
            # a run that failed inside train_run returns its status: its eval does not follow
            return it["kind"] != "train" or _state(it["run_dir"]) in ("done", "diverged")
        except Exception:
            at = (
                joblogs.log_offsets()
            )  # the traceback, after the job's part of the log was copied: the run's too
            traceback.print_exc()
            sys.stderr.flush()
            joblogs.copy_part(it["run_dir"], it["kind"], job_id, at)
            return False
        finally:
            self._current = None
            _forget_process_state()

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        from submitit.helpers import DelayedSubmission

        pool = _Pool.load(self.queue_path)
        i, self._current = self._current, None
        if i is not None:
            it = pool.items[i]
            if it["kind"] == "train":
                it["fn"].checkpoint()  # saves the live trainer
            if self.only is None:  # back in the queue: this worker (requeued) or another resumes it
                with pool.lock:
                    states = pool.read()
                    states[i] = {"state": "waiting", "worker": None}
                    pool.write(states)
        return DelayedSubmission(self)


def _die_with_parents(supervisor: int) -> None:
    """This worker process dies (SIGKILL) as soon as its submitit controller (its parent: the job id that
    ``klsweep status`` shows) or the supervisor dies, however they die: a worker never outlives the pool whose
    claims it acts on, and a rerun resumes its run (the training lock covers the moment in between). The
    parent by ``PR_SET_PDEATHSIG`` (Linux), the supervisor by a thread waiting on its pidfd (else polling)."""
    import ctypes
    import threading

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if not pid_alive(os.getppid(), "submitit") or not pid_alive(supervisor, SUPERVISOR_MODULE):
        os.kill(os.getpid(), signal.SIGKILL)  # gone already

    def watch() -> None:
        try:
            select.select([os.pidfd_open(supervisor)], [], [])  # readable when the supervisor has exited
        except (AttributeError, OSError):
            while pid_alive(supervisor, SUPERVISOR_MODULE):
                time.sleep(_POLL_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="klsweep-die-with-supervisor", daemon=True).start()


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _forget_process_state() -> None:
    """What one job leaves in the process that the next would inherit: accelerate's process-wide state (the
    next trainer sets up its own, as in a fresh process)."""
    import gc

    if "accelerate" in sys.modules:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
    gc.collect()  # the last trainer's model and optimizer


def _state(run_dir: str) -> str | None:
    """The run's state, None when its status.json cannot be read (the job will say so)."""
    try:
        return store.read_status(run_dir).get("state")
    except store.UnreadableFile:
        return None
