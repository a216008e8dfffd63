"""The launcher against real submitit: the local executor (supervised waves), the debug executor, and the real
local Slurm cluster (``bash slurm/start.sh; source /tmp/klsweep-slurm/env.sh``; marked ``slurm``)."""

from __future__ import annotations

import multiprocessing
import os
import re
import time
from pathlib import Path

import launcher_jobs as jobs  # tests/ is on sys.path under pytest
import pytest

from klsweep import store, submit

CLUSTERS = ["local", pytest.param("slurm", marks=pytest.mark.slurm)]


def wait(sweep: Path, timeout_s: float = 120) -> dict[str, submit.RunStatus]:
    runs = submit.wait_until_final(sweep, poll_s=0.5, timeout_s=timeout_s)
    return {r.run_id: r for r in runs}


def wait_for(cond, timeout_s: float = 60) -> None:
    start = time.time()
    while not cond():
        if time.time() - start > timeout_s:
            raise TimeoutError("condition not met")
        time.sleep(0.3)


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_array_runs_then_rerun_skips(tmp_path: Path, cluster: str) -> None:
    sweep = tmp_path / "arr"
    plan = jobs.make_plan(sweep, [0, 1, 2], **{"cluster.max_local_jobs": 2, "cluster.array_parallelism": 2})
    res = submit.submit(plan, cluster, train_fn=jobs.ok_train)
    assert res.actions == {r.id: "submit" for r in plan.runs}
    if cluster == "slurm":
        assert res.sbatch_calls == 1
        assert len({j["job_id"].split("_")[0] for j in res.jobs}) == 1  # one array
    final = wait(sweep)
    assert {r.state for r in final.values()} == {"done"}
    assert all(r.step == 3 and r.reward == pytest.approx(0.3) for r in final.values())
    assert all(r.params == {"seed": i} for i, r in enumerate(final[p.id] for p in plan.runs))
    assert jobs.max_overlap(sweep) <= 2
    assert (sweep / store.SWEEP_FILE).exists()
    assert all((r.run_dir / store.CONFIG_FILE).exists() for r in plan.runs)
    n_rows = len(store.read_jsonl(sweep / store.JOBS_FILE))
    again = submit.submit(plan, cluster, train_fn=jobs.ok_train)
    assert set(again.actions.values()) == {"skip-done"}
    assert again.jobs == [] and again.sbatch_calls == 0
    assert len(store.read_jsonl(sweep / store.JOBS_FILE)) == n_rows


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_failing_run_shows_failed_with_log_tail(tmp_path: Path, cluster: str) -> None:
    sweep = tmp_path / "fail"
    plan = jobs.make_plan(sweep, [0])
    submit.submit(plan, cluster, train_fn=jobs.bad_train)
    (run,) = wait(sweep).values()
    assert run.state == "failed"
    assert any("KLSWEEP-BOOM" in line for line in run.log_tail)
    assert "Traceback (most recent call last)" in Path(run.log).read_text()  # in the run's own log
    # a failed run is not resubmitted unless asked
    assert submit.submit(plan, cluster, train_fn=jobs.ok_train).actions[run.run_id] == "skip-failed"
    assert (
        submit.submit(plan, cluster, train_fn=jobs.ok_train, retry_failed=True).actions[run.run_id]
        == "resume"
    )
    (run,) = wait(sweep).values()
    assert run.state == "done"


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_cancel(tmp_path: Path, cluster: str) -> None:
    sweep = tmp_path / "cancel"
    plan = jobs.make_plan(sweep, [0])
    submit.submit(plan, cluster, train_fn=jobs.slow_train)
    run_dir = plan.runs[0].run_dir
    wait_for(lambda: (run_dir / "progress.txt").exists())
    assert submit.status(sweep)[0].state == "running"
    assert submit.cancel(sweep) == [plan.runs[0].id]
    (run,) = wait(sweep, timeout_s=30).values()
    assert run.state == "cancelled"
    stopped_at = int((run_dir / "progress.txt").read_text())
    time.sleep(3)
    assert int((run_dir / "progress.txt").read_text()) == stopped_at  # the job is really gone


def test_local_timeout_requeues_and_resumes(tmp_path: Path) -> None:
    sweep = tmp_path / "requeue"
    plan = jobs.make_plan(sweep, [0])
    plan.runs[0].config["model"]["resources"]["timeout_min"] = 0.25  # 15 s; USR2 at 10 s
    submit.submit(plan, "local", train_fn=jobs.slow_train)
    (run,) = wait(sweep, timeout_s=90).values()
    assert run.state == "done" and run.step == 20
    starts = [int(line.split()[0]) for line in (plan.runs[0].run_dir / "starts.txt").read_text().splitlines()]
    assert len(starts) >= 2 and starts[0] == 0 and starts[1] > 0  # resumed, not restarted
    # every attempt of the requeued job in the run's own log, one after the other
    log = (plan.runs[0].run_dir / "logs" / f"train-{run.job_id}.out").read_text()
    assert [int(n) for n in re.findall(r"slow_train: starting at step (\d+)", log)] == starts


def test_a_worker_on_its_time_limit_requeues_and_resumes_the_run_it_trained(tmp_path: Path) -> None:
    """Two runs in one worker, whose time limit is the sum of theirs (30 s, USR2 at 25 s): the second run is
    trained when the signal comes; it is saved, put back in the queue and resumed by the requeued worker."""
    sweep = tmp_path / "poolrequeue"
    plan = jobs.make_plan(sweep, [0, 1], **{"cluster.max_local_jobs": 1})
    for run in plan.runs:
        run.config["model"]["resources"]["timeout_min"] = 0.25
    submit.submit(plan, "local", train_fn=jobs.slow_train)
    final = wait(sweep, timeout_s=120)
    assert [final[r.id].state for r in plan.runs] == ["done", "done"]
    first, second = (
        [line.split()[0] for line in (r.run_dir / "starts.txt").read_text().splitlines()] for r in plan.runs
    )
    assert first == ["0"]
    assert len(second) == 2 and second[0] == "0" and int(second[1]) > 0  # resumed, not restarted
    assert len(set().union(*worker_ids(sweep).values())) == 1  # the same worker job, requeued


def test_a_worker_preempted_mid_run_saves_it_at_the_step_end_and_resumes_it(tmp_path: Path) -> None:
    """USR2 to a worker training its second real run: the signal waits for the end of the step (the
    deferred handler is installed once per worker, not once per run), the run is saved, requeued with its
    worker and resumed; every step once in metrics.jsonl."""
    import os
    import signal

    sweep = tmp_path / "poolpreempt"
    no_collapse = {"train.collapse_fraction": 0.0}  # 8 samples a step: the reward is noisy
    plan = real_plan(sweep, [0, 1], **{"train.steps": 30, "train.save_steps": 100, **no_collapse})
    submit.submit(plan, "local")
    first, second = plan.runs
    wait_for(lambda: any(r["step"] >= 2 for r in store.read_metrics(second.run_dir)), timeout_s=300)
    (worker,) = worker_ids(sweep)[second.id]
    (task,) = (int(c) for c in Path(f"/proc/{worker}/task/{worker}/children").read_text().split())
    os.kill(task, signal.SIGUSR2)
    final = wait(sweep, timeout_s=300)
    assert [final[r.id].state for r in plan.runs] == ["done", "done"]
    for run in plan.runs:
        assert [r["step"] for r in store.read_metrics(run.run_dir)] == list(range(1, 31))
    assert worker_ids(sweep)[second.id] == {worker}  # claimed twice by the same (requeued) worker job
    assert len([r for r in jobs.train_rows(sweep)[second.id] if r["job_id"] and "state" not in r]) == 2


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_eval_runs_after_successful_train_only(tmp_path: Path, cluster: str) -> None:
    sweep = tmp_path / "evaldep"
    plan = jobs.make_plan(sweep, [0, 1], **{"eval.suite": "tiny"})
    res = submit.submit(plan, cluster, train_fn=jobs.seed_train, eval_fn=jobs.ok_eval)
    assert sorted(r["kind"] for r in res.jobs) == ["eval", "eval", "train", "train"]
    final = wait(sweep)
    good, bad = plan.runs[0], plan.runs[1]
    assert final[good.id].state == "done" and final[good.id].eval_state == "done"
    assert (good.run_dir / "eval/h0/checkpoint-3/results.json").exists()
    assert final[bad.id].state == "failed"
    assert final[bad.id].eval_state in ("skipped", "cancelled")
    assert not (bad.run_dir / "eval").exists()  # the eval of a failed train never ran


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_concurrent_submits_submit_each_run_once(tmp_path: Path, cluster: str) -> None:
    sweep = tmp_path / "race"
    plan = jobs.make_plan(sweep, [0, 1, 2])
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(
            target=jobs.submit_in_child, args=(plan, cluster, jobs.ok_train, str(tmp_path / f"r{i}.json"))
        )
        for i in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    wait(sweep)
    rows = jobs.train_rows(sweep)
    submitted = {
        rid: [r for r in rs if r["job_id"] is not None or r.get("supervisor")] for rid, rs in rows.items()
    }
    if cluster == "slurm":
        assert {rid: len(rs) for rid, rs in submitted.items()} == {r.id: 1 for r in plan.runs}
    else:  # local: one queued row per run from `submit`, then one row when a worker started it (and one at its end)
        queued = {rid: sum(r["job_id"] is None for r in rs) for rid, rs in rows.items()}
        started = {
            rid: sum(r["job_id"] is not None and "state" not in r for r in rs) for rid, rs in rows.items()
        }
        assert queued == started == {r.id: 1 for r in plan.runs}
    for run in plan.runs:
        assert (run.run_dir / "spans.txt").read_text().count("start") == 1


def real_plan(sweep: Path, seeds: list[int], **overrides):
    """Runs of the real trainer on the project's tiny model: 4 steps, checkpoints at 2 and 4, W&B offline."""
    from klsweep.tinymodel import tiny_model_path

    settings = {
        "model.path": str(tiny_model_path()),
        "train.steps": 4,
        "train.save_steps": 2,
        "train.prompts_per_step": 2,
        "train.group_size": 4,
        "train.max_completion_length": 6,
        "train.learning_rate": 1e-3,
        "kl.beta": 0.1,
        "offpolicy.lag": 2,
        "wandb.mode": "offline",
        "cluster.max_local_jobs": 1,
    }
    return jobs.make_plan(sweep, seeds, **{**settings, **overrides})


def trajectory(run_dir: Path) -> tuple[list[dict], dict]:
    """A run's metrics rows without their clock fields, and its final weights."""
    from safetensors.torch import load_file

    rows = [
        {k: v for k, v in row.items() if k not in ("time", "elapsed_s", "step_time")}
        for row in store.read_metrics(run_dir)
    ]
    final = store.read_status(run_dir)["final_checkpoint"]
    return rows, load_file(run_dir / store.CHECKPOINTS_DIR / final / "model.safetensors")


def worker_ids(sweep: Path) -> dict[str, set[str]]:
    """Run id -> the job ids of the workers that started its training."""
    return {
        rid: {r["job_id"] for r in rs if r["job_id"] is not None and "state" not in r}
        for rid, rs in jobs.train_rows(sweep).items()
    }


def test_the_pool_defaults_to_the_cores_it_may_run_on(tmp_path: Path) -> None:
    """Without cluster.max_local_jobs, the pool has as many workers as the cores this process may run on (its
    affinity mask, as under Slurm's or taskset's CPU binding), not the machine's count: on one core, one worker
    trains both runs one after the other."""
    sweep = tmp_path / "onecore"
    plan = jobs.make_plan(sweep, [0, 1])
    assert plan.runs[0].config["cluster"]["max_local_jobs"] is None
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mask)})
    try:
        submit.submit(plan, "local", train_fn=jobs.ok_train)
    finally:
        os.sched_setaffinity(0, mask)
    assert {r.state for r in wait(sweep).values()} == {"done"}
    assert len(set().union(*worker_ids(sweep).values())) == 1
    spans = [(r.run_dir / "spans.txt").read_text().split() for r in plan.runs]  # start T end T
    first, second = sorted((float(s[1]), float(s[3])) for s in spans)
    assert first[1] <= second[0]  # never two at once


def test_a_worker_trains_each_run_as_a_fresh_process_does(tmp_path: Path) -> None:
    """Three runs in one worker, each evaluated by lm-eval after its training, the middle one failing
    mid-training: the others go on, and train bit for bit as they do one process per run
    (cluster.local_jobs_per_worker=1)."""
    import torch
    import yaml

    import klsweep

    suite = yaml.safe_load((Path(klsweep.__file__).parent / "conf/eval/tiny.yaml").read_text())
    tiny_eval = {f"eval.{k}": v for k, v in {**suite, "limit": 4}.items()}
    pooled = real_plan(tmp_path / "pooled", [0, 1, 2], **tiny_eval)
    submit.submit(pooled, "local", train_fn=jobs.train_failing_odd)
    final = wait(tmp_path / "pooled", timeout_s=600)
    a, b, c = (final[r.id] for r in pooled.runs)
    assert (a.state, b.state, c.state) == ("done", "failed", "done")
    assert (a.eval_state, b.eval_state, c.eval_state) == ("done", "skipped", "done")
    assert any("KLSWEEP-BOOM" in line for line in b.log_tail)
    ids = worker_ids(tmp_path / "pooled")
    assert len(set().union(*ids.values())) == 1  # one worker trained all three
    assert a.job_id == b.job_id == c.job_id

    fresh = real_plan(tmp_path / "fresh", [0, 2], **{"cluster.local_jobs_per_worker": 1})
    submit.submit(fresh, "local")
    wait(tmp_path / "fresh", timeout_s=600)
    assert len(set().union(*worker_ids(tmp_path / "fresh").values())) == 2  # a process each
    for run in fresh.runs:
        assert run.id in final
        rows, weights = trajectory(run.run_dir)
        pooled_rows, pooled_weights = trajectory(tmp_path / "pooled" / run.id)
        assert len(rows) == 4 and any(r["reward_mean"] for r in rows) and rows == pooled_rows
        assert weights.keys() == pooled_weights.keys()
        assert all(torch.equal(weights[k], pooled_weights[k]) for k in weights)


def test_cancel_in_a_worker_stops_that_run_only(tmp_path: Path) -> None:
    sweep = tmp_path / "poolcancel"
    plan = jobs.make_plan(sweep, [0, 1, 2], **{"cluster.max_local_jobs": 1})
    submit.submit(plan, "local", train_fn=jobs.short_slow_train)
    a, b, c = plan.runs
    wait_for(lambda: (a.run_dir / "progress.txt").exists())
    now = {r.run_id: r for r in submit.status(sweep)}
    (worker,) = worker_ids(sweep)[a.id]
    assert now[a.id].state == "running" and now[a.id].job_id == worker
    assert now[b.id].state == now[c.id].state == "pending"
    assert submit.cancel(sweep, [b.id]) == [b.id]  # waiting: the worker must not start it
    assert submit.cancel(sweep, [a.id]) == [a.id]  # training: its worker is stopped, a new one goes on
    final = wait(sweep, timeout_s=60)
    assert [final[r.id].state for r in plan.runs] == ["cancelled", "cancelled", "done"]
    assert not (b.run_dir / "starts.txt").exists()
    assert worker_ids(sweep)[c.id] and worker not in worker_ids(sweep)[c.id]


def test_a_killed_worker_fails_its_run_and_a_new_one_trains_the_rest(tmp_path: Path) -> None:
    sweep = tmp_path / "poolkill"
    plan = jobs.make_plan(sweep, [0, 1, 2], **{"cluster.max_local_jobs": 1})
    submit.submit(plan, "local", train_fn=jobs.killed_odd_train)
    final = wait(sweep)
    a, b, c = plan.runs
    assert [final[r.id].state for r in plan.runs] == ["done", "failed", "done"]
    assert final[b.id].reason.startswith("the process died without a word")
    (worker,) = worker_ids(sweep)[b.id]
    assert final[b.id].log == str(b.run_dir / "logs" / f"train-{worker}.err")  # its part of the worker's log
    assert "klsweep worker: train " + b.id in Path(final[b.id].log).read_text()
    assert "klsweep worker: train " + a.id not in Path(final[b.id].log).read_text()
    ids = worker_ids(sweep)
    assert ids[a.id] == ids[b.id] != ids[c.id]  # the worker that died trained a, then b; a new one c


def test_poll_delay_backs_off_as_submitits_watcher_does() -> None:
    """``--wait``/``--watch`` query the scheduler ``first_s`` apart at first, then half the time since the last
    change, at most ``POLL_MAX_S`` apart: an hour with nothing changing makes ~120 queries, not 1800."""
    from klsweep.submit.state import POLL_MAX_S, poll_delay

    assert poll_delay(0.0) == 2.0 and poll_delay(0.0, first_s=0.5) == 0.5  # at first and after a change
    assert poll_delay(20.0) == 10.0 and poll_delay(3600.0) == POLL_MAX_S == 30.0
    t, gaps = 0.0, []
    while t < 3600:
        gaps.append(poll_delay(t))
        t += gaps[-1]
    assert gaps == sorted(gaps) and gaps[0] == 2.0 and gaps[-1] == 30.0
    assert len(gaps) < 150


def test_wait_backs_off_and_still_notices_completion(tmp_path: Path) -> None:
    """A wait through a 20-s run: the scheduler is asked less and less often while nothing changes (a fixed
    0.5-s poll would ask 40 times), and the wait still ends with the run done."""
    sweep = tmp_path / "backoff"
    plan = jobs.make_plan(sweep, [0])
    submit.submit(plan, "local", train_fn=jobs.slow_train)
    queries: list[list[submit.RunStatus]] = []
    (run,) = submit.wait_until_final(sweep, poll_s=0.5, on_update=queries.append, timeout_s=120)
    assert run.state == "done" and run.step == 20
    assert [r.state for r in queries[-1]] == ["done"]
    assert sum(r.state == "running" for (r,) in queries) < 20, [(r.state, r.step) for (r,) in queries]


def test_wait_timeout_names_the_runs_not_final_and_what_their_jobs_say(tmp_path: Path) -> None:
    sweep = tmp_path / "late"
    plan = jobs.make_plan(sweep, [0])
    submit.submit(plan, "local", train_fn=jobs.slow_train)
    run_dir = plan.runs[0].run_dir
    wait_for(lambda: (run_dir / "progress.txt").exists())
    with pytest.raises(TimeoutError) as e:
        submit.wait_until_final(sweep, poll_s=0.5, timeout_s=1)
    said = str(e.value)
    assert f"{plan.runs[0].id}: running, step " in said and "(local): RUNNING" in said, said
    submit.cancel(sweep)


def test_debug_executor_runs_in_process(tmp_path: Path) -> None:
    sweep = tmp_path / "debug"
    plan = jobs.make_plan(sweep, [0, 1], **{"eval.suite": "tiny"})
    res = submit.submit(plan, "debug", train_fn=jobs.seed_train, eval_fn=jobs.ok_eval)
    # in-process: everything has run by the time submit returns
    states = {r.run_id: (r.state, r.eval_state) for r in submit.status(sweep)}
    assert states == {plan.runs[0].id: ("done", "done"), plan.runs[1].id: ("failed", None)}
    assert {r["kind"] for r in res.jobs} == {"train", "eval"}


def test_force_resubmits_and_clears(tmp_path: Path) -> None:
    sweep = tmp_path / "force"
    plan = jobs.make_plan(sweep, [0])
    submit.submit(plan, "debug", train_fn=jobs.ok_train)
    marker = plan.runs[0].run_dir / "stale.txt"
    marker.write_text("x")
    res = submit.submit(plan, "debug", train_fn=jobs.ok_train, force=True)
    assert res.actions == {plan.runs[0].id: "submit"}
    assert not marker.exists()
    assert submit.status(sweep)[0].state == "done"


def test_unknown_cluster_is_a_user_error(tmp_path: Path) -> None:
    from klsweep.errors import UserError

    with pytest.raises(UserError, match="unknown cluster"):
        submit.submit(jobs.make_plan(tmp_path / "x", [0]), "kubernetes")


def test_run_wait_exits_1_when_a_run_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`klsweep run --wait`: real tiny training on the local executor, one run done and one failed (its model
    path does not exist): exit 1, the summary says so; the status table that follows has both ids whole at 80
    columns and when piped."""
    from typer.testing import CliRunner

    from klsweep.cli import app

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # offline, run refuses the missing model up front
    grid = tmp_path / "g.yaml"
    grid.write_text(
        "name: exitcode\nbase:\n  model: tiny\n  task: tiny\n  cluster: local\n  train.steps: 1\n"
        "  train.save_steps: 1\n  train.prompts_per_step: 2\n  train.group_size: 2\n"
        "  train.max_completion_length: 4\n  wandb.mode: disabled\n"
        "grid:\n  - kl.beta: 0.1\n  - kl.beta: 0.0\n    model.path: " + str(tmp_path / "missing") + "\n"
    )
    result = CliRunner().invoke(
        app, ["run", str(grid), "--out", str(tmp_path), "--wait"], env={"COLUMNS": "80"}
    )
    assert result.exit_code == 1, result.output
    assert "1 done, 1 failed" in result.output
    sweep = tmp_path / "exitcode"
    ids = sorted(p.name for p in store.run_dirs(sweep))
    for terminal in ("1", ""):
        shown = CliRunner().invoke(
            app, ["status", str(sweep)], env={"COLUMNS": "80", "TTY_COMPATIBLE": terminal}
        )
        assert shown.exit_code == 0, shown.output
        table = shown.output.split("\n---")[0]  # the failed run's log tail follows, as written
        lines = re.sub(r"\x1b\[[0-9;]*m", "", table).splitlines()
        assert all(any(line.split()[:1] == [i] for line in lines) for i in ids)  # ids whole, first in a row
        if terminal:
            assert max(len(line) for line in lines) <= 80, table
        else:
            assert "\x1b[" not in table


def test_final_summary_and_exit_code() -> None:
    """A diverged run is a result (exit 0, said in the summary) unless --fail-on-diverged; a failed run, a
    cancelled one or a failed eval: exit 1."""

    def run(state: str, eval_state: str | None = None) -> submit.RunStatus:
        return submit.RunStatus(run_id=state, params={}, state=state, step=1, total_steps=1, reward=None,
                                elapsed_s=1.0, gpu_hours=0.0, job_id=None, cluster="local",
                                eval_state=eval_state, log_tail=[])  # fmt: skip

    line, code = submit.final_summary([run("done"), run("diverged")])
    assert code == 0 and "1 done, 1 diverged" in line and "--fail-on-diverged" in line
    assert submit.final_summary([run("done"), run("diverged")], fail_on_diverged=True)[1] == 1
    assert submit.final_summary([run("done"), run("failed")]) == ("1 done, 1 failed", 1)
    assert submit.final_summary([run("cancelled")])[1] == 1
    assert submit.final_summary([run("done", "failed")]) == ("1 done, 1 eval(s) failed", 1)
    assert submit.final_summary([run("done", "done")]) == ("1 done", 0)


def test_interrupted_waits_say_which_runs_go_on(tmp_path: Path) -> None:
    """Issue 44 (issue 43 item 5): `klsweep run --wait` interrupted (Ctrl-C) exited 130 without a word while its
    local runs trained on in their own session. Interrupted, `run --wait`, `study` and `status --watch` exit 130
    and say which runs go on and that `klsweep cancel SWEEP` stops them; the runs do go on."""
    import select
    import signal
    import subprocess
    import sys

    grid = tmp_path / "g.yaml"
    grid.write_text(
        "name: ctrlc\nbase: {model: tiny, task: tiny, eval: tiny, train.steps: 400, wandb.mode: disabled,\n"
        "  cluster.max_local_jobs: 1}\ngrid: {seed: range(2)}\n"
    )
    out = tmp_path / "res"
    sweep = out / "ctrlc"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "400"}
    env.pop("TTY_COMPATIBLE", None)

    def start(*args: object, **more: str) -> subprocess.Popen:
        command = [sys.executable, "-m", "klsweep", *map(str, args)]
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**env, **more}, cwd=tmp_path)  # fmt: skip

    def until_said(proc: subprocess.Popen, text: str, timeout_s: float = 300) -> None:
        """Read the process's stdout until ``text`` appears (it waits then)."""
        assert proc.stdout is not None
        said, deadline = "", time.time() + timeout_s
        while text not in said:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.time()))
            line = proc.stdout.readline() if ready else ""
            assert line, f"never said {text!r}: {said}{proc.communicate()[1]}"
            said += line

    def interrupt(proc: subprocess.Popen) -> str:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", err).split())  # status --watch: a terminal's colours

    try:
        run = start("run", grid, "--out", out, "--wait")
        until_said(run, "2 runs on local")
        said = interrupt(run)
        ids = sorted(p.name for p in store.run_dirs(sweep))
        assert "interrupted: 2 runs go on in the background" in said, said
        assert all(i in said for i in ids) and f"`klsweep cancel {sweep}` stops them" in said, said
        watch = start("status", sweep, "--watch", TTY_COMPATIBLE="1")
        until_said(watch, "ctrlc")  # the live table: it watches
        said = interrupt(watch)
        assert "stopped watching: 2 runs go on" in said and f"`klsweep cancel {sweep}`" in said, said
        study = start("study", grid, "--out", out)
        until_said(study, " pending")  # its first progress line: it waits
        said = interrupt(study)
        assert "interrupted: 2 runs go on" in said and f"`klsweep cancel {sweep}`" in said, said
        assert {r.state for r in submit.status(sweep)} <= {"pending", "running"}  # they do go on
    finally:
        if sweep.exists():
            submit.cancel(sweep)
