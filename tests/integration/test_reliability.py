"""Nothing trains twice, nothing runs that was not asked (issue 21), each fault the way a user meets it, with real
processes and a real kill -9: the local supervisor killed, the job id `status` shows killed, a trainer klsweep
has no record of, a disk that fills during a checkpoint save (a real tmpfs), a crafted result pickle in a
results folder, a run folder that is a symbolic link out of the results folder. Promises: docs/FAULTS.md."""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import launcher_jobs as jobs  # tests/ is on sys.path under pytest
import pytest
from clitools import cli
from runfiles import TRAIN

from klsweep import grid, job, store, submit
from klsweep.submit.jobs import TrainJob

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the job functions below travel by value

STEPS = 12
STEP_S = 0.5
FIXTURE = Path(__file__).parents[1] / "fixtures" / "sweep_tiny"


def metered_train(run_dir: Path) -> dict:
    """``STEPS`` steps of ``STEP_S`` s that resume after the last metrics row, as ``klsweep.job.train_run``
    does; each row names the process that wrote it."""
    rows = store.read_metrics(run_dir)
    done = rows[-1]["step"] if rows else 0
    store.write_status(run_dir, "running", step=done, total_steps=STEPS, started_at=time.time())
    while done < STEPS:
        time.sleep(STEP_S)
        done += 1
        store.append_jsonl(run_dir / store.METRICS_FILE, {"step": done, "pid": os.getpid()})
        store.write_status(run_dir, "running", step=done)
    end = jobs.final_checkpoint(run_dir, done)
    return store.write_status(run_dir, "done", step=done, finished_at=time.time(), final_checkpoint=end)


def counted_eval(run_dir: Path, eval_cfg: dict, checkpoints: str = "last") -> dict:
    """``ok_eval``, counting its calls in the run's evals.txt."""
    with open(run_dir / "evals.txt", "a") as f:
        f.write(f"{os.getpid()}\n")
    return jobs.ok_eval(run_dir, eval_cfg, checkpoints)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def wait_for(cond, what: str, timeout_s: float = 120) -> None:
    start = time.time()
    while not cond():
        assert time.time() - start < timeout_s, what
        time.sleep(0.1)


def steps(run_dir: Path) -> list[int]:
    """Every step the file holds, as written (a step twice is there twice: ``read_metrics`` would set it aside)."""
    return [r["step"] for r in store.read_jsonl(run_dir / store.METRICS_FILE)]


def evals(run_dir: Path) -> int:
    p = run_dir / "evals.txt"
    return len(p.read_text().split()) if p.exists() else 0


def assert_each_step_once_and_one_eval(plan) -> None:
    final = {r.run_id: r for r in submit.wait_until_final(plan.sweep_dir, poll_s=0.5, timeout_s=240)}
    for run in plan.runs:
        assert final[run.id].state == "done", final[run.id]
        assert steps(run.run_dir) == list(range(1, STEPS + 1)), (run.id, store.read_metrics(run.run_dir))
        assert evals(run.run_dir) == 1 and final[run.id].eval_state == "done", run.id


# ------------------------------------------------------------------------------------------------------------
# 1. kill -9 of the local supervisor: its workers die with it; a rerun resumes each run once
# ------------------------------------------------------------------------------------------------------------


def test_kill_9_of_the_supervisor_then_a_rerun_trains_and_evaluates_each_run_once(
    tmp_path, monkeypatch, capsys
):
    sweep = tmp_path / "supkill"
    plan = jobs.make_plan(sweep, [0, 1, 2, 3], **{"cluster.max_local_jobs": 2, "eval.suite": "tiny"})
    submit.submit(plan, "local", train_fn=metered_train, eval_fn=counted_eval)
    wait_for(lambda: sum(len(steps(r.run_dir)) >= 2 for r in plan.runs) >= 2, "two runs never trained")
    rows = store.read_jsonl(sweep / store.JOBS_FILE)
    supervisor = rows[0]["supervisor"]
    workers = {int(r["job_id"]) for r in rows if r.get("worker")}
    processes = workers | {c for w in workers for c in children(w)}
    os.kill(supervisor, signal.SIGKILL)
    # the workers (controllers and the processes training) die with it: none trains on under pid 1
    wait_for(lambda: not any(alive(p) for p in processes), "a worker outlived its supervisor", 3)
    before = {r.id: steps(r.run_dir) for r in plan.runs}
    time.sleep(2 * STEP_S)
    assert {r.id: steps(r.run_dir) for r in plan.runs} == before  # nobody trains them any more

    by_id = {r.run_id: r for r in submit.status(sweep)}
    queued = [r for r in plan.runs if not before[r.id]]
    assert queued
    for run in queued:  # never started: said so, with what to do (was "failed LOST ... (no log)")
        assert "supervisor process is gone" in by_id[run.id].reason and "klsweep run" in by_id[run.id].reason
    code, out, err = cli(["status", sweep], monkeypatch, capsys)
    assert code == 0 and "(no log)" not in out

    again = submit.submit(plan, "local", train_fn=metered_train, eval_fn=counted_eval)
    assert "skip-live" not in again.actions.values(), again.actions  # nothing is left alive to skip
    assert_each_step_once_and_one_eval(plan)


# ------------------------------------------------------------------------------------------------------------
# 2. kill -9 of the job id `status` shows (submitit's local controller): its trainer dies with it; of the trainer
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("victim", ["controller", "worker"])
def test_kill_9_of_the_job_id_status_shows_leaves_no_orphan_trainer(tmp_path, victim):
    """The job id is submitit's controller; the worker is its child process, which trains."""
    sweep = tmp_path / "ctlkill"
    plan = jobs.make_plan(sweep, [0], **{"eval.suite": "tiny"})
    run_dir = plan.runs[0].run_dir
    submit.submit(plan, "local", train_fn=metered_train, eval_fn=counted_eval)
    wait_for(lambda: len(steps(run_dir)) >= 2, "the run never trained")
    (shown,) = submit.status(sweep)
    assert shown.state == "running" and shown.job_id
    controller = int(shown.job_id)
    trainers = children(controller)
    assert trainers
    os.kill(controller if victim == "controller" else trainers[0], signal.SIGKILL)
    wait_for(lambda: not any(alive(p) for p in trainers), "the trainer outlived its job (orphaned)", 3)
    # its training lock goes with it (a killed process's last thread closes its files a moment after the
    # first one is a zombie)
    wait_for(lambda: store.trainer_of(run_dir) is None, "the dead trainer's lock was kept", 3)
    (run,) = submit.wait_until_final(sweep, poll_s=0.5, timeout_s=60)
    assert run.state == "failed" and run.reason.startswith("the process died without a word")
    kept = steps(run_dir)
    time.sleep(2 * STEP_S)
    assert steps(run_dir) == kept  # nobody goes on training it

    again = submit.submit(plan, "local", train_fn=metered_train, eval_fn=counted_eval)
    assert again.actions == {plan.runs[0].id: "resume"}
    assert_each_step_once_and_one_eval(plan)
    pids = [r["pid"] for r in store.read_metrics(run_dir)]
    assert len(set(pids)) == 2 and pids == sorted(pids, key=pids.index)  # two trainers, one after the other


# ------------------------------------------------------------------------------------------------------------
# 3. A trainer klsweep has no record of (one that outlived its job): the run's training lock says it is live
# ------------------------------------------------------------------------------------------------------------

HOLD = """
import sys, time
from klsweep import store
with store.training(sys.argv[1]):
    print("training", flush=True)
    time.sleep(600)
"""


def test_a_run_whose_training_lock_is_held_is_live_and_never_trained_twice(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "held"
    plan = jobs.make_plan(sweep, [0])
    run_dir = plan.runs[0].run_dir
    other = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "training"
        holder = store.trainer_of(run_dir)
        assert holder["pid"] == other.pid

        res = submit.submit(plan, "local", train_fn=metered_train)  # jobs.jsonl knows of no job: still live
        assert res.actions == {plan.runs[0].id: "skip-live"} and res.jobs == []
        (run,) = submit.status(sweep)
        assert run.state == "running"
        code, out, err = cli(["status", sweep], monkeypatch, capsys)
        assert code == 0 and "running" in out and "failed" not in out

        # a second trainer started anyway (a job klsweep submitted before, `klsweep train`) does not train it
        monkeypatch.setattr(store.lock, "TRAIN_LOCK_WAIT_S", 0.5)
        with pytest.raises(store.AlreadyTraining, match=f"already being trained by pid {other.pid}"):
            job.train_run(run_dir)
        code, out, err = cli(
            ["train", run_dir / store.CONFIG_FILE, "--run-dir", run_dir], monkeypatch, capsys
        )
        assert code == 2 and f"already being trained by pid {other.pid}" in err and "Traceback" not in err
        import submitit

        ex = submitit.LocalExecutor(folder=tmp_path / "submitit")
        ex.update_parameters(timeout_min=5, tasks_per_node=2)  # data-parallel: no rank trains, none hangs
        dp_job = ex.submit(TrainJob(str(run_dir), metered_train))
        with pytest.raises(submitit.core.utils.FailedJobError, match="already being trained"):
            dp_job.results()
        assert dp_job.done() and not alive(int(dp_job.job_id))
        assert not (run_dir / store.METRICS_FILE).exists()
        assert store.read_status(run_dir)["state"] == "pending"  # the job did not mark the run failed
    finally:
        other.kill()  # kill -9: the kernel releases the lock
        other.wait()
    assert store.trainer_of(run_dir) is None
    res = submit.submit(plan, "debug", train_fn=metered_train)
    assert res.actions == {plan.runs[0].id: "submit"}
    assert steps(run_dir) == list(range(1, STEPS + 1))


# ------------------------------------------------------------------------------------------------------------
# 4. A disk that fills during a checkpoint save (a real tmpfs): the run fails with its reason
# ------------------------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 64 MiB (resized by the test), mounted for the test; skipped where it cannot be mounted."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from klsweep.tinymodel import random_tiny_model

    return random_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_a_full_disk_during_a_checkpoint_save_fails_the_run_with_its_reason(small_disk, model_dir):
    sweep = small_disk / "full"
    values = {"model.path": str(model_dir), **TRAIN, "train.steps": 12, "train.save_steps": 6}
    plan = jobs.make_plan(sweep, [0], **{**values, "train.keep_checkpoints": 1})
    run_dir = plan.runs[0].run_dir
    submit.submit(plan, "local")
    first = run_dir / store.CHECKPOINTS_DIR / "checkpoint-6" / store.TRAINER_STATE
    wait_for(first.exists, "the first checkpoint was never saved", 300)
    # room for the steps' files and part of the next checkpoint (1.8 MB), not all of it
    used = shutil.disk_usage(small_disk).used
    subprocess.run(["mount", "-o", f"remount,size={used + 900_000}", str(small_disk)], check=True)
    (run,) = submit.wait_until_final(sweep, poll_s=0.5, timeout_s=300)

    status = store.read_status(run_dir)
    assert status["state"] == "failed" and run.state == "failed", status
    assert status["reason"].startswith("OSError: No space left on device"), status
    assert run.reason == status["reason"]  # not "the process died without a word"
    (log,) = (run_dir / "logs").glob("train-*.err")
    assert log.stat().st_size and "Traceback" in log.read_text()
    assert run.log == str(log)
    pool = store.read_json(next((sweep / "submitit").glob("*/pool.json")))
    assert [s["state"] for s in pool] == ["failed"]  # not stuck claimed
    # the last complete checkpoint is intact; the one cut short is gone
    assert [c.name for c in store.checkpoints(run_dir)] == ["checkpoint-6"]
    assert steps(run_dir) == list(range(1, 13))


# ------------------------------------------------------------------------------------------------------------
# 9. A read-only command never executes anything from a results folder
# ------------------------------------------------------------------------------------------------------------


class _Payload:
    """Unpickling it creates the file ``path``."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_status_never_unpickles_a_result_file_from_the_results_folder(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep_tiny"
    shutil.copytree(FIXTURE, sweep, ignore=shutil.ignore_patterns("make_fixture.py"))
    run_id = store.run_dirs(sweep)[0].name
    evil = tmp_path / "received" / "submitit"
    evil.mkdir(parents=True)
    pwned = tmp_path / "pwned"
    (evil / "999999_0_result.pkl").write_bytes(pickle.dumps(("success", _Payload(str(pwned)))))
    (evil / "999998_0_result.pkl").write_bytes(pickle.dumps((_Payload(str(pwned)), None)))
    for kind, job_id in (("train", "999999"), ("eval", "999998")):  # local jobs whose process is gone
        row = {"run_id": run_id, "kind": kind, "cluster": "local", "job_id": job_id, "folder": str(evil),
               "submitted_at": time.time(), "supervisor": None}  # fmt: skip
        store.append_jsonl(sweep / store.JOBS_FILE, row)
    for args in (["status", sweep], ["status", sweep, "--json"]):
        code, out, err = cli(args, monkeypatch, capsys)
        assert code == 0 and "Traceback" not in err, err
        assert not pwned.exists(), args
    runs = {r.run_id: r for r in submit.status(sweep)}
    assert not pwned.exists()
    assert runs[run_id].job_state == "COMPLETED"  # submitit's outcome, read without running the pickle
    # a real submitit result file reads the same
    from klsweep.submit.scheduler import _result_state

    (evil / "1_0_result.pkl").write_bytes(cloudpickle.dumps(("success", {"state": "done"})))
    (evil / "2_0_result.pkl").write_bytes(cloudpickle.dumps(("error", "Traceback ...")))
    states = [_result_state(evil, j) for j in ("1", "2", "999998", "3")]
    assert states == ["COMPLETED", "FAILED", "FAILED", "FAILED"]
    assert not pwned.exists()


# ------------------------------------------------------------------------------------------------------------
# 10. A run folder that is a symbolic link out of the results folder: refused, located, exit 2
# ------------------------------------------------------------------------------------------------------------

GRID = "name: linked\nbase:\n  model.path: /models/m\ngrid:\n  seed: 0,1\n"


def test_a_run_folder_linked_out_of_the_results_folder_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE")  # offline, `run` refuses the grid's model, /models/m, first
    g = tmp_path / "g.yaml"
    g.write_text(GRID)
    res = tmp_path / "res"
    plan = grid.load_plan(g, out=res)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = plan.runs[0].run_dir
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere)
    for extra in ([], ["--force"], ["--cluster", "debug"]):
        code, out, err = cli(["run", g, "--out", res, *extra], monkeypatch, capsys)
        assert code == 2, (extra, err)
        assert str(link) in err and "leads out of" in err and "Traceback" not in err, err
    assert list(elsewhere.iterdir()) == []  # nothing written there
    assert not (link.parent / store.SWEEP_FILE).exists() and link.is_symlink()  # nor anything else
    link.unlink()  # a run folder of its own, whose checkpoints/ leads elsewhere
    link.mkdir()
    (link / store.CHECKPOINTS_DIR).symlink_to(elsewhere)
    code, out, err = cli(["run", g, "--out", res, "--cluster", "debug"], monkeypatch, capsys)
    assert code == 2 and str(link / store.CHECKPOINTS_DIR) in err and "leads out of" in err, err
    assert list(elsewhere.iterdir()) == []

    # eval: a finished run moved out and linked back
    sweep = tmp_path / "sweep_tiny"
    shutil.copytree(FIXTURE, sweep, ignore=shutil.ignore_patterns("make_fixture.py"))
    for config in sweep.glob("*/config.yaml"):  # an eval task that is shipped
        config.write_text(config.read_text().replace("tiny_mul", "tiny_rev"))
    run = store.run_dirs(sweep)[0]
    moved = tmp_path / "moved"
    shutil.move(run, moved)
    run.symlink_to(moved)
    listing = sorted(p.relative_to(moved) for p in moved.rglob("*"))
    for target in (sweep, run):
        code, out, err = cli(["eval", target, "--cluster", "debug"], monkeypatch, capsys)
        assert code == 2 and str(run) in err and "leads out of" in err and "Traceback" not in err, err
    assert sorted(p.relative_to(moved) for p in moved.rglob("*")) == listing


def test_a_report_or_eval_folder_linked_out_of_the_sweep_is_refused(tmp_path, monkeypatch, capsys):
    """Issue 47 item 10: ``<sweep>/report`` linked elsewhere made ``report`` write its files there, and
    ``<run>/eval/<hash>`` (or a checkpoint folder in it) linked elsewhere made ``eval --checkpoints all`` write
    there. Both refused by the one check ``run`` has: exit 2, the link named, nothing written through it."""
    from klsweep import evaluate
    from klsweep.submit.evals import eval_request

    sweep = tmp_path / "sweep_tiny"
    shutil.copytree(FIXTURE, sweep, ignore=shutil.ignore_patterns("make_fixture.py"))
    for config in sweep.glob("*/config.yaml"):  # an eval task that is shipped
        config.write_text(config.read_text().replace("tiny_mul", "tiny_rev"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    (sweep / store.REPORT_DIR).symlink_to(elsewhere)
    code, out, err = cli(["report", sweep], monkeypatch, capsys)
    assert code == 2 and str(sweep / store.REPORT_DIR) in err and "leads out of" in err, err
    assert "Traceback" not in err and list(elsewhere.iterdir()) == []
    (sweep / store.REPORT_DIR).unlink()
    code, out, err = cli(["report", sweep, "--out", tmp_path / "asked"], monkeypatch, capsys)
    assert code == 0 and (tmp_path / "asked" / "report.md").is_file(), err  # an --out given is the user's

    run = store.run_dirs(sweep)[0]
    request = eval_request(run, checkpoints="all")
    hash_dir = (
        run
        / store.EVAL_DIR
        / evaluate.eval_hash(evaluate.eval_settings(evaluate.as_eval_section(request.eval_cfg)))
    )
    hash_dir.parent.mkdir(exist_ok=True)
    hash_dir.symlink_to(elsewhere)
    for target in (sweep, run):
        code, out, err = cli(
            ["eval", target, "--checkpoints", "all", "--cluster", "debug"], monkeypatch, capsys
        )
        assert code == 2 and str(hash_dir) in err and "leads out of" in err and "Traceback" not in err, err
    hash_dir.unlink()  # its own folder, whose checkpoint-40/ leads elsewhere
    (hash_dir / "checkpoint-40").parent.mkdir()
    (hash_dir / "checkpoint-40").symlink_to(elsewhere)
    code, out, err = cli(["eval", sweep, "--checkpoints", "all", "--cluster", "debug"], monkeypatch, capsys)
    assert code == 2 and str(hash_dir / "checkpoint-40") in err and "leads out of" in err, err
    assert list(elsewhere.iterdir()) == []


def test_workers_that_die_before_taking_a_job_are_not_restarted_for_ever(tmp_path):
    """A worker that cannot even start (here the cluster's setup lines fail; a full disk does the same) would
    leave its jobs waiting, and the supervisor would start workers for ever: it gives up after
    MAX_WORKER_DEATHS, records the waiting jobs failed and ends."""
    from klsweep.submit import local

    sweep = tmp_path / "nostart"
    plan = jobs.make_plan(sweep, [0, 1], **{"cluster.setup": ["exit 3"]})
    submit.submit(plan, "local", train_fn=jobs.ok_train)
    runs = submit.wait_until_final(sweep, poll_s=0.5, timeout_s=120)
    assert {r.state for r in runs} == {"failed"}, [(r.run_id, r.state, r.reason) for r in runs]
    rows = store.read_jsonl(sweep / store.JOBS_FILE)
    supervisor = next(r["supervisor"] for r in rows if r.get("supervisor"))
    wait_for(lambda: not alive(supervisor), "the supervisor kept starting workers", 30)
    pool = store.read_json(next((sweep / "submitit").glob("*/pool.json")))
    assert [s["state"] for s in pool] == ["failed", "failed"]
    started = list((sweep / "submitit").rglob("*_submitted.pkl"))  # one per worker job it started
    assert local.MAX_WORKER_DEATHS <= len(started) <= local.MAX_WORKER_DEATHS + 1, started


# ------------------------------------------------------------------------------------------------------------
# 12. A supervisor still starting is not taken for lost (issue 47 item 4)
# ------------------------------------------------------------------------------------------------------------


def test_a_supervisor_still_starting_is_not_taken_for_lost(tmp_path, monkeypatch):
    """`study --retry-failed` after a full disk evaluated and reported without the run it retried: its first
    status poll came while the new supervisor's /proc/<pid>/cmdline was still empty (the kernel loading its
    program, milliseconds after Popen), the supervisor was taken for lost and the run read failed. The poll
    is made to fall in that moment for sure: the supervisor's cmdline read empty (faked) while its process
    lives. A supervisor is known by its pid and start: a process at its pid started at another time is not
    it."""
    from klsweep.submit import scheduler

    sweep = tmp_path / "retry"
    plan = jobs.make_plan(sweep, [0])
    submit.submit(plan, "local", train_fn=jobs.bad_train)
    (run,) = submit.wait_until_final(sweep, poll_s=0.3, timeout_s=120)
    assert run.state == "failed"
    submit.submit(plan, "local", retry_failed=True, train_fn=jobs.ok_train)
    supervisor = store.read_jsonl(sweep / store.JOBS_FILE)[-1]["supervisor"]
    empty = tmp_path / "cmdline"
    empty.write_bytes(b"")
    real = scheduler.Path
    with monkeypatch.context() as m:  # the moment its program is being loaded: an empty command line
        m.setattr(scheduler, "Path", lambda p: empty if p == f"/proc/{supervisor}/cmdline" else real(p))
        (first,) = submit.status(sweep)
    assert first.state == "pending", (first.state, first.reason)
    (run,) = submit.wait_until_final(sweep, poll_s=0.3, timeout_s=120)
    assert run.state == "done", (run.state, run.reason)
    me = scheduler.process_start(os.getpid())
    assert scheduler.pid_alive(os.getpid(), "pytest", me) and not scheduler.pid_alive(
        os.getpid(), "pytest", me + 1
    )


# ------------------------------------------------------------------------------------------------------------
# 13. The study's eval stage: Ctrl-C stops the waiting, not the evals; an eval killed or on a full disk is
# said, the study goes on (issue 47 items 5, 6)
# ------------------------------------------------------------------------------------------------------------

STUDY = (  # one run of the tiny model, 2 steps, 4 eval problems per task: a real study in seconds
    "name: {name}\nbase: {{model: tiny, task: tiny, eval: tiny, eval.limit: 4, cluster.max_local_jobs: 1,\n"
    "  train.steps: 2, train.save_steps: 2, train.prompts_per_step: 2, train.group_size: 4,\n"
    "  train.max_completion_length: 8, wandb.mode: disabled}}\ngrid: {{seed: range(1)}}\n"
)


def start_study(tmp_path: Path, name: str) -> tuple[subprocess.Popen, Path]:
    """`klsweep study` of ``STUDY`` in a process group of its own (as a shell runs a command: Ctrl-C goes to
    the group), and its sweep folder."""
    grid = tmp_path / f"{name}.yaml"
    grid.write_text(STUDY.format(name=name))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "400"}
    env.pop("TTY_COMPATIBLE", None)
    command = [sys.executable, "-m", "klsweep", "study", str(grid), "--out", str(tmp_path / "res")]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path, start_new_session=True)  # fmt: skip
    return proc, tmp_path / "res" / name


def eval_jobs(sweep: Path) -> list[int]:
    """The pids of the sweep's eval jobs (submitit's local controllers), once submitted."""
    rows = store.read_jsonl(sweep / store.JOBS_FILE) if (sweep / store.JOBS_FILE).exists() else []
    return sorted({int(r["job_id"]) for r in rows if r["kind"] == "eval" and r.get("job_id")})


@pytest.mark.slow
def test_ctrl_c_during_the_eval_stage_stops_the_waiting_not_the_evals(tmp_path):
    """Ctrl-C (SIGINT to the command's process group) while `klsweep study` waits for its evals killed them
    (they ran in the command's process group) while it said they went on in the background: they go on, in
    a session of their own as training does, and the message is true."""
    proc, sweep = start_study(tmp_path, "ctrlc")
    try:
        wait_for(lambda: eval_jobs(sweep) or proc.poll() is not None, "the eval stage never began", 300)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        said = " ".join(err.split())
        assert proc.returncode == 130, err
        assert "interrupted: 1 run goes on in the background (1 evaluated)" in said, err
        (run,) = submit.wait_until_final(sweep, poll_s=0.5, timeout_s=300)
        assert run.eval_state == "done", (run.eval_state, run.eval_error)
        assert list(sweep.glob("*/eval/*/checkpoint-2/results.json"))
        assert list(sweep.glob("baseline/*/eval/*/step-0/results.json"))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if sweep.exists():
            submit.cancel(sweep)


@pytest.mark.slow
def test_an_eval_job_killed_is_said_and_the_study_reports_what_it_has(tmp_path):
    """An eval job killed (the OOM killer's kill -9 of the process evaluating) crashed `klsweep study` with
    submitit's UncompletedJobError: no report, and `status` said `eval failed` with no reason. The study goes
    on: the report, and which eval failed and why, here and in `klsweep status`."""
    proc, sweep = start_study(tmp_path, "evalkill")
    try:
        wait_for(lambda: eval_jobs(sweep) or proc.poll() is not None, "the eval stage never began", 300)
        (controller,) = eval_jobs(sweep)
        wait_for(lambda: children(controller) or proc.poll() is not None, "the eval job never started", 60)
        (task,) = children(controller)
        os.kill(task, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in out + err and "UncompletedJobError" not in out + err, err
    assert proc.returncode == 0, err  # (issue 51 makes a study that ends with an eval failed exit non-zero)
    said = " ".join(out.split())
    assert "eval failed" in said and f"its eval job {controller} ended before it scored it" in said, out
    assert (sweep / "report" / "report.md").is_file()
    (run,) = submit.status(sweep)
    assert run.state == "done" and run.eval_state == "failed", run
    assert run.eval_error and f"its eval job {controller}" in run.eval_error, run.eval_error


# ------------------------------------------------------------------------------------------------------------
# 14. Cancel stops what trains the run, and says cancelled only what it stopped (issue 47 item 15)
# ------------------------------------------------------------------------------------------------------------


def progress_of(run_dir: Path) -> str:
    path = run_dir / "progress.txt"
    return path.read_text() if path.exists() else ""


def test_cancel_stops_a_job_run_under_a_setup_shell_and_the_run_stays_cancelled(tmp_path):
    """With `cluster.setup` lines a local job's process (the id `status` shows) is a shell running them and
    then submitit's controller: `klsweep cancel` stopped that shell alone, said the run cancelled, and the
    controller and the worker below it trained it on to done. Every process of the job is stopped; the run
    stays cancelled and the pool goes on with the next run."""
    sweep = tmp_path / "setupcancel"
    plan = jobs.make_plan(sweep, [0, 1], **{"cluster.max_local_jobs": 1, "cluster.setup": ["true"]})
    submit.submit(plan, "local", train_fn=jobs.short_slow_train)
    a, b = plan.runs  # seed 0 trains 60 steps of 0.5 s, seed 1 six
    wait_for(lambda: progress_of(a.run_dir), "the run never trained", 120)
    assert submit.cancel(sweep, [a.id]) == [a.id]
    assert store.trainer_of(a.run_dir) is None
    stopped = progress_of(a.run_dir)
    time.sleep(2)
    assert progress_of(a.run_dir) == stopped  # nothing trains it
    final = {r.run_id: r for r in submit.wait_until_final(sweep, poll_s=0.5, timeout_s=120)}
    assert final[a.id].state == "cancelled" and final[b.id].state == "done", final
    assert progress_of(a.run_dir) == stopped and int(stopped) < 60


HOLD_RUNNING = """
import sys, time
from klsweep import store
with store.training(sys.argv[1]):
    store.write_status(sys.argv[1], "running", step=1)
    print("training", flush=True)
    time.sleep(600)
"""


def test_cancel_stops_a_trainer_it_has_no_job_record_of(tmp_path):
    """A trainer that outlived its job (its shell or controller killed) trains on under no job klsweep
    knows: `klsweep cancel` said the run cancelled and left it training. The process holding the run's
    training lock (the kernel's lock table names it) is stopped too, before the run is said cancelled."""
    sweep = tmp_path / "orphan"
    plan = jobs.make_plan(sweep, [0])
    run_dir = plan.runs[0].run_dir
    submit.submit(plan, "local", train_fn=jobs.bad_train)
    submit.wait_until_final(sweep, poll_s=0.3, timeout_s=120)
    orphan = subprocess.Popen(
        [sys.executable, "-c", HOLD_RUNNING, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert orphan.stdout.readline().strip() == "training"
        assert submit.cancel(sweep) == [plan.runs[0].id]
        assert orphan.wait(timeout=10) is not None and store.trainer_of(run_dir) is None
        (run,) = submit.status(sweep)
        assert run.state == "cancelled"
    finally:
        orphan.kill()
        orphan.wait()


@pytest.mark.slow
def test_a_full_disk_during_the_eval_stage_is_said_and_the_study_reports_what_it_has(tmp_path):
    """A full disk under the evals (a tiny tmpfs, full, where the run's scores go) crashed `klsweep study` with
    submitit's job error and no report. The study goes on: the baseline scored, the run's eval failed with its
    reason (here and in `klsweep status`), the report written."""
    from mounts import full_disk

    from klsweep.study import run_study

    grid = tmp_path / "fulleval.yaml"
    grid.write_text(STUDY.format(name="fulleval"))
    sweep = tmp_path / "res" / "fulleval"
    with contextlib.ExitStack() as disks:

        def on_stage(stage: str) -> None:
            if stage.startswith("eval"):  # the runs trained: their eval/ on a disk with no room left
                for run_dir in store.run_dirs(sweep):
                    full = disks.enter_context(full_disk(run_dir / store.EVAL_DIR, "64k"))
                    with contextlib.suppress(OSError), open(full / "filler", "wb") as f:
                        f.write(b"x" * 1_000_000)

        res = run_study(grid, out=tmp_path / "res", formats=("md",), on_stage=on_stage)
        (run,) = res.runs
        assert run.state == "done" and run.eval_state == "failed", run
        assert "No space left on device" in run.eval_error, run.eval_error
        assert list(res.eval.errors) == [str(run_dir := sweep / run.run_id)], res.eval.errors
        assert (sweep / "report" / "report.md").is_file()
        assert list(sweep.glob("baseline/*/eval/*/step-0/results.json"))
        (again,) = submit.status(sweep)
        assert again.eval_state == "failed" and again.eval_error == run.eval_error
        assert not list(run_dir.glob("eval/*/*/results.json"))
