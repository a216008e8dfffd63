"""The names of a results folder's files and of a run's states (the package docstring draws the layout)."""

from __future__ import annotations

STATES = ("pending", "running", "done", "failed", "diverged", "cancelled")


FINAL_STATES = ("done", "failed", "diverged", "cancelled")


TRAINED_STATES = ("done", "diverged")  # trained to the end (or stopped by a collapse): run skips them


STOPPED_STATES = ("failed", "cancelled")  # run skips them unless --retry-failed


CONFIG_FILE = "config.yaml"


STATUS_FILE = "status.json"


METRICS_FILE = "metrics.jsonl"


ENV_FILE = "env.json"


CHECKPOINTS_DIR = "checkpoints"


EVAL_DIR = "eval"


JOBS_FILE = "jobs.jsonl"


SWEEP_FILE = "sweep.yaml"


BASELINE_DIR = "baseline"


REPORT_DIR = "report"


FINAL_MARKER = "klsweep_final.json"  # in the checkpoint where a run ended: {"state", "step", "reason"}


TRAIN_LOCK = ".train.lock"  # held (flock) by the process training the run; holds its pid, host, job id


# Hugging Face weights files (one of them): what eval loads from a checkpoint
HF_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


TRAINER_STATE = "trainer_state.json"  # transformers writes it last when it saves a checkpoint: a complete one


REHEARSAL_MARKER = ".klsweep-rehearsal"  # in a rehearsal's folder and its run folders (klsweep.rehearse)


UNUSABLE_PREFIX = (
    "unusable-"  # checkpoints/unusable-checkpoint-<step>: one set aside (``set_aside_checkpoint``)
)
