"""A rehearsed run's config: ``rehearsal_config``, the run small (the tiny model, the samples, a few steps, one
process), with what each stage runs with and what that stands in for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from klsweep.rehearse.standins import SAMPLES, TINY, TRAIN_SAMPLES

# the sharding CPU-only processes run: one process, no sharding
ONE_PROCESS = "none"
# options of TRL's colocate vLLM its CPU build does not have (sleep mode frees GPU memory; one engine a process)
GPU_ONLY_VLLM = ("vllm_enable_sleep_mode", "vllm_tensor_parallel_size")


def rehearsal_config(
    config: dict[str, Any], model_dir: Path, tasks_dir: Path | None, gpus: int
) -> tuple[dict[str, Any], list[str], dict[str, tuple[str, str, str]]]:
    """The run's config, small: the tiny model, the samples, a few steps (the lag exercised), one process;
    generation and eval through vLLM where the grid asks for it and it is installed here (its CPU build
    without a GPU), else HF. Also the notes and what each stage runs with (``RunRehearsal.ran_with``)."""
    from klsweep import engines

    notes = []
    lag = int(config.get("offpolicy", {}).get("lag", 0))
    steps = max(2, lag + 2)
    vllm = engines.vllm_build()
    wants_vllm = bool(config["train"].get("use_vllm"))
    train = {**config["train"], "steps": steps, "save_steps": max(1, steps // 2), "keep_checkpoints": None,
             "prompts_per_step": 2, "micro_batch_size": None, "max_completion_length": 16,
             "use_vllm": wants_vllm and vllm is not None}  # fmt: skip
    gen = "HF generate"
    if train["use_vllm"]:
        gen = f"{vllm} colocate"
        if not gpus:
            trl = dict(train.get("trl") or {})
            for option in GPU_ONLY_VLLM:
                if option in trl:
                    notes.append(f"{option} not exercised: not in vLLM's CPU build")
                    del trl[option]
            train["trl"] = trl
    elif wants_vllm:
        notes.append("HF generate in place of vLLM: vllm does not import here")
    sharding = train.get("sharding", "none")
    if sharding != ONE_PROCESS:
        notes.append(f"sharding {sharding} not exercised: one process" + ("" if gpus else ", no GPU here"))
        train["sharding"] = ONE_PROCESS
    shard_note = ONE_PROCESS if sharding == ONE_PROCESS else f"{ONE_PROCESS} (for {sharding})"
    # every part the stage swapped for a stand-in, named (the stage table's "in place of")
    asked = int(config["model"]["resources"].get("gpus_per_node", 0))
    real_model = config["model"]["path"] != "tiny"  # the project's tiny model is rehearsed as itself
    common = [f"a tiny random model for {config['model']['path']}"] if real_model else []
    if asked > min(gpus, 1):
        common.append(f"{'1 GPU' if gpus else 'the CPU'} for {asked} GPU(s)")
    task = dict(config["task"])
    swapped = list(common)
    if task.get("name") == "math":
        dataset = task.get("dataset") or "DigitalLearningGmbH/MATH-lighteval"
        if dataset in TRAIN_SAMPLES:
            task["dataset"] = str(SAMPLES / TRAIN_SAMPLES[dataset])
            swapped.append(f"shipped samples for {dataset}")
    swapped.append(f"{steps} steps for {config['train'].get('steps')}")
    if wants_vllm and not train["use_vllm"]:
        swapped.append("HF generate for vLLM (not installed)")
    ran_with = {stage: (gen, shard_note, "; ".join(swapped)) for stage in ("train", "resume")}
    resources = {
        **config["model"]["resources"],
        "gpus_per_node": min(gpus, 1),
        "tasks_per_node": 1,
        "nodes": 1,
    }
    model = {**config["model"], "path": str(model_dir), "revision": None, "resources": resources}
    if not gpus:
        model["dtype"] = "auto"
    ev = dict(config.get("eval", {}))
    if tasks_dir is not None:
        wants = ev.get("backend", "hf")
        backend = "vllm" if wants == "vllm" and vllm is not None else "hf"
        if wants == "vllm" and backend == "hf":
            notes.append("lm-eval hf in place of vllm: vllm does not import here")
        longest = TINY["max_position_embeddings"]
        if (ev.get("max_model_len") or longest) > longest:
            notes.append(f"eval.max_model_len {ev['max_model_len']} cut to the stand-in's {longest}")
            ev["max_model_len"] = longest
        limit = ev.get("limit")
        ev.update(include_path=str(tasks_dir), limit=4, max_gen_toks=16, num_samples=1, backend=backend,
                  batch_size=8, tensor_parallel_size=1)  # fmt: skip
        engine = f"lm-eval vllm, {vllm}" if backend == "vllm" else "lm-eval hf"
        copies = engines.eval_copies(config)
        one = "one copy" if copies == 1 else f"one copy (for {copies})"
        swapped = [*common, f"4 shipped sample problems per task for {limit or 'all'}"]
        if wants != backend:
            swapped.append("lm-eval hf for vLLM (not installed)")
        ran_with["eval"] = (engine, one, "; ".join(swapped))
    out = {**config, "model": model, "train": train, "task": task, "eval": ev,
           "wandb": {**config.get("wandb", {}), "mode": "disabled"}}  # fmt: skip
    return out, notes, ran_with
