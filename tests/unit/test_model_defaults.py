"""A model's config group carries its own training defaults where they differ from the global ones (the tiny
model: learning rate 3e-4, constant schedule); a grid's base:, its axes and the command line set theirs over
them; the resolved values enter the run id as every value does; `plan` shows the learning rate."""

from __future__ import annotations

from pathlib import Path

from clitools import cli

from klsweep import grid

REPO = Path(__file__).resolve().parents[2]


def _grid(tmp_path: Path, base: str = "", axes: str = "seed: range(2)") -> Path:
    path = tmp_path / "g.yaml"
    path.write_text(f"name: g\nbase:\n  model: tiny\n  task: tiny\n{base}grid:\n  {axes}\n")
    return path


def _lr(plan) -> set[tuple[float, str]]:
    return {(r.config["train"]["learning_rate"], r.config["train"]["lr_scheduler_type"]) for r in plan.runs}


def test_the_tiny_model_trains_at_its_own_learning_rate(tmp_path):
    assert _lr(grid.load_plan(_grid(tmp_path), out=tmp_path)) == {(3e-4, "constant")}


def test_the_grid_and_the_command_line_set_theirs_over_the_models(tmp_path):
    path = _grid(tmp_path, base="  train.learning_rate: 1.0e-4\n")
    assert _lr(grid.load_plan(path, out=tmp_path)) == {(1e-4, "constant")}
    plan = grid.load_plan(path, ["train.lr_scheduler_type=linear"], out=tmp_path)
    assert _lr(plan) == {(1e-4, "linear")}
    plan = grid.load_plan(_grid(tmp_path, axes="train.learning_rate: 1e-4,2e-4"), out=tmp_path)
    assert _lr(plan) == {(1e-4, "constant"), (2e-4, "constant")}


def test_another_model_keeps_the_global_defaults(tmp_path):
    path = _grid(tmp_path, axes="model: qwen2.5-7b")
    assert _lr(grid.load_plan(path, ["task=math"], out=tmp_path)) == {(1e-5, "linear")}


def test_the_shipped_tiny_grids_keep_their_run_ids(tmp_path):
    """They set the tiny model's schedule themselves: dropping it (~key, the default applies) changes nothing,
    and the ids are those their runs were trained under. Their learning rate is their own since study v5
    (1e-4 with 8 completions a prompt, docs/STUDY.md), not the model's 3e-4: dropping it changes the runs."""
    for name in ("tiny", "tiny-full"):
        path = REPO / "sweeps" / f"{name}.yaml"
        want = [r.id for r in grid.load_plan(path, out=tmp_path).runs]
        assert [r.id for r in grid.load_plan(path, ["~train.lr_scheduler_type"], out=tmp_path).runs] == want
        plan = grid.load_plan(path, ["~train.learning_rate"], out=tmp_path)
        assert {r.config["train"]["learning_rate"] for r in plan.runs} == {3e-4}
        assert not {r.id for r in plan.runs} & set(want)


def test_plan_shows_the_learning_rate(tmp_path, monkeypatch, capsys):
    code, out, _ = cli(["plan", _grid(tmp_path), "--out", tmp_path], monkeypatch, capsys)
    assert code == 0 and "3e-04 constant" in out
    args = ["plan", _grid(tmp_path), "train.learning_rate=1e-4,2e-4", "--json", "--out", tmp_path]
    code, out, _ = cli(args, monkeypatch, capsys)
    assert code == 0 and '"1e-04 constant",\n' in out and '"2e-04 constant"\n' in out
