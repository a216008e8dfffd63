"""TRL 1.16's loader, executed: a recipe's YAML parsed into TRL's own ``GRPOConfig`` (and ``ModelConfig``) by
``HfArgumentParser.parse_dict`` as ``TrlParser`` parses a ``--config`` file, TRL's ``__post_init__`` run (its
refusals are the loader's); keys of the launcher's own dataclasses (open-r1's ``GRPOScriptArguments``: dataset,
reward functions) are left to them. A file that sets no field of GRPOConfig or ModelConfig is not a TRL
training config (an accelerate config, a data-filtering recipe): refused, with the keys it does set.

GRPOConfig's batch checks depend on the number of processes (``generation_batch_size`` = per-device batch x
processes x steps_per_generation must divide by ``num_generations``): a recipe whose README launches it with
``accelerate launch --num_processes=N`` names N in its PROVENANCE entry (``{"processes": 7}``) and is parsed at
that world size (TrainingArguments.world_size, the one value of the machine, is N); else at 1, this machine's."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

LOADER = "trl 1.16.0 (installed): HfArgumentParser((GRPOConfig, ModelConfig)).parse_dict of the YAML"
# the keys klsweep's TRL reader reads (klsweep/audit/frameworks/trl.py)
KEYS = (
    "beta",
    "use_bias_correction_kl",
    "importance_sampling_level",
    "sync_ref_model",
    "ref_model_sync_steps",
    "ref_model_mixup_alpha",
)


def available() -> bool:
    try:
        import trl
    except ImportError:
        return False
    return trl.__version__ == "1.16.0"


def expected(file: Path, files: Path) -> dict[str, Any]:
    import tempfile

    import yaml
    from transformers import HfArgumentParser
    from trl import GRPOConfig, ModelConfig

    data = yaml.safe_load(file.read_text())
    if not isinstance(data, dict):
        return {"refused": "not a YAML mapping"}
    fields = {f.name for c in (GRPOConfig, ModelConfig) for f in dataclasses.fields(c)}
    if not set(data) & fields:
        return {"refused": f"sets no field of GRPOConfig or ModelConfig ({', '.join(sorted(data)[:6])}, ...)"}
    processes = _processes(file, files)

    class AtWorldSize(GRPOConfig):  # the processes accelerate would start (no other field touched)
        @property
        def world_size(self) -> int:
            return processes

    with tempfile.TemporaryDirectory() as work:
        # use_cpu: TrainingArguments refuses bf16 on a machine without a GPU; the KL fields do not depend on it
        data = {"output_dir": work, **data, "use_cpu": True}
        try:
            config, _ = HfArgumentParser((AtWorldSize, ModelConfig)).parse_dict(data, allow_extra_keys=True)
        except Exception as e:  # TRL's own refusals (__post_init__, a type it cannot parse)
            return {"refused": f"{type(e).__name__}: {e}".splitlines()[0]}
    return {"values": {k: getattr(config, k) for k in KEYS}}


def _processes(file: Path, files: Path) -> int:
    """The number of processes the file's PROVENANCE entry says its README launches it with (else 1)."""
    import json

    entry = json.loads((files.parent / "PROVENANCE.json").read_text())["files"].get(
        str(file.relative_to(files))
    )
    return int((entry or {}).get("processes", 1))
