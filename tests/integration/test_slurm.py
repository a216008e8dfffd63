"""Slurm-only launcher behaviour on the real local cluster (``bash slurm/start.sh; source
/tmp/klsweep-slurm/env.sh``): preemption requeue with resume, and 2-task data-parallel training.

Waits follow the job's state (``launcher_jobs.follow``): a job waiting for the node is not timed as a slow
one, and a job Slurm cannot start (a 2-task job on a cluster started with one CPU: ``PartitionConfig``) fails
at once, saying so."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import launcher_jobs as jobs  # tests/ is on sys.path under pytest
import pytest

from klsweep import store, submit

pytestmark = pytest.mark.slurm


def test_preemption_checkpoints_requeues_and_resumes(tmp_path: Path) -> None:
    sweep = tmp_path / "preempt"
    plan = jobs.make_plan(sweep, [0])
    run_dir = plan.runs[0].run_dir
    res = submit.submit(plan, "slurm", train_fn=jobs.slow_train)
    (job_id,) = [r["job_id"] for r in res.jobs]
    progress = run_dir / "progress.txt"
    jobs.follow(sweep, lambda _: progress.exists() and int(progress.read_text() or 0) >= 3, "3 steps", 60)
    # what Slurm sends before preemption/timeout: submitit calls TrainJob.checkpoint and requeues the job.
    # (About 1 in 16 `scontrol requeue` calls made from inside a job report failure although Slurm requeued
    # it: the run may pass through 'failed' but must end done.)
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    runs = submit.wait_until_final(sweep, poll_s=1, timeout_s=180)
    if runs[0].state == "failed":  # the flaky requeue report: give the requeued job its time
        runs = submit.wait_until_final(sweep, poll_s=1, timeout_s=120)
    assert runs[0].state == "done" and runs[0].step == 20
    starts = [int(line.split()[0]) for line in (run_dir / "starts.txt").read_text().splitlines()]
    assert len(starts) == 2 and starts[0] == 0 and starts[1] >= 3  # resumed, not restarted
    assert runs[0].job_id == job_id  # the same job, requeued
    # both attempts in the run's own log (a hard link of Slurm's file, appended to by the requeued job)
    log = (run_dir / "logs" / f"train-{job_id}.out").read_text()
    assert [int(n) for n in re.findall(r"slow_train: starting at step (\d+)", log)] == starts


def test_two_tasks_train_data_parallel_with_same_weights(tmp_path: Path) -> None:
    """2 tasks on one node: TrainJob exports RANK/WORLD_SIZE/MASTER_ADDR; klsweep.job trains with gloo, and both
    ranks end with the same weights, which moved from the initial ones and are what rank 0 saved.

    An untrained tiny model (``model.path`` set: the job must not build the warm-started one, minutes on a cold
    cache) has no task reward, so the k1 KL in the loss gives each rank a gradient of its own samples: without
    DDP's all-reduce the ranks' weights would differ after the first step."""
    pytest.importorskip("klsweep.job", reason="klsweep/job.py not written yet")
    import torch
    from safetensors.torch import load_file

    from klsweep.tinymodel import random_tiny_model

    model_dir = random_tiny_model(tmp_path / "model")
    sweep = tmp_path / "ddp"
    plan = jobs.make_plan(
        sweep,
        [0],
        **{
            "model.path": str(model_dir),
            "model.resources.tasks_per_node": 2,
            "train.steps": 2,
            "train.save_steps": 2,
            "train.prompts_per_step": 2,
            "train.max_completion_length": 8,
            "train.learning_rate": 1e-3,
            "kl.estimator": "k1",
            "kl.placement": "loss",
            "kl.beta": 0.1,
            "wandb.mode": "disabled",
        },
    )
    run_dir = plan.runs[0].run_dir
    submit.submit(plan, "slurm", train_fn=jobs.train_keeping_weights)
    run = jobs.follow(sweep, lambda r: r.state in store.FINAL_STATES, "training", timeout_s=300)
    assert run.state == "done", run.log_tail
    folder = Path(store.read_jsonl(sweep / store.JOBS_FILE)[-1]["folder"])
    assert len(list(folder.glob(f"{run.job_id}_*_log.err"))) == 2  # two tasks ran
    logs = {p.name for p in (run_dir / "logs").iterdir()}  # each task's stdout and stderr, in the run
    assert logs == {f"train-{run.job_id}{t}{s}" for t in ("", "-task1") for s in (".err", ".out")}
    assert [r["step"] for r in store.read_metrics(run_dir)] == [1, 2]  # rank 0 alone writes the metrics

    ranks = [torch.load(run_dir / f"final_weights_rank{r}.pt") for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys()
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])
    initial = load_file(model_dir / "model.safetensors")
    assert any(not torch.equal(initial[k], ranks[0][k]) for k in initial)  # training moved the weights
    saved = load_file(store.checkpoints(run_dir)[-1] / "model.safetensors")
    assert saved.keys() <= ranks[0].keys()
    assert all(torch.equal(saved[k], ranks[0][k]) for k in saved)


def test_two_tasks_with_a_lag_resume_after_preemption_and_requeue(tmp_path: Path) -> None:
    """2 tasks, ``offpolicy.lag`` 2, the real training job. USR2 (what Slurm sends before preemption or the time
    limit): every rank saves a checkpoint with its own lag buffers at the end of the step in progress, then the
    job requeues itself and resumes there. Then a hard ``scontrol requeue`` (no warning): the job restarts and
    resumes from its last complete checkpoint. The run finishes with every metrics step written exactly once,
    the steps before the preemption checkpoint kept as they were (resumed, not restarted), and the batch of
    every step after the pipeline fill generated ``lag`` steps earlier on every rank (a rank whose queue came
    back empty would refill it: a smaller mean lag, or ranks whose collectives no longer match, a hang)."""
    from klsweep.tinymodel import random_tiny_model

    lag, steps = 2, 24
    model_dir = random_tiny_model(tmp_path / "model")
    sweep = tmp_path / "lagpreempt"
    plan = jobs.make_plan(
        sweep,
        [0],
        **{
            "model.path": str(model_dir),
            "model.resources.tasks_per_node": 2,
            "train.steps": steps,
            # no periodic save: under load the signal can land near one, which would then be taken for the
            # preemption save (the save at the end of the step in progress is what this test checks)
            "train.save_steps": 1000,
            "train.keep_checkpoints": None,
            "train.prompts_per_step": 2,
            "train.max_completion_length": 8,
            "train.learning_rate": 1e-3,
            "kl.estimator": "k1",
            "kl.placement": "loss",
            "kl.beta": 0.1,
            "offpolicy.lag": lag,
            "wandb.mode": "disabled",
        },
    )
    run_dir = plan.runs[0].run_dir

    def rows() -> list[dict]:
        return store.read_metrics(run_dir)

    def wait_for(cond, what: str) -> None:
        # 'failed' may be the flaky in-job requeue report (see above): the requeued job goes on
        jobs.follow(sweep, lambda _: cond(), what)

    job_id, signalled = jobs.submit_and_signal(sweep, plan, after_steps=3)

    def preemption_checkpoint() -> Path | None:
        late = [c for c in store.checkpoints(run_dir) if store.checkpoint_step(c) >= max(signalled)]
        return next((c for c in late if (c / "trainer_state.json").exists()), None)

    wait_for(lambda: preemption_checkpoint() is not None, "the preemption save")
    saved = preemption_checkpoint()
    # the preemption save, not the final one
    assert saved is not None and store.checkpoint_step(saved) < steps
    assert sorted(p.name for p in saved.glob("klsweep_buffers_rank*.pt")) == [
        "klsweep_buffers_rank0.pt",
        "klsweep_buffers_rank1.pt",
    ]
    p = store.checkpoint_step(saved)
    wait_for(lambda: max((r["step"] for r in rows()), default=0) >= p + 2, "training after the requeue")
    subprocess.run(["scontrol", "requeue", job_id], check=True)

    run = jobs.follow_to_the_end(sweep, timeout_s=300)
    assert run.state == "done" and run.step == steps, run.log_tail
    assert run.job_id == job_id  # the same job, requeued
    jobs.assert_resumed_not_restarted(run_dir, steps, signalled, lag)


def _status_cli(sweep: Path, *args: str) -> str:
    """``klsweep status SWEEP ARGS`` as a terminal of 80 columns shows it (colours stripped)."""
    import re

    from typer.testing import CliRunner

    from klsweep.cli import app

    shown = CliRunner().invoke(
        app, ["status", str(sweep), *args], env={"COLUMNS": "80", "TTY_COMPATIBLE": "1"}
    )
    assert shown.exit_code == 0, shown.output
    return re.sub(r"\x1b\[[0-9;]*m", "", shown.output)


def test_waiting_jobs_show_slurms_reason_and_cancelled_jobs_its_state(tmp_path: Path) -> None:
    """Slurm's pending reason beside klsweep's 'pending': a job asking more CPUs than the node has waits for
    ever (PartitionConfig, what a 2-task job met on a cluster started with one CPU), a held one until released
    (JobHeldUser). In the status data, the 80-column table and --json; cancelled, both read CANCELLED."""
    import json

    too_big = jobs.make_plan(tmp_path / "toobig", [0], **{"model.resources.cpus_per_task": 64})
    held = jobs.make_plan(tmp_path / "held", [0], **{"cluster.additional_parameters": {"hold": True}})
    for plan, reason in ((too_big, "PartitionConfig"), (held, "JobHeldUser")):
        sweep = plan.sweep_dir
        submit.submit(plan, "slurm", train_fn=jobs.ok_train)
        run = jobs.follow(sweep, lambda r, why=reason: r.job_reason == why, reason, pending_s=60)
        assert (run.state, run.job_state, run.job_reason) == ("pending", "PENDING", reason)
        assert run.scheduler == f"PENDING ({reason})"
        table = _status_cli(sweep)
        assert max(len(line) for line in table.splitlines()) <= 80, table
        assert "scheduler" in table and f"({reason})" in table, table
        (shown,) = json.loads(_status_cli(sweep, "--json"))
        assert (shown["job_state"], shown["job_reason"]) == ("PENDING", reason)
    for plan in (too_big, held):
        assert submit.cancel(plan.sweep_dir) == [plan.runs[0].id]
        (run,) = submit.wait_until_final(plan.sweep_dir, poll_s=0.5, timeout_s=60)
        assert (run.state, run.job_state, run.job_reason, run.scheduler) == (
            "cancelled",
            "CANCELLED",
            None,
            "",
        )
        assert "scheduler" not in _status_cli(plan.sweep_dir)  # nothing to add: no column


@pytest.mark.slow
def test_a_job_past_its_time_limit_shows_timeout(tmp_path: Path) -> None:
    """A job that does not answer Slurm's warning signal (stuck, e.g. in a hung collective) runs into its time
    limit (1 minute, Slurm's least): klsweep's 'failed' with Slurm's TIMEOUT beside it, in the data, the
    80-column table and --json, and the reason names the limit's key."""
    import json

    sweep = tmp_path / "timeout"
    plan = jobs.make_plan(sweep, [0], **{"model.resources.timeout_min": 1})
    submit.submit(plan, "slurm", train_fn=jobs.hung_train)
    run = jobs.follow(sweep, lambda r: r.state in store.FINAL_STATES, "the time limit", timeout_s=240)
    assert (run.state, run.job_state, run.job_reason, run.scheduler) == ("failed", "TIMEOUT", None, "TIMEOUT")
    assert "model.resources.timeout_min" in " ".join(run.log_tail)
    table = _status_cli(sweep)
    assert max(len(line) for line in table.split("\n---")[0].splitlines()) <= 80, table
    assert "TIMEOUT" in table.split("\n---")[0], table
    (shown,) = json.loads(_status_cli(sweep, "--json"))
    assert shown["job_state"] == "TIMEOUT" and shown["state"] == "failed"


def test_a_signal_delay_set_reaches_sbatch(tmp_path: Path) -> None:
    """cluster.signal_delay_s (#34, 5) is what sbatch gets (`--signal=USR2@<s>`), not the fixed 60 s of before;
    without it a CPU run (no time estimate) keeps 60 s. Held jobs: nothing runs; cancelled at the end."""
    held = {"cluster.additional_parameters": {"hold": True}}
    set_plan = jobs.make_plan(tmp_path / "set", [0], **held, **{"cluster.signal_delay_s": 45})
    default_plan = jobs.make_plan(tmp_path / "default", [0], **held)
    for plan, delay in ((set_plan, 45), (default_plan, 60)):
        submit.submit(plan, "slurm", train_fn=jobs.ok_train)
        try:
            (script,) = plan.sweep_dir.rglob("*_submission.sh")
            assert f"#SBATCH --signal=USR2@{delay}\n" in script.read_text()
        finally:
            submit.cancel(plan.sweep_dir)
