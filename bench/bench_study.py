"""Where the time of a tiny study's run goes, and what the local back end's worker pool saves.

    .venv/bin/python bench/bench_study.py                  # 2 cores: ~4 minutes
    .venv/bin/python bench/bench_study.py --steps 50 --runs 4 --grid sweeps/tiny.yaml

1. Phases of one run (the grid's first run, ``--steps`` steps), in a fresh Python process as a job gets it,
   through the real code paths (``klsweep.job.train_run``, then ``klsweep.evaluate.eval_run``), each phase timed
   by wrapping the function that does it (wall: perf_counter, CPU: process_time): the interpreter's start, the
   imports (torch, transformers, TRL, datasets, W&B), model and tokenizer load, dataset build, trainer
   construction, W&B init and finish, the optimiser steps, checkpoint saves, the rest of ``train_run`` (config,
   status, environment record), lm-eval's import and the eval. The per-run fixed cost is everything but the
   steps; its fraction of a 300-step run is extrapolated from the measured step time.
2. The local back end end to end (``klsweep.submit``, submitit's LocalExecutor, one job at a time so that the
   per-run cost is not hidden by parallelism): the grid's first ``--runs`` runs, trained and evaluated with one
   process per job (``cluster.local_jobs_per_worker=1``, the baseline) and with one worker for all
   (``cluster.local_jobs_per_worker=0``, the default); printed as seconds per run and the pool's ratio to the
   baseline, both measured in this same call (so machine load hits both).

Measured (2026-11-30, this project's 2-core x86 CPU VM, torch 2.13 CPU, the cores shared with other jobs at
a load average of ~4; sweeps/tiny.yaml of the 50-run design: beta 1, lr 3e-4, 150 eval problems per task;
50 steps, 4 runs). One run in a fresh process, CPU seconds: imports 5.6 (40% of the run's wall), W&B init +
finish 0.8, model load 0.2, dataset 0.2, trainer construction 0.02, saves 0.04, the rest of train_run 0.3,
eval 1.6 (lm-eval's heavy modules load inside it), the 50 steps 4.1 (89 ms wall a step). Per-run fixed cost
7.6 s wall: 22% of a 300-step run, 27% with its eval. End to end, seconds per run (train + eval): 24.5 with a
process per job, 9.2 with one worker: ratio 0.38 (before the 50-run design, at loads of ~5 and ~7: 0.35 and
0.32). The pool saves more than one process's imports because a process per job starts two per run (the
training and the eval job), each paying the imports, submitit's start and the supervisor's polling.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STARTED = time.time()  # the child's first instruction: the interpreter's start ends here

ROOT = Path(__file__).resolve().parents[1]
PHASES = {  # phase -> what it covers
    "start": "interpreter start",
    "imports": "imports (torch, TRL, W&B)",
    "model": "model + tokenizer load",
    "dataset": "dataset build",
    "trainer": "trainer construction",
    "wandb": "W&B init + finish",
    "steps": "optimiser steps",
    "saves": "checkpoint saves",
    "other": "rest of train_run",
    "eval_imports": "lm-eval import",
    "eval": "eval (lm-eval)",
}
FIXED = [p for p in PHASES if p not in ("steps", "eval_imports", "eval")]


def _timer(totals: dict[str, list[float]], phase: str, fn):
    """``fn`` with its wall and CPU seconds added to ``totals[phase]``."""

    def timed(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[phase][0] += time.perf_counter() - wall
            totals[phase][1] += time.process_time() - cpu

    return timed


def phases(run_dir: Path, spawned: float) -> dict[str, list[float]]:
    """In a fresh process: train and evaluate ``run_dir`` with each phase timed; phase -> [wall s, CPU s]."""
    totals = {p: [0.0, 0.0] for p in PHASES}
    totals["start"] = [STARTED - spawned, time.process_time()]
    wall, cpu = time.perf_counter(), time.process_time()
    import datasets  # noqa: F401
    import torch  # noqa: F401
    import transformers
    import trl  # noqa: F401
    import wandb

    from klsweep import job, tasks, tracking
    from klsweep.trainer import KLGRPOTrainer

    totals["imports"] = [time.perf_counter() - wall, time.process_time() - cpu]

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        cls.from_pretrained = staticmethod(_timer(totals, "model", cls.from_pretrained))
    tasks.load_train_dataset = _timer(totals, "dataset", tasks.load_train_dataset)
    tasks.drop_long_prompts = _timer(totals, "dataset", tasks.drop_long_prompts)
    KLGRPOTrainer.__init__ = _timer(totals, "trainer", KLGRPOTrainer.__init__)
    tracking.open_training_run = _timer(totals, "wandb", tracking.open_training_run)
    wandb.sdk.wandb_run.Run.finish = _timer(totals, "wandb", wandb.sdk.wandb_run.Run.finish)
    KLGRPOTrainer._save_checkpoint = _timer(totals, "saves", KLGRPOTrainer._save_checkpoint)

    def train(self, *args, **kwargs):  # the steps: trainer.train less the saves inside it
        saved = list(totals["saves"])
        w, c = time.perf_counter(), time.process_time()
        try:
            return real_train(self, *args, **kwargs)
        finally:
            totals["steps"][0] += time.perf_counter() - w - (totals["saves"][0] - saved[0])
            totals["steps"][1] += time.process_time() - c - (totals["saves"][1] - saved[1])

    real_train = KLGRPOTrainer.train
    KLGRPOTrainer.train = train

    wall, cpu = time.perf_counter(), time.process_time()
    status = job.train_run(run_dir)
    total = [time.perf_counter() - wall, time.process_time() - cpu]
    if status["state"] != "done":
        raise SystemExit(f"the run did not finish: {status['state']} {status.get('reason')}")
    inner = ("model", "dataset", "trainer", "wandb", "steps", "saves")
    totals["other"] = [total[k] - sum(totals[p][k] for p in inner) for k in (0, 1)]

    from klsweep import evaluate

    wall, cpu = time.perf_counter(), time.process_time()
    import lm_eval.api.registry  # noqa: F401
    import lm_eval.evaluator  # noqa: F401
    import lm_eval.loggers  # noqa: F401
    import lm_eval.models.huggingface  # noqa: F401
    import lm_eval.tasks  # noqa: F401

    totals["eval_imports"] = [time.perf_counter() - wall, time.process_time() - cpu]
    config = evaluate.run_config(run_dir)
    wall, cpu = time.perf_counter(), time.process_time()
    evaluate.eval_run(run_dir, config.eval)
    totals["eval"] = [time.perf_counter() - wall, time.process_time() - cpu]
    return totals


def first_runs(grid: Path, steps: int, n: int, out: Path, *overrides: str):
    from klsweep.grid import load_plan

    plan = load_plan(
        grid, [f"train.steps={steps}", f"train.save_steps={steps}", "wandb.mode=offline", *overrides], out=out
    )
    plan.runs = plan.runs[:n]
    return plan


def end_to_end(grid: Path, steps: int, n: int, root: Path, per_worker: int) -> float:
    """Wall seconds until ``n`` runs trained and evaluated through the local back end, one job at a time."""
    from klsweep import submit
    from klsweep.submit.state import FINAL

    plan = first_runs(
        grid,
        steps,
        n,
        root / f"e2e{per_worker}",
        "cluster.max_local_jobs=1",
        f"cluster.local_jobs_per_worker={per_worker}",
    )
    start = time.perf_counter()
    submit.submit(plan, "local")
    while True:  # every 0.5 s (wait_until_final backs off while nothing changes: the end would be seen late)
        runs = submit.status(plan.sweep_dir)
        if all(r.state in FINAL and r.eval_state not in ("pending", "running") for r in runs):
            break
        time.sleep(0.5)
    took = time.perf_counter() - start
    bad = [r for r in runs if r.state != "done" or r.eval_state != "done"]
    if bad:
        raise SystemExit(f"runs not done: {[(r.run_id, r.state, r.eval_state, r.reason) for r in bad]}")
    return took


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(*header, box=None, pad_edge=False)
    for col in t.columns[1:]:
        col.justify = "right"
    for row in rows:
        t.add_row(*row)
    Console(width=80).print(t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", type=Path, default=ROOT / "sweeps" / "tiny.yaml")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--runs", type=int, default=4, help="runs of the end-to-end comparison")
    ap.add_argument("--phases-of", type=Path, help=argparse.SUPPRESS)  # the child: phases of this run folder
    ap.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phases_of:
        print(json.dumps(phases(args.phases_of, args.spawned)))
        return

    os.environ.setdefault("WANDB_SILENT", "true")
    root = Path(tempfile.mkdtemp(prefix="klsweep-bench-study-"))
    from klsweep import store, tinymodel
    from klsweep.config import write_run
    from klsweep.environment import usable_cores

    tinymodel.tiny_model_path()  # built (once, cached) here, not in the timed process
    plan = first_runs(args.grid, args.steps, 1, root / "phases")
    write_run(plan.runs[0].run_dir, plan.runs[0].config)
    store.write_status(plan.runs[0].run_dir, "pending")
    spawned = time.time()
    child = subprocess.run(
        [sys.executable, __file__, "--phases-of", str(plan.runs[0].run_dir), "--spawned", str(spawned)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    if child.returncode:
        raise SystemExit(child.stderr[-3000:])
    t = json.loads(child.stdout.strip().splitlines()[-1])
    run_wall = sum(t[p][0] for p in PHASES)
    rows = [
        (what, f"{t[p][0]:.2f}", f"{t[p][1]:.2f}", f"{100 * t[p][0] / run_wall:.0f}%")
        for p, what in PHASES.items()
    ]
    fixed = sum(t[p][0] for p in FIXED)
    step = t["steps"][0] / args.steps
    per_run_eval = t["eval_imports"][0] + t["eval"][0]
    print(f"One run of {args.grid.name} ({args.steps} steps), a fresh process, {usable_cores()} cores:")
    table(rows, ("phase", "wall s", "CPU s", "of run"))
    full = fixed + 300 * step
    print(f"per-run fixed cost (all but the steps and the eval): {fixed:.1f} s; a step: {step * 1000:.0f} ms")
    print(
        f"a 300-step run: {fixed / full:.0%} fixed cost ({fixed:.1f} of {full:.1f} s), "
        f"{(fixed + per_run_eval) / (full + per_run_eval):.0%} with its eval"
    )

    baseline = end_to_end(args.grid, args.steps, args.runs, root, per_worker=1)
    pooled = end_to_end(args.grid, args.steps, args.runs, root, per_worker=0)
    print(f"\nLocal back end, {args.runs} runs of {args.steps} steps + eval, one job at a time:")
    table(
        [
            (
                "a process per job (local_jobs_per_worker=1)",
                f"{baseline:.1f}",
                f"{baseline / args.runs:.1f}",
                "1.00",
            ),
            (
                "one worker (local_jobs_per_worker=0)",
                f"{pooled:.1f}",
                f"{pooled / args.runs:.1f}",
                f"{pooled / baseline:.2f}",
            ),
        ],
        ("", "wall s", "s/run", "ratio"),
    )


if __name__ == "__main__":
    main()
