"""Typed configuration of one klsweep run: the single source of truth for every key.

Hydra composes YAML config groups (``klsweep/conf/{model,task,cluster,eval}``) on top of ``RunConfig``;
the dotted keys of these dataclasses (``kl.estimator``, ``offpolicy.lag``, ``train.steps`` ...) are the
public vocabulary of grid files and command-line overrides. ``schema``: ``RunConfig`` and its sections, each
field with its help; ``identity``: which configurations are the same run (the keys a run id leaves out, the
values old folders trained with, how a run without KL reads); ``runfile``: a run folder's ``config.yaml``,
read by ``load_run`` (typed; the one reader) and written by ``write_run``. More: docs/DESIGN.md (Run
configuration).
"""

from klsweep.config.identity import (
    COSMETIC_KEYS,
    ID_HASHED_AT,
    ID_OMITTED_AT,
    KL_FORMS,
    KL_ONLY_KEYS,
    LEGACY_VALUES,
    NO_KL,
    id_omitted_at,
    is_cosmetic,
    kl_off_hashed_at,
    on_policy,
    without_kl_when_off,
)
from klsweep.config.runfile import (
    CONFIG_TODO,
    load_run,
    read_run_file,
    run_differences,
    run_file_text,
    write_run,
)
from klsweep.config.schema import (
    COLLAPSE_Z,
    SBATCH_OPTION,
    SBATCH_OPTION_ALLOWED,
    VLLM_IS_DEFAULT,
    VLLM_IS_MODES,
    Architecture,
    ClusterSection,
    EvalSection,
    KLSection,
    ModelSection,
    OffPolicySection,
    Resources,
    RunConfig,
    TaskSection,
    TrainSection,
    WandbSection,
    key,
    sbatch_option_problem,
    section,
    tasks_per_node,
)

__all__ = [
    "RunConfig",
    "Resources",
    "Architecture",
    "ModelSection",
    "TaskSection",
    "TrainSection",
    "KLSection",
    "OffPolicySection",
    "EvalSection",
    "ClusterSection",
    "WandbSection",
    "key",
    "section",
    "tasks_per_node",
    "COLLAPSE_Z",
    "VLLM_IS_MODES",
    "VLLM_IS_DEFAULT",
    "SBATCH_OPTION",
    "SBATCH_OPTION_ALLOWED",
    "sbatch_option_problem",
    "KL_FORMS",
    "LEGACY_VALUES",
    "ID_OMITTED_AT",
    "ID_HASHED_AT",
    "COSMETIC_KEYS",
    "NO_KL",
    "KL_ONLY_KEYS",
    "on_policy",
    "id_omitted_at",
    "kl_off_hashed_at",
    "without_kl_when_off",
    "is_cosmetic",
    "CONFIG_TODO",
    "run_file_text",
    "read_run_file",
    "load_run",
    "write_run",
    "run_differences",
]
