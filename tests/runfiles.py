"""Run configs for the job and fault tests: a few fast steps of an untrained tiny model (tests/ is on sys.path
under pytest)."""

from __future__ import annotations

from pathlib import Path

TRAIN = {  # a few fast steps of the untrained tiny model
    "train.steps": 3,
    "train.save_steps": 2,
    "train.prompts_per_step": 2,
    "train.group_size": 4,
    "train.max_completion_length": 8,
    "train.learning_rate": 1e-3,
    "kl.beta": 0.1,
    "wandb.mode": "disabled",
}


def write_config(run_dir: Path, model_dir: Path, **values) -> dict:
    """The resolved config of a run of ``model_dir`` (``TRAIN``, then ``values``: dotted keys), written to
    ``run_dir`` as ``klsweep train`` would read it."""
    from omegaconf import OmegaConf

    from klsweep.config import RunConfig, write_run

    config = OmegaConf.structured(RunConfig)
    for key, value in {"name": "jobtest", "model.path": str(model_dir), **TRAIN, **values}.items():
        OmegaConf.update(config, key, value)
    resolved = OmegaConf.to_container(config)
    write_run(run_dir, resolved)
    return resolved
