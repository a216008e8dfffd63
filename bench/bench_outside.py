"""Where a study run's CPU goes outside its optimiser steps, in a warm worker as the local back end runs them.

    .venv/bin/python bench/bench_outside.py                       # 3 runs of study v5 on fast numerics: minutes
    .venv/bin/python bench/bench_outside.py --runs 2 --numerics exact

Study v5's grid (sweeps/tiny.yaml at commit 4b78a56, ``git show``; ``--grid`` for another), its first ``--runs`` runs: after one warm-up run of 2 steps and its eval (the imports a worker pays
once), each run is trained (``job.train_run``) and its last checkpoint evaluated (``evaluate.eval_run``) in this
process, every phase timed by wrapping the function that does it. CPU seconds (``time.process_time``: this
process, all its threads), each phase without the phases inside it (a model load inside the trainer's
construction is the load's); and the CPU of W&B's service process (``wandb-core``, outside this process, its
children included) while each run trains and is evaluated, as the grid's ``wandb.mode`` (auto: offline without
a W&B login) has it.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
V5_COMMIT = "4b78a56"  # the last commit whose sweeps/tiny.yaml is study v5's grid (issue 48's pinned study)


def v5_grid(folder: Path) -> Path:
    """Study v5's grid, sweeps/tiny.yaml as of ``V5_COMMIT`` (``git show``), written to ``folder``."""
    import subprocess

    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{V5_COMMIT}:sweeps/tiny.yaml"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = folder / "tiny.yaml"  # the grid's name is the sweep's: "tiny"
    path.write_text(text)
    return path


TRAIN = {  # phase -> what it covers
    "load": "model, reference and tokenizer loads (from_pretrained)",
    "dataset": "training dataset built",
    "trainer": "trainer construction (less its loads)",
    "wandb": "W&B open and finish",
    "steps": "optimiser steps (trainer.train less what is below)",
    "rows": "metrics rows appended (fsync)",
    "status": "status.json written (fsync, each step)",
    "lock": "training lock checked (each step)",
    "saves": "checkpoint saves",
    "environment": "environment record",
    "other": "rest of train_run",
}
EVAL = {
    "eval_load": "lm-eval's HF model built (model load)",
    "eval_generate": "generation (HFLM._model_generate)",
    "eval_tracker": "lm-eval's results file",
    "eval_wandb": "scores to W&B",
    "eval_other": "rest: lm-eval's requests, scoring, samples and results.json",
}


class Phases:
    """CPU seconds per phase, each without the phases that ran inside it."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self._stack: list[list[float]] = []  # [start, inner seconds] of each open phase

    def wrap(self, phase: str, fn):
        def timed(*args, **kwargs):
            self._stack.append([time.process_time(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                start, inner = self._stack.pop()
                took = time.process_time() - start
                self.cpu[phase] = self.cpu.get(phase, 0.0) + took - inner
                if self._stack:
                    self._stack[-1][1] += took

        return timed

    def patch(self, phase: str, owner, name: str) -> None:
        fn = inspect.getattr_static(owner, name)
        wrapped = self.wrap(phase, fn.__func__ if isinstance(fn, staticmethod | classmethod) else fn)
        if isinstance(fn, classmethod):
            wrapped = classmethod(wrapped)
        elif isinstance(fn, staticmethod):
            wrapped = staticmethod(wrapped)
        setattr(owner, name, wrapped)


def instrument(phases: Phases) -> None:
    import transformers
    import wandb

    from klsweep import environment, store, tasks, tracking
    from klsweep.evaluate import running
    from klsweep.evaluate import runs as eval_runs
    from klsweep.trainer import KLGRPOTrainer

    for cls in (transformers.PreTrainedModel, transformers.AutoTokenizer):
        phases.patch("load", cls, "from_pretrained")
    phases.patch("dataset", tasks, "load_train_dataset")
    phases.patch("dataset", tasks, "drop_long_prompts")
    phases.patch("trainer", KLGRPOTrainer, "__init__")
    phases.patch("wandb", tracking, "open_training_run")
    phases.patch("wandb", wandb.sdk.wandb_run.Run, "finish")
    phases.patch("steps", KLGRPOTrainer, "train")
    phases.patch("saves", KLGRPOTrainer, "_save_checkpoint")
    phases.patch("saves", KLGRPOTrainer, "save_consolidated")
    phases.patch("rows", store, "append_jsonl")
    phases.patch("status", store, "write_status")
    phases.patch("lock", store, "check_training")
    phases.patch("environment", environment, "record")
    phases.patch("eval_load", running, "_make_lm")
    phases.patch("eval_tracker", running, "_save_lm_eval_results")
    phases.patch("eval_wandb", eval_runs, "_log_to_wandb")
    from lm_eval.models.huggingface import HFLM

    phases.patch("eval_generate", HFLM, "_model_generate")


def wandb_core() -> float:
    """CPU seconds of this process's W&B service (wandb-core, its waited children included) so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_text()
            if "wandb-core" in cmd and f"--pid\0{os.getpid()}" in cmd:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += sum(int(x) for x in fields[11:15]) / tick
        except OSError:
            continue
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", type=Path, default=None, help="default: study v5's grid")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="train.steps (default: the grid's)")
    ap.add_argument("--numerics", default="fast", choices=("fast", "exact"))
    args = ap.parse_args()
    os.environ.setdefault("WANDB_SILENT", "true")
    warnings.filterwarnings("ignore")
    from transformers.utils import logging

    logging.set_verbosity_error()
    from klsweep import job, store, tinymodel
    from klsweep.config import write_run
    from klsweep.evaluate import eval_run, run_config
    from klsweep.grid import load_plan

    tinymodel.tiny_model_path()
    root = Path(tempfile.mkdtemp(prefix="klsweep-bench-outside-"))
    args.grid = args.grid or v5_grid(root)
    steps = [f"train.steps={args.steps}"] if args.steps else []
    plan = load_plan(args.grid, [f"train.numerics={args.numerics}", *steps], out=root / "runs")
    warm = load_plan(args.grid, [f"train.numerics={args.numerics}", "train.steps=2"], out=root / "warm")
    runs = [warm.runs[0], *plan.runs[: args.runs]]
    phases = Phases()
    instrument(phases)
    rows = []
    for n, run in enumerate(runs):
        write_run(run.run_dir, run.config)
        store.write_status(run.run_dir, "pending")
        before = dict(phases.cpu)
        start, core = time.process_time(), wandb_core()
        status = phases.wrap("other", job.train_run)(run.run_dir)
        train_cpu = time.process_time() - start
        assert status["state"] in ("done", "diverged"), status
        start = time.process_time()
        phases.wrap("eval_other", eval_run)(run.run_dir, run_config(run.run_dir).eval)
        eval_cpu = time.process_time() - start
        time.sleep(1)  # wandb-core writes behind finish()
        if n == 0:  # the warm-up
            phases.cpu.clear()
            continue
        row = {p: phases.cpu.get(p, 0.0) - before.get(p, 0.0) for p in {**TRAIN, **EVAL}}
        row.update(train=train_cpu, eval=eval_cpu, wandb_core=wandb_core() - core)
        rows.append(row)
        print(
            f"{run.id}: train {train_cpu:.1f} s CPU, eval {eval_cpu:.2f}, wandb-core {row['wandb_core']:.2f}",
            file=sys.stderr,
        )
    load = os.getloadavg()[0]
    print(f"{len(rows)} runs of {args.grid.name} on {args.numerics} numerics, a warm worker; load {load:.1f}")
    print(f"{'phase':<14}{'CPU s/run':>10}  (median of {len(rows)})")
    for p, what in {**TRAIN, **EVAL}.items():
        print(f"{p:<14}{statistics.median(r[p] for r in rows):>10.2f}  {what}")
    outside = statistics.median(r["train"] - r["steps"] for r in rows)
    print(
        f"{'train_run':<14}{statistics.median(r['train'] for r in rows):>10.2f}  of which outside the steps {outside:.2f}"
    )
    print(
        f"{'eval_run':<14}{statistics.median(r['eval'] for r in rows):>10.2f}  an eval of the last checkpoint"
    )
    print(
        f"{'wandb-core':<14}{statistics.median(r['wandb_core'] for r in rows):>10.2f}  W&B's service process (train and eval)"
    )
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
