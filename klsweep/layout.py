"""How a run's training is laid out on its processes: the dtype each model is held and computed in, and whether
the policy and the reference are sharded (``model.dtype``, ``train.sharding``). ``klsweep.job`` builds the
trainer's arguments from it; the same decisions are the ones to count when estimating memory.

One training process per Slurm task; each process drives one GPU (or CPU threads) and holds:

Precision (mixed precision with float32 master weights, whatever ``model.dtype`` says):

- the trained policy: float32 weights, gradients and AdamW state (``KLGRPOTrainer`` upcasts it), so that an
  update of lr 1e-6 is applied, not rounded away as it is on bfloat16 weights;
- compute: ``model.dtype`` (``auto``: bfloat16 on a GPU, float32 on a CPU): the forward and backward passes run
  under autocast in it (transformers' ``bf16`` / ``fp16`` arguments; float16 adds a loss scaler); TRL computes
  log-probs and the loss in float32;
- the frozen reference: held in the compute dtype (no gradients, no optimizer: it needs no master copy). It is
  the model as loaded (in the compute dtype): the published weights of the paper's models are bfloat16, so the
  policy starts exactly from them, and the reference equals the initial policy.

Sharding (``train.sharding``):

- ``none``: every process holds the whole policy (weights, gradients, AdamW state) and the whole reference; DDP
  all-reduces the gradients. On CPUs the processes talk over ``gloo``.
- ``fsdp``: FSDP2 through transformers and accelerate (``fsdp=True`` and ``fsdp_config``): the policy's
  weights, gradients and AdamW state are sharded over all processes of the run, one FSDP unit per decoder layer
  (the model's ``_no_split_modules``), all-gathered layer by layer in the compute dtype, with FSDP's activation
  checkpointing; gradients are reduce-scattered in the compute dtype (accelerate's mixed-precision policy) and
  applied to the float32 shards. The reference is sharded by TRL's ``prepare_fsdp`` as one unit: each of its
  forwards all-gathers its whole weights (compute dtype) for a moment. Checkpoints are sharded
  (``SHARDED_STATE_DICT``, torch.distributed.checkpoint): each rank writes its own shard of the float32 policy
  (``pytorch_model_fsdp_0/__<rank>_0.distcp``) and of the AdamW state (``optimizer_0/``), what a resume reads,
  beside the model's config and tokenizer; the final checkpoint also gets the whole weights gathered into
  ``model.safetensors`` (what eval reads; ``KLGRPOTrainer.save_consolidated``). On GPUs; on CPUs only in the
  tests (``TEST_FSDP_ON_CPU``): accelerate applies its FSDP plugin only to accelerator processes (on CPUs it
  would silently train unsharded), so ``fsdp`` on a CPU is refused otherwise. docs/DESIGN.md (FSDP2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from klsweep.errors import Problem, UserError

SHARDING = ("none", "fsdp")  # train.sharding
COMPUTE_DTYPES = ("auto", "float32", "bfloat16", "float16")  # model.dtype
MASTER_DTYPE = "float32"  # the trained policy's weights, gradients and optimizer state
# Test-only: "1" lets ``fsdp`` run on CPU processes (gloo), accelerate made to apply its FSDP2 plugin there
# (``shard_cpu_processes``). Only the tests marked ``fsdp`` set it; a user's CPU run is still refused.
TEST_FSDP_ON_CPU = "KLSWEEP_TEST_FSDP_ON_CPU"


def fsdp_on_cpu() -> bool:
    """Whether this process may shard over CPU processes (the test-only ``TEST_FSDP_ON_CPU``)."""
    return os.environ.get(TEST_FSDP_ON_CPU) == "1"


@dataclass(frozen=True)
class Layout:
    """What one training process holds, in which dtype."""

    sharding: str  # none | fsdp
    compute: str  # float32 | bfloat16 | float16: autocast dtype of the forward and backward passes
    policy: str = MASTER_DTYPE  # the trained policy's weights, gradients, optimizer state

    @property
    def reference(self) -> str:
        """The frozen reference is held in the compute dtype."""
        return self.compute


def layout(model_dtype: str, sharding: str, gpu: bool) -> Layout:
    """The layout of a process with (``gpu``) or without a GPU; a ``UserError`` for what cannot run there."""
    problems = []
    if model_dtype not in COMPUTE_DTYPES:
        problems.append(Problem("model.dtype", f"{model_dtype!r} is not valid", ", ".join(COMPUTE_DTYPES)))
    elif model_dtype == "float16" and not gpu:
        problems.append(Problem("model.dtype", "float16 autocast needs a GPU", "auto, float32, bfloat16"))
    if sharding not in SHARDING:
        problems.append(Problem("train.sharding", f"{sharding!r} is not valid", ", ".join(SHARDING)))
    elif sharding == "fsdp" and not gpu and not fsdp_on_cpu():
        problems.append(
            Problem(
                "train.sharding",
                "fsdp needs GPUs (accelerate shards only accelerator processes)",
                "none on a CPU",
            )
        )
    if problems:
        raise UserError(problems, title="the run cannot be laid out on this machine")
    compute = ("bfloat16" if gpu else "float32") if model_dtype == "auto" else model_dtype
    return Layout(sharding=sharding, compute=compute)


def training_arguments(lay: Layout, gpu: bool, world: int) -> dict[str, Any]:
    """The transformers ``TrainingArguments`` (TRL ``GRPOConfig``) values that realise ``lay`` in a run of
    ``world`` processes."""
    args: dict[str, Any] = {
        "bf16": lay.compute == "bfloat16",
        "fp16": lay.compute == "float16",
        "use_cpu": not gpu,
        "ddp_backend": "gloo" if world > 1 and not gpu else None,
        "activation_checkpointing": gpu,  # memory for large models on GPU; off on CPU
    }
    if lay.sharding == "fsdp":
        args["fsdp"] = True
        args["fsdp_config"] = {
            "version": 2,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",  # one unit per decoder layer
            "reshard_after_forward": True,
            "activation_checkpointing": True,  # FSDP's own (the Trainer's would all-gather again)
            "state_dict_type": "SHARDED_STATE_DICT",  # each rank writes its own shard (DCP)
        }
        args["activation_checkpointing"] = False
    import dataclasses

    from transformers import TrainingArguments

    if "activation_checkpointing" not in {f.name for f in dataclasses.fields(TrainingArguments)}:
        # transformers < 5.2x (the one vLLM's CPU build pins, .venv-vllm) knows it by its older name
        args["gradient_checkpointing"] = args.pop("activation_checkpointing")
    return args


def shard_cpu_processes() -> None:
    """Test-only (``TEST_FSDP_ON_CPU``): make accelerate apply its FSDP plugin to a multi-process CPU run, as it
    does to GPU processes. accelerate's ``AcceleratorState`` turns a plugin into ``DistributedType.FSDP`` only
    for accelerator process groups (MULTI_GPU, MULTI_XPU, ...) and drops it for MULTI_CPU; torch's FSDP2
    (``fully_shard``) itself shards over a CPU device mesh (gloo). Wraps ``AcceleratorState.__init__`` once
    in this process to do the same for MULTI_CPU."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__
    if getattr(original, "klsweep_cpu_fsdp", False):
        return

    def __init__(self, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = self.distributed_type  # as accelerate's own end

    __init__.klsweep_cpu_fsdp = True  # type: ignore[attr-defined]
    AcceleratorState.__init__ = __init__  # type: ignore[method-assign]


def torch_dtype(name: str) -> Any:
    """The torch dtype of a dtype name of this module."""
    import torch

    return getattr(torch, name)
