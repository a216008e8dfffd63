"""``train.trl``: TRL ``GRPOConfig`` options passed through as written, merged into the trainer's GRPOConfig
after klsweep's own arguments (``klsweep.job``).

Owns the one table of the GRPOConfig options klsweep sets itself (``KLSWEEP_SETS``: TRL's name -> the klsweep
key that sets it, or why klsweep owns it); they are refused in ``train.trl`` (``train.trl.num_generations=8``:
"use train.group_size") and as keys of ``train`` (``train.num_generations=8``: TRL's name for
``train.group_size``, refused with the same words). Also the check of a pass-through mapping against
GRPOConfig's dataclass fields: each name (a did-you-mean among them) and the type of each value; and
``schedule_problems``: what transformers' learning-rate schedule (``train.lr_scheduler_type``) makes of the keys
beside it, refused where one would do nothing (a warm-up with ``constant``) or the run could not start, and
``schedule_text``, the schedule as ``klsweep plan`` shows it.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from klsweep import store

# GRPOConfig option -> the klsweep key that sets it (dotted), or "(...)": why klsweep sets it itself. Every
# argument ``klsweep.job`` gives GRPOConfig is listed (it refuses to train otherwise).
KLSWEEP_SETS: dict[str, str] = {
    "num_generations": "train.group_size",
    "max_steps": "train.steps",
    "learning_rate": "train.learning_rate",
    "lr_scheduler_type": "train.lr_scheduler_type",
    "warmup_steps": "train.warmup_steps",
    "max_grad_norm": "train.max_grad_norm",
    "per_device_train_batch_size": "train.micro_batch_size",
    "gradient_accumulation_steps": "train.micro_batch_size",
    "generation_batch_size": "train.prompts_per_step",
    "steps_per_generation": "train.prompts_per_step",
    "max_completion_length": "train.max_completion_length",
    "temperature": "train.temperature",
    "loss_type": "train.loss_type",
    "epsilon": "train.epsilon",
    "scale_rewards": "train.scale_rewards",
    "save_steps": "train.save_steps",
    "save_total_limit": "train.keep_checkpoints",
    "use_vllm": "train.use_vllm",
    "vllm_max_model_length": "train.max_prompt_length",
    "vllm_importance_sampling_mode": "train.vllm_importance_sampling",
    "vllm_importance_sampling_correction": "train.vllm_importance_sampling",
    "fsdp": "train.sharding",
    "fsdp_config": "train.sharding",
    "beta": "kl.beta",
    "use_bias_correction_kl": "kl.importance and kl.importance_gradient (the trl preset)",
    "num_iterations": "offpolicy.num_iterations",
    "seed": "seed",
    "data_seed": "seed",
    "bf16": "model.dtype",
    "fp16": "model.dtype",
    "model_init_kwargs": "model.path",
    "report_to": "wandb.mode",
    "output_dir": "(the run folder's checkpoints/)",
    "run_name": "(the run id)",
    "use_cpu": "(klsweep.layout: a GPU when there is one)",
    "ddp_backend": "(klsweep.layout: gloo on CPUs)",
    "activation_checkpointing": "(klsweep.layout: on GPUs)",
    "gradient_checkpointing": "(klsweep.layout: activation checkpointing on GPUs)",
    "ddp_find_unused_parameters": "(klsweep.layout)",
    "vllm_mode": "(colocate)",
    "logging_steps": "(one metrics row per step)",
    "save_strategy": "(train.save_steps)",
    "disable_tqdm": "(klsweep prints its own progress)",
    "log_completions": "(metrics.jsonl)",
}


# What transformers' get_scheduler (Trainer.create_scheduler) makes of the keys beside train.lr_scheduler_type:
# ``constant`` is given neither the warm-up nor train.trl.lr_scheduler_kwargs, ``constant_with_warmup`` the
# warm-up only, every other schedule both; some fail without their arguments. tests/unit/test_schedule.py checks
# this table against transformers' own get_scheduler.
NO_WARMUP = ("constant",)
NO_KWARGS = ("constant", "constant_with_warmup")
NEEDS_KWARGS = {  # schedule -> the lr_scheduler_kwargs it needs (one of them)
    "cosine_with_min_lr": ("min_lr", "min_lr_rate"),
    "cosine_warmup_with_min_lr": ("min_lr", "min_lr_rate"),
    "warmup_stable_decay": ("num_decay_steps",),
}
WITH_WARMUP = {"constant": "constant_with_warmup"}  # the same schedule after a linear warm-up


def schedule_problems(train: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """What the learning-rate schedule of a run's ``train`` section makes of the keys beside it, as (key, what,
    allowed): a warm-up (``warmup_steps``/``warmup_ratio`` > 0) a schedule ignores (``constant``: the learning
    rate would be ``train.learning_rate`` from the first step, whatever the warm-up says), schedule arguments
    (``train.trl.lr_scheduler_kwargs``) one ignores, and the ones a schedule needs to start."""
    schedule = train.get("lr_scheduler_type")
    kwargs = (train.get("trl") or {}).get("lr_scheduler_kwargs")
    found = []
    for key in ("warmup_steps", "warmup_ratio"):
        if train.get(key) and schedule in NO_WARMUP:
            found.append(
                (
                    f"train.{key}",
                    f"{train[key]} with train.lr_scheduler_type {schedule}, which has no warm-up (transformers "
                    f"passes it none: the learning rate would be train.learning_rate from the first step)",
                    f"train.lr_scheduler_type={WITH_WARMUP[schedule]} (the same after a linear warm-up), or "
                    f"train.{key}=0",
                )
            )
    if kwargs and schedule in NO_KWARGS:
        found.append(
            (
                "train.trl.lr_scheduler_kwargs",
                f"{kwargs} with train.lr_scheduler_type {schedule}, which takes no arguments (transformers "
                "passes it none)",
                "none, or a schedule that takes them",
            )
        )
    need = NEEDS_KWARGS.get(schedule)
    if need and not (isinstance(kwargs, Mapping) and any(k in kwargs for k in need)):
        found.append(
            (
                "train.trl.lr_scheduler_kwargs",
                f"{kwargs or 'none'} for train.lr_scheduler_type {schedule}, which needs {' or '.join(need)} "
                "(the run would fail at its start)",
                f"train.trl.lr_scheduler_kwargs={{{need[0]}: ...}}",
            )
        )
    return found


def schedule_text(train: Mapping[str, Any]) -> str:
    """The learning rate and its schedule as ``klsweep plan`` shows them: ``3e-04 constant``,
    ``1e-04 constant_with_warmup (warm-up 30 steps)``, ``1e-05 linear (warm-up 10% of the steps)``; a
    warm-up the schedule ignores is not shown (``plan`` refuses it: ``schedule_problems``)."""
    text = f"{float(train['learning_rate']):.0e} {train['lr_scheduler_type']}"
    if train["lr_scheduler_type"] in NO_WARMUP:
        return text
    if train.get("warmup_steps"):
        return f"{text} (warm-up {train['warmup_steps']} steps)"
    if train.get("warmup_ratio"):
        return f"{text} (warm-up {100 * float(train['warmup_ratio']):g}% of the steps)"
    return text


def vllm_importance_sampling(mode: str) -> dict[str, Any]:
    """GRPOConfig's arguments for ``train.vllm_importance_sampling``: TRL's mode, or "off" (no correction)."""
    if mode == "off":
        return {"vllm_importance_sampling_correction": False}
    return {"vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": mode}


def owner(name: str) -> tuple[str, str] | None:
    """What sets the GRPOConfig option ``name`` when klsweep does: (what, allowed) of a refusal, else None."""
    source = KLSWEEP_SETS.get(name)
    if source is None:
        return None
    if source.startswith("("):
        return f"{name!r} is set by klsweep {source}", "a GRPOConfig option klsweep does not set"
    return f"{name!r} is set by klsweep from {source}", f"use {source}"


# GRPOConfig's settable fields and their types (``field_types``), generated from the locked TRL: checking a grid's
# ``train.trl`` keys needs no import of TRL (transformers, torch: seconds). Another installed TRL gets its own
# table, generated once and cached (``KLSWEEP_CACHE``). Regenerate after changing the lock: ./dev.sh lock.
FIELDS_FILE = Path(__file__).parent / "trl_fields.json"


def trl_version() -> str | None:
    """The installed TRL's version (its metadata: nothing imported), or None."""
    from importlib import metadata

    try:
        return metadata.version("trl")
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def grpo_fields() -> dict[str, Any]:
    """GRPOConfig's settable dataclass fields -> their type (``field_types``' form) for the installed TRL: the
    shipped table when it is the locked TRL, else the one cached for its version, else generated (imports trl:
    seconds) and cached."""
    installed = trl_version()
    shipped = _read_table(FIELDS_FILE)
    if shipped is not None and shipped["trl"] == installed:
        return shipped["fields"]
    cached = store.cache_dir() / "trl" / f"grpo-fields-{installed}.json"
    table = _read_table(cached)
    if table is not None and table["trl"] == installed:
        return table["fields"]
    table = fields_table()
    with contextlib.suppress(OSError):  # a read-only cache: generated again next time
        store.write_json(cached, table)
    return table["fields"]


def _read_table(path: Path) -> dict[str, Any] | None:
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(table, dict) and isinstance(table.get("fields"), dict) and "trl" in table
    return table if ok else None


def fields_table() -> dict[str, Any]:
    """``{"trl": version, "fields": {name: type}}`` of the installed TRL's GRPOConfig (imports trl): what
    ``FIELDS_FILE`` holds for the locked TRL."""
    import dataclasses
    import typing

    from trl import GRPOConfig

    hints = typing.get_type_hints(GRPOConfig)
    fields = {f.name: field_type(hints[f.name]) for f in dataclasses.fields(GRPOConfig) if f.init}
    return {"trl": trl_version(), "fields": fields}


def write_fields_file() -> None:
    """Write ``FIELDS_FILE`` from the installed TRL (./dev.sh lock, after the lock is resolved)."""
    table = fields_table()
    lines = [f"  {json.dumps(name)}: {json.dumps(tp)}" for name, tp in sorted(table["fields"].items())]
    fields = "{\n" + ",\n".join(lines) + "\n}"
    FIELDS_FILE.write_text(f'{{"trl": {json.dumps(table["trl"])}, "fields": {fields}}}\n')


def field_type(tp: Any) -> Any:
    """An annotation as JSON, what ``accepts`` and ``type_name`` read: ``"any"``, ``"none"``, ``"bool"``,
    ``"int"``, ``"float"``, ``"str"``, ``{"union": [...]}``, ``{"literal": [values]}``, ``{"enum": [values]}``,
    ``{"list": item or null}``, ``{"dict": name}``, ``{"object": name}`` (a Python object, not written in
    YAML)."""
    origin = get_origin(tp)
    if tp is Any:
        return "any"
    if origin in (Union, types.UnionType):
        return {"union": [field_type(a) for a in get_args(tp)]}
    if origin is Literal:
        return {"literal": list(get_args(tp))}
    if tp is type(None):
        return "none"
    if tp in (bool, int, float, str):
        return tp.__name__
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if tp is list or origin is list:
        args = get_args(tp)
        return {"list": field_type(args[0]) if args else None}
    if tp is dict or origin is dict:
        return {"dict": _annotation_name(tp)}
    return {"object": _annotation_name(tp)}


def _annotation_name(tp: Any) -> str:
    if get_origin(tp) is not None:
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", str(tp))


def check(options: Any) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """A ``train.trl`` mapping checked against GRPOConfig: (the options, ints given for float options made
    floats; every problem as (option, what, allowed)). An empty mapping imports nothing."""
    if not isinstance(options, Mapping):
        return {}, [("", f"{options!r} is not a mapping", "train.trl: {option: value} (GRPOConfig options)")]
    if not options:
        return {}, []
    known = grpo_fields()
    out: dict[str, Any] = {}
    problems: list[tuple[str, str, str]] = []
    for name, value in options.items():
        name = str(name)
        refused = owner(name)
        if refused is not None:
            problems.append((name, *refused))
            continue
        tp = known.get(name)
        if tp is None:
            problems.append((name, *unknown(name)))
            continue
        if not accepts(tp, value):
            problems.append((name, f"{value!r} is not a valid value", type_name(tp)))
            continue
        takes_int = accepts(tp, 0) and not accepts(tp, 0.5)
        out[name] = float(value) if _is_int(value) and not takes_int and accepts(tp, 0.5) else value
    return out, problems


def unknown(name: str) -> tuple[str, str]:
    """(what, allowed) of a name that is no GRPOConfig option, with a did-you-mean."""
    import difflib

    near = difflib.get_close_matches(name, [*grpo_fields(), *KLSWEEP_SETS], n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return f"{name!r} is not a GRPOConfig option{hint}", "a field of trl.GRPOConfig"


def merged(own: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """klsweep's own GRPOConfig arguments, then the pass-through options. ``RuntimeError`` when klsweep sets an
    option ``KLSWEEP_SETS`` does not list (the table is the one place that says which are klsweep's)."""
    from klsweep.errors import Problem, UserError

    unlisted = sorted(set(own) - set(KLSWEEP_SETS))
    if unlisted:
        raise RuntimeError(f"klsweep.trlargs.KLSWEEP_SETS does not list {', '.join(unlisted)}")
    checked, problems = check(options)
    if problems:
        raise UserError([Problem(f"train.trl.{n}" if n else "train.trl", w, a) for n, w, a in problems])
    return {**own, **checked}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def accepts(tp: Any, v: Any) -> bool:
    """Whether a YAML value ``v`` is a value of type ``tp`` (``field_type``'s form; an enum: one of its
    values)."""
    if isinstance(tp, str):
        if tp == "any":
            return True
        if tp == "none":
            return v is None
        if tp == "bool":
            return isinstance(v, bool)
        if tp == "int":
            return _is_int(v)
        if tp == "float":
            return _is_int(v) or isinstance(v, float)
        return tp == "str" and isinstance(v, str)
    ((kind, arg),) = tp.items()
    if kind == "union":
        return any(accepts(a, v) for a in arg)
    if kind == "literal":
        return any(v == a and type(v) is type(a) for a in arg)
    if kind == "enum":
        return v in arg
    if kind == "list":
        return isinstance(v, list) and (arg is None or all(accepts(arg, x) for x in v))
    if kind == "dict":
        return isinstance(v, dict)
    return False  # a Python object (e.g. accelerate's ParallelismConfig): not written in YAML


def type_name(tp: Any) -> str:
    """A type (``field_type``'s form) as a user reads it: ``int | None``, ``str``, ``list[float]``, ``False``."""
    if isinstance(tp, str):
        return {"none": "None", "any": "Any"}.get(tp, tp)
    ((kind, arg),) = tp.items()
    if kind == "union":
        return " | ".join(type_name(a) for a in arg)
    if kind == "literal":
        return " | ".join(repr(a) for a in arg)
    if kind == "enum":
        return ", ".join(str(a) for a in arg)
    if kind == "list":
        return "list" if arg is None else f"list[{type_name(arg)}]"
    return arg
