"""openrlhf's reader: its config's KL keys mapped onto klsweep's (openrlhf 0.11.2)."""

from __future__ import annotations

from typing import Any

from klsweep import grpo as grpo_math
from klsweep.audit.frameworks.openrlhf_flags import FLAGS
from klsweep.audit.frameworks.reading import Reading, Terms, term
from klsweep.errors import Problem

NAME = "openrlhf"
VERSION = "openrlhf 0.11.2"
KIND = "flags"  # a launch command with --flags
# the KL flags of openrlhf 0.9.x (0.9.10's openrlhf/cli/train_ppo_ray.py 408-439), renamed algo.kl.* and
# algo.advantage.* by 0.11: 0.11.2's parser refuses them (unrecognized arguments)
LEGACY = ("init_kl_coef", "use_kl_loss", "kl_estimator", "kl_target", "kl_horizon", "advantage_estimator")
GROUP = ("group_norm", "dr_grpo", "rloo", "reinforce_baseline")


def read(r: Reading) -> Terms:
    """OpenRLHF 0.11.2 (openrlhf/cli/train_ppo_ray.py; openrlhf/models/utils.py compute_approx_kl): the estimator
    (--algo.kl.estimator, default k1) in the reward, or in the loss with --algo.kl.use_loss, at
    --algo.kl.init_coef (0.01), the value clamped at +-10; --algo.kl.unbiased_gradient: a detached weight
    capped at 10 times k1 times grad log pi. A command with 0.9.x's flags (``LEGACY``): ``read_0_9``. A dotted
    flag of one of its sections that its parser does not have (``openrlhf_flags.FLAGS``: a flag of 0.11.0 renamed
    since, a typo) is refused, as argparse refuses it."""
    legacy = [k for k in LEGACY if k in r.settings]
    if legacy:
        return read_0_9(r, legacy)
    _refuse_unknown_flags(r)
    estimator = r.choice("algo.kl.estimator", "k1", ("k1", "k2", "k3"))
    beta = r.get("algo.kl.init_coef", 0.01, float)
    in_loss = r.get("algo.kl.use_loss", False, bool)
    unbiased = r.get("algo.kl.unbiased_gradient", False, bool)
    if r.get("algo.kl.target", None, float) is not None:
        r.warnings.append(f"algo.kl.target: an adaptive coefficient, audited at its initial {beta:g}")
    r.get("algo.kl.horizon", 10000, int)
    advantage = r.get("algo.advantage.estimator", "gae", str)
    grpo = _advantage(r, advantage)
    if beta <= 0:
        return [], grpo
    if not in_loss:
        if unbiased:
            r.warnings.append("algo.kl.unbiased_gradient without algo.kl.use_loss: OpenRLHF ignores it")
        # the penalty is added to the returns after the task reward's normalisation: klsweep's separate mode
        return [("reward", term("reward", estimator, beta, value_clamp=10.0, reward_mode="separate",
                                 reward_logp="current"))], grpo  # fmt: skip
    forms: dict[str, Any] = {"value_clamp": 10.0}
    if unbiased:
        forms |= {"unbiased_gradient": True, "importance": "token", "importance_cap": 10.0}
    return [("loss", term("loss", estimator, beta, reward_mode="separate", **forms))], grpo


def read_0_9(r: Reading, legacy: list[str]) -> Terms:
    """A command written for openrlhf 0.9.x, which 0.11.2 refuses, read as openrlhf 0.9.10 reads it (its
    train_ppo_ray.py 408-439; models/utils.py compute_approx_kl, the value clamped at +-10; experience_maker.py
    200-215: the KL in the reward unless --use_kl_loss; ppo_actor.py 281-299: in the loss at the coefficient),
    said first. 0.9.x's flags mixed with 0.11's --algo.* ones: refused (neither version reads that command)."""
    flags = ", ".join(f"--{k}" for k in legacy)
    newer = sorted(k for k in r.settings if k.startswith("algo."))
    if newer:
        r.problems.append(
            Problem(flags, f"flags of openrlhf 0.9.x beside 0.11's --{newer[0]}", "one version's flags")
        )
        return [], False
    estimator = r.choice("kl_estimator", "k1", ("k1", "k2", "k3"))
    beta = r.get("init_kl_coef", 0.01, float)
    in_loss = r.get("use_kl_loss", False, bool)
    r.get("kl_horizon", 10000, int)
    target = r.get("kl_target", None, float)
    advantage = r.choice(
        "advantage_estimator",
        "gae",
        ("gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo"),
    )
    place = "loss" if in_loss else "reward"
    said = (
        f"{estimator} in the {place} at {beta:g}"
        if beta > 0
        else "no KL (init_kl_coef 0: no reference model)"
    )
    r.warnings.insert(
        0,
        f"flags of openrlhf 0.9.x ({flags}): {VERSION} refuses them (unrecognized arguments); as openrlhf 0.9.10 "
        f"reads them: {said}",
    )
    if target is not None and not in_loss:
        r.warnings.append(f"kl_target: an adaptive coefficient, audited at its initial {beta:g}")
    if beta <= 0:
        return [], advantage in GROUP
    forms: dict[str, Any] = {"value_clamp": 10.0, "reward_mode": "separate"}
    if place == "reward":
        forms["reward_logp"] = "current"
    return [(place, term(place, estimator, beta, **forms))], advantage in GROUP


def _advantage(r: Reading, advantage: str) -> bool:
    """The advantage estimator --algo.advantage.estimator selects (experience_maker.py
    compute_advantages_and_returns: the task reward's baseline, then the KL per token added after it,
    cumulative returns, then the whitening of reinforce and reinforce_baseline): ``r.advantage``, and whether
    the GRPO audit applies (False for gae and for what it cannot model, said)."""
    no_std = r.get("algo.advantage.no_std_norm", False, bool)
    gamma = r.get("algo.advantage.gamma", 1.0, float)
    specs = {
        "group_norm": grpo_math.Advantage("group", "group", 1e-9, returns="token"),
        "dr_grpo": grpo_math.Advantage("group", "none", returns="token"),
        "rloo": grpo_math.Advantage("leave_one_out", "none", returns="token"),
        "reinforce_baseline": grpo_math.Advantage("group", "none", returns="token", whiten="biased"),
        "reinforce": grpo_math.Advantage("none", "none", returns="token", whiten="biased"),
    }
    if advantage not in (*specs, "flash_reinforce"):
        return False
    why = ""
    if advantage == "flash_reinforce":
        why = "flash_reinforce (a baseline over the whole batch)"
    elif advantage in ("reinforce", "reinforce_baseline") and no_std:
        why = "--algo.advantage.no_std_norm (whitened without the std)"
    elif advantage == "reinforce" and gamma != 1.0:
        why = f"--algo.advantage.gamma {gamma:g}"
    else:
        r.advantage = specs[advantage]
    if why:
        r.warnings.append(
            f"--algo.advantage.estimator {advantage}: the GRPO audit cannot model {why}; the plain estimator "
            "audit alone"
        )
    return r.advantage is not None


SECTIONS = frozenset(f.split(".", 1)[0] for f in FLAGS if "." in f)


def _refuse_unknown_flags(r: Reading) -> None:
    """A ``--section.name`` flag (section one of 0.11.2's: algo, actor, rollout, ...) that 0.11.2's parser does
    not accept: ``parse_args`` exits 2 on it ("unrecognized arguments"). Flags of other commands in the script
    (``ray job submit --address``) have no such section and are left alone."""
    unknown = sorted(k for k in r.settings if "." in k and k.split(".", 1)[0] in SECTIONS and k not in FLAGS)
    if unknown:
        r.problems.append(
            Problem(
                ", ".join(f"--{k}" for k in unknown),
                f"not a flag of {VERSION}: its train_ppo_ray parser refuses the command (unrecognized "
                "arguments; a flag of another version, renamed, or misspelt)",
                f"the flags of {VERSION} (openrlhf/cli/train_ppo_ray.py)",
            )
        )
