"""The typed configuration of one run (``RunConfig`` and its sections): the public key vocabulary of grid files
and overrides, each field with its default and its help (``key(default, help)``), the one description of the
key that ``klsweep keys`` prints; two keys are open mappings, ``train.trl`` (TRL options passed through,
``klsweep.trlargs``) and ``cluster.additional_parameters`` (sbatch options)."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def key(default: Any, text: str) -> Any:
    """A RunConfig field: its default and its help, the one description of the key (``klsweep keys``; a list or
    mapping default is copied for each config)."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"help": text})
    return field(default=default, metadata={"help": text})


def section(cls: type) -> Any:
    """A RunConfig field holding a section (its help: the class's docstring)."""
    return field(default_factory=cls, metadata={"help": (cls.__doc__ or "").split("\n\n")[0]})


@dataclass
class Resources:
    """What one job of this model asks the scheduler for."""

    nodes: int = key(1, "nodes of one training job")
    gpus_per_node: int = key(0, "GPUs per node (0: CPU only)")
    tasks_per_node: int | None = key(None, "processes per node; null: one per GPU (one without GPUs)")
    cpus_per_task: int = key(1, "CPUs of each process")
    mem_gb: int = key(4, "memory of a node's job (GB)")
    gpu_memory_gb: float = key(
        80.0, "memory of one GPU: what klsweep plan checks each run's estimate against"
    )
    gpu: str = key(
        "h100-80gb",
        "the GPU model, for klsweep plan's step-time and GPU-hour estimate (its data-sheet figures: "
        "klsweep.cost, klsweep docs slurm); which nodes Slurm gives is cluster.constraint's business",
    )
    timeout_min: int = key(
        60, "time limit of a training job (minutes); the job is requeued when it is reached"
    )
    eval_timeout_min: int = key(60, "time limit of an eval job (minutes)")


def tasks_per_node(resources: Mapping[str, Any]) -> int:
    """The processes a training job starts per node: ``tasks_per_node``, or one per GPU when it is null (one
    on a node without GPUs)."""
    explicit = resources.get("tasks_per_node")
    return int(explicit) if explicit is not None else max(1, int(resources.get("gpus_per_node", 0)))


@dataclass
class Architecture:
    """The architecture numbers of a hub model (names as in its ``config.json``), for ``klsweep plan``'s memory
    estimate without a download. Unused for a local path (its ``config.json`` is read) and the tiny model."""

    hidden_size: int | None = key(None, "width of the model")
    num_hidden_layers: int | None = key(None, "decoder layers")
    intermediate_size: int | None = key(None, "width of the MLP")
    vocab_size: int | None = key(None, "vocabulary size")
    num_attention_heads: int | None = key(None, "attention heads")
    num_key_value_heads: int | None = key(None, "key/value heads (grouped-query attention)")
    head_dim: int | None = key(None, "width of a head; null: hidden_size // num_attention_heads")
    tie_word_embeddings: bool = key(False, "whether the output layer shares the input embedding")
    max_position_embeddings: int | None = key(
        None, "the longest context (tokens); klsweep plan refuses a longer vLLM context (null: not checked)"
    )
    model_type: str | None = key(
        None, "its config.json's model_type (qwen2, llama, qwen3): the class klsweep rehearse builds tiny"
    )


@dataclass
class ModelSection:
    """The model trained (config group ``model``: klsweep/conf/model/)."""

    name: str = key("tiny", "the model's name in tables and W&B (not part of the run id)")
    path: str = key(
        "tiny",
        "tiny: the project's own warm-started tiny model (built once, cached); else a hub id or a path",
    )
    revision: str | None = key(
        None,
        "a hub id's commit (or branch, tag); null: the commit `klsweep fetch` put in the cache, recorded in "
        "each run's config.yaml when the sweep is submitted, so every run loads the same weights",
    )
    dtype: str = key(
        "auto",
        "compute dtype (autocast; auto: bfloat16 on a GPU, float32 on a CPU); the trained policy's weights and "
        "optimizer state are float32 whatever it says, the reference is held in it (klsweep.layout)",
    )
    chat_template: bool = key(
        True,
        "whether prompts go through the tokenizer's chat template, in training and in eval (lm-eval's "
        "apply_chat_template): false for a base model",
    )
    resources: Resources = section(Resources)
    arch: Architecture = section(Architecture)


@dataclass
class TaskSection:
    """The training task (config group ``task``: klsweep/conf/task/)."""

    name: str = key("tiny", "tiny (synthetic, offline) | math (MATH train split, math-verify reward)")
    dataset: str = key("", "math: a hub id or a local .jsonl/.json/.parquet file; tiny: unused")
    split: str = key("train", "the dataset split trained on")
    num_train: int | None = key(None, "cap on training prompts (null: all)")
    system_prompt: str | None = key(None, "a system message before each prompt (null: none)")


COLLAPSE_Z = 5.5  # train.collapse_z's default: its false-collapse rates are in docs/COLLAPSE.md


# TRL 1.16's vllm_importance_sampling_mode (its default first), and "off": no correction at all
VLLM_IS_MODES = ("sequence_mask", "sequence_truncate", "token_mask", "token_truncate", "off")
VLLM_IS_DEFAULT = VLLM_IS_MODES[0]


@dataclass
class TrainSection:
    """GRPO training (TRL's GRPOTrainer): steps, batch, optimiser, checkpoints, divergence."""

    steps: int = key(50, "optimiser steps (TRL's max_steps)")
    learning_rate: float = key(1e-5, "peak learning rate (AdamW)")
    prompts_per_step: int = key(4, "prompts of one optimiser step (all processes together)")
    group_size: int = key(4, "completions per prompt (TRL's num_generations)")
    max_prompt_length: int = key(
        512, "longer training prompts (tokens, chat template applied) are dropped before training"
    )
    max_completion_length: int = key(16, "tokens generated per completion at most")
    temperature: float = key(1.0, "sampling temperature of the completions")
    loss_type: str = key("dapo", "any TRL GRPO loss_type (dapo, grpo, dr_grpo, bnpo, ...)")
    epsilon: float = key(
        0.2,
        "PPO clip range (on-policy, offpolicy.lag 0 with one iteration, the importance ratio is 1: nothing is "
        "clipped, whatever its value)",
    )
    scale_rewards: str = key("group", "group | batch | none: how advantages are scaled by the rewards' std")
    max_grad_norm: float = key(1.0, "gradient clipping norm")
    lr_scheduler_type: str = key(
        "linear",
        "transformers' scheduler: linear (decay to 0), cosine, constant (no warm-up), constant_with_warmup, ...",
    )
    warmup_steps: int = key(
        0,
        "linear warm-up from 0 (steps); at most one of warmup_steps and warmup_ratio; refused with a schedule "
        "that has none (constant: use constant_with_warmup)",
    )
    warmup_ratio: float = key(
        0.0, "linear warm-up from 0 (fraction of train.steps); refused with constant, as warmup_steps"
    )
    micro_batch_size: int | None = key(
        None,
        "completions per forward/backward pass on each process (gradients accumulated); null: all of the "
        "process's completions in one pass",
    )
    sharding: str = key(
        "none",
        "none (DDP: a full copy on every GPU) | fsdp (policy and reference sharded over the processes)",
    )
    save_steps: int = key(25, "a checkpoint every this many steps (and at the end)")
    keep_checkpoints: int | None = key(2, "the newest kept (TRL's save_total_limit); null keeps every one")
    use_vllm: bool = key(
        False,
        "TRL's colocate vLLM generation (needs klsweep[vllm], or vLLM's CPU build without a GPU: run refuses it "
        "when vllm cannot be imported; sleep mode: train.trl.vllm_enable_sleep_mode, GPU only); the run id is "
        "the same either way",
    )
    generation: str = key(
        "auto",
        "how HF generates the completions (without train.use_vllm): fast (klsweep.fastgen: generate's sampling "
        "loop without its overhead, the same tokens for a seed), hf (transformers' generate), auto (fast for the "
        "model types fastgen runs itself, qwen2, on CPUs; hf elsewhere; vLLM and FSDP always fall back): klsweep "
        "plan says which each run takes; the run id is the same either way",
    )
    numerics: str = key(
        "exact",
        "how the trainer computes: exact (TRL's operations: its log-prob forward and fused LM head, HF "
        "generate's prefill; bit for bit the same whatever train.generation) | fast (klsweep.fastpass: each "
        "distinct prompt computed once for the completions that share it, in generation and in the log-prob "
        "passes, and the LM head on the completion positions only; the same quantities to float32 rounding, "
        "a different stream of numbers, so in the run id; a qwen2 model in one process on CPUs, else TRL's, "
        "said by klsweep plan)",
    )
    vllm_importance_sampling: str = key(
        VLLM_IS_DEFAULT,
        "with train.use_vllm: how TRL reweights a sample by the trainer's over vLLM's probability (klsweep docs kl): "
        "token_truncate, token_mask, sequence_truncate, sequence_mask (TRL's default), off; the bound is "
        "train.trl.vllm_importance_sampling_clip_max (3)",
    )
    collapse_window: int = key(
        10, "divergence: the task reward is averaged over windows of this many steps (klsweep docs collapse)"
    )
    collapse_fraction: float = key(
        0.5, "divergence: the run stops when a window's mean reward falls below this fraction of the peak's"
    )
    collapse_z: float = key(
        COLLAPSE_Z,
        "divergence: ... and only when it is also more than this many standard errors below the peak's (from "
        "the logged reward_std over the completions a step): sets the false-collapse rate (klsweep docs collapse)",
    )
    trl: dict[str, Any] = key(
        {},
        "TRL GRPOConfig options passed through as written (e.g. {top_k: 5, weight_decay: 0.01}), merged into "
        "the trainer's GRPOConfig last; the options klsweep sets from its own keys are refused (klsweep.trlargs)",
    )


@dataclass
class KLSection:
    """The KL penalty: estimator, placement, level, beta (klsweep.kl.KLConfig validates it; docs/KL.md)."""

    estimator: str = key(
        "k3", "the estimator of KL(pi_theta || pi_ref): k1, k2, k3, abs (|log-ratio|, verl's)"
    )
    placement: str = key("loss", "where the penalty enters: the reward, the loss, or both")
    level: str = key("token", "token: per-token penalty; sequence: summed over the completion")
    beta: float = key(0.0, "the KL coefficient (0: no KL)")
    importance: str = key(
        "none",
        "pi_theta/mu weighting of the KL term off-policy: none, token, sequence, sequence_mean (the geometric "
        "mean of the token ratios, TRL's sequence level), self (pi_theta/stopgrad(pi_theta): 1, NeMo-RL's) (the "
        "loss half; the reward half too with reward_logp current)",
    )
    importance_cap: float = key(0.0, "the importance weights are min(w, this); 0: no cap (a cap adds bias)")
    importance_gradient: bool = key(
        False,
        "the loss half's importance weight keeps its gradient (TRL's use_bias_correction_kl, slime's "
        "--use-unbiased-kl): on-policy it adds each token's own score term k x grad log pi (klsweep docs kl)",
    )
    straight_through: bool = key(
        False, "the loss half has the estimator's value and k2's gradient (verl's '+' suffix, e.g. k3+)"
    )
    unbiased_gradient: bool = key(
        False,
        "the loss half is stopgrad(w x k) x log pi per token, w the capped importance weight (OpenRLHF's "
        "--algo.kl.unbiased_gradient)",
    )
    log_ratio_clamp: float = key(
        0.0,
        "the log-ratio is clamped to +-this before the estimator, reward and loss (verl, NeMo-RL: 20; "
        "PipelineRL: 5); 0: none",
    )
    value_clamp: float = key(
        0.0,
        "the estimator's value is clamped to +-this, reward and loss (verl, NeMo-RL, OpenRLHF, AReaL: 10); "
        "0: none",
    )
    clamp_weighted: bool = key(
        False,
        "the loss half's value_clamp applies to weight x estimator, not to the estimator before the weight "
        "(NeMo-RL's calculate_kl): where it bites the term has no gradient at all; needs value_clamp > 0",
    )
    clamp_detaches_weight: bool = key(
        False,
        "the loss half's importance weight is detached where the log-ratio clamp bites (NeMo-RL's "
        "calculate_kl): such a token has no gradient at all; needs log_ratio_clamp > 0",
    )
    beta_final: float | None = key(
        None,
        "null: constant beta; else beta decays linearly towards this (PipelineRL's final_kl_coef), reaching "
        "it where beta_final_at says",
    )
    beta_final_at: str = key(
        "last",
        "where a decaying beta reaches beta_final: last (at the last step) or end (one step past it, never "
        "trained: PipelineRL's completed_steps / max_steps)",
    )
    reward_logp: str = key(
        "current",
        "whose log-ratio the reward-placed KL uses, separate mode (klsweep docs kl). current: the training forward "
        "pass's (detached), the reward half its own importance-weighted term outside the clipped ratio; "
        "behavior: the generating policy's, inside the advantage (runs before this key). The same on-policy",
    )
    reward_mode: str = key(
        "separate",
        "how a KL in the reward enters GRPO's advantage (klsweep docs kl). separate: its own "
        "centred advantage, never std-scaled, so beta means what it says; shaped: added to the task reward and "
        "normalised with it, as TRL reward functions and verl's KL-in-reward do",
    )


@dataclass
class OffPolicySection:
    """Off-policy training: a stale generating policy, several updates per batch."""

    lag: int = key(0, "the batch trained at step t was generated by the policy of step t-lag")
    num_iterations: int = key(1, "updates per generated batch (TRL's num_iterations)")


@dataclass
class EvalSection:
    """lm-eval after training (config group ``eval``: klsweep/conf/eval/)."""

    suite: str = key("none", "the suite's name; none: no eval chained after training")
    in_domain: list[str] = key([], "lm-eval task names of the in-domain score")
    ood: list[str] = key([], "lm-eval task names of the out-of-domain score")
    include_path: str | None = key(
        None, 'folder of custom lm-eval task YAMLs ("builtin:tiny": the shipped tiny tasks)'
    )
    metric: str = key("exact_match", "the lm-eval metric reported")
    num_fewshot: int = key(0, "few-shot examples per question")
    apply_chat_template: bool | None = key(
        None,
        "null: the model's own decision (model.chat_template), as in training; klsweep plan refuses another",
    )
    max_gen_toks: int = key(32, "tokens generated per answer at most")
    temperature: float = key(0.0, "sampling temperature (0: greedy)")
    num_samples: int = key(1, "pass@k samples per problem")
    limit: int | None = key(None, "questions per task at most (null: all)")
    batch_size: int = key(16, "lm-eval's batch size")
    backend: str = key("hf", "hf | vllm")
    tensor_parallel_size: int = key(
        1, "vllm: GPUs per model copy; copies = model.resources.gpus_per_node // this"
    )
    max_model_len: int | None = key(
        None,
        "vllm: the longest prompt + answer (tokens) vLLM makes room for; null: the model's own context "
        "(Qwen3-4B-Instruct-2507's 262,144 leaves little memory for the KV cache); longer prompts are cut",
    )
    gpu_memory_utilization: float = key(
        0.9, "vllm: the fraction of each GPU's memory vLLM takes (weights and KV cache; vLLM's default 0.9)"
    )


@dataclass
class ClusterSection:
    """Where jobs run (config group ``cluster``: klsweep/conf/cluster/; slurm/README.md)."""

    kind: str = key("local", "local (this machine) | slurm | debug (in this process, for pdb)")
    partition: str | None = key(None, "sbatch --partition")
    account: str | None = key(None, "sbatch --account")
    qos: str | None = key(None, "sbatch --qos")
    constraint: str | None = key(None, "sbatch --constraint")
    array_parallelism: int = key(64, "tasks of a job array running at once (--array=0-N%this)")
    max_requeues: int = key(3, "preemption/timeout requeues per job (submitit's max_num_timeout)")
    signal_delay_s: int | None = key(
        None,
        "seconds before the time limit Slurm sends USR2 (the job then ends its step, saves and requeues); "
        "null: derived from the step time, the checkpoint's size and checkpoint_write_gbps (klsweep plan)",
    )
    checkpoint_write_gbps: float = key(
        0.5,
        "GB/s a training job writes a checkpoint at, all its processes together, to the results folder's "
        "file system (a conservative default: measure yours); sets the derived signal_delay_s",
    )
    max_local_jobs: int | None = key(None, "local: parallel jobs (null: the cores klsweep may run on)")
    local_jobs_per_worker: int = key(
        0, "local: jobs one worker process runs one after the other (0: no limit; 1: a process per job)"
    )
    additional_parameters: dict[str, Any] = key(
        {}, "any other sbatch option, verbatim (e.g. +cluster.additional_parameters.exclude=node13)"
    )
    setup: list[str] = key([], "shell lines run before each job (module load ...)")
    offline: bool = key(
        False,
        "compute nodes without internet (also implied by HF_HUB_OFFLINE=1 where klsweep runs): plan, run and "
        "eval refuse while a model or dataset is missing from the caches (klsweep fetch), and jobs run with "
        "HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1",
    )


# A key of cluster.additional_parameters becomes `#SBATCH --<key>=<value>` (submitit; `_` as `-`): an sbatch
# option's name and nothing else (a newline in it would be a line of the job's shell script).
SBATCH_OPTION = re.compile(r"[a-z][a-z0-9_-]*")
SBATCH_OPTION_ALLOWED = "an sbatch option's long name: a-z, then a-z 0-9 - _ (e.g. exclude, mail-type)"


def sbatch_option_problem(name: Any) -> str | None:
    """What is wrong with ``name`` as a key of ``cluster.additional_parameters``, or None."""
    if isinstance(name, str) and SBATCH_OPTION.fullmatch(name):
        return None
    return f"{name!r} is not an sbatch option name"


@dataclass
class WandbSection:
    """Weights & Biases mirroring of the metrics (metrics.jsonl stays the source of truth)."""

    mode: str = key(
        "auto", "auto (online when W&B is configured, else offline) | online | offline | disabled"
    )
    project: str = key("klsweep", "the W&B project")
    entity: str | None = key(None, "the W&B entity (null: your default)")
    init_timeout_s: float = key(30.0, "online: give up on W&B after this long and mirror offline instead")


@dataclass
class RunConfig:
    """One run: every key of grid files and overrides."""

    name: str = key("run", "the sweep's name: W&B group, results/<name>/")
    seed: int = key(0, "seeds everything: sampling, data order, initialisation")
    model: ModelSection = section(ModelSection)
    task: TaskSection = section(TaskSection)
    train: TrainSection = section(TrainSection)
    kl: KLSection = section(KLSection)
    offpolicy: OffPolicySection = section(OffPolicySection)
    eval: EvalSection = section(EvalSection)
    cluster: ClusterSection = section(ClusterSection)
    wandb: WandbSection = section(WandbSection)
