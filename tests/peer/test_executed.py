"""The peer tier, executed: each preset of a framework published on PyPI against that framework's own KL function,
read out of its wheel (downloaded by pinned version and sha256, cached under ``$KLSWEEP_CACHE/peer-wheels``)
and executed without importing the package (tests/peer/peers.py): float64, log-ratios to +-40 so every clamp
bites, random masks, on- and off-policy, value and gradient of the whole term (weight and beta included) within
1e-6. TRL's presets run against TRL's trainer itself in tests/integration/test_presets.py.

Where a framework's estimator enters the reward (OpenRLHF's default, AReaL), the term is
stopgrad(sum of its per-token values) x log pi(y): the framework's function gives the values (computed without
gradient, experience_maker.py / actor.py), klsweep's reward half their score-function gradient."""

from __future__ import annotations

import dataclasses

import pytest
from peers import Wheel, assert_same, inputs, load, masked_sum, value_and_gradient, wheel_source

from klsweep import kl, presets

pytestmark = pytest.mark.peer

WHEELS = {
    "verl": Wheel(
        "verl", "0.9.1", "db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14",
        "verl-0.9.1-py3-none-any.whl",
    ),
    "openrlhf": Wheel(
        "openrlhf", "0.11.2", "c969d70db03a70724c3d8a5a01186c6e0728bce624fb3dff95e39b5396acefa6",
        "openrlhf-0.11.2-cp311-cp311-manylinux1_x86_64.whl",
        ("--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--platform", "manylinux1_x86_64"),
    ),
    "areal": Wheel(
        "areal", "1.0.4", "7d7cfab10d9ec0990d9263290a9472366827783b9ad5fce22f56a1add416bdd9",
        "areal-1.0.4-py3-none-any.whl",
    ),
    # skyrl 0.4.0 (2026-10-01) holds the skyrl/backends/skyrl_train/ layout of the commit the preset cites
    # (a956457, 2026-08-21) and the same compute_approx_kl; skyrl-train 0.3.1 is January's older layout
    "skyrl": Wheel(
        "skyrl", "0.4.0", "7f95dad660ddc388ca135a1faf61bcbd8010a39e3d4fef92c62959c0353c6ee9",
        "skyrl-0.4.0-py3-none-any.whl",
    ),
}  # fmt: skip

# preset -> the wheel its test executes (every preset whose SOURCES say "executed", but TRL's)
EXECUTED = {
    "verl": "verl",
    "verl-k3plus": "verl",
    "openrlhf": "openrlhf",
    "openrlhf-unbiased": "openrlhf",
    "skyrl": "skyrl",
    "areal": "areal",
}


def test_every_executed_preset_has_its_peer_test():
    """presets.SOURCES and this tier agree: each preset said to be executed is executed here (or, TRL's, in
    tests/integration/test_presets.py), each transcribed one in test_transcribed.py."""
    said = {n for n in presets.names() if presets.checked(n) == "executed"}
    assert said == set(EXECUTED) | {"trl", "trl-sequence"}
    assert set(presets.SOURCES) == set(presets.names())
    for name, wheel in EXECUTED.items():
        assert f"{wheel} {WHEELS[wheel].version}" in presets.SOURCES[name][1], name


def ours(config: kl.KLConfig, x, beta: float | None = None):
    """klsweep's term: beta x ``kl.surrogate`` per sequence (value, gradient)."""
    beta = config.beta if beta is None else beta
    behavior = x.old if config.importance not in ("none", "self") else None
    return value_and_gradient(lambda lp: beta * kl.surrogate(lp, x.ref, x.mask, config, behavior), x)


def in_the_reward(values, x, beta: float):
    """The reward-placed term of per-token KL values computed without gradient: beta x stopgrad(sum) x log pi(y)."""
    return lambda lp: beta * masked_sum(values.detach(), x.mask) * masked_sum(lp, x.mask)


# --- verl 0.9.1: verl/trainer/ppo/core_algos.py kl_penalty (+ kl_penalty_forward) -----------------------------


def verl_kl_penalty():
    source = wheel_source(WHEELS["verl"], "verl/trainer/ppo/core_algos.py")
    return load(source, ("kl_penalty_forward", "kl_penalty"), "verl/trainer/ppo/core_algos.py")["kl_penalty"]


@pytest.mark.parametrize("off_policy", [False, True])
@pytest.mark.parametrize(("preset", "kl_loss_type"), [("verl", "low_var_kl"), ("verl-k3plus", "low_var_kl+")])
def test_verl_presets_are_verls_kl_penalty(preset, kl_loss_type, off_policy):
    """verl's KL loss: kl_loss_coef x kl_penalty(log_prob, ref_log_prob, kl_loss_type) per token
    (dp_actor.py), here at the preset's beta (actor.yaml's kl_loss_coef 0.001)."""
    kl_penalty, x = verl_kl_penalty(), inputs(off_policy)
    config = presets.kl_config(preset)
    theirs = value_and_gradient(
        lambda lp: config.beta * masked_sum(kl_penalty(lp, x.ref, kl_loss_type), x.mask), x
    )
    assert_same(ours(config, x), theirs, preset)


# --- OpenRLHF 0.11.2: openrlhf/models/utils.py compute_approx_kl ---------------------------------------------


def openrlhf_compute_approx_kl():
    source = wheel_source(WHEELS["openrlhf"], "openrlhf/models/utils.py")
    scope = load(source, ("KL_IS_WEIGHT_CLIP", "compute_approx_kl"), "openrlhf/models/utils.py")
    return scope["compute_approx_kl"], scope["KL_IS_WEIGHT_CLIP"]


@pytest.mark.parametrize("off_policy", [False, True])
def test_openrlhf_preset_is_openrlhfs_reward_kl(off_policy):
    """The default: compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator="k1") in the reward
    (experience_maker.py), init_coef 0.01, the value clamped at +-10."""
    compute_approx_kl, _ = openrlhf_compute_approx_kl()
    x, config = inputs(off_policy), presets.kl_config("openrlhf")
    values = compute_approx_kl(x.logp, x.ref, kl_estimator="k1")
    assert_same(ours(config, x), value_and_gradient(in_the_reward(values, x, config.beta), x), "openrlhf")


@pytest.mark.parametrize("off_policy", [False, True])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_openrlhf_unbiased_preset_is_openrlhfs_unbiased_gradient(estimator, off_policy):
    """--algo.kl.use_loss --algo.kl.unbiased_gradient (ppo_actor.py): compute_approx_kl(action_log_probs,
    base_action_log_probs, log_probs_old=old_action_log_probs, unbiased_gradient=True), for each estimator (the
    preset's k1, and k2 and k3, which share its gradient); the weight's cap is its KL_IS_WEIGHT_CLIP."""
    compute_approx_kl, cap = openrlhf_compute_approx_kl()
    x = inputs(off_policy)
    config = dataclasses.replace(presets.kl_config("openrlhf-unbiased"), estimator=estimator)
    assert config.importance_cap == cap

    def theirs(lp):
        values = compute_approx_kl(
            lp, x.ref, log_probs_old=x.old, kl_estimator=estimator, unbiased_gradient=True
        )
        return config.beta * masked_sum(values, x.mask)

    assert_same(ours(config, x), value_and_gradient(theirs, x), f"openrlhf-unbiased {estimator}")


# --- SkyRL (skyrl 0.4.0): skyrl/backends/skyrl_train/utils/ppo_utils.py compute_approx_kl ---------------------


@pytest.mark.parametrize("off_policy", [False, True])
def test_skyrl_preset_is_skyrls_compute_approx_kl(off_policy):
    """use_kl_loss (its default) with kl_estimator_type k3 and kl_loss_coef 0.001, per token, masked."""
    source = wheel_source(WHEELS["skyrl"], "skyrl/backends/skyrl_train/utils/ppo_utils.py")
    compute_approx_kl = load(source, ("compute_approx_kl",), "ppo_utils.py")["compute_approx_kl"]
    x, config = inputs(off_policy), presets.kl_config("skyrl")

    def theirs(lp):
        return config.beta * compute_approx_kl(lp, x.ref, loss_mask=x.mask, kl_estimator_type="k3").sum(-1)

    assert_same(ours(config, x), value_and_gradient(theirs, x), "skyrl")


# --- AReaL 1.0.4: areal/utils/data.py KLEstimator ------------------------------------------------------------


@pytest.mark.parametrize("off_policy", [False, True])
def test_areal_preset_is_areals_kl_estimator(off_policy):
    """The actor's KLEstimator(config.kl_estimator) (its apply_clamp default: True) of the old (generating)
    policy's log-probs against the reference, times kl_ctl 0.1, in the reward (actor.py); klsweep's
    reward_logp behavior evaluates the penalty with the same log-probs."""
    source = wheel_source(WHEELS["areal"], "areal/utils/data.py")
    estimator = load(source, ("KLEstimator",), "areal/utils/data.py")["KLEstimator"]("k1")
    x, config = inputs(off_policy), presets.kl_config("areal")
    values = estimator(x.old, x.ref)
    klsweep_values = kl.penalty(x.old, x.ref, x.mask, config)
    ours_term = value_and_gradient(lambda lp: config.beta * klsweep_values * masked_sum(lp, x.mask), x)
    assert_same(ours_term, value_and_gradient(in_the_reward(values, x, config.beta), x), "areal")
