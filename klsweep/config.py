"""Typed configuration of one klsweep run: the single source of truth for every key.

Hydra composes YAML config groups (``klsweep/conf/{model,task,cluster,eval}``) on top of ``RunConfig``;
the dotted keys of these dataclasses (``kl.estimator``, ``offpolicy.lag``, ``train.steps`` ...) are the
public vocabulary of grid files and command-line overrides.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from klsweep import store


@dataclass
class Resources:
    """What one job of this model asks the scheduler for."""

    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: int | None = None  # processes per node; None: one per GPU (one without GPUs)
    cpus_per_task: int = 1
    mem_gb: int = 4
    gpu_memory_gb: float = 80.0  # memory of one GPU: what klsweep plan checks each run's estimate against
    timeout_min: int = 60
    eval_timeout_min: int = 60


def tasks_per_node(resources: Mapping[str, Any]) -> int:
    """The processes a training job starts per node: ``tasks_per_node``, or one per GPU when it is null (one
    on a node without GPUs)."""
    explicit = resources.get("tasks_per_node")
    return int(explicit) if explicit is not None else max(1, int(resources.get("gpus_per_node", 0)))


@dataclass
class Architecture:
    """The architecture numbers of a hub model (names as in its ``config.json``), for ``klsweep plan``'s memory
    estimate without a download. Unused for a local path (its ``config.json`` is read) and the tiny model."""

    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    tie_word_embeddings: bool = False


@dataclass
class ModelSection:
    name: str = "tiny"
    # "tiny" builds (once, cached) the project's own warm-started tiny model; anything else is a hub id or a path.
    path: str = "tiny"
    # Compute dtype (autocast): auto (bf16 on GPU, float32 on CPU) | float32 | bfloat16 | float16. The trained
    # policy's weights and optimizer state are float32 whatever it says; the reference is held in it (klsweep.layout).
    dtype: str = "auto"
    # Whether prompts go through the tokenizer's chat template, in training (the task's prompts are chat
    # messages, else plain text) and in eval (lm-eval's apply_chat_template): false for a base model.
    chat_template: bool = True
    resources: Resources = field(default_factory=Resources)
    arch: Architecture = field(default_factory=Architecture)


@dataclass
class TaskSection:
    name: str = "tiny"  # tiny (synthetic, offline) | math (MATH train split, math-verify reward)
    dataset: str = ""  # math: hub id or local .jsonl/.json/.parquet file; tiny: unused
    split: str = "train"
    num_train: int | None = None  # cap on training prompts (None: all)
    system_prompt: str | None = None


@dataclass
class TrainSection:
    steps: int = 50
    learning_rate: float = 1e-5
    prompts_per_step: int = 4
    group_size: int = 4  # completions per prompt (TRL num_generations)
    max_prompt_length: int = 512  # longer training prompts (tokens, chat template applied) are dropped
    max_completion_length: int = 16
    temperature: float = 1.0
    loss_type: str = "dapo"  # any TRL GRPO loss_type
    epsilon: float = 0.2  # PPO clip range
    scale_rewards: str = "group"
    max_grad_norm: float = 1.0
    lr_scheduler_type: str = "linear"  # transformers' schedulers: linear (decay to 0), cosine, constant, ...
    warmup_steps: int = 0  # linear warm-up from 0 (steps); at most one of warmup_steps and warmup_ratio
    warmup_ratio: float = 0.0  # linear warm-up from 0 (fraction of train.steps)
    # Completions per forward/backward pass on each process: a step's completions are split into micro-batches
    # of this size and their gradients accumulated. None: all of the process's completions in one pass.
    micro_batch_size: int | None = None
    # none (DDP: a full copy on every GPU) | fsdp (policy and reference sharded over the processes)
    sharding: str = "none"
    save_steps: int = 25
    keep_checkpoints: int | None = 2  # the newest kept (TRL's save_total_limit); None keeps every one
    use_vllm: bool = False  # GPU only: TRL's colocate vLLM generation (needs klsweep[vllm])
    # Divergence: a non-finite loss, or a reward collapse (see klsweep.trainer for the definition).
    collapse_window: int = 10
    collapse_fraction: float = 0.5
    # TRL GRPOConfig options passed through as written (e.g. {top_k: 5, weight_decay: 0.01}), merged into the
    # trainer's GRPOConfig last; options klsweep sets from its own keys are refused (klsweep.trlargs).
    trl: dict[str, Any] = field(default_factory=dict)


@dataclass
class KLSection:
    """Mirrors klsweep.kl.KLConfig, which validates it."""

    estimator: str = "k3"
    placement: str = "loss"
    level: str = "token"
    beta: float = 0.0
    importance: str = "none"  # none | token | sequence: pi_theta/mu weighting of the KL term off-policy
    # separate | shaped: how a KL in the reward enters GRPO's advantage (klsweep/grpo.py, docs/KL.md).
    # separate: its own centred advantage, never std-scaled, so beta means what it says; shaped: added to the
    # task reward and normalised with it, as TRL reward functions and verl's KL-in-reward do.
    reward_mode: str = "separate"


@dataclass
class OffPolicySection:
    lag: int = 0  # the batch trained at step t was generated by the policy of step t-lag
    num_iterations: int = 1  # updates per generated batch (TRL's num_iterations)


@dataclass
class EvalSection:
    suite: str = "none"  # none: no eval chained after training
    in_domain: list[str] = field(default_factory=list)  # lm-eval task names
    ood: list[str] = field(default_factory=list)
    include_path: str | None = (
        None  # folder of custom lm-eval task YAMLs ("builtin:tiny" = shipped tiny tasks)
    )
    metric: str = "exact_match"
    num_fewshot: int = 0
    # None: the model's own decision (model.chat_template), as in training; klsweep plan refuses a different value
    apply_chat_template: bool | None = None
    max_gen_toks: int = 32
    temperature: float = 0.0
    num_samples: int = 1  # pass@k samples per problem
    limit: int | None = None
    batch_size: int = 16
    backend: str = "hf"  # hf | vllm
    tensor_parallel_size: int = 1  # vllm: GPUs per model copy; copies = model.resources.gpus_per_node // this


@dataclass
class ClusterSection:
    kind: str = "local"  # local | slurm | debug
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    array_parallelism: int = 64
    max_requeues: int = 3
    max_local_jobs: int | None = None  # local: parallel jobs (None: the number of cores)
    additional_parameters: dict[str, Any] = field(default_factory=dict)  # extra sbatch options
    setup: list[str] = field(default_factory=list)  # shell lines run before each job (module load ...)


@dataclass
class WandbSection:
    mode: str = "auto"  # auto (online when W&B is configured, else offline) | online | offline | disabled
    project: str = "klsweep"
    entity: str | None = None
    # online: give up on W&B after this long and mirror offline instead (W&B never fails a run)
    init_timeout_s: float = 30.0


@dataclass
class RunConfig:
    name: str = "run"  # the sweep's name: W&B group, results/<name>/
    seed: int = 0
    model: ModelSection = field(default_factory=ModelSection)
    task: TaskSection = field(default_factory=TaskSection)
    train: TrainSection = field(default_factory=TrainSection)
    kl: KLSection = field(default_factory=KLSection)
    offpolicy: OffPolicySection = field(default_factory=OffPolicySection)
    eval: EvalSection = field(default_factory=EvalSection)
    cluster: ClusterSection = field(default_factory=ClusterSection)
    wandb: WandbSection = field(default_factory=WandbSection)


# Keys added to RunConfig after run folders were written with it, and the value those runs trained with: a
# config.yaml that lacks one is read with this value (klsweep.job, klsweep.report), not with today's default.
LEGACY_VALUES: dict[str, Any] = {"kl.reward_mode": "shaped", "train.trl": {}}

# Keys added after run ids were published, left out of a run's id while they hold this value (their default):
# a run that does not use them keeps the id it had (``grid.run_id``).
ID_OMITTED_AT: dict[str, Any] = {"train.trl": {}}

# How a run without KL (kl.beta = 0) reads wherever a configuration is shown (plan, status, report), in place
# of the KL fields that then do nothing: one label, from ``without_kl_when_off``.
NO_KL = "no KL"
KL_ONLY_KEYS: tuple[str, ...] = (
    "kl.estimator",
    "kl.placement",
    "kl.level",
    "kl.importance",
    "kl.reward_mode",
)


def without_kl_when_off(params: Mapping[str, Any]) -> dict[str, Any]:
    """A run's dotted keys -> values (its varying axes, or its whole flattened config), with the KL-only fields
    (``KL_ONLY_KEYS``) read as ``NO_KL`` when ``kl.beta`` is 0: the no-KL runs form one configuration whatever
    those fields hold, and read the same in the plan, the status and the report."""
    out = dict(params)
    if out.get("kl.beta") == 0:
        for key in KL_ONLY_KEYS:
            if key in out:
                out[key] = NO_KL
    return out


# Top-level sections (and model keys) that do not change what a run computes: excluded from its id.
COSMETIC_KEYS: tuple[str, ...] = (
    "name",
    "eval",
    "cluster",
    "wandb",
    "model.name",
    "model.resources",
    "model.arch",
)


CONFIG_TODO = "rerun `klsweep run` with the sweep's grid (it rewrites config.yaml), or restore the file"


def read_run_file(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A run folder's ``config.yaml`` as plain data (what every reader of a run's config calls).
    ``store.UnreadableFile`` when it is not YAML, not a mapping, or cut short: no final newline, or the
    sections of a file klsweep wrote (every section, in RunConfig's order) stopping before the last one. A
    hand-written file may leave sections out (their defaults apply)."""
    import yaml

    path = Path(run_dir) / store.CONFIG_FILE
    try:
        text = path.read_text()
    except UnicodeDecodeError as e:
        raise store.UnreadableFile(path, "not a text file", CONFIG_TODO) from e
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        raise store.UnreadableFile(path, f"not valid YAML: {' '.join(str(e).split())}", CONFIG_TODO) from e
    if not isinstance(data, dict):
        raise store.UnreadableFile(path, "not a mapping of config keys", CONFIG_TODO)
    if not text.endswith("\n"):
        raise store.UnreadableFile(path, "cut short (no final newline)", CONFIG_TODO)
    sections = [f.name for f in fields(RunConfig)]
    present = list(data)
    if 2 <= len(present) < len(sections) and present == sections[: len(present)]:
        missing = ", ".join(sections[len(present) :])
        raise store.UnreadableFile(path, f"cut short (it stops before {missing})", CONFIG_TODO)
    return data
