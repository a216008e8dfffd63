"""Small real job functions for the launcher tests (pickled by value, so jobs need not import this module),
and a helper that builds a Plan by hand from ``klsweep.config.RunConfig``."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
from omegaconf import OmegaConf

from klsweep import store
from klsweep.config import RunConfig
from klsweep.grid import Plan, PlannedRun, run_id

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def make_plan(sweep_dir: Path, seeds: list[int], **overrides: Any) -> Plan:
    """One run per seed; ``overrides`` are dotted keys set on every run's plain config dict."""
    runs = []
    for seed in seeds:
        cfg = OmegaConf.to_container(OmegaConf.structured(RunConfig), resolve=True)
        cfg["name"] = sweep_dir.name
        cfg["seed"] = seed
        cfg["train"]["steps"] = 3
        for key, value in overrides.items():
            node = cfg
            *parents, leaf = key.split(".")
            for p in parents:
                node = node[p]
            node[leaf] = value
        rid = run_id(cfg)
        runs.append(PlannedRun(id=rid, params={"seed": seed}, config=cfg, run_dir=sweep_dir / rid))
    return Plan(name=sweep_dir.name, sweep_dir=sweep_dir, runs=runs, axes=["seed"], excluded=0, grid_text="")


def _seed(run_dir: Path) -> int:
    return int(OmegaConf.load(run_dir / store.CONFIG_FILE).seed)


def final_checkpoint(run_dir: Path, step: int) -> str:
    """The checkpoint a trainer leaves where a run ended (a config.json: whole for ``store.stale_end``, no
    weights); its name, for status.json's ``final_checkpoint``."""
    folder = run_dir / store.CHECKPOINTS_DIR / f"checkpoint-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    store.write_json(folder / "config.json", {})
    return folder.name


def ok_train(run_dir: Path) -> dict:
    """Three quick steps; records when it ran (to check how many ran at once)."""
    with open(run_dir / "spans.txt", "a") as f:
        f.write(f"start {time.time()}\n")
    store.write_status(run_dir, "running", step=0, total_steps=3, started_at=time.time())
    for step in range(1, 4):
        time.sleep(0.5)
        store.append_jsonl(run_dir / store.METRICS_FILE, {"step": step, "reward_mean": 0.1 * step})
        store.write_status(run_dir, "running", step=step)
    with open(run_dir / "spans.txt", "a") as f:
        f.write(f"end {time.time()}\n")
    return store.write_status(
        run_dir, "done", finished_at=time.time(), elapsed_s=1.5, final_checkpoint=final_checkpoint(run_dir, 3)
    )


def bad_train(run_dir: Path) -> dict:
    store.write_status(run_dir, "running", step=0, total_steps=3, started_at=time.time())
    print("about to fail: KLSWEEP-BOOM", file=sys.stderr, flush=True)
    raise RuntimeError("KLSWEEP-BOOM: this run fails on purpose")


def seed_train(run_dir: Path) -> dict:
    """Fails for odd seeds, succeeds for even ones."""
    return bad_train(run_dir) if _seed(run_dir) % 2 else ok_train(run_dir)


def slow_train(run_dir: Path, total: int = 20, step_s: float = 1.0) -> dict:
    """``total`` steps of ``step_s`` seconds; progress lives in progress.txt, so a rerun resumes where the
    last one stopped. starts.txt gets one line per start: the step it started from."""
    progress = run_dir / "progress.txt"
    done = int(progress.read_text()) if progress.exists() else 0
    with open(run_dir / "starts.txt", "a") as f:
        f.write(f"{done} {os.environ.get('SLURM_JOB_ID', os.environ.get('SUBMITIT_LOCAL_JOB_ID'))}\n")
    print(f"slow_train: starting at step {done}", flush=True)  # the job's log (and the run's logs/)
    store.write_status(run_dir, "running", step=done, total_steps=total, started_at=time.time())
    while done < total:
        time.sleep(step_s)
        done += 1
        store.atomic_write_text(progress, str(done))
        store.write_status(run_dir, "running", step=done)
    end = final_checkpoint(run_dir, done)
    return store.write_status(run_dir, "done", step=done, finished_at=time.time(), final_checkpoint=end)


def short_slow_train(run_dir: Path) -> dict:
    """``slow_train`` of 6 steps of 0.5 s; seed 0 trains 60 (30 s: long enough to be cancelled while it trains
    on a loaded machine)."""
    return slow_train(run_dir, total=60 if _seed(run_dir) == 0 else 6, step_s=0.5)


def killed_odd_train(run_dir: Path) -> dict:
    """``ok_train`` for even seeds; odd seeds start, then their process is killed (as by the OOM killer)."""
    if _seed(run_dir) % 2 == 0:
        return ok_train(run_dir)
    import signal

    store.write_status(run_dir, "running", step=0, total_steps=3, started_at=time.time())
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def train_failing_odd(run_dir: Path) -> dict:
    """``klsweep.job.train_run``; for odd seeds the reward raises at the second step (a run that fails in the
    middle of training, with its trainer and W&B run live)."""
    import functools

    from klsweep import job, tasks

    if _seed(run_dir) % 2 == 0:
        return job.train_run(run_dir)
    real = tasks.reward_function
    calls: list[int] = []

    def failing(task: Any) -> Any:
        reward = real(task)

        @functools.wraps(reward)
        def wrapped(*args: Any, **kwargs: Any) -> list[float]:
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("KLSWEEP-BOOM in the reward at step 2")
            return reward(*args, **kwargs)

        return wrapped

    tasks.reward_function = failing
    try:
        return job.train_run(run_dir)
    finally:
        tasks.reward_function = real


def hung_train(run_dir: Path) -> dict:
    """A job stuck where no Python signal handler runs (a hung collective): Slurm's warning before the time
    limit (USR2) goes unanswered, so it runs into the limit. progress.txt counts its seconds."""
    import signal

    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    store.write_status(run_dir, "running", step=0, total_steps=1000, started_at=time.time())
    for step in range(1, 1001):
        time.sleep(1)
        store.atomic_write_text(run_dir / "progress.txt", str(step))
        store.write_status(run_dir, "running", step=step)
    end = final_checkpoint(run_dir, 1000)
    return store.write_status(run_dir, "done", finished_at=time.time(), final_checkpoint=end)


def ok_eval(run_dir: Path, eval_cfg: dict, checkpoints: str = "last") -> dict:
    """Scores the run's final checkpoint (ok_train's: checkpoint-3), as an eval job does."""
    final = store.final_checkpoint(run_dir)
    out = {"suite": eval_cfg["suite"], "checkpoint": final, "metrics": {"in_domain": {"t": 1.0}}}
    store.write_json(run_dir / store.EVAL_DIR / "h0" / final / "results.json", out)
    return out


def max_overlap(sweep_dir: Path) -> int:
    """The largest number of ok_train runs that were running at the same moment."""
    events = []
    for p in sweep_dir.glob("*/spans.txt"):
        for line in p.read_text().split("\n"):
            if line:
                kind, t = line.split()
                events.append((float(t), 1 if kind == "start" else -1))
    cur = best = 0
    for _, d in sorted(events):
        cur += d
        best = max(best, cur)
    return best


def train_rows(sweep_dir: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in store.read_jsonl(sweep_dir / store.JOBS_FILE):
        if row["kind"] == "train":
            out.setdefault(row["run_id"], []).append(row)
    return out


def submit_in_child(plan: Plan, cluster: str, train_fn: Any, out: str) -> None:
    """Entry for a forked process of the race test: submit, write the result's actions to ``out``."""
    from klsweep.submit import submit

    res = submit(plan, cluster, train_fn=train_fn)
    Path(out).write_text(json.dumps(res.actions))


def train_keeping_weights(run_dir: Path) -> dict:
    """``klsweep.job.train_run`` unchanged, except that each rank then saves the final weights of the model it
    trained to ``final_weights_rank<RANK>.pt`` in the run folder (to check data-parallel ranks agree)."""
    import torch

    from klsweep import job, trainer_factory

    trainers = []
    build = trainer_factory.build_trainer

    def build_and_keep(*args: Any, **kwargs: Any) -> Any:
        trainers.append(build(*args, **kwargs))
        return trainers[-1]

    trainer_factory.build_trainer = build_and_keep
    try:
        status = job.train_run(run_dir)
    finally:
        trainer_factory.build_trainer = build
    (trainer,) = trainers
    model = trainer.accelerator.unwrap_model(trainer.model)
    weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    torch.save(weights, Path(run_dir) / f"final_weights_rank{os.environ.get('RANK', '0')}.pt")
    return status


# Slurm's reasons for a pending job that do not pass by themselves: the job cannot start as asked.
NEVER_STARTS = {
    "PartitionConfig",  # more than the partition's nodes have (e.g. 2 tasks on a node started with 1 CPU)
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "BadConstraints",
    "DependencyNeverSatisfied",
    "InvalidAccount",
    "InvalidQOS",
    "JobHeldUser",
    "JobHeldAdmin",
}


def follow(sweep_dir: Path, until: Any, what: str, timeout_s: float = 240, pending_s: float = 600) -> Any:
    """Poll the sweep's one run (``klsweep.submit.status``) until ``until(run)``; returns its last status.

    Follows the job's real state instead of one time budget: ``timeout_s`` counts only while the job runs; while
    it waits to start (behind another job on the node) it has ``pending_s`` more. Fails at once when the run
    ended first, or when Slurm says the job cannot start as asked (``NEVER_STARTS``). Every failure says what
    klsweep, the scheduler (state, reason, the queue) and the job's log say."""
    import subprocess

    from klsweep import submit

    ran = waited = 0.0
    last = time.time()
    while True:
        (run,) = submit.status(sweep_dir)
        if until(run):
            return run
        now = time.time()
        if run.state == "pending":
            waited += now - last
        else:
            ran += now - last
        last = now
        problem = (
            f"Slurm says the job cannot start ({run.job_reason})"
            if run.job_reason in NEVER_STARTS
            else f"the run ended {run.state}"
            if run.state in ("done", "diverged", "cancelled")
            else f"timed out after {ran:.0f} s running"
            if ran > timeout_s
            else f"still waiting to start after {waited:.0f} s"
            if waited > pending_s
            else None
        )
        if problem:
            queue = subprocess.run(["squeue", "-o", "%i %j %T %r %C"], capture_output=True, text=True).stdout
            raise AssertionError(
                f"{what}: {problem}; run {run.state} step {run.step}/{run.total_steps} ({run.reason}), "
                f"job {run.job_id} {run.job_state} ({run.job_reason})\nqueue:\n{queue}"
                f"log tail:\n{_train_log_tail(sweep_dir)}"
            )
        time.sleep(0.5)


def _train_log_tail(sweep_dir: Path, n: int = 15) -> str:
    """The last lines of the stderr of every task of the sweep's latest training job."""
    (row,) = [r for r in store.read_jsonl(sweep_dir / store.JOBS_FILE) if r["kind"] == "train"][-1:]
    logs = sorted(Path(row["folder"]).glob(f"{row['job_id']}_*_log.err"))
    return "\n".join(f"{p.name}: ...\n" + "\n".join(p.read_text().splitlines()[-n:]) for p in logs)


def submit_and_signal(
    sweep_dir: Path, plan: Plan, after_steps: int, timeout_s: float = 240
) -> tuple[str, dict]:
    """Submit the plan's one run to Slurm, wait for its first ``after_steps`` metrics rows, then send the job
    USR2 (what Slurm sends before a preemption or the time limit). Returns the job id and the rows written by
    then (step: time), which a resumed run keeps as they were."""
    import subprocess

    from klsweep import submit

    (run,) = plan.runs
    (job_id,) = [r["job_id"] for r in submit.submit(plan, "slurm").jobs]
    follow(sweep_dir, lambda _: len(store.read_metrics(run.run_dir)) >= after_steps, "first steps", timeout_s)
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    return job_id, {r["step"]: r["time"] for r in store.read_metrics(run.run_dir)}


def follow_to_the_end(sweep_dir: Path, timeout_s: float = 240) -> Any:
    """Follow the sweep's one run until it ends; a 'failed' that is the in-job requeue's report (a requeued job
    may read failed for a moment, test_slurm.py) is followed on to the end after the requeue."""

    def ended(r: Any) -> bool:
        return r.state in store.FINAL_STATES

    run = follow(sweep_dir, ended, "the end", timeout_s=timeout_s)
    if run.state == "failed":
        run = follow(sweep_dir, lambda r: ended(r) and r.state != "failed", "the end after a requeue")
    return run


def assert_resumed_not_restarted(run_dir: Path, steps: int, signalled: dict, lag: int) -> None:
    """Every step's metrics written exactly once, those written before the signal kept as they were (resumed
    from the preemption's save, not restarted), and every batch after the pipeline fill ``lag`` steps old."""
    final = store.read_metrics(run_dir)
    assert [r["step"] for r in final] == list(range(1, steps + 1))
    times = {r["step"]: r["time"] for r in final}
    assert {s: times[s] for s in signalled} == signalled
    assert [r["policy_lag"] for r in final if r["step"] > lag] == [float(lag)] * (steps - lag)
