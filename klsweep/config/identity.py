"""Which configurations are the same run: the keys a run's id leaves out (cosmetic ones, ones added later at
the value runs before them trained with, ones that change how a run is computed, not what), the values a
folder written before a key existed trained with (``LEGACY_VALUES``), and how a run without KL reads."""

from __future__ import annotations

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
    out of the id wherever both values are the same computation (on-policy, shaped mode, no KL in the reward;
    whatever it holds: the ids of runs written before the key existed stand), and otherwise while it holds
    ``behavior``, what those runs trained with; so it is in the id only where ``current`` changes the run."""
    kl = config.get("kl") or {}
    changes_nothing = (
        on_policy(config)
        or kl.get("reward_mode") == "shaped"
        or kl.get("placement") == "loss"
        or not kl.get("beta")
    )
    own = kl.get("reward_logp", "behavior")
    return {**ID_OMITTED_AT, "kl.reward_logp": own if changes_nothing else "behavior"}


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


def kl_off_hashed_at(config: Mapping[str, Any]) -> dict[str, Any]:
    """The KL-only keys (``KL_ONLY_KEYS``) at their defaults when a resolved RunConfig (nested plain data) has
    ``kl.beta`` 0, else nothing: hashed at that value in the run's id (``grid.run_id``), so the no-KL runs of a
    grid that crosses beta 0 with estimators or placements are one run per seed. The defaults are what the no-KL
    runs of the committed studies hold: their ids stand (docs/DESIGN.md, "Run configuration")."""
    if (config.get("kl") or {}).get("beta") or (config.get("kl") or {}).get("beta_final"):
        return {}
    defaults = KLSection()
    return {key: getattr(defaults, key.split(".", 1)[1]) for key in KL_ONLY_KEYS}


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
