"""`--config-dir` on every command that reads a grid (plan, fetch, config, run, study, rehearse) and on eval
(a suite from DIR/eval/): a group kept outside the package is found with it and refused without it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from clitools import cli
from runfiles import write_config

from klsweep import store
from klsweep.grid import CONF_DIR

GRID = "name: cd\nbase:\n  model: mytiny\n  task: tiny\n  eval: tiny\ngrid:\n  seed: 0,1\n"


@pytest.fixture
def groups(tmp_path: Path) -> Path:
    """A config folder outside the package: model/mytiny.yaml (the tiny model under another name) and
    eval/mine.yaml (the tiny suite on the vLLM backend)."""
    folder = tmp_path / "conf"
    (folder / "model").mkdir(parents=True)
    text = (CONF_DIR / "model" / "tiny.yaml").read_text().replace("name: tiny", "name: mytiny")
    (folder / "model" / "mytiny.yaml").write_text(text)
    (folder / "eval").mkdir()
    text = (CONF_DIR / "eval" / "tiny.yaml").read_text().replace("backend: hf", "backend: vllm")
    (folder / "eval" / "mine.yaml").write_text(text)
    return folder


@pytest.mark.parametrize("command", ["plan", "fetch", "config", "run", "study", "rehearse"])
def test_every_grid_command_takes_config_dir(command, groups, tmp_path, monkeypatch, capsys):
    grid = tmp_path / "cd.yaml"
    grid.write_text(GRID)
    not_a_folder = tmp_path / "file"  # --out: refused with the grid's other problems, before anything runs
    not_a_folder.write_text("")
    extra = ["0"] if command == "config" else []
    args = [command, grid, *extra, "--out", not_a_folder]
    code, _, err = cli(args, monkeypatch, capsys)
    assert code == 2 and "mytiny" in err, err  # the group is unknown without the folder
    code, _, err = cli([*args, "--config-dir", groups], monkeypatch, capsys)
    assert code == 2 and "--out" in err and "mytiny" not in err, err  # found with it


def test_eval_takes_a_suite_from_config_dir(groups, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE")  # offline, eval refuses the runs' model first: no such folder
    run = tmp_path / "sweep" / "run0"
    model = tmp_path / "model"
    write_config(run, model)
    (run / store.CHECKPOINTS_DIR / "checkpoint-2").mkdir(parents=True)
    (run / store.CHECKPOINTS_DIR / "checkpoint-2" / "config.json").write_text("{}")
    store.write_status(run, "done", step=2)
    args = ["eval", tmp_path / "sweep", "--suite", "mine", "--cluster", "debug"]
    code, _, err = cli(args, monkeypatch, capsys)
    assert code == 2 and "no eval suite 'mine'" in err, err
    real = importlib.util.find_spec  # the suite asks for vLLM: refused where it does not import, nothing run
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("vllm", "ray") else real(name, *a)
    )
    code, out, err = cli([*args, "--config-dir", groups], monkeypatch, capsys)
    assert code == 2 and "eval.backend: needs vllm" in " ".join((out + err).split()), err
    assert not (run / store.EVAL_DIR).exists()
