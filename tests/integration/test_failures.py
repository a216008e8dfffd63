"""Failures in plain sight, with real tiny training and lm-eval on the local executor: a failed run (or eval)
records the exception's type and message, not a traceback's last line; every run keeps the stdout/stderr of the
jobs that worked on it in its ``logs/``, which outlive the submitit files; ``klsweep status`` and the summary of
``klsweep run --wait`` say why a run failed and where its log is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from clitools import cli  # tests/ is on sys.path under pytest

from klsweep import store, submit

BROKEN = (
    "huggingface_hub.errors.StrictDataclassFieldValidationError: Validation error for field 'hidden_size'"
)


def _break(model_dir: Path) -> None:
    """A model folder whose config.json has a field of the wrong type: transformers refuses it, in a message of
    several lines whose last is not the error."""
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["hidden_size"] = "wide"
    (model_dir / "config.json").write_text(json.dumps(cfg))


def _words(text: str) -> str:
    return " ".join(text.split())


def test_failed_run_and_eval_say_why_and_keep_their_logs(tmp_path: Path, monkeypatch, capsys) -> None:
    from klsweep.tinymodel import tiny_model_path

    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_path(), broken)
    _break(broken)
    grid = tmp_path / "g.yaml"
    grid.write_text(
        "name: failing\nbase:\n  model: tiny\n  task: tiny\n  cluster: local\n  train.steps: 1\n"
        "  train.save_steps: 1\n  train.prompts_per_step: 2\n  train.group_size: 2\n"
        "  train.max_completion_length: 4\n  wandb.mode: disabled\n"
        f"grid:\n  - kl.beta: 0.1\n  - kl.beta: 0.0\n    model.path: {broken}\n"
    )
    code, ran, err_out = cli(["run", grid, "--out", tmp_path, "--wait"], monkeypatch, capsys)
    assert code == 1, ran + err_out
    sweep = tmp_path / "failing"
    runs = {r.state: r for r in submit.status(sweep)}
    assert sorted(runs) == ["done", "failed"]
    failed, done = runs["failed"], runs["done"]
    failed_dir, done_dir = sweep / failed.run_id, sweep / done.run_id

    # the reason: the exception's qualified type and its message, in one line; the traceback's tail in `error`
    status = store.read_status(failed_dir)
    assert status["reason"].startswith(BROKEN), status["reason"]
    assert "expected int, got str" in status["reason"] and "\n" not in status["reason"]
    assert status["error"].splitlines()[-1].endswith("expected int, got str (value: 'wide')")  # its tail
    assert failed.reason == status["reason"]

    # each run's logs/: the failed run's holds the whole traceback, the done run's its training output
    err = failed_dir / "logs" / f"train-{failed.job_id}.err"
    assert failed.log == str(err)
    log = err.read_text()
    assert "Traceback (most recent call last)" in log and "StrictDataclassFieldValidationError" in log
    out = (done_dir / "logs" / f"train-{done.job_id}.out").read_text()
    assert "'loss'" in out and "'kl/k3'" in out  # the trainer's log of its step
    assert not (done_dir / "logs" / f"train-{failed.job_id}.err").exists()  # each run its own jobs' logs

    # the summary of `run --wait` (a pipe: full width) and `status` at 80 columns: why, and the log's path whole
    assert f"log: {err}" in ran.splitlines() and status["reason"] in ran
    code, shown, _ = cli(["status", sweep], monkeypatch, capsys, columns=80, terminal=True)
    assert code == 0, shown
    lines = shown.splitlines()
    assert f"log: {err}" in lines  # never cut or wrapped: it can be copied
    notes = lines[lines.index(f"--- {failed.run_id} (failed) ---") + 1 : lines.index(f"log: {err}")]
    assert _words(" ".join(notes)) == _words(status["reason"]) and max(map(len, notes)) <= 80

    # a failed eval says why the same way, and its job's part of the log is the run's
    final = store.read_status(done_dir)["final_checkpoint"]
    _break(done_dir / "checkpoints" / final)
    code, evaluated, _ = cli(
        ["eval", sweep, "--suite", "tiny", "--cluster", "local", "--wait"], monkeypatch, capsys
    )
    eval_error = store.read_status(done_dir)["eval_error"]
    assert eval_error.startswith(f"{done.run_id} {final}: {BROKEN}"), (eval_error, evaluated)
    assert "\n" not in eval_error
    (row,) = [
        r
        for r in store.read_jsonl(sweep / store.JOBS_FILE)
        if r["kind"] == "eval" and r["run_id"] == done.run_id
    ]
    eval_err = done_dir / "logs" / f"eval-{row['job_id']}.err"
    eval_log = eval_err.read_text()
    assert code == 1 and f"eval failed: {done_dir}: {eval_error}" in evaluated
    assert f"log: {eval_err}" in evaluated.splitlines()
    assert "Traceback (most recent call last)" in eval_log and eval_error in eval_log
    # the job evaluated the step-0 baseline too: that part is the baseline's, not the run's
    (baseline,) = (sweep / store.BASELINE_DIR).iterdir()
    assert (baseline / "logs" / f"eval-{row['job_id']}.err").is_file()
    (run,) = [r for r in submit.status(sweep) if r.run_id == done.run_id]
    assert run.eval_state == "failed" and run.eval_error == eval_error
    code, shown, _ = cli(["status", sweep], monkeypatch, capsys)
    assert f"--- {done.run_id} (eval failed) ---" in shown and eval_error in shown
    assert f"log: {eval_err}" in shown.splitlines()

    # the logs outlive submitit's files and the sweep folder's move (no link to break)
    moved = tmp_path / "moved"
    shutil.move(sweep, moved)
    shutil.rmtree(moved / "submitit")
    assert (moved / failed.run_id / "logs" / err.name).read_text() == log


@pytest.mark.slurm
def test_a_job_that_fails_before_its_run_starts_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    """The job dies before klsweep's code runs (here its setup line fails, in the job's sbatch script; also an
    import error in a broken checkout): status.json still says pending, and the reason is the last line of the
    job's log."""
    grid = tmp_path / "g.yaml"
    grid.write_text(
        "name: early\nbase:\n  model: tiny\n  task: tiny\n  cluster: slurm\n  train.steps: 2\n"
        "  cluster.setup: ['echo \"ModuleNotFoundError: no module named torch\" >&2; exit 3']\ngrid:\n  seed: 0\n"
    )
    code, out, err = cli(["run", grid, "--out", tmp_path, "--wait"], monkeypatch, capsys)
    assert code == 1, out + err
    (run,) = submit.status(tmp_path / "early")
    assert run.state == "failed"
    assert run.reason == "its job failed before the run started: ModuleNotFoundError: no module named torch"
    assert store.read_status(tmp_path / "early" / run.run_id)["state"] == "pending"
    code, shown, _ = cli(["status", tmp_path / "early"], monkeypatch, capsys)
    assert run.reason in _words(shown)
