"""The frameworks' KL keys mapped onto klsweep's, one reader per framework at the version its preset cites
(``VERSIONS``; the code tests/peer/ executes): each takes a ``Reading`` of the file's settings and gives its KL
terms (place, ``KLConfig``) and whether its algorithm is GRPO-like; the ``Reading`` keeps the keys read, the
warnings and the values the framework would refuse."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from klsweep.errors import Problem
from klsweep.kl import KLConfig

VERSIONS = {
    "verl": "verl 0.9.1",
    "trl": "trl 1.16.0",
    "openrlhf": "openrlhf 0.11.2",
    "slime": "slime 624b824",
    "nemo-rl": "NeMo-RL 7ea279a",
    "skyrl": "skyrl 0.4.0",
    "areal": "areal 1.0.4",
    "pipelinerl": "PipelineRL 58d3934",
}
FRAMEWORKS = tuple(VERSIONS)


class Reading:
    """One framework's settings being mapped: typed reads with defaults, the keys read, the warnings."""

    def __init__(self, framework: str, settings: dict[str, Any]):
        self.framework, self.settings = framework, settings
        self.read: set[str] = set()
        self.warnings: list[str] = []
        self.problems: list[Problem] = []

    def get(self, key: str, default: Any, kind: type) -> Any:
        """The setting ``key`` (``default`` where the file does not set it) as ``kind``; a value of another type
        is a problem (the framework would refuse it), an interpolation that cannot be resolved here is read as
        the default, said."""
        self.read.add(key)
        if key not in self.settings:
            return default
        name, value = key, self.settings[key]
        if isinstance(value, str) and "${" in value:
            self.warnings.append(f"{name}: {value} cannot be resolved from this file; read as {default!r}")
            return default
        if kind is float and isinstance(value, str):  # 1e-4: a float to argparse and OmegaConf, text to YAML
            with contextlib.suppress(ValueError):
                value = float(value)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if value is None and default is None:
            return None
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            self.problems.append(
                Problem(
                    name,
                    f"{value!r} is not valid",
                    f"a {kind.__name__}, as {VERSIONS[self.framework]} reads it",
                )
            )
            return default
        return value

    def choice(self, key: str, default: str, allowed: Mapping[str, Any] | tuple[str, ...]) -> str:
        value = self.get(key, default, str)
        if value not in allowed:
            self.problems.append(Problem(key, f"{value!r} is not valid", ", ".join(allowed)))
            return default
        return value

    def unknown(self, touches_kl: Callable[[str], bool]) -> None:
        """Name every key that touches the KL and that this framework's version does not read."""
        for name in sorted(self.settings):
            if name not in self.read and touches_kl(name):
                self.warnings.append(
                    f"{name}: touches the KL but is not a key {VERSIONS[self.framework]} reads; not read "
                    "(the audit may not be what this config trains)"
                )


# Keys with "kl" in their name that are not the reference KL (a policy loss's own divergence, a metric's check):
# known, so not named as unknown.
NOT_REFERENCE_KL = frozenset(
    (
        "kl_cov_ratio",
        "ppo_kl_coef",
        "kl_cov_frac",
        "opd-kl-coef",
        "ci-disable-kl-checker",
        "kl_cov",
        "binary_kl",
    )
)


def touches_kl(name: str) -> bool:
    """Whether a key names a KL (a component "kl" or "kl..." of its dotted, dashed or underscored name) other
    than ``NOT_REFERENCE_KL``."""
    parts = name.lower().split(".")
    if any(p in NOT_REFERENCE_KL for p in parts) or parts[-1].startswith("_"):  # Hydra's _target_ ...
        return False
    return any(w.startswith("kl") for p in parts for w in re.split(r"[_-]", p))


def _term(place: str, estimator: str, beta: float, **forms: Any) -> KLConfig:
    """A framework's KL term as klsweep's keys: per token; a penalty in the reward normalised with the task
    reward and evaluated with the log-probs of the batch (shaped, behavior) unless ``forms`` say otherwise."""
    base: dict[str, Any] = {"reward_mode": "shaped"}
    if place == "reward":
        base["reward_logp"] = "behavior"
    return KLConfig(estimator, place, "token", beta, **(base | forms))


def _verl(r: Reading) -> tuple[list[tuple[str, KLConfig]], bool]:
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
        terms.append(("reward", _term("reward", reward_form[0], reward_beta, **reward_form[1])))
    if in_loss and loss_form is not None:
        terms.append(("loss", _term("loss", loss_form[0], loss_beta, **loss_form[1])))
    grpo_like = ("grpo", "grpo_passk", "grpo_vectorized", "rloo", "rloo_vectorized", "opo", "gpg", "gdpo")
    return terms, algorithm in grpo_like


def _trl(r: Reading) -> tuple[list[tuple[str, KLConfig]], bool]:
    """TRL 1.16.0's GRPOConfig (trl/trainer/grpo_config.py; the loss in grpo_trainer.py ``_compute_loss``): k3
    per token in the loss at ``beta`` (default 0), times coef_1 with its gradient under use_bias_correction_kl
    (default true): per token, or the sequence's mean ratio with importance_sampling_level sequence."""
    beta = r.get("beta", 0.0, float)
    corrected = r.get("use_bias_correction_kl", True, bool)
    level = r.choice("importance_sampling_level", "token", ("token", "sequence", "sequence_token"))
    for key in ("sync_ref_model", "ref_model_sync_steps", "ref_model_mixup_alpha"):
        r.get(key, None, object)
    if r.get("sync_ref_model", False, bool):
        r.warnings.append(
            "sync_ref_model: the reference is replaced by the policy every ref_model_sync_steps"
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
    return [("loss", _term("loss", "k3", beta, **weight))], True


def _openrlhf(r: Reading) -> tuple[list[tuple[str, KLConfig]], bool]:
    """OpenRLHF 0.11.2 (openrlhf/cli/train_ppo_ray.py; openrlhf/models/utils.py compute_approx_kl): the estimator
    (--algo.kl.estimator, default k1) in the reward, or in the loss with --algo.kl.use_loss, at
    --algo.kl.init_coef (0.01), the value clamped at +-10; --algo.kl.unbiased_gradient: a detached weight
    capped at 10 times k1 times grad log pi."""
    estimator = r.choice("algo.kl.estimator", "k1", ("k1", "k2", "k3"))
    beta = r.get("algo.kl.init_coef", 0.01, float)
    in_loss = r.get("algo.kl.use_loss", False, bool)
    unbiased = r.get("algo.kl.unbiased_gradient", False, bool)
    if r.get("algo.kl.target", None, float) is not None:
        r.warnings.append(f"algo.kl.target: an adaptive coefficient, audited at its initial {beta:g}")
    r.get("algo.kl.horizon", 10000, int)
    advantage = r.get("algo.advantage.estimator", "gae", str)
    grpo = advantage in ("group_norm", "dr_grpo", "rloo", "reinforce_baseline")
    if beta <= 0:
        return [], grpo
    if not in_loss:
        if unbiased:
            r.warnings.append("algo.kl.unbiased_gradient without algo.kl.use_loss: OpenRLHF ignores it")
        # the penalty is added to the returns after the task reward's normalisation: klsweep's separate mode
        return [("reward", _term("reward", estimator, beta, value_clamp=10.0, reward_mode="separate",
                                 reward_logp="current"))], grpo  # fmt: skip
    forms: dict[str, Any] = {"value_clamp": 10.0}
    if unbiased:
        forms |= {"unbiased_gradient": True, "importance": "token", "importance_cap": 10.0}
    return [("loss", _term("loss", estimator, beta, reward_mode="separate", **forms))], grpo


def _slime(r: Reading) -> tuple[list[tuple[str, KLConfig]], bool]:
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
    if reward_coef != 0 and loss_coef != 0:
        r.warnings.append(
            "--kl-coef and --kl-loss-coef both set: slime refuses to start (arguments.py: 'Only one of kl_coef "
            "and kl_loss_coef can be set')"
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
            terms.append(("reward", _term("reward", estimator, reward_coef, **clamp)))
    if loss_coef != 0 and not use_loss:
        r.warnings.append(f"--kl-loss-coef {loss_coef:g} without --use-kl-loss: slime adds no KL to the loss")
    if use_loss and loss_coef != 0:
        forms = dict(clamp)
        if unbiased:
            forms |= {"importance": "token", "importance_gradient": True}
            if clamp:
                forms["clamp_weighted"] = True
        terms.append(("loss", _term("loss", estimator, loss_coef, **forms)))
    elif unbiased:
        r.warnings.append("--use-unbiased-kl without a KL loss (--use-kl-loss, --kl-loss-coef): no effect")
    return terms, grpo


def _nemo(r: Reading) -> tuple[list[tuple[str, KLConfig]], bool]:
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
        return [("reward", _term("reward", estimator, beta, log_ratio_clamp=20.0, value_clamp=10.0))], grpo
    weight = {"importance": "token" if approximation else "self", "importance_gradient": True}
    forms = clamps | weight | {"clamp_weighted": bool(clamp_out), "clamp_detaches_weight": bool(clamp_in)}
    return [("loss", _term("loss", estimator, beta, **forms))], grpo


def _skyrl(r: Reading) -> tuple[list[tuple[str, KLConfig]], bool]:
    """SkyRL (skyrl 0.4.0: skyrl/train/config/config.py AlgorithmConfig, ppo_utils.py compute_approx_kl):
    trainer.algorithm.use_kl_loss (true) at kl_loss_coef (0.001), or use_kl_in_reward (exclusive) at the same
    coefficient, of kl_estimator_type (k3: clamps 20/10; k1, k2, abs)."""
    p = "trainer.algorithm."
    estimator = r.choice(f"{p}kl_estimator_type", "k3", ("k1", "k2", "k3", "abs"))
    beta = r.get(f"{p}kl_loss_coef", 0.001, float)
    in_loss = r.get(f"{p}use_kl_loss", True, bool)
    in_reward = r.get(f"{p}use_kl_in_reward", False, bool)
    advantage = r.get(f"{p}advantage_estimator", "grpo", str)
    grpo = advantage in ("grpo", "rloo", "reinforce++", "gdpo")
    if in_loss and in_reward:
        r.warnings.append(
            "use_kl_loss and use_kl_in_reward both true: SkyRL refuses them (mutually exclusive)"
        )
    clamps = {"log_ratio_clamp": 20.0, "value_clamp": 10.0} if estimator == "k3" else {}
    terms = []
    if in_reward and beta:
        terms.append(("reward", _term("reward", estimator, beta, **clamps)))
    if in_loss and beta:
        terms.append(("loss", _term("loss", estimator, beta, **clamps)))
    return terms, grpo


def _areal(r: Reading) -> tuple[list[tuple[str, KLConfig]], bool]:
    """AReaL 1.0.4 (areal/api/cli_args.py PPOActorConfig, trainer/ppo/actor.py, utils/data.py KLEstimator):
    actor.kl_ctl (0.1) x actor.kl_estimator (k1) of the old policy's log-probs, clamped at +-10, in the reward."""
    beta = r.get("actor.kl_ctl", 0.1, float)
    estimator = r.choice("actor.kl_estimator", "k1", ("k1", "k2", "k3"))
    grpo = r.get("actor.reward_norm.mean_level", None, str) == "group"
    r.get("actor.reward_norm.std_level", None, str)
    if beta == 0:
        return [], grpo
    return [("reward", _term("reward", estimator, beta, value_clamp=10.0))], grpo


def _pipelinerl(r: Reading) -> tuple[list[tuple[str, KLConfig]], bool]:
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
    return [("loss", _term("loss", "k3", beta, log_ratio_clamp=clamp, beta_final_at="end", **decay))], True


READERS: dict[str, tuple[Callable[[Reading], tuple[list[tuple[str, KLConfig]], bool]], str]] = {
    "verl": (_verl, "yaml"),
    "trl": (_trl, "yaml"),
    "openrlhf": (_openrlhf, "flags"),
    "slime": (_slime, "flags"),
    "nemo-rl": (_nemo, "yaml"),
    "skyrl": (_skyrl, "yaml"),
    "areal": (_areal, "yaml"),
    "pipelinerl": (_pipelinerl, "yaml"),
}
