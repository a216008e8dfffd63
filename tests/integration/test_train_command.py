"""`klsweep train`: a line per step (step, reward, KL, loss), not TRL's raw log dicts, Python warnings or W&B's
chatter; `--verbose` keeps them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from runfiles import write_config

from klsweep.tinymodel import random_tiny_model

REPO = Path(__file__).resolve().parents[2]


def _train(config: Path, run: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "default"}
    env.pop("WANDB_SILENT", None)  # as a user's shell has it
    return subprocess.run(
        [sys.executable, "-m", "klsweep", "train", config, "--run-dir", run, "wandb.mode=offline", *extra],
        capture_output=True, text=True, env=env, cwd=run.parent, timeout=600,
    )  # fmt: skip


def test_train_prints_a_line_per_step_and_nothing_of_the_libraries(tmp_path):
    model_dir = random_tiny_model(tmp_path / "model")
    config = write_config(tmp_path / "cfg", model_dir)
    done = _train(tmp_path / "cfg" / "config.yaml", tmp_path / "run")
    assert done.returncode == 0, done.stderr
    steps = config["train"]["steps"]
    lines = done.stdout.splitlines()
    assert [line.split()[1] for line in lines[:-1]] == [f"{i}/{steps}" for i in range(1, steps + 1)], lines
    assert lines[-1] == f"{tmp_path / 'run'}: done"
    assert "{'loss'" not in done.stdout and "Warning" not in done.stderr and "wandb" not in done.stderr
    verbose = _train(tmp_path / "cfg" / "config.yaml", tmp_path / "run2", "--verbose")
    assert verbose.returncode == 0 and "{'loss'" in verbose.stdout
