"""A whole run of the tiny study (start to final save, ``job.train_run``) generating with ``klsweep.fastgen``
against the same run generating with HF generate (today's path before it): CPU time of each, interleaved, in one
process as a warm local worker runs them (its imports paid once, by a warm-up run that is not timed), and
whether both wrote the same run (every metrics row equal but its times, the same final weights).

    python bench/bench_run.py                 # a v5 run (k3 in the loss, beta 1, 4 x 8, 300 steps): minutes
    python bench/bench_run.py --steps 100 --reps 2

Prints each repetition's CPU seconds and the ratio fast / hf (target of issue 48: <= 0.6).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

TIMES = ("time", "elapsed_s", "step_time")  # the columns that differ between two trainings of one run


def v5_run(run_dir: Path, generation: str, steps: int) -> None:
    """The config of a study v5 run (sweeps/tiny.yaml: k3 in the loss, seed 0), written to ``run_dir``."""
    from omegaconf import OmegaConf

    from klsweep.config import RunConfig, write_run

    config = OmegaConf.structured(RunConfig)
    values = {
        "name": "bench",
        "model.path": "tiny",
        "task.name": "tiny",
        "kl.estimator": "k3",
        "kl.placement": "loss",
        "kl.level": "token",
        "kl.reward_mode": "separate",
        "kl.beta": 1.0,
        "train.steps": steps,
        "train.save_steps": 100,
        "train.learning_rate": 1e-4,
        "train.lr_scheduler_type": "constant",
        "train.collapse_window": 20,
        "train.collapse_fraction": 0.3,
        "train.prompts_per_step": 4,
        "train.group_size": 8,
        "train.max_completion_length": 6,
        "train.generation": generation,
        "wandb.mode": "disabled",
        "seed": 0,
    }
    for key, value in values.items():
        OmegaConf.update(config, key, value)
    write_run(run_dir, OmegaConf.to_container(config))


def rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMES} for line in lines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from transformers.utils import logging

    from klsweep import job

    logging.set_verbosity_error()
    cpu: dict[str, list[float]] = {"hf": [], "fast": []}
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm"
        v5_run(warm, "fast", 2)
        job.train_run(warm)  # imports, the shipped model's checks: paid once per worker
        done: dict[str, Path] = {}
        for rep in range(args.reps):
            for generation in ("hf", "fast") if rep % 2 == 0 else ("fast", "hf"):
                run_dir = Path(tmp) / f"{generation}-{rep}"
                v5_run(run_dir, generation, args.steps)
                start = time.process_time()
                status = job.train_run(run_dir)
                cpu[generation].append(time.process_time() - start)
                assert status["state"] in ("done", "diverged"), status
                done[generation] = run_dir
                print(f"rep {rep} {generation}: {cpu[generation][-1]:.1f} s CPU", file=sys.stderr)
        same = rows(done["hf"]) == rows(done["fast"])
    ratios = [f / h for f, h in zip(cpu["fast"], cpu["hf"], strict=True)]
    print(f"a v5 run of {args.steps} steps, {args.reps} repetitions; load {os.getloadavg()[0]:.1f}")
    print(f"hf   CPU s: {', '.join(f'{t:.1f}' for t in cpu['hf'])}")
    print(f"fast CPU s: {', '.join(f'{t:.1f}' for t in cpu['fast'])}")
    ratio = statistics.median(cpu["fast"]) / statistics.median(cpu["hf"])
    print(
        f"fast / hf: {ratio:.3f} (repetitions {min(ratios):.3f}-{max(ratios):.3f}; target 0.6: "
        f"{'met' if ratio <= 0.6 else 'MISSED'}); the same metrics rows but times: {same}"
    )


if __name__ == "__main__":
    main()
