"""The environment a run trained in, recorded in its folder (``env.json``) at every training start, so a sweep's
report shows which machines and package versions its numbers come from (``report/``: the Environment section).

``record(run_dir)`` writes ``describe()``: Python and the versions of the packages that decide the numbers
(``PACKAGES``), torch's intra-op threads and ``OMP_NUM_THREADS``, the CPU model (``/proc/cpuinfo``) and the
CPU kernels torch dispatches to (``klsweep.PORTABLE_CPU_KERNELS``), the GPU
name (None without CUDA), klsweep's version and git commit (None when it is not installed from a git
checkout), and the hostname. Every value is a string, an int or None.
"""

from __future__ import annotations

import math
import os
import platform
import socket
import subprocess
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from klsweep import store

# distribution names whose versions are recorded (key: the name shown)
PACKAGES = {
    "torch": "torch",
    "transformers": "transformers",
    "trl": "trl",
    "accelerate": "accelerate",
    "datasets": "datasets",
    "lm-eval": "lm_eval",
    "numpy": "numpy",
}
KEYS = (
    "python",
    *PACKAGES,
    "torch threads",
    "OMP_NUM_THREADS",
    "cpu",
    "cpu kernels",
    "gpu",
    "klsweep",
    "git commit",
    "hostname",
)


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity mask (Slurm's binding, a cpuset), else the machine's
    count; at most its cgroup's CPU quota, rounded up (``cpu_quota``: ``docker --cpus``, a systemd CPUQuota)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(cores, quota)) if quota is not None else cores


def cpu_quota(cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The CPUs this process's cgroup may use at once, rounded up: the quota over the period, the tightest of
    its cgroup and the cgroups above it; cgroup v2's ``cpu.max`` and v1's ``cpu.cfs_quota_us`` (the cpu
    controller's hierarchy, as older Docker and Slurm hosts mount it); None without a limit or a cgroup."""
    try:
        lines = cgroup.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers = parts[1].split(",") if parts[1] else []
        if not controllers:  # v2: "0::/path", every controller in one tree
            limits += _limits_up(root, parts[2], _v2_limit)
        elif "cpu" in controllers:  # v1: "4:cpu,cpuacct:/path", mounted as cpu,cpuacct (and often cpu)
            mount = root / parts[1] if (root / parts[1]).is_dir() else root / "cpu"
            limits += _limits_up(mount, parts[2], _v1_limit)
    return min(limits) if limits else None


def _limits_up(mount: Path, path: str, limit: Callable[[Path], int | None]) -> list[int]:
    """``limit(folder)`` of the cgroup at ``path`` under ``mount`` and of each cgroup above it, where set."""
    limits = []
    folder = mount / path.strip().lstrip("/")
    while True:
        try:
            found = limit(folder)
        except (OSError, ValueError):
            found = None
        if found is not None:
            limits.append(found)
        if folder == mount or mount not in folder.parents:
            return limits
        folder = folder.parent


def _v2_limit(folder: Path) -> int | None:
    quota, period = (folder / "cpu.max").read_text().split()
    return None if quota == "max" else math.ceil(int(quota) / int(period))


def _v1_limit(folder: Path) -> int | None:
    quota = int((folder / "cpu.cfs_quota_us").read_text())
    period = int((folder / "cpu.cfs_period_us").read_text())
    return None if quota <= 0 else math.ceil(quota / period)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpuinfo(field: str) -> str | None:
    """The first ``field`` of /proc/cpuinfo (``model name``, ``vendor_id``), or None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_model() -> str | None:
    return _cpuinfo("model name") or platform.processor() or None


def cpu_vendor() -> str | None:
    """The CPU's vendor (``GenuineIntel``, ``AuthenticAMD``), or None. Part of what a CPU run's numbers depend
    on: MKL picks its code paths by vendor too, AVX2 pinned or not (docs/DESIGN.md, "Reproducible across
    CPUs")."""
    return _cpuinfo("vendor_id")


def _git_commit() -> str | None:
    """The commit of the checkout klsweep is imported from, or None (an installed wheel, no git)."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def describe() -> dict[str, Any]:
    """This process's environment (``KEYS``)."""
    import torch

    import klsweep

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "python": platform.python_version(),
        **{name: _version(dist) for name, dist in PACKAGES.items()},
        "torch threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "cpu": _cpu_model(),
        "cpu kernels": torch.backends.cpu.get_cpu_capability(),
        "gpu": gpu,
        "klsweep": klsweep.__version__,
        "git commit": _git_commit(),
        "hostname": socket.gethostname(),
    }


def record(run_dir: str | Path) -> dict[str, Any]:
    """Write ``describe()`` to ``<run_dir>/env.json`` and return it."""
    env = describe()
    store.write_json(Path(run_dir) / store.ENV_FILE, env)
    return env
