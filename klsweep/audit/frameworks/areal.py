"""areal's reader: its config's KL keys mapped onto klsweep's (areal 1.0.4)."""

from __future__ import annotations

from klsweep.audit.frameworks.reading import Reading, Terms, term

NAME = "areal"
VERSION = "areal 1.0.4"
KIND = "yaml"  # a YAML mapping or Hydra overrides


def read(r: Reading) -> Terms:
    """AReaL 1.0.4 (areal/api/cli_args.py PPOActorConfig, trainer/ppo/actor.py, utils/data.py KLEstimator):
    actor.kl_ctl (0.1) x actor.kl_estimator (k1) of the old policy's log-probs, clamped at +-10, in the reward."""
    reference = any((k == "ref" and v is not None) or k.startswith("ref.") for k, v in r.settings.items())
    r.values["reference"] = reference
    if (
        not reference
    ):  # the trainer builds a reference policy only from a ref: section (PPOTrainer: config.ref)
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
