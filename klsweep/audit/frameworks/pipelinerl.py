"""pipelinerl's reader: its config's KL keys mapped onto klsweep's (PipelineRL 58d3934)."""

from __future__ import annotations

from klsweep.audit.frameworks.reading import Reading, Terms, term

NAME = "pipelinerl"
VERSION = "PipelineRL 58d3934"
KIND = "yaml"  # a YAML mapping or Hydra overrides


def read(r: Reading) -> Terms:
    """PipelineRL 58d3934 (conf/finetune/base.yaml, pipelinerl/finetune/rl/__init__.py): finetune.rl.kl_coef (0)
    decayed linearly towards final_kl_coef (= kl_coef) over completed steps / max steps, k3 on the log-ratio
    clamped at clamp_log_ratio_ref_new_value (5) in the loss; none under policy_loss gspo."""
    p = "finetune.rl."
    beta = r.get(f"{p}kl_coef", 0.0, float)
    final = r.get(f"{p}final_kl_coef", beta, float)
    clamp = r.get(f"{p}clamp_log_ratio_ref_new_value", 5.0, float)
    policy_loss = r.choice(f"{p}policy_loss", "reinforce", ("ppo", "reinforce", "gspo"))
    if r.get(f"{p}reward_minus_kl_coef", 0.0, float):
        r.warnings.append(
            "finetune.rl.reward_minus_kl_coef: RLOO's implicit KL in the reward, not one of the audited terms; "
            "not audited"
        )
    if policy_loss == "gspo" and (beta or final):
        r.warnings.append(
            f"finetune.rl.kl_coef {beta:g} is ignored under policy_loss gspo: rl_step adds no KL"
        )
        return [], True
    if beta == 0 and final == 0:
        return [], True
    decay = {"beta_final": final} if final != beta else {}
    if decay:
        r.warnings.append(
            f"kl_coef decays from {beta:g} towards {final:g} (never reached: the last step's is one step short); "
            "audited at the first"
        )
    return [("loss", term("loss", "k3", beta, log_ratio_clamp=clamp, beta_final_at="end", **decay))], True
