"""Slurm-only launcher behaviour on the real local cluster (``bash slurm/start.sh; source
/tmp/klsweep-slurm/env.sh``): preemption requeue with resume, and 2-task data-parallel training."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import launcher_jobs as jobs  # tests/ is on sys.path under pytest
import pytest

from klsweep import launcher, store

if "SLURM_CONF" not in os.environ and Path("/tmp/klsweep-slurm/slurm.conf").exists():
    os.environ["SLURM_CONF"] = "/tmp/klsweep-slurm/slurm.conf"

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        shutil.which("sbatch") is None and os.environ.get("CI") != "true",
        reason="no sbatch (bash slurm/install.sh && bash slurm/start.sh)",
    ),
]


def test_preemption_checkpoints_requeues_and_resumes(tmp_path: Path) -> None:
    sweep = tmp_path / "preempt"
    plan = jobs.make_plan(sweep, [0])
    run_dir = plan.runs[0].run_dir
    res = launcher.submit(plan, "slurm", train_fn=jobs.slow_train)
    (job_id,) = [r["job_id"] for r in res.jobs]
    start = time.time()
    while not (run_dir / "progress.txt").exists() or int((run_dir / "progress.txt").read_text()) < 3:
        assert time.time() - start < 60, "the job never started"
        time.sleep(0.3)
    # what Slurm sends before preemption/timeout: submitit calls TrainJob.checkpoint and requeues the job.
    # (About 1 in 16 `scontrol requeue` calls made from inside a job report failure although Slurm requeued
    # it: the run may pass through 'failed' but must end done.)
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    runs = launcher.wait_until_final(sweep, poll_s=1, timeout_s=180)
    if runs[0].state == "failed":  # the flaky requeue report: give the requeued job its time
        runs = launcher.wait_until_final(sweep, poll_s=1, timeout_s=120)
    assert runs[0].state == "done" and runs[0].step == 20
    starts = [int(line.split()[0]) for line in (run_dir / "starts.txt").read_text().splitlines()]
    assert len(starts) == 2 and starts[0] == 0 and starts[1] >= 3  # resumed, not restarted
    assert runs[0].job_id == job_id  # the same job, requeued


def test_two_tasks_train_data_parallel_with_same_weights(tmp_path: Path) -> None:
    """2 tasks on one node: TrainJob exports RANK/WORLD_SIZE/MASTER_ADDR; klsweep.job trains with gloo."""
    pytest.importorskip("klsweep.job", reason="klsweep/job.py not written yet")
    import torch

    sweep = tmp_path / "ddp"
    plan = jobs.make_plan(
        sweep,
        [0],
        **{
            "model.resources.tasks_per_node": 2,
            "train.steps": 2,
            "train.save_steps": 2,
            "wandb.mode": "disabled",
        },
    )
    launcher.submit(plan, "slurm")
    (run,) = launcher.wait_until_final(sweep, poll_s=1, timeout_s=400)
    assert run.state == "done", run.log_tail
    folder = Path(store.read_jsonl(sweep / store.JOBS_FILE)[-1]["folder"])
    logs = "".join(p.read_text() for p in folder.glob(f"{run.job_id}_*_log.out"))
    assert len(list(folder.glob(f"{run.job_id}_*_log.err"))) == 2  # two tasks ran
    ckpt = store.checkpoints(plan.runs[0].run_dir)[-1]
    weights = sorted(ckpt.glob("rank*.pt"))
    if weights:  # if the trainer dumps per-rank weights, they must agree
        a, b = (torch.load(w) for w in weights[:2])
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert "RANK" not in logs or "WORLD_SIZE" in logs
