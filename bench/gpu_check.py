"""GPU check: the GPU path and the memory planner on real model sizes, in one short run with no downloads.

For each size, a randomly initialised Qwen2-architecture model built from a config (Qwen2.5's shapes; the
project's byte-level tokenizer built locally, ids past it decode to nothing) trains in the configuration
``klsweep.trainer_factory.build_trainer`` chooses on one GPU (fp32 master weights and optimiser state, bf16 compute, the
reference model on the GPU), with a parity reward on the completion ids so that every group has advantages:

- step time of ``KLGRPOTrainer`` with the KL in the loss / reward / both against plain TRL ``GRPOTrainer``
  (its built-in k3 in the loss, beta > 0) at the same size, batch and completion length; the first step is
  warm-up, the median of the rest is compared (targets: loss <= 1.05, reward and both <= 1.10);
- peak GPU memory (``torch.cuda.max_memory_allocated``) of each variant against ``klsweep plan``'s estimate
  for the same run config (the ratio must stay within 0.75-1.25);
- step time against ``klsweep plan``'s estimate (``klsweep.cost``, for the GPU found: A100/H100/H200) of the
  same run config: ``est s`` and ``meas/est``; the calibration of the time model's constants (slurm/README.md,
  "Time estimate", says which to change and how);
- precision: with the paper's learning rate (1e-6), the fraction of the trained policy's master weights that
  the first optimiser step changes (fp32 master weights: nearly all; bf16 weights: ~2%).

With ``--vllm`` every variant generates through TRL's colocate vLLM (``train.use_vllm``, as sweeps/paper.yaml:
token-level importance sampling, vLLM on 30% of the GPU, sleep mode on a GPU): the vLLM colocate step of
bench/gpu_check.sh, run where vllm imports (a machine set up with ``KLSWEEP_GPU=1 ./dev.sh setup``).

Everything is printed as one table and written to ``--out`` as JSON. Sizes run in order and a size is skipped
when the time left (``--budget-s``) looks too short for it.

``--calibrate`` measures the parts of a step the time model takes as assumptions (``klsweep.cost.Assumptions``,
slurm/README.md "Time estimate") and prints the values to put there: the training forward/backward's MFU (fp32
master weights, bf16 autocast, activation checkpointing: 8 FLOPs a parameter a token, on the GPU; ``--sizes``'
first), the CPU seconds of math-verify per completion (``reward_s``: klsweep's MATH reward on MATH-style
answers), the GB/s of writing a checkpoint file under ``--write-dir`` (``cluster.checkpoint_write_gbps``: run it
on the results folder's file system). The weight sync into vLLM is not measured (vLLM is not carried).

    bash bench/gpu_check.sh                                      # the GPU machine: carried wheels, then this
    bash bench/gpu_check.sh --calibrate --sizes 1.5b             # the band's assumptions, measured
    python bench/gpu_check.py --sizes tiny --length 8 --steps 2  # CPU smoke run (the test suite runs it)
    python bench/gpu_check.py --vllm --sizes 0.5b                # the vLLM colocate step
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

# Qwen2.5's shapes (config.json of the 0.5B/1.5B/3B models); "tiny" is a CPU smoke size.
SIZES: dict[str, dict[str, int]] = {
    # head_dim 64 (vLLM's CPU attention refuses the tiny study's 16: --vllm runs it on vLLM's CPU build)
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=0),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936),
    "3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2, vocab_size=151936),
}  # fmt: skip
VARIANTS: dict[str, tuple[str, str] | None] = {  # name -> (estimator, placement); None: TRL's built-in k3
    "trl": None,
    "loss": ("k3", "loss"),
    "reward": ("k1", "reward"),
    "both": ("k3", "both"),
}
TARGETS = {"loss": 1.05, "reward": 1.10, "both": 1.10}
MEMORY_BAND = (0.75, 1.25)


def parity_reward(prompts: list, completions: list, completion_ids: list, **kwargs: Any) -> list[float]:
    """The fraction of even token ids: a reward every completion of a random model gets a different value of."""
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def build_model(size: str, folder: Path, device: str) -> Path:
    from klsweep.tinymodel import TinySpec, random_tiny_model

    shape = dict(SIZES[size])
    vocab = shape.pop("vocab_size") or None
    return random_tiny_model(folder, TinySpec(**shape, max_position_embeddings=4096), vocab, device)


def run_config(model_dir: Path, size: str, variant: str, args: argparse.Namespace) -> Any:
    """The klsweep run config of one variant (the TRL baseline uses the KL-in-loss config's trainer args)."""
    import torch
    from omegaconf import OmegaConf

    from klsweep.config import RunConfig

    estimator, placement = VARIANTS[variant] or VARIANTS["loss"]
    resources = {"gpus_per_node": 0}  # the planner's CPU case
    if torch.cuda.is_available():
        memory = torch.cuda.get_device_properties(0).total_memory / 2**30
        resources = {"gpus_per_node": 1, "gpu_memory_gb": int(memory), "gpu": gpu_name() or "h100-80gb"}
    overrides = {
        "name": "gpu_check",
        "seed": 0,
        "model": {"name": size, "path": str(model_dir), "resources": resources},
        "train": {
            "steps": args.steps + 1,
            "learning_rate": args.lr,
            "prompts_per_step": args.prompts,
            "group_size": args.group,
            "max_completion_length": args.length,
            "save_steps": 10_000,
        },
        "kl": {"estimator": estimator, "placement": placement, "beta": args.beta},
        "wandb": {"mode": "disabled"},
    }
    if args.vllm:  # sweeps/paper.yaml's generation; sleep mode only on a GPU (vLLM's CPU build has none)
        trl = {"vllm_gpu_memory_utilization": 0.3, "vllm_enable_sleep_mode": torch.cuda.is_available()}
        overrides["train"].update(use_vllm=True, vllm_importance_sampling="token_truncate", trl=trl)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), overrides))


def gpu_name() -> str | None:
    """The ``model.resources.gpu`` of the GPU at hand (``klsweep.cost.GPUS``), None for another or none."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name().lower()
    return next((k for k in ("a100-80gb", "h100-80gb", "h200") if k.split("-")[0] in name), None)


def planned(config: Any) -> tuple[float | None, float | None]:
    """``klsweep plan``'s per-device peak memory estimate and step-time estimate (None without a GPU of
    ``klsweep.cost.GPUS``) for this run config."""
    from dataclasses import asdict

    from klsweep import planner

    estimate, _ = planner.run_problems(asdict(config))
    if estimate is None:
        return None, None
    return estimate.peak_gb, (estimate.cost.step.total if estimate.cost and gpu_name() else None)


def measure(variant: str, model_dir: Path, size: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Train one variant ``args.steps + 1`` steps; its step times, peak memory and first-step weight change."""
    import dataclasses
    import gc

    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    from klsweep import trainer_factory

    gpu = torch.cuda.is_available()
    if gpu:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    config = run_config(model_dir, size, variant, args)
    trainer = trainer_factory.build_trainer(config, out)
    if VARIANTS[variant] is None:  # plain TRL, same arguments, its own k3 in the loss
        policy_dtype = next(trainer.model.parameters()).dtype
        trl_args = dataclasses.replace(  # generation_batch_size is derived again from steps_per_generation
            trainer.args, beta=args.beta, use_bias_correction_kl=False, generation_batch_size=None
        )
        dataset, tokenizer = trainer.train_dataset, trainer.processing_class
        del trainer
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=policy_dtype)
        # its vLLM engine started as klsweep's is (its KV cache on a CPU, its rendezvous port)
        with trainer_factory.vllm_engine_start(trl_args, model.config, 1, gpu):
            trainer = GRPOTrainer(
                model,
                reward_funcs=parity_reward,
                args=trl_args,
                train_dataset=dataset,
                processing_class=tokenizer,
            )
    else:
        trainer.reward_funcs = [parity_reward]
    trainer.remove_callback(PrinterCallback)
    times: list[float] = []
    changed: dict[str, Any] = {}

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    class Probe(TrainerCallback):
        def __init__(self, params: list[Any]) -> None:
            self.params = params

        def on_step_begin(self, _args, state, *a, **k):
            if state.global_step == 0:
                self.before = [p.detach().clone() for p in self.params]
            sync()
            self.start = time.perf_counter()

        def on_step_end(self, _args, state, *a, **k):
            sync()
            times.append(time.perf_counter() - self.start)
            if state.global_step == 1:
                n = sum(p.numel() for p in self.params)
                pairs = zip(self.params, self.before, strict=True)
                moved = sum(int((p.detach() != b).sum()) for p, b in pairs)
                changed.update(fraction=moved / n, dtype=str(self.params[0].dtype).removeprefix("torch."))
                del self.before

    trainer.add_callback(Probe([p for p in trainer.model.parameters() if p.requires_grad]))
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else None
    del trainer
    gc.collect()
    return {
        "step_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
        "peak_gb": peak,
        "master_dtype": changed.get("dtype"),
        "changed_fraction": changed.get("fraction"),
    }


def check(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    last_size_s: float | None = None
    last_params = 1
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            t0 = time.perf_counter()
            model_dir = build_model(size, Path(tmp) / size, device)
            from transformers import AutoConfig

            cfg = AutoConfig.from_pretrained(model_dir)
            n_params = _param_count(cfg)
            left = args.budget_s - (time.perf_counter() - start)
            if last_size_s is not None and last_size_s * n_params / last_params > left:
                print(f"{size}: skipped, {left:.0f} s left is too short", flush=True)
                break
            base: float | None = None
            for variant in VARIANTS:
                m = measure(variant, model_dir, size, Path(tmp) / f"{size}-{variant}", args)
                est, est_s = planned(run_config(model_dir, size, variant, args))
                base = m["step_s"] if variant == "trl" else base
                row = {"size": size, "params_b": n_params / 1e9, "variant": variant, **m}
                row["ratio_to_trl"] = m["step_s"] / base if base else None
                row["target"] = TARGETS.get(variant)
                row["estimate_gb"] = est
                row["peak_over_estimate"] = m["peak_gb"] / est if m["peak_gb"] and est else None
                row["estimate_step_s"] = est_s
                row["step_over_estimate"] = m["step_s"] / est_s if est_s else None
                rows.append(row)
                print(_line(row), flush=True)
            last_size_s, last_params = time.perf_counter() - t0, n_params
    return rows


def _param_count(cfg: Any) -> int:
    h, i, layers, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    kv = cfg.num_key_value_heads * h // cfg.num_attention_heads
    per_layer = h * (h + 2 * kv) + (h + 2 * kv) + h * h + 3 * h * i + 2 * h
    return v * h * (1 if cfg.tie_word_embeddings else 2) + layers * per_layer + h


HEADER = (
    f"{'size':<5} {'variant':<7} {'s/step':>7} {'vs TRL':>7} {'peak GB':>8} {'plan GB':>8} {'ratio':>6} "
    f"{'changed':>8} {'est s':>6} {'meas/est':>8}"
)
CALIBRATE = """meas/est: the measured step time over klsweep plan's estimate at its band's low end (klsweep/cost.py).
Off by more than a factor 1.5: on long completions (--length 1024) generation dominates, set HF_LAUNCH_S_PER_LAYER
or HBM_EFFICIENCY so that its decode matches; on short ones training dominates: --calibrate measures the MFU to
put in cost.LOW/HIGH. Record the GPU, the sizes and the ratios in slurm/README.md ("Time estimate")."""


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _line(r: dict[str, Any]) -> str:
    ratio = _fmt(r["ratio_to_trl"], ".3f") if r["variant"] != "trl" else "1"
    return (
        f"{r['size']:<5} {r['variant']:<7} {r['step_s']:>7.3f} {ratio:>7} {_fmt(r['peak_gb'], '.1f'):>8} "
        f"{_fmt(r['estimate_gb'], '.1f'):>8} {_fmt(r['peak_over_estimate'], '.2f'):>6} "
        f"{_fmt(r['changed_fraction'], '.1%'):>8} {_fmt(r.get('estimate_step_s'), '.2f'):>6} "
        f"{_fmt(r.get('step_over_estimate'), '.2f'):>8}"
    )


# ---------------------------------------------------------------------------------------------- calibration

# MATH-style final answers, and completions that box them right or wrong (math-verify parses and compares both)
_ANSWERS = [
    "\\frac{3}{4}",
    "2\\sqrt{5}",
    "x^2 + 2x + 1",
    "(1, -2)",
    "\\frac{\\pi}{6}",
    "144",
    "[0, 3)",
    "-\\frac{7}{2}",
]
_WRONG = ["0.7", "\\sqrt{20}", "(x+1)^2", "(-2, 1)", "30^\\circ", "12^2", "[0, 3]", "-3.5"]


def reward_seconds(n: int = 200) -> float:
    """CPU seconds per completion of klsweep's MATH reward (``tasks.math_reward``: math-verify), over ``n``
    completions, half right, half wrong (some equal in value but not in form: math-verify's slow path)."""
    from klsweep import tasks

    completions, answers = [], []
    for i in range(n):
        k = i % len(_ANSWERS)
        boxed = _ANSWERS[k] if i % 2 else _WRONG[k]
        completions.append(f"Let us work it out step by step. ... So the answer is $\\boxed{{{boxed}}}$.")
        answers.append(_ANSWERS[k])
    tasks.math_reward([""] * n, completions, answers)  # warm-up: imports, sympy's caches
    start = time.perf_counter()
    tasks.math_reward([""] * n, completions, answers)
    return (time.perf_counter() - start) / n


def write_gbps(folder: Path, nbytes: int) -> float:
    """GB/s (1e9 bytes) of writing ``nbytes`` as a checkpoint file (``torch.save`` of one tensor, flushed to
    the disk with fsync) under ``folder``; the file is removed."""
    import os

    import torch

    folder.mkdir(parents=True, exist_ok=True)
    tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
    path = folder / f".gpu_check_write_{os.getpid()}.pt"
    try:
        start = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(tensor, f)
            f.flush()
            os.fsync(f.fileno())
        return tensor.numel() * 4 / 1e9 / (time.perf_counter() - start)
    finally:
        path.unlink(missing_ok=True)


def mfu(flops: float, seconds: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: ``flops`` done in ``seconds`` over the GPU's peak."""
    return flops / seconds / (peak_tflops * 1e12)


def train_mfu(model_dir: Path, gpu: str, micro: int, seq: int, repeats: int = 3) -> float:
    """The MFU of the training forward/backward as klsweep trains on a GPU: fp32 weights, bf16 autocast,
    activation checkpointing; ``micro`` sequences of ``seq`` tokens, the median of ``repeats`` timed passes
    after a warm-up. FLOPs as ``klsweep.cost`` counts them (forward 2P + attention; backward twice; the
    recomputed forward)."""
    import torch
    from transformers import AutoModelForCausalLM

    from klsweep import cost, planner

    arch = planner.architecture({"path": str(model_dir)})
    assert arch is not None
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (micro, seq), device="cuda")
    times = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    flops = 8 * cost.forward_flops(arch, seq / 2) / 2 * micro * seq
    del model
    torch.cuda.empty_cache()
    return mfu(flops, statistics.median(times[1:]), cost.GPUS[gpu].tflops)


def calibrate(args: argparse.Namespace) -> dict[str, Any]:
    """The measured values of the time model's assumptions (None where this machine cannot measure one)."""
    import torch

    from klsweep.config import ClusterSection

    found: dict[str, Any] = {"mfu": None, "reward_s": reward_seconds(), "weight_sync_s": None}
    folder = args.write_dir or Path(tempfile.gettempdir())
    found["checkpoint_write_gbps"] = write_gbps(folder, int(args.write_gb * 1e9))
    found["write_dir"] = str(folder)
    gpu = gpu_name()
    if torch.cuda.is_available() and gpu:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = build_model(args.sizes[0], Path(tmp) / "m", "cuda")
            # the paper's micro-batch (8) of a 512-token prompt and its completion
            found["mfu"] = train_mfu(model_dir, gpu, micro=8, seq=512 + args.length)
    found["defaults"] = {"checkpoint_write_gbps": ClusterSection().checkpoint_write_gbps}
    return found


def calibration_lines(found: dict[str, Any]) -> list[str]:
    """What to put in ``klsweep.cost.LOW``/``HIGH`` and ``cluster.checkpoint_write_gbps``, one line each."""
    from klsweep import cost

    def band(name: str, spec: str) -> str:
        value = found.get(name)
        shown = "not measured here" if value is None else format(value, spec)
        low, high = getattr(cost.LOW, name, None), getattr(cost.HIGH, name, None)
        return f"{name:<22} {shown:>18}  (cost.LOW {low:g}, cost.HIGH {high:g})"

    rate = found.get("checkpoint_write_gbps")
    where = f" under {found['write_dir']}" if found.get("write_dir") else ""
    return [
        "calibration (klsweep/cost.py Assumptions; slurm/README.md, Time estimate):",
        band("mfu", ".3f") + ("" if found.get("mfu") is not None else ": a GPU of klsweep.cost.GPUS"),
        band("reward_s", ".4f"),
        band("weight_sync_s", ".2f") + ": needs vLLM (not carried)",
        f"{'checkpoint_write_gbps':<22} {'-' if rate is None else format(rate, '.2f'):>18}  (cluster default "
        f"{found['defaults']['checkpoint_write_gbps']:g}){where}",
        "Set cost.LOW/HIGH so the measured mfu and reward_s lie inside them, and cluster.checkpoint_write_gbps "
        "below the write rate of the results folder's file system (one node, all its processes writing).",
    ]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=lambda s: s.split(","), default=["0.5b", "1.5b", "3b"])
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--length", type=int, default=256, help="max completion length")
    parser.add_argument("--beta", type=float, default=0.05)
    parser.add_argument("--lr", type=float, default=1e-6, help="the paper's learning rate")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip sizes that would end past this")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument(
        "--calibrate", action="store_true", help="measure the time model's assumptions instead"
    )
    parser.add_argument("--write-dir", type=Path, default=None, help="--calibrate: where to time a write")
    parser.add_argument("--write-gb", type=float, default=2.0, help="--calibrate: GB to write")
    parser.add_argument(
        "--vllm", action="store_true", help="generate with TRL's colocate vLLM (train.use_vllm)"
    )
    args = parser.parse_args(argv)
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {', '.join(unknown)}; allowed: {', '.join(SIZES)}")
    import importlib.util

    if args.vllm and importlib.util.find_spec("vllm") is None:
        parser.error("--vllm: vllm cannot be imported here (KLSWEEP_GPU=1 ./dev.sh setup installs it)")
    warnings.filterwarnings("ignore")
    import datasets
    from transformers.utils import logging

    logging.set_verbosity_error()
    datasets.disable_progress_bars()
    if args.calibrate:
        found = calibrate(args)
        print("\n".join(calibration_lines(found)))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"calibration": found}, indent=1))
        print(f"written: {args.out}")
        return [found]
    print(HEADER, flush=True)
    rows = check(args)
    import torch

    meta = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "generation": "vllm colocate" if args.vllm else "hf",
        "torch": torch.__version__,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "targets": {"step_ratio": TARGETS, "peak_over_estimate": MEMORY_BAND},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**meta, "rows": rows}, indent=1))
    print(CALIBRATE)
    print(f"written: {args.out}")
    return rows


if __name__ == "__main__":
    main()
