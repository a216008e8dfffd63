"""klsweep.grpo: TRL's advantages and aggregations bit for bit (against the trainer's code before the module
existed, and TRL's nanstd), the leave-one-out baseline, the reward modes, the reward half as its own term (its
identity on-policy), the clipped policy loss, leading batch dimensions."""

from __future__ import annotations

import pytest
import torch
from pre_grpo import old_aggregate, old_group_advantages  # tests/ is on sys.path under pytest

from klsweep import grpo, kl


def rewards_with_every_case(dtype=torch.float32) -> torch.Tensor:
    """Four groups of 4: mixed, constant, one unscorable (NaN), two unscorable."""
    torch.manual_seed(0)
    r = torch.randn(16, dtype=dtype)
    r[4:8] = 0.7
    r[9] = torch.nan
    r[12], r[15] = torch.nan, torch.nan
    return r


@pytest.mark.parametrize("scale_rewards", grpo.SCALE_REWARDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_group_advantages_are_the_old_ones_bit_for_bit(scale_rewards, dtype):
    r = rewards_with_every_case(dtype)
    for g in (1, 2, 4, 8):
        assert torch.equal(
            grpo.group_advantages(r, g, scale_rewards), old_group_advantages(r, g, scale_rewards)
        )
    one = r[:1]
    assert torch.equal(
        grpo.group_advantages(one, 1, scale_rewards), old_group_advantages(one, 1, scale_rewards)
    )


def test_nanstd_is_trls():
    from trl.trainer.utils import nanstd

    r = rewards_with_every_case().view(4, 4)
    assert torch.equal(grpo.nanstd(r, dim=-1), nanstd(r, dim=-1))
    assert torch.equal(grpo.nanstd(r, dim=-1, keepdim=True), nanstd(r, dim=-1, keepdim=True))
    assert torch.isnan(grpo.nanstd(torch.tensor([1.0, torch.nan]))).item()  # one value: no std


@pytest.mark.parametrize("loss_type", grpo.LOSS_TYPES)
def test_aggregation_is_the_old_one_bit_for_bit(loss_type):
    torch.manual_seed(1)
    per_token = torch.randn(6, 9)
    mask = (torch.rand(6, 9) > 0.3).float()
    mask[2] = 0  # an empty completion
    tokens = torch.tensor(31.0)
    for accumulation in (1.0, 3.0):
        new = grpo.Aggregation(loss_type, accumulation, tokens, 12)(per_token, mask)
        assert torch.equal(new, old_aggregate(per_token, mask, loss_type, accumulation, tokens, 12))
    per_sequence = torch.randn(6)
    assert torch.equal(
        grpo.Aggregation(loss_type, 2.0).sequences(per_sequence), per_sequence.sum() / (6 * 2.0)
    )


def test_leading_dimensions_are_independent_steps():
    torch.manual_seed(2)
    rewards = torch.randn(5, 8, dtype=torch.float64)
    for scale in grpo.SCALE_REWARDS:
        batched = grpo.group_advantages(rewards, 4, scale)
        for i in range(5):
            torch.testing.assert_close(
                batched[i], grpo.group_advantages(rewards[i], 4, scale), rtol=0, atol=1e-15
            )
    per_token, mask = torch.randn(5, 8, 3, dtype=torch.float64), torch.ones(5, 8, 3)
    for loss_type in grpo.LOSS_TYPES:
        agg = grpo.Aggregation(loss_type, tokens=24.0, max_completion_length=3)
        batched = agg(per_token, mask)
        assert batched.shape == (5,)
        for i in range(5):
            torch.testing.assert_close(batched[i], agg(per_token[i], mask[i]), rtol=1e-15, atol=0)
    loo = grpo.leave_one_out(rewards, 4)
    for i in range(5):
        assert torch.equal(loo[i], grpo.leave_one_out(rewards[i], 4))


def test_leave_one_out_by_hand():
    x = torch.tensor([1.0, 2.0, 3.0, 6.0, 5.0, torch.nan, 7.0, torch.nan])
    got = grpo.leave_one_out(x, 4)
    # group 1: baselines (2+3+6)/3, (1+3+6)/3, (1+2+6)/3, (1+2+3)/3
    want = torch.tensor([1 - 11 / 3, 2 - 10 / 3, 3 - 9 / 3, 6 - 2, 5 - 7, 0.0, 7 - 5, 0.0])
    torch.testing.assert_close(got, want)
    # no other valid completion in the group: baseline 0
    torch.testing.assert_close(
        grpo.leave_one_out(torch.tensor([4.0, torch.nan]), 2), torch.tensor([4.0, 0.0])
    )
    # G/(G-1) times the deviation from the inclusive mean
    y = torch.randn(12, dtype=torch.float64)
    inclusive = y.view(-1, 4) - y.view(-1, 4).mean(-1, keepdim=True)
    torch.testing.assert_close(grpo.leave_one_out(y, 4), (inclusive * 4 / 3).flatten())


def test_reward_modes():
    torch.manual_seed(3)
    task, penalty = torch.randn(8), torch.rand(8)
    for scale in grpo.SCALE_REWARDS:
        shaped = grpo.advantages(task, penalty, 0.3, 4, scale, "shaped")
        assert torch.equal(shaped, grpo.group_advantages(task - 0.3 * penalty, 4, scale))
        separate = grpo.advantages(task, penalty, 0.3, 4, scale, "separate")
        task_only = grpo.group_advantages(task, 4, scale)
        assert torch.equal(separate, task_only - 0.3 * grpo.leave_one_out(penalty, 4))
        for mode in ("shaped", "separate"):  # no penalty, or beta 0: the task advantages
            assert torch.equal(grpo.advantages(task, None, 0.3, 4, scale, mode), task_only)
            assert torch.equal(grpo.advantages(task, penalty, 0.0, 4, scale, mode), task_only)
    # shaped with a constant task reward: the penalty rescaled to unit variance, whatever beta is
    constant = torch.zeros(4)
    a = grpo.advantages(constant, penalty[:4], 0.1, 4, "group", "shaped")
    b = grpo.advantages(constant, penalty[:4], 1.0, 4, "group", "shaped")
    torch.testing.assert_close(a, b, rtol=0.01, atol=0)  # up to the 1e-4 added to the std
    with pytest.raises(ValueError, match="separate, shaped"):
        grpo.advantages(task, penalty, 0.3, 4, "group", "normalised")
    with pytest.raises(ValueError, match="group, batch, none"):
        grpo.group_advantages(task, 4, "groups")


def test_policy_loss_gradient_is_minus_advantage_times_score():
    logp = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(4, 3)
    adv = torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64)
    grpo.policy_loss(adv, logp, mask, grpo.Aggregation("luspo")).backward()
    torch.testing.assert_close(logp.grad, -adv[:, None].expand(4, 3) / 4)


def test_leave_one_out_baseline_by_hand():
    x = torch.tensor([1.0, 2.0, 3.0, 6.0, torch.nan, 4.0])
    got = grpo.leave_one_out_baseline(x, 3)
    torch.testing.assert_close(got, torch.tensor([2.5, 2.0, 1.5, 4.0, 5.0, 6.0]))
    torch.testing.assert_close(grpo.leave_one_out(x, 3), torch.nan_to_num(x - got, nan=0.0))


@pytest.mark.parametrize("importance", ["none", "token", "sequence"])
@pytest.mark.parametrize(
    ("estimator", "placement", "level"), [("k1", "reward", "token"), ("k3", "both", "sequence")]
)
def test_reward_half_as_its_own_term_is_the_advantage_path_on_policy(estimator, placement, level, importance):
    """On-policy (behaviour = current log-probs: weights 1, ratio 1) the reward half as its own term
    beta * stopgrad(w (KL_hat - b)) log pi has the gradient of the separate-mode penalty advantage through the
    policy loss (clipped or not): the same update, whatever the importance weighting."""
    torch.manual_seed(0)
    n, t, g, beta = 8, 5, 4, 0.3
    logp = (-torch.rand(n, t, dtype=torch.float64) * 2).requires_grad_()
    ref = -torch.rand(n, t, dtype=torch.float64) * 2
    mask = torch.rand(n, t) > 0.2
    task = torch.randint(0, 2, (n,)).to(torch.float64)
    config = kl.KLConfig(estimator, placement, level, beta=beta, importance=importance)
    aggregation = grpo.Aggregation("dapo", tokens=mask.sum())
    penalty = kl.estimate(logp.detach(), ref, mask, estimator, level)

    old = grpo.policy_loss(
        grpo.advantages(task, penalty, beta, g, "group", "separate"), logp, mask, aggregation
    )
    (old_grad,) = torch.autograd.grad(old, logp)
    task_only = grpo.advantages(task, None, beta, g, "group", "separate")
    baseline = grpo.leave_one_out_baseline(penalty, g)
    own = beta * grpo.kl_reward_loss(logp, ref, mask, config, aggregation, baseline, logp.detach())
    for policy in (
        grpo.policy_loss(task_only, logp, mask, aggregation),
        grpo.clipped_policy_loss(task_only, logp, logp.detach(), mask, aggregation),
    ):
        (new_grad,) = torch.autograd.grad(policy + own, logp, retain_graph=True)
        torch.testing.assert_close(new_grad, old_grad, rtol=1e-12, atol=1e-14)


def test_clipped_policy_loss_clips_like_ppo():
    logp = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64)).requires_grad_()
    old = torch.log(torch.tensor([[0.25, 0.5]], dtype=torch.float64))  # ratios 2 and 1
    mask = torch.ones(1, 2)
    agg = grpo.Aggregation("luspo")
    (up,) = torch.autograd.grad(grpo.clipped_policy_loss(torch.tensor([1.0]), logp, old, mask, agg), logp)
    torch.testing.assert_close(up, torch.tensor([[0.0, -1.0]], dtype=torch.float64))  # ratio 2 > 1.2: clipped
    (down,) = torch.autograd.grad(grpo.clipped_policy_loss(torch.tensor([-1.0]), logp, old, mask, agg), logp)
    torch.testing.assert_close(down, torch.tensor([[2.0, 1.0]], dtype=torch.float64))  # A < 0: min keeps r A


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_sample_weights_per_token_are_their_product_per_sequence(level):
    """TRL's vLLM importance-sampling ratio comes per token (token_* modes) or per sequence (sequence_*): a
    sequence-level KL term weighs a sample by the product of its tokens' ratios (its probability ratio), so
    per-token ratios give what their per-sequence products give; a token-level term weighs each token."""
    torch.manual_seed(0)
    B, T = 6, 5
    logp, ref = torch.randn(B, T).requires_grad_(), torch.randn(B, T)
    mask = torch.ones(B, T)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    per_token = torch.rand(B, T) + 0.5
    per_sequence = torch.where(mask.bool(), per_token, 1.0).prod(-1, keepdim=True)
    config = kl.KLConfig("k3", "loss", level, beta=0.1)
    agg = grpo.Aggregation("dapo", tokens=mask.sum())
    with_tokens = grpo.kl_loss(logp, ref, mask, config, agg, sample_weights=per_token)
    if level == "sequence":
        torch.testing.assert_close(
            with_tokens, grpo.kl_loss(logp, ref, mask, config, agg, sample_weights=per_sequence)
        )
    else:
        terms = kl.token_terms(logp, ref, mask, config)
        torch.testing.assert_close(with_tokens, agg(terms * per_token, mask))
    assert not torch.allclose(with_tokens, grpo.kl_loss(logp, ref, mask, config, agg))


def test_engine_agreement_counts_what_trls_correction_keeps():
    """Sequence modes: a sequence's ratio is exp of its summed token log-ratios, kept inside [min, max]; token
    modes: each completion token's; a token the engine could not score (NaN) has ratio 1 and no difference."""
    import math

    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -0.5], [-2.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    log_ratio = torch.tensor(
        [[math.log(4) / 2, math.log(4) / 2, 5.0], [0.0, 0.0, 0.0], [-0.1, math.nan, 0.1]]
    )
    engine = trainer - log_ratio
    kept, units, ratios, gaps, tokens = grpo.engine_agreement(
        trainer, engine, mask, "sequence_mask", None, 3.0
    )
    # the first sequence's ratio is 4 > 3; its padding token's log-ratio 5 is not counted
    assert (kept, units) == (2, 3)
    assert ratios.item() == pytest.approx(4 + 1 + 1)
    assert tokens == 7 and gaps.item() == pytest.approx(2 * math.log(4) / 2 + 0.2)
    kept, units, ratios, _, _ = grpo.engine_agreement(trainer, engine, mask, "token_truncate", 0.95, 3.0)
    token_ratios = [2, 2, 1, 1, 1, math.exp(-0.1), 1, math.exp(0.1)]  # exp(-0.1) < 0.95: the one out
    assert (kept, units) == (7, 8) and ratios.item() == pytest.approx(sum(token_ratios))


@pytest.mark.parametrize("mode", kl.REWARD_MODES)
@pytest.mark.parametrize("scale_rewards", grpo.SCALE_REWARDS)
def test_default_advantage_spec_is_the_trainers_advantages(scale_rewards, mode):
    """``grpo.Advantage`` with the trainer's scaling (TRL's GRPO) gives ``grpo.advantages`` bit for bit, the
    per-token penalties summed: the audit models klsweep's own trainer with it."""
    torch.manual_seed(1)
    task = (torch.rand(2, 8) < 0.5).double()
    mask = torch.rand(2, 8, 5) < 0.8
    tokens = torch.randn(2, 8, 5, dtype=torch.float64) * mask
    spec = grpo.Advantage("group", scale_rewards)
    got = grpo.advantage_of(spec, task, tokens, mask, 0.3, 4, mode)
    assert torch.equal(got, grpo.advantages(task, tokens.sum(-1), 0.3, 4, scale_rewards, mode))


def test_advantage_specs_by_hand():
    """RLOO: the score less the mean of the others in its group; Dr.GRPO: less the group's mean; per-token
    returns: the task reward less the penalties from each token on; whitening: mean 0, Bessel variance 1
    over the step's completion tokens."""
    task = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    tokens = torch.tensor([[1.0, 2.0], [0.0, 4.0], [2.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]], dtype=torch.bool)
    score = task - 0.5 * (tokens * mask).sum(-1)  # [-0.5, -2.0, 0.0, 0.5]
    rloo = grpo.advantage_of(grpo.Advantage("leave_one_out", "none"), task, tokens, mask, 0.5, 4, "shaped")
    others = (score.sum() - score) / 3
    assert torch.allclose(rloo, score - others)
    dr = grpo.advantage_of(grpo.Advantage("group", "none"), task, tokens, mask, 0.5, 4, "shaped")
    assert torch.allclose(dr, score - score.mean())
    spec = grpo.Advantage("none", "none", returns="token")
    to_go = grpo.advantage_of(spec, task, tokens, mask, 0.5, 4, "shaped")
    assert torch.allclose(to_go, torch.tensor([[-0.5, 0.0], [-2.0, -2.0], [0.0, 0.0], [0.5, 1.0]]).double())
    white = grpo.advantage_of(grpo.Advantage("none", "none", returns="token", whiten="unbiased"),
                              task, tokens, mask, 0.5, 4, "shaped")  # fmt: skip
    kept = white[mask]
    assert abs(kept.mean().item()) < 1e-12
    assert abs(kept.var().item() - 1) < 1e-6
    assert (white[~mask] == 0).all()
    with pytest.raises(ValueError, match="never divided"):
        grpo.Advantage("leave_one_out", "group")
