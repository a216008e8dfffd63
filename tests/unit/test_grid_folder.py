"""Grids of one `name:` told apart by run ids (issue 51): a second grid with the same name (copied and not
renamed) wrote into the first's folder, plan said nothing, sweep.yaml was rewritten with the new runs only
and the report mixed both. `plan`, `run` and `study` refuse a sweep folder holding runs the plan does not
have, saying whose runs are which, unless --add-to-folder; a grid that only adds runs is not refused;
sweep.yaml is appended, never rewritten smaller."""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import cli

from klsweep import grid, store
from klsweep.config import run_file_text
from klsweep.errors import UserError
from klsweep.submit import submit
from klsweep.submit.sweep import write_sweep_file

GRID = "name: mine\nbase: {{model: tiny, task: tiny, eval: tiny, train.steps: 2{extra}}}\ngrid: {{seed: range({n})}}\n"


def _first(tmp_path: Path) -> tuple[Path, list[str]]:
    """The first grid's sweep, as `klsweep run` leaves it: its run folders and sweep.yaml."""
    g1 = tmp_path / "mine.yaml"
    g1.write_text(GRID.format(extra="", n=2))
    plan = grid.load_plan(g1, out=tmp_path / "res")
    for run in plan.runs:
        Path(run.run_dir).mkdir(parents=True)
        (Path(run.run_dir) / store.CONFIG_FILE).write_text(run_file_text(run.config))
    write_sweep_file(plan, "local")
    return g1, [r.id for r in plan.runs]


def test_another_grid_of_the_same_name_is_refused_saying_whose_runs_are_which(tmp_path, monkeypatch, capsys):
    _, first = _first(tmp_path)
    g2 = tmp_path / "copy.yaml"
    g2.write_text(GRID.format(extra=", train.learning_rate: 2.0e-4", n=2))
    second = [r.id for r in grid.load_plan(g2, out=tmp_path / "res").runs]
    for command in ("plan", "study", "run"):
        code, _, err = cli([command, g2, "--out", tmp_path / "res"], monkeypatch, capsys)
        said = " ".join(err.split())
        assert code == 2, (command, err)
        assert "holds 2 run(s) of another grid named 'mine'" in said, err
        assert all(i in said for i in first + second) and "--add-to-folder" in said, err
    assert sorted(p.name for p in store.run_dirs(tmp_path / "res" / "mine")) == sorted(
        first
    )  # nothing written
    assert set(store.read_sweep_file(tmp_path / "res" / "mine")["runs"]) == set(first)
    code, _, err = cli(["plan", g2, "--out", tmp_path / "res", "--add-to-folder"], monkeypatch, capsys)
    assert code == 0, err
    with pytest.raises(UserError, match="another grid named"):  # the library's submit when asked to check
        submit(grid.load_plan(g2, out=tmp_path / "res"), "local", add_to_folder=False)


def test_a_grid_that_only_adds_runs_is_not_refused_and_sweep_yaml_grows(tmp_path, monkeypatch, capsys):
    g1, first = _first(tmp_path)
    more = tmp_path / "more.yaml"
    more.write_text(GRID.format(extra="", n=3))  # one more seed: the first grid's runs and one more
    code, _, err = cli(["plan", more, "--out", tmp_path / "res"], monkeypatch, capsys)
    assert code == 0, err
    plan = grid.load_plan(more, out=tmp_path / "res")
    write_sweep_file(plan, "local")
    assert set(store.read_sweep_file(tmp_path / "res" / "mine")["runs"]) == {r.id for r in plan.runs}
    # a grid added with --add-to-folder: sweep.yaml keeps every run it listed, and the earlier grid's text
    other = tmp_path / "other.yaml"
    other.write_text(GRID.format(extra=", train.learning_rate: 2.0e-4", n=1))
    plan2 = grid.load_plan(other, out=tmp_path / "res")
    write_sweep_file(plan2, "local")
    sweep = store.read_sweep_file(tmp_path / "res" / "mine")
    assert set(sweep["runs"]) == {r.id for r in plan.runs} | {plan2.runs[0].id}
    assert sweep["grid"] == other.read_text() and sweep["earlier_grids"] == [g1.read_text(), more.read_text()]
    # a run sweep.yaml lists whose folder is gone is still another grid's: a grid adding a run beside it is
    # refused, naming it
    code, _, err = cli(["plan", more, "--out", tmp_path / "res", "seed=5"], monkeypatch, capsys)
    assert code == 2 and plan2.runs[0].id in " ".join(err.split()), err
    # a plan whose runs the folder holds already adds nothing to it: the first grid again, or a subset of it
    for args in ([g1], [g1, "seed=0"], [more, "seed=2"]):
        code, _, err = cli(["plan", *args, "--out", tmp_path / "res"], monkeypatch, capsys)
        assert code == 0, (args, err)
