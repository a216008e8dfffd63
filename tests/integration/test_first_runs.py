"""What a newcomer meets in the first minutes, with real tiny training and lm-eval: `klsweep run` says before
submitting that an axis changes nothing (estimators without a beta); `klsweep eval` of a sweep whose runs are
scored says that nothing is left to do and submits no job; an eval that scores prints the scores table (as
lm-eval does), not the paths of results.json."""

from __future__ import annotations

from pathlib import Path

from clitools import cli  # tests/ is on sys.path under pytest

GRID = (
    "name: first\nbase:\n  model: tiny\n  task: tiny\n  eval: tiny\n  eval.limit: 4\n  train.steps: 1\n"
    "  train.save_steps: 1\n  train.prompts_per_step: 2\n  train.group_size: 2\n"
    "  train.max_completion_length: 4\n  wandb.mode: disabled\n"
    "grid:\n  kl.estimator: k1,k3\n  seed: 0\n"
)


def _words(text: str) -> str:
    return " ".join(text.split())


def test_run_warns_of_an_inert_axis_and_eval_of_a_scored_sweep_has_nothing_left(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text(GRID)
    code, out, err = cli(["run", grid, "--out", tmp_path, "--wait"], monkeypatch, capsys)
    assert code == 0, out + err
    said = "warning: kl.estimator varies but kl.beta is 0 in every run: it changes nothing; set kl.beta"
    assert said in _words(out)
    sweep = tmp_path / "first"
    assert len(list(sweep.glob("*/eval/*/checkpoint-1/results.json"))) == 1  # one run (merged), scored

    # the run is scored: only the sweep's step-0 baseline is left; --wait prints every score as a table
    code, out, err = cli(["eval", sweep, "--wait"], monkeypatch, capsys)
    assert code == 0, out + err
    assert "scored already (not evaluated again): 1 results" in out
    assert "to evaluate: the step-0 baseline of tiny" in out and "submitted eval job" in out
    assert "results.json" not in out  # the scores, not their paths
    rows = [line.split() for line in out.splitlines() if "tiny_" in line]
    assert {r[0] for r in rows} == {"baseline", sweep.glob("*/config.yaml").__next__().parent.name}
    assert {r[-3] for r in rows} == {"tiny_add", "tiny_sub", "tiny_rev"}  # task, value, stderr

    code, out, err = cli(["eval", sweep], monkeypatch, capsys)
    assert code == 0, out + err
    assert "nothing left to do" in out and "submitted eval job" not in out and "to evaluate" not in out
    assert "tiny_add" in out  # the scores there are


def test_lm_evals_git_call_is_quiet_outside_a_git_checkout(tmp_path: Path, monkeypatch, capfd) -> None:
    """lm-eval's ``get_git_commit_hash`` (run by every ``simple_evaluate``) lets git print "fatal: not a git
    repository" outside a checkout (`klsweep rehearse` printed it twice); klsweep's evaluation runs it quietly."""
    import lm_eval.evaluator

    from klsweep.evaluate.running import quiet_git_hash

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # whatever folder /tmp lies in
    lm_eval.evaluator.get_git_commit_hash()
    assert "not a git repository" in capfd.readouterr().err  # lm-eval's own call, as it is
    with quiet_git_hash():
        assert lm_eval.evaluator.get_git_commit_hash() is None
    assert capfd.readouterr().err == ""
    assert lm_eval.evaluator.get_git_commit_hash.__module__ == "lm_eval.loggers.utils"  # put back
