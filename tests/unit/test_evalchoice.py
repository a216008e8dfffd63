"""Which eval a report shows (klsweep.report.evalchoice): the one asked for, else the grid's, else the only one
present; never merely the newest, and always said."""

from __future__ import annotations

from dataclasses import replace

from klsweep.evaluate import eval_hash, eval_settings, load_suite
from klsweep.report.evalchoice import Present, choose_eval, grid_evals

GRID = eval_settings(replace(load_suite("tiny"), limit=100))
SUITE_FILE = eval_settings(load_suite("tiny"))  # limit 64: what `klsweep eval --suite tiny` scored before


def _flat(settings: dict) -> dict:
    """A run's flattened config as the report reads it (lists as JSON text)."""
    import json

    eval_keys = {k: v for k, v in settings.items() if k != "tasks_digest"}
    return {f"eval.{k}": json.dumps(v) if isinstance(v, list) else v for k, v in eval_keys.items()}


def test_the_grids_eval_is_read_from_the_runs_configs():
    assert grid_evals([_flat(GRID), _flat(GRID), {"eval.suite": "none"}]) == [GRID]


def test_the_grids_eval_not_the_newest_and_the_other_named():
    present = {"aaa": Present(GRID, {"r1", "r2"}), "zzz": Present(SUITE_FILE, {"r1", "r2"})}
    choice = choose_eval(present, None, [GRID], "results/tiny")
    assert choice.hash == "aaa" and choice.label == "suite tiny, 100 problems per task, eval aaa"
    assert "zzz (suite tiny, 64 problems per task, eval zzz, 2 runs)" in choice.note
    assert "--eval-hash HASH" in choice.note


def test_only_another_eval_present_shows_no_scores_and_says_so():
    choice = choose_eval({"zzz": Present(SUITE_FILE, {"r1"})}, None, [GRID], "results/tiny")
    assert choice.hash == eval_hash(GRID)  # the grid's, with nothing under it: no scores from another eval
    assert "no run has been scored with the grid's eval yet" in choice.note and "zzz" in choice.note


def test_without_a_grid_eval_the_only_one_present_else_none():
    one = choose_eval({"zzz": Present(SUITE_FILE, {"r1"})}, None, [], "s")
    assert one.hash == "zzz" and "the only eval present" in one.note
    two = choose_eval({"a": Present(GRID, {"r1"}), "b": Present(SUITE_FILE, {"r1"})}, None, [], "s")
    assert two.hash is None and "several are present" in two.note and "a (" in two.note and "b (" in two.note


def test_the_eval_asked_for_wins():
    present = {"aaa": Present(GRID, {"r1"}), "zzz": Present(SUITE_FILE, {"r1"})}
    choice = choose_eval(present, "zzz", [GRID], "s")
    assert choice.hash == "zzz" and "64 problems per task" in choice.label and "aaa" in choice.note
