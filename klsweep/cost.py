"""How long a run's step takes and what a run costs in GPU-hours: a first-principles model, not a measurement,
given as a band: each figure at the optimistic end (``LOW``) and the pessimistic one (``HIGH``).

A step is generation (prefill, then one decode step per completion token: the slowest of the GPU's memory
reads, its FLOPs, FSDP's parameter all-gathers over NVLink and HF's kernel launches), the weight sync into vLLM,
the reward (math-verify on the CPU), then training FLOPs at a stated utilisation (``Assumptions.mfu``), and its
share of the periodic checkpoint saves (bytes over ``cluster.checkpoint_write_gbps``). The GPU's figures
(``GPUS``: data-sheet bf16 TFLOP/s, HBM and NVLink bandwidth) are those of ``model.resources.gpu``. The
derivation, the constants and their sources: slurm/README.md ("Time estimate"); ``bench/gpu_check.py``
measures step parts on a GPU to calibrate them. ``klsweep.planner`` calls it for every run of a plan; it reads
plain numbers (an architecture, a batch shape) and imports nothing of klsweep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass(frozen=True)
class GPU:
    """Data-sheet figures of one SXM GPU (dense bf16, no sparsity)."""

    tflops: float  # bf16 dense tensor-core TFLOP/s
    hbm_tb_s: float  # HBM bandwidth, TB/s
    nvlink_gb_s: float  # NVLink bandwidth, GB/s, both directions together (the data sheet's figure)
    memory_gb: float


GPUS = {
    "a100-80gb": GPU(tflops=312, hbm_tb_s=2.039, nvlink_gb_s=600, memory_gb=80),  # A100 80GB SXM
    "h100-80gb": GPU(tflops=989, hbm_tb_s=3.35, nvlink_gb_s=900, memory_gb=80),  # H100 SXM5
    "h200": GPU(tflops=989, hbm_tb_s=4.8, nvlink_gb_s=900, memory_gb=141),  # H200 SXM
}


@dataclass(frozen=True)
class Assumptions:
    """What the model cannot derive from data sheets: one end of the band (slurm/README.md, "Time estimate")."""

    mfu: float  # model FLOPs utilisation of training and prefill (HF + FSDP2 + activation checkpointing)
    weight_sync_s: float  # vLLM colocate: a step's weight sync takes at least this (per-tensor gather + load,
    # wake/sleep), whatever the bandwidths give
    reward_s: float  # seconds of CPU to score one completion (math-verify; the tiny task: 0)


LOW = Assumptions(mfu=0.30, weight_sync_s=1.0, reward_s=0.01)  # the optimistic end of the band
HIGH = Assumptions(mfu=0.20, weight_sync_s=5.0, reward_s=0.10)  # the pessimistic end
HBM_EFFICIENCY = 0.80  # fraction of the HBM bandwidth a decode step's reads reach
NVLINK_EFFICIENCY = 0.80  # NCCL all-gather bus bandwidth over one direction's NVLink bandwidth (nccl-tests)
HF_LAUNCH_S_PER_LAYER = 0.4e-3  # HF generate (eager PyTorch): CPU time to launch a decoder layer's kernels
PCIE_GB_S = 25.0  # host <-> GPU copies (vLLM's sleep mode offloads and reloads the weights each step)
JOB_STARTUP_S = 300.0  # a training job: imports, model load, FSDP wrapping, resuming a checkpoint
EVAL_STARTUP_S = 180.0  # an eval job: model load, vLLM's memory profiling and CUDA-graph capture
COMPUTE_BYTES = 2  # bf16 weights and KV cache while generating
# questions of the eval tasks klsweep ships for GPUs (their test splits); other tasks: no eval estimate
EVAL_QUESTIONS = {
    "klsweep_math500": 500,
    "klsweep_mmlu_college_physics": 102,
    "klsweep_mmlu_college_chemistry": 100,
    "klsweep_mmlu_college_biology": 144,
}


class Arch(Protocol):  # klsweep.planner.Arch
    @property
    def params(self) -> int: ...
    @property
    def q_dim(self) -> int: ...
    @property
    def kv_dim(self) -> int: ...

    num_hidden_layers: int


class Shape(Protocol):  # klsweep.planner.BatchShape
    processes: int
    per_device: int

    @property
    def per_process(self) -> int: ...


# ---------------------------------------------------------------------------------------------- building blocks


def forward_flops(arch: Arch, context: float) -> float:
    """FLOPs of one token's forward: 2 per parameter, plus causal attention over ``context`` earlier tokens
    (scores and weighted sum: 2 x 2 x layers x q_dim x context)."""
    return 2 * arch.params + 4 * arch.num_hidden_layers * arch.q_dim * context


def kv_bytes_per_token(arch: Arch) -> float:
    """Bytes of one token's KV cache: keys and values of every layer, bf16."""
    return 2 * arch.num_hidden_layers * arch.kv_dim * COMPUTE_BYTES


def link_bytes_per_s(gpu: GPU) -> float:
    """What one GPU receives per second in an all-gather: one direction of NVLink at NCCL's efficiency."""
    return gpu.nvlink_gb_s / 2 * 1e9 * NVLINK_EFFICIENCY


def gather_s(gpu: GPU, nbytes: float, world: int) -> float:
    """An all-gather of a tensor of ``nbytes`` over ``world`` GPUs: each receives (world - 1) / world of it."""
    return nbytes * (world - 1) / world / link_bytes_per_s(gpu) if world > 1 else 0.0


def compute_s(gpu: GPU, flops: float, at: Assumptions = LOW) -> float:
    return flops / (gpu.tflops * 1e12 * at.mfu)


def decode_step_s(
    gpu: GPU,
    read_bytes: float,
    flops: float,
    gathered_bytes: float = 0.0,
    launch_s: float = 0.0,
    at: Assumptions = LOW,
) -> float:
    """One decode step (one new token for every sequence of the batch): the slowest of reading ``read_bytes``
    (weights and KV cache) from HBM, ``flops``, receiving ``gathered_bytes`` of an all-gather, and launching
    the kernels, which overlap (FSDP prefetches the next layer's gather; launches are asynchronous)."""
    hbm = read_bytes / (gpu.hbm_tb_s * 1e12 * HBM_EFFICIENCY)
    comm = gathered_bytes / link_bytes_per_s(gpu)
    return max(hbm, compute_s(gpu, flops, at), comm, launch_s)


# ---------------------------------------------------------------------------------------------- one step


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimiser step of one process (all processes take the same time), by phase."""

    prefill: float
    decode: float
    weight_sync: float  # vLLM colocate: the trained weights loaded into vLLM (and woken from sleep)
    train: float  # policy forward/backward, reference and behaviour forwards
    reward: float = 0.0  # scoring the process's completions on the CPU
    checkpoint: float = 0.0  # a save's seconds over the steps between two saves

    @property
    def generation(self) -> float:
        return self.prefill + self.decode + self.weight_sync

    @property
    def total(self) -> float:
        return self.generation + self.reward + self.train + self.checkpoint


def uses_behaviour_forward(config: Mapping[str, Any]) -> bool:
    """Whether a step runs a forward of the policy for the behaviour log-probs: a KL in the reward (klsweep's
    trainer), a lag, several updates per batch, or vLLM (TRL's importance-sampling correction)."""
    train, kl, off = config["train"], config.get("kl", {}), config.get("offpolicy", {})
    in_reward = float(kl.get("beta", 0)) > 0 and kl.get("placement") in ("reward", "both")
    return bool(
        in_reward
        or int(off.get("lag", 0)) > 0
        or int(off.get("num_iterations", 1)) > 1
        or train.get("use_vllm")
    )


def save_seconds(checkpoint_bytes: float, write_gbps: float) -> float:
    """Seconds to write a checkpoint of ``checkpoint_bytes`` at ``write_gbps`` GB/s (all the job's processes
    together: ``cluster.checkpoint_write_gbps``)."""
    return checkpoint_bytes / (write_gbps * 1e9)


def step_time(
    config: Mapping[str, Any],
    arch: Arch,
    shape: Shape,
    gpu: GPU,
    kv_room: float | None = None,
    at: Assumptions = LOW,
    save_s: float = 0.0,
) -> StepTime:
    """One step of a run on ``gpu`` under the assumptions ``at`` (the module docstring; slurm/README.md, "Time
    estimate"). Every completion is taken to run to ``max_completion_length`` (a batch decodes until its
    longest ends) and every prompt to be ``max_prompt_length`` long: an estimate from above for the sequence
    lengths. ``kv_room``: the bytes of KV cache vLLM's share of the GPU holds (colocate); a batch whose cache
    is larger decodes in waves. ``save_s``: one checkpoint save's seconds (``save_seconds``), spread over the
    ``train.save_steps`` steps between saves."""
    train = config["train"]
    p, w, layers = arch.params, shape.processes, arch.num_hidden_layers
    fsdp = train.get("sharding", "none") == "fsdp" and w > 1
    vllm = bool(train.get("use_vllm"))
    prompt, completion = int(train["max_prompt_length"]), int(train["max_completion_length"])
    batch = shape.per_process  # completions one process generates a step
    weights = COMPUTE_BYTES * p
    context = prompt + completion / 2  # the mean context of a decode step

    def step(n: float, gathered: float = 0.0, launch: float = 0.0) -> float:  # n sequences decoding
        read = weights + n * context * kv_bytes_per_token(arch)
        return decode_step_s(gpu, read, n * forward_flops(arch, context), gathered, launch, at)

    if vllm:  # its own copy of the weights, CUDA graphs: no gathers, no launch overhead
        need = batch * (prompt + completion) * kv_bytes_per_token(arch)
        waves = math.ceil(need / kv_room) if kv_room and kv_room > 0 else 1
        decode = waves * completion * step(math.ceil(batch / waves))
        sync = gather_s(gpu, 4 * p, w) if fsdp else 0.0  # TRL gathers the fp32 master weights into vLLM
        sync += weights / (gpu.hbm_tb_s * 1e12 * HBM_EFFICIENCY)
        if (train.get("trl") or {}).get("vllm_enable_sleep_mode"):
            sync += weights / (PCIE_GB_S * 1e9)  # woken: the weights back from host memory
        sync = max(sync, at.weight_sync_s)  # tensor by tensor, wake/sleep: seconds whatever the bandwidths
        gathered = 0.0
    else:  # HF generate; under FSDP every decode step gathers the whole model (reshard_after_forward)
        gathered = weights * (w - 1) / w if fsdp else 0.0
        launch = layers * HF_LAUNCH_S_PER_LAYER
        decode = completion * step(batch, gathered, launch)
        sync = 0.0
    prefill_flops = batch * prompt * forward_flops(arch, prompt / 2)
    prefill = max(compute_s(gpu, prefill_flops, at), gathered / link_bytes_per_s(gpu))
    # training: fwd + bwd of the policy (6 FLOPs a parameter a token), the recomputed forward of activation
    # checkpointing (2, on GPUs), the reference forward (2: always, klsweep.trainer) and the behaviour forward
    tokens = batch * (prompt + completion)
    per_token = forward_flops(arch, (prompt + completion) / 2) / 2  # FLOPs of one forward, per 2 FLOPs
    factor = 6 + 2 + 2 + (2 if uses_behaviour_forward(config) else 0)
    work = compute_s(gpu, factor * per_token * tokens, at)
    if fsdp:  # per micro-batch: the policy's forward and backward gathers, its gradients' reduce-scatter
        # (same volume), the reference's (and behaviour) forward gathers; overlapped with the compute
        passes = 3 + 1 + (1 if uses_behaviour_forward(config) else 0)
        work = max(work, batch // shape.per_device * passes * gather_s(gpu, weights, w))
    # the reward: each process scores its own completions, one after the other (TRL), on the CPU
    reward = batch * at.reward_s if config.get("task", {}).get("name") == "math" else 0.0
    checkpoint = save_s / max(1, int(train.get("save_steps") or 1))
    return StepTime(
        prefill=prefill, decode=decode, weight_sync=sync, train=work, reward=reward, checkpoint=checkpoint
    )


# ---------------------------------------------------------------------------------------------- eval


def eval_seconds(config: Mapping[str, Any], arch: Arch, gpu: GPU, at: Assumptions = LOW) -> float | None:
    """An eval job's seconds: startup, then generating every answer of the suite (``max_gen_toks`` tokens
    each, greedy or ``num_samples``) with vLLM (one engine per ``tensor_parallel_size`` GPUs, continuous
    batching) or HF (one GPU, batches of ``batch_size``), prompts of ``train.max_prompt_length`` tokens. None
    when the suite has a task of unknown size."""
    ev = config.get("eval", {})
    tasks = [*ev.get("in_domain", []), *ev.get("ood", [])]
    if ev.get("suite", "none") == "none" or not tasks or any(t not in EVAL_QUESTIONS for t in tasks):
        return None
    answers = sum(EVAL_QUESTIONS[t] for t in tasks) * int(ev.get("num_samples", 1))
    if ev.get("limit"):
        answers = min(answers, int(ev["limit"]) * len(tasks) * int(ev.get("num_samples", 1)))
    tokens, prompt = int(ev.get("max_gen_toks", 256)), int(config["train"]["max_prompt_length"])
    weights = COMPUTE_BYTES * arch.params
    gpus = max(1, int(config["model"]["resources"].get("gpus_per_node", 1)))
    if ev.get("backend", "hf") == "vllm":
        tp = max(1, int(ev.get("tensor_parallel_size", 1)))
        batches, batch, launch, shard = 1, math.ceil(answers / max(1, gpus // tp)), 0.0, tp
    else:
        size = int(ev.get("batch_size") or 16)
        batches, batch, shard = math.ceil(answers / size), size, 1
        launch = arch.num_hidden_layers * HF_LAUNCH_S_PER_LAYER
    context = prompt + tokens / 2
    read = (weights + batch * context * kv_bytes_per_token(arch)) / shard
    step = decode_step_s(gpu, read, batch * forward_flops(arch, context) / shard, launch_s=launch, at=at)
    prefill = compute_s(gpu, batch * prompt * forward_flops(arch, prompt / 2) / shard, at)
    return EVAL_STARTUP_S + batches * (prefill + tokens * step)


# ---------------------------------------------------------------------------------------------- a run


@dataclass(frozen=True)
class RunCost:
    """A run's estimated time and GPU-hours, and the jobs its training needs under its time limit."""

    gpu: str  # model.resources.gpu
    step: StepTime
    steps: int
    gpus: int  # of the training job
    limit_hours: float  # a training job's time limit
    tries: int  # 1 + cluster.max_requeues: jobs a run may use
    eval_seconds: float | None  # the estimate of its eval job (None: no eval, or a task of unknown size)
    eval_gpus: int
    save_seconds: float = 0.0  # one checkpoint save (its share of each step is in ``step.checkpoint``)

    @property
    def train_hours(self) -> float:
        """Wall-clock hours of training, each job's startup included."""
        return (self.steps * self.step.total + self.jobs * JOB_STARTUP_S) / 3600

    @property
    def jobs(self) -> int:
        """Jobs the training needs: one, and one more each time the time limit is reached (a requeue)."""
        per_job = self.limit_hours * 3600 - JOB_STARTUP_S
        return max(1, math.ceil(self.steps * self.step.total / per_job)) if per_job > 0 else self.tries + 1

    @property
    def exceeds_limit(self) -> bool:
        return self.jobs > 1

    @property
    def eval_gpu_hours(self) -> float:
        return (self.eval_seconds or 0.0) / 3600 * self.eval_gpus

    @property
    def gpu_hours(self) -> float:
        """The estimate: training (steps x step time x GPUs, startups included) plus eval."""
        return self.train_hours * self.gpus + self.eval_gpu_hours


def run_cost(
    config: Mapping[str, Any],
    arch: Arch,
    shape: Shape,
    kv_room: float | None = None,
    at: Assumptions = LOW,
    save_s: float = 0.0,
) -> RunCost | None:
    """The cost of a GPU run under the assumptions ``at`` (None without GPUs, or on a GPU not in ``GPUS``: the
    grid refuses it); ``kv_room``, ``save_s``: ``step_time``'s."""
    res = config["model"]["resources"]
    gpu = GPUS.get(str(res.get("gpu")))
    per_node = int(res.get("gpus_per_node", 0))
    if not per_node or gpu is None:
        return None
    return RunCost(
        gpu=str(res["gpu"]),
        step=step_time(config, arch, shape, gpu, kv_room, at, save_s),
        steps=int(config["train"]["steps"]),
        gpus=per_node * int(res.get("nodes", 1)),
        limit_hours=int(res["timeout_min"]) / 60,
        tries=1 + int(config.get("cluster", {}).get("max_requeues", 0)),
        eval_seconds=eval_seconds(config, arch, gpu, at),
        eval_gpus=per_node,
        save_seconds=save_s,
    )
