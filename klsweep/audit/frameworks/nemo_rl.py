"""nemo-rl's reader: its config's KL keys mapped onto klsweep's (NeMo-RL 7ea279a)."""

from __future__ import annotations

from typing import Any

from klsweep.audit.frameworks.reading import Reading, Terms, term

NAME = "nemo-rl"
VERSION = "NeMo-RL 7ea279a"
KIND = "yaml"  # a YAML mapping or Hydra overrides


def read(r: Reading) -> Terms:
    """NeMo-RL 7ea279a (nemo_rl/algorithms/loss/loss_functions.py ClippedPGLossConfig, utils.py calculate_kl):
    loss_fn.reference_policy_kl_penalty (0.01) x calculate_kl of reference_policy_kl_type (k3), clamps
    kl_input_clamp_value (20) and kl_output_clamp_value (10, on weight x KL), weighted by
    exp(logp - logp.detach()) or, with use_on_policy_kl_approximation, by pi/pi_gen; use_kl_in_reward moves it to
    the advantage (advantage_estimator.py, default clamps, no weight)."""
    p = "loss_fn."
    beta = r.get(f"{p}reference_policy_kl_penalty", 0.01, float)
    estimator = r.choice(f"{p}reference_policy_kl_type", "k3", ("k1", "k2", "k3"))
    clamp_in = r.get(f"{p}kl_input_clamp_value", 20.0, float)
    clamp_out = r.get(f"{p}kl_output_clamp_value", 10.0, float)
    approximation = r.get(f"{p}use_on_policy_kl_approximation", False, bool)
    in_reward = r.get(f"{p}use_kl_in_reward", False, bool)
    grpo = "ppo" not in {k.split(".", 1)[0] for k in r.settings}  # its GRPO configs: grpo:, PPO's: ppo:
    if beta == 0:
        return [], grpo
    clamps: dict[str, Any] = {"log_ratio_clamp": clamp_in or 0.0, "value_clamp": clamp_out or 0.0}
    if in_reward:
        return [("reward", term("reward", estimator, beta, log_ratio_clamp=20.0, value_clamp=10.0))], grpo
    weight = {"importance": "token" if approximation else "self", "importance_gradient": True}
    forms = clamps | weight | {"clamp_weighted": bool(clamp_out), "clamp_detaches_weight": bool(clamp_in)}
    return [("loss", term("loss", estimator, beta, **forms))], grpo
