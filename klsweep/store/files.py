"""A results folder's files read and written: atomic writes through an unpredictable temporary file, regular
files only, JSON, a run's status.json, the JSONL files (a damaged line skipped and counted; metrics.jsonl:
``klsweep.store.metrics``); a full disk told apart."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from klsweep.errors import Problem, UserError
from klsweep.store.layout import STATES, STATUS_FILE, SWEEP_FILE


class UnreadableFile(UserError):
    """A run's file that cannot be read (cut short, not JSON/YAML, not a mapping): the run is "unreadable"."""

    def __init__(self, path: str | os.PathLike, what: str, todo: str):
        self.path = Path(path)
        self.what = what
        self.todo = todo
        super().__init__(Problem(str(path), f"{what}; {todo}"), title="unreadable run file")

    @property
    def message(self) -> str:
        """One line: the file, what is wrong with it, what to do."""
        return f"{self.path}: {self.what}; {self.todo}"


STATUS_TODO = "delete it and rerun `klsweep run`: the run resumes from its last checkpoint"


def atomic_write_text(path: str | os.PathLike, text: str | bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, renamed over it. Its mode is what
    ``open`` gives a new file (0666 less the umask), not ``mkstemp``'s 0600: colleagues sharing a results
    folder read it as they read the rest. ``text``: bytes are written as they are."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temp_file(path)
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _new_temp_file(path: Path) -> tuple[int, Path]:
    """A new empty file beside ``path`` (``.<name>.<random>.tmp``) opened for writing, created with mode 0666
    so that the kernel applies the umask, as it does for ``open``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(path.parent))


def umask() -> int:
    """This process's umask (Linux reads it without changing it; elsewhere it is set and set back)."""
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(folder: str | os.PathLike) -> None:
    """Give every regular file directly in ``folder`` the mode ``open`` gives a new file (0666 less the umask):
    for the files of a writer that does not (safetensors writes 0600), so that a colleague sharing the results
    folder reads a checkpoint's weights as they read the rest. Links are not followed."""
    mode = 0o666 & ~umask()
    with os.scandir(folder) as entries:
        for entry in entries:
            if not entry.is_file(follow_symlinks=False):
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except (FileNotFoundError, PermissionError):  # replaced (a temporary file renamed) meanwhile
                continue
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.fchmod(fd, mode)
            finally:
                os.close(fd)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


REGULAR_TODO = "remove it: klsweep reads only regular files in a results folder"


@contextlib.contextmanager
def open_regular(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """``path`` opened for reading in binary, when it is a regular file; anything else (a FIFO, which a plain
    ``open`` waits on for a writer, for ever; a device; a folder) raises ``UnreadableFile`` at once, the way
    ``trainer_of`` opens the lock file: without waiting (``O_NONBLOCK``). FileNotFoundError when absent."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnreadableFile(path, f"not a regular file but {_file_kind(mode)}", REGULAR_TODO)
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as f:
        yield f


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file"


def read_bytes(path: str | os.PathLike, limit: int | None = None) -> bytes:
    """The bytes of a regular file (``open_regular``); with ``limit``, at most that many are read and a longer
    file raises ValueError ("larger than ...") without being read whole."""
    with open_regular(path) as f:
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 and limit % (1 << 20) == 0 else f"{limit} bytes"
        raise ValueError(f"larger than {size}")
    return data


def read_text(path: str | os.PathLike) -> str:
    """The text (UTF-8) of a regular file (``open_regular``); UnicodeDecodeError when it is not text."""
    return read_bytes(path).decode()


def read_sweep_file(sweep_dir: str | os.PathLike) -> dict[str, Any]:
    """A sweep's ``sweep.yaml`` (its grid text, planned axes and runs) as a mapping, or {} when it is missing or
    cannot be read: the run folders' own config.yaml files say the same, more slowly."""
    import yaml

    try:
        text = read_text(Path(sweep_dir) / SWEEP_FILE)
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, UnreadableFile):
        return {}
    return data if isinstance(data, dict) else {}


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(read_bytes(path))


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_status(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The run's status; a folder with no status file is 'pending'. ``UnreadableFile`` when the file is not a
    JSON object with a known state."""
    p = Path(run_dir) / STATUS_FILE
    try:
        status = read_json(p)
    except FileNotFoundError:
        return {"state": "pending", "step": 0}
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise UnreadableFile(p, f"not valid JSON (cut short?): {e}", STATUS_TODO) from e
    if not isinstance(status, dict) or status.get("state") not in STATES:
        raise UnreadableFile(p, "not a status (a JSON object with a known state)", STATUS_TODO)
    return status


def write_status(run_dir: str | os.PathLike, state: str, **fields: Any) -> dict[str, Any]:
    """Update the status file, keeping the fields not given (none of an unreadable one); stamps updated_at."""
    if state not in STATES:
        raise ValueError(f"state {state!r} is not one of {', '.join(STATES)}")
    try:
        status = read_status(run_dir) if (Path(run_dir) / STATUS_FILE).exists() else {}
    except UnreadableFile:
        status = {}
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
    """Every row of a JSONL file; unreadable lines are skipped (``scan_jsonl``)."""
    return scan_jsonl(path)[0]


def scan_jsonl(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[int]]:
    """The rows of a JSONL file (its lines that are JSON objects) and the numbers (1-based) of the lines that are
    not: a torn line is skipped and counted, and the rows after it are kept. An unfinished last line (no
    newline: a writer killed mid-line) is ignored without being counted."""
    try:
        data = read_bytes(path)
    except FileNotFoundError:
        return [], []
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    lines = data.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = _json_object(line)
        if row is not None:
            rows.append(row)
        elif number < len(lines):  # the last element follows the last newline: unfinished
            bad.append(number)
    return rows, bad


def _json_object(line: bytes) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return row if isinstance(row, dict) else None


def disk_full(path: str | os.PathLike, error: BaseException) -> bool:
    """Whether ``error`` came from a full disk where ``path`` is: an ENOSPC/EDQUOT ``OSError`` in its chain, or
    less than 1 MiB left there (torch's writers say only "file write failed" / "unexpected pos")."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 1 << 20
