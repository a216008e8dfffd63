"""slime's reader: its config's KL keys mapped onto klsweep's (slime 624b824)."""

from __future__ import annotations

from klsweep.audit.frameworks.reading import Reading, Terms, term
from klsweep.errors import Problem

NAME = "slime"
VERSION = "slime 624b824"
KIND = "flags"  # a launch command with --flags


def read(r: Reading) -> Terms:
    """slime 624b824 (slime/utils/arguments.py; slime/utils/ppo_utils.py compute_approx_kl;
    slime/backends/megatron_utils/loss.py): --use-kl-loss with --kl-loss-coef (default 0) and --kl-loss-type
    (k1 default, k2, k3, low_var_kl: k3 whose value, weighted or not, is clamped at +-10), --use-unbiased-kl (x
    pi/pi_old with its gradient); --kl-coef (default 0) in the reward, for ppo and reinforce_plus_plus(_baseline)
    only: grpo, gspo and cispo drop it (get_grpo_returns)."""
    kind = r.choice("kl-loss-type", "k1", ("k1", "k2", "k3", "low_var_kl"))
    estimator = "k3" if kind == "low_var_kl" else kind
    clamp = {"value_clamp": 10.0} if kind == "low_var_kl" else {}
    advantage = r.choice(
        "advantage-estimator", "grpo",
        ("grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"),
    )  # fmt: skip
    grpo = advantage in ("grpo", "gspo", "cispo")
    reward_coef = r.get("kl-coef", 0.0, float)
    use_loss = r.get("use-kl-loss", False, bool)
    loss_coef = r.get("kl-loss-coef", 0.0, float)
    unbiased = r.get("use-unbiased-kl", False, bool)
    if reward_coef != 0 and loss_coef != 0:  # slime_validate_args (arguments.py 1846): an AssertionError
        r.problems.append(
            Problem(
                "--kl-coef, --kl-loss-coef",
                f"both set ({reward_coef:g}, {loss_coef:g}): slime refuses to start ('Only one of kl_coef and "
                "kl_loss_coef can be set')",
                "one of them (the reward's --kl-coef, or the loss's --use-kl-loss --kl-loss-coef)",
            )
        )
    normalize = r.get("normalize-advantages", False, bool)
    if advantage in ("reinforce_plus_plus", "reinforce_plus_plus_baseline") and not normalize:
        r.problems.append(  # slime_validate_args (arguments.py 1848-1852)
            Problem(
                "--advantage-estimator",
                f"{advantage} without --normalize-advantages: slime refuses to start (it requires advantage "
                "normalization)",
                "add --normalize-advantages",
            )
        )
    terms = []
    if reward_coef != 0:
        if grpo:
            r.warnings.append(
                f"--kl-coef {reward_coef:g} is ignored under --advantage-estimator {advantage}: its returns are "
                "the task reward alone (get_grpo_returns); put the KL in the loss (--use-kl-loss "
                "--kl-loss-coef) or use ppo / reinforce_plus_plus"
            )
        else:
            terms.append(("reward", term("reward", estimator, reward_coef, **clamp)))
    if loss_coef != 0 and not use_loss:
        r.warnings.append(f"--kl-loss-coef {loss_coef:g} without --use-kl-loss: slime adds no KL to the loss")
    if use_loss and loss_coef != 0:
        forms = dict(clamp)
        if unbiased:
            forms |= {"importance": "token", "importance_gradient": True}
            if clamp:
                forms["clamp_weighted"] = True
        terms.append(("loss", term("loss", estimator, loss_coef, **forms)))
    elif unbiased:
        r.warnings.append("--use-unbiased-kl without a KL loss (--use-kl-loss, --kl-loss-coef): no effect")
    return terms, grpo
