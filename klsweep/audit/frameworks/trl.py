"""trl's reader: its config's KL keys mapped onto klsweep's (trl 1.16.0)."""

from __future__ import annotations

from typing import Any

from klsweep.audit.frameworks.reading import Reading, Terms, term

NAME = "trl"
VERSION = "trl 1.16.0"
KIND = "yaml"  # a YAML mapping or Hydra overrides


def read(r: Reading) -> Terms:
    """TRL 1.16.0's GRPOConfig (trl/trainer/grpo_config.py; the loss in grpo_trainer.py ``_compute_loss``): k3
    per token in the loss at ``beta`` (default 0), times coef_1 with its gradient under use_bias_correction_kl
    (default true): per token, or the sequence's mean ratio with importance_sampling_level sequence."""
    beta = r.get("beta", 0.0, float)
    corrected = r.get("use_bias_correction_kl", True, bool)
    # grpo_trainer.py _compute_loss: "Unknown importance sampling level ... Possible values are 'token' and
    # 'sequence'" (sequence_token: a ValueError at the first step)
    level = r.choice("importance_sampling_level", "token", ("token", "sequence"))
    # GRPOConfig's defaults (read as TRL reads them, not as None: the corpus compares them)
    steps = r.get("ref_model_sync_steps", 512, int)
    alpha = r.get("ref_model_mixup_alpha", 0.6, float)
    if r.get("sync_ref_model", False, bool):
        r.warnings.append(
            f"sync_ref_model: the reference is mixed towards the policy (alpha {alpha:g}) every {steps} steps"
        )
    if beta == 0:
        return [], True
    weight: dict[str, Any] = {}
    if corrected:
        weight = {"importance": "token" if level == "token" else "sequence_mean", "importance_gradient": True}
        if level != "token":
            r.warnings.append(
                f"TRL #6586: importance_sampling_level {level} with use_bias_correction_kl multiplies every "
                "token's k3 by the sequence's mean ratio, whose gradient adds a spurious term (PR #7188 open); "
                "set importance_sampling_level token for the KL"
            )
    return [("loss", term("loss", "k3", beta, **weight))], True
