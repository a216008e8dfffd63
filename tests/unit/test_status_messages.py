"""What `klsweep status` (and report) says when it is given something that is not a sweep: a grid file (use
the sweep's name), a name nothing was launched under, a folder without runs."""

from __future__ import annotations

from clitools import cli


def test_status_of_a_grid_file_names_the_sweep(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("name: study1\nbase: {model: tiny}\ngrid: {seed: range(2)}\n")
    for command in ("status", "report"):
        code, _, err = cli([command, "mine.yaml"], monkeypatch, capsys)
        assert code == 2 and "that is a grid file: use the sweep name study1" in " ".join(err.split()), err


def test_status_of_a_sweep_without_runs_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(["status", "never"], monkeypatch, capsys)
    assert code == 2 and "no run of it was launched here" in " ".join(err.split()), err
    (tmp_path / "results" / "empty").mkdir(parents=True)
    code, _, err = cli(["status", "empty"], monkeypatch, capsys)
    assert code == 2 and "has no runs" in err, err


def test_the_sweeps_offered_are_sweeps_not_rehearsals(tmp_path, monkeypatch, capsys):
    """`report GRID.yaml` offered `.rehearsal` (where `klsweep rehearse` writes) as a sweep name."""
    from klsweep import store

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("name: study1\nbase: {model: tiny}\ngrid: {seed: range(2)}\n")
    (tmp_path / "results" / "study0" / "abc").mkdir(parents=True)
    rehearsal = tmp_path / "results" / "rehearsed"
    rehearsal.mkdir()
    (rehearsal / store.REHEARSAL_MARKER).write_text("{}")
    (tmp_path / "results" / ".rehearsal" / "paper").mkdir(parents=True)
    for command in ("status", "report"):
        code, _, err = cli([command, "mine.yaml"], monkeypatch, capsys)
        said = " ".join(err.split())
        assert code == 2 and "(allowed: study0)" in said and "rehears" not in said, err
