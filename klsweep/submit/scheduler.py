"""What was submitted and what the scheduler says about it: the sweep's job records (``jobs.jsonl``, the
lock, the submitit folders), one batched query for the state of every recorded job (``sacct``/``squeue``
on Slurm; the process table and submitit's result files locally), and stopping live jobs.

A job record is ``job_row``; states are Slurm's words for every cluster (plus ``LOST``, ``GONE``, ``UNKNOWN``)
with Slurm's pending reason beside them (``JobState``). The record and the states: docs/DESIGN.md
(Submission).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klsweep import store

LOCK_FILE = ".lock"
# The local supervisor runs as ``python -m klsweep.submit supervise QUEUE``: how it is found in /proc.
SUPERVISOR_MODULE = "klsweep.submit"
LIVE_SLURM = {
    "PENDING",
    "REQUEUED",
    "CONFIGURING",
    "RESIZING",
    "SUSPENDED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RUNNING",
    "COMPLETING",
    "STAGE_OUT",
    "SIGNALING",
    "STOPPED",
}
RUNNING_SLURM = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}


@dataclass(frozen=True)
class JobState:
    """A job's state in the scheduler's words and, while it waits to start, why (Slurm's pending reason)."""

    state: str
    reason: str | None = None


def _job_state(state: str, reason: str | None) -> JobState:
    """Slurm's state (its first word: ``CANCELLED by 0`` is ``CANCELLED``) and its reason, kept while the job
    waits (accounting keeps a started job's last pending reason: stale)."""
    state = state.split()[0] if state.strip() else "UNKNOWN"
    waiting = state in LIVE_SLURM and state not in RUNNING_SLURM
    return JobState(state, reason if waiting and reason not in (None, "", "None") else None)


# --- records -------------------------------------------------------------------------------------------------


def submission_folder(sweep_dir: Path) -> Path:
    """A new folder for one submission's submitit files: ``<sweep>/submitit/<time>[-k]/``."""
    base = time.strftime("%Y%m%d-%H%M%S")
    folder = sweep_dir / "submitit" / base
    k = 1
    while folder.exists():
        k += 1
        folder = sweep_dir / "submitit" / f"{base}-{k}"
    folder.mkdir(parents=True)
    return folder


def job_row(
    run_id: str, kind: str, cluster: str, job_id: str | None, folder: Path, **extra: Any
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "kind": kind,
        "cluster": cluster,
        "job_id": job_id,
        "folder": str(folder),
        "submitted_at": time.time(),
        **extra,
    }


def latest_rows(sweep_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The latest jobs.jsonl row per (run id, kind)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for row in store.read_jsonl(sweep_dir / store.JOBS_FILE):
        out[(row["run_id"], row["kind"])] = row
    return out


# --- states --------------------------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name (the first is the state: ``Z`` a zombie);
    None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start(pid: int) -> int | None:
    """When the process ``pid`` started (clock ticks after boot: ``/proc/<pid>/stat``'s 22nd field), from its
    fork on: with the pid, the process's identity (a reused pid never has the same start); None when there is
    no such process."""
    return _start(_stat_fields(pid))


def _start(fields: list[str] | None) -> int | None:
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int, marker: str, start: int | None = None) -> bool:
    """Whether the process ``pid`` lives (not a zombie) and is the one meant: started at ``start``
    (``process_start``, recorded when it was started) when given, and running a command line that names
    ``marker`` or **is empty**: a process that is starting, whose command line stays empty while the kernel
    loads the new program (``exec``: milliseconds, more on a loaded machine; ``subprocess.Popen`` returns
    before it is filled). A supervisor polled then is starting, not gone."""
    fields = _stat_fields(pid)
    if not fields or fields[0] == "Z" or (start is not None and _start(fields) != start):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return not cmdline.strip(b"\0") or marker in cmdline.replace(b"\0", b" ").decode(errors="replace")


def _local_state(row: dict[str, Any]) -> str:
    """A Slurm-like state of a local job, read from the process table and submitit's result file. A pool's
    worker dies with its supervisor (``klsweep.submit.local``): its jobs are ``LOST`` once the supervisor is."""
    if row.get("state"):
        return row["state"]
    if row["job_id"] is None or row.get("worker"):
        if not pid_alive(int(row["supervisor"]), SUPERVISOR_MODULE, row.get("supervisor_start")):
            return "LOST"
        # a worker gone while its supervisor lives: the supervisor is about to record how the job ended
        return "PENDING" if row["job_id"] is None else "RUNNING"
    if pid_alive(int(row["job_id"]), "submitit", row.get("job_start")):
        return "RUNNING"
    return _result_state(Path(row["folder"]), row["job_id"])


def _result_state(folder: Path, job_id: str) -> str:
    """How an ended local job ended, from submitit's result file, **without unpickling it** (a results folder
    may come from anyone: a read-only command executes nothing from it): the file holds the tuple
    ``(outcome, result)`` and its first string is the outcome, read with ``pickletools``, which decodes the
    opcodes and runs none."""
    import pickletools

    path = folder / f"{job_id}_0_result.pkl"
    if not path.exists():
        return "CANCELLED" if (folder / f"{job_id}.cancelled").exists() else "FAILED"
    try:
        with store.open_regular(path) as f:
            for _, arg, _ in pickletools.genops(f):
                if isinstance(arg, str):
                    return "COMPLETED" if arg == "success" else "FAILED"
    except Exception:  # not a pickle: whatever the file is, the job did not say it succeeded
        pass
    return "FAILED"


def run_cmd(cmd: list[str]) -> str | None:
    """A Slurm command's stdout; None when it cannot be run, fails or takes more than a minute."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


DOWN = "the Slurm controller does not answer"
PING_TIMEOUT_S = 5.0  # `scontrol ping`: a controller that answers does at once; one that is down, at once too
_PING_TTL_S = 10.0
# SLURM_CONF -> (when, what ``controller_problem`` said)
_pinged: dict[str | None, tuple[float, str | None]] = {}


def controller_problem() -> str | None:
    """None when the Slurm controller answers (``scontrol ping``, at most ``PING_TIMEOUT_S``; no Slurm here
    counts as answering: its commands say so themselves), else ``the Slurm controller does not answer: ...``
    with what scontrol said. Remembered for ``_PING_TTL_S``: squeue, sbatch and scontrol each wait about
    10 s (Slurm's MessageTimeout) for a controller that is down before they give up."""
    conf = os.environ.get("SLURM_CONF")
    when, said = _pinged.get(conf, (0.0, None))
    if time.time() - when < _PING_TTL_S:
        return said
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=PING_TIMEOUT_S)
        # (a controller that is down adds a banner of asterisks: "** RESTORE SLURMCTLD DAEMON TO SERVICE **")
        words = [w.strip() for w in (out.stdout + out.stderr).splitlines() if w.strip() and w[:2] != "**"]
        said = (
            None
            if any(w.endswith(" is UP") for w in words)
            else " / ".join(words) or f"exit {out.returncode}"
        )
    except subprocess.TimeoutExpired:
        said = f"no answer to `scontrol ping` within {PING_TIMEOUT_S:g} s"
    except OSError:
        said = None  # no scontrol: not a Slurm machine
    if said is not None:
        said = f"{DOWN}: {said}"
    _pinged[conf] = (time.time(), said)
    return said


def _squeue() -> dict[str, JobState] | None:
    """Live Slurm jobs of this user (one squeue call): job id -> state and reason; None when squeue is
    unavailable or the controller does not answer (``controller_problem``: accounting may still)."""
    if controller_problem() is not None:
        return None
    out = run_cmd(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T|%r"])
    if out is None:
        return None
    fields = [line.split("|", 2) for line in out.splitlines() if line.count("|") == 2]
    return {j: _job_state(state, reason) for j, state, reason in fields}


def _sacct(job_ids: list[str]) -> dict[str, JobState]:
    """Final or live states of Slurm jobs (one sacct call for all; arrays are queried by their array id)."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    if not job_ids:
        return {}
    bases = sorted({j.split("_")[0] for j in job_ids}, key=lambda s: (len(s), s))
    out = run_cmd(["sacct", "-X", "--parsable2", "-o", "JobID,State,Reason", "-j", ",".join(bases)])
    if out is None:
        return {}
    info = SlurmInfoWatcher().read_info(out)
    return {j: _job_state(s["State"], s.get("Reason")) for j, s in info.items()}


def job_states(rows: list[dict[str, Any]], live_only: bool = False) -> dict[str, JobState]:
    """``key(row)`` -> the scheduler's state of the row's job (and why it waits), for every row. Slurm:
    one sacct call for all, and one squeue call when a job is live (squeue has the live jobs' current
    state and pending reason; accounting lags it) or, with ``live_only``, squeue alone."""
    states: dict[str, JobState] = {}
    slurm_ids = [r["job_id"] for r in rows if r["cluster"] == "slurm" and r["job_id"]]
    if slurm_ids:
        if live_only:
            q = _squeue()
            if q is None:  # no squeue: trust accounting
                q = {j: s for j, s in _sacct(slurm_ids).items() if s.state in LIVE_SLURM}
            states.update({j: q.get(j, JobState("GONE")) for j in slurm_ids})
        else:
            acct = _sacct(slurm_ids)
            if any(j not in acct or acct[j].state in LIVE_SLURM for j in slurm_ids):
                # a live job's current state and reason; a fresh submission accounting does not list yet
                acct.update({j: s for j, s in (_squeue() or {}).items() if j in slurm_ids})
            states.update({j: acct.get(j, JobState("UNKNOWN")) for j in slurm_ids})
    for r in rows:
        if r["cluster"] == "local":
            states[key(r)] = JobState(_local_state(r))
        elif r["cluster"] == "debug":
            states[key(r)] = JobState(r.get("state", "COMPLETED"))
    return states


def scheduler_states(rows: list[dict[str, Any]], live_only: bool = False) -> dict[str, str]:
    """``key(row)`` -> Slurm-like state, for every row (``job_states`` without the reasons)."""
    return {k: s.state for k, s in job_states(rows, live_only).items()}


def key(row: dict[str, Any]) -> str:
    """A row's key in ``scheduler_states``: the Slurm job id, or one built from the local/debug row."""
    return (
        row["job_id"]
        if row["cluster"] == "slurm"
        else f"{row['cluster']}:{row['job_id']}:{row.get('supervisor')}:{row['run_id']}:{row['kind']}"
    )


def row_state(row: dict[str, Any]) -> str:
    return scheduler_states([row])[key(row)]


def live_jobs(rows: Any) -> set[tuple[str, str]]:
    """(run id, kind) of the rows whose job is still queued or running."""
    rows = list(rows)
    states = scheduler_states(rows, live_only=True)
    return {(r["run_id"], r["kind"]) for r in rows if states.get(key(r)) in LIVE_SLURM}


# --- stopping ------------------------------------------------------------------------------------------------


def cancel_rows(rows: list[dict[str, Any]]) -> dict[int, int | None]:
    """Stop the rows' jobs: scancel on Slurm (waiting until they left the queue); locally every process of the
    job (submitit's controller and what it started: a shell of ``cluster.setup`` lines, the task training)
    stopped (``stop_processes``). Returns the local processes that could not be stopped (pid -> start)."""
    slurm_ids = [r["job_id"] for r in rows if r["cluster"] == "slurm" and r["job_id"]]
    if slurm_ids:
        run_cmd(["scancel", *slurm_ids])
        # submitit jobs ignore SIGTERM: Slurm kills them KillWait seconds later. Wait for that, so that no
        # dying job overwrites the 'cancelled' status afterwards.
        deadline = time.time() + 60
        while time.time() < deadline:
            live = _squeue()
            if live is None or not any(j in live for j in slurm_ids):
                break
            time.sleep(0.5)
    procs: dict[int, int | None] = {}
    for r in rows:
        if r["cluster"] != "local" or r["job_id"] is None:
            continue  # queued in the supervisor: it skips runs whose status is cancelled
        if pid_alive(int(r["job_id"]), "submitit", r.get("job_start")):
            Path(r["folder"], f"{r['job_id']}.cancelled").touch()
            procs.update(process_tree(int(r["job_id"])))
    return stop_processes(procs)


def process_tree(pid: int) -> dict[int, int | None]:
    """The process ``pid`` and every process below it (pid -> start, ``process_start``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree: dict[int, int | None] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        if p not in tree and (start := process_start(p)) is not None:
            tree[p] = start
            todo += children.get(p, [])
    return tree


def flock_holders(paths: list[Path]) -> dict[int, int | None]:
    """The processes of this machine holding a ``flock`` on any of ``paths`` (the kernel's ``/proc/locks``; a
    path that is gone holds none), pid -> start."""
    files = set()
    for path in paths:
        with contextlib.suppress(OSError):
            st = os.stat(path, follow_symlinks=False)
            files.add(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")
    holders: dict[int, int | None] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; a waiter's line has "->" after the number
            held = len(fields) > 5 and fields[1] == "FLOCK" and fields[5] in files and fields[4].isdigit()
            if held and (start := process_start(int(fields[4]))) is not None:
                holders[int(fields[4])] = start
    return holders


STOP_WAIT_S = 5.0  # how long the processes of a cancelled job have to end on SIGINT before SIGKILL


def stop_processes(procs: dict[int, int | None], wait_s: float = STOP_WAIT_S) -> dict[int, int | None]:
    """Stop processes (pid -> start: a pid started at another time is another process, left alone): SIGINT
    (submitit's controller stops its tasks; a trainer ends its step), after ``wait_s`` SIGKILL to what is
    left and to what it started meanwhile. Returns those still alive (another user's: not ours to stop)."""

    def alive(procs: dict[int, int | None]) -> dict[int, int | None]:
        return {p: s for p, s in procs.items() if _live(p, s)}

    def send(procs: dict[int, int | None], sig: signal.Signals) -> None:
        for p in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)

    send(procs, signal.SIGINT)
    deadline = time.time() + wait_s
    while (procs := alive(procs)) and time.time() < deadline:
        time.sleep(0.1)
    for p in list(procs):
        procs.update(process_tree(p))
    send(procs, signal.SIGKILL)
    deadline = time.time() + 5
    while (procs := alive(procs)) and time.time() < deadline:
        time.sleep(0.05)
    return procs


def _live(pid: int, start: int | None) -> bool:
    """Whether the process ``pid`` started at ``start`` still lives (a zombie has ended)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] != "Z" and (start is None or _start(fields) == start)
