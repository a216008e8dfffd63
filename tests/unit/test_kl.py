"""klsweep.kl: estimator values by hand, surrogate gradients against docs/KL.md's closed forms, the forward-KL
estimate, masking, validation."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from klsweep import kl
from klsweep.audit import TabularPolicy
from klsweep.errors import UserError

ALL_CONFIGS = [
    kl.KLConfig(e, p, lv, importance=i)
    for e, p, lv, i in itertools.product(kl.ESTIMATORS, kl.PLACEMENTS, kl.LEVELS, kl.IMPORTANCE)
]


def k_hand(d: float, estimator: str) -> float:
    return {"k1": d, "k2": 0.5 * d * d, "k3": math.exp(-d) - 1 + d}[estimator]


def batch(seed: int = 0, b: int = 4, t: int = 5):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    ref_logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    behavior_logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    mask = torch.rand(b, t, generator=g) > 0.3
    mask[:, 0] = True
    mask[-1] = False  # an empty completion
    return logp, ref_logp, behavior_logp, mask


# --- values -------------------------------------------------------------------------------------------


def test_estimator_values_by_hand():
    delta = torch.tensor([0.5, -1.0, 0.0, 2.0], dtype=torch.float64)
    for est in kl.ESTIMATORS:
        got = kl.estimator_value(delta, est).tolist()
        assert got == pytest.approx([k_hand(d, est) for d in delta.tolist()], abs=1e-12)
    assert kl.estimator_value(delta, "k3").min() >= 0


def test_estimate_by_hand_both_levels():
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.3, -9.0]], dtype=torch.float64)
    ref_logp = torch.tensor([[-1.0, -0.2, -1.5], [-0.4, -0.3, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    deltas = [[0.5, -0.8, -0.5], [0.3, 0.0]]
    for est in kl.ESTIMATORS:
        token = kl.estimate(logp, ref_logp, mask, est, "token").tolist()
        seq = kl.estimate(logp, ref_logp, mask, est, "sequence").tolist()
        assert token == pytest.approx([sum(k_hand(d, est) for d in ds) for ds in deltas], abs=1e-12)
        assert seq == pytest.approx([k_hand(sum(ds), est) for ds in deltas], abs=1e-12)


def test_forward_estimate_by_hand_and_masked():
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.3, float("nan")]], dtype=torch.float64)
    ref_logp = torch.tensor([[-1.0, -0.2, -1.5], [-0.4, -0.3, float("inf")]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    got = kl.forward_estimate(logp, ref_logp, mask).tolist()
    logr = [[-0.5, 0.8, 0.5], [-0.3, 0.0]]  # log(ref / pi)
    want = [sum(math.exp(x) * x - math.exp(x) + 1 for x in row) for row in logr]
    assert got == pytest.approx(want, abs=1e-12)
    assert min(got) >= 0


def test_forward_estimate_is_unbiased_for_one_token_and_follows_pi_prefixes_for_more():
    """One token: E_pi[estimate] = KL(ref || pi) exactly. Longer: the sum over positions of the next-token
    forward KLs along pi's prefixes, which is not the sequence KL(ref || pi)."""
    for length in (1, 2):
        policy = TabularPolicy.random(3, length, seed=4, ref_distance=1.0, behavior_shift=0.0)
        logp, ref = policy.token_logp(policy.theta), policy.token_logp(policy.ref)
        p = logp.sum(-1).exp()
        estimate = p @ kl.forward_estimate(logp, ref, torch.ones_like(logp, dtype=torch.bool))
        forward = ref.sum(-1).exp() @ (ref.sum(-1) - logp.sum(-1))
        # next-token forward KL at every prefix, weighted by pi's probability of the prefix
        rows_kl = (policy.ref.softmax(-1) * (policy.ref.log_softmax(-1) - policy.theta.log_softmax(-1))).sum(
            -1
        )
        along_pi = p @ rows_kl[policy.rows].sum(-1)  # E_pi[sum_t KL(ref || pi)(. | y_<t)]
        assert estimate.item() == pytest.approx(along_pi.item(), rel=1e-10)
        if length == 1:
            assert estimate.item() == pytest.approx(forward.item(), rel=1e-10)
        else:
            assert abs(estimate.item() - forward.item()) > 1e-3


def test_k1_token_and_sequence_estimates_are_equal_and_k3_is_not():
    logp, ref_logp, _, mask = batch()
    tok = kl.estimate(logp, ref_logp, mask, "k1", "token")
    seq = kl.estimate(logp, ref_logp, mask, "k1", "sequence")
    torch.testing.assert_close(tok, seq)
    assert not torch.allclose(
        kl.estimate(logp, ref_logp, mask, "k3", "token")[:-1],
        kl.estimate(logp, ref_logp, mask, "k3", "sequence")[:-1],
    )


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=str)
def test_token_terms_sum_to_surrogate_and_vanish_where_masked(config):
    logp, ref_logp, behavior_logp, mask = batch(1)
    terms = kl.token_terms(logp, ref_logp, mask, config, behavior_logp)
    assert terms.shape == logp.shape
    assert (terms[~mask] == 0).all()
    torch.testing.assert_close(terms.sum(-1), kl.surrogate(logp, ref_logp, mask, config, behavior_logp))


def test_surrogate_values_per_placement_and_importance():
    logp, ref_logp, behavior_logp, mask = batch(2)
    for est, level in itertools.product(kl.ESTIMATORS, kl.LEVELS):
        kl_hat = kl.estimate(logp, ref_logp, mask, est, level)
        seq_logp = torch.where(mask, logp, 0).sum(-1)

        def surr(placement, importance="none", est=est, level=level):
            config = kl.KLConfig(est, placement, level, importance=importance)
            return kl.surrogate(logp, ref_logp, mask, config, behavior_logp)

        torch.testing.assert_close(surr("reward"), kl_hat * seq_logp)
        torch.testing.assert_close(surr("loss"), kl_hat)
        torch.testing.assert_close(surr("both"), kl_hat * seq_logp + kl_hat)
        w = torch.where(mask, logp - behavior_logp, 0).sum(-1).exp()
        torch.testing.assert_close(surr("both", "sequence"), w * surr("both"))
    # token weighting: the token-level loss term at t is weighted by pi_t / mu_t
    config = kl.KLConfig("k3", "loss", "token", importance="token")
    want = torch.where(mask, kl.estimator_value(logp - ref_logp, "k3") * (logp - behavior_logp).exp(), 0).sum(
        -1
    )
    torch.testing.assert_close(kl.surrogate(logp, ref_logp, mask, config, behavior_logp), want)


def test_importance_needs_behavior_logp():
    logp, ref_logp, _, mask = batch()
    with pytest.raises(ValueError, match="behavior_logp"):
        kl.surrogate(logp, ref_logp, mask, kl.KLConfig("k1", "reward", importance="sequence"))


# --- gradients ----------------------------------------------------------------------------------------


def grad_wrt_logp(config, logp, ref_logp, mask, behavior_logp=None):
    lp = logp.detach().clone().requires_grad_()
    (g,) = torch.autograd.grad(kl.surrogate(lp, ref_logp, mask, config, behavior_logp).sum(), lp)
    return g


def test_reward_placement_is_a_score_function_and_importance_weights_are_detached():
    logp, ref_logp, behavior_logp, mask = batch(3)
    for est, level in itertools.product(kl.ESTIMATORS, kl.LEVELS):
        kl_hat = kl.estimate(logp, ref_logp, mask, est, level)
        g = grad_wrt_logp(kl.KLConfig(est, "reward", level), logp, ref_logp, mask)
        torch.testing.assert_close(g, torch.where(mask, kl_hat[:, None], 0))
        # detached weights: the gradient is exactly w times the unweighted one
        w = torch.where(mask, logp - behavior_logp, 0).sum(-1).exp()
        config = kl.KLConfig(est, "reward", level, importance="sequence")
        gw = grad_wrt_logp(config, logp, ref_logp, mask, behavior_logp)
        torch.testing.assert_close(gw, w[:, None] * g)


def per_sample_theta_grads(policy: TabularPolicy, config: kl.KLConfig) -> list[torch.Tensor]:
    """Each sequence's surrogate gradient, by plain autograd through the logits table."""
    out = []
    for i in range(len(policy.seqs)):
        theta = policy.theta.detach().requires_grad_()
        logp = policy.token_logp(theta)[i : i + 1]
        ref_logp = policy.token_logp(policy.ref)[i : i + 1]
        s = kl.surrogate(logp, ref_logp, torch.ones_like(logp, dtype=torch.bool), config)
        out.append(torch.autograd.grad(s.sum(), theta)[0])
    return out


def grad_seq_logp(policy: TabularPolicy, i: int) -> torch.Tensor:
    theta = policy.theta.detach().requires_grad_()
    return torch.autograd.grad(policy.token_logp(theta)[i].sum(), theta)[0]


@pytest.mark.parametrize("level", kl.LEVELS)
def test_k1_in_loss_gradient_is_the_score_with_mean_zero(level):
    policy = TabularPolicy.random(3, 3, seed=0, ref_distance=1.0, behavior_shift=0.0)
    grads = per_sample_theta_grads(policy, kl.KLConfig("k1", "loss", level))
    pi = policy.token_logp(policy.theta).sum(-1).exp()
    for i, g in enumerate(grads):
        torch.testing.assert_close(g, grad_seq_logp(policy, i))
    mean = sum(p * g for p, g in zip(pi, grads, strict=True))
    assert mean.abs().max() < 1e-12
    assert max(g.abs().max() for g in grads) > 0.1  # only noise, but noise


def test_k2_and_k3_in_loss_sequence_closed_forms():
    policy = TabularPolicy.random(3, 3, seed=1, ref_distance=1.0, behavior_shift=0.0)
    log_ratio = (policy.token_logp(policy.theta) - policy.token_logp(policy.ref)).sum(-1)
    k2 = per_sample_theta_grads(policy, kl.KLConfig("k2", "loss", "sequence"))
    k3 = per_sample_theta_grads(policy, kl.KLConfig("k3", "loss", "sequence"))
    for i in range(len(policy.seqs)):
        score = grad_seq_logp(policy, i)
        torch.testing.assert_close(k2[i], log_ratio[i] * score)  # (sum delta) grad log pi
        torch.testing.assert_close(k3[i], (1 - torch.exp(-log_ratio[i])) * score)  # (1 - R) grad log pi


# --- masking ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=str)
def test_masked_positions_affect_neither_values_nor_gradients(config):
    logp, ref_logp, behavior_logp, mask = batch(4)
    clean = (torch.where(mask, x, 0.0) for x in (logp, ref_logp, behavior_logp))
    garbage = [torch.tensor(float(v), dtype=torch.float64) for v in ("nan", "inf", "-inf")]

    def dirty(x, k):
        fill = torch.stack([garbage[(k + j) % 3] for j in range(x.numel())]).reshape(x.shape)
        return torch.where(mask, x, fill)

    clean = list(clean)
    dirt = [dirty(x, k) for k, x in enumerate(clean)]
    results = []
    for lp, ref, beh in (clean, dirt):
        lp = lp.clone().requires_grad_()
        s = kl.surrogate(lp, ref, mask, config, beh)
        est = kl.estimate(lp, ref, mask, config.estimator, config.level)
        (g,) = torch.autograd.grad(s.sum() + est.sum(), lp)
        results.append((s.detach(), est.detach(), g))
    for a, b in zip(*results, strict=True):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(a, b)
    assert (results[1][2][~mask] == 0).all()


# --- validation ---------------------------------------------------------------------------------------


def test_config_reports_every_problem_with_field_value_and_allowed():
    with pytest.raises(UserError) as info:
        kl.KLConfig("k4", "rewards", "tok", beta=-0.1, importance="seq", reward_mode="normalised")
    problems = {p.where: p for p in info.value.problems}
    assert set(problems) == {"estimator", "placement", "level", "beta", "importance", "reward_mode"}
    assert "'normalised'" in problems["reward_mode"].what
    assert problems["reward_mode"].allowed == "separate, shaped"
    assert "'k4'" in problems["estimator"].what and problems["estimator"].allowed == "k1, k2, k3, abs"
    assert "'rewards'" in problems["placement"].what and problems["placement"].allowed == "reward, loss, both"
    assert problems["level"].allowed == "token, sequence"
    assert problems["importance"].allowed == "none, token, sequence, sequence_mean, self"
    assert "-0.1" in problems["beta"].what
    text = str(info.value)
    assert "6 problems" in text and "'tok'" in text and "'seq'" in text


@pytest.mark.parametrize("beta", [float("nan"), float("inf"), -1, "0.1", True, None])
def test_config_rejects_bad_beta(beta):
    with pytest.raises(UserError, match="beta"):
        kl.KLConfig("k1", "reward", beta=beta)


def test_config_accepts_valid_values():
    c = kl.KLConfig("k3", "both", "sequence", beta=0.3, importance="token")
    assert (c.estimator, c.placement, c.level, c.beta, c.importance) == (
        "k3",
        "both",
        "sequence",
        0.3,
        "token",
    )
    assert kl.KLConfig("k1", "reward", beta=1).beta == 1
    assert kl.KLConfig("k1", "reward").reward_mode == "separate"  # the default: beta means what it says
    assert kl.KLConfig("k1", "reward", reward_mode="shaped").reward_mode == "shaped"
    with pytest.raises(AttributeError):
        c.beta = 1.0  # frozen


def test_reward_logp_and_importance_cap_are_validated_and_say_when_the_reward_half_is_its_own_term():
    with pytest.raises(UserError) as info:
        kl.KLConfig("k1", "reward", reward_logp="stale", importance_cap=-1.0)
    assert {p.where for p in info.value.problems} == {"reward_logp", "importance_cap"}
    assert kl.KLConfig("k1", "reward").reward_logp == "current"  # the default (docs/KL.md says why)
    assert kl.KLConfig("k1", "reward").reward_term
    assert kl.KLConfig("k1", "both").reward_term
    assert not kl.KLConfig("k1", "loss").reward_term
    assert not kl.KLConfig("k1", "reward", reward_logp="behavior").reward_term
    assert not kl.KLConfig("k1", "reward", reward_mode="shaped").reward_term  # shaped: behaviour's, in A


def test_importance_weights_token_sequence_and_cap():
    logp = torch.tensor([[-1.0, -2.0, 0.0]], dtype=torch.float64)
    behavior = torch.tensor([[-2.0, -1.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    token = kl.importance_weights(logp, behavior, mask, kl.KLConfig("k1", "loss", importance="token"))
    torch.testing.assert_close(token, torch.tensor([[math.e, 1 / math.e, 1.0]], dtype=torch.float64))
    seq = kl.importance_weights(logp, behavior, mask, kl.KLConfig("k1", "loss", importance="sequence"))
    torch.testing.assert_close(seq, torch.ones(1, 1, dtype=torch.float64))
    capped = kl.KLConfig("k1", "loss", importance="token", importance_cap=2.0)
    torch.testing.assert_close(
        kl.importance_weights(logp, behavior, mask, capped),
        torch.tensor([[2.0, 1 / math.e, 1.0]], dtype=torch.float64),
    )
    assert kl.importance_weights(logp, None, mask, kl.KLConfig("k1", "loss")).item() == 1.0
    # the cap applies to the loss half's weights too
    ref = torch.zeros_like(logp)
    terms = kl.token_terms(logp, ref, mask, capped, behavior)
    torch.testing.assert_close(terms, torch.tensor([[-2.0, -2 / math.e, 0.0]], dtype=torch.float64))
