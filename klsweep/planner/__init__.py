"""What a ``Plan``'s runs need (one module per concern: ``shape``, ``needs``, ``check``, ``summary``) and whether they can run: the launch shape of each run (processes, batch split),
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

from klsweep.planner.check import check, run_label, run_problems, runs_text
from klsweep.planner.needs import (
    AT_RISK,
    CHECKPOINT_BYTES_PER_PARAM,
    FINAL_BYTES_PER_PARAM,
    FRAGMENTATION,
    GIB,
    HOST_PROCESS_GB,
    OVERHEAD_GB,
    SIGNAL_MARGIN_S,
    VLLM_HOST_GB,
    VLLM_SHARE,
    Estimate,
    checkpoint_bytes,
    default_signal_delay,
    estimate,
    gpu_hours,
    host_parts,
    job_signal_delay,
    memory_parts,
    signal_delay,
    vllm_share,
)
from klsweep.planner.shape import (
    ARCH_KEYS,
    Arch,
    BatchShape,
    architecture,
    batch_shape,
    context_length,
    processes,
)
from klsweep.planner.summary import STORAGE_WARN_GB, inert_axes, learning_rates, summary, warnings

__all__ = [
    "Arch",
    "ARCH_KEYS",
    "architecture",
    "context_length",
    "BatchShape",
    "batch_shape",
    "processes",
    "GIB",
    "OVERHEAD_GB",
    "FRAGMENTATION",
    "VLLM_SHARE",
    "CHECKPOINT_BYTES_PER_PARAM",
    "FINAL_BYTES_PER_PARAM",
    "AT_RISK",
    "HOST_PROCESS_GB",
    "VLLM_HOST_GB",
    "SIGNAL_MARGIN_S",
    "Estimate",
    "vllm_share",
    "memory_parts",
    "host_parts",
    "checkpoint_bytes",
    "default_signal_delay",
    "signal_delay",
    "job_signal_delay",
    "estimate",
    "gpu_hours",
    "run_problems",
    "check",
    "run_label",
    "runs_text",
    "STORAGE_WARN_GB",
    "inert_axes",
    "learning_rates",
    "summary",
    "warnings",
]
