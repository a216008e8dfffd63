"""The line `klsweep study` ends with and its exit code (issue 51): a study whose runs were cancelled, failed
or never started says so, with the command that trains them, and exits 1; diverged runs are results (exit 0),
as `klsweep run --wait` treats them."""

from __future__ import annotations

from types import SimpleNamespace

from klsweep.study import study_command, summary


def _runs(*states: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(run_id=f"r{i}", state=s) for i, s in enumerate(states)]


def test_cancelled_runs_are_not_done():
    assert summary(_runs("cancelled", "cancelled"), "klsweep study mine.yaml") == (
        "0 of 2 runs done: 2 cancelled (klsweep study mine.yaml --retry-failed)",
        1,
    )


def test_failed_and_never_started_runs_are_named():
    line, code = summary(_runs("done", "failed", "pending", "cancelled"), "klsweep study g.yaml")
    assert code == 1
    assert (
        line == "1 of 4 runs done: 1 failed, 1 not started, 1 cancelled (klsweep study g.yaml --retry-failed)"
    )


def test_diverged_runs_are_results():
    assert summary(_runs("done", "diverged"), "c") == (
        "2 of 2 runs done (1 diverged: a result of the study)",
        0,
    )
    assert summary(_runs("done"), "c") == ("1 of 1 run done", 0)


def test_the_command_is_the_users():
    assert study_command("mine.yaml", ["seed=0"], "results") == "klsweep study mine.yaml seed=0"
    assert study_command("my grid.yaml", [], "/tmp/r") == "klsweep study 'my grid.yaml' --out /tmp/r"
