"""The environment a run trained in, recorded in its folder (``env.json``) at every training start, so a sweep's
report shows which machines and package versions its numbers come from (``report/``: the Environment section).

``record(run_dir)`` writes ``describe()`` (``bug_report()``: the same, for ``klsweep env``, less the hostname and
with a few more facts a bug report needs): Python and the versions of the packages that decide the numbers
(``PACKAGES``), torch's intra-op threads and ``OMP_NUM_THREADS``, the CPU model (``/proc/cpuinfo``) and the
CPU kernels torch dispatches to (``klsweep.PORTABLE_CPU_KERNELS``), the GPU
name (None without CUDA), klsweep's version and git commit (None when it is not installed from a git
checkout), and the hostname. Every value is a string, an int or None.
"""

from __future__ import annotations

import contextlib
import gc
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


def use_cpu_threads(n: int) -> None:
    """On a machine without CUDA, ``n`` intra-op threads for torch (at least 1): its default is every core the
    process may run on, so jobs that share a machine (local workers, local eval jobs) oversubscribe it, and a
    small model runs several times slower (two eval jobs of the tiny study on 2 cores: 2.4 s an eval against
    0.9 s). The numbers are the same: the tiny model's greedy evals gave the same samples on 1 and 2 threads."""
    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, n))


@contextlib.contextmanager
def frozen_heap():
    """What is alive on entry is left out of Python's cyclic collections until the block ends (``gc.freeze``):
    a warm worker's heap (torch, transformers, TRL, lm-eval: ~500,000 objects) is scanned by every full
    collection, the one transformers' trainer runs at the end of training and lm-eval's model freed after each
    eval included; each run's own garbage is still collected, and what was frozen is back in the collector's
    care on exit. Nothing is done when the caller froze the heap already (theirs to unfreeze), and a freeze
    made inside the block is left as it is (theirs too): vLLM's engine freezes the heap when it starts and
    unfreezes it when it shuts down, and an unfreeze here would hand a run's engine, still alive, to the
    collector, whose finaliser tears down vLLM's process groups under the next engine, half built."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    mark: list[Any] = []  # made after the freeze: out of every generation on exit only if frozen again inside
    try:
        yield
    finally:
        if not gc.get_freeze_count() or any(o is mark for g in range(3) for o in gc.get_objects(g)):
            gc.unfreeze()


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


# what a bug report needs beyond ``describe`` (``klsweep env``): the engines' versions, the OS, the CPU's vendor,
# where klsweep is imported from; not the hostname
REPORT_PACKAGES = {"vllm": "vllm", "hydra-core": "hydra-core", "submitit": "submitit"}


def bug_report() -> dict[str, Any]:
    """``klsweep env``: this environment as a bug report needs it (as ``trl env`` says TRL's), from ``describe``
    (the one source of what a run records in env.json) less the hostname, with the OS, the CPU's vendor, the
    versions of vLLM, Hydra and submitit (None: not installed), where klsweep is imported from and the packages
    not at the version of klsweep's lock (``lock_drift``)."""
    import klsweep

    env = describe()
    more = {name: _version(dist) for name, dist in REPORT_PACKAGES.items()}
    out: dict[str, Any] = {"platform": platform.platform()}
    for key, value in env.items():
        if key == "hostname":
            continue
        out[key] = value
        if key == list(PACKAGES)[-1]:  # after the recorded packages, the engines'
            out.update(more)
        if key == "cpu":
            out["cpu vendor"] = cpu_vendor()
    out["klsweep location"] = str(Path(klsweep.__file__).parent)
    drift = lock_drift()
    out["not at the locked version"] = (
        ", ".join(f"{n} {have} (lock {want})" for n, have, want in drift) if drift else "none"
    )
    return out


LOCK = (
    Path(__file__).parent / "requirements.lock"
)  # the repository's requirements.lock, shipped in the package


def lock_drift(lock: Path = LOCK) -> list[tuple[str, str, str]]:
    """The packages of klsweep's lock installed at another version: (name, installed version, locked version).
    Packages not installed are not counted (the lock holds the test tools too); torch is not in the lock
    (installed first, its CPU or CUDA build)."""
    if not lock.is_file():
        return []
    out = []
    for line in lock.read_text().splitlines():
        name, sep, locked = line.partition("==")
        if not sep or line.startswith("#"):
            continue
        installed = _version(name.strip())
        if installed is not None and installed != locked.strip():
            out.append((name.strip(), installed, locked.strip()))
    return out


def record(run_dir: str | Path) -> dict[str, Any]:
    """Write ``describe()`` to ``<run_dir>/env.json`` and return it."""
    env = describe()
    store.write_json(Path(run_dir) / store.ENV_FILE, env)
    return env
