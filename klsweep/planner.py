"""What a ``Plan``'s runs need and whether they can run: the launch shape of each run (processes, batch split),
its peak GPU memory per device, GPU-hours and checkpoint storage, and the sweep's totals. ``check`` refuses,
with every problem located, the runs that cannot start or cannot fit (``klsweep plan`` and ``klsweep run``);
``batch_shape`` is also how ``klsweep.job`` maps a run's batch onto TRL. It reads a plan made by
``klsweep.grid``; it never builds or changes one, and it submits nothing.

Launch topology. A training job starts ``nodes x tasks_per_node`` processes (``config.tasks_per_node``: one per
GPU unless set), each on one GPU: data parallel (DDP, ``train.sharding: none``) or sharded (FSDP, ``fsdp``). No
mode here drives several GPUs from one process, so on a GPU job ``tasks_per_node`` must equal ``gpus_per_node``.

Batch. A step trains on ``prompts_per_step x group_size`` completions, split evenly over the processes, each
process's share in micro-batches of ``train.micro_batch_size`` (gradients accumulated). TRL's GRPOConfig then
gets ``per_device_train_batch_size`` = the micro-batch and ``gradient_accumulation_steps`` = micro-batches per
process; its own rules (``GRPOConfig.__post_init__``: ``steps_per_generation`` defaults to the accumulation
steps, ``generation_batch_size = per_device x processes x steps_per_generation`` must be a multiple of
``num_generations``, which must be >= 2) then hold by construction: the generation batch is the step's
completions, a multiple of ``group_size`` (>= 2 by the grid's checks). A group may span two processes (TRL
gathers the rewards before normalising), so a process's share need not hold whole groups.

Memory per device (GiB, 2**30 bytes; a formula, not a measurement: see ``slurm/README.md`` for where it is
approximate). P parameters, W processes, S = W under FSDP else 1; mixed precision keeps fp32 master weights,
fp32 gradients and fp32 AdamW moments and computes in bf16 (``model.dtype: float32``: fp32 compute):

- model states: weights 4P/S, gradients 4P/S, AdamW moments 8P/S, and the compute copy: under DDP the bf16 cast
  of every weight (2P, held through the forward by autocast), under FSDP the gathered units (two layers' bf16
  weights, prefetch included, and one layer's unsharded gradient); DDP with W > 1 adds its gradient buckets
  (4P). Unsharded that is the published 16-18 bytes per parameter of mixed-precision Adam (ZeRO paper: 16;
  Hugging Face's model memory anatomy: 18 with the fp16/bf16 copy); FSDP is ZeRO-3 (16P/W).
- the reference model (frozen, compute dtype): 2P/S, and under FSDP the whole of it again while its forward
  runs (TRL's ``prepare_fsdp`` wraps it as one unit, so its forward gathers every weight);
- working memory, the larger of training and generation: training holds, per micro-batch of m sequences of
  S_len = max_prompt_length + max_completion_length tokens, the checkpointed input of every layer (fp32 residual
  stream) and one layer's recomputed activations (SwiGLU MLP, attention with a fused kernel: no S_len**2 term;
  without GPUs there is no activation checkpointing and every layer's activations are held); the fused LM head
  never holds whole logits. HF generation holds the KV cache of the process's whole generation batch. With vLLM
  (TRL's colocate mode) generation lives in vLLM's share of the GPU instead (``train.trl.
  vllm_gpu_memory_utilization``, TRL's default ``VLLM_SHARE``), on top of the training's working memory; with
  ``train.trl.vllm_enable_sleep_mode`` vLLM frees it while the policy trains: the larger of the two counts.
- the lag queue (``offpolicy.lag`` batches of ids, masks and log-probs);
- ``FRAGMENTATION`` on top of the above (the caching allocator), then ``OVERHEAD_GB`` per process (CUDA
  context, NCCL and cuBLAS workspaces).

Host memory per node (GiB; ``host_parts``): each training process holds on the host, while it builds its
trainer, the policy as loaded (compute dtype, moved to its GPU before the float32 cast; under FSDP cast to
float32 on the host before FSDP shards it: 4P), the reference only without GPUs (``trainer_factory`` loads it
onto the GPU, never as a host copy), and ``HOST_PROCESS_GB`` of its own (``VLLM_HOST_GB`` more with vLLM); without
GPUs a process's whole estimate is host memory. ``tasks_per_node`` of them against ``model.resources.mem_gb``:
more is refused (Slurm would kill the job: OUT_OF_MEMORY).

Time and GPU-hours (``klsweep.cost``): each run's step time estimated from the GPU's data-sheet figures
(``model.resources.gpu``), as a band (``cost.LOW`` to ``cost.HIGH``), its GPU-hours (steps x step time x GPUs,
plus its eval job) beside its limit (the time limit x GPUs x tries, 1 + ``cluster.max_requeues``, plus the eval
job's limit). ``warnings`` flags runs that may need requeues (at the band's high end), memory within
``AT_RISK`` of the GPU, checkpoints past ``STORAGE_WARN_GB``, a ``cluster.signal_delay_s`` shorter than the
derived one and a Hugging Face cache on node-local storage. Storage: the checkpoints a run keeps
(``train.keep_checkpoints`` of its ``ceil(steps / save_steps)`` saves), each fp32 weights and AdamW moments
(12 bytes per parameter; under FSDP sharded, and the final one 4 more: its whole fp32 weights for eval); one more
exists briefly while a new one is written.

Preemption (``signal_delay``): Slurm sends USR2 ``signal_delay_s`` before the time limit; the job ends the step
in progress, saves and requeues (docs/DESIGN.md, Preemption). Unless ``cluster.signal_delay_s`` sets it, the
delay is the step time (the band's high end) plus one save (the checkpoint's bytes over
``cluster.checkpoint_write_gbps``) plus ``SIGNAL_MARGIN_S``; ``klsweep.submit.slurm`` asks Slurm for it.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import cost, engines
from klsweep.config import tasks_per_node
from klsweep.errors import Problem, UserError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from klsweep.grid import Plan, PlannedRun

GIB = 2**30
OVERHEAD_GB = 2.0  # per process: CUDA context, NCCL and cuBLAS workspaces
FRAGMENTATION = 0.10  # caching-allocator headroom on the estimated tensors
VLLM_SHARE = 0.3  # TRL's vllm_gpu_memory_utilization (colocate mode), the GPU fraction vLLM reserves
# fp32 weights (4) + AdamW moments (8); under FSDP the same, sharded (each rank writes 12/W of it), and the final
# checkpoint also the whole fp32 weights for eval (FINAL_BYTES_PER_PARAM; docs/DESIGN.md, FSDP2)
CHECKPOINT_BYTES_PER_PARAM = {"none": 12, "fsdp": 12}
FINAL_BYTES_PER_PARAM = {"none": 0, "fsdp": 4}
_LAG_BYTES_PER_TOKEN = 24  # a queued batch per token: ids, masks, behaviour and reference log-probs
_EXAMPLES = 3  # run ids named in a grouped problem
AT_RISK = 0.10  # a peak within this fraction of the GPU's memory is flagged (slurm/README.md)
STORAGE_WARN_GB = 10 * 1024  # checkpoints past 10 TiB are flagged
HOST_PROCESS_GB = 4.0  # host memory of a training process: Python, torch, CUDA/NCCL host buffers, data
VLLM_HOST_GB = 4.0  # and of its colocated vLLM engine (no weights: TRL's sleep mode discards them, level 2)
SIGNAL_MARGIN_S = 60  # after the preemption save: the requeue and the processes' exit


# ---------------------------------------------------------------------------------------------- architecture


@dataclass(frozen=True)
class Arch:
    """The numbers of a dense decoder (Llama/Qwen family: GQA attention, SwiGLU MLP) the estimate needs. Its
    parameter count leaves out biases (Qwen2's q/k/v: 0.01% of a 7B model)."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h = self.hidden_size
        attention = 2 * h * self.q_dim + 2 * h * self.kv_dim  # q, o; k, v
        return attention + 3 * h * self.intermediate_size + 2 * h  # gate, up, down; two norms

    @property
    def embedding_params(self) -> int:
        """The input embedding, the LM head unless tied, the final norm: FSDP's root unit."""
        heads = 1 if self.tie_word_embeddings else 2
        return heads * self.vocab_size * self.hidden_size + self.hidden_size

    @property
    def params(self) -> int:
        return self.num_hidden_layers * self.layer_params + self.embedding_params


_ARCH_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "vocab_size",
    "num_attention_heads",
    "num_key_value_heads",
)


def architecture(model: Mapping[str, Any]) -> Arch | None:
    """The architecture of a run's ``model`` section: the tiny model's spec, a local path's ``config.json``, else
    the section's ``arch`` numbers; None when none of them gives every number (or a number is not one: the
    model's own loading says what is wrong with it). Nothing is downloaded."""
    numbers: Mapping[str, Any] = model.get("arch") or {}
    if model.get("path") == "tiny":
        from dataclasses import asdict

        from klsweep.tinymodel import TinySpec

        numbers = {**asdict(TinySpec()), "tie_word_embeddings": True}
    else:
        config_json = Path(str(model.get("path", ""))).expanduser() / "config.json"
        if config_json.is_file():
            try:
                data = json.loads(config_json.read_text())
            except (OSError, ValueError):  # not JSON: loading the model says what is wrong with it
                return None
            if not isinstance(data, dict):
                return None
            numbers = data.get("text_config", data) if "hidden_size" not in data else data
    if any(numbers.get(k) is None for k in _ARCH_KEYS):
        return None
    try:
        n = {k: int(numbers[k]) for k in _ARCH_KEYS}
        head_dim = int(numbers.get("head_dim") or n["hidden_size"] // n["num_attention_heads"])
    except (TypeError, ValueError, ZeroDivisionError):  # not numbers: loading the model says what is wrong
        return None
    return Arch(**n, head_dim=head_dim, tie_word_embeddings=bool(numbers.get("tie_word_embeddings", False)))


# ---------------------------------------------------------------------------------------------- batch


@dataclass(frozen=True)
class BatchShape:
    """How a step's completions map onto TRL's GRPOConfig (its batch sizes count completions)."""

    completions: int  # a step's completions, all processes together
    processes: int
    per_device: int  # per_device_train_batch_size: completions per forward/backward pass
    accumulation: int  # gradient_accumulation_steps (TRL's steps_per_generation follows it)

    @property
    def per_process(self) -> int:
        return self.per_device * self.accumulation


def batch_shape(train: Mapping[str, Any], processes: int) -> BatchShape:
    """The batch split of a run's ``train`` section over ``processes``; ``UserError`` when it does not split."""
    prompts, group = int(train["prompts_per_step"]), int(train["group_size"])
    completions = prompts * group
    if completions % processes:
        raise UserError(
            Problem(
                "train.prompts_per_step",
                f"{completions} completions a step ({prompts} prompts x group_size {group}) do not split evenly "
                f"over {processes} processes",
                f"prompts_per_step x group_size a multiple of {processes} (nodes x tasks_per_node)",
            )
        )
    per_process = completions // processes
    micro = train.get("micro_batch_size") or per_process
    if per_process % micro:
        divisors = [d for d in range(1, per_process + 1) if per_process % d == 0]
        raise UserError(
            Problem(
                "train.micro_batch_size",
                f"{micro} does not divide the {per_process} completions of each process",
                f"a divisor of {per_process}: {', '.join(map(str, divisors))}, or null",
            )
        )
    return BatchShape(completions, processes, micro, per_process // micro)


def processes(config: Mapping[str, Any]) -> int:
    """The training processes of a run: nodes x tasks per node."""
    res = config["model"]["resources"]
    return int(res.get("nodes", 1)) * tasks_per_node(res)


# ---------------------------------------------------------------------------------------------- estimates


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


# ---------------------------------------------------------------------------------------------- checks


def run_problems(config: Mapping[str, Any]) -> tuple[Estimate | None, list[tuple[str, str, str]]]:
    """The estimate of one run's config and what keeps it from starting or fitting, as (key, what, allowed)."""
    model, train, res = config["model"], config["train"], config["model"]["resources"]
    found: list[tuple[str, str, str]] = []
    gpus = int(res.get("gpus_per_node", 0))
    tasks = tasks_per_node(res)
    if gpus and tasks != gpus:
        found.append(
            (
                "model.resources.tasks_per_node",
                f"{tasks} processes per node for {gpus} GPUs per node: "
                + ("GPUs left idle" if tasks < gpus else "processes sharing a GPU"),
                f"{gpus} (one process per GPU), or null",
            )
        )
    eval_chat = config.get("eval", {}).get("apply_chat_template")
    suite = config.get("eval", {}).get("suite", "none")
    if eval_chat is not None and suite != "none" and bool(eval_chat) != bool(model.get("chat_template")):
        trained = "with" if model.get("chat_template") else "without"
        found.append(
            (
                "eval.apply_chat_template",
                f"{eval_chat} for {model.get('name')}, trained {trained} a chat template (model.chat_template)",
                f"null (the model's decision) or {bool(model.get('chat_template'))}",
            )
        )
    if train.get("warmup_steps") and train.get("warmup_ratio"):
        found.append(
            ("train.warmup_ratio", "set together with train.warmup_steps", "one of them; the other 0")
        )
    if train.get("sharding") == "fsdp" and not gpus:
        found.append(
            (
                "train.sharding",
                "fsdp without GPUs (accelerate applies its FSDP plugin to GPU processes only)",
                "none on CPUs, or model.resources.gpus_per_node > 0",
            )
        )
    arch = architecture(model)
    if arch is None and gpus:  # without GPUs, nothing is checked against the estimate
        found.append(
            (
                "model.arch",
                f"no architecture numbers for {model.get('path')!r} (a hub id: nothing is downloaded)",
                f"model.arch.{{{','.join(_ARCH_KEYS)}}} from its config.json, or a local path",
            )
        )
    try:
        shape = batch_shape(train, processes(config))
    except UserError as e:
        found += [(p.where, p.what, p.allowed) for p in e.problems]
        shape = None
    if arch is None or shape is None:
        return None, found
    est = estimate(config, arch, shape)
    if not est.fits:
        found.append(("model.resources.gpu_memory_gb", _too_big(est), _fix(config, arch, shape)))
    if not est.host_fits:
        found.append(("model.resources.mem_gb", _host_too_big(est), _host_fix(est)))
    if est.signal_delay_s >= int(res["timeout_min"]) * 60:
        found.append(
            (
                "cluster.signal_delay_s" if est.delay_set else "model.resources.timeout_min",
                f"the preemption signal {est.signal_delay_s} s before the time limit "
                f"({'cluster.signal_delay_s' if est.delay_set else 'derived: a step and a save'}) comes "
                f"before the job's {res['timeout_min']} min have begun: it would requeue at once",
                f"a timeout_min above {math.ceil(est.signal_delay_s / 60)}, or a shorter signal_delay_s",
            )
        )
    return est, found


def _host_too_big(est: Estimate) -> str:
    shown = ", ".join(f"{k} {v:.1f}" for k, v in est.host_parts.items() if v)
    return (
        f"needs ~{est.host_gb:.0f} GiB of host memory per node ({est.tasks_per_node} processes x "
        f"{sum(est.host_parts.values()):.1f} GiB: {shown}) but a node's job asks for {est.mem_gb:g}"
    )


def _host_fix(est: Estimate) -> str:
    return (
        f"mem_gb >= {math.ceil(est.host_gb)} where the nodes have it (slurm/README.md, host memory), or fewer "
        "processes per node"
    )


def _too_big(est: Estimate) -> str:
    big = sorted(est.parts.items(), key=lambda kv: -kv[1])[:4]
    shown = ", ".join(f"{k} {v:.1f}" for k, v in big)
    return f"needs ~{est.peak_gb:.1f} GiB per GPU ({shown}, ...) but a GPU has {est.gpu_memory_gb:g}"


def _fix(config: Mapping[str, Any], arch: Arch, shape: BatchShape) -> str:
    """The smallest change that makes the run fit, as overrides with the estimate it gives."""
    train, res = config["train"], config["model"]["resources"]
    micro = [
        {"train.micro_batch_size": d}
        for d in range(shape.per_device - 1, 0, -1)
        if shape.per_process % d == 0
    ]
    fsdp = {} if train.get("sharding", "none") == "fsdp" else {"train.sharding": "fsdp"}
    nodes = int(res.get("nodes", 1))
    candidates: list[dict[str, Any]] = [fsdp, *micro, *({**fsdp, **m} for m in micro)]
    for more in ({"model.resources.nodes": n} for n in (2 * nodes, 4 * nodes)):
        candidates += [{**more, **fsdp}, *({**more, **fsdp, **m} for m in micro)]
    for change in filter(None, candidates):
        changed = copy.deepcopy(dict(config))
        for key, value in change.items():
            *parents, leaf = key.split(".")
            node = changed
            for part in parents:
                node = node[part]
            node[leaf] = value
        try:
            new = estimate(changed, arch, batch_shape(changed["train"], processes(changed)))
        except UserError:
            continue
        if new.fits:
            sets = " ".join(f"{k}={v}" for k, v in change.items())
            return f"{sets} (~{new.peak_gb:.1f} GiB)"
    return "a GPU with more memory, or a shorter max_completion_length"


def check(plan: Plan) -> dict[str, Estimate]:
    """Every run's estimate; ``UserError`` naming each run (runs with the same problem together) that cannot
    start or cannot fit its GPUs."""
    estimates: dict[str, Estimate] = {}
    grouped: dict[tuple[str, str, str], list[str]] = {}
    seen: dict[str, tuple[Estimate | None, list[tuple[str, str, str]]]] = {}
    for run in plan.runs:
        c = run.config
        ev = c.get("eval", {})
        cl = c.get("cluster", {})
        timing = (
            ev,
            cl.get("max_requeues"),
            cl.get("signal_delay_s"),
            cl.get("checkpoint_write_gbps"),
            c.get("task", {}).get("name"),
            cost.uses_behaviour_forward(c),
        )
        key = repr((c["model"], c["train"], c.get("offpolicy"), *timing))
        if key not in seen:  # runs differing only in KL settings or seed have the same needs
            seen[key] = run_problems(c)
        est, found = seen[key]
        if est is not None:
            estimates[run.id] = est
        for problem in found:
            grouped.setdefault(problem, []).append(run.id)
    if grouped:
        problems = [
            Problem(f"{_runs_text(ids, run_label(plan, ids[0]))}: {key}", what, allowed)
            for (key, what, allowed), ids in grouped.items()
        ]
        raise UserError(problems, title="runs that cannot start or fit")
    _check_tiny_model(plan)
    return estimates


def _check_tiny_model(plan: Plan) -> None:
    """The shipped tiny model checked against its ``SHA256SUMS`` (``tinymodel.verified``) when a run uses it,
    before anything is written: a damaged one is found at plan time, not in the jobs."""
    if any(r.config["model"].get("path") == "tiny" for r in plan.runs):
        from klsweep import tinymodel

        try:
            tinymodel.shipped_model_path()
        except tinymodel.TinyModelError as e:
            raise UserError(Problem("model.path: tiny", str(e)), title="the tiny model is damaged") from e


def run_label(plan: Plan, run_id: str) -> str:
    run = next(r for r in plan.runs if r.id == run_id)
    return str(run.config["model"].get("name"))


def _runs_text(ids: list[str], model: str) -> str:
    if len(ids) == 1:
        return f"run {ids[0]} ({model})"
    shown = ", ".join(ids[:_EXAMPLES])
    more = f" and {len(ids) - _EXAMPLES} more" if len(ids) > _EXAMPLES else ""
    return f"runs {shown}{more} ({model})"


def learning_rates(runs: list[PlannedRun]) -> list[str]:
    """The learning rates the runs train at, with their schedule (``3e-04 constant``): a model's config group
    may set its own (``klsweep/conf/model/tiny.yaml``), a grid's keys set theirs over it."""
    seen = {(float(r.config["train"]["learning_rate"]), r.config["train"]["lr_scheduler_type"]) for r in runs}
    return [f"{lr:.0e} {schedule}" for lr, schedule in sorted(seen)]


def summary(plan: Plan) -> dict[str, Any]:
    """Counts of the plan (total, excluded, merged: configurations that train the same thing as a run of the plan,
    done: status.json says done or diverged under the out folder, failed: failed or cancelled, both skipped by
    ``klsweep run``, the second unless ``--retry-failed``; to submit: the others), the
    GPU-hours upper bound of the runs to submit, the checkpoint storage of every run, the largest per-GPU memory
    estimate, one row per model and launch shape (``resources``: runs, GPUs, sharding, micro-batch,
    learning rates, largest per-GPU estimate, GPU-hours, storage) and each run's estimate (``estimates``: run
    id -> ``Estimate``).
    Raises ``check``'s ``UserError``, and ``store.refuse_rehearsal``'s when the out folder holds a
    rehearsal."""
    from klsweep import store

    estimates = check(plan)
    store.refuse_rehearsal(plan.sweep_dir)  # its runs are not done, whatever they say: `run` refuses it
    # as `klsweep run` decides (submit.sweep): trained runs are skipped, failed and cancelled ones too unless
    # --retry-failed
    states = {r.id: store.read_status(r.run_dir).get("state") for r in plan.runs}
    todo = [r for r in plan.runs if states[r.id] not in (*store.TRAINED_STATES, *store.STOPPED_STATES)]
    shapes: dict[tuple, list[PlannedRun]] = {}
    for run in plan.runs:
        c = run.config
        res = c["model"]["resources"]
        key = (
            c["model"].get("name"),
            f"{res.get('nodes', 1)}x{res.get('gpus_per_node', 0)}",
            c["train"].get("sharding", "none"),
            c["train"].get("micro_batch_size"),
        )
        shapes.setdefault(key, []).append(run)
    resources = []
    for (model, gpus, sharding, micro), runs in shapes.items():
        ests = [estimates[r.id] for r in runs if r.id in estimates]
        resources.append(
            {
                "model": model,
                "runs": len(runs),
                "gpus": gpus,
                "sharding": sharding,
                "micro_batch_size": micro,
                "learning_rate": learning_rates(runs),
                "gpu_memory_gb": max((e.peak_gb for e in ests if e.gpus), default=None),
                "of_gb": next((e.gpu_memory_gb for e in ests if e.gpus), None),
                "host_memory_gb": max((e.host_gb for e in ests), default=None),
                "mem_gb": next((e.mem_gb for e in ests), None),
                "gpu_hours": gpu_hours(runs),
                "storage_gb": sum(e.storage_gb for e in ests),
                **_time_row(ests),
            }
        )
    on_gpu = [(rid, e) for rid, e in estimates.items() if e.gpus]
    largest = max(on_gpu, key=lambda kv: kv[1].peak_gb / (kv[1].gpu_memory_gb or 1), default=None)
    return {
        "sweep_dir": str(plan.sweep_dir),
        "axes": plan.axes,
        "total": len(plan.runs),
        "excluded": plan.excluded,
        "merged": plan.merged,
        "done": sum(s in store.TRAINED_STATES for s in states.values()),
        "failed": sum(s in store.STOPPED_STATES for s in states.values()),
        "to_submit": len(todo),
        "gpu_hours_upper_bound": round(gpu_hours(todo), 1),
        **_time_totals([estimates[r.id] for r in todo if r.id in estimates]),
        "storage_gb": round(sum(e.storage_gb for e in estimates.values()), 1),
        "largest_gpu_memory": None
        if largest is None
        else {
            "run": largest[0],
            "model": run_label(plan, largest[0]),
            "gpu_memory_gb": round(largest[1].peak_gb, 1),
            "of_gb": largest[1].gpu_memory_gb,
        },
        "resources": resources,
        "warnings": warnings(plan, estimates),
        "estimates": estimates,
    }


def _time_row(ests: list[Estimate]) -> dict[str, Any]:
    """A resources row's time: the GPU, the longest step and training (the band's low and high ends), the
    limit, the jobs (high end), the estimated GPU-hours (both ends), the longest signal delay."""
    timed = [e for e in ests if e.cost and e.cost_high]
    if not timed:
        return {"gpu": None, "step_seconds_low": None, "step_seconds_high": None, "train_hours_high": None,
                "limit_hours": None, "jobs": None, "gpu_hours_estimate_low": None,
                "gpu_hours_estimate_high": None, "signal_delay_s": max((e.signal_delay_s for e in ests),
                                                                       default=None)}  # fmt: skip
    slowest = max(timed, key=lambda e: e.cost_high.step.total)  # type: ignore[union-attr]
    lo, hi = slowest.cost, slowest.cost_high
    assert lo is not None and hi is not None
    return {
        "gpu": lo.gpu,
        "step_seconds_low": round(lo.step.total, 1),
        "step_seconds_high": round(hi.step.total, 1),
        "generation_seconds": round(lo.step.generation, 1),
        "train_hours_high": round(max(e.cost_high.train_hours for e in timed), 2),  # type: ignore[union-attr]
        "limit_hours": lo.limit_hours,
        "jobs": max(e.cost_high.jobs for e in timed),  # type: ignore[union-attr]
        "gpu_hours_estimate_low": round(sum(e.gpu_hours for e in ests), 1),
        "gpu_hours_estimate_high": round(sum(e.gpu_hours_high for e in ests), 1),
        "signal_delay_s": max(e.signal_delay_s for e in ests),
    }


def _time_totals(todo: list[Estimate]) -> dict[str, Any]:
    """The estimated GPU-hours of the runs to submit (training and eval; the band's low and high ends) and the
    eval jobs' at their limits."""
    costs = [e.cost for e in todo if e.cost]
    return {
        "gpu_hours_estimate_low": round(sum(e.gpu_hours for e in todo), 1),
        "gpu_hours_estimate_high": round(sum(e.gpu_hours_high for e in todo), 1),
        "eval_gpu_hours_estimate": round(sum(c.eval_gpu_hours for c in costs), 1),
        "eval_gpu_hours_limit": round(sum(e.eval_limit_gpu_hours for e in todo), 1),
        "eval_estimated": all(
            e.cost.eval_seconds is not None for e in todo if e.cost and e.eval_limit_gpu_hours
        ),
    }


def warnings(plan: Plan, estimates: Mapping[str, Estimate]) -> list[str]:
    """What the plan should say before anything is submitted, runs of one model together: a
    ``gpu_memory_gb`` larger than the GPU of ``model.resources.gpu`` has, training longer than its time limit
    (requeues needed; more than ``cluster.max_requeues`` allow), memory within ``AT_RISK`` of the GPU,
    checkpoints past ``STORAGE_WARN_GB``, and an engine the jobs cannot import (``engines.missing``)."""
    slow: dict[str, list[Estimate]] = {}
    tight: dict[str, list[Estimate]] = {}
    short: dict[str, list[Estimate]] = {}  # a cluster.signal_delay_s shorter than the derived delay
    oversold: set[str] = set()  # models whose gpu_memory_gb is more than their GPU has
    out: list[str] = []
    for run in plan.runs:
        e = estimates.get(run.id)
        if e is None:
            continue
        model = str(run.config["model"].get("name"))
        if e.cost_high and e.cost_high.exceeds_limit:
            slow.setdefault(model, []).append(e)
        if e.delay_set and e.signal_delay_s < e.derived_delay_s:
            short.setdefault(model, []).append(e)
        if e.at_risk:
            tight.setdefault(model, []).append(e)
        gpu = cost.GPUS[e.cost.gpu] if e.cost else None
        if gpu and (e.gpu_memory_gb or 0) > gpu.memory_gb and model not in oversold:
            oversold.add(model)
            out.append(
                f"runs ({model}): model.resources.gpu_memory_gb {e.gpu_memory_gb:g} is more than an "
                f"{e.cost.gpu} has ({gpu.memory_gb:g} GB); the memory check trusts gpu_memory_gb"
            )
    for model, ests in slow.items():
        worst = max((e.cost_high for e in ests if e.cost_high), key=lambda c: c.jobs)
        out.append(
            f"{len(ests)} runs ({model}) may need ~{worst.train_hours:.1f} h of training against a "
            f"{worst.limit_hours:g} h time limit: {worst.jobs} jobs each ({worst.jobs - 1} requeue{'s' if worst.jobs > 2 else ''})"
            + (
                f", more than cluster.max_requeues {worst.tries - 1} allows: raise it or "
                "model.resources.timeout_min"
                if worst.jobs > worst.tries
                else f", within cluster.max_requeues {worst.tries - 1}"
            )
        )
    for model, ests in short.items():
        worst = max(ests, key=lambda e: e.derived_delay_s - e.signal_delay_s)
        c = worst.cost_high
        step = f"a step (up to ~{c.step.total - c.step.checkpoint:.0f} s), " if c else ""
        save = f"a save (~{c.save_seconds:.0f} s at cluster.checkpoint_write_gbps), " if c else ""
        out.append(
            f"{len(ests)} runs ({model}): cluster.signal_delay_s {worst.signal_delay_s} is shorter than the "
            f"{worst.derived_delay_s} s that {step}{save}and a {SIGNAL_MARGIN_S} s margin need: a preempted "
            "job may be killed before its checkpoint is written, losing up to train.save_steps steps "
            "(null derives it)"
        )
    for model, ests in tight.items():
        worst = max(ests, key=lambda e: e.peak_gb)
        out.append(
            f"{len(ests)} runs ({model}) need ~{worst.peak_gb:.1f} of {worst.gpu_memory_gb:g} GiB per GPU: "
            f"within {AT_RISK:.0%} of the GPU, at risk (slurm/README.md); a smaller train.micro_batch_size "
            "leaves room"
        )
    storage = sum(e.storage_gb for e in estimates.values())
    if storage > STORAGE_WARN_GB:
        out.append(
            f"checkpoints kept: {storage / 1024:.1f} TiB, past {STORAGE_WARN_GB / 1024:g} TiB: check the "
            "results folder's quota (train.keep_checkpoints: how many each run keeps)"
        )
    # an engine the jobs' environment cannot import: klsweep run and klsweep eval refuse it (klsweep.engines)
    out += [f"{p.where}: {p.what} ({p.allowed})" for p in engines.missing(r.config for r in plan.runs)]
    return out
