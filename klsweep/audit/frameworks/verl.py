"""verl's reader: its config's KL keys mapped onto klsweep's (verl 0.9.1)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from klsweep import grpo
from klsweep.audit.frameworks.reading import Reading, Terms, term
from klsweep.errors import Problem

NAME = "verl"
VERSION = "verl 0.9.1"
KIND = "yaml"  # a YAML mapping or Hydra overrides
# the top-level sections of verl 0.9.1's config (verl/trainer/config/ppo_trainer.yaml, _generated_ppo_trainer.yaml)
SECTIONS = frozenset(
    ("actor_rollout_ref", "algorithm", "critic", "custom_reward_function", "data", "defaults", "distillation",
     "global_profiler", "ray_kwargs", "reward", "reward_model", "sandbox_fusion", "trainer", "transfer_queue")
)  # fmt: skip


def read(r: Reading) -> Terms:
    """verl 0.9.1 (verl/trainer/config/_generated_ppo_trainer.yaml, verl/trainer/ppo/core_algos.py kl_penalty):
    the reward's algorithm.use_kl_in_reward / kl_penalty / kl_ctrl.kl_coef (from old_log_probs), the loss's
    actor_rollout_ref.actor.use_kl_loss / kl_loss_type / kl_loss_coef; k3 (low_var_kl) clamped 20/10, a "+"
    suffix the straight-through k2 gradient."""
    types = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
    allowed = (*types, *(f"{t}+" for t in types), "full")

    def form(key: str, default: str) -> tuple[str, dict[str, Any]] | None:
        name = r.choice(key, default, allowed)
        used = key.startswith("algorithm") and in_reward or key.startswith("actor") and in_loss
        if name == "full":
            if used:
                r.warnings.append(f"{key} full: the full-vocabulary KL, not a sample estimate; not audited")
            return None
        base = name.rstrip("+")
        forms: dict[str, Any] = {"log_ratio_clamp": 20.0, "value_clamp": 10.0} if types[base] == "k3" else {}
        if name.endswith("+") and types[base] != "k2":
            forms["straight_through"] = True
        return types[base], forms

    if not any(k.lstrip("+~").split(".", 1)[0] in SECTIONS for k in r.settings):
        r.problems.append(
            Problem(
                "the file",
                "sets none of verl's config sections (a launcher's or another tool's file: verl reads only the "
                "overrides of the command it runs)",
                "verl's own config or its launch script (python3 -m verl.trainer.main_ppo key=value ...)",
            )
        )
        return [], False
    _known_keys(r)
    algorithm = r.get("algorithm.adv_estimator", "gae", str)
    actor = "actor_rollout_ref.actor."
    in_reward, in_loss = (
        r.get("algorithm.use_kl_in_reward", False, bool),
        r.get(f"{actor}use_kl_loss", False, bool),
    )
    kind = r.choice("algorithm.kl_ctrl.type", "fixed", ("fixed", "adaptive"))
    reward_beta, loss_beta = (
        r.get("algorithm.kl_ctrl.kl_coef", 0.001, float),
        r.get(f"{actor}kl_loss_coef", 0.001, float),
    )
    r.get("algorithm.kl_ctrl.target_kl", 0.1, float), r.get("algorithm.kl_ctrl.horizon", 10000, int)
    reward_form, loss_form = form("algorithm.kl_penalty", "kl"), form(f"{actor}kl_loss_type", "low_var_kl")
    terms = []
    if in_reward and reward_form is not None:
        if kind == "adaptive":
            r.warnings.append(
                f"algorithm.kl_ctrl.type adaptive: audited at its initial kl_coef {reward_beta:g}"
            )
        terms.append(("reward", term("reward", reward_form[0], reward_beta, **reward_form[1])))
    if in_loss and loss_form is not None:
        terms.append(("loss", term("loss", loss_form[0], loss_beta, **loss_form[1])))
    return terms, _advantage(r, algorithm)


# verl's critic-free estimators the GRPO audit does not model (verl/trainer/ppo/core_algos.py)
UNMODELLED = (
    "grpo_passk",
    "opo",
    "gpg",
    "gdpo",
    "remax",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
)


def _advantage(r: Reading, algorithm: str) -> bool:
    """The advantage estimator ``algorithm.adv_estimator`` selects (core_algos.py; the KL in the reward is in
    token_level_rewards before it, ray_trainer.py apply_kl_penalty): ``r.advantage``, and whether the GRPO
    audit applies (False for GAE and for an estimator it cannot model, said)."""
    norm = r.get("algorithm.norm_adv_by_std_in_grpo", True, bool)
    gamma = r.get("algorithm.gamma", 1.0, float)
    if algorithm in ("grpo", "grpo_vectorized"):  # (score - mean) / (std + 1e-6), or Dr.GRPO's no std
        r.advantage = grpo.Advantage("group", "group" if norm else "none", 1e-6)
    elif algorithm in ("rloo", "rloo_vectorized"):  # score x n/(n-1) - mean x n/(n-1): leave-one-out
        r.advantage = grpo.Advantage("leave_one_out", "none")
    elif algorithm == "reinforce_plus_plus_baseline":  # score - group mean, whitened (masked_whiten)
        r.advantage = grpo.Advantage("group", "none", whiten="unbiased")
    elif algorithm == "reinforce_plus_plus" and gamma == 1.0:  # per-token returns, whitened
        r.advantage = grpo.Advantage("none", "none", returns="token", whiten="unbiased")
    elif algorithm in (*UNMODELLED, "reinforce_plus_plus"):
        why = f"algorithm.gamma {gamma:g}" if algorithm == "reinforce_plus_plus" else algorithm
        r.warnings.append(
            f"algorithm.adv_estimator {algorithm}: the GRPO audit cannot model {why}; the plain estimator "
            "audit alone"
        )
    return r.advantage is not None


# every key of verl 0.9.1's composed configs (ppo_trainer, ppo_megatron_trainer), from its wheel (tests/peer/loaders/
# verl.py config_keys; tests/peer/test_corpus.py checks it is the loader's)
KEYS_FILE = Path(__file__).parents[2] / "assets" / "frameworks" / "verl-0.9.1-keys.json"


@cache
def config_keys() -> dict[str, frozenset[str]]:
    data = json.loads(KEYS_FILE.read_text())
    return {name: frozenset(keys) for name, keys in data["configs"].items()}


def _known_keys(r: Reading) -> None:
    """A key the launch command overrides (``key=value``, not ``+key``: an addition) that verl 0.9.1's config
        (``--config-name``, ppo_trainer by default) does not have is refused, as Hydra refuses it (``Could not
        override 'key'``): verl exits before training (a key of an older verl, such as megatron.grad_offload, or a
        misspelling). A file with its own ``defaults:``, or a ``--config-path`` other than main_ppo's own, composes
    other configs: not checked."""
    name = str(r.settings.get("--config-name", "ppo_trainer")).strip("'\"").removesuffix(".yaml")
    known = config_keys().get(name)
    path = str(r.settings.get("--config-path", "config")).strip("'\"").rstrip("/")
    if (
        path not in ("config", "verl/trainer/config")
        or known is None
        or "defaults" in r.settings
        or any(k.startswith("defaults.") for k in r.settings)
    ):
        return
    unknown = sorted(k for k in r.settings if not k.startswith("-") and k not in known and k not in r.added)
    for key in unknown:
        r.problems.append(
            Problem(
                key,
                f"not a key of {VERSION}'s {name} config: {VERSION} refuses the file before training (Hydra: "
                f"Could not override '{key}'); a key of an older verl or a misspelling",
                f"{VERSION}'s name for it, or +{key}=... to add it; or audit with the verl version the file was "
                "written for",
            )
        )
