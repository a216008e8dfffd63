"""``job.train_run`` end to end on an untrained tiny model: the run folder's files, resume after a kill,
divergence (non-finite, reward collapse), failure, and the ``klsweep train`` command."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from klsweep import job, store


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from klsweep.tinymodel import random_tiny_model

    return random_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def write_config(run_dir: Path, model_dir: Path, **values) -> dict:
    from omegaconf import OmegaConf

    from klsweep.config import RunConfig

    config = OmegaConf.structured(RunConfig)
    settings = {
        "name": "jobtest",
        "model.path": str(model_dir),
        "train.steps": 3,
        "train.save_steps": 2,
        "train.prompts_per_step": 2,
        "train.group_size": 4,
        "train.max_completion_length": 8,
        "train.learning_rate": 1e-3,
        "kl.beta": 0.1,
        "wandb.mode": "disabled",
        **values,
    }
    for key, value in settings.items():
        OmegaConf.update(config, key, value)
    resolved = OmegaConf.to_container(config)
    job.write_run_config(run_dir, resolved)
    return resolved


def length_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """Signal for an untrained model (the tiny task's reward is 0 everywhere)."""
    return [float(len(c[0]["content"]) % 3) for c in completions]


def test_train_run_writes_the_contract_files(tmp_path, model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from klsweep import tasks

    monkeypatch.setattr(tasks, "reward_function", lambda task: length_reward)
    run = tmp_path / "run"
    write_config(run, model_dir, **{"wandb.mode": "offline", "kl.placement": "both"})
    status = job.train_run(run)

    assert status["state"] == "done", status.get("error")
    assert status == store.read_status(run)
    assert status["step"] == status["total_steps"] == 3
    assert status["finished_at"] >= status["started_at"] and status["elapsed_s"] > 0
    rows = store.read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        for key in ("step", "time", "elapsed_s", *job.ROW_KEYS):
            assert key in row, key
        for key in ("reward_mean", "kl_k1", "kl_k3", "kl_penalty", "entropy", "loss", "grad_norm"):
            assert isinstance(row[key], float), key
    assert rows[-1]["kl_k3"] > 0
    assert [c.name for c in store.checkpoints(run)] == ["checkpoint-2", "checkpoint-3"]
    last = store.checkpoints(run)[-1]
    for name in ("config.json", "model.safetensors", "tokenizer.json", "trainer_state.json", "optimizer.pt"):
        assert (last / name).is_file(), name
    AutoModelForCausalLM.from_pretrained(last)
    AutoTokenizer.from_pretrained(last)
    assert any((run / "wandb").rglob("*.wandb"))
    assert job.train_run(run) == status  # a done run is left as it is


_KILLABLE = """
import sys
from klsweep import job
job.train_run(sys.argv[1])
"""


def test_resume_after_kill(tmp_path, model_dir):
    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.steps": 6, "offpolicy.lag": 1})
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLABLE, str(run)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any(r["step"] >= 3 for r in store.read_metrics(run)):
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert store.read_status(run)["state"] == "running"
    assert [c.name for c in store.checkpoints(run)] == ["checkpoint-2"]
    assert (store.checkpoints(run)[0] / "klsweep_buffers_rank0.pt").is_file()
    assert max(r["step"] for r in store.read_metrics(run)) >= 3

    status = job.train_run(run)
    assert status["state"] == "done", status.get("error")
    assert status["step"] == 6
    steps = [r["step"] for r in store.read_metrics(run)]
    assert steps == [1, 2, 3, 4, 5, 6]  # strictly increasing, none twice
    # the lag buffer came back with the checkpoint: no second pipeline fill after the resume
    assert [r["policy_lag"] for r in store.read_metrics(run)] == [0, 1, 1, 1, 1, 1]
    assert [c.name for c in store.checkpoints(run)] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]


def test_a_checkpoint_without_trainer_state_is_not_resumed(tmp_path, model_dir):
    """A save cut short (the trainer state is written last) is skipped: the run resumes from the one before."""
    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.steps": 4, "offpolicy.lag": 1})
    assert job.train_run(run)["state"] == "done"
    (run / "checkpoints" / "checkpoint-4" / job.TRAINER_STATE).unlink()
    store.write_status(run, "running")
    status = job.train_run(run)
    assert status["state"] == "done", status.get("error")
    assert [r["step"] for r in store.read_metrics(run)] == [1, 2, 3, 4]  # steps 3-4 retrained, none twice
    assert (run / "checkpoints" / "checkpoint-4" / job.TRAINER_STATE).is_file()


def test_non_finite_weights_diverge(tmp_path, model_dir, monkeypatch):
    from klsweep import tasks

    monkeypatch.setattr(tasks, "reward_function", lambda task: length_reward)
    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.steps": 5, "train.learning_rate": 1e30})
    status = job.train_run(run)
    assert status["state"] == "diverged", status
    assert status["diverged_step"] == 2
    assert "non-finite" in status["reason"]
    assert status["error"] is None


def test_reward_collapse_diverges(tmp_path, model_dir, monkeypatch):
    from klsweep import tasks

    def falling_reward(prompts, completions, answer, trainer_state, **kwargs):
        return [1.0 if trainer_state.global_step < 2 else 0.0] * len(completions)

    monkeypatch.setattr(tasks, "reward_function", lambda task: falling_reward)
    run = tmp_path / "run"
    values = {"train.steps": 8, "train.collapse_window": 2, "train.collapse_fraction": 0.5}
    write_config(run, model_dir, **values)
    status = job.train_run(run)
    assert status["state"] == "diverged", status
    assert status["diverged_step"] == 4  # windowed means 1, 1, 0.5, 0
    assert "collapse" in status["reason"]
    assert [r["step"] for r in store.read_metrics(run)] == [1, 2, 3, 4]
    assert [c.name for c in store.checkpoints(run)] == ["checkpoint-2"]  # nothing saved at the diverged step


def test_reward_collapse_rule():
    from klsweep.collapse import find_collapse

    def collapse(rewards, window):
        found = find_collapse(range(1, len(rewards) + 1), rewards, window, 0.5)
        return found and found.step

    assert collapse([1.0, 1.0, 0.4], window=1) == 3
    assert collapse([1.0, 1.0, 0.6], window=1) is None
    assert collapse([0.05, 0.0], window=1) is None  # peak below the minimum
    assert collapse([1.0, None, math.nan, 0.0, 0.0], window=2) == 4  # missing rewards are skipped
    assert collapse([1.0], window=2) is None
    assert collapse([0.19, 0.0, 0.0], window=10) == 3  # inside the first window


def test_nan_loss_stops_the_run(tmp_path, model_dir):
    from transformers import TrainerControl, TrainerState

    from klsweep.config import RunConfig

    monitor = job._RunMonitor(tmp_path, RunConfig(), [], 0.0, time.time(), is_main=True)
    state, control = TrainerState(), TrainerControl()
    state.global_step = 1
    monitor.on_log(state, control, {"loss": 0.5, "grad_norm": 1.0, "task_reward/mean": 0.5})
    assert monitor.diverged is None and not control.should_training_stop
    state.global_step = 2
    control.should_save = True
    monitor.on_log(state, control, {"loss": math.nan, "grad_norm": 1.0, "task_reward/mean": 0.5})
    assert monitor.diverged == (2, "non-finite loss (nan)")
    assert control.should_training_stop and not control.should_save
    rows = store.read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["loss"] is None


def test_failure_is_recorded(tmp_path, model_dir):
    run = tmp_path / "run"
    write_config(run, model_dir, **{"model.path": str(tmp_path / "no-such-model")})
    status = job.train_run(run)
    assert status["state"] == "failed"
    assert "no-such-model" in status["error"]


def test_wandb_mode_and_tags(monkeypatch, tmp_path):
    from klsweep.config import RunConfig

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert job._wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x")
    assert job._wandb_mode("auto") == "online"
    assert job._wandb_mode("disabled") == "disabled"
    tags = job.wandb_tags(RunConfig())
    assert tags == [
        "estimator=k3",
        "placement=loss",
        "level=token",
        "beta=0",
        "lag=0",
        "seed=0",
        "model=tiny",
    ]


def test_train_command(tmp_path, model_dir, monkeypatch):
    from typer.testing import CliRunner

    from klsweep.cli import app

    yaml = tmp_path / "run.yaml"
    yaml.write_text(
        f"name: clitest\nmodel:\n  path: {model_dir}\ntrain:\n  steps: 1\n  prompts_per_step: 2\n"
        "  group_size: 4\n  max_completion_length: 4\nwandb:\n  mode: disabled\n"
    )
    result = CliRunner().invoke(app, ["train", str(yaml), "kl.beta=0.1", "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "done" in result.output
    assert store.read_status(tmp_path / "r")["state"] == "done"

    monkeypatch.chdir(tmp_path)  # the default run folder: results/<name>/<run-id>
    bad = CliRunner().invoke(app, ["train", str(yaml), f"model.path={tmp_path}/missing"])
    assert bad.exit_code == 1


@pytest.mark.slow
def test_data_parallel_two_processes(tmp_path, model_dir):
    """WORLD_SIZE=2 on a CPU (gloo): one run, two ranks; rank 0 alone writes the folder's files."""
    import socket

    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.steps": 2, "kl.placement": "both"})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = "import sys, json; from klsweep import job; print(json.dumps(job.train_run(sys.argv[1])['state']))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(run)],
            env={
                **os.environ,
                "PYTHONWARNINGS": "ignore",
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(out.strip().endswith('"done"') for out in outputs), outputs
    assert store.read_status(run)["state"] == "done"
    rows = store.read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for rank in (0, 1):  # each rank's lag buffer is its own
        assert (store.checkpoints(run)[-1] / f"klsweep_buffers_rank{rank}.pt").is_file()
