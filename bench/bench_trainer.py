"""Step time of KLGRPOTrainer against plain TRL GRPOTrainer with its built-in KL (k3 in the loss, beta > 0).

Same untrained tiny model, batch, completion length and seed for every variant; each variant trains
``--steps`` steps, ``--reps`` times, the variants interleaved (so that a change in machine load hits them all);
the time of a step is TRL's ``step_time`` (generation + reference/behaviour forwards + loss + backward +
optimiser), the first step of each repetition dropped as warm-up. Prints the median per variant and its ratio
to TRL. Targets: <= 1.05 for "loss", <= 1.20 for "reward" and "both".

    python bench/bench_trainer.py                 # CPU: ~1-2 minutes
    python bench/bench_trainer.py --batch 32 --group 8 --length 64 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
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


def step_times(variant: str, model_dir: Path, dataset, out: Path, args: argparse.Namespace) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
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
        learning_rate=1e-3,
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
    trainer.train()
    times = [row["step_time"] for row in trainer.state.log_history if "step_time" in row]
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16, help="completions per step")
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--length", type=int, default=32, help="max completion length")
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    from datasets import Dataset
    from transformers.utils import logging

    from klsweep.tinymodel import random_tiny_model

    logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = random_tiny_model(Path(tmp) / "model")
        questions = [f"{a}+{b}=" for a in range(20) for b in range(20)]
        dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q in questions]})
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for rep in range(args.reps):
            for name in VARIANTS:
                times[name] += step_times(name, model_dir, dataset, Path(tmp) / f"{name}-{rep}", args)
    base = statistics.median(times["trl"])
    print(f"batch {args.batch}, group {args.group}, length {args.length}, {args.reps}x{args.steps} steps")
    print(f"{'variant':<8} {'median s/step':>14} {'ratio':>7} {'target':>7}")
    for name, values in times.items():
        median = statistics.median(values)
        target = TARGETS.get(name)
        mark = "" if target is None else ("ok" if median / base <= target else "MISSED")
        print(f"{name:<8} {median:>14.4f} {median / base:>7.3f} {target or '':>7} {mark}")


if __name__ == "__main__":
    main()
