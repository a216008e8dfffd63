"""Typed configuration of one klsweep run: the single source of truth for every key.

Hydra composes YAML config groups (``klsweep/conf/{model,task,cluster,eval}``) on top of ``RunConfig``;
the dotted keys of these dataclasses (``kl.estimator``, ``offpolicy.lag``, ``train.steps`` ...) are the
public vocabulary of grid files and command-line overrides. Each field carries its help (``key(default, help)``),
the one description of the key that ``klsweep keys`` prints; two keys are open mappings, ``train.trl`` (TRL
options passed through, ``klsweep.trlargs``) and ``cluster.additional_parameters`` (sbatch options).
A run folder's ``config.yaml`` is read by ``load_run`` (typed; the one reader) and written by ``write_run``.
More: docs/DESIGN.md (Run configuration).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from klsweep import store
from klsweep.errors import Problem, UserError


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
    epsilon: float = key(0.2, "PPO clip range")
    scale_rewards: str = key("group", "group | batch | none: how advantages are scaled by the rewards' std")
    max_grad_norm: float = key(1.0, "gradient clipping norm")
    lr_scheduler_type: str = key(
        "linear", "transformers' scheduler: linear (decay to 0), cosine, constant, ..."
    )
    warmup_steps: int = key(0, "linear warm-up from 0 (steps); at most one of warmup_steps and warmup_ratio")
    warmup_ratio: float = key(0.0, "linear warm-up from 0 (fraction of train.steps)")
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
        "the log-ratio is clamped to +-this before the estimator, reward and loss (verl, NeMo-RL: 20); 0: none",
    )
    value_clamp: float = key(
        0.0,
        "the estimator's value is clamped to +-this, reward and loss (verl, NeMo-RL, OpenRLHF: 10); 0: none",
    )
    beta_final: float | None = key(
        None,
        "null: constant beta; else beta decays linearly to this at the last step (PipelineRL's final_kl_coef)",
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


# The frameworks' KL forms (klsweep.kl; docs/KL.md, "What each framework's KL does") at their defaults, which
# are klsweep's own computation: runs before them trained with these values, and their ids leave them out.
KL_FORMS: dict[str, Any] = {
    "kl.importance_gradient": False,
    "kl.straight_through": False,
    "kl.unbiased_gradient": False,
    "kl.log_ratio_clamp": 0.0,
    "kl.value_clamp": 0.0,
    "kl.beta_final": None,
}

# Keys added to RunConfig after run folders were written with it, and the value those runs trained with: a
# config.yaml that lacks one is read with this value (``load_run``), not with today's default.
LEGACY_VALUES: dict[str, Any] = {
    "kl.reward_mode": "shaped",
    "kl.reward_logp": "behavior",
    "kl.importance_cap": 0.0,
    **KL_FORMS,
    "train.trl": {},
    "train.vllm_importance_sampling": VLLM_IS_DEFAULT,
}

# Keys added after run ids were published, left out of a run's id while they hold this value (their default):
# a run that does not use them keeps the id it had (``grid.run_id``). ``id_omitted_at`` adds kl.reward_logp.
ID_OMITTED_AT: dict[str, Any] = {
    "train.trl": {},
    "kl.importance_cap": 0.0,
    **KL_FORMS,
    "model.resources.gpu": "h100-80gb",
    "train.collapse_z": COLLAPSE_Z,
    "train.vllm_importance_sampling": VLLM_IS_DEFAULT,
}


def on_policy(config: Mapping[str, Any]) -> bool:
    """Whether a resolved RunConfig (nested plain data) trains on-policy: lag 0 and one update per batch."""
    off = config.get("offpolicy") or {}
    return off.get("lag", 0) == 0 and off.get("num_iterations", 1) == 1


def id_omitted_at(config: Mapping[str, Any]) -> dict[str, Any]:
    """``ID_OMITTED_AT`` for this run (a resolved RunConfig, nested plain data), plus ``kl.reward_logp``: left
    out of the id wherever both values are the same computation (``reward_logp_inert``: on-policy, shaped mode,
    no KL in the reward; whatever it holds: the ids of runs written before the key existed stand), and otherwise
    while it holds ``behavior``, what those runs trained with; so it is in the id only where ``current`` changes
    the run. Shared between runs (read-only): a plan's run ids find their rules once (``grid.run_id``)."""
    own = (config.get("kl") or {}).get("reward_logp", "behavior")
    value = own if reward_logp_inert(config) is not None else "behavior"
    return _omitted_with(value) if isinstance(value, str) else {**ID_OMITTED_AT, "kl.reward_logp": value}


@functools.cache
def _omitted_with(reward_logp: str) -> dict[str, Any]:
    return {**ID_OMITTED_AT, "kl.reward_logp": reward_logp}


def reward_logp_inert(config: Mapping[str, Any]) -> str | None:
    """Why ``kl.reward_logp`` changes nothing in this run (both of its values are the same computation), or
    None where it does: on-policy, a KL in the reward in shaped mode, no KL in the reward (placement loss,
    beta 0). The rule of ``id_omitted_at``."""
    kl = config.get("kl") or {}
    if on_policy(config):
        return ON_POLICY
    if kl.get("reward_mode") == "shaped":
        return "kl.reward_mode is shaped"
    if kl.get("placement") == "loss":
        return "kl.placement is loss"
    if not kl.get("beta"):
        return "kl.beta is 0"
    return None


ON_POLICY = "on-policy (offpolicy.lag 0, offpolicy.num_iterations 1)"


# Keys that change how a run is computed, not what it computes (generation engine, batching into passes,
# checkpoints kept): hashed at this value whatever they hold, so that changing one resumes the same runs. The
# value is their default, which the ids published before this rule hashed: those ids stay. Not one:
# train.save_steps (the committed tiny studies hashed 100, not the default 25: their ids would change) and
# train.sharding (a DDP run cannot resume an FSDP checkpoint); eval, cluster and wandb are left out of the id
# whole (COSMETIC_KEYS). docs/DESIGN.md, "Run configuration".
ID_HASHED_AT: dict[str, Any] = {
    "train.use_vllm": False,
    "train.micro_batch_size": None,
    "train.keep_checkpoints": 2,
}

# How a run without KL (kl.beta = 0) reads wherever a configuration is shown (plan, status, report), in place
# of the KL fields that then do nothing: one label, from ``without_kl_when_off``.
NO_KL = "no KL"
KL_ONLY_KEYS: tuple[str, ...] = (
    "kl.estimator",
    "kl.placement",
    "kl.level",
    "kl.importance",
    "kl.importance_cap",
    "kl.reward_mode",
    "kl.reward_logp",
    *(key for key in KL_FORMS if key != "kl.beta_final"),  # beta_final > 0 is a KL (kl_off_hashed_at)
)


def kl_off(config: Mapping[str, Any]) -> bool:
    """Whether a resolved RunConfig (nested plain data) trains without KL: ``kl.beta`` 0 and no
    ``kl.beta_final`` (a decay to a beta > 0 is a KL)."""
    kl = config.get("kl") or {}
    return not kl.get("beta") and not kl.get("beta_final")


def kl_off_hashed_at(config: Mapping[str, Any]) -> dict[str, Any]:
    """The KL-only keys (``KL_ONLY_KEYS``) at their defaults when a resolved RunConfig (nested plain data) has
    no KL (``kl_off``), else nothing: hashed at that value in the run's id (``grid.run_id``), so the no-KL runs
    of a grid that crosses beta 0 with estimators or placements are one run per seed. The defaults are what the
    no-KL runs of the committed studies hold: their ids stand (docs/DESIGN.md, "Run configuration"). Shared
    between runs: read-only."""
    return _kl_defaults() if kl_off(config) else _NOTHING


_NOTHING: dict[str, Any] = {}  # shared: read-only


@functools.cache
def _kl_defaults() -> dict[str, Any]:
    defaults = KLSection()
    return {key: getattr(defaults, key.split(".", 1)[1]) for key in KL_ONLY_KEYS}


# Keys a setting of the run makes inert (they change nothing it computes), beyond the KL-only keys of a run
# without KL and kl.reward_logp (``reward_logp_inert``): key -> (the setting, its values that make the key
# inert, why in words, what to set). The KL forms of the loss half (klsweep.kl.token_terms) do nothing where
# the KL is only in the reward, whose importance weights are detached whatever importance_gradient says
# (grpo.kl_reward_loss); a cap or a gradient of importance weights does nothing without weights; the reward
# mode does nothing without a KL in the reward; vLLM's importance sampling and TRL's vllm_* options do nothing
# without vLLM generation (klsweep.trainer, TRL's GRPOTrainer: read under use_vllm only).
_MADE_INERT: dict[str, tuple[str, tuple[Any, ...], str, str]] = {
    "kl.reward_mode": ("kl.placement", ("loss",), "kl.placement is loss", "set kl.placement: reward or both"),
    "kl.straight_through": (
        "kl.placement",
        ("reward",),
        "kl.placement is reward",
        "set kl.placement: loss or both",
    ),
    "kl.unbiased_gradient": (
        "kl.placement",
        ("reward",),
        "kl.placement is reward",
        "set kl.placement: loss or both",
    ),
    "kl.importance_gradient": ("kl.importance", ("none",), "kl.importance is none", "set kl.importance"),
    "kl.importance_cap": ("kl.importance", ("none",), "kl.importance is none", "set kl.importance"),
    "train.vllm_importance_sampling": (
        "train.use_vllm",
        (False,),
        "train.use_vllm is false",
        "set train.use_vllm: true",
    ),
}
_REWARD_LOGP_FIX = {
    ON_POLICY: "set offpolicy.lag",
    "kl.reward_mode is shaped": "set kl.reward_mode: separate",
    "kl.placement is loss": "set kl.placement: reward or both",
    "kl.beta is 0": "set kl.beta",
}


def inert(config: Mapping[str, Any], key: str) -> tuple[str, str] | None:
    """Why the dotted ``key`` changes nothing in a run (a resolved RunConfig, nested plain data), and what to
    set so that it does: (why, what to set), or None when it may change the run. The one rule behind the run
    id's merges (``kl_off_hashed_at``, ``id_omitted_at``) and the plan's warning of an axis that changes nothing
    in any run (``klsweep.planner``): the KL-only keys without KL, ``kl.reward_logp`` where
    ``reward_logp_inert`` says, and ``_MADE_INERT``'s keys (``kl.importance_gradient`` under placement reward
    too; ``train.trl.vllm_*`` options without ``train.use_vllm``)."""
    if key in KL_ONLY_KEYS and kl_off(config):
        return "kl.beta is 0", "set kl.beta"
    if key == "kl.reward_logp" and (why := reward_logp_inert(config)) is not None:
        return why, _REWARD_LOGP_FIX[why]
    if key == "kl.importance_gradient" and _value(config, "kl.placement") == "reward":
        return "kl.placement is reward", "set kl.placement: loss or both"
    if key.startswith("train.trl.vllm_") and not _value(config, "train.use_vllm"):
        key = "train.vllm_importance_sampling"  # the same rule
    rule = _MADE_INERT.get(key)
    if rule is not None and _value(config, rule[0]) in rule[1]:
        return rule[2], rule[3]
    return None


def _value(config: Mapping[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def without_kl_when_off(params: Mapping[str, Any]) -> dict[str, Any]:
    """A run's dotted keys -> values (its varying axes, or its whole flattened config), with the KL-only fields
    (``KL_ONLY_KEYS``) read as ``NO_KL`` when ``kl.beta`` is 0: the no-KL runs form one configuration whatever
    those fields hold, and read the same in the plan, the status and the report."""
    out = dict(params)
    if out.get("kl.beta") == 0 and not out.get("kl.beta_final"):
        for key in KL_ONLY_KEYS:
            if key in out:
                out[key] = NO_KL
    return out


# Top-level sections (and model keys, and the TRL options of vLLM's memory) that do not change what a run
# computes: excluded from its id.
COSMETIC_KEYS: tuple[str, ...] = (
    "name",
    "eval",
    "cluster",
    "wandb",
    "model.name",
    # the pinned commit of a hub id, recorded when a sweep's runs are written (klsweep.fetch): a sweep's runs keep
    # their ids when the pin is recorded; every run of a sweep holds the same one
    "model.revision",
    "model.resources",
    "model.arch",
    "train.trl.vllm_enable_sleep_mode",
    "train.trl.vllm_gpu_memory_utilization",
)


def is_cosmetic(key: str) -> bool:
    """Whether the dotted ``key`` is one of ``COSMETIC_KEYS`` or inside one (the run id does not see it)."""
    return any(key == c or key.startswith(c + ".") for c in COSMETIC_KEYS)


def run_file_text(config: Mapping[str, Any]) -> str:
    """A resolved RunConfig (plain data) as a run folder's ``config.yaml`` holds it: what every writer of the
    file and ``klsweep config`` print."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(dict(config)))


CONFIG_TODO = "rerun `klsweep run` with the sweep's grid (it rewrites config.yaml), or restore the file"


def read_run_file(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A run folder's ``config.yaml`` as plain data (what every reader of a run's config calls).
    ``store.UnreadableFile`` when it is not YAML, not a mapping, or cut short: no final newline, or the
    sections of a file klsweep wrote (every section, in RunConfig's order) stopping before the last one. A
    hand-written file may leave sections out (their defaults apply)."""
    import yaml

    path = Path(run_dir) / store.CONFIG_FILE
    try:
        text = store.read_text(path)  # a FIFO there: UnreadableFile, not a wait for ever
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


@functools.cache
def _schema() -> Any:
    """RunConfig as an OmegaConf structured config, built once (half the cost of a ``load_run``)."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(RunConfig)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(cls)


_NOT_EXACT = object()


def _exact(tp: Any, value: Any) -> Any:
    """``value`` as type ``tp`` of RunConfig's annotations when it is exactly of that shape (a section: every
    field present, no other key; a float field may hold an int, as OmegaConf reads it), else ``_NOT_EXACT``.
    The fast path of ``load_run`` (some 20x cheaper than OmegaConf's merge); anything else (a key missing, a
    string for an int, an interpolation) takes OmegaConf's path, which converts, fills in or says what is
    wrong."""
    import types
    import typing

    if dataclasses.is_dataclass(tp):
        hints = _field_types(tp)
        if not isinstance(value, dict) or value.keys() != hints.keys():
            return _NOT_EXACT
        out = {name: _exact(sub, value[name]) for name, sub in hints.items()}
        return _NOT_EXACT if _NOT_EXACT in out.values() else tp(**out)
    origin = typing.get_origin(tp)
    if origin is types.UnionType:  # X | None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _exact(inner, value)
    if origin in (list, dict):
        return copy.deepcopy(value) if type(value) is origin and _plain(value) else _NOT_EXACT
    if tp is float and type(value) in (int, float):
        return float(value)
    if tp in (int, bool, str) and type(value) is tp and _plain(value):
        return value
    return _NOT_EXACT


def _plain(value: Any) -> bool:
    """Data OmegaConf keeps as it is: no interpolation or missing-value marker in a string, string keys."""
    if isinstance(value, str):
        return "${" not in value and value != "???"
    if isinstance(value, list):
        return all(map(_plain, value))
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return value is None or type(value) in (int, float, bool)


def load_run(run_dir: str | os.PathLike) -> RunConfig:
    """The RunConfig of a run folder: its ``config.yaml`` over the schema's defaults, a key the folder predates
    read with ``LEGACY_VALUES``. The one reader of a run's config (train, eval, report, W&B).
    ``UserError`` when the folder has no config.yaml, ``store.UnreadableFile`` when it cannot be read or does
    not fit the schema."""
    path = Path(run_dir) / store.CONFIG_FILE
    if not path.exists():  # anything else there (a FIFO, a folder): read_run_file says what
        raise UserError(Problem(str(path), "no run config", "write it with `klsweep train` or `klsweep run`"))
    data = read_run_file(run_dir)
    exact = _exact(RunConfig, data)
    if exact is not _NOT_EXACT:  # every key there, every value of its field's type: what OmegaConf builds
        return exact
    from omegaconf import OmegaConf  # some 0.2 s to import: not on the fast path

    try:
        loaded = OmegaConf.create(data)
        for dotted, value in LEGACY_VALUES.items():  # a folder written before the key existed
            if OmegaConf.select(loaded, dotted, default=None) is None:
                OmegaConf.update(loaded, dotted, value, force_add=True)
        merged = OmegaConf.merge(_schema(), loaded)  # merge copies the schema: never changed
    except Exception as e:  # omegaconf's validation errors
        raise store.UnreadableFile(path, str(e).splitlines()[0], CONFIG_TODO) from e
    return OmegaConf.to_object(merged)


def write_run(run_dir: str | os.PathLike, config: Mapping[str, Any]) -> Path:
    """Write a resolved RunConfig (plain data) to ``run_dir/config.yaml``. A folder that already holds a config
    is the same run when the two differ only in keys its run id does not see (``_id_blind``: ``ID_HASHED_AT``,
    ``COSMETIC_KEYS``, ``id_omitted_at``'s at their value): its config.yaml is then rewritten with ``config``'s
    values, as ``klsweep run`` does on a resume. Any other difference is an error naming the keys (the folder's
    checkpoints belong to its own config)."""
    from omegaconf import OmegaConf

    path = Path(run_dir) / store.CONFIG_FILE
    if path.is_file():
        read_run_file(run_dir)  # UnreadableFile when it was cut short
        loaded = OmegaConf.load(path)
        omitted = id_omitted_at(config)  # a folder written before these keys existed: the same run
        for dotted, value in omitted.items():
            if OmegaConf.select(loaded, dotted, default=None) is None:
                OmegaConf.update(loaded, dotted, value, force_add=True)
        held = OmegaConf.to_container(loaded, resolve=True)
        changed = _differences(held, dict(config))
        if not changed:
            return path
        seen = [k for k, was, now in changed if not _id_blind(k, was, now, held, config)]
        if seen:
            raise UserError(
                Problem(
                    str(path),
                    f"the run folder holds a different config ({', '.join(seen)} differ): another run",
                    "another --run-dir, or the same config (keys the run id does not see, such as "
                    "train.use_vllm or train.micro_batch_size, may differ)",
                )
            )
    store.atomic_write_text(path, run_file_text(config))
    return path


_ABSENT = object()


def _differences(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, value in ``a``, value in ``b``) for each leaf where two nested configs differ (a mapping
    present on one side only counts as one key)."""
    out = []
    for k in sorted({*a, *b}, key=str):
        was, now = a.get(k, _ABSENT), b.get(k, _ABSENT)
        if isinstance(was, Mapping) and isinstance(now, Mapping):
            out += _differences(was, now, f"{prefix}{k}.")
        elif was != now:
            out.append((f"{prefix}{k}", was, now))
    return out


def _id_blind(key: str, was: Any, now: Any, held: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    """Whether the run id (``grid.run_id``) does not see ``key`` changing from ``was`` (in the folder's config
    ``held``) to ``now`` (in ``config``): a key hashed at its default, a cosmetic key (or one inside), or one
    left out of both ids at the values both hold."""
    if key in ID_HASHED_AT or is_cosmetic(key):
        return True
    before, after = id_omitted_at(held), id_omitted_at(config)
    return key in before and key in after and before[key] == was and after[key] == now
