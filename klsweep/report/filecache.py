"""What the report read from its runs' files, kept beside the report so that the next report of an unchanged
sweep does not parse them again (``FileCache``): the runs' configs, their metrics and their per-problem
outcomes each have one. An item (a run's folder, an eval's folder) is kept under a key: the stat keys of the
files it was read from (``stat_key``: size, inode, change times) and whatever else its value depends on; the
cache as a whole under a version, the code that read it.

``stat_key`` needs nothing; numpy is imported when a cache is opened.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from klsweep import store

BACKGROUND_AT = 64  # items to read afresh before it pays to read some in a forked child (about 1 ms each)
# An item's value: what it holds besides arrays (JSON: a reason it cannot be read, notes, a parsed config) and
# its numpy arrays by name (int64 or float64, any shape).
Value = tuple[Any, dict[str, Any]]


def stat_key(path: Path) -> list[int] | None:
    """What tells a cache that a file changed: its size, inode and change times (None: it cannot be stat'ed)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


class FileCache:
    """Values read from files, one per item, kept in one ``.npz``: an index (JSON: per item its key, what it
    holds besides arrays and where its arrays lie) and one flat array per dtype. An item whose key changed, or a
    cache that is missing, damaged (however: cut short, a byte flipped, a header that lies), of the wrong shape
    or of another version, is read afresh; the file is rewritten (atomically) when anything was read afresh or
    left out; a results folder one cannot write to goes without. ``path`` None: nothing kept (every item
    read)."""

    def __init__(self, path: Path | None, version: str) -> None:
        self.path, self.version = path, version
        self.items: dict[str, Any] = {}
        self.pools: dict[str, Any] = {}
        self.seen: dict[str, tuple[Any, Value]] = {}
        self.fresh = False
        self.keep = True

    def __enter__(self) -> FileCache:
        import numpy as np

        if self.path is not None and self.path.is_file():
            try:
                with np.load(self.path, allow_pickle=False) as z:
                    index = json.loads(bytes(z["index"]).decode())
                    if index.get("version") == self.version and isinstance(index.get("items"), dict):
                        self.items = index["items"]
                        self.pools = {k: z[k] for k in z.files if k != "index"}
            except Exception:
                # Damaged, or not an .npz: everything read afresh and the file rewritten. Whatever numpy and
                # zipfile raise on it (a file cut short or one byte flipped: BadZipFile, a CRC error; a header
                # declaring 10^12 elements: MemoryError; ValueError, EOFError, OSError ...): a cache is only
                # ever a copy of what the runs' files hold, so nothing in it is worth a failed report.
                self.items, self.pools = {}, {}
        return self

    def read(
        self,
        items: Sequence[Path],
        keys: Sequence[Any],
        reader: Callable[[Path], Value],
        *,
        valid: Callable[[Value], bool] = lambda value: True,
        child_share: float = 0.5,
    ) -> Callable[[], list[Value]]:
        """Start reading ``items`` (each under its key; None: not kept, always read); returns the call that gives
        each one's value in order. The cache's values under the same key that pass ``valid`` are used; the
        others are read by ``reader`` (a list of items -> their values): when there are ``BACKGROUND_AT`` or
        more, ``child_share`` of them in a forked child (``background.in_background``) while the caller goes
        on, the rest by the call."""
        from klsweep.report.background import in_background

        names = [str(p.absolute()) for p in items]
        keys = [json.loads(json.dumps(k)) for k in keys]  # as the index holds it: lists, not tuples
        out: list[Value | None] = [
            self._get(name, key, valid) if key is not None else None
            for name, key in zip(names, keys, strict=True)
        ]
        afresh = [i for i, value in enumerate(out) if value is None]
        todo = [items[i] for i in afresh]
        split = int(len(todo) * child_share) if len(todo) >= BACKGROUND_AT else 0
        child = in_background(_each, reader, todo[:split], fork=split > 0)

        def wait() -> list[Value]:
            mine = _each(reader, todo[split:])
            for i, value in zip(afresh, [*child(), *mine], strict=True):
                out[i], self.fresh = value, True
            for name, key, value in zip(names, keys, out, strict=True):
                if key is not None:
                    self.seen[name] = (key, value)
            return out  # type: ignore[return-value]  # every None was read above

        return wait

    def discard(self) -> None:
        """Keep nothing of this report (its items cannot be reported: no cache for them)."""
        self.keep = False

    def _get(self, name: str, key: Any, valid: Callable[[Value], bool]) -> Value | None:
        entry = self.items.get(name)
        try:
            if not isinstance(entry, dict) or entry.get("key") != key:
                return None
            arrays = {
                a: self.pools[dtype][start : start + _size(shape)].reshape(shape)
                for a, (dtype, start, shape) in entry["at"].items()
            }
            value = (entry.get("meta"), arrays)
            return value if valid(value) else None
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def __exit__(self, *exc: object) -> None:
        import numpy as np

        changed = self.fresh or self.seen.keys() != self.items.keys()
        if self.path is None or exc[0] is not None or not self.keep or not changed:
            return
        items, pools, start = {}, {}, {}
        for name, (key, (meta, arrays)) in self.seen.items():
            at = {}
            for a, array in arrays.items():
                array = np.asarray(array)
                dtype = array.dtype.name
                at[a] = [dtype, start.get(dtype, 0), list(array.shape)]
                pools.setdefault(dtype, []).append(array.ravel())
                start[dtype] = start.get(dtype, 0) + array.size
            items[name] = {"key": key, "meta": meta, "at": at}
        index = np.frombuffer(json.dumps({"version": self.version, "items": items}).encode(), dtype=np.uint8)
        buf = io.BytesIO()
        np.savez(buf, index=index, **{dtype: np.concatenate(parts) for dtype, parts in pools.items()})
        with contextlib.suppress(OSError):  # a results folder one cannot write to: read afresh next time
            store.atomic_write_text(self.path, buf.getvalue())


def _each(reader: Callable[[Path], Value], items: list[Path]) -> list[Value]:
    return [reader(item) for item in items]


def _size(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
