"""Which configurations are the same run: the keys a run's id leaves out (cosmetic ones, ones added later at
the value runs before them trained with, ones that change how a run is computed, not what), the values a
folder written before a key existed trained with (``LEGACY_VALUES``), and how a run without KL reads."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from klsweep.config.schema import COLLAPSE_Z, VLLM_IS_DEFAULT, KLSection

# The frameworks' KL forms (klsweep.kl; docs/KL.md, "What each framework's KL does") at their defaults, which
# are klsweep's own computation: runs before them trained with these values, and their ids leave them out.
KL_FORMS: dict[str, Any] = {
    "kl.importance_gradient": False,
    "kl.straight_through": False,
    "kl.unbiased_gradient": False,
    "kl.log_ratio_clamp": 0.0,
    "kl.value_clamp": 0.0,
    "kl.clamp_weighted": False,
    "kl.clamp_detaches_weight": False,
    "kl.beta_final": None,
    "kl.beta_final_at": "last",
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
    "train.numerics": "exact",
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
    "train.numerics": "exact",
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
    # klsweep.fastgen samples the very tokens HF generate samples (tests/unit/test_fastgen.py): the same run
    "train.generation",
)


def is_cosmetic(key: str) -> bool:
    """Whether the dotted ``key`` is one of ``COSMETIC_KEYS`` or inside one (the run id does not see it)."""
    return any(key == c or key.startswith(c + ".") for c in COSMETIC_KEYS)
