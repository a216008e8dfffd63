"""skyrl's reader: its config's KL keys mapped onto klsweep's (skyrl 0.4.0)."""

from __future__ import annotations

import re

from klsweep import grpo as grpo_math
from klsweep.audit.frameworks.reading import Reading, Terms, term
from klsweep.errors import Problem

NAME = "skyrl"
VERSION = "skyrl 0.4.0"
# SkyRLTrainConfig's sections (skyrl/train/config/config.py)
SECTIONS = frozenset(("data", "trainer", "generator", "environment"))
KIND = "yaml"  # a YAML mapping or Hydra overrides


OLD_ENTRY = re.compile(r"-m\s+skyrl_train\.entrypoints\.[\w.]+")
# keys of skyrl-train <= 0.3 that skyrl 0.4.0 no longer has (removed in SkyRL #913: kl_estimator_type)
OLD_KEYS = {"trainer.algorithm.use_kl_estimator_k3": "k3", "trainer.algorithm.use_abs_kl": "abs"}


def other_version(text: str) -> Problem | None:
    """A launch command of skyrl-train 0.3.x or before (``-m skyrl_train.entrypoints.main_base``): skyrl 0.4.0
    has no ``skyrl_train`` package, so it does not run it; refused, naming the version, never read as 0.4.0."""
    found = OLD_ENTRY.search(text)
    if found is None:
        return None
    return Problem(
        "the file",
        f"a skyrl-train 0.3.x (or older) launch command ({found.group(0)}): {VERSION} has no skyrl_train package "
        "(its entry point is skyrl.train.entrypoints.main_base) and renamed keys (use_kl_estimator_k3, "
        "use_abs_kl: kl_estimator_type); it does not run this script",
        f"the script as {VERSION} writes it (-m skyrl.train.entrypoints.main_base), or the skyrl-train version it "
        "was written for",
    )


def read(r: Reading) -> Terms:
    """SkyRL (skyrl 0.4.0: skyrl/train/config/config.py AlgorithmConfig, ppo_utils.py compute_approx_kl):
    trainer.algorithm.use_kl_loss (true) at kl_loss_coef (0.001), or use_kl_in_reward (exclusive) at the same
    coefficient, of kl_estimator_type (k3: clamps 20/10; k1, k2, abs)."""
    p = "trainer.algorithm."
    if not any(k.split(".", 1)[0] in SECTIONS for k in r.settings):
        r.problems.append(
            Problem(
                "the file",
                "sets none of SkyRL's config sections (data, trainer, generator, environment): a launcher's or "
                "another tool's file; SkyRL reads the overrides of the command it runs",
                "SkyRL's launch script (python -m skyrl.train.entrypoints.main_base trainer...=...)",
            )
        )
        return [], False
    # a non-KL key the pinned config refuses in the authors' own files (thunder_agent r2egym_32b run_trainer.sh:
    # trainer.logger="['tensorboard','console']"; TrainerConfig.logger is a str: OmegaConf "Cannot convert
    # 'list' to string"): the file does not start, so it is refused, not audited
    if isinstance(r.settings.get("trainer.logger"), list):
        r.problems.append(
            Problem(
                "trainer.logger",
                f"{r.settings['trainer.logger']!r}: a list; {VERSION}'s TrainerConfig.logger is one name (str) and "
                "SkyRL refuses the file before training (OmegaConf: Cannot convert 'list' to string)",
                "one logger name, e.g. trainer.logger=tensorboard",
            )
        )
    for key, estimator in OLD_KEYS.items():
        if key in r.settings:
            r.problems.append(
                Problem(
                    key,
                    f"a key of skyrl-train 0.3.x and before; {VERSION} does not have it and refuses the file",
                    f"trainer.algorithm.kl_estimator_type={estimator}",
                )
            )
    estimator = r.choice(f"{p}kl_estimator_type", "k3", ("k1", "k2", "k3", "abs"))
    beta = r.get(f"{p}kl_loss_coef", 0.001, float)
    in_loss = r.get(f"{p}use_kl_loss", True, bool)
    in_reward = r.get(f"{p}use_kl_in_reward", False, bool)
    advantage = r.get(f"{p}advantage_estimator", "grpo", str)
    # config.py KLCtrlConfig; ppo_utils.py get_kl_controller: the reward's coefficient only (trainer.py 302)
    control = r.choice(f"{p}kl_ctrl.type", "fixed", ("fixed", "adaptive"))
    r.get(f"{p}kl_ctrl.kl_target", 0.1, float)
    horizon = r.get(f"{p}kl_ctrl.horizon", 10000, int)
    if control == "adaptive" and horizon <= 0:
        r.problems.append(
            Problem(f"{p}kl_ctrl.horizon", f"{horizon} with kl_ctrl.type adaptive", "larger than 0")
        )
    if control == "adaptive" and in_reward and beta:
        r.warnings.append(
            f"kl_ctrl.type adaptive: the reward's coefficient adapts; audited at its initial {beta:g}"
        )
    grpo = _advantage(r, advantage)
    if in_loss and in_reward:
        r.warnings.append(
            "use_kl_loss and use_kl_in_reward both true: SkyRL refuses them (mutually exclusive)"
        )
    clamps = {"log_ratio_clamp": 20.0, "value_clamp": 10.0} if estimator == "k3" else {}
    terms = []
    if in_reward and beta:
        terms.append(("reward", term("reward", estimator, beta, **clamps)))
    if in_loss and beta:
        terms.append(("loss", term("loss", estimator, beta, **clamps)))
    return terms, grpo


def _advantage(r: Reading, advantage: str) -> bool:
    """The advantage estimator ``trainer.algorithm.advantage_estimator`` selects (ppo_utils.py; the KL in the
    reward is in the per-token rewards before it, trainer.py apply_reward_kl_penalty): ``r.advantage``, and
    whether the GRPO audit applies (False for GAE and for what it cannot model, said)."""
    p = "trainer.algorithm."
    norm = r.get(f"{p}grpo_norm_by_std", True, bool)
    gamma = r.get(f"{p}gamma", 1.0, float)
    batch_normalize = r.get(f"{p}advantage_batch_normalize", False, bool)
    critic_free = ("grpo", "rloo", "reinforce++", "gdpo", "maxrl")
    if advantage not in critic_free:
        return False
    why = ""
    if batch_normalize:
        why = "advantage_batch_normalize (a mean over padding too)"
    elif advantage == "grpo":  # (score - mean) / (std + 1e-6), or no std
        r.advantage = grpo_math.Advantage("group", "group" if norm else "none", 1e-6)
    elif advantage == "rloo":  # (score - mean) x n/(n-1): leave-one-out
        r.advantage = grpo_math.Advantage("leave_one_out", "none")
    elif advantage == "reinforce++" and gamma == 1.0:  # per-token returns, masked_whiten
        r.advantage = grpo_math.Advantage("none", "none", returns="token", whiten="unbiased")
    else:
        why = f"gamma {gamma:g}" if advantage == "reinforce++" else advantage
    if why:
        r.warnings.append(
            f"trainer.algorithm.advantage_estimator {advantage}: the GRPO audit cannot model {why}; the plain "
            "estimator audit alone"
        )
    return r.advantage is not None
