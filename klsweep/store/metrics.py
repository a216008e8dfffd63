"""metrics.jsonl read through one validator: every reader of a run's metrics (the report, ``klsweep status``, a
resume and with it the collapse rule of the resumed run, the rehearsal) gets the rows this module keeps and the
list of what it set aside, line by line, with the reason. The trainer appends the rows (``append_jsonl``); this
is for reading them.

The rules (docs/FAULTS.md, "Metrics rows"):

- A line is read with a bounded length (``MAX_LINE``; never the whole file into memory: a file of gigabytes of
  NUL bytes is skipped in chunks), must be JSON (UTF-8), nested no deeper than Python's JSON reader goes, and a
  JSON object; otherwise it is unreadable, skipped and counted. Blank lines are nothing. A last line with no
  newline that is not a JSON object is unfinished (a row being written, or cut short): left out, not counted
  (the report says which it is from the run's state); one that is a whole row is a row.
- ``step`` is a whole number (a JSON integer: not 8.5, ``true``, ``"six"``, null or NaN) from 1 to the run's
  steps (``train.steps``, when the reader knows it); otherwise the row is set aside.
- Steps go forward: a row whose step is not above the last row kept (a step written twice, or going
  backwards) is set aside, and the earlier row kept. A resume never writes such a row: it cuts the file just
  before its first row past the checkpoint it resumes from (``cut_metrics``) before the trainer appends again,
  so a file read here with a step going backwards was written by something else (a copy appended twice, a
  second writer, a hand), and keeping the earlier rows means one stray row cannot replace a run's curve.
- A value is a number (``Infinity`` is data: a diverged KL) or null (the trainer writes a non-finite number as
  null: "not logged"). One that is not (a string, ``true``, a list or object, an integer too large for a float)
  or is NaN is left out of its row, which is kept, and noted with its key and steps.

``scan`` applies the rules of a line alone; ``in_order`` those of a run's sequence of steps (its upper bound and
order), which the report applies after its cache of the first (``klsweep.report.data``); ``read`` both.
``last_row`` is ``klsweep status``'s: the last row kept of the file's last ``TAIL`` bytes, read as a file of its
own. ``notes`` says what was set aside, one line per reason.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from klsweep.store.files import open_regular
from klsweep.store.layout import METRICS_FILE

MAX_LINE = 1 << 20  # bytes of one line: a metrics row is a few hundred
SKIP = 1 << 22  # bytes read at a time past a line longer than MAX_LINE
TAIL = 1 << 16  # bytes at the end of the file that ``last_row`` reads
MAX_STEP = 1 << 53  # above any run's steps, and every step up to it exact as a float (the report's arrays)
SHOWN = 5  # lines named in a note, then "..."

# Why a line or a value is set aside (``Aside.kind``), in the order ``notes`` says them.
UNREADABLE = "unreadable"  # a line that is not a JSON object (detail: why)
BAD_STEP = (
    "step"  # a row whose step is not a whole number from 1 to the run's steps (detail: the step as written)
)
ORDER = "order"  # a row whose step does not go forward (detail: "3 after step 20", "20 again")
NOT_NUMBER = "not a number"  # a value left out of its row (detail: the key)
NAN = "NaN"  # a NaN left out of its row (detail: the key)
KINDS = (UNREADABLE, BAD_STEP, ORDER, NOT_NUMBER, NAN)
ROW_KINDS = (UNREADABLE, BAD_STEP, ORDER)  # the whole line set aside; the others: one value of a kept row


@dataclass(frozen=True)
class Aside:
    """One thing set aside: the line it is on, why (``kind``), what (``detail``), the row's step (value kinds)."""

    line: int
    kind: str
    detail: str
    step: int | None = None


@dataclass
class Metrics:
    """A metrics file as read: the rows kept (in file order, steps going forward, every value a number or
    None), the number of each one's line, what was set aside and the number of an unfinished last line."""

    path: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    aside: list[Aside] = field(default_factory=list)
    unfinished: int | None = None
    max_step: int | None = None

    def notes(self) -> list[str]:
        return notes(self.path, self.aside, self.max_step)


def metrics_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / METRICS_FILE


def scan(path: str | os.PathLike) -> Metrics:
    """The rows of ``path`` that pass the rules of a line alone (readable, a JSON object, a whole step from 1,
    its values numbers), in file order (``in_order`` not applied: a step may repeat). No file: no rows.
    ``UnreadableFile`` when it is not a regular file (``open_regular``)."""
    path = Path(path)
    out = Metrics(path)
    try:
        with open_regular(path) as f:
            for number, _, line, ended in _lines(f):
                _add(out, number, line, ended)
    except FileNotFoundError:
        pass
    return out


def read(path: str | os.PathLike, max_step: int | None = None) -> Metrics:
    """``scan`` then ``in_order``: the rows every reader but the report's cache uses. ``max_step``: the run's
    ``train.steps`` (None: not known, no upper bound but ``MAX_STEP``)."""
    out = scan(path)
    keep, order = in_order([r["step"] for r in out.rows], out.lines, max_step)
    return settle(out, keep, order, max_step)


def settle(scanned: Metrics, keep: Sequence[bool], order: list[Aside], max_step: int | None) -> Metrics:
    """``scanned`` with only the rows ``keep`` says (``in_order``), ``order`` (what it set aside) added, and the
    notes of values left out of rows that are gone dropped."""
    return Metrics(
        scanned.path,
        [r for r, k in zip(scanned.rows, keep, strict=True) if k],
        [n for n, k in zip(scanned.lines, keep, strict=True) if k],
        settled(scanned.aside, scanned.lines, keep, order),
        scanned.unfinished,
        max_step,
    )


def settled(
    aside: Sequence[Aside], lines: Sequence[int], keep: Sequence[bool], order: list[Aside]
) -> list[Aside]:
    """What ``scan`` set aside (``aside``; its rows' ``lines``) and what ``in_order`` did (``keep``, ``order``),
    in line order, without the values left out of rows that ``in_order`` set aside whole."""
    kept_lines = {int(n) for n, k in zip(lines, keep, strict=True) if k}
    out = [a for a in aside if a.kind in ROW_KINDS or a.line in kept_lines] + order
    return sorted(out, key=lambda a: a.line)


def in_order(
    steps: Sequence[Any], lines: Sequence[int], max_step: int | None
) -> tuple[list[bool], list[Aside]]:
    """Which rows of a run (their steps and line numbers, in file order, each step already a whole number from
    1) are kept: a step past ``max_step`` is set aside; so is one not above the last step kept (the earlier row
    kept). Also what was set aside."""
    keep: list[bool] = []
    aside: list[Aside] = []
    last = 0
    top = MAX_STEP if max_step is None else max_step
    for step, line in zip(steps, lines, strict=True):
        step = int(step)
        if step > top:
            keep.append(False)
            aside.append(Aside(int(line), BAD_STEP, str(step)))
        elif step <= last:
            keep.append(False)
            aside.append(
                Aside(int(line), ORDER, f"{step} again" if step == last else f"{step} after step {last}")
            )
        else:
            keep.append(True)
            last = step
    return keep, aside


def read_metrics(run_dir: str | os.PathLike, max_step: int | None = None) -> list[dict[str, Any]]:
    """The rows ``read`` keeps of a run's metrics.jsonl."""
    return read(metrics_path(run_dir), max_step).rows


def cut_metrics(run_dir: str | os.PathLike, step: int, max_step: int | None = None) -> Metrics:
    """Before a resume from the checkpoint of ``step``: cut a run's metrics.jsonl just before the first row
    ``read`` keeps past ``step`` (the trainer writes those again), or else before a last line with no newline
    that is not a row (unfinished, or too long: the rows appended next must begin a line of their own); a whole
    last row with no newline gets its newline. Every line before the cut stays as it is (what was set aside
    there is set aside again at each read). Returns what ``read`` gives of what is left."""
    path = metrics_path(run_dir)
    found = read(path, max_step)
    past = next((n for r, n in zip(found.rows, found.lines, strict=True) if r["step"] > step), None)
    cut_line, size, offset, cut, ended = past, 0, 0, None, True
    try:
        with open_regular(path) as f:
            for number, length, line, ended in _lines(f):
                if cut_line is None and not ended and (line is None or number == found.unfinished):
                    cut_line = number
                if number == cut_line:
                    cut = offset
                offset += length
            size = offset
    except FileNotFoundError:
        return found
    if cut is not None or not ended:
        with open(path, "r+b") as f:
            f.truncate(size if cut is None else cut)
            end = f.seek(0, os.SEEK_END)
            if end:
                f.seek(end - 1)
                if f.read(1) != b"\n":  # a whole last row written without its newline
                    f.write(b"\n")
            f.flush()
            os.fsync(f.fileno())
    if cut_line is None:
        return found
    keep = [n < cut_line for n in found.lines]
    left = Metrics(path, unfinished=None, max_step=max_step)
    left.rows = [r for r, k in zip(found.rows, keep, strict=True) if k]
    left.lines = [n for n, k in zip(found.lines, keep, strict=True) if k]
    left.aside = [a for a in found.aside if a.line < cut_line]
    return left


def last_row(path: str | os.PathLike, max_step: int | None = None) -> dict[str, Any] | None:
    """The last row ``read`` keeps of the file's last ``TAIL`` bytes (its first line there dropped when it
    begins before them), or None. ``UnreadableFile`` when it is not a regular file; None when it cannot be
    read."""
    path = Path(path)
    out = Metrics(path)
    try:
        with open_regular(path) as f:
            size = f.seek(0, os.SEEK_END)
            if size > TAIL:
                f.seek(size - TAIL - 1)
                if f.read(1) != b"\n":
                    f.readline(TAIL)  # the rest of a line that begins before the tail
            else:
                f.seek(0)
            for number, _, line, ended in _lines(f):
                _add(out, number, line, ended)
    except OSError:
        return None
    keep, _ = in_order([r["step"] for r in out.rows], out.lines, max_step)
    kept = [r for r, k in zip(out.rows, keep, strict=True) if k]
    return kept[-1] if kept else None


def _lines(f: BinaryIO) -> Iterator[tuple[int, int, bytes | None, bool]]:
    """Each line of ``f``: its number, its length in bytes (with its newline), its bytes (None when longer than
    ``MAX_LINE``: skipped in chunks, never held whole) and whether a newline ends it."""
    number = 0
    while chunk := f.readline(MAX_LINE + 1):
        number += 1
        ended = chunk.endswith(b"\n")
        if ended or len(chunk) <= MAX_LINE:
            yield number, len(chunk), chunk, ended
            continue
        rest, ended = _skip_line(f)
        yield number, len(chunk) + rest, None, ended


def _skip_line(f: BinaryIO) -> tuple[int, bool]:
    """Read past the rest of a line in blocks of ``SKIP`` bytes (a buffered ``readline`` goes 8 KiB at a time:
    3 GB of NUL bytes took 20 s), leaving ``f`` after its newline: the bytes skipped, and whether a newline
    ended it."""
    skipped = 0
    while block := f.read(SKIP):
        at = block.find(b"\n")
        if at >= 0:
            f.seek(at + 1 - len(block), os.SEEK_CUR)
            return skipped + at + 1, True
        skipped += len(block)
    return skipped, False


def _add(out: Metrics, number: int, line: bytes | None, ended: bool) -> None:
    """Line ``number`` read into ``out``: a row kept, or set aside with why, or an unfinished last line. (The
    report reads every row of every run through it, cold: one decoder, the values' checks inline.)"""
    if line is None:
        out.aside.append(Aside(number, UNREADABLE, f"longer than {MAX_LINE // (1 << 20)} MiB"))
        return
    try:
        row = _decode(line.decode())
    except RecursionError:
        row, why = None, "nested too deep"
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        if not line.strip():
            return
        row, why = None, "not JSON"
    else:
        why = "not a JSON object"
    if type(row) is not dict:
        if ended:
            out.aside.append(Aside(number, UNREADABLE, why))
        else:  # the last line, no newline: being written, or cut short
            out.unfinished = number
        return
    step = row.get("step")
    if type(step) is not int or not 1 <= step <= MAX_STEP:
        out.aside.append(Aside(number, BAD_STEP, "missing" if "step" not in row else _shown(step)))
        return
    values = row.values()
    if not set(map(type, values)) <= _NUMBERS or not _sum_is_a_number(values):  # else every value is a number
        for key, value in list(row.items()):
            kind = _value_problem(value)
            if kind is not None:
                del row[key]
                out.aside.append(Aside(number, kind, key, step))
    out.rows.append(row)
    out.lines.append(number)


_NUMBERS = {int, float}  # not bool: type(True) is bool


def _sum_is_a_number(values: Any) -> bool:
    """Whether the sum of ``values`` (ints and floats) is: no NaN among them, no int too large for a float (a
    false "no", such as Infinity + -Infinity, only sends the row through ``_value_problem``)."""
    try:
        total = sum(values)
    except OverflowError:
        return False
    return total == total


def _value_problem(value: Any) -> str | None:
    """Why a row's value is left out of it (``NOT_NUMBER``, ``NAN``), or None: a number (not a bool) that a
    float holds (the report's arrays), NaN excepted, or null."""
    t = type(value)
    if t is float:
        return NAN if value != value else None
    if t is int:
        try:
            float(value)
        except OverflowError:
            return NOT_NUMBER
        return None
    return None if value is None else NOT_NUMBER


_decode = json.JSONDecoder().decode  # NaN, Infinity: Python's json reads them (a NaN is then left out)


def _shown(value: Any) -> str:
    """A step as the file has it (JSON: true, null, "six", 1e+30, NaN)."""
    try:
        return json.dumps(value)[:40]
    except (TypeError, ValueError):
        return type(value).__name__


def notes(path: Path, aside: Sequence[Aside], max_step: int | None = None) -> list[str]:
    """What was set aside of ``path``, one line per reason (a value left out: per key), each naming its lines
    (or steps) and what to make of it."""
    out: list[str] = []
    by_kind = {k: [a for a in aside if a.kind == k] for k in KINDS}
    if found := by_kind[UNREADABLE]:
        why = ", ".join(dict.fromkeys(a.detail for a in found))
        out.append(
            f"{path}: {len(found)} unreadable line(s) skipped (line {_list(a.line for a in found)}): {why}; "
            "the other rows are reported"
        )
    if found := by_kind[BAD_STEP]:
        top = "the run's steps" if max_step is None else f"{max_step} (the run's steps)"
        out.append(
            f"{path}: {len(found)} row(s) set aside, their step not a whole number from 1 to {top}: "
            f"{_list(f'line {a.line} (step {a.detail})' for a in found)}; the other rows are reported"
        )
    if found := by_kind[ORDER]:
        out.append(
            f"{path}: {len(found)} row(s) set aside, their step not after the step before (a step written "
            f"again, or going backwards; the earlier row is kept): "
            f"{_list(f'line {a.line} (step {a.detail})' for a in found)}; the other rows are reported"
        )
    for kind in (NOT_NUMBER, NAN):
        keys: dict[str, list[Aside]] = {}
        for a in by_kind[kind]:
            keys.setdefault(a.detail, []).append(a)
        for key, found in keys.items():
            steps = _list(a.step for a in found)
            if (
                kind == NAN
            ):  # the trainer writes a non-finite number as null: a NaN is a hand's or another writer's
                out.append(
                    f"{path}: {key!r} is NaN in {len(found)} row(s) (step {steps}): left out as not logged "
                    "there; the curves, peaks and finals are of the other rows"
                )
            else:
                out.append(
                    f"{path}: {key!r} not a number in {len(found)} row(s) (step {steps}): left out as not "
                    "logged there; the curves, peaks and finals are of the other rows"
                )
    return out


def _list(items: Any) -> str:
    items = [str(i) for i in items]
    return ", ".join(items[:SHOWN]) + (", ..." if len(items) > SHOWN else "")
