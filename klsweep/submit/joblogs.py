"""Each run's own copy of the stdout/stderr of the jobs that worked on it: ``<run>/logs/`` (``kept``), and the
log file to show for a run (``run_log``).

``<run>/logs/<kind>-<job id>.out|.err``: a job of one run hard-links submitit's log files; a job of several
runs (a local worker, the local ``klsweep eval`` job) copies each run its part. Debug jobs keep no log. Why and
the details: docs/DESIGN.md (Submission), docs/FAULTS.md (where the logs are).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOGS_DIR = "logs"


def log_name(kind: str, job_id: str, task: int = 0) -> str:
    """``<kind>-<job id>`` (``-task<k>`` after it for the tasks after the first): the stem of a run's log files."""
    return f"{kind}-{job_id}" + (f"-task{task}" if task else "")


@contextlib.contextmanager
def kept(run_dir: str | os.PathLike, kind: str, shared: bool = False) -> Iterator[None]:
    """Keep this job task's stdout and stderr in ``run_dir/logs/`` while the body works on the run (see the
    module docstring); ``shared``: the job works on other runs too, before or after this one. Outside a local
    or Slurm submitit job, nothing."""
    sources = _job_logs()
    if sources is None:
        yield
        return
    job_id, task, files = sources
    logs = Path(run_dir) / LOGS_DIR
    stem = log_name(kind, job_id, task)
    pending: list[tuple[Path, Path, int]] = []  # (submitit's file, the run's copy, where its part starts)
    for source, suffix in files:
        target = logs / f"{stem}{suffix}"
        if not shared and _linked(source, target):
            continue
        pending.append((source, target, _size(source)))
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for source, target, start in pending:
            _append_part(source, target, start)


def log_offsets() -> dict[str, int]:
    """This job task's log files and their sizes now: where the part of a run that starts now begins, for
    ``copy_part`` ({} outside a local or Slurm job)."""
    sources = _job_logs()
    return {str(path): _size(path) for path, _ in sources[2]} if sources else {}


def copy_part(run_dir: str | os.PathLike, kind: str, job_id: str, offsets: dict[str, int]) -> None:
    """Append to the run's ``logs/`` what the job's log files (``log_offsets``) hold from their offsets on: the
    part of a job that worked on several runs and died before ``kept`` could copy it."""
    for source, start in offsets.items():
        suffix = ".err" if source.endswith(".err") else ".out"
        _append_part(Path(source), Path(run_dir) / LOGS_DIR / f"{log_name(kind, job_id)}{suffix}", start)


def run_log(run_dir: str | os.PathLike, row: dict[str, Any] | None) -> Path | None:
    """The log file to show for the run's job of ``row`` (a ``jobs.jsonl`` record): its stderr in the run's
    ``logs/``, else submitit's own; None when the job has no log (not started, debug) or neither exists."""
    if row is None or not row.get("job_id"):
        return None
    for path in (
        Path(run_dir) / LOGS_DIR / f"{log_name(row['kind'], row['job_id'])}.err",
        Path(row["folder"]) / f"{row['job_id']}_0_log.err",
    ):
        if path.is_file():
            return path
    return None


def _job_logs() -> tuple[str, int, list[tuple[Path, str]]] | None:
    """(job id, task, [(submitit's log file, suffix)]) of this process's submitit task, None outside a local
    or Slurm job (or when its log files are not there)."""
    if os.environ.get("SUBMITIT_EXECUTOR") not in ("local", "slurm"):
        return None
    import submitit

    env = submitit.JobEnvironment()
    paths = env.paths
    files = [(paths.stdout, ".out")]
    if paths.stderr != paths.stdout:
        files.append((paths.stderr, ".err"))
    files = [(p, suffix) for p, suffix in files if p.is_file()]
    return (env.job_id, env.global_rank, files) if files else None


def _linked(source: Path, target: Path) -> bool:
    """Whether ``target`` is (now) a hard link of ``source``."""
    try:
        if target.exists():
            return target.samefile(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(source, target)
        return True
    except OSError:
        return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _append_part(source: Path, target: Path, start: int) -> None:
    """Append ``source`` from byte ``start`` on to ``target``; a log that cannot be copied is not a failure."""
    with contextlib.suppress(OSError):
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(source, "rb") as src, open(target, "ab") as dst:
            src.seek(start)
            while chunk := src.read(1 << 20):
                dst.write(chunk)
