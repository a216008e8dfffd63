"""A run's checkpoints: which there are, whether one is whole (weights, trainer state, a safetensors header
that reads), the newest usable, one cut short set aside, where a run ended (``FINAL_MARKER``) and whether that
one is still there (``stale_end``), which were evaluated."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from klsweep.store.files import read_json, read_status
from klsweep.store.layout import CHECKPOINTS_DIR, EVAL_DIR, HF_WEIGHTS, TRAINER_STATE, UNUSABLE_PREFIX


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


def unreadable_weights(checkpoint: str | os.PathLike) -> str | None:
    """Why this process cannot read a weights file of ``checkpoint`` (``model*.safetensors``,
    ``pytorch_model*.bin`` and their indexes), in words, or None: a permission problem (a colleague's
    checkpoint saved 0600), which safetensors reports as a missing file. Opens each one, reading nothing."""
    folder = Path(checkpoint)
    names = (
        "model*.safetensors",
        "model.safetensors.index.json",
        "pytorch_model*.bin",
        "pytorch_model.bin.index.json",
    )
    for path in sorted({p for name in names for p in folder.glob(name) if p.is_file()}):
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        except PermissionError:
            st = path.stat()
            return (
                f"{folder.name}/{path.name} cannot be read: permission denied (mode {stat.S_IMODE(st.st_mode):04o}, owner uid "
                f"{st.st_uid}, group {st.st_gid}; this process: uid {os.geteuid()}): its owner can make it "
                f"readable (chmod g+r, or a+r)"
            )
    return None


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


def stale_end(
    run_dir: str | os.PathLike, status: dict[str, Any] | None = None
) -> tuple[str, Path | None] | None:
    """A done run that is not done after all: its final checkpoint (``final_checkpoint``) is gone or not whole
    (no config.json, a file cut short: ``checkpoint_problem``) and was never scored (its results, under any
    eval settings, keep what the run ended as: a sweep whose checkpoints were removed once evaluated stays
    done). Returns what is wrong, in words, and the newest usable checkpoint to train it again from (None:
    none is left); None when the run is done, or not done by its status. ``status``: the run's, when already
    read. (A diverged run is a result where it diverged, whatever is left of its checkpoints.)"""
    status = read_status(run_dir) if status is None else status
    final = final_checkpoint(run_dir, status) if status.get("state") == "done" else None
    if final is None or final in evaluated_checkpoints(run_dir):
        return None
    folder = Path(run_dir) / CHECKPOINTS_DIR / final
    if not folder.is_dir():
        problem = f"its final checkpoint {final} is gone"
    elif not (folder / "config.json").is_file():
        problem = f"its final checkpoint {final} is not whole (no config.json)"
    elif unreadable_weights(folder) is not None:  # whole as far as can be told: its eval says why it fails
        return None
    elif (broken := checkpoint_problem(folder)) is not None:
        problem = f"its final checkpoint {final} is not whole ({broken})"
    else:
        return None
    found = [c for c in checkpoints(run_dir) if c.name != final and (c / TRAINER_STATE).is_file()]
    return problem, newest_usable(found)[0]


def evaluated_checkpoints(run_dir: str | os.PathLike) -> list[str]:
    """The checkpoints of a run that have eval results (under any eval settings), oldest first."""
    names = {p.parent.name for p in (Path(run_dir) / EVAL_DIR).glob("*/*/results.json")}
    return sorted(names, key=checkpoint_order)


def checkpoint_order(name: str) -> tuple[int, str]:
    """Sort key of checkpoint names by step (``step-0`` and other names first): checkpoint-2 before -10."""
    return (checkpoint_step(name) if name.rsplit("-", 1)[-1].isdigit() else -1, name)


def drop_incomplete_checkpoints(run_dir: str | os.PathLike) -> None:
    """Remove the run's checkpoints whose save did not finish (no ``TRAINER_STATE``, the file a save writes
    last; a resume never reads them): after a failed save (a full disk), the space it took, so that the failure can be
    recorded."""
    import shutil

    d = Path(run_dir) / CHECKPOINTS_DIR
    for c in d.glob("checkpoint-*") if d.is_dir() else []:
        if c.is_dir() and not (c / TRAINER_STATE).exists():
            shutil.rmtree(c, ignore_errors=True)
