"""The framework presets (``klsweep/conf/preset/NAME.yaml``): each one a framework's KL configuration as it is
(its version and file are cited in the YAML), usable as a grid's ``preset`` axis and by ``klsweep audit
--preset``. docs/KL.md, "What each framework's KL does", has their audits.

``names()`` lists them, ``kl_config(name)`` is one as a ``klsweep.kl.KLConfig`` (the preset's ``kl.*`` over
``RunConfig``'s defaults), ``resolve`` checks names (``all``: every one) and ``name_of`` finds the preset a
run's KL settings are (the report labels its audit rows with it); ``SOURCES`` says how each one was proven to be
its framework's code (executed or transcribed: tests/peer/)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.errors import Problem, UserError

if TYPE_CHECKING:
    from klsweep.kl import KLConfig

PRESET_DIR = Path(__file__).parent / "conf" / "preset"

# How each preset was proven to be its framework's KL (docs/KL.md, "What each framework's KL does"): executed,
# the framework's own function from its published package run beside the preset on float64 inputs that hit
# every clamp (tests/peer/test_executed.py; TRL's trainer in tests/integration/test_presets.py), value and
# gradient within 1e-6; transcribed, the framework's lines copied verbatim into tests/peer/test_transcribed.py
# (no wheel has the commit cited) and run the same way; own, klsweep's configuration.
CHECKED = ("executed", "transcribed", "own")
SOURCES: dict[str, tuple[str, str]] = {
    "areal": ("executed", "areal 1.0.4: areal/utils/data.py KLEstimator"),
    "nemo": ("transcribed", "NVIDIA-NeMo/RL 7ea279a: nemo_rl/algorithms/utils.py:42-101, loss/loss_functions.py:477-503"),
    "nemo-onpolicy": ("transcribed", "NVIDIA-NeMo/RL 7ea279a: as nemo"),
    "openrlhf": ("executed", "openrlhf 0.11.2: openrlhf/models/utils.py compute_approx_kl"),
    "openrlhf-unbiased": ("executed", "openrlhf 0.11.2: openrlhf/models/utils.py compute_approx_kl"),
    "paper": ("own", "arXiv 2512.21852: k1 in the reward"),
    "pipelinerl": ("transcribed", "ServiceNow/PipelineRL 58d3934: pipelinerl/finetune/rl/__init__.py:119-133, 280-293"),
    "skyrl": ("executed", "skyrl 0.4.0: skyrl/backends/skyrl_train/utils/ppo_utils.py compute_approx_kl"),
    "slime": ("transcribed", "THUDM/slime 624b824: slime/utils/ppo_utils.py:12-51"),
    "slime-unbiased": ("transcribed", "THUDM/slime 624b824: slime/utils/ppo_utils.py:12-51, backends/megatron_utils/loss.py:1116-1127"),
    "trl": ("executed", "trl 1.16.0: GRPOTrainer._compute_loss (tests/integration/test_presets.py)"),
    "trl-sequence": ("executed", "trl 1.16.0: GRPOTrainer._compute_loss (tests/integration/test_presets.py)"),
    "verl": ("executed", "verl 0.9.1: verl/trainer/ppo/core_algos.py kl_penalty"),
    "verl-k3plus": ("executed", "verl 0.9.1: verl/trainer/ppo/core_algos.py kl_penalty"),
}  # fmt: skip


def names() -> tuple[str, ...]:
    """Every preset's name, sorted."""
    return tuple(sorted(p.stem for p in PRESET_DIR.glob("*.yaml")))


def kl_settings(name: str) -> dict[str, Any]:
    """The ``kl.*`` keys a preset sets (``kl.`` left off), as its YAML has them."""
    return dict(_settings(name))


@functools.cache
def _settings(name: str) -> tuple[tuple[str, Any], ...]:
    """``kl_settings``, read once per process (the report labels every configuration with ``name_of``, which
    compares it with every preset: reading the YAMLs each time was most of a warm report's time)."""
    import yaml

    text = (PRESET_DIR / f"{name}.yaml").read_text()
    if "${" in text:  # an interpolation: Hydra's reading of the group file (OmegaConf, some 50 ms to import)
        from omegaconf import OmegaConf

        data = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    else:  # plain YAML: the same values (tests/unit/test_preset_math.py), without OmegaConf
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return tuple(((data or {}).get("kl") or {}).items())


@functools.cache
def kl_config(name: str) -> KLConfig:
    """The preset's KL configuration: its ``kl.*`` over the defaults of ``RunConfig``'s ``kl`` section (a
    frozen dataclass, read once per process)."""
    return config_of(kl_settings(name))


def config_of(settings: Mapping[str, Any]) -> KLConfig:
    """``kl.*`` settings (``kl.`` left off) over the defaults of ``RunConfig``'s ``kl`` section, as a
    ``klsweep.kl.KLConfig``; ``UserError`` or ``TypeError`` when they are not a valid one."""
    import dataclasses

    from klsweep.config import KLSection
    from klsweep.kl import KLConfig

    return KLConfig(**{**dataclasses.asdict(KLSection()), **dict(settings)})


def checked(name: str) -> str:
    """How the preset was proven to be its framework's KL: executed, transcribed or own (``SOURCES``)."""
    return SOURCES[name][0]


def resolve(requested: Iterable[str]) -> tuple[str, ...]:
    """The presets named (``all``: every one, in order), each once; ``UserError`` listing every unknown one."""
    known = names()
    out: list[str] = []
    problems = []
    for name in requested:
        if name == "all":
            out.extend(known)
        elif name in known:
            out.append(name)
        else:
            problems.append(Problem("preset", f"{name!r} is not a preset", ", ".join((*known, "all"))))
    if problems:
        raise UserError(problems)
    return tuple(dict.fromkeys(out))


def name_of(kl: Mapping[str, Any]) -> str | None:
    """The preset whose KL configuration a run's ``kl`` section (plain data, every key) is, or None; where several
    frameworks train the same (SkyRL's and verl's k3), their names in ``names()`` order joined by "/" (skyrl/verl)."""
    try:
        config = config_of(kl)
    except (UserError, TypeError):
        return None
    return name_of_config(config)


def name_of_config(config: KLConfig) -> str | None:
    """``name_of`` for a ``KLConfig`` already built."""
    return "/".join(name for name in names() if kl_config(name) == config) or None
