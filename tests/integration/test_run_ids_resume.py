"""Changing how runs are computed (micro-batch, vLLM) resumes the same run folders: `klsweep run` end to end on a
random tiny model (the id rule itself: tests/unit/test_grid.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from clitools import cli


def write(tmp_path: Path, text: str, name: str = "g.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_toggling_micro_batch_size_or_use_vllm_resumes_the_same_run_ids(tmp_path, monkeypatch, capsys):
    """`klsweep run` after a change of how the runs are computed: the same run folders, resumed where they
    stopped, then skipped once done; `klsweep plan` counts them done with use_vllm toggled."""
    from klsweep import store
    from klsweep.tinymodel import random_tiny_model

    model = random_tiny_model(tmp_path / "model")
    text = (
        f"name: resume\nbase:\n  model.path: {model}\n  cluster: debug\n  train.steps: 3\n"
        "  train.save_steps: 1\n  train.keep_checkpoints: null\n  train.prompts_per_step: 2\n"
        "  train.group_size: 4\n  train.max_completion_length: 4\n  offpolicy.num_iterations: 2\n"
        "  train.max_prompt_length: 128\n"  # vLLM's context within the model's 256 (plan refuses a longer one)
        "  wandb.mode: disabled\ngrid:\n  seed: 0\n"
    )
    g, out = write(tmp_path, text), tmp_path / "results"
    code, stdout, _ = cli(["run", g, "--out", out], monkeypatch, capsys)
    assert code == 0 and "1 submit" in stdout, stdout
    (run,) = store.run_dirs(out / "resume")
    # killed after step 1, in the middle of a generation batch's two updates: TRL's buffer is in use
    import shutil

    for step in (2, 3):
        shutil.rmtree(run / store.CHECKPOINTS_DIR / f"checkpoint-{step}")
    store.write_status(run, "running", step=1, finished_at=None, final_checkpoint=None)
    code, stdout, _ = cli(["run", g, "train.micro_batch_size=2", "--out", out], monkeypatch, capsys)
    assert code == 0 and "1 resume" in stdout, stdout
    assert store.run_dirs(out / "resume") == [run]
    status = store.read_status(run)
    assert status["state"] == "done" and status["step"] == 3
    assert [r["step"] for r in store.read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["micro_batch_size"] == 2
    code, stdout, _ = cli(["run", g, "--out", out], monkeypatch, capsys)
    assert code == 0 and "1 skip-done" in stdout, stdout
    code, stdout, _ = cli(["plan", g, "train.use_vllm=true", "--json", "--out", out], monkeypatch, capsys)
    plan = json.loads(stdout)
    assert plan["done"] == 1 and [r["id"] for r in plan["runs"]] == [run.name]
