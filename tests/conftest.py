"""Shared test setup: everything offline, W&B offline; tests marked ``slurm`` need the local Slurm cluster
(``bash slurm/start.sh``): skipped where there is no ``sbatch``, except under CI=true, where they must run. Tests
marked ``vllm`` need vLLM (``./dev.sh vllm-test`` runs them in ``.venv-vllm``): skipped where it cannot be imported,
except under CI=true, where they fail."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

# tests/unit/ and tests/integration/ import the shared helpers beside this file (clitools, runfiles, ...)
sys.path.insert(0, str(Path(__file__).parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tests' own Hugging Face caches (never the user's): offline, plan/run/eval check them (klsweep.fetch), so they
# hold what the shipped paper grid loads, tiny (tests/hubcache.py, filled once per session: hf_caches)
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="klsweep-tests-hf-")
os.environ.pop("HF_HUB_CACHE", None)
os.environ.pop("HF_DATASETS_CACHE", None)

# Ctrl-C as a terminal sends it: a test suite started in the background of a shell without job control (`cmd &`,
# nohup: a CI runner) inherits SIGINT ignored, and so would every command a test starts (an ignored signal stays
# ignored across exec), where Python then never raises KeyboardInterrupt: the Ctrl-C tests (test_launcher,
# test_reliability) saw exit 0 for 130. Caught here, it is the default again in the commands the tests start.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The local test cluster's config, when it runs here and the caller did not source its env.sh.
if "SLURM_CONF" not in os.environ and Path("/tmp/klsweep-slurm/slurm.conf").exists():
    os.environ["SLURM_CONF"] = "/tmp/klsweep-slurm/slurm.conf"


@pytest.fixture(scope="session", autouse=True)
def hf_caches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's HF_HOME, holding the paper grid's models (tiny random ones) and datasets (a row each)."""
    from hubcache import populate

    from klsweep.tinymodel import random_tiny_model

    home = Path(os.environ["HF_HOME"])
    tmp = tmp_path_factory.mktemp("hf-sources")
    populate(home, random_tiny_model(tmp / "model"), tmp)
    return home


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import importlib.util

    if os.environ.get("CI") == "true":
        return
    if importlib.util.find_spec("vllm") is None:
        no_vllm = pytest.mark.skip(reason="vllm cannot be imported here (./dev.sh vllm-test runs these)")
        for item in items:
            if item.get_closest_marker("vllm") is not None:
                item.add_marker(no_vllm)
    if shutil.which("sbatch") is not None:
        return
    skip = pytest.mark.skip(reason="no Slurm here (bash slurm/install.sh && bash slurm/start.sh)")
    for item in items:
        if "slurm" in item.keywords:
            item.add_marker(skip)


# Where a run's time goes, per tier (tests/unit, tests/peer, tests/integration, ...): every phase of every test
# (set-up, call, tear-down, module fixtures included), summed under the first folder below tests/, printed after
# pytest's own --durations list (CI's log, issue 48).
_TIER_SECONDS: dict[str, float] = {}
_TIER_TESTS: dict[str, int] = {}


def tier(nodeid: str) -> str:
    """The tier of a test id: the folder below tests/ (``unit`` for tests/unit/test_x.py::test), else its
    first folder, else its file."""
    parts = nodeid.split("::", 1)[0].split("/")
    if parts[0] == "tests" and len(parts) > 2:
        return parts[1]
    return parts[0]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    name = tier(report.nodeid)
    _TIER_SECONDS[name] = _TIER_SECONDS.get(name, 0.0) + report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _TIER_TESTS[name] = _TIER_TESTS.get(name, 0) + 1


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _TIER_SECONDS:
        return
    terminalreporter.write_sep("=", "time per tier (set-up, call and tear-down of every test)")
    for name, seconds in sorted(_TIER_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{name:<14} {seconds:9.1f} s  {_TIER_TESTS.get(name, 0):5d} tests")
    terminalreporter.write_line(f"{'all':<14} {sum(_TIER_SECONDS.values()):9.1f} s")
