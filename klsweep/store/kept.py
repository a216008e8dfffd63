"""Derived data kept under ``cache_dir()`` by a key (a hash of everything that decides it), as JSON, and read
back only when it is what was written for that key: a cache is never trusted. A kept file is one header line,
``{"key": KEY, "sha256": DIGEST}``, then the JSON of the value, whose SHA-256 is DIGEST. ``read`` gives None
(the caller computes the value again and ``keep`` writes it anew) for anything else: an absent file, one that is
not a regular file (a FIFO, which a plain ``open`` waits on for ever; a device; a symbolic link), one owned by
another user or writable by others (a shared ``KLSWEEP_CACHE``), one larger than ``KEPT_BYTES``, one kept for
another key, one whose content is not what its digest says (a flipped byte, a hand edit), one that is not JSON."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from klsweep.store.files import umask

KEPT_BYTES = (
    64 << 20
)  # the largest kept file read back (a composed config is ~10 KB, an override parse < 1 MB)


def key_of(*parts: str | bytes) -> str:
    """The key (SHA-256, hex) of ``parts``, each length-prefixed so that no two lists of parts share a key. A
    str is taken as UTF-8; UnicodeEncodeError for a str that is not text (a surrogate-escaped byte of argv):
    callers keep nothing for it."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(f"{len(data)}:".encode() + data)
    return h.hexdigest()


def read(path: Path, key: str) -> Any:
    """What ``keep(path, key, value)`` kept: the value, or None when the file is not exactly that (see the
    module's docstring). Never waits (a FIFO is opened without waiting and refused), never raises."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except (OSError, ValueError):  # absent, a symbolic link (ELOOP), unreadable, a NUL in the name
        return None
    try:
        st = os.fstat(fd)
        if not _ours(st) or st.st_size > KEPT_BYTES:
            return None
        chunks, left = [], KEPT_BYTES + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
    head, _, body = data.partition(b"\n")
    try:
        header = json.loads(head)
        if not isinstance(header, dict) or header.get("key") != key:
            return None
        if header.get("sha256") != hashlib.sha256(body).hexdigest():
            return None
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def keep(path: Path, key: str, value: Any) -> bool:
    """Keep ``value`` at ``path`` for ``key``, whole or not at all (a temporary file beside it, renamed over
    it), writable by this user only (its mode 0644 less the umask: ``read`` refuses a file others can write).
    False when it cannot be kept: a value JSON cannot hold, a read-only or full cache (computed again next
    time)."""
    try:
        body = json.dumps(value).encode()  # ASCII: a lone surrogate is written as its escape
    except (ValueError, TypeError, RecursionError):
        return False
    header = json.dumps({"key": key, "sha256": hashlib.sha256(body).hexdigest()}).encode()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        tmp = Path(name)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644 & ~umask())
            f.write(header + b"\n" + body)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return False
    return True


def _ours(st: os.stat_result) -> bool:
    """A regular file of this process's user that no one else can write."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022
