"""Step time of KLGRPOTrainer against plain TRL GRPOTrainer with its built-in KL (k3 in the loss, beta > 0).

Same untrained tiny model, batch, completion length and seed for every variant, and a learning rate of 0, so
that every variant generates exactly the same completions and does the same work but for its KL; each trains
``--steps`` steps, ``--reps`` times, the variants interleaved (so that a change in machine load hits them all);
a step (generation + reference/behaviour forwards + loss + backward + optimiser) is timed by the process's
CPU time with torch on one thread, which other processes' load on the machine barely changes (the wall time
is printed too); the first step of each repetition is dropped as warm-up. Prints the median per variant and
its ratio to TRL. Targets: <= 1.05 for "loss", <= 1.20 for "reward" and "both".

    python bench/bench_trainer.py                 # CPU: ~2 minutes
    python bench/bench_trainer.py --batch 32 --group 8 --length 64 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

TARGETS = {"loss": 1.05, "reward": 1.20, "both": 1.20}
VARIANTS = {  # name -> KL configuration (None: TRL's built-in k3)
    "trl": None,
    "loss": ("k3", "loss"),
    "reward": ("k1", "reward"),
    "both": ("k3", "both"),
}


def length_reward(prompts, completions, **kwargs) -> list[float]:
    return [float(len(c[0]["content"]) % 3) for c in completions]


def step_times(
    variant: str, model_dir: Path, dataset, out: Path, args: argparse.Namespace
) -> tuple[list[float], list[float]]:
    """CPU and wall seconds of each step after the first."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from klsweep.kl import KLConfig
    from klsweep.trainer import KLGRPOTrainer

    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    kl = VARIANTS[variant]
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=args.batch,
        num_generations=args.group,
        max_completion_length=args.length,
        max_steps=args.steps + 1,
        learning_rate=0.0,  # the policy stays put: every variant samples the very same completions
        logging_steps=1,
        report_to=[],
        bf16=False,
        use_cpu=True,
        save_strategy="no",
        seed=args.seed,
        disable_tqdm=True,
        beta=args.beta if kl is None else 0.0,
        use_bias_correction_kl=False,
    )
    common = dict(
        reward_funcs=length_reward,
        args=config,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    if kl is None:
        trainer = GRPOTrainer(model, **common)
    else:
        trainer = KLGRPOTrainer(model, kl=KLConfig(*kl, beta=args.beta), **common)
    trainer.remove_callback(PrinterCallback)
    cpu: list[float] = []
    wall: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.cpu, self.wall = time.process_time(), time.perf_counter()

        def on_step_end(self, *a, **k):
            cpu.append(time.process_time() - self.cpu)
            wall.append(time.perf_counter() - self.wall)

    trainer.add_callback(Timer())
    trainer.train()
    return cpu[1:], wall[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16, help="completions per step")
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--length", type=int, default=16, help="max completion length")
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import torch
    from datasets import Dataset
    from transformers.utils import logging

    from klsweep.tinymodel import random_tiny_model

    logging.set_verbosity_error()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = random_tiny_model(Path(tmp) / "model")
        questions = [f"{a}+{b}=" for a in range(20) for b in range(20)]
        dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q in questions]})
        cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
        wall: dict[str, list[float]] = {name: [] for name in VARIANTS}
        names = list(VARIANTS)
        for rep in range(args.reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:  # rotate the order
                c, w = step_times(name, model_dir, dataset, Path(tmp) / f"{name}-{rep}", args)
                cpu[name] += c
                wall[name] += w
    base, base_wall = statistics.median(cpu["trl"]), statistics.median(wall["trl"])
    print(f"batch {args.batch}, group {args.group}, length {args.length}, {args.reps}x{args.steps} steps")
    print(
        f"{'variant':<8} {'cpu s/step':>11} {'ratio':>7} {'target':>7} {'':>6} {'wall s/step':>12} {'ratio':>7}"
    )
    for name in VARIANTS:
        median, median_wall = statistics.median(cpu[name]), statistics.median(wall[name])
        target = TARGETS.get(name)
        mark = "" if target is None else ("ok" if median / base <= target else "MISSED")
        print(
            f"{name:<8} {median:>11.4f} {median / base:>7.3f} {target or '':>7} {mark:>6} "
            f"{median_wall:>12.4f} {median_wall / base_wall:>7.3f}"
        )


if __name__ == "__main__":
    main()
