"""areal's reader: its config's KL keys mapped onto klsweep's (areal 1.0.4)."""

from __future__ import annotations

from klsweep.audit.frameworks.reading import Reading, Terms, term
from klsweep.errors import Problem

NAME = "areal"
VERSION = "areal 1.0.4"
KIND = "yaml"  # a YAML mapping or Hydra overrides
# keys of older AReaL versions that 1.0.4 refuses (api/cli_args.py _LEGACY_REJECTION_SAMPLING_KEYS, checked under
# actor and teacher by _migrate_legacy_rejection_sampling; behav_imp_weight_cap, the name before them, is no
# field of PPOActorConfig: OmegaConf's ConfigKeyError)
LEGACY = ("behave_imp_weight_cap", "behave_imp_weight_mode", "behav_imp_weight_cap")


def read(r: Reading) -> Terms:
    """AReaL 1.0.4 (areal/api/cli_args.py PPOActorConfig, trainer/ppo/actor.py, utils/data.py KLEstimator):
    actor.kl_ctl (0.1) x actor.kl_estimator (k1) of the old policy's log-probs, clamped at +-10, in the reward."""
    for key in sorted(r.settings):
        section, _, name = key.partition(".")
        if section in ("actor", "teacher") and name in LEGACY:
            r.problems.append(
                Problem(
                    key,
                    f"a key of an older AReaL: {VERSION} refuses it (its rejection_sampling sub-config replaces "
                    "behave_imp_weight_*)",
                    f"{section}.rejection_sampling: {{level, action, metric, upper}} (AReaL's migration message), "
                    "or the AReaL version this file was written for",
                )
            )
    sections = {k.split(".", 1)[0] for k in r.settings}
    if "teacher.backend" in r.settings:  # TeacherConfig has engine_type, no backend, in 1.0.4
        r.problems.append(
            Problem(
                "teacher.backend",
                f"a key of another AReaL version: {VERSION}'s TeacherConfig has none",
                "the AReaL version this file was written for",
            )  # fmt: skip
        )
    if (
        "rollout" in sections and "rollout.backend" not in r.settings
    ):  # InferenceEngineConfig.backend: MISSING
        r.problems.append(
            Problem(
                "rollout.backend",
                f"missing: {VERSION} requires it (InferenceEngineConfig)",
                "a backend and its parallelism, e.g. sglang:d4 or vllm:d2t4",
            )  # fmt: skip
        )
    rl = bool(
        sections & {"rollout", "gconfig"}
    )  # PPOConfig's generation sections: SFT/RW/DPO configs have none
    reference = any((k == "ref" and v is not None) or k.startswith("ref.") for k, v in r.settings.items())
    r.values["reference"] = rl and reference
    if "actor" not in sections:
        r.no_reference = (
            "no actor: section: AReaL trains no policy from this file (a launcher whose training command and "
            "config are elsewhere, or a rollout-only file)"
        )
        return [], False
    if not rl:
        r.no_reference = (
            "no rollout: or gconfig: section: an SFT, reward-model or DPO config (DPO's ref: is its loss's "
            "reference, not a KL penalty), which AReaL trains without a policy-gradient KL"
        )
        return [], False
    if not reference:  # rl_trainer.py 178-181: the reference policy is built only from a ref: section
        r.no_reference = (
            "no ref: section, so AReaL builds no reference policy (actor.kl_ctl then weighs nothing)"
        )
        return [], False
    beta = r.get("actor.kl_ctl", 0.1, float)
    estimator = r.choice("actor.kl_estimator", "k1", ("k1", "k2", "k3"))
    grpo = r.get("actor.reward_norm.mean_level", None, str) == "group"
    r.get("actor.reward_norm.std_level", None, str)
    if beta == 0:
        return [], grpo
    return [("reward", term("reward", estimator, beta, value_clamp=10.0))], grpo
