"""Which values are valid: the bounds and choices of ``CHECKS``, the types of RunConfig, the KL values
(judged by ``klsweep.kl.KLConfig``) and the config groups' options. ``Values`` checks each distinct value of a
key once and remembers where each was first given, so that a problem found later in a whole KL section
(``check_kl``) points at the place that set the value."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from klsweep import config as config_mod
from klsweep import cost, fastgen, layout
from klsweep.errors import Problem, UserError
from klsweep.grid.schema import GROUPS, Schema, did_you_mean

# Bounds of numeric values and choices of string values (KL values are checked by klsweep.kl.KLConfig).
_POSITIVE = (lambda v: v > 0, "> 0")
_NON_NEGATIVE = (lambda v: v >= 0, ">= 0")
# transformers' SchedulerType values a GRPO run can use (tests check them against transformers;
# reduce_lr_on_plateau and greedy need eval metrics, which GRPO training has none of); what each makes of the
# warm-up and of train.trl.lr_scheduler_kwargs, and which need the latter: klsweep.trlargs.schedule_problems
LR_SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
)
CHECKS: dict[str, tuple[Any, str]] = {
    "seed": _NON_NEGATIVE,
    "train.steps": _POSITIVE,
    "train.learning_rate": _POSITIVE,
    "train.prompts_per_step": _POSITIVE,
    "train.group_size": (lambda v: v >= 2, ">= 2 (GRPO compares completions within a group)"),
    "train.max_prompt_length": _POSITIVE,
    "train.max_completion_length": _POSITIVE,
    "train.temperature": _POSITIVE,
    "train.epsilon": _NON_NEGATIVE,
    "train.max_grad_norm": _POSITIVE,
    "train.warmup_steps": _NON_NEGATIVE,
    "train.warmup_ratio": (lambda v: 0 <= v < 1, ">= 0 and < 1"),
    "train.lr_scheduler_type": (lambda v: v in LR_SCHEDULERS, ", ".join(LR_SCHEDULERS)),
    "train.micro_batch_size": (lambda v: v is None or v > 0, "null (all completions at once) or > 0"),
    "train.save_steps": _POSITIVE,
    "model.resources.gpu": (lambda v: v in cost.GPUS, ", ".join(cost.GPUS)),
    "train.keep_checkpoints": (lambda v: v is None or v > 0, "null or > 0"),
    "train.collapse_window": _POSITIVE,
    "train.collapse_fraction": (lambda v: 0 <= v <= 1, "between 0 and 1"),
    "train.collapse_z": _NON_NEGATIVE,
    "offpolicy.lag": _NON_NEGATIVE,
    "offpolicy.num_iterations": (lambda v: v >= 1, ">= 1"),
    "task.num_train": (lambda v: v is None or v > 0, "null or > 0"),
    "model.dtype": (lambda v: v in layout.COMPUTE_DTYPES, ", ".join(layout.COMPUTE_DTYPES)),
    "train.sharding": (lambda v: v in layout.SHARDING, ", ".join(layout.SHARDING)),
    "train.generation": (lambda v: v in fastgen.GENERATION_CHOICES, ", ".join(fastgen.GENERATION_CHOICES)),
    "train.numerics": (lambda v: v in fastgen.NUMERICS_CHOICES, ", ".join(fastgen.NUMERICS_CHOICES)),
    "train.vllm_importance_sampling": (
        lambda v: v in config_mod.VLLM_IS_MODES,
        ", ".join(config_mod.VLLM_IS_MODES),
    ),
    "model.resources.nodes": _POSITIVE,
    "model.resources.gpus_per_node": _NON_NEGATIVE,
    "model.resources.tasks_per_node": (lambda v: v is None or v > 0, "null (one per GPU) or > 0"),
    "model.resources.cpus_per_task": _POSITIVE,
    "model.resources.mem_gb": _POSITIVE,
    "model.resources.gpu_memory_gb": _POSITIVE,
    "model.resources.timeout_min": _POSITIVE,
    "model.resources.eval_timeout_min": _POSITIVE,
    "cluster.kind": (lambda v: v in ("local", "slurm", "debug"), "local, slurm, debug"),
    "cluster.local_jobs_per_worker": _NON_NEGATIVE,
    "cluster.signal_delay_s": (
        lambda v: v is None or 0 < v <= 65535,
        "null (derived) or 1-65535 (Slurm's bound)",
    ),
    "cluster.checkpoint_write_gbps": _POSITIVE,
    "wandb.mode": (
        lambda v: v in ("auto", "online", "offline", "disabled"),
        "auto, online, offline, disabled",
    ),
    "wandb.init_timeout_s": _POSITIVE,
    "eval.backend": (lambda v: v in ("hf", "vllm"), "hf, vllm"),
    "eval.max_model_len": (lambda v: v is None or v > 0, "null (the model's own) or > 0"),
    "eval.gpu_memory_utilization": (lambda v: 0 < v <= 1, "a fraction in (0, 1]"),
}

TRL = "train.trl"  # GRPOConfig options passed through (klsweep.trlargs)
SBATCH = "cluster.additional_parameters"  # sbatch options passed through (submitit's additional_parameters)
SBATCH_ALLOWED = "sbatch option: a string or an integer (true: a flag without value), e.g. exclude: node13"

# (ok, the converted value, the error: (what, allowed), or a list of them, when not ok)
Checked = tuple[bool, Any, Any]

# A sweep's name is a folder name (results/<name>/) and part of W&B ids: one rule wherever it comes from (a
# grid's `name:`, a run file's `name:`, a `name=` override).
# ASCII only: the name is also the Slurm job's name and W&B's group, and a folder name the same on every file
# system (no Unicode normalisation to differ between two machines).
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
NAME_MAX = 100
NAME_ALLOWED = f"ASCII letters A-Z a-z, digits 0-9, . _ - (not first), at most {NAME_MAX} characters"


def name_problem(value: Any) -> str | None:
    """What is wrong with ``value`` as a sweep's name, or None."""
    if isinstance(value, bool):  # YAML 1.1: an unquoted off, no, false (on, yes, true) is a boolean
        words = "on, yes or true" if value else "off, no or false"
        first = words.split(",")[0]
        said = f"YAML reads an unquoted {words} as {value}"
        return f'{value!r} is not a valid sweep name: {said}: quote it (name: "{first}")'
    if isinstance(value, int | float):
        said = "YAML reads an unquoted number as one"
        return f'{value!r} is not a valid sweep name: {said}: quote it (name: "...")'
    if not isinstance(value, str) or not NAME_PATTERN.match(value):
        bad = sorted(set(re.sub(r"[A-Za-z0-9._-]", "", value))) if isinstance(value, str) else []
        which = f": {', '.join(map(repr, bad))} not allowed" if bad else ""
        return f"{value!r} is not a valid sweep name (a folder name: no path){which}"
    if len(value) > NAME_MAX:
        return f"a sweep name of {len(value)} characters is too long"
    return None


def check_group(key: str, raw: Any, options: list[str]) -> Checked:
    """One choice of config group ``key`` among its ``options``."""
    if key == "preset" and raw is None:
        return True, None, ""
    if not isinstance(raw, str) or raw not in options:
        hint = did_you_mean(str(raw), options)
        return False, None, (f"{raw!r} is not an option of config group {key!r}{hint}", ", ".join(options))
    return True, raw, ""


def check_leaf(schema: Schema, key: str, raw: Any) -> Checked:
    """One value of a RunConfig key: its type, then KL values with KLConfig, then ``CHECKS`` (``name``:
    ``name_problem``)."""
    from omegaconf.errors import OmegaConfBaseException

    if key == "name":
        problem = name_problem(raw)
        return (False, None, (problem, NAME_ALLOWED)) if problem else (True, raw, "")

    try:
        value = schema.convert(key, raw)
    except (OmegaConfBaseException, ValueError) as e:
        msg = str(e).splitlines()[0]
        return False, None, (f"{raw!r} is not a valid value: {msg}", schema.type_name(key))
    if key == TRL or key.startswith(TRL + "."):  # GRPOConfig options: names and types (klsweep.trlargs)
        return check_trl(key, value)
    if key == SBATCH or key.startswith(SBATCH + "."):
        return check_sbatch(key, value)
    if key.startswith("kl."):  # klsweep.kl.KLConfig judges KL values: this one, with valid defaults
        from klsweep.kl import KLConfig

        probe = dict(vars(config_mod.KLSection()), **{key[3:]: value})
        try:
            KLConfig(**probe)
        except UserError as e:
            return False, None, (f"{value!r} is not valid", e.problems[0].allowed)
    check = CHECKS.get(key)
    if check is not None:
        predicate, allowed = check
        try:
            good = predicate(value)
        except TypeError:
            good = False
        if not good:
            return False, None, (f"{value!r} is out of range", allowed)
    return True, value, ""


def check_trl(key: str, value: Any) -> Checked:
    """A value of ``train.trl`` (the whole mapping) or of ``train.trl.NAME[.inner]`` (one option, or a key
    inside a mapping option) checked against GRPOConfig; every problem of a mapping at once."""
    from klsweep import trlargs

    path = key.split(".")[2:]
    options = value
    for part in reversed(path):
        options = {part: options}
    checked, problems = trlargs.check(options)
    if problems:
        return (
            False,
            None,
            [(f"{TRL}.{n}: {what}" if n and not path else what, ok) for n, what, ok in problems],
        )
    for part in path:
        checked = checked[part]
    return True, checked, ""


def check_sbatch(key: str, value: Any) -> Checked:
    """A value of ``cluster.additional_parameters`` (sbatch option -> value) or of one of its options."""
    options = value if key == SBATCH else {key[len(SBATCH) + 1 :]: value}
    if not isinstance(options, dict):
        return False, None, (f"{value!r} is not a mapping", SBATCH_ALLOWED)
    bad = [
        (problem, config_mod.SBATCH_OPTION_ALLOWED)
        for k in options
        if (problem := config_mod.sbatch_option_problem(k))
    ]
    bad += [
        (f"{SBATCH}.{k}: {v!r} is not valid" if key == SBATCH else f"{v!r} is not valid", SBATCH_ALLOWED)
        for k, v in options.items()
        if not config_mod.sbatch_option_problem(k) and not (isinstance(v, str | int) and v is not False)
    ]
    return (False, None, bad) if bad else (True, value, "")


class Values:
    """Validates and converts the values of keys, each distinct value once, recording problems."""

    def __init__(self, schema: Schema, group_options: Callable[[str], list[str]], problems: list[Problem]):
        self.schema = schema
        self.group_options = group_options
        self.problems = problems
        self.cache: dict[tuple[str, str], Checked] = {}
        self.sources: dict[tuple[str, Any], str] = {}  # (key, value) -> where it was first given

    def value(self, key: str, raw: Any, where: str) -> tuple[bool, Any]:
        """Validate (once per distinct value) and convert one value of ``key``."""
        cache_key = (key, json.dumps(raw, sort_keys=True, default=repr) + type(raw).__name__)
        hit = self.cache.get(cache_key)
        if hit is None:
            hit = self._check(key, raw)
            self.cache[cache_key] = hit
        ok, value, error = hit
        if not ok:
            for e in error if isinstance(error, list) else [error]:
                self.problems.append(
                    Problem(where, e[0], e[1]) if isinstance(e, tuple) else Problem(where, e)
                )
            return False, None
        self.sources.setdefault((key, hashable(value)), where)
        return True, value

    def _check(self, key: str, raw: Any) -> Checked:
        if key in GROUPS:
            return check_group(key, raw, self.group_options(key))
        return check_leaf(self.schema, key, raw)

    def check_kl(self, configs: Iterable[dict]) -> None:
        """Validate each distinct KL section once with klsweep.kl.KLConfig."""
        from klsweep.kl import KLConfig

        seen: set[tuple] = set()
        reported: set[tuple[str, str]] = set()
        for config in configs:
            kl = config["kl"]
            key = tuple(kl.items())  # in the composed config's order (another order: validated again)
            if key in seen:
                continue
            seen.add(key)
            try:
                KLConfig(**kl)
            except UserError as e:
                for p in e.problems:
                    k = f"kl.{p.where}"
                    where = self.sources.get((k, hashable(kl.get(p.where))), f"{k} (set by a config group)")
                    if (where, p.what) not in reported:
                        reported.add((where, p.what))
                        self.problems.append(Problem(where, f"{k}: {p.what}", p.allowed))


def hashable(v: Any) -> Any:
    """``v`` as a set member or dict key: lists and mappings as their canonical JSON."""
    return json.dumps(v, sort_keys=True) if isinstance(v, list | dict) else v
