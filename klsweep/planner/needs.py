"""What one run needs (``estimate``): peak GPU memory per device by part, host memory per node, checkpoint
storage, GPU-hours beside its limit, and the preemption signal's delay (the package docstring has the model)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from klsweep import cost
from klsweep.config import tasks_per_node
from klsweep.errors import UserError
from klsweep.planner.shape import Arch, BatchShape, architecture, batch_shape, processes

if TYPE_CHECKING:
    from collections.abc import Mapping

    from klsweep.grid import PlannedRun


GIB = 2**30


OVERHEAD_GB = 2.0  # per process: CUDA context, NCCL and cuBLAS workspaces


FRAGMENTATION = 0.10  # caching-allocator headroom on the estimated tensors


VLLM_SHARE = 0.3  # TRL's vllm_gpu_memory_utilization (colocate mode), the GPU fraction vLLM reserves


# fp32 weights (4) + AdamW moments (8); under FSDP the same, sharded (each rank writes 12/W of it), and the final
# checkpoint also the whole fp32 weights for eval (FINAL_BYTES_PER_PARAM; docs/DESIGN.md, FSDP2)
CHECKPOINT_BYTES_PER_PARAM = {"none": 12, "fsdp": 12}


FINAL_BYTES_PER_PARAM = {"none": 0, "fsdp": 4}


_LAG_BYTES_PER_TOKEN = 24  # a queued batch per token: ids, masks, behaviour and reference log-probs


AT_RISK = 0.10  # a peak within this fraction of the GPU's memory is flagged (slurm/README.md)


HOST_PROCESS_GB = 4.0  # host memory of a training process: Python, torch, CUDA/NCCL host buffers, data


VLLM_HOST_GB = 4.0  # and of its colocated vLLM engine (no weights: TRL's sleep mode discards them, level 2)


SIGNAL_MARGIN_S = 60  # after the preemption save: the requeue and the processes' exit


@dataclass
class Estimate:
    """What one run needs. ``parts``: GiB per component of the peak per device (``peak_gb`` is their total)."""

    peak_gb: float  # estimated peak memory of one process (of its GPU; of the host without GPUs)
    limit_gpu_hours: float  # every try of the training job and the eval job for their whole time limits
    storage_gb: float
    parts: dict[str, float] = field(default_factory=dict)
    gpus: int = 0  # per job
    gpu_memory_gb: float | None = None  # of one GPU (None without GPUs)
    cost: cost.RunCost | None = None  # the time estimate (None without GPUs)
    limit_hours: float = 0.0  # a training job's time limit
    tries: int = 1  # 1 + cluster.max_requeues
    eval_limit_gpu_hours: float = 0.0  # the eval job's GPUs for its whole time limit (0: no eval)
    cost_high: cost.RunCost | None = None  # the time estimate at the band's pessimistic end (``cost.HIGH``)
    host_parts: dict[str, float] = field(default_factory=dict)  # GiB per component of a process's host memory
    tasks_per_node: int = 1
    mem_gb: float = 0.0  # model.resources.mem_gb: a node's job's host memory
    save_seconds: float | None = None  # one checkpoint save at cluster.checkpoint_write_gbps (None: no GPUs)
    signal_delay_s: int = 60  # what Slurm is asked for: cluster.signal_delay_s, else derived
    derived_delay_s: int = 60  # the derived delay (``signal_delay``)
    delay_set: bool = False  # cluster.signal_delay_s set by the user

    @property
    def fits(self) -> bool:
        return self.gpu_memory_gb is None or self.peak_gb <= self.gpu_memory_gb

    @property
    def at_risk(self) -> bool:
        """Fits, but within ``AT_RISK`` of the GPU's memory."""
        return self.gpu_memory_gb is not None and self.peak_gb > (1 - AT_RISK) * self.gpu_memory_gb

    @property
    def gpu_hours(self) -> float:
        """The estimate at the band's low end (0 without GPUs)."""
        return self.cost.gpu_hours if self.cost else 0.0

    @property
    def gpu_hours_high(self) -> float:
        """The estimate at the band's high end (0 without GPUs)."""
        return self.cost_high.gpu_hours if self.cost_high else 0.0

    @property
    def host_gb(self) -> float:
        """The estimated host memory of a node: its processes' together."""
        return self.tasks_per_node * sum(self.host_parts.values())

    @property
    def host_fits(self) -> bool:
        return self.host_gb <= self.mem_gb

    def as_json(self) -> dict[str, Any]:
        """``plan --json``'s per-run estimate (``gpu_memory_gb``: the estimated peak per GPU; the time fields:
        null without GPUs; ``_low``/``_high``: the band's ends, ``jobs`` and ``exceeds_time_limit`` at its high
        end)."""
        lo, hi = self.cost, self.cost_high

        def band(name: str, value: Any, digits: int) -> dict[str, Any]:
            ends = (("low", lo), ("high", hi))
            return {
                f"{name}_{end}": None if (v := c and value(c)) is None else round(v, digits)
                for end, c in ends
            }

        return {
            "gpu_memory_gb": round(self.peak_gb, 1) if self.gpus else None,
            "memory_at_risk": self.at_risk,
            "host_memory_gb": round(self.host_gb, 1),
            "host_memory_of_gb": self.mem_gb,
            **band("step_seconds", lambda c: c.step.total, 1),
            "generation_seconds": round(lo.step.generation, 1) if lo else None,
            **band("train_hours", lambda c: c.train_hours, 2),
            "jobs": hi.jobs if hi else None,
            "exceeds_time_limit": hi.exceeds_limit if hi else False,
            **band("eval_gpu_hours", lambda c: None if c.eval_seconds is None else c.eval_gpu_hours, 2),
            "gpu_hours_low": round(self.gpu_hours, 2),
            "gpu_hours_high": round(self.gpu_hours_high, 2),
            "storage_gb": round(self.storage_gb, 1),
            "checkpoint_save_seconds": None if self.save_seconds is None else round(self.save_seconds, 1),
            "signal_delay_s": self.signal_delay_s,
            "signal_delay_derived_s": self.derived_delay_s,
            "signal_delay_set": self.delay_set,
        }

    def limit_json(self) -> dict[str, Any]:
        """``plan --json``'s per-run limits: a training job's hours, the tries (1 + ``cluster.max_requeues``),
        the eval job's GPU-hours, all GPU-hours at the limits."""
        return {
            "hours": round(self.limit_hours, 2),
            "tries": self.tries,
            "eval_gpu_hours": round(self.eval_limit_gpu_hours, 2),
            "gpu_hours": round(self.limit_gpu_hours, 2),
        }


def vllm_share(config: Mapping[str, Any]) -> float | None:
    """The bytes of a GPU that TRL's colocate vLLM takes (``train.trl.vllm_gpu_memory_utilization``, TRL's
    default ``VLLM_SHARE``); None without it."""
    train, res = config["train"], config["model"]["resources"]
    if not (train.get("use_vllm") and int(res.get("gpus_per_node", 0))):
        return None
    fraction = float((train.get("trl") or {}).get("vllm_gpu_memory_utilization", VLLM_SHARE))
    return fraction * float(res.get("gpu_memory_gb", 0)) * GIB


def memory_parts(config: Mapping[str, Any], arch: Arch, shape: BatchShape) -> dict[str, float]:
    """GiB per component of a process's peak memory (see the module docstring)."""
    train, model = config["train"], config["model"]
    res = model["resources"]
    gpus = int(res.get("gpus_per_node", 0))
    p, w = arch.params, shape.processes
    fsdp = train.get("sharding", "none") == "fsdp"
    shards = w if fsdp else 1
    compute = 4 if model.get("dtype") == "float32" or not gpus else 2  # bytes; CPU runs compute in fp32
    h, layers = arch.hidden_size, arch.num_hidden_layers
    unit = max(arch.layer_params, arch.embedding_params)
    parts = {
        "weights": 4 * p / shards,
        "gradients": 4 * p / shards,
        "optimizer": 8 * p / shards,
        "compute copy": (2 * unit * compute + 4 * unit) if fsdp else (2 * p if compute == 2 else 0),
        "reference": compute * p / shards,
    }
    if fsdp:  # TRL's prepare_fsdp wraps the reference as one unit: its forward gathers every weight at once
        parts["reference gather"] = compute * p * (1 - 1 / shards)
    if not fsdp and w > 1:
        parts["ddp buckets"] = 4 * p
    seq = int(train["max_prompt_length"]) + int(train["max_completion_length"])
    tokens = shape.per_device * seq
    # one layer's saved activations per token (bytes): fp32 residual stream and norms, then q/k/v (and their
    # rotary outputs), attention output, the four SwiGLU tensors in the compute dtype
    per_layer = 16 * h + compute * (2 * h + 3 * arch.q_dim + 4 * arch.kv_dim + 4 * arch.intermediate_size)
    # on GPUs activation checkpointing keeps every layer's input and recomputes one layer; on a CPU, every layer
    training = tokens * (layers * 4 * h + per_layer) if gpus else tokens * layers * per_layer
    training += tokens * 64  # per-token log-probs, advantages, masks of the loss
    share = vllm_share(config)
    if share is not None:
        generation = 0.0
        parts["vllm"] = share
    else:
        generation = 2 * layers * arch.kv_dim * compute * shape.per_process * seq
        generation += shape.per_process * arch.vocab_size * 4  # the last position's logits
    if share is not None and (train.get("trl") or {}).get("vllm_enable_sleep_mode"):  # freed while training
        if training <= parts["vllm"]:
            training = 0.0
        else:
            parts["vllm"] = 0.0
    parts["activations" if training >= generation else "kv cache"] = max(training, generation)
    lag = int(config.get("offpolicy", {}).get("lag", 0))
    if lag:
        parts["lag queue"] = lag * shape.per_process * seq * _LAG_BYTES_PER_TOKEN
    vllm = parts.pop("vllm", 0.0)
    parts["allocator"] = FRAGMENTATION * sum(parts.values())
    parts["overhead"] = OVERHEAD_GB * GIB
    if vllm:
        parts["vllm"] = vllm
    return {k: v / GIB for k, v in parts.items()}


def host_parts(config: Mapping[str, Any], arch: Arch, parts: Mapping[str, float]) -> dict[str, float]:
    """GiB per component of one training process's host memory (the module docstring); ``parts``: its
    ``memory_parts`` (without GPUs, all of them are on the host)."""
    train, model = config["train"], config["model"]
    if not int(model["resources"].get("gpus_per_node", 0)):
        return dict(parts)
    compute = 4 if model.get("dtype") == "float32" else 2
    fsdp = train.get("sharding", "none") == "fsdp"
    out = {"policy": (4 if fsdp else compute) * arch.params / GIB, "process": HOST_PROCESS_GB}
    if train.get("use_vllm"):
        out["vllm"] = VLLM_HOST_GB
    return out


def checkpoint_bytes(config: Mapping[str, Any], arch: Arch) -> float:
    """The bytes of one checkpoint of a run (all its processes' files together)."""
    return CHECKPOINT_BYTES_PER_PARAM[config["train"].get("sharding", "none")] * arch.params


def default_signal_delay(resources: Mapping[str, Any]) -> int:
    """The delay without an estimate (no GPUs): a minute, half that for a job of 5 minutes or less."""
    return 60 if int(resources.get("timeout_min", 60)) > 5 else 30


def signal_delay(config: Mapping[str, Any], high: cost.RunCost | None) -> tuple[int, int]:
    """(the delay Slurm is asked for, the derived one): ``cluster.signal_delay_s`` when set, else derived
    from ``high``: the step in progress at the band's high end, one save, ``SIGNAL_MARGIN_S``
    (``default_signal_delay`` without an estimate)."""
    if high is None:
        derived = default_signal_delay(config["model"]["resources"])
    else:
        step = high.step.total - high.step.checkpoint
        derived = math.ceil(step + high.save_seconds + SIGNAL_MARGIN_S)
    derived = min(derived, 65535)  # Slurm's bound
    chosen = config.get("cluster", {}).get("signal_delay_s")
    return (derived if chosen is None else int(chosen)), derived


def job_signal_delay(config: Mapping[str, Any]) -> int:
    """The ``signal_delay_s`` a training job of the run ``config`` asks Slurm for (``signal_delay``)."""
    arch = architecture(config["model"])
    try:
        shape = batch_shape(config["train"], processes(config))
    except UserError:  # refused by the plan before any submission
        shape = None
    if arch is None or shape is None:
        return signal_delay(config, None)[0]
    return estimate(config, arch, shape).signal_delay_s


def estimate(config: Mapping[str, Any], arch: Arch, shape: BatchShape) -> Estimate:
    """The estimate of one run (its config, architecture and batch shape)."""
    res, train = config["model"]["resources"], config["train"]
    gpus = int(res.get("gpus_per_node", 0)) * int(res.get("nodes", 1))
    parts = memory_parts(config, arch, shape)
    saves = math.ceil(int(train["steps"]) / int(train["save_steps"]))
    keep = train.get("keep_checkpoints")
    kept = saves if keep is None else min(int(keep), saves)
    sharding = train.get("sharding", "none")
    # vLLM's KV cache: its share of the GPU less its bf16 copy of the weights
    share = vllm_share(config)
    kv_room = share - cost.COMPUTE_BYTES * arch.params if share is not None else None
    train_limit, eval_limit = _limit_gpu_hours(config)
    rate = float(config.get("cluster", {}).get("checkpoint_write_gbps", 0.5))
    save_s = cost.save_seconds(checkpoint_bytes(config, arch), rate)
    low = cost.run_cost(config, arch, shape, kv_room, cost.LOW, save_s)
    high = cost.run_cost(config, arch, shape, kv_room, cost.HIGH, save_s)
    delay, derived = signal_delay(config, high)
    return Estimate(
        peak_gb=sum(parts.values()),
        limit_gpu_hours=train_limit + eval_limit,
        storage_gb=(kept * checkpoint_bytes(config, arch) + FINAL_BYTES_PER_PARAM[sharding] * arch.params)
        / GIB,
        parts=parts,
        gpus=gpus,
        gpu_memory_gb=float(res["gpu_memory_gb"]) if gpus else None,
        cost=low,
        limit_hours=int(res["timeout_min"]) / 60,
        tries=_tries(config),
        eval_limit_gpu_hours=eval_limit,
        cost_high=high,
        host_parts=host_parts(config, arch, parts),
        tasks_per_node=tasks_per_node(res),
        mem_gb=float(res.get("mem_gb", 4)),
        save_seconds=save_s if high else None,
        signal_delay_s=delay,
        derived_delay_s=derived,
        delay_set=config.get("cluster", {}).get("signal_delay_s") is not None,
    )


def _tries(config: Mapping[str, Any]) -> int:
    """The jobs a run's training may use: 1 + ``cluster.max_requeues``."""
    return 1 + int(config.get("cluster", {}).get("max_requeues", 0))


def _limit_gpu_hours(config: Mapping[str, Any]) -> tuple[float, float]:
    """GPU-hours of a run at its limits: every try of its training job for its whole time limit; its eval
    job's (the node's GPUs; 0 without eval)."""
    res = config["model"]["resources"]
    evals = config.get("eval", {}).get("suite", "none") != "none"
    per_node = int(res.get("gpus_per_node", 0))
    train = per_node * int(res.get("nodes", 1)) * int(res["timeout_min"]) / 60 * _tries(config)
    return train, per_node * int(res.get("eval_timeout_min", 60)) / 60 if evals else 0.0


def gpu_hours(runs: list[PlannedRun]) -> float:
    """Upper bound of the GPU-hours of ``runs``: every try of every job using its whole time limit."""
    return sum(sum(_limit_gpu_hours(run.config)) for run in runs)
