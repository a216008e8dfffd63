"""Launcher scale benchmark: sbatch calls for 1,000 runs, and `status` over 1,000 run folders.

    source /tmp/klsweep-slurm/env.sh        # the local test cluster (bash slurm/start.sh), if running
    .venv/bin/python bench/bench_slurm.py [--runs 1000]

Submission is counted at the subprocess boundary (every sbatch that submitit runs); with a cluster up the 1,000
runs are really submitted (a no-op job, then cancelled). Status is timed over synthetic run folders whose jobs
are recorded in jobs.jsonl; the naive baseline asks the scheduler once per job.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import launcher_jobs as jobs  # noqa: E402

from klsweep import store, submit  # noqa: E402
from klsweep.submit.sweep import write_sweep_file  # noqa: E402


def noop(run_dir: Path) -> dict:
    return {}


def count_sbatch(plan) -> tuple[int, float]:
    """Submit for real, counting every sbatch submitit runs (its CommandFunction is the subprocess boundary)."""
    from submitit.core import utils

    calls = 0
    real_call = utils.CommandFunction.__call__

    def counting_call(self, *a, **k):
        nonlocal calls
        calls += self.command[0] == "sbatch"
        return real_call(self, *a, **k)

    utils.CommandFunction.__call__ = counting_call
    try:
        t = time.time()
        submit.submit(plan, "slurm", train_fn=noop)
        return calls, time.time() - t
    finally:
        utils.CommandFunction.__call__ = real_call
        subprocess.run(["scancel", "--user=" + __import__("getpass").getuser()], check=False)


def synthetic_sweep(root: Path, n: int, with_cluster: bool) -> Path:
    plan = jobs.make_plan(root / "status", list(range(n)))
    sweep = plan.sweep_dir
    write_sweep_file(plan, "slurm")
    base = 1 if not with_cluster else 10**6  # ids the cluster does not know: the query still runs
    for i, run in enumerate(plan.runs):
        run.run_dir.mkdir(parents=True)
        store.atomic_write_text(run.run_dir / store.CONFIG_FILE, "{}\n")
        store.write_status(run.run_dir, ["done", "running", "failed"][i % 3], step=i % 50, total_steps=50)
        store.append_jsonl(run.run_dir / store.METRICS_FILE, {"step": i % 50, "reward_mean": 0.5})
        store.append_jsonl(
            sweep / store.JOBS_FILE,
            {"run_id": run.id, "kind": "train", "cluster": "slurm", "job_id": f"{base}_{i}",
             "folder": str(sweep / "submitit"), "submitted_at": time.time()},
        )  # fmt: skip
    return sweep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    n = ap.parse_args().runs
    have_cluster = (
        shutil.which("sbatch") is not None and subprocess.run(["sinfo"], capture_output=True).returncode == 0
    )
    root = Path(tempfile.mkdtemp(prefix="klsweep-bench-"))
    try:
        if have_cluster:
            calls, secs = count_sbatch(jobs.make_plan(root / "submit", list(range(n))))
            print(
                f"submit {n} runs: {calls} sbatch call(s) in {secs:.1f} s (naive one-job-per-run: {n}; ratio {n / max(calls, 1):.0f}x)"
            )
        else:
            print("submit: no Slurm cluster up (bash slurm/start.sh); skipped")
        sweep = synthetic_sweep(root, n, have_cluster)
        sacct_calls = 0
        real_run = subprocess.run

        def counting_run(cmd, *a, **k):
            nonlocal sacct_calls
            if isinstance(cmd, list) and cmd and cmd[0] in ("sacct", "squeue"):
                sacct_calls += 1
            return real_run(cmd, *a, **k)

        subprocess.run = counting_run
        t = time.time()
        runs = submit.status(sweep)
        batched = time.time() - t
        subprocess.run = real_run
        print(
            f"status over {len(runs)} runs: {batched:.2f} s, {sacct_calls} scheduler quer{'y' if sacct_calls == 1 else 'ies'}"
        )
        if have_cluster:
            sample = 50
            t = time.time()
            for i in range(sample):
                real_run(
                    ["sacct", "-X", "--parsable2", "-o", "JobID,State", "-j", f"{10**6}_{i}"],
                    capture_output=True,
                )
            per = (time.time() - t) / sample
            naive = per * n + batched
            print(
                f"naive baseline (one sacct per job, measured on {sample}): {per * 1000:.1f} ms each, ~{naive:.1f} s for {n}; ratio {naive / batched:.0f}x"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
