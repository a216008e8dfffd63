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
            env.json               the environment of the last training start (klsweep/environment.py)
            metrics.jsonl          one JSON object per optimiser step (the report's source of truth)
            checkpoints/checkpoint-<step>/   Hugging Face format (lm-eval loads it) + trainer state; the newest
                                     train.keep_checkpoints; the last holds FINAL_MARKER (done|diverged)
            checkpoints/unusable-checkpoint-<step>/   one cut short, set aside by a resume (checkpoint_problem)
            eval/<eval-hash>/<checkpoint-name>/results.json, samples_<task>.jsonl, results_<date>.json
                                   (lm-eval's own results file)
            wandb/offline-run-*/   W&B's files (offline; `wandb sync` uploads them), or run-*/ (online)
            logs/                  stdout/stderr of the jobs that worked on it: <kind>-<job id>.out|err
                                   (hard links of submitit's files, or the run's part copied; klsweep.submit.joblogs)
            .train.lock            flock'd, with the run folder, by the process training the run
                                   (``training``; its pid, host, job id)
        report/                    tables and plots (`klsweep report`)

A rehearsal's folder and its run folders hold ``REHEARSAL_MARKER``: the readers of a sweep refuse them
(``refuse_rehearsal``), whatever their runs' states say.

Every write goes through a temporary file and an atomic rename, so a reader never sees half a file; the
JSONL files are appended to line by line. What a reader does when a file is damaged anyway (a full disk, a copy
cut short, a hand edit): a JSONL line that is not a JSON object is skipped and counted (``scan_jsonl``), never
the rows after it; a status.json that cannot be read raises ``UnreadableFile``, which names the file and what
to do, so that callers can set that one run aside and carry on with the others.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from klsweep.errors import Problem, UserError

STATES = ("pending", "running", "done", "failed", "diverged", "cancelled")
FINAL_STATES = ("done", "failed", "diverged", "cancelled")
TRAINED_STATES = ("done", "diverged")  # trained to the end (or stopped by a collapse): run skips them
STOPPED_STATES = ("failed", "cancelled")  # run skips them unless --retry-failed

CONFIG_FILE = "config.yaml"
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
ENV_FILE = "env.json"
CHECKPOINTS_DIR = "checkpoints"
EVAL_DIR = "eval"
JOBS_FILE = "jobs.jsonl"
SWEEP_FILE = "sweep.yaml"
BASELINE_DIR = "baseline"
REPORT_DIR = "report"
FINAL_MARKER = "klsweep_final.json"  # in the checkpoint where a run ended: {"state", "step", "reason"}
TRAIN_LOCK = ".train.lock"  # held (flock) by the process training the run; holds its pid, host, job id
TRAIN_LOCK_WAIT_S = 30.0  # how long a trainer waits for the lock (a dying trainer releases it at its exit)
# Hugging Face weights files (one of them): what eval loads from a checkpoint
HF_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TRAINER_STATE = "trainer_state.json"  # transformers writes it last when it saves a checkpoint: a complete one
REHEARSAL_MARKER = ".klsweep-rehearsal"  # in a rehearsal's folder and its run folders (rehearse.py)


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


def read_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of a regular file (``open_regular``)."""
    with open_regular(path) as f:
        return f.read()


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


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    return read_jsonl(Path(run_dir) / METRICS_FILE)


def cut_metrics(run_dir: str | os.PathLike, step: int) -> tuple[list[dict[str, Any]], list[int]]:
    """Before a resume from the checkpoint of ``step``: cut metrics.jsonl just before its first row past
    ``step`` (and an unfinished last line), leaving every line before it as it is. Returns the rows kept and the
    numbers of the unreadable lines among them (skipped, as ``scan_jsonl`` does)."""
    p = Path(run_dir) / METRICS_FILE
    try:
        data = read_bytes(p)
    except FileNotFoundError:
        return [], []
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    offset, cut = 0, len(data)
    for number, line in enumerate(data.splitlines(keepends=True), 1):
        row = _json_object(line)
        if (row is not None and row.get("step", 0) > step) or (row is None and not line.endswith(b"\n")):
            cut = offset  # the first row past the checkpoint, or an unfinished last line
            break
        if row is not None:
            rows.append(row)
        elif line.strip():
            bad.append(number)
        offset += len(line)
    if cut < len(data) or (data and not data.endswith(b"\n")):
        with open(p, "r+b") as f:
            f.truncate(cut)
            if cut and data[cut - 1 : cut] != b"\n":  # a complete last row written without its newline
                f.seek(cut)
                f.write(b"\n")
            f.flush()
            os.fsync(f.fileno())
    return rows, bad


def checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run, oldest first (a checkpoint counts once its config.json exists)."""
    d = Path(run_dir) / CHECKPOINTS_DIR
    if not d.exists():
        return []
    found = [p for p in d.glob("checkpoint-*") if p.is_dir() and (p / "config.json").exists()]
    return sorted(found, key=checkpoint_step)


def has_weights(checkpoint: str | os.PathLike) -> bool:
    """Whether a checkpoint holds Hugging Face weights (what eval loads): not so a sharded FSDP checkpoint but
    the final one (docs/DESIGN.md, FSDP2)."""
    folder = Path(checkpoint)
    return any((folder / name).exists() for name in HF_WEIGHTS)


def checkpoint_problem(checkpoint: str | os.PathLike) -> str | None:
    """Why a checkpoint cannot be resumed from, or None: one of its files cut short or not what it should be
    (a full disk, a copy cut short, a kill mid-save). Reads each file's structure, not its tensors, so it is
    quick whatever the model's size: every ``*.safetensors`` file is as long as its header says, every
    ``*.pt``/``*.pth``/``*.bin`` (torch.save's zip archives) has its directory and members within the file,
    every ``*.json`` is JSON."""
    import zipfile

    for path in sorted(Path(checkpoint).iterdir()):
        try:
            if path.suffix == ".safetensors":
                problem = _safetensors_problem(path)
            elif path.suffix in (".pt", ".pth", ".bin"):
                with zipfile.ZipFile(path) as archive:
                    size = path.stat().st_size
                    ends = [i.header_offset + i.compress_size for i in archive.infolist()]
                problem = "a member lies past the end of the file" if ends and max(ends) > size else None
            elif path.suffix == ".json":
                read_json(path)
                problem = None
            else:
                continue
        except (OSError, ValueError, UnicodeDecodeError, zipfile.BadZipFile) as e:
            problem = f"{type(e).__name__}: {e}"
        if problem is not None:
            return f"{path.name}: {problem}"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """Whether a safetensors file is whole: an 8-byte header length, a JSON header, then exactly the bytes
    its tensors' offsets say."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            return f"cut short: a header of {n} bytes in a file of {size}"
        header = json.loads(f.read(n))
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    expected = 8 + n + max(ends, default=0)
    return None if expected == size else f"cut short: {size} bytes of {expected}"


def newest_usable(found: list[Path]) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest of ``found`` (checkpoints, oldest first) that can be resumed from (``checkpoint_problem``),
    and each newer one with what is wrong with it."""
    unusable = []
    for checkpoint in reversed(found):
        problem = checkpoint_problem(checkpoint)
        if problem is None:
            return checkpoint, unusable
        unusable.append((checkpoint, problem))
    return None, unusable


UNUSABLE_PREFIX = (
    "unusable-"  # checkpoints/unusable-checkpoint-<step>: one set aside (``set_aside_checkpoint``)
)


def set_aside_checkpoint(checkpoint: str | os.PathLike) -> Path:
    """Rename a checkpoint that cannot be resumed from to ``unusable-<name>`` beside it (replacing an older
    one of that name), out of the trainer's and eval's sight, kept for a look; returns the new path."""
    import shutil

    checkpoint = Path(checkpoint)
    target = checkpoint.with_name(UNUSABLE_PREFIX + checkpoint.name)
    if target.exists():
        shutil.rmtree(target)
    checkpoint.rename(target)
    return target


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    """The optimiser step of a ``checkpoint-<step>`` folder."""
    return int(Path(checkpoint).name.rsplit("-", 1)[1])


def final_checkpoint(run_dir: str | os.PathLike, status: dict[str, Any] | None = None) -> str | None:
    """The checkpoint a finished run (done or diverged) ended at, which its eval scores: ``final_checkpoint``
    in its status (a folder written before that key: ``checkpoint-<step>``); None while it has not finished.
    ``status``: the run's, when already read."""
    status = read_status(run_dir) if status is None else status
    if status.get("state") not in ("done", "diverged"):
        return None
    return status.get("final_checkpoint") or (f"checkpoint-{status['step']}" if status.get("step") else None)


def evaluated_checkpoints(run_dir: str | os.PathLike) -> list[str]:
    """The checkpoints of a run that have eval results (under any eval settings), oldest first."""
    names = {p.parent.name for p in (Path(run_dir) / EVAL_DIR).glob("*/*/results.json")}
    return sorted(names, key=checkpoint_order)


def checkpoint_order(name: str) -> tuple[int, str]:
    """Sort key of checkpoint names by step (``step-0`` and other names first): checkpoint-2 before -10."""
    return (checkpoint_step(name) if name.rsplit("-", 1)[-1].isdigit() else -1, name)


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


def sweep_runs(sweep_dir: str | os.PathLike) -> list[Path]:
    """The run folders of a sweep (``run_dirs``); ``UserError`` when it has none: the folder is not a sweep's
    (``klsweep status /``), or nothing was launched in it."""
    dirs = run_dirs(sweep_dir)
    if not dirs:
        raise UserError(
            Problem(
                str(sweep_dir),
                "has no runs (no sub-folder with a config.yaml)",
                "a sweep folder: plan and launch it with `klsweep run`",
            ),
            title="no runs",
        )
    return dirs


def _grid_name(path: Path) -> str | None:
    """The ``name:`` of a grid file, or None when it cannot be read as one."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text()[:1_000_000])
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def resolve_sweep(
    sweep: str | os.PathLike, results_root: str | os.PathLike = "results", *, rehearsal: bool = False
) -> Path:
    """A sweep folder, or the name of one under ``results_root``; UserError if neither exists, or when it is a
    rehearsal's (``refuse_rehearsal``) unless ``rehearsal``."""
    p, q = Path(sweep), Path(results_root) / str(sweep)
    for candidate in (p, q):
        if candidate.is_dir():
            if not rehearsal:
                refuse_rehearsal(candidate)
            return candidate
    root = Path(results_root)
    known = sorted(d.name for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
    if p.is_file() and p.suffix in (".yaml", ".yml"):
        name = _grid_name(p)
        use = f"the sweep name {name}" if name else "its sweep's name (its name: key)"
        raise UserError(
            Problem(
                str(sweep), f"that is a grid file: use {use}", ", ".join(known) or "a sweep folder's name"
            ),
            title="not a sweep",
        )
    raise UserError(
        Problem(
            str(sweep),
            f"no such sweep folder: no run of it was launched here (neither {p} nor {q} exists)",
            ", ".join(known) if known else "a sweep folder made by `klsweep run GRID` (its name: key)",
        ),
        title="no such sweep",
    )


def rehearsals_in(folder: str | os.PathLike) -> list[Path]:
    """The folders that ``klsweep rehearse`` marked (``REHEARSAL_MARKER``) among ``folder`` (a sweep or a run
    folder), the folder it is in, and its run folders."""
    folder = Path(folder)
    near = [folder, folder.parent, *run_dirs(folder)] if folder.is_dir() else [folder.parent]
    return [p for p in near if (p / REHEARSAL_MARKER).is_file()]


def refuse_rehearsal(folder: str | os.PathLike) -> None:
    """``UserError`` when ``folder`` is, lies in or holds a rehearsal (``rehearsals_in``): its runs are
    stand-in models trained a few steps, never a sweep's results, whatever their state says."""
    marked = rehearsals_in(folder)
    if not marked:
        return
    folder, rehearsal = Path(folder), marked[0]
    where = {folder: "is", folder.parent: "lies in"}.get(rehearsal, f"holds ({rehearsal.name})")
    raise UserError(
        Problem(
            str(folder),
            f"{where} a rehearsal (`klsweep rehearse`: stand-in models, a few steps), not a sweep's results",
            f"a sweep folder made by `klsweep run`; remove the rehearsal (rm -r {rehearsal}) "
            "or use another --out",
        ),
        title="a rehearsal is not a sweep",
    )


def _existing(path: str | os.PathLike) -> Path:
    """``path``, or its nearest ancestor that exists."""
    p = Path(path).absolute()
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def not_a_folder(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` cannot be (or become) a folder: a file is there or on the way; None when it can."""
    p = _existing(folder)
    if p.is_dir():
        return None
    on_the_way = f" (on the way to {folder})" if p != Path(folder).absolute() else ""
    return f"{p} is a file, not a folder{on_the_way}"


def check_writable(folder: str | os.PathLike, where: str, todo: str) -> None:
    """``UserError`` (located at ``where``, saying ``todo``) unless files can be written in ``folder``, or in the
    folder it would be created in. Tries it: permission bits, read-only mounts and a file in the way all count."""
    what = not_a_folder(folder)
    if what is not None:
        raise UserError(Problem(where, what, todo), title="cannot write there")
    p = _existing(folder)
    try:
        with tempfile.TemporaryFile(dir=p):
            pass
    except OSError as e:
        raise UserError(
            Problem(where, f"cannot write in {p}: {e.strerror or e}", todo), title="cannot write there"
        ) from e


def cache_dir() -> Path:
    """klsweep's cache of derived, rebuildable files: ``$KLSWEEP_CACHE``, default ``~/.cache/klsweep``."""
    return Path(os.environ.get("KLSWEEP_CACHE", "~/.cache/klsweep")).expanduser()


# --- the training lock: one process trains a run at a time ----------------------------------------------------

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
            print(f"klsweep warning: {path}: no lock (no flock on this file system); training unlocked",
                  file=sys.stderr, flush=True)  # fmt: skip
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


# --- the results root: klsweep writes only inside it ----------------------------------------------------------


def links_out(root: str | os.PathLike, folders: list[Path]) -> list[Problem]:
    """A problem for each symbolic link that leads out of ``root`` among ``folders`` and the files and folders
    directly in them (a run folder, its checkpoints/, its metrics.jsonl ...): klsweep writes only inside the
    results folder."""
    real_root = Path(os.path.realpath(root))
    links = []
    for folder in folders:
        if folder.is_symlink():
            links.append(folder)
        if folder.is_dir():
            links += [p for p in sorted(folder.iterdir()) if p.is_symlink()]
    problems = []
    for p in links:
        real = Path(os.path.realpath(p))
        if real != real_root and real_root not in real.parents:
            problems.append(
                Problem(
                    str(p),
                    f"leads out of {root} (a symbolic link to {real}): klsweep writes only inside it",
                    f"a plain file or folder inside {root}: remove the link (move what it leads to there)",
                )
            )
    return problems


def drop_incomplete_checkpoints(run_dir: str | os.PathLike) -> None:
    """Remove the run's checkpoints whose save did not finish (no ``TRAINER_STATE``, the file a save writes
    last; a resume never reads them): after a failed save (a full disk), the space it took, so that the failure can be
    recorded."""
    import shutil

    d = Path(run_dir) / CHECKPOINTS_DIR
    for c in d.glob("checkpoint-*") if d.is_dir() else []:
        if c.is_dir() and not (c / TRAINER_STATE).exists():
            shutil.rmtree(c, ignore_errors=True)


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
