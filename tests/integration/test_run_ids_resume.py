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


def _trained(tmp_path: Path, monkeypatch, capsys, name: str, more: str = "") -> tuple[Path, Path, Path]:
    """A grid of one run of a random tiny model (3 steps, a checkpoint at each, in this process) trained by
    `klsweep run`: the grid file, the results folder, the run folder."""
    from klsweep import store
    from klsweep.tinymodel import random_tiny_model

    model = random_tiny_model(tmp_path / "model")
    text = (
        f"name: {name}\nbase:\n  model.path: {model}\n  cluster: debug\n  train.steps: 3\n"
        "  train.save_steps: 1\n  train.keep_checkpoints: null\n  train.prompts_per_step: 2\n"
        f"  train.group_size: 4\n  train.max_completion_length: 4\n{more}"
        "  train.max_prompt_length: 128\n"  # vLLM's context within the model's 256 (plan refuses a longer one)
        "  wandb.mode: disabled\ngrid:\n  seed: 0\n"
    )
    g, out = write(tmp_path, text), tmp_path / "results"
    code, stdout, _ = cli(["run", g, "--out", out], monkeypatch, capsys)
    assert code == 0 and "1 submit" in stdout, stdout
    (run,) = store.run_dirs(out / name)
    return g, out, run


def test_toggling_micro_batch_size_or_use_vllm_resumes_the_same_run_ids(tmp_path, monkeypatch, capsys):
    """`klsweep run` after a change of how the runs are computed: the same run folders, resumed where they
    stopped, then skipped once done; `klsweep plan` counts them done with use_vllm toggled."""
    from klsweep import store

    g, out, run = _trained(tmp_path, monkeypatch, capsys, "resume", "  offpolicy.num_iterations: 2\n")
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


def test_a_done_run_is_done_only_with_its_whole_final_checkpoint_of_the_grids_config(
    tmp_path, monkeypatch, capsys
):
    """Issue 44 D10: a done run whose final checkpoint was deleted still read done and `run` skipped it
    (`status`: "partial ... klsweep eval scores it", for ever). A run is done when its final checkpoint is whole
    (or was scored): otherwise `status` says what is missing, `run` trains it again from its newest usable
    checkpoint, or, with none left, says so and trains it from step 0 with --retry-failed. And a folder whose
    recorded config.yaml is another configuration (a rehearsal's copied in: train.steps 2 against 3) is not
    the grid's run: `run` says what differs before it would rewrite config.yaml, and neither skips it as
    done nor trains over it."""
    import shutil

    from klsweep import store

    g, out, run = _trained(tmp_path, monkeypatch, capsys, "stale")
    final = run / store.CHECKPOINTS_DIR / "checkpoint-3"

    def said(*args: object) -> tuple[int, str]:
        code, stdout, err = cli([*map(str, args)], monkeypatch, capsys)
        return code, " ".join((stdout + err).split())

    def trained_again(start: str, *flags: str) -> None:
        code, text = said("run", g, "--out", out, *flags)
        assert code == 0 and "1 resume" in text and f"trained again from {start}" in text, text
        status = store.read_status(run)
        assert status["state"] == "done" and status["final_checkpoint"] == "checkpoint-3"
        assert store.checkpoint_problem(final) is None
        assert [r["step"] for r in store.read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]
        assert "1 skip-done" in said("run", g, "--out", out)[1]

    shutil.rmtree(final)  # deleted
    code, text = said("status", out / "stale")
    assert "incomplete" in text and "klsweep eval" not in text, text
    assert "done at step 3, but its final checkpoint checkpoint-3 is gone" in text, text
    assert "`klsweep run` trains it again from checkpoint-2" in text, text
    trained_again("checkpoint-2")
    weights = final / "model.safetensors"  # cut short
    weights.write_bytes(weights.read_bytes()[:-100])
    code, text = said("status", out / "stale")
    assert "its final checkpoint checkpoint-3 is not whole (model.safetensors: cut short" in text, text
    trained_again("checkpoint-2")
    shutil.rmtree(run / store.CHECKPOINTS_DIR)  # none left
    code, text = said("status", out / "stale")
    assert "no checkpoint is left to train it again from" in text and "--retry-failed" in text, text
    code, text = said("run", g, "--out", out)
    assert code == 1 and "1 skip-incomplete" in text and "no checkpoint is left" in text, text  # not done
    trained_again("step 0", "--retry-failed")

    config = run / store.CONFIG_FILE  # a rehearsal's run copied in: its marker removed, train.steps 2
    held = config.read_text().replace("steps: 3\n", "steps: 2\n", 1)
    config.write_text(held)
    before = (run / store.STATUS_FILE).read_text()
    code, text = said("run", g, "--out", out)
    assert code == 0 and "1 skip-other" in text and "not the grid's run" in text, text
    assert "train.steps 2 there, 3 in the grid" in text, text
    assert config.read_text() == held and (run / store.STATUS_FILE).read_text() == before
