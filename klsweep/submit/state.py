"""The state of a sweep's runs: each run's ``status.json`` combined with its jobs' scheduler states into a
``RunStatus`` (``status``, ``wait_until_final``), and cancelling runs (``cancel``).

The scheduler is asked once per call for the whole sweep (``scheduler.job_states``). Beside klsweep's state,
a run keeps its training job's state in the scheduler's words (``job_state``: ``TIMEOUT``, ``OUT_OF_MEMORY``,
``PREEMPTED``, ``NODE_FAIL`` ... which klsweep's ``failed`` does not tell apart) and, while the job waits, Slurm's
reason (``job_reason``: ``Resources``, ``Priority``, ``JobHeldUser`` ...); ``RunStatus.scheduler`` is what of
them adds to klsweep's state. Besides the states of
``klsweep.store.STATES`` a run can be ``unreadable`` (its status.json or config.yaml cannot be read: the
file and what to do are in ``reason``; the other runs are shown as usual). A run whose training lock a process
holds (``store.trainer_of``) is ``running``, whatever the job records say. A run whose job ended without the
run recording why (killed, out of memory: no traceback) is ``failed`` with a ``reason`` that says so, instead
of an unrelated log tail.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klsweep import store
from klsweep.collapse import REASON
from klsweep.config import read_run_file
from klsweep.errors import Problem, UserError
from klsweep.submit import joblogs
from klsweep.submit.jobs import has_eval_results
from klsweep.submit.scheduler import (
    DOWN,
    LIVE_SLURM,
    LOCK_FILE,
    RUNNING_SLURM,
    JobState,
    cancel_rows,
    controller_problem,
    flock_holders,
    job_states,
    key,
    latest_rows,
    live_jobs,
    stop_processes,
)

INCOMPLETE = "incomplete"  # done by its status, but its final checkpoint is gone or not whole (never scored)
FINAL = (*store.FINAL_STATES, "unreadable", INCOMPLETE)  # states that do not change by themselves


@dataclass
class RunStatus:
    run_id: str
    params: dict[str, Any]  # the sweep's varying axes -> this run's value
    state: str  # pending | running | done | failed | diverged | cancelled | unreadable | incomplete (done by
    # its status, but its final checkpoint unscored and gone or not whole: ``store.stale_end``)
    step: int
    total_steps: int | None
    reward: float | None  # reward_mean of the last metrics row
    elapsed_s: float
    gpu_hours: float
    job_id: str | None
    cluster: str | None
    eval_state: str | None  # None (no eval) | pending | running | done | failed | cancelled | skipped |
    # partial (checkpoints scored, not the run's final one: an eval cancelled part-way)
    log_tail: list[str]  # failed runs (or evals): the last lines of the job's stderr (or the traceback kept)
    reason: str | None = None  # failed, diverged, unreadable, incomplete: why, in one line (failed: the
    # exception's type and message; incomplete: what is missing and what `klsweep run` does)
    log: str | None = None  # failed runs (or evals): the job's stderr, in the run's logs/ (else submitit's)
    eval_error: str | None = None  # a failed (or partial) eval: why, in one line
    job_state: str | None = None  # the training job's state in the scheduler's words (Slurm's: TIMEOUT ...)
    job_reason: str | None = None  # why the training job waits (Slurm's pending reason), while it does
    startup_s: float = 0.0  # its jobs' start-up before their training loop (``elapsed_s`` is the loop's)

    @property
    def scheduler(self) -> str:
        """What the scheduler says of the training job beyond ``state``: why a waiting job waits
        (``PENDING (Resources)``), or a state that klsweep's words do not tell (``TIMEOUT``,
        ``OUT_OF_MEMORY``, ``PREEMPTED``, ``NODE_FAIL``, ``REQUEUED`` ...); "" when it says nothing more."""
        if self.job_reason:
            return f"{self.job_state} ({self.job_reason})"
        return "" if self.job_state in _SAID_BY_STATE else self.job_state or ""

    @property
    def collapsed(self) -> bool:
        """Diverged because its reward collapsed (``klsweep.collapse``): the report calls it collapsed too."""
        return self.state == "diverged" and (self.reason or "").startswith(REASON)

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


# scheduler states whose meaning klsweep's state already carries (or that say nothing)
_SAID_BY_STATE = {None, *RUNNING_SLURM, "PENDING", "COMPLETED", "FAILED", "CANCELLED", "UNKNOWN", "GONE"}


def _combine(status_state: str, sched: str | None) -> str:
    if sched in RUNNING_SLURM:
        return "running"
    if sched in LIVE_SLURM:
        return "pending"
    if status_state in ("done", "diverged", "cancelled"):  # cancelled: only `cancel` writes it, once stopped
        return status_state
    if sched is None or sched in ("UNKNOWN", "GONE", "SKIPPED"):  # skipped: the run's state says why
        return status_state
    if sched == "COMPLETED":
        return status_state if status_state in store.FINAL_STATES else "done"
    if sched.startswith("CANCELLED"):
        return "cancelled"
    if sched == "LOST":
        return status_state if status_state in store.FINAL_STATES else "failed"
    return "failed"  # FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, BOOT_FAIL, DEADLINE


def _log_tail(path: Path | None, n: int = 15) -> list[str]:
    if path is None:
        return []
    try:
        return path.read_text(errors="replace").rstrip().splitlines()[-n:]
    except OSError:
        return []


def status(sweep_dir: str | Path) -> list[RunStatus]:
    """The state of every run of a sweep: status.json combined with one batched scheduler query."""
    sweep_dir = Path(sweep_dir)
    sweep = store.read_sweep_file(sweep_dir)
    axes: list[str] = list(sweep.get("axes") or [])
    planned: dict[str, dict] = sweep.get("runs") or {}
    rows = latest_rows(sweep_dir)
    states = job_states(list(rows.values()))
    out: list[RunStatus] = []
    for run_dir in store.run_dirs(sweep_dir):
        rid = run_dir.name
        train_row, eval_row = rows.get((rid, "train")), rows.get((rid, "eval"))
        try:
            out.append(_run_status(run_dir, train_row, eval_row, states, axes, planned.get(rid)))
        except store.UnreadableFile as e:
            params = planned.get(rid) or {}
            out.append(
                RunStatus(
                    run_id=rid,
                    params={a: params.get(a) for a in axes} if axes else dict(params),
                    state="unreadable",
                    step=0,
                    total_steps=None,
                    reward=None,
                    elapsed_s=0.0,
                    gpu_hours=0.0,
                    job_id=train_row["job_id"] if train_row else None,
                    cluster=train_row["cluster"] if train_row else None,
                    eval_state=None,
                    log_tail=[e.message],
                    reason=e.message,
                )
            )
    return out


def scheduler_problem(sweep_dir: str | Path) -> str | None:
    """Why the scheduler cannot tell the sweep's jobs' states, for a line beside ``status``: the Slurm
    controller does not answer (``scheduler.controller_problem``); None when it does or no job is Slurm's."""
    if not any(r["cluster"] == "slurm" for r in latest_rows(Path(sweep_dir)).values()):
        return None
    problem = controller_problem()
    return f"{problem}; job states are from Slurm's accounting (sacct), if it answers" if problem else None


def _run_status(
    run_dir: Path,
    train_row: dict[str, Any] | None,
    eval_row: dict[str, Any] | None,
    states: dict[str, JobState],
    axes: list[str],
    params: dict[str, Any] | None,
) -> RunStatus:
    """One run's RunStatus; ``store.UnreadableFile`` when its status.json or config.yaml cannot be read."""
    rid = run_dir.name
    st = store.read_status(run_dir)
    job = states.get(key(train_row)) if train_row else None
    sched = job.state if job else None
    state = _combine(st.get("state", "pending"), sched)
    # accounting lags the job: trust a running status written since this submission
    fresh = train_row and float(st.get("updated_at") or 0) >= float(train_row["submitted_at"])
    if state == "pending" and st.get("state") == "running" and fresh:
        state = "running"
    if state not in ("done", "diverged", "running") and store.trainer_of(run_dir) is not None:
        state = "running"  # a process holds its training lock, whatever the jobs' records say
    stale = store.stale_end(run_dir, st) if state == "done" else None
    if stale is not None:
        state = INCOMPLETE
    # the eval is done when the run's final checkpoint is scored; some other checkpoints alone: partial
    complete = has_eval_results(run_dir, st)
    scored = [] if complete else store.evaluated_checkpoints(run_dir)
    eval_state = ("done" if complete else "partial" if scored else None) if eval_row is None else None
    if eval_row is not None:
        e_job = states.get(key(eval_row))
        e_sched = e_job.state if e_job else None
        if complete:
            eval_state = "done"
        elif e_sched == "SKIPPED":
            eval_state = "skipped"
        else:
            eval_state = _combine("pending", e_sched)
            if eval_state == "done" and st.get("eval_error"):  # its job went on to other runs: the run failed
                eval_state = "failed"
            elif eval_state in ("done", "cancelled") and scored:  # e.g. scancel part-way
                eval_state = "partial"
    if stale is not None and eval_state == "partial":
        eval_state = None  # its final checkpoint cannot be scored: the run's reason says what to do
    partial = None
    if eval_state == "partial":
        final = store.final_checkpoint(run_dir, st)
        partial = (
            f"eval partial: {len(scored)} checkpoint(s) scored ({', '.join(scored)}), "
            + (f"not the final {final}" if final else "and the run has not finished")
            + f": `klsweep eval {run_dir.parent}` scores it"
        )
    cfg: dict[str, Any] | None = None  # config.yaml, read at most once, at the first need
    if params is None:
        cfg = read_run_file(run_dir)
        params = _axes_from_config(cfg, axes)
    total = st.get("total_steps")  # the run's steps: a bound of the rows kept (store.metrics)
    last = store.last_row(run_dir / store.METRICS_FILE, total if type(total) is int else None) or {}
    elapsed, startup = run_times(st, state == "running")
    res: dict[str, Any] = {}
    if elapsed or startup:
        with contextlib.suppress(OSError):
            res = _resources_of(cfg if cfg is not None else read_run_file(run_dir))
    gpus = int(res.get("gpus_per_node", 0)) * int(res.get("nodes", 1))
    tail: list[str] = []
    reason = st.get("reason") if state in ("failed", "diverged") else None
    log = None
    if state == "failed":
        log = joblogs.run_log(run_dir, train_row)
    elif eval_state == "failed":
        log = joblogs.run_log(run_dir, eval_row)
    if state == "failed" and st.get("state") == "running":
        # the job ended and the run never said why: no traceback to show, the process was killed
        tail = _died_silently(sched)
        reason = tail[0]
    elif state == "failed":
        tail = _log_tail(log) or (st.get("error") or "").splitlines()[-15:]
        if (
            st.get("state", "pending") == "pending"
        ):  # the job failed before the run began: the run said nothing
            said = next((line.strip() for line in reversed(tail) if line.strip()), "")
            reason = (
                "its local supervisor process is gone (killed?) before the run started: "
                "rerun `klsweep run` to submit it"
                if sched == "LOST"
                else f"its job failed before the run started{': ' + said if said else ' (no log)'}"
            )
    elif eval_state == "failed":
        tail = _log_tail(log)
    if stale is not None:
        reason = stale_reason(st, *stale)
    return RunStatus(
        run_id=rid,
        params={a: params.get(a) for a in axes} if axes else dict(params),
        state=state,
        step=int(st.get("step") or last.get("step") or 0),
        total_steps=st.get("total_steps"),
        reward=last.get("reward_mean"),
        elapsed_s=elapsed,
        gpu_hours=(elapsed + startup) * gpus / 3600.0,  # the job held its GPUs from its start
        job_id=train_row["job_id"] if train_row else None,
        cluster=train_row["cluster"] if train_row else None,
        eval_state=eval_state,
        log_tail=tail,
        reason=reason,
        log=str(log) if log else None,
        eval_error=(st.get("eval_error") or _eval_ended(eval_row, run_dir.parent))
        if eval_state == "failed"
        else partial,
        job_state=sched,
        job_reason=job.reason if job else None,
        startup_s=startup,
    )


def run_times(st: dict[str, Any], running: bool) -> tuple[float, float]:
    """A run's own time (its training loop's, every attempt's) and its start-up apart (each attempt's, from its
    start to its loop's: imports, the model and trainer built, W&B opened), from status.json (``klsweep.job``);
    while it runs, up to now. A status.json of an older klsweep has no start-up: its elapsed time counts it."""
    elapsed = float(st.get("elapsed_s") or 0.0)
    startup = float(st.get("startup_s") or 0.0)
    if not running:
        return elapsed, startup
    now = time.time()
    if st.get("trained_from"):
        return max(elapsed, now - float(st["trained_from"])), startup
    if st.get("attempt_started_at"):  # starting up: no step trained in this attempt yet
        return elapsed, startup + max(0.0, now - float(st["attempt_started_at"]))
    if st.get("started_at"):
        elapsed = max(elapsed, now - float(st["started_at"]))
    return elapsed, startup


def stale_reason(status: dict[str, Any], problem: str, resume: Path | None, submitted: bool = False) -> str:
    """What `klsweep status` and `klsweep run` say of a run ``store.stale_end`` finds not finished after all:
    what is missing, and what `klsweep run` does about it (``submitted``: what this one did)."""
    ended = f"{status.get('state')} at step {status.get('step')}, but {problem}"
    start = resume.name if resume is not None else "step 0"
    if submitted:
        return f"{ended}: trained again from {start}"
    if resume is not None:
        return f"{ended}: `klsweep run` trains it again from {start}"
    return (
        f"{ended}, and no checkpoint is left to train it again from: "
        "`klsweep run --retry-failed` trains it again from step 0"
    )


_SCHEDULER_SAYS = {
    "OUT_OF_MEMORY": "Slurm says it ran out of memory (model.resources.mem_gb)",
    "TIMEOUT": "Slurm says it reached its time limit (model.resources.timeout_min)",
    "NODE_FAIL": "Slurm says its node failed",
    "PREEMPTED": "Slurm says it was preempted and not requeued",
    "BOOT_FAIL": "Slurm says its node failed to boot",
    "LOST": "its local supervisor process is gone",
}


def _died_silently(sched: str | None) -> list[str]:
    """What to say of a run whose job ended without a word from the run (status.json still running)."""
    lines = ["the process died without a word (no traceback; killed? out of memory?)"]
    if sched in _SCHEDULER_SAYS:
        lines.append(_SCHEDULER_SAYS[sched])
    elif sched:
        lines.append(f"the scheduler says {sched}")
    return lines


def _eval_ended(row: dict[str, Any] | None, sweep_dir: Path) -> str:
    """Why a run's eval failed when the eval recorded nothing (its job killed, out of memory, or unable to write
    on a full disk), and what evaluates it again."""
    job = f"its eval job {row['job_id']}" if row and row.get("job_id") else "its eval"
    return (
        f"{job} ended before it scored the run, leaving no word (killed? out of memory? a full disk?): "
        f"`klsweep eval {sweep_dir}` (or the study again) evaluates it"
    )


def _axes_from_config(cfg: dict[str, Any], axes: list[str]) -> dict[str, Any]:
    out = {}
    for a in axes:
        v: Any = cfg
        for part in a.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        out[a] = v
    return out


def _resources_of(cfg: dict[str, Any]) -> dict[str, Any]:
    return (cfg.get("model") or {}).get("resources") or {}


POLL_MAX_S = 30.0  # the longest wait between two scheduler queries of ``wait_until_final``


PROGRESS_ORDER = ("running", "pending", "done", "diverged", "failed", "cancelled")


def progress(runs: list[RunStatus]) -> tuple[dict[str, int], float | None]:
    """The runs per state (running first, then pending, then the final states) and an estimate of the seconds
    until every run is final: the steps left (running and pending runs) times the time a step has taken, over
    the runs training side by side. A step's time is every trained step's so far, whatever the run's state now
    (the seconds the runs spent over the steps they trained: their start-up spread over their steps), so a run
    that just started, or finished, moves it little; side by side are the runs running now, those just starting
    (step 0) and those whose job the scheduler runs while their status still says pending. None until a run
    has trained a step. A rough figure: it takes the pending runs to start as soon as a slot frees."""
    counts = {
        s: n
        for s in (*PROGRESS_ORDER, *sorted({r.state for r in runs}))
        if (n := sum(r.state == s for r in runs))
    }
    trained = [r for r in runs if r.step > 0 and r.elapsed_s + r.startup_s > 0]
    steps = sum(r.step for r in trained)
    busy = sum(r.state == "running" or (r.state == "pending" and r.job_state == "RUNNING") for r in runs)
    if not steps or not busy:
        return counts, None
    # a pending run has not said its steps yet (its status is the submission's): as many as the runs that did
    known = [r.total_steps for r in runs if r.total_steps]
    typical = sum(known) / len(known) if known else 0.0
    left = sum(max(0, (r.total_steps or typical) - r.step) for r in runs if r.state in ("running", "pending"))
    # the seconds a step has taken, its run's start-up spread over its steps
    return counts, time_left(sum(r.elapsed_s + r.startup_s for r in trained), steps, left, busy)


def time_left(spent_s: float, done: float, left: float, side_by_side: int) -> float | None:
    """The seconds until ``left`` units of work more are done (training steps, checkpoints to score), at the
    pace of the ``done`` ones: ``spent_s`` the seconds they took, summed over the workers that did them, over
    the ``side_by_side`` workers at it now. None before a unit is done or while no worker is at it. The one
    estimate of training's time left (``progress``) and the eval's (``submit.evals.EvalProgress``)."""
    if done <= 0 or side_by_side <= 0:
        return None
    return left * (spent_s / done) / side_by_side


def poll_delay(idle_s: float, first_s: float = 2.0, max_s: float = POLL_MAX_S) -> float:
    """Seconds until the next scheduler query when nothing changed for ``idle_s`` seconds: ``first_s`` at
    first, then half the time since the last change (as submitit's job watcher spaces its sacct calls), at
    most ``max_s``. A change starts it over."""
    return min(max_s, max(first_s, idle_s / 2))


def _changes(runs: list[RunStatus]) -> list[tuple[Any, ...]]:
    """What of the runs counts as a change for ``poll_delay``: states, not steps (a busy sweep's steps change
    at every query)."""
    return [(r.run_id, r.state, r.eval_state, r.job_state, r.job_reason) for r in runs]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while waiting on a sweep (``wait_until_final``, ``klsweep.study.run_study``): the sweep's jobs go on
    without the waiter (local ones run in their own session); ``sweep_dir`` says which sweep."""

    def __init__(self, sweep_dir: str | Path):
        super().__init__(str(sweep_dir))
        self.sweep_dir = Path(sweep_dir)


def wait_until_final(
    sweep_dir: str | Path,
    poll_s: float = 2.0,
    on_update: Callable[[list[RunStatus]], None] | None = None,
    timeout_s: float | None = None,
) -> list[RunStatus]:
    """Poll ``status`` until every run (and its eval) is final; returns the last statuses. Queries are
    ``poll_s`` apart at first and after every change of a run's state, further apart while nothing changes
    (``poll_delay``: at most ``POLL_MAX_S``). ``TimeoutError`` after ``timeout_s``, naming the runs not final
    with their state, the scheduler's state and reason, and their job log's last lines; ``Interrupted`` on
    Ctrl-C."""
    try:
        return _wait_until_final(Path(sweep_dir), poll_s, on_update, timeout_s)
    except Interrupted:
        raise
    except KeyboardInterrupt:
        raise Interrupted(sweep_dir) from None


def _wait_until_final(
    sweep_dir: Path,
    poll_s: float,
    on_update: Callable[[list[RunStatus]], None] | None,
    timeout_s: float | None,
) -> list[RunStatus]:
    start = last_change = time.time()
    seen: list[tuple[Any, ...]] | None = None
    while True:
        runs = status(sweep_dir)
        now = time.time()
        if (changes := _changes(runs)) != seen:
            seen, last_change = changes, now
        if on_update is not None:
            on_update(runs)
        waiting = [r for r in runs if r.state not in FINAL or r.eval_state in ("pending", "running")]
        if not waiting:
            return runs
        if timeout_s is not None and now - start > timeout_s:
            raise TimeoutError(_not_final(Path(sweep_dir), waiting, timeout_s))
        delay = poll_delay(now - last_change, poll_s)
        if timeout_s is not None:  # not past the deadline
            delay = min(delay, max(0.0, start + timeout_s - now) + 0.01)
        time.sleep(delay)


def _not_final(sweep_dir: Path, runs: list[RunStatus], timeout_s: float) -> str:
    """The message of ``wait_until_final``'s timeout: each run not final, what the scheduler says of its job
    and the last lines of the job's log."""
    rows = latest_rows(sweep_dir)
    lines = [f"runs of {sweep_dir} still not final after {timeout_s:.0f} s:"]
    for r in runs:
        job = f"job {r.job_id} ({r.cluster}): {r.job_state or 'no state'}" if r.job_id else "no job"
        why = f", reason {r.job_reason}" if r.job_reason else ""
        ev = f", eval {r.eval_state}" if r.eval_state else ""
        lines.append(f"  {r.run_id}: {r.state}, step {r.step}/{r.total_steps}{ev}; {job}{why}")
        log = joblogs.run_log(sweep_dir / r.run_id, rows.get((r.run_id, "train")))
        lines += [f"    | {line}" for line in _log_tail(log, 5)]
    return "\n".join(lines)


@dataclass
class Cancelled:
    """What ``cancel_runs`` did: the runs it stopped and marked cancelled, those that ended (done, diverged) before
    it could, and those whose trainer it could not stop (run id -> why: a process of another
    user, of another machine), left as they were."""

    cancelled: list[str]
    ended: list[str]
    not_stopped: dict[str, str]


def cancel(sweep_dir: str | Path, run_ids: list[str] | None = None) -> list[str]:
    """Cancel the live jobs of a sweep (or of the given runs); their status becomes 'cancelled'.
    Returns the run ids cancelled (``cancel_runs``: what else happened)."""
    return cancel_runs(sweep_dir, run_ids).cancelled


def cancel_runs(sweep_dir: str | Path, run_ids: list[str] | None = None) -> Cancelled:
    """Cancel the live jobs of a sweep (or of the given runs) and stop what trains them: a run waiting in a
    local supervisor's queue is never started; a job's processes are stopped (``scheduler.cancel_rows``);
    then whatever process of this machine still holds a run's training lock (its trainer, wherever it
    lives: the kernel's lock table says which) is stopped too. A run is reported cancelled only once nothing
    trains it; one whose trainer cannot be stopped keeps its status, named in ``not_stopped``."""
    from filelock import FileLock

    sweep_dir = Path(sweep_dir)
    store.check_writable(sweep_dir, str(sweep_dir), "a sweep folder you can write to (cancel marks its runs)")
    known = {p.name for p in store.run_dirs(sweep_dir)}
    if run_ids:
        unknown = [r for r in run_ids if r not in known]
        if unknown:
            raise UserError([Problem("RUN", f"no run {r!r} in {sweep_dir}") for r in unknown])
    targets = set(run_ids) if run_ids else known
    with FileLock(str(sweep_dir / LOCK_FILE)):
        rows = [r for k, r in latest_rows(sweep_dir).items() if k[0] in targets]
        down = controller_problem() if any(r["cluster"] == "slurm" for r in rows) else None
        if down is not None:  # at once, rather than scancel's own timeouts; and no run marked cancelled
            raise UserError(
                Problem(
                    "scancel",
                    f"{DOWN}, so nothing was cancelled: {down.removeprefix(DOWN + ': ')}",
                    "the same command once `scontrol ping` says UP",
                ),
                title=DOWN,
            )
        live = live_jobs(rows)
        rows = [r for r in rows if (r["run_id"], r["kind"]) in live]
        chosen = sorted(
            {r["run_id"] for r in rows}
            | {r for r in targets if _state(sweep_dir / r) in ("pending", "running")}
            | {r for r in targets if store.trainer_of(sweep_dir / r) is not None}
        )
        before = {rid: _status_or_none(sweep_dir / rid) for rid in chosen}
        for rid in chosen:  # first: the supervisor (under this lock) never starts a run marked so
            store.write_status(
                sweep_dir / rid, "cancelled", reason="cancelled by user", finished_at=time.time()
            )
        cancel_rows(rows)
        not_stopped = {rid: why for rid in chosen if (why := _stop_trainer(sweep_dir / rid))}
        out = Cancelled([], [], not_stopped)
        for rid in chosen:  # a dying job may have written its own state meanwhile
            state = _state(sweep_dir / rid)
            if rid in not_stopped:
                _restore_status(sweep_dir / rid, before[rid])
            elif state in ("done", "diverged"):  # (a failed one: its job dying as it was stopped)
                out.ended.append(rid)
            else:
                store.write_status(sweep_dir / rid, "cancelled", reason="cancelled by user")
                out.cancelled.append(rid)
    return out


def _stop_trainer(run_dir: Path) -> str | None:
    """Stop the processes of this machine that still hold the run's training lock (the kernel's table of
    locks names them, whatever the job records say: a trainer orphaned by its job's shell, one started by
    hand); None once no process holds it, else why not: one of another machine (its scheduler's to stop),
    or one that will not die (another user's)."""
    if store.trainer_of(run_dir) is None:
        return None
    import socket

    left = stop_processes(flock_holders([run_dir, run_dir / store.TRAIN_LOCK]))
    deadline = time.time() + 5  # the kernel drops a dead holder's lock as it reaps it
    while (holder := store.trainer_of(run_dir)) is not None and time.time() < deadline:
        time.sleep(0.05)
    if holder is None:
        return None
    if left or holder.get("host") == socket.gethostname():
        return f"its trainer ({store.describe_trainer(holder)}) could not be stopped"
    return f"still trained by {store.describe_trainer(holder)}: a process of another machine"


def _status_or_none(run_dir: Path) -> dict[str, Any] | None:
    try:
        return store.read_status(run_dir)
    except store.UnreadableFile:
        return None


def _restore_status(run_dir: Path, status: dict[str, Any] | None) -> None:
    """Put back the status a run had before ``cancel`` marked it (its trainer goes on)."""
    if status is not None:
        store.write_json(run_dir / store.STATUS_FILE, status)


def _state(run_dir: Path) -> str | None:
    """The run's state in its status.json; None when the file cannot be read."""
    try:
        return store.read_status(run_dir).get("state")
    except store.UnreadableFile:
        return None


def final_summary(runs: list[RunStatus], fail_on_diverged: bool = False) -> tuple[str, int]:
    """The line ``klsweep run --wait`` ends with, and its exit code: 1 when a run (or its eval) failed, was
    cancelled or is otherwise not done, and with ``fail_on_diverged`` also when one diverged (a divergence is a result of the
    study, not a failure of the tool: exit 0 unless asked); else 0."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.state] = counts.get(r.state, 0) + 1
    evals_failed = sum(r.eval_state in ("failed", "cancelled", "partial") for r in runs)
    order = [*store.STATES, *sorted(set(counts) - set(store.STATES))]
    parts = [f"{counts[s]} {s}" for s in order if counts.get(s)]
    if evals_failed:
        parts.append(f"{evals_failed} eval(s) failed")
    bad = sum(n for s, n in counts.items() if s not in ("done", "diverged")) + evals_failed
    diverged = counts.get("diverged", 0)
    line = ", ".join(parts) or "no runs"
    if diverged:
        line += (
            "; diverged runs fail this command (--fail-on-diverged)"
            if fail_on_diverged
            else "; diverged runs are a result of the study (exit 0; --fail-on-diverged to fail)"
        )
    return line, int(bool(bad or (fail_on_diverged and diverged)))
