"""Faults and bad input the way a cluster user meets them (issue 12: nothing lost, nothing stranded), one section
per fault: W&B unreachable or dying, a refused sbatch and arrays past MaxArraySize (real local Slurm), a torn
metrics line, a truncated status.json or config.yaml, names from overrides, huge grids and alias bombs, user
errors that used to be tracebacks, a collapse in the first full window, and runs killed without a word.
What klsweep promises under faults: docs/FAULTS.md."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import launcher_jobs as jobs  # tests/ is on sys.path under pytest
import pytest
from clitools import cli
from runfiles import TRAIN, write_config

from klsweep import grid, job, store, submit
from klsweep.errors import UserError

FIXTURE = Path(__file__).parents[1] / "fixtures" / "sweep_tiny"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from klsweep.tinymodel import random_tiny_model

    return random_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def fixture_copy(tmp_path: Path) -> Path:
    sweep = tmp_path / "sweep_tiny"
    shutil.copytree(FIXTURE, sweep, ignore=shutil.ignore_patterns("make_fixture.py"))
    return sweep


def with_shipped_eval_tasks(sweep: Path) -> Path:
    """The fixture's runs name an eval task that is not shipped (tiny_mul): name a shipped one (tiny_rev)."""
    for config in sweep.glob("*/config.yaml"):
        config.write_text(config.read_text().replace("tiny_mul", "tiny_rev"))
    return sweep


def cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------------------
# 1. W&B unreachable, or gone mid-run: a warning, never a failed run
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "key"), [("auto", "a" * 40), ("online", "not-a-key")])
def test_unreachable_wandb_mirrors_offline_and_the_run_finishes(tmp_path, model_dir, monkeypatch, mode, key):
    """A key and no network (here: a W&B server address nobody listens on), or a malformed key."""
    monkeypatch.setenv("WANDB_API_KEY", key)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.steps": 2, "wandb.mode": mode, "wandb.init_timeout_s": 3})
    status = job.train_run(run)
    assert status["state"] == "done", status.get("error")
    assert any(w.startswith("W&B online failed") for w in status["warnings"]), status["warnings"]
    assert status == store.read_status(run)  # the warning is in the run's status.json
    assert [r["step"] for r in store.read_metrics(run)] == [1, 2]
    assert any((run / "wandb").rglob("*.wandb"))  # mirrored offline instead


@pytest.mark.slurm
def test_preemption_with_wandb_never_reads_failed(tmp_path, model_dir):
    """USR2 (preemption) on real Slurm: wandb's service process dies with the job's processes and its teardown
    raised ConnectionResetError, which marked the run failed until the requeued job started. Now the run reads
    running/pending throughout, resumes, and ends done with every step once (a preemption between an optimiser
    step and its metrics row saves no checkpoint: that step is redone)."""
    sweep = tmp_path / "wbpreempt"
    values = {"model.path": str(model_dir), **TRAIN, "train.steps": 40, "train.save_steps": 100}
    plan = jobs.make_plan(sweep, [0], **{**values, "wandb.mode": "offline"})
    run_dir = plan.runs[0].run_dir
    res = submit.submit(plan, "slurm")
    (job_id,) = [r["job_id"] for r in res.jobs]
    start = time.time()
    while not any(r["step"] >= 2 for r in store.read_metrics(run_dir)):
        assert time.time() - start < 180, "the job never trained"
        assert store.read_status(run_dir)["state"] not in ("failed", "done"), store.read_status(run_dir)
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    failures = []
    while time.time() - start < 420:
        st = store.read_status(run_dir)
        if st["state"] == "failed":
            failures.append(st.get("error") or "")
        if st["state"] == "done":
            break
        time.sleep(0.2)
    # (1 requeue in 16 from inside a job reports failure although Slurm requeued it: tolerate that one)
    assert not [e for e in failures if "scontrol" not in e], failures
    status = store.read_status(run_dir)
    assert status["state"] == "done", status
    assert [r["step"] for r in store.read_jsonl(run_dir / store.METRICS_FILE)] == list(
        range(1, 41)
    )  # none lost, none twice
    # (when W&B broke, which depends on where the signal finds the job, status.json says so in `warnings`)


# ------------------------------------------------------------------------------------------------------------
# 2. A refused sbatch: Slurm's words, exit 2, no run claiming a job it does not have; arrays split
# ------------------------------------------------------------------------------------------------------------

REFUSED_GRID = """\
name: refused
base:
  cluster: slurm
  cluster.partition: no_such_partition
  model.path: {model}
grid:
  seed: 0,1,2
"""


@pytest.mark.slurm
def test_refused_sbatch_exits_2_and_leaves_nothing(tmp_path, model_dir, monkeypatch, capsys):
    g = tmp_path / "g.yaml"
    g.write_text(REFUSED_GRID.format(model=model_dir))
    code, out, err = cli(["run", g, "--out", tmp_path / "res"], monkeypatch, capsys)
    assert code == 2, (out, err)
    assert "Traceback" not in err and "FailedJobError" not in err
    assert "Slurm refused" in err and "invalid partition" in err.lower()  # what Slurm said
    assert not (tmp_path / "res" / "refused").exists()  # made for nothing: gone


@pytest.mark.slurm
def test_refused_sbatch_rolls_back_the_runs_it_touched(tmp_path):
    from klsweep.submit.slurm import SubmissionRefused

    sweep = tmp_path / "refused"
    plan = jobs.make_plan(sweep, [0, 1, 2], **{"cluster.partition": "no_such_partition"})
    done, failed, new = plan.runs
    # done means a whole final checkpoint (else status reads it incomplete)
    store.write_status(done.run_dir, "done", step=3, final_checkpoint=jobs.final_checkpoint(done.run_dir, 3))
    store.write_status(failed.run_dir, "failed", step=3)
    before = {r.id: (r.run_dir / store.STATUS_FILE).read_bytes() for r in (done, failed)}
    with pytest.raises(SubmissionRefused, match="(?i)invalid partition"):
        submit.submit(plan, "slurm", retry_failed=True, train_fn=jobs.ok_train)
    assert (failed.run_dir / store.STATUS_FILE).read_bytes() == before[failed.id]  # not left 'pending'
    assert (done.run_dir / store.STATUS_FILE).read_bytes() == before[done.id]
    assert not new.run_dir.exists()  # made by the refused submission: removed
    assert not (sweep / store.JOBS_FILE).exists()  # no row for a job that does not exist
    assert not (sweep / store.SWEEP_FILE).exists() and not list((sweep / "submitit").glob("*"))
    assert {r.run_id: r.state for r in submit.status(sweep)} == {done.id: "done", failed.id: "failed"}


@pytest.mark.slurm
def test_arrays_split_at_the_clusters_max_array_size(tmp_path, monkeypatch):
    from klsweep.submit import slurm

    slurm.max_array_size.cache_clear()
    assert slurm.max_array_size() == 1001  # the local cluster's (scontrol show config)
    monkeypatch.setattr(slurm, "max_array_size", lambda: 2)  # 5 runs: arrays of 2, 2 and 1 (real sbatch)
    sweep = tmp_path / "split"
    plan = jobs.make_plan(sweep, list(range(5)))
    res = submit.submit(plan, "slurm", train_fn=jobs.ok_train)
    assert res.sbatch_calls == 3
    arrays = Counter(row["job_id"].split("_")[0] for row in res.jobs)
    assert sorted(arrays.values()) == [1, 2, 2]
    final = submit.wait_until_final(sweep, poll_s=0.5, timeout_s=240)
    assert {r.state for r in final} == {"done"} and len(final) == 5


# ------------------------------------------------------------------------------------------------------------
# 3. A torn line in metrics.jsonl: skipped and counted, the rows after it kept
# ------------------------------------------------------------------------------------------------------------


def test_torn_lines_are_skipped_and_a_cut_keeps_everything_before_the_checkpoint(tmp_path):
    rows = [f'{{"step": {s}, "reward_mean": 0.{s}}}\n' for s in range(1, 7)]
    rows[2] = '{"step": 3, "rew\n'  # torn in the middle
    path = tmp_path / store.METRICS_FILE
    path.write_text("".join(rows) + '{"step": 7, "rewa')  # and a writer killed mid-line
    got, bad = store.scan_jsonl(path)
    assert [r["step"] for r in got] == [1, 2, 4, 5, 6] and bad == [3]  # the rows after it are kept
    kept = store.cut_metrics(tmp_path, 4)  # resume from checkpoint-4
    assert [r["step"] for r in kept.rows] == [1, 2, 4] and [a.line for a in kept.aside] == [3]
    assert path.read_text() == "".join(rows[:4])  # only the rows past the checkpoint are cut
    store.append_jsonl(path, {"step": 5})
    assert [r["step"] for r in store.read_metrics(tmp_path)] == [1, 2, 4, 5]
    path.write_text('{"step": 1}\n{"step": 2}')  # a whole last row without its newline is kept and ended
    assert [r["step"] for r in store.cut_metrics(tmp_path, 2).rows] == [1, 2]
    store.append_jsonl(path, {"step": 3})
    assert [r["step"] for r in store.read_metrics(tmp_path)] == [1, 2, 3]


def test_resume_keeps_the_valid_rows_after_a_torn_line(tmp_path, model_dir):
    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.steps": 6, "train.save_steps": 4})
    assert job.train_run(run)["state"] == "done"
    lines = (run / store.METRICS_FILE).read_text().splitlines(keepends=True)
    lines[1] = lines[1][:20] + "\n"  # step 2 torn
    (run / store.METRICS_FILE).write_text("".join(lines))
    (run / "checkpoints" / "checkpoint-6" / store.TRAINER_STATE).unlink()  # resume from checkpoint-4
    store.write_status(run, "running")
    status = job.train_run(run)
    assert status["state"] == "done", status.get("error")
    assert [r["step"] for r in store.read_metrics(run)] == [1, 3, 4, 5, 6]  # 3 and 4 survive, 5-6 retrained
    assert any("1 unreadable line(s) skipped (line 2)" in w for w in status["warnings"])


def test_report_counts_a_torn_metrics_line_and_keeps_the_rows_after_it(tmp_path):
    from klsweep.report import build_report

    sweep = fixture_copy(tmp_path)
    path = sweep / "a1-k1rew-s0" / store.METRICS_FILE
    lines = path.read_text().splitlines(keepends=True)
    n = len(lines)
    lines[5] = "{torn\n"
    path.write_text("".join(lines))
    rep = build_report(sweep, tmp_path / "out", formats=("md",))
    assert rep.runs.set_index("run").loc["a1-k1rew-s0", "last logged step"] == n
    assert any(str(path) in line and "1 unreadable line" in line for line in rep.set_aside)
    assert "Set aside" in (tmp_path / "out" / "report.md").read_text()


# ------------------------------------------------------------------------------------------------------------
# 4. A truncated status.json or config.yaml: that run is unreadable (named, what to do), the others carry on
# ------------------------------------------------------------------------------------------------------------


def test_truncated_status_sets_one_run_aside_in_status_report_and_eval(tmp_path, monkeypatch, capsys):
    from klsweep.report import build_report
    from klsweep.submit.evals import eval_request

    sweep = with_shipped_eval_tasks(fixture_copy(tmp_path))
    bad = sweep / "a1-k1rew-s0" / store.STATUS_FILE
    cut_in_half(bad)

    runs = {r.run_id: r for r in submit.status(sweep)}
    assert runs["a1-k1rew-s0"].state == "unreadable" and str(bad) in runs["a1-k1rew-s0"].reason
    assert "klsweep run" in runs["a1-k1rew-s0"].reason  # what to do
    assert runs["b1-k3loss-s0"].state == "done" and runs["c1-k3rew-s0"].state == "diverged"
    code, out, err = cli(["status", sweep], monkeypatch, capsys)
    assert code == 0 and "unreadable" in out and str(bad) in out.replace("\n", "")

    rep = build_report(sweep, tmp_path / "out", formats=("md",))
    assert "a1-k1rew-s0" not in set(rep.runs["run"]) and len(rep.runs) == 7
    assert any(str(bad) in line for line in rep.set_aside)
    code, out, err = cli(["report", sweep, "--out", tmp_path / "out2", "-q"], monkeypatch, capsys)
    assert code == 0 and "set aside" in err and "Traceback" not in err

    request = eval_request(sweep)
    why = request.skipped[str(sweep / "a1-k1rew-s0")]
    assert why.startswith("unreadable") and str(bad) in why
    assert sweep / "b1-k3loss-s0" in request.runs


def test_truncated_config_is_named_not_reported_as_a_configuration(tmp_path):
    from klsweep.report import build_report
    from klsweep.submit.evals import eval_request

    sweep = with_shipped_eval_tasks(fixture_copy(tmp_path))
    bad = sweep / "a1-k1rew-s0" / store.CONFIG_FILE
    cut_in_half(bad)
    rep = build_report(sweep, tmp_path / "out", formats=("md",))
    assert "a1-k1rew-s0" not in set(rep.runs["run"])
    assert rep.runs["config"].nunique() == 3  # no fourth "—" configuration
    assert any(str(bad) in line for line in rep.set_aside)
    request = eval_request(sweep)  # not "the runs have different eval settings"
    assert str(bad) in request.skipped[str(sweep / "a1-k1rew-s0")]
    assert {r.run_id: r.state for r in submit.status(sweep)}["a1-k1rew-s0"] == "unreadable"


def test_run_sets_an_unreadable_run_aside_and_submits_the_others(tmp_path):
    sweep = tmp_path / "unreadable"
    plan = jobs.make_plan(sweep, [0, 1])
    submit.submit(plan, "debug", train_fn=jobs.ok_train)
    broken, fine = plan.runs
    cut_in_half(broken.run_dir / store.STATUS_FILE)
    store.write_status(fine.run_dir, "failed")
    res = submit.submit(plan, "debug", retry_failed=True, train_fn=jobs.ok_train)
    assert res.actions == {broken.id: "skip-unreadable", fine.id: "resume"}
    assert any(broken.id in h and store.STATUS_FILE in h for h in res.hints())
    assert store.read_status(fine.run_dir)["state"] == "done"


def test_status_refuses_a_fifo_in_place_of_a_run_file_without_waiting_on_it(tmp_path):
    """A FIFO where a run's metrics.jsonl, status.json or config.yaml (and sweep.yaml) should be: a plain
    open() waits on it for a writer, for ever; status names each such run unreadable at once (what is there,
    what to do) and shows the others."""
    sweep = fixture_copy(tmp_path)
    fifos = [
        sweep / store.SWEEP_FILE,  # so that status reads each run's config.yaml for its axes
        sweep / "a1-k1rew-s0" / store.METRICS_FILE,
        sweep / "b1-k3loss-s0" / store.STATUS_FILE,
        sweep / "c1-k3rew-s0" / store.CONFIG_FILE,
    ]
    for path in fifos:
        path.unlink()
        os.mkfifo(path)
    out = subprocess.run(
        [sys.executable, "-m", "klsweep", "status", str(sweep), "--json"],
        capture_output=True,
        text=True,
        timeout=120,  # a hang fails here
    )
    assert out.returncode == 0, out.stderr
    runs = {r["run_id"]: r for r in json.loads(out.stdout)}
    for path in fifos[1:]:
        run = runs[path.parent.name]
        assert run["state"] == "unreadable", run
        assert str(path) in run["reason"] and "FIFO" in run["reason"] and "remove it" in run["reason"]
    others = {rid: r["state"] for rid, r in runs.items() if rid not in {p.parent.name for p in fifos[1:]}}
    assert len(others) == 5 and "unreadable" not in others.values(), others
    (sweep / "a2-k1rew-s1" / store.ENV_FILE).unlink(missing_ok=True)
    os.mkfifo(sweep / "a2-k1rew-s1" / store.ENV_FILE)  # read by the report only
    report = subprocess.run(
        [sys.executable, "-m", "klsweep", "report", str(sweep), "--out", str(tmp_path / "report")],
        capture_output=True,
        text=True,
        timeout=300,  # a hang fails here
        env={**os.environ, "COLUMNS": "400"},
    )
    assert report.returncode == 0, report.stderr
    for path in fifos[
        1:
    ]:  # the run with a FIFO for its metrics is reported without them; the others set aside
        assert f"{path}: not a regular file but a FIFO" in report.stderr, report.stderr
    assert (tmp_path / "report" / "report.md").is_file()


# ------------------------------------------------------------------------------------------------------------
# 5. Names from overrides: the grid's name rule, wherever the name comes from
# ------------------------------------------------------------------------------------------------------------

SMALL_GRID = "name: small\nbase:\n  model.path: /models/m\ngrid:\n  seed: 0,1\n"


def test_name_overrides_are_checked_like_a_grid_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    g = tmp_path / "g.yaml"
    g.write_text(SMALL_GRID)
    escape = tmp_path / "escape"
    with pytest.raises(UserError, match="name") as e:
        grid.load_plan(g, ["name=../../escape"], out=tmp_path / "res")
    assert "command line: name=../../escape" in str(e.value)
    code, out, err = cli(["run", g, "name=../../escape", "--out", tmp_path / "res"], monkeypatch, capsys)
    assert code == 2 and "not a valid sweep name" in err
    assert grid.load_plan(g, ["name=renamed"], out=tmp_path / "res").sweep_dir == tmp_path / "res" / "renamed"

    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text("model:\n  path: /models/m\n")
    with pytest.raises(UserError, match="not a valid sweep name"):
        grid.compose_run_config(run_yaml, [f"name={escape}"])
    code, out, err = cli(["train", run_yaml, f"name={escape}"], monkeypatch, capsys)
    assert code == 2 and "not a valid sweep name" in err and "Traceback" not in err
    run_yaml.write_text("name: ../x\nmodel:\n  path: /models/m\n")
    with pytest.raises(UserError, match=r"run.yaml.name: '\.\./x' is not a valid sweep name"):
        grid.compose_run_config(run_yaml, [])
    assert not escape.exists() and not (tmp_path / "results").exists()


# ------------------------------------------------------------------------------------------------------------
# 6. Huge grids and YAML alias bombs: refused before they are expanded
# ------------------------------------------------------------------------------------------------------------


def _bounded(fn) -> tuple[Exception, float, int]:
    """fn's exception, the seconds and the peak Python memory (bytes) it took."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        fn()
    except Exception as e:
        err = e
    else:
        raise AssertionError("not refused")
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return err, seconds, peak


def test_a_million_run_grid_is_refused_at_once(tmp_path):
    g = tmp_path / "g.yaml"
    g.write_text("name: huge\ngrid:\n  kl.estimator: k1,k3\n  seed: range(1000000)\n")
    grid.load_plan(_small(tmp_path), out=tmp_path / "res")  # Hydra's imports, once
    err, seconds, peak = _bounded(lambda: grid.load_plan(g))
    assert isinstance(err, UserError) and "2,000,000 runs" in str(err) and "--max-runs" in str(err)
    # loose bounds (it was 3 minutes to a MemoryError at 11.8 GB): never listed, never expanded
    assert seconds < 60 and peak < 200e6, (seconds, peak)


def _small(tmp_path: Path) -> Path:
    g = tmp_path / "small.yaml"
    g.write_text(SMALL_GRID)
    return g


def test_the_run_limit_is_configurable(tmp_path, monkeypatch):
    g = tmp_path / "g.yaml"
    g.write_text("name: mid\ngrid:\n  - {seed: range(20)}\n  - {seed: range(20), kl.beta: 0.1}\n")
    with pytest.raises(UserError, match="40 runs .* more than the limit of 30"):
        grid.load_plan(g, max_runs=30)
    monkeypatch.setenv("KLSWEEP_MAX_RUNS", "30")
    with pytest.raises(UserError, match="limit of 30"):
        grid.load_plan(g)
    with pytest.raises(UserError, match="limit of 10"):  # a command-line sweep replaces the file's axis
        grid.load_plan(g, ["seed=range(0,12,1)"], max_runs=10)
    assert len(grid.load_plan(g, max_runs=40).runs) == 40


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path):
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]" for p, c in zip("abcdefg", "bcdefgh", strict=False)]
    g = tmp_path / "bomb.yaml"
    g.write_text("name: bomb\n" + "\n".join(levels) + "\ngrid:\n  seed: *h\n")  # 10**8 values
    err, seconds, peak = _bounded(lambda: grid.load_plan(g))
    assert isinstance(err, UserError) and "alias bomb" in str(err)
    assert seconds < 30 and peak < 100e6, (seconds, peak)
    g.write_text("name: loop\ngrid: &x\n  seed: [*x]\n")
    with pytest.raises(UserError, match="expands without end"):
        grid.load_plan(g)


# ------------------------------------------------------------------------------------------------------------
# 7. User errors that were tracebacks: located exit-2 messages, nothing left behind
# ------------------------------------------------------------------------------------------------------------


def test_bad_files_names_and_folders_are_located_exit_2(tmp_path, monkeypatch, capsys):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    code, out, err = cli(["plan", binary], monkeypatch, capsys)
    assert code == 2 and f"{binary}: not a text file" in err and "Traceback" not in err

    long_name = tmp_path / "long.yaml"
    long_name.write_text(SMALL_GRID.replace("name: small", "name: " + "n" * 300))
    code, out, err = cli(["run", long_name, "--out", tmp_path / "res"], monkeypatch, capsys)
    assert code == 2 and "300 characters is too long" in err
    assert not (tmp_path / "res").exists()  # nothing left behind

    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for command in ("plan", "run"):
        code, out, err = cli([command, _small(tmp_path), "--out", a_file], monkeypatch, capsys)
        assert code == 2 and "--out" in err and "is a file, not a folder" in err, err

    # a study told to compare its claims with a file that is not a claims.csv stops before anything runs
    tiny = Path(__file__).resolve().parents[2] / "sweeps" / "tiny.yaml"
    for expected in (binary, tmp_path / "missing.csv"):
        code, out, err = cli(
            ["study", tiny, "--expect-claims", expected, "--out", tmp_path / "res"], monkeypatch, capsys
        )
        assert code == 2 and f"{expected}: not a readable claims.csv" in err, err
    assert not (tmp_path / "res").exists()


def test_a_read_only_sweep_folder_is_a_located_exit_2(tmp_path):
    from mounts import without_root_powers

    sweep = fixture_copy(tmp_path)
    results = tmp_path / "results"
    results.mkdir()
    g = tmp_path / "g.yaml"
    g.write_text(SMALL_GRID)
    for folder in (sweep, results):
        folder.chmod(0o555)
    try:
        for args in (
            ["report", sweep],
            ["eval", sweep, "--cluster", "debug"],
            ["run", g, "--out", results],
            ["cancel", sweep],  # an OSError traceback before (issue 47 item 12)
        ):
            proc = subprocess.run(
                [*without_root_powers(), sys.executable, "-m", "klsweep.cli", *map(str, args)],
                capture_output=True,
                text=True,
                timeout=300,
                # online: offline, `run` refuses the model of the grid, /models/m, first (no such folder)
                env={**{k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}, "COLUMNS": "400"},
            )
            assert proc.returncode == 2, (args, proc.stderr)
            assert "cannot write in" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    finally:
        for folder in (sweep, results):
            folder.chmod(0o755)
    assert not (results / "small").exists()


# ------------------------------------------------------------------------------------------------------------
# 8. A collapse in the first full window: the one rule stops the run, and status and report agree
# ------------------------------------------------------------------------------------------------------------


def test_a_collapse_at_step_2_is_caught_and_reads_collapsed_everywhere(tmp_path, model_dir, monkeypatch):
    from klsweep import tasks
    from klsweep.console import status_table
    from klsweep.report import build_report

    def falling_reward(prompts, completions, answer, trainer_state, **kwargs):
        return [0.19 if trainer_state.global_step < 1 else 0.0] * len(completions)

    monkeypatch.setattr(tasks, "reward_function", lambda task: falling_reward)
    sweep = tmp_path / "collapse"
    run = sweep / "r1"
    # a window of 2 steps: a collapse is judged on full windows only (issue 49), the first one here at step 2
    config = write_config(run, model_dir, **{"train.steps": 8, "train.collapse_window": 2})
    rule = (2, 0.5, 5.5)  # each step's completions all score alike: no spread, the fraction decides
    assert tuple(config["train"][f"collapse_{k}"] for k in ("window", "fraction", "z")) == rule
    status = job.train_run(run)
    assert status["state"] == "diverged", status  # windows (steps 1-2) 0.095, then (2-3) 0 < 0.5 x 0.095
    assert status["diverged_step"] == 3 and status["reason"].startswith("reward collapse")
    assert [r["step"] for r in store.read_metrics(run)] == [1, 2, 3]

    rep = build_report(sweep, tmp_path / "out", formats=("md",))
    assert rep.runs.iloc[0]["collapse_step"] == 3 and bool(rep.runs.iloc[0]["collapsed"])
    (row,) = submit.status(sweep)
    assert row.collapsed
    from rich.console import Console

    console = Console(width=80, record=True)
    console.print(status_table([row]))
    assert "collapsed" in console.export_text()


# ------------------------------------------------------------------------------------------------------------
# 9. Unclear states: killed without a word; the flag that reruns skipped runs
# ------------------------------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_a_killed_run_says_it_died_without_a_word(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "killed"
    plan = jobs.make_plan(sweep, [0])
    submit.submit(plan, "local", train_fn=jobs.slow_train)
    run_dir = plan.runs[0].run_dir
    start = time.time()
    while not (run_dir / "progress.txt").exists() or int((run_dir / "progress.txt").read_text() or 0) < 2:
        assert time.time() - start < 120, "the job never started"
        time.sleep(0.2)
    (row,) = [r for r in store.read_jsonl(sweep / store.JOBS_FILE) if r.get("job_id")]
    tasks = _children(int(row["job_id"]))  # submitit's controller runs the job in a child process
    assert tasks
    for pid in tasks:
        os.kill(pid, signal.SIGKILL)  # kill -9
    (run,) = submit.wait_until_final(sweep, poll_s=0.5, timeout_s=120)
    assert run.state == "failed"
    assert run.reason.startswith("the process died without a word")
    assert run.log_tail[0] == run.reason
    assert run.log == str(run_dir / "logs" / f"train-{row['job_id']}.err")  # the run's own copy of its log
    code, out, err = cli(["status", sweep], monkeypatch, capsys)
    assert code == 0 and "died without a word" in out and f"log: {run.log}" in out.splitlines()


def test_skipped_failed_and_cancelled_runs_name_retry_failed(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(
        "HF_HUB_OFFLINE"
    )  # offline, `run` refuses the grid's model, /models/m (no such folder)
    g = _small(tmp_path)
    plan = grid.load_plan(g, out=tmp_path / "res")
    for run, state in zip(plan.runs, ("failed", "cancelled"), strict=True):
        store.write_status(run.run_dir, state)
    res = submit.submit(plan, "debug", train_fn=jobs.ok_train)
    assert set(res.actions.values()) == {"skip-failed"}
    (hint,) = res.hints()
    assert "2 run(s)" in hint and "--retry-failed" in hint
    code, out, err = cli(["run", g, "--out", tmp_path / "res"], monkeypatch, capsys)
    assert code == 0 and "2 skip-failed" in out and "rerun with --retry-failed" in out


# ------------------------------------------------------------------------------------------------------------
# Issue 21: a corrupt latest checkpoint, a cancelled eval, a report before any run finished, slurmctld down,
# an sbatch option name that is a shell line, a memory error under another error
# ------------------------------------------------------------------------------------------------------------


def test_a_corrupt_latest_checkpoint_falls_back_to_the_one_before(tmp_path, model_dir):
    """`klsweep train` killed (kill -9) after a few checkpoints, its newest model.safetensors cut short (a full
    disk): the rerun resumed from it and failed (SafetensorError: invalid header length), then read
    skip-failed. Now it resumes from the checkpoint before, says so in status.json, trains every step once."""
    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.steps": 10, "train.save_steps": 2})
    train = [
        sys.executable,
        "-m",
        "klsweep.cli",
        "train",
        str(run / store.CONFIG_FILE),
        "--run-dir",
        str(run),
    ]
    proc = subprocess.Popen(train, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    start = time.time()
    while len([c for c in store.checkpoints(run) if (c / store.TRAINER_STATE).exists()]) < 2:
        assert proc.poll() is None and time.time() - start < 300, "it never saved two checkpoints"
        time.sleep(0.1)
    proc.kill()  # kill -9
    proc.wait()
    found = [c for c in store.checkpoints(run) if (c / store.TRAINER_STATE).exists()]
    newest, before = found[-1], found[-2]
    cut_in_half(newest / "model.safetensors")
    assert "model.safetensors: cut short" in store.checkpoint_problem(newest)

    done = subprocess.run(train, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    status = store.read_status(run)
    assert status["state"] == "done"
    (warning,) = [w for w in status["warnings"] if w.startswith("cannot resume")]
    assert f"{newest} (model.safetensors: cut short" in warning and f"resuming from {before.name}" in warning
    assert [r["step"] for r in store.read_jsonl(run / store.METRICS_FILE)] == list(
        range(1, 11)
    )  # each step once
    assert (newest.parent / f"unusable-{newest.name}").is_dir()  # set aside, not deleted

    # none usable: from step 0, with a warning, never a failed run
    store.write_status(run, "running")
    for checkpoint in store.checkpoints(run):
        (checkpoint / store.FINAL_MARKER).unlink(missing_ok=True)
        cut_in_half(checkpoint / "optimizer.pt")
    status = job.train_run(run)
    assert status["state"] == "done", status.get("error")
    assert any("none usable: training from step 0" in w for w in status["warnings"])
    assert [r["step"] for r in store.read_metrics(run)] == list(range(1, 11))


def _controller_down(tmp_path: Path, monkeypatch) -> None:
    """Slurm's commands of this test talk to a controller port nobody listens on (a copy of the cluster's
    slurm.conf): the shared cluster goes on; accounting (slurmdbd) still answers."""
    conf = Path(os.environ["SLURM_CONF"])
    text = "".join(
        line for line in conf.read_text().splitlines(keepends=True) if not line.startswith("SlurmctldPort")
    )
    down = tmp_path / "slurm-down.conf"
    down.write_text(text + f"SlurmctldPort={closed_port()}\n")
    monkeypatch.setenv("SLURM_CONF", str(down))


@pytest.mark.slurm
def test_an_unreachable_slurm_controller_is_named_fast_by_status_and_run(
    tmp_path, model_dir, monkeypatch, capsys
):
    """slurmctld down: `status` said nothing of it (9.6 s for its first call), `run` took 31 s and then
    blamed the user's cluster settings. Now both name the controller within seconds; run exits 2, writes
    nothing."""
    sweep = tmp_path / "ctld"
    plan = jobs.make_plan(sweep, [0])
    submit.submit(plan, "slurm", train_fn=jobs.ok_train)
    assert {r.state for r in submit.wait_until_final(sweep, poll_s=0.5, timeout_s=240)} == {"done"}

    _controller_down(tmp_path, monkeypatch)
    start = time.time()
    code, out, err = cli(["status", sweep], monkeypatch, capsys)
    assert time.time() - start < 5
    assert code == 0 and "Traceback" not in err
    assert "the Slurm controller does not answer" in " ".join(err.split()), err
    assert plan.runs[0].id in out and "done" in out  # the runs still shown, from their files and accounting

    g = tmp_path / "g.yaml"
    g.write_text(REFUSED_GRID.format(model=model_dir).replace("  cluster.partition: no_such_partition\n", ""))
    start = time.time()
    code, out, err = cli(["run", g, "--out", tmp_path / "res"], monkeypatch, capsys)
    assert time.time() - start < 10
    flat = " ".join(err.split())
    assert code == 2 and "Traceback" not in err, (out, err)
    assert "the Slurm controller does not answer" in flat and "scontrol ping" in flat
    assert "cluster settings" not in flat  # not the user's settings
    assert not (tmp_path / "res" / "refused").exists()  # nothing half-written


@pytest.mark.slurm
def test_cancel_names_an_unreachable_slurm_controller_fast_and_changes_nothing(tmp_path, monkeypatch, capsys):
    """slurmctld down while a run's job is live: `cancel` waited on scancel's own timeouts and retries, then
    marked the run cancelled with its job still there. Now it names the controller within seconds, exits 2 and
    leaves the run as it was; once the controller answers, the same command cancels it."""
    sweep = tmp_path / "ctldcancel"
    plan = jobs.make_plan(sweep, [0])
    submit.submit(plan, "slurm", train_fn=jobs.slow_train)
    run_dir = plan.runs[0].run_dir
    deadline = time.time() + 120
    while not (run_dir / "progress.txt").exists():
        assert time.time() < deadline, "the job did not start"
        time.sleep(0.5)
    up = os.environ["SLURM_CONF"]

    _controller_down(tmp_path, monkeypatch)
    start = time.time()
    code, out, err = cli(["cancel", sweep], monkeypatch, capsys)
    took = time.time() - start
    flat = " ".join(err.split())
    assert code == 2 and "Traceback" not in err, (out, err)
    assert "the Slurm controller does not answer" in flat and "scontrol ping" in flat
    assert took < 10, took
    assert store.read_status(run_dir)["state"] == "running"  # nothing changed

    monkeypatch.setenv("SLURM_CONF", up)
    code, out, err = cli(["cancel", sweep], monkeypatch, capsys)
    assert code == 0 and plan.runs[0].id in out, (out, err)
    assert store.read_status(run_dir)["state"] == "cancelled"


def scancel_at_once(job_id: str) -> None:
    """scancel a job whose processes stop at once. A plain scancel's SIGTERM is ignored by submitit's job, which
    goes on working for KillWait seconds (an eval scored all its checkpoints on a loaded machine; CI failed on
    it once), and slurmctld turns --signal=KILL into that same sequence. So: SIGSTOP the job's processes, cancel
    the job (its state CANCELLED, as a user's scancel leaves it), SIGKILL them before its SIGCONT lets them on."""
    listed = subprocess.run(["scontrol", "listpids", job_id], capture_output=True, text=True, check=True)
    pids = [int(line.split()[0]) for line in listed.stdout.splitlines()[1:] if line.split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    subprocess.run(["scancel", job_id], check=True)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slurm
def test_an_eval_cancelled_part_way_reads_partial_and_is_not_scored(tmp_path, model_dir, monkeypatch, capsys):
    """`klsweep eval --checkpoints all` on Slurm, scancel of its job once some checkpoints are scored: status
    said eval done (any results.json counted) and the report scored the run at that checkpoint beside others
    at their last. Now the eval is partial until the run's final checkpoint is scored, and the report leaves
    the run unscored and says so."""
    sweep = tmp_path / "evalcut"
    values = {"model.path": str(model_dir), **TRAIN, "train.steps": 24, "train.keep_checkpoints": None}
    # 12 checkpoints to score: the scancel below stops the job within one, long before the last
    from omegaconf import OmegaConf

    from klsweep import evaluate

    suite = OmegaConf.to_container(OmegaConf.structured(evaluate.load_suite("tiny"))) | {"limit": 2}
    plan = jobs.make_plan(sweep, [0, 1], **{**values, "eval": suite})
    submit.submit(plan, "debug", chain_eval=False)  # trains both here: checkpoints 2, 4, ..., 24
    whole, cut = plan.runs
    assert [c.name for c in store.checkpoints(cut.run_dir)][-1] == "checkpoint-24"
    assert not submit.submit_eval(whole.run_dir, cluster="debug").errors  # scored at its final checkpoint

    res = submit.submit_eval(cut.run_dir, cluster="slurm", checkpoints="all")
    (job_id,) = res.jobs
    start = time.time()
    while not store.evaluated_checkpoints(cut.run_dir):
        assert time.time() - start < 400, "the eval job never scored a checkpoint"
        time.sleep(0.2)
    scancel_at_once(job_id)
    start = time.time()
    while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
        assert time.time() - start < 60, "the cancelled eval job never left the queue"
        time.sleep(0.2)
    scored = store.evaluated_checkpoints(cut.run_dir)
    assert scored and "checkpoint-24" not in scored, scored  # cancelled part-way

    by_id = {r.run_id: r for r in submit.status(sweep)}
    assert by_id[whole.id].eval_state == "done"
    assert by_id[cut.id].eval_state == "partial"
    assert "not the final checkpoint-24" in by_id[cut.id].eval_error
    code, out, err = cli(["status", sweep, "--json"], monkeypatch, capsys)
    assert code == 0 and '"eval_state": "partial"' in out

    code, out, err = cli(["report", sweep, "--no-wandb"], monkeypatch, capsys)
    assert code == 0, err
    flat = " ".join(err.split())
    assert f"run {cut.id}: not scored: {scored[0]}" in flat and "its final checkpoint-24 is not" in flat
    from klsweep import report as rp

    runs = rp.build_report(sweep, formats=("md",), wandb=False).runs.set_index("run")
    assert runs.loc[whole.id, "eval_checkpoint"] == "checkpoint-24"
    assert (
        runs.loc[cut.id, "eval_checkpoint"] not in scored
    )  # not scored at checkpoint-2 beside the other's -24
    assert math.isnan(runs.loc[cut.id, "in-domain avg"])


INJECTION_GRID = """\
name: inject
base:
  cluster: slurm
  model.path: {model}
  cluster.additional_parameters: {{"comment=ok\\ntouch {pwned}\\n#": "1", exclude: node13}}
grid:
  seed: 0,1
"""


def test_an_sbatch_option_name_holding_a_shell_line_is_refused_at_plan_time(
    tmp_path, model_dir, monkeypatch, capsys
):
    """A key of cluster.additional_parameters with a newline passed `plan` and `run` and became a line of the
    sbatch script (the file was created, every later #SBATCH line ignored). Now plan and run refuse it, located,
    exit 2, nothing written; and a hand-edited config.yaml holding one is refused where it reaches submitit."""
    from klsweep.submit.slurm import slurm_parameters

    pwned = tmp_path / "pwned"
    g = tmp_path / "g.yaml"
    g.write_text(INJECTION_GRID.format(model=model_dir, pwned=pwned))
    for command in ("plan", "run"):
        code, out, err = cli([command, g, "--out", tmp_path / "res"], monkeypatch, capsys)
        flat = " ".join(err.split())
        assert code == 2 and "Traceback" not in err, (out, err)
        assert (
            "g.yaml: base.cluster.additional_parameters:" in flat and "is not an sbatch option name" in flat
        )
        assert "1 problem" in flat  # exclude, a real option name, passes
    assert not pwned.exists() and not (tmp_path / "res").exists()

    with pytest.raises(UserError, match="is not an sbatch option name"):
        slurm_parameters({}, {"additional_parameters": {"a\ntouch x": 1}}, "inject", eval_job=False)
    params = slurm_parameters({}, {"additional_parameters": {"mail-type": "END"}}, "ok", eval_job=False)
    assert params["additional_parameters"] == {"mail-type": "END"}


def test_a_memory_error_under_another_error_is_the_reason(tmp_path):
    """A RAM-starved worker failed with "Failed to import trl..." (transformers' lazy import raises that from
    the MemoryError): the reason now says out of memory first. Likewise torch's allocator failing (as under
    `ulimit -v`), and an OSError ENOMEM."""
    from klsweep.errors import describe

    try:
        try:
            raise MemoryError()
        except MemoryError as e:
            raise RuntimeError(
                "Failed to import trl.trainer.grpo_trainer because of the following error (look up to see its "
                "traceback):\nerror return without exception set"
            ) from e
    except RuntimeError as e:
        reason = describe(e)
    assert reason.startswith("out of memory: MemoryError (raised as RuntimeError: Failed to import trl")

    import torch

    with pytest.raises(RuntimeError) as alloc:
        torch.empty(2**62, dtype=torch.uint8)  # the allocator's own error, not a MemoryError
    assert describe(alloc.value).startswith("out of memory: RuntimeError:")
    assert describe(OSError(12, "Cannot allocate memory")).startswith("out of memory: OSError")
    assert describe(RuntimeError("can't start new thread")).startswith("out of memory (or of threads): ")
    assert describe(SystemError("error return without exception set")).startswith("out of memory (likely): ")
    assert describe(ValueError("a value")) == "ValueError: a value"  # others as before


@pytest.mark.slurm
def test_a_slurm_run_under_ulimit_v_says_out_of_memory(tmp_path, model_dir):
    """A training job on Slurm under `ulimit -v` (cluster.setup) failed with "Failed to import trl..." or
    "can't start new thread": its reason never said memory. Now it begins with "out of memory"."""
    sweep = tmp_path / "ulimit"
    values = {"model.path": str(model_dir), **TRAIN, "cluster.setup": ["ulimit -v 1000000"]}
    plan = jobs.make_plan(sweep, [0], **values)
    submit.submit(plan, "slurm", chain_eval=False)
    (run,) = submit.wait_until_final(sweep, poll_s=0.5, timeout_s=300)
    assert run.state == "failed"
    assert "memory" in run.reason.lower(), (
        run.reason
    )  # out of memory: ... (or MemoryError before the run began)


def test_a_trainer_whose_lock_another_node_took_stops_and_writes_nothing_more(model_dir, tmp_path):
    """#32 D4 across the nodes of a shared file system (NFS: a folder's lock holds on its node only): a user
    removes ``.train.lock`` while the run trains and a trainer on another node locks a new one. The first
    trainer finds that at its next step, before writing it, and stops: no more metrics rows, no status of its
    own (the run is the newcomer's), exit 2 naming the newcomer."""
    from runfiles import OTHER_NODE

    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.steps": 400, "train.save_steps": 1000})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    train = [sys.executable, "-m", "klsweep", "train", str(run / store.CONFIG_FILE), "--run-dir", str(run)]
    first = subprocess.Popen(train, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    other = None
    try:
        deadline = time.time() + 180
        while len(store.read_metrics(run)) < 3:
            assert first.poll() is None and time.time() < deadline, "the first trainer never reached step 3"
            time.sleep(0.2)
        other = subprocess.Popen(
            [sys.executable, "-c", OTHER_NODE, str(run)], stdout=subprocess.PIPE, text=True
        )
        assert other.stdout.readline().strip() == "locked"
        taken_at = len(store.read_metrics(run))
        _, err = first.communicate(timeout=120)
        assert first.returncode == 2, err
        assert f"already being trained by pid {other.pid} on node2" in " ".join(err.split())
        assert "Traceback" not in err
        rows = store.read_metrics(run)
        assert taken_at <= len(rows) <= taken_at + 1  # a step checked just before the take may still write
        assert rows[-1]["step"] < 400
        status = store.read_status(run)
        assert status["state"] == "running" and status["step"] == rows[-1]["step"]  # not failed: not its own
    finally:
        for proc in (first, other):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
