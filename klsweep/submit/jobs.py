"""The two kinds of job, train a run and evaluate a run: the submitit callables that run on the compute node
(pickled by submitit), and what a planned run asks of its jobs (resources, cluster settings, a chained eval).

Training jobs are ``TrainJob`` (submitit checkpointable: requeued on preemption or timeout, docs/DESIGN.md);
``train_run`` resumes from the run's last checkpoint. A training job holds the run's training lock
(``store.training``): one process trains a run at a time. Eval jobs are ``EvalJob``. Both keep their stdout/stderr
in the run's ``logs/`` (``klsweep.submit.joblogs``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klsweep import store
from klsweep.errors import describe
from klsweep.printable import visible_lines
from klsweep.submit import joblogs

PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def master_port(job_id: str, port_range_file: str = PORT_RANGE_FILE) -> int:
    """The rendezvous port of a job of several processes, the same in each: from the job's id, in 20000 up to
    the kernel's ephemeral ports (32768 by default), which any outgoing connection may hold (rank 0 failed to
    listen there, EADDRINUSE, and the other ranks waited on it). A numeric id (Slurm's job id, one per array
    task; a local job's process id) counts through the range: two jobs whose ids are closer than the range is
    wide (12,768 ports by default) never share a port, however many run on a node at once (two 4-GPU runs on
    one 8-GPU node); another id is hashed into it, as submitit does. ``MASTER_PORT`` set by the user wins
    (``TrainJob`` sets this only where it is unset). A job of one process holds a port of its own instead
    (``engines.own_rendezvous_port``)."""
    import random

    try:
        low = int(Path(port_range_file).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    top = low - 1 if low > 21000 else 60000  # an unusual range: submitit's
    if job_id.isdigit():
        return 20000 + int(job_id) % (top - 20000 + 1)
    return random.Random(job_id).randint(20000, top)


@dataclass
class TrainJob:
    """Train one run: ``klsweep.job.train_run(run_dir)`` (or ``fn``, for tests), data-parallel when the job has
    several tasks. Checkpointable: submitit calls ``checkpoint`` on preemption/timeout and requeues the job."""

    run_dir: str
    fn: Callable[[Path], Any] | None = None
    shared_log: bool = False  # its process runs other jobs too (a local worker): keep its part of the log

    def __call__(self) -> Any:
        import submitit

        _offline_environment(self.run_dir)
        env = submitit.JobEnvironment()
        if env.num_tasks > 1:
            # Slurm's id of this job (an array task's own); submitit's id elsewhere (read back by submitit)
            job_id = os.environ.get("SLURM_JOB_ID") or env.job_id
            os.environ.setdefault("MASTER_PORT", str(master_port(job_id)))
            submitit.helpers.TorchDistributedEnvironment().export(
                set_cuda_visible_devices=False, overwrite=True
            )
        _defer_preemption_to_step_end(env)
        if self.fn is None:
            from klsweep.job import train_run

            fn: Callable[[Path], Any] = train_run
        else:
            fn = self.fn
        # one process trains a run at a time, whatever died before: rank 0 holds the run's training lock
        lock = store.training(self.run_dir) if env.global_rank == 0 else contextlib.nullcontext()
        try:
            if env.global_rank > 0:
                _join_rank_0(self.run_dir)
            with joblogs.kept(self.run_dir, "train", shared=self.shared_log), lock:
                status = store.read_status(self.run_dir)
                if status["state"] in ("done", "diverged"):  # trained meanwhile (by a job now gone)
                    return status
                return fn(Path(self.run_dir))
        except store.AlreadyTraining as e:  # the run is the other trainer's: its status stays as it says
            print(
                visible_lines(f"klsweep: {e.problems[0].what}; this job does not train it"),
                file=sys.stderr,
                flush=True,
            )
            raise
        except Exception as e:
            # a status.json that cannot be read is left as it is (the error names it in the job's log)
            with contextlib.suppress(store.UnreadableFile):
                if (
                    env.global_rank == 0
                    and store.read_status(self.run_dir)["state"] not in store.FINAL_STATES
                ):
                    store.write_status(
                        self.run_dir, "failed", reason=describe(e), error=_tail(traceback.format_exc())
                    )
            raise

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        from submitit.helpers import DelayedSubmission

        if self.fn is None:
            from klsweep.preemption import save_on_preemption

            save_on_preemption()
        return DelayedSubmission(self)


@dataclass
class EvalJob:
    """Evaluate one trained run: ``klsweep.evaluate.eval_run(run_dir, eval_cfg, checkpoints="last")``."""

    run_dir: str
    eval_cfg: dict[str, Any]
    fn: Callable[..., Any] | None = None
    shared_log: bool = False  # as TrainJob's

    def __call__(self) -> Any:
        _offline_environment(self.run_dir)
        if self.fn is None:
            from klsweep.evaluate import eval_run

            fn: Callable[..., Any] = eval_run
        else:
            fn = self.fn
        with joblogs.kept(self.run_dir, "eval", shared=self.shared_log):
            return fn(Path(self.run_dir), self.eval_cfg, checkpoints="last")


def _join_rank_0(run_dir: str) -> None:
    """On the other ranks of a data-parallel job: ``store.AlreadyTraining`` when another job holds the run's
    training lock for longer than rank 0 waits for it (rank 0 then does not train either), instead of waiting
    for rank 0 in the distributed setup until its timeout. Returns at once when the lock is free (or there is
    no ``flock``), or held by this job's rank 0."""
    import os
    import time

    job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID")
    deadline = time.time() + store.TRAIN_LOCK_WAIT_S + 15
    while (holder := store.trainer_of(run_dir)) is not None and holder.get("job_id") != job_id:
        if time.time() > deadline:
            raise store.AlreadyTraining(run_dir, holder)
        time.sleep(0.5)


def _defer_preemption_to_step_end(env: Any) -> None:
    """In every task of a training job: submitit's preemption handler (``USR2`` by default) runs at the end of
    the training step in progress (``klsweep.preemption``; why: docs/DESIGN.md, Preemption)."""
    import signal
    import threading

    from klsweep.preemption import defer_to_step_end

    signum = getattr(signal, "SIG" + env.USR_SIG, None)
    if signum is None or threading.current_thread() is not threading.main_thread():
        return  # the debug executor runs jobs in the caller: no handler to defer
    handler = signal.getsignal(signum)
    if not callable(handler) or getattr(handler, "deferred_to_step_end", False):
        return  # no handler, or deferred already (a local worker trains several runs in one process)

    def deferred(sig: int, frame: Any) -> None:
        if not defer_to_step_end(lambda: handler(sig, frame)):
            handler(sig, frame)

    deferred.deferred_to_step_end = True  # type: ignore[attr-defined]
    signal.signal(signum, deferred)


def _offline_environment(run_dir: str) -> None:
    """On an offline cluster (the run's ``cluster.offline``), HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1 in this
    job's environment before anything loads (``klsweep.fetch.job_environment``)."""
    from klsweep.config import read_run_file
    from klsweep.fetch import job_environment

    with contextlib.suppress(store.UnreadableFile, OSError):  # the job itself reports an unreadable config
        os.environ.update(job_environment(read_run_file(run_dir)))


def _tail(text: str, n: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


def resources(run: Any) -> dict[str, Any]:
    """What one job of the planned run asks the scheduler for (``model.resources``)."""
    return dict(run.config.get("model", {}).get("resources", {}))


def cluster_settings(run: Any) -> dict[str, Any]:
    """The planned run's ``cluster`` section (partition, account, setup, requeues, local parallelism...)."""
    return dict(run.config.get("cluster", {}))


def wants_eval(run: Any) -> bool:
    """Whether the planned run names an eval suite (an eval job follows its training job)."""
    return run.config.get("eval", {}).get("suite", "none") not in ("none", "", None)


def has_eval_results(run_dir: Path, status: dict[str, Any] | None = None) -> bool:
    """Whether the run's eval is done: its final checkpoint (``store.final_checkpoint``) has results (under
    any eval settings). Results of other checkpoints alone (an eval cancelled part-way) are not."""
    final = store.final_checkpoint(run_dir, status)
    return final is not None and final in store.evaluated_checkpoints(run_dir)
