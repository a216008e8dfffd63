"""A run's training lock: one process trains a run at a time (``training``: the run folder and ``TRAIN_LOCK``
flock'd, with the holder's pid, host and job id), checked at every step (``check_training``), and who holds it
(``trainer_of``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from klsweep.errors import Problem, UserError
from klsweep.printable import visible_lines
from klsweep.store.layout import TRAIN_LOCK

TRAIN_LOCK_WAIT_S = 30.0  # how long a trainer waits for the lock (a dying trainer releases it at its exit)


class AlreadyTraining(UserError):
    """The run is being trained by another process (it holds the run's training lock): this one does not
    train it."""

    def __init__(self, run_dir: str | os.PathLike, holder: dict[str, Any]):
        self.run_dir = Path(run_dir)
        self.holder = holder
        super().__init__(
            Problem(
                str(run_dir),
                f"already being trained by {describe_trainer(holder)}",
                "wait for it to end, or stop that process; `klsweep status` shows the run running",
            ),
            title="run already being trained",
        )


_held: dict[str, int] = {}  # run folders whose training lock this process holds -> its locked file's fd


def describe_trainer(holder: dict[str, Any]) -> str:
    """``pid 123 on host (job 45)``, from a training lock's record (parts missing when it could not be read)."""
    text = f"pid {holder['pid']}" if holder.get("pid") else "another process"
    if holder.get("host"):
        text += f" on {holder['host']}"
    return text + (f" (job {holder['job_id']})" if holder.get("job_id") else "")


@contextlib.contextmanager
def training(run_dir: str | os.PathLike, wait_s: float | None = None) -> Iterator[None]:
    """Hold the run's training lock while the body trains it: an exclusive ``flock`` on the run folder itself
    and on ``<run>/.train.lock`` (which holds the trainer's pid, host and job id), both released by the kernel
    when this process ends, however it ends (kill -9, out of memory). The folder's lock is what a newcomer
    cannot miss: a user who removes ``.train.lock`` while a run trains removes only the record, and a second
    trainer still finds the folder locked; the file's lock stays for what reads it (an older klsweep). Waits
    up to ``wait_s`` (default ``TRAIN_LOCK_WAIT_S``) for another holder to let go, then raises
    ``AlreadyTraining`` naming it. Reentrant in one process. On a file system without ``flock`` (Lustre
    mounted without it, some NFS setups) it trains unlocked, with a line on stderr: there the scheduler's one
    job per run is the guarantee."""
    run_dir = Path(run_dir)
    key = os.path.realpath(run_dir)
    if key in _held:
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    folder_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fd = -1
    try:
        fd = _lock_both(run_dir, folder_fd, TRAIN_LOCK_WAIT_S if wait_s is None else wait_s)
        _write_record(fd)
        _held[key] = fd
        try:
            yield
        finally:
            fd = _held.pop(key)  # ``check_training`` may have locked a new file meanwhile
    finally:
        if fd >= 0:
            os.close(fd)  # releases the locks
        os.close(folder_fd)


def _write_record(fd: int) -> None:
    """Who holds the training lock, into its locked file: pid, host, job id, since when."""
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID"),
        "since": time.time(),
    }
    with contextlib.suppress(OSError):  # in place (a rename would replace the locked file); a full disk
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)


class LostTrainingLock(AlreadyTraining):
    """Another trainer holds the run's lock file now, in place of this one's (``check_training``): this one
    stops, writing nothing more, and leaves the run to it."""


def check_training(run_dir: str | os.PathLike) -> None:
    """For the process training ``run_dir`` (inside ``training``), at each step: whether ``.train.lock`` is still
    the file it locked. A folder's ``flock`` holds on its own node only on a shared file system (Linux's NFS
    client), so across nodes a user who removes the file lets a second trainer in, which locks a new one: this
    trainer then finds that file and raises ``LostTrainingLock`` (it stops within a step of the newcomer's
    start, before a model of any size has loaded there). A file merely removed is created and locked again,
    its record back for ``trainer_of``. Nothing when this process holds no lock (ranks but 0)."""
    import fcntl

    key = os.path.realpath(run_dir)
    fd = _held.get(key)
    if fd is None:
        return
    path = Path(run_dir) / TRAIN_LOCK
    if _names(path, fd):
        return
    try:
        new = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:  # another trainer's file
        raise LostTrainingLock(run_dir, _record_at(path)) from None
    if (
        _try_flock(new, fcntl.LOCK_EX) is False
    ):  # created just now by this process: locked at once by another?
        os.close(new)
        raise LostTrainingLock(run_dir, _record_at(path))
    _write_record(new)
    os.close(fd)
    _held[key] = new


def _lock_both(run_dir: Path, folder_fd: int, wait_s: float) -> int:
    """``training``'s locks, the folder's then the file's, waiting up to ``wait_s``: the locked file's fd. A
    file the path no longer names once locked (removed or replaced meanwhile) is let go and the path opened
    again."""
    import fcntl

    deadline = time.time() + wait_s
    path = run_dir / TRAIN_LOCK
    while True:
        folder_locked = _try_flock(folder_fd, fcntl.LOCK_EX)
        if folder_locked is False:
            if time.time() >= deadline:
                raise AlreadyTraining(run_dir, _record_at(path))
            time.sleep(0.2)
            continue
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        file_locked = _try_flock(fd, fcntl.LOCK_EX)
        if file_locked is None and folder_locked is None:
            warning = f"klsweep warning: {path}: no lock (no flock on this file system); training unlocked"
            print(visible_lines(warning), file=sys.stderr, flush=True)
            return fd
        if file_locked is not False and _names(path, fd):
            return fd
        busy = _lock_record(fd) if file_locked is False else {}
        os.close(fd)
        if folder_locked:
            fcntl.flock(folder_fd, fcntl.LOCK_UN)
        if file_locked is False:  # held by a trainer that locks only the file
            if time.time() >= deadline:
                raise AlreadyTraining(run_dir, busy)
            time.sleep(0.2)


def _try_flock(fd: int, kind: int) -> bool | None:
    """``flock(fd, kind)`` without waiting: True when locked, False when another holds it, None when this file
    system has no ``flock`` there."""
    import fcntl

    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    return True


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    here = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


def trainer_of(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """Who trains the run now: its training lock's record (``pid``, ``host``, ``job_id``, ``since``; {} when
    it cannot be read: ``.train.lock`` removed by hand) while a process holds the lock (the file's, or the
    folder's: ``training``), else None. Read-only: creates nothing."""
    import fcntl

    path = Path(run_dir) / TRAIN_LOCK
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # no link followed, no wait on a FIFO planted there
    with contextlib.suppress(OSError):
        fd = os.open(path, flags)
        try:
            if _try_flock(fd, fcntl.LOCK_SH) is False:
                return _lock_record(fd)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    try:
        folder_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        held = _try_flock(folder_fd, fcntl.LOCK_SH) is False
        return _record_at(path) if held else None
    finally:
        os.close(folder_fd)  # releases a shared lock taken


def _record_at(path: Path) -> dict[str, Any]:
    """The record of the training lock file at ``path``; {} when there is none to read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        return _lock_record(fd)
    finally:
        os.close(fd)


def _lock_record(fd: int) -> dict[str, Any]:
    try:
        record = json.loads(os.pread(fd, 4096, 0))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
