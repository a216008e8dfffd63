"""A whole run of the tiny study (start to final save, ``job.train_run``) three ways: generating with HF
generate (``hf``: the path before ``klsweep.fastgen``), with fastgen (``fast``: today's default, the same bits),
and with fastgen on ``train.numerics: fast`` (``lean``: klsweep.fastpass, another stream of numbers): CPU time of
each, interleaved, in one process as a warm local worker runs them (its imports paid once, by a warm-up run that
is not timed), and whether hf and fast wrote the same run (every metrics row equal but its times).

    python bench/bench_run.py                 # a v5 run (k3 in the loss, beta 1, 4 x 8, 300 steps): minutes
    python bench/bench_run.py --steps 100 --reps 2

Prints each repetition's CPU seconds and the ratios fast / hf and lean / hf (target of issue 48: <= 0.6).
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


# name -> (train.generation, train.numerics)
VARIANTS = {"hf": ("hf", "exact"), "fast": ("fast", "exact"), "lean": ("fast", "fast")}


def v5_run(run_dir: Path, generation: str, steps: int, numerics: str = "exact") -> None:
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
        "train.numerics": numerics,
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
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm"
        v5_run(warm, "fast", 2, "fast")
        job.train_run(warm)  # imports, the shipped model's checks: paid once per worker
        done: dict[str, Path] = {}
        names = list(VARIANTS)
        for rep in range(args.reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:  # rotate the order
                run_dir = Path(tmp) / f"{name}-{rep}"
                generation, numerics = VARIANTS[name]
                v5_run(run_dir, generation, args.steps, numerics)
                start = time.process_time()
                status = job.train_run(run_dir)
                cpu[name].append(time.process_time() - start)
                assert status["state"] in ("done", "diverged"), status
                done[name] = run_dir
                print(f"rep {rep} {name}: {cpu[name][-1]:.1f} s CPU", file=sys.stderr)
        same = rows(done["hf"]) == rows(done["fast"])
        lean_same = rows(done["hf"]) == rows(done["lean"])
    print(f"a v5 run of {args.steps} steps, {args.reps} repetitions; load {os.getloadavg()[0]:.1f}")
    for name in names:
        print(f"{name:<5} CPU s: {', '.join(f'{t:.1f}' for t in cpu[name])}")
    for name in ("fast", "lean"):
        ratios = [f / h for f, h in zip(cpu[name], cpu["hf"], strict=True)]
        ratio = statistics.median(cpu[name]) / statistics.median(cpu["hf"])
        print(
            f"{name} / hf: {ratio:.3f} (repetitions {min(ratios):.3f}-{max(ratios):.3f}; target 0.6: "
            f"{'met' if ratio <= 0.6 else 'MISSED'})"
        )
    lean_fast = statistics.median(cpu["lean"]) / statistics.median(cpu["fast"])
    print(f"lean / fast (today's default): {lean_fast:.3f}")
    print(f"hf and fast wrote the same metrics rows but times: {same}; lean too: {lean_same}")


if __name__ == "__main__":
    main()
