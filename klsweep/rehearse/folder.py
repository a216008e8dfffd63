"""A rehearsal's output folder: ``<out>/<name>/``, apart from the sweep's results, marked (``MARKER``) so that
run, status, eval and report refuse it, and locked while a rehearsal writes it (``.<name>.rehearse.lock`` beside
it): ``only_rehearsal``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from klsweep import store
from klsweep.errors import Problem, UserError

DEFAULT_OUT = Path("results") / ".rehearsal"
MARKER = store.REHEARSAL_MARKER  # in a rehearsal's folder and run folders: a rerun replaces only a marked
# folder, and run, status, eval and report refuse one (store.refuse_rehearsal)
MARKER_TEXT = "a klsweep rehearsal: stand-in models trained a few steps, never a sweep's results\n"


def only_rehearsal(folder: Path) -> int:
    """Before a rehearsal into ``folder``: a lock (``flock``) on ``.<name>.rehearse.lock`` beside it, held
    until the returned fd is closed, so that a second rehearsal into the same folder is refused instead of
    removing the first one's files; then the folder emptied, when it holds a previous rehearsal.
    ``UserError`` (nothing touched) when another rehearsal holds the lock, or the folder holds something
    else: a sweep's results (``klsweep run`` leaves its jobs.jsonl even in a marked folder), whatever a user
    put there."""
    import fcntl

    problem = store.not_a_folder(folder)
    if problem is not None:
        raise UserError(Problem("--out", problem, "a folder"))
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(
        folder.parent / f".{folder.name}.rehearse.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        raise UserError(
            Problem(
                "--out",
                f"another `klsweep rehearse` is writing {folder} now",
                "wait for it, or another --out",
            ),
            title="rehearsal under way",
        ) from None
    except OSError:  # no flock on this file system: unlocked, as before
        pass
    if folder.exists() and any(folder.iterdir()):
        sweep = (folder / store.JOBS_FILE).exists() or (folder / "submitit").exists()
        if sweep or not (folder / MARKER).is_file():
            os.close(lock)
            what = (
                "a sweep's results (its jobs.jsonl)"
                if sweep
                else "something else than a rehearsal (a sweep?)"
            )
            raise UserError(Problem("--out", f"{folder} holds {what}", "another --out"))
        shutil.rmtree(folder)  # the previous rehearsal
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(MARKER_TEXT)
    return lock
