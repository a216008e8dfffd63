"""Folders that cannot be written to, for the tests of read-only and full disks (tests/ is on sys.path under
pytest). CI runs as root, whom mode bits do not stop: there a tmpfs is mounted (read-only, or tiny); elsewhere
a read-only folder is one of mode 0555, and a full disk cannot be made: the test is skipped, saying why. A
command run ``without_root_powers`` obeys permission bits even as root."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def _tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs as root here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """An empty folder at ``path`` that no one can write to."""
    if os.geteuid() == 0:
        with _tmpfs(path, "ro,size=64k") as p:
            yield p
        return
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o555)
    try:
        yield path
    finally:
        path.chmod(0o755)


@contextlib.contextmanager
def full_disk(path: Path, size: str = "64k") -> Iterator[Path]:
    """A folder at ``path`` on a filesystem of ``size`` (a tmpfs: root only; skipped otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a tmpfs, which only root can mount (CI runs as root)")
    with _tmpfs(path, f"size={size}") as p:
        yield p


def without_root_powers() -> list[str]:
    """A command prefix that makes root obey permission bits (as any user does), or [] when not root."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root, and no setpriv to drop CAP_DAC_OVERRIDE")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
