"""Engines a run's jobs use (klsweep.engines): `klsweep run` and `klsweep eval` refuse, before any job starts,
an engine whose packages cannot be imported in this environment (the jobs'); `klsweep plan` warns; a training
job never falls back to HF generate; `klsweep keys` shows the extra's name. The environment is made to lack
vllm and ray whatever is installed (the one boundary faked: importlib's view of the packages)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from clitools import cli
from runfiles import write_config

from klsweep import engines, job, store

GRID = """\
name: eng
base:
  model: tiny
  cluster: debug
  train.steps: 2
  train.max_prompt_length: 128  # with use_vllm, vLLM's context within the tiny model's 256 (plan refuses more)
  wandb.mode: disabled
grid:
  seed: 0,1
"""


@pytest.fixture
def without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("vllm", "ray") else real(name, *a)
    )


def test_what_each_engine_needs() -> None:
    config = {"model": {"resources": {"gpus_per_node": 8}}, "train": {"use_vllm": True}}
    assert engines.needed(config) == {"train.use_vllm": ("vllm",)}
    config["eval"] = {"suite": "paper", "backend": "vllm", "tensor_parallel_size": 1}
    assert engines.needed(config)["eval.backend"] == ("vllm", "ray")  # 8 model copies: data parallel
    config["eval"]["tensor_parallel_size"] = 8
    assert engines.needed(config)["eval.backend"] == ("vllm",)
    config["eval"]["suite"] = "none"  # nothing evaluated: no engine
    assert "eval.backend" not in engines.needed(config)
    assert engines.needed({"train": {"use_vllm": False}, "eval": {"suite": "tiny", "backend": "hf"}}) == {}


def test_run_refuses_a_missing_engine_and_plan_warns(
    tmp_path: Path, without_vllm: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text(GRID)
    out = tmp_path / "results"
    for extra in (
        ["train.use_vllm=true"],
        ["eval=paper", "eval.max_model_len=null"],
    ):  # within the tiny model
        code, stdout, err = cli(["run", grid, *extra, "--out", out], monkeypatch, capsys)
        text = " ".join((stdout + err).split())
        assert code == 2, text
        key = "train.use_vllm" if "use_vllm" in extra[0] else "eval.backend"
        assert f"{key}: needs vllm" in text and engines.install_command() in text
        assert not out.exists()  # nothing written, no job started

    code, stdout, err = cli(["plan", grid, "train.use_vllm=true", "--out", out], monkeypatch, capsys)
    text = " ".join((stdout + err).split())
    assert code == 0 and "warning: train.use_vllm: needs vllm" in text and engines.install_command() in text
    code, stdout, _ = cli(["plan", grid, "--json", "--out", out], monkeypatch, capsys)
    assert code == 0 and '"warnings": []' in stdout


def test_eval_refuses_the_vllm_backend_without_vllm(
    tmp_path: Path, without_vllm: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")  # offline, eval refuses the runs' model first: no such folder
    run = tmp_path / "sweep" / "run0"
    write_config(run, tmp_path / "model", **{"model.resources.gpus_per_node": 4})
    (run / store.CHECKPOINTS_DIR / "checkpoint-2").mkdir(parents=True)
    (run / store.CHECKPOINTS_DIR / "checkpoint-2" / "config.json").write_text("{}")
    store.write_status(run, "done", step=2)
    args = ["eval", tmp_path / "sweep", "--suite", "tiny", "--backend", "vllm", "--cluster", "debug"]
    code, stdout, err = cli(args, monkeypatch, capsys)
    text = " ".join((stdout + err).split())
    assert code == 2, text
    assert "eval.backend: needs vllm and ray" in text and engines.install_command() in text
    assert not (run / store.EVAL_DIR).exists()
    code, stdout, err = cli([*args[:5], "hf", "--cluster", "debug"], monkeypatch, capsys)
    assert "needs vllm" not in stdout + err  # eval.backend=hf stays possible


def test_use_vllm_never_falls_back_to_hf_generate(tmp_path: Path, without_vllm: None) -> None:
    """On a machine without vllm a run that asks for vLLM fails, saying why."""
    from klsweep.tinymodel import random_tiny_model

    model = random_tiny_model(tmp_path / "model")
    run = tmp_path / "run"
    write_config(run, model, **{"train.use_vllm": True})
    status = job.train_run(run)
    assert status["state"] == "failed"
    assert "train.use_vllm" in status["reason"] and engines.install_command() in status["reason"]
    assert not store.checkpoints(run)


def test_what_the_cpu_build_cannot_do_is_refused(tmp_path: Path) -> None:
    """Without a GPU, train.use_vllm runs on vLLM's CPU build where vllm imports; what that build cannot do (sleep
    mode, tensor parallel) is refused before any model is loaded, each named, whether vllm is installed or not."""
    import torch

    from klsweep import config as config_mod
    from klsweep import trainer_factory
    from klsweep.errors import UserError

    assert not torch.cuda.is_available()
    run = tmp_path / "run"
    trl = {"vllm_enable_sleep_mode": True, "vllm_tensor_parallel_size": 2}
    write_config(run, tmp_path / "no-model-needed", **{"train.use_vllm": True, "train.trl": trl})
    with pytest.raises(UserError) as refused:
        trainer_factory.build_trainer(config_mod.load_run(run), run)
    text = " ".join(str(refused.value).split())
    assert "train.trl.vllm_enable_sleep_mode: true, but vLLM's CPU build has no sleep mode" in text
    assert "train.trl.vllm_tensor_parallel_size: 2, but vLLM's CPU build runs one engine" in text
    assert ("vllm cannot be imported" in text) == (importlib.util.find_spec("vllm") is None)
    assert not (run / store.CHECKPOINTS_DIR).exists()
    assert engines.cpu_refusals({"vllm_enable_sleep_mode": False, "vllm_tensor_parallel_size": 1}) == []


def test_keys_shows_the_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    code, stdout, _ = cli(["keys", "train.use_vllm"], monkeypatch, capsys)
    assert code == 0 and "klsweep[vllm]" in stdout and "[bool]" in stdout
