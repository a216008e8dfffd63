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

Time and GPU-hours (``klsweep.cost``): each run's step time estimated from the GPU's data-sheet figures
(``model.resources.gpu``), its GPU-hours (steps x step time x GPUs, plus its eval job) beside its limit (the
time limit x GPUs x tries, 1 + ``cluster.max_requeues``, plus the eval job's limit). ``warnings`` flags runs that
need requeues, memory within ``AT_RISK`` of the GPU and checkpoints past ``STORAGE_WARN_GB``. Storage: the checkpoints a run keeps
(``train.keep_checkpoints`` of its ``ceil(steps / save_steps)`` saves), each fp32 weights and AdamW moments
(12 bytes per parameter; 16 under FSDP, where accelerate also writes a full fp32 copy of the weights); one more
exists briefly while a new one is written.
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
# fp32 weights (4) + AdamW moments (8); under FSDP accelerate writes a second full fp32 copy of the weights
# (pytorch_model_fsdp.bin) beside the model's own: 16
CHECKPOINT_BYTES_PER_PARAM = {"none": 12, "fsdp": 16}
_LAG_BYTES_PER_TOKEN = 24  # a queued batch per token: ids, masks, behaviour and reference log-probs
_EXAMPLES = 3  # run ids named in a grouped problem
AT_RISK = 0.10  # a peak within this fraction of the GPU's memory is flagged (slurm/README.md)
STORAGE_WARN_GB = 10 * 1024  # checkpoints past 10 TiB are flagged


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

    @property
    def fits(self) -> bool:
        return self.gpu_memory_gb is None or self.peak_gb <= self.gpu_memory_gb

    @property
    def at_risk(self) -> bool:
        """Fits, but within ``AT_RISK`` of the GPU's memory."""
        return self.gpu_memory_gb is not None and self.peak_gb > (1 - AT_RISK) * self.gpu_memory_gb

    @property
    def gpu_hours(self) -> float:
        """The estimate (0 without GPUs)."""
        return self.cost.gpu_hours if self.cost else 0.0

    def as_json(self) -> dict[str, Any]:
        """``plan --json``'s per-run estimate (``gpu_memory_gb``: the estimated peak per GPU; the time fields:
        null without GPUs)."""
        c = self.cost
        return {
            "gpu_memory_gb": round(self.peak_gb, 1) if self.gpus else None,
            "memory_at_risk": self.at_risk,
            "step_seconds": round(c.step.total, 1) if c else None,
            "generation_seconds": round(c.step.generation, 1) if c else None,
            "train_hours": round(c.train_hours, 2) if c else None,
            "jobs": c.jobs if c else None,
            "exceeds_time_limit": c.exceeds_limit if c else False,
            "eval_gpu_hours": round(c.eval_gpu_hours, 2) if c and c.eval_seconds is not None else None,
            "gpu_hours": round(self.gpu_hours, 2),
            "storage_gb": round(self.storage_gb, 1),
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


def estimate(config: Mapping[str, Any], arch: Arch, shape: BatchShape) -> Estimate:
    """The estimate of one run (its config, architecture and batch shape)."""
    res, train = config["model"]["resources"], config["train"]
    gpus = int(res.get("gpus_per_node", 0)) * int(res.get("nodes", 1))
    parts = memory_parts(config, arch, shape)
    saves = math.ceil(int(train["steps"]) / int(train["save_steps"]))
    keep = train.get("keep_checkpoints")
    kept = saves if keep is None else min(int(keep), saves)
    # vLLM's KV cache: its share of the GPU less its bf16 copy of the weights
    share = vllm_share(config)
    kv_room = share - cost.COMPUTE_BYTES * arch.params if share is not None else None
    train_limit, eval_limit = _limit_gpu_hours(config)
    return Estimate(
        peak_gb=sum(parts.values()),
        limit_gpu_hours=train_limit + eval_limit,
        storage_gb=kept * CHECKPOINT_BYTES_PER_PARAM[train.get("sharding", "none")] * arch.params / GIB,
        parts=parts,
        gpus=gpus,
        gpu_memory_gb=float(res["gpu_memory_gb"]) if gpus else None,
        cost=cost.run_cost(config, arch, shape, kv_room),
        limit_hours=int(res["timeout_min"]) / 60,
        tries=_tries(config),
        eval_limit_gpu_hours=eval_limit,
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
    return est, found


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
        timing = (ev, c.get("cluster", {}).get("max_requeues"), cost.uses_behaviour_forward(c))
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
    return estimates


def run_label(plan: Plan, run_id: str) -> str:
    run = next(r for r in plan.runs if r.id == run_id)
    return str(run.config["model"].get("name"))


def _runs_text(ids: list[str], model: str) -> str:
    if len(ids) == 1:
        return f"run {ids[0]} ({model})"
    shown = ", ".join(ids[:_EXAMPLES])
    more = f" and {len(ids) - _EXAMPLES} more" if len(ids) > _EXAMPLES else ""
    return f"runs {shown}{more} ({model})"


def summary(plan: Plan) -> dict[str, Any]:
    """Counts of the plan (total, excluded, merged: configurations that train the same thing as a run of the plan,
    done: status.json says done under the out folder, to submit), the
    GPU-hours upper bound of the runs to submit, the checkpoint storage of every run, the largest per-GPU memory
    estimate, one row per model and launch shape (``resources``: runs, GPUs, sharding, micro-batch, largest
    per-GPU estimate, GPU-hours, storage) and each run's estimate (``estimates``: run id -> ``Estimate``).
    Raises ``check``'s ``UserError``."""
    from klsweep import store

    estimates = check(plan)
    todo = [r for r in plan.runs if store.read_status(r.run_dir).get("state") != "done"]
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
                "gpu_memory_gb": max((e.peak_gb for e in ests if e.gpus), default=None),
                "of_gb": next((e.gpu_memory_gb for e in ests if e.gpus), None),
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
        "done": len(plan.runs) - len(todo),
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
    """A resources row's time: the GPU, the longest step and training, the limit, the estimated GPU-hours."""
    costs = [e.cost for e in ests if e.cost]
    if not costs:
        return {"gpu": None, "step_seconds": None, "train_hours": None, "limit_hours": None,
                "jobs": None, "gpu_hours_estimate": None}  # fmt: skip
    slowest = max(costs, key=lambda c: c.step.total)
    return {
        "gpu": slowest.gpu,
        "step_seconds": round(slowest.step.total, 1),
        "generation_seconds": round(slowest.step.generation, 1),
        "train_hours": round(max(c.train_hours for c in costs), 2),
        "limit_hours": slowest.limit_hours,
        "jobs": max(c.jobs for c in costs),
        "gpu_hours_estimate": round(sum(e.gpu_hours for e in ests), 1),
    }


def _time_totals(todo: list[Estimate]) -> dict[str, Any]:
    """The estimated GPU-hours of the runs to submit (training and eval) and the eval jobs' at their limits."""
    costs = [e.cost for e in todo if e.cost]
    return {
        "gpu_hours_estimate": round(sum(e.gpu_hours for e in todo), 1),
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
    oversold: set[str] = set()  # models whose gpu_memory_gb is more than their GPU has
    out: list[str] = []
    for run in plan.runs:
        e = estimates.get(run.id)
        if e is None:
            continue
        model = str(run.config["model"].get("name"))
        if e.cost and e.cost.exceeds_limit:
            slow.setdefault(model, []).append(e)
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
        worst = max((e.cost for e in ests if e.cost), key=lambda c: c.jobs)
        out.append(
            f"{len(ests)} runs ({model}) need ~{worst.train_hours:.1f} h of training against a "
            f"{worst.limit_hours:g} h time limit: {worst.jobs} jobs each ({worst.jobs - 1} requeue{'s' if worst.jobs > 2 else ''})"
            + (
                f", more than cluster.max_requeues {worst.tries - 1} allows: raise it or "
                "model.resources.timeout_min"
                if worst.jobs > worst.tries
                else f", within cluster.max_requeues {worst.tries - 1}"
            )
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
