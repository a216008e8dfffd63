"""GRPO's advantages and policy-loss aggregation as pure torch functions: the one implementation that the
trainer (``klsweep.trainer``) and the GRPO audit (``klsweep.audit.grpo_audit``) both call.

- ``group_advantages``: TRL's ``sum_then_normalize`` advantages (``scale_rewards`` group | batch | none), op for
  op, so that the trainer's advantages are TRL's bit for bit;
- ``leave_one_out``: a value centred by the mean of the *other* completions of its group;
- ``advantages``: the advantage of each completion given its task reward and its KL penalty in the reward,
  per ``reward_mode`` (below);
- ``Aggregation``: how TRL reduces a per-token loss of each ``loss_type`` to a scalar (``__call__``), and how
  klsweep reduces a per-sequence KL term (``sequences``: sum over sequences / (sequences x accumulation));
- ``kl_loss``: the loss-placed KL term the trainer adds (before beta); ``policy_loss``: the on-policy surrogate
  of TRL's policy loss, ``aggregate(-A * log pi)``, whose gradient at importance ratio 1 is TRL's for every loss
  type but vespo (see its docstring for cispo; the tests check it against the real trainer);
- ``engine_agreement``: a generation engine's log-probs of its samples against the trainer's (vLLM: what TRL's
  importance-sampling correction keeps, the mean ratio, the mean log-prob difference).

Every function accepts leading batch dimensions: ``[..., N]`` completions (``[..., N, T]`` tokens) reduce to
``[...]``, each leading index an independent optimiser step (the audit enumerates many steps at once); the
trainer calls them with one step.

Reward modes, for completions i = 1..G of a group, task reward R_i and penalty P_i = beta * KL_hat(y_i):

- ``shaped``: A_i = (R_i - P_i - mean_j (R_j - P_j)) / (std_j (R_j - P_j) + eps). The penalty is normalised
  with the task reward (TRL reward functions, verl's KL-in-reward). Its expected update is not beta x
  E[KL_hat grad log pi]: the inclusive group mean scales it by (1 - 1/G) and the std rescales it, by a factor
  that depends on beta (when every completion has the same task reward, the KL part is rescaled to unit
  variance whatever beta is).
- ``separate``: A_i = (R_i - mean_j R_j) / (std_j R_j + eps) - beta (KL_hat_i - mean_{j != i} KL_hat_j). The
  task reward is normalised as GRPO does; the penalty gets its own advantage, centred by a leave-one-out
  baseline (independent of y_i, so it adds no bias) and never scaled. The expected KL part of the update is
  then exactly beta x E[stopgrad(KL_hat(y)) grad log pi(y)], aggregated like the policy loss, at any beta.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from klsweep import kl as klmath

if TYPE_CHECKING:
    from torch import Tensor

SCALE_REWARDS = ("group", "batch", "none")
LOSS_TYPES = ("grpo", "sapo", "bnpo", "dr_grpo", "dapo", "cispo", "vespo", "luspo")
EPS = 1e-4  # TRL's: advantages / (std + 1e-4)


def nanstd(x: Tensor, dim: int = -1, keepdim: bool = False) -> Tensor:
    """The standard deviation over ``dim`` ignoring NaNs, with Bessel's correction (NaN for fewer than two
    values): the operations of ``trl.trainer.utils.nanstd``, without importing TRL."""
    import torch

    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    variance *= correction
    std = torch.sqrt(variance)
    return std if keepdim else std.squeeze(dim)


def group_advantages(rewards: Tensor, group_size: int, scale_rewards: str) -> Tensor:
    """TRL's ``sum_then_normalize`` advantages of rewards ``[..., N]`` (consecutive groups of ``group_size``
    completions; NaN = unscorable, left out of the statistics, advantage 0): reward minus its group's mean,
    divided by (std + 1e-4) of its group (``group``) or of all N (``batch``), or not divided (``none``)."""
    import torch

    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards={scale_rewards!r} is not one of {', '.join(SCALE_REWARDS)}")
    g = group_size
    grouped = rewards.unflatten(-1, (-1, g))
    mean = torch.nanmean(grouped, dim=-1, keepdim=True).expand_as(grouped).flatten(-2)
    if scale_rewards in ("group", "none"):
        if g > 1:
            std = nanstd(grouped, dim=-1, keepdim=True).expand_as(grouped).flatten(-2)
        else:
            std = torch.zeros_like(rewards)
    elif rewards.size(-1) > 1:  # batch
        std = nanstd(rewards, dim=-1, keepdim=True).expand_as(rewards)
    else:
        std = torch.zeros_like(rewards)
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + EPS)
    return torch.nan_to_num(advantages, nan=0.0)


def leave_one_out(values: Tensor, group_size: int) -> Tensor:
    """``x_i - mean_{j != i} x_j`` over the other completions of i's group, for values ``[..., N]``. NaN values
    are left out of the baselines and get 0; a completion with no other valid one in its group keeps its value
    (baseline 0). Because the baseline does not depend on y_i, E[(x_i - b_i) grad log pi(y_i)] =
    E[x_i grad log pi(y_i)] exactly (an inclusive group mean would give (1 - 1/G) times that)."""
    import torch

    return torch.nan_to_num(values - leave_one_out_baseline(values, group_size), nan=0.0)


def leave_one_out_baseline(values: Tensor, group_size: int) -> Tensor:
    """``mean_{j != i} x_j`` over the other valid (not NaN) completions of i's group, for values ``[..., N]``;
    0 where i has no other valid one."""
    import torch

    grouped = values.unflatten(-1, (-1, group_size))
    valid = ~torch.isnan(grouped)
    filled = torch.where(valid, grouped, torch.zeros((), dtype=grouped.dtype, device=grouped.device))
    others = valid.sum(-1, keepdim=True) - valid.to(torch.long)
    baseline = (filled.sum(-1, keepdim=True) - filled) / others.clamp(min=1)
    return torch.where(others > 0, baseline, torch.zeros_like(baseline)).flatten(-2)


def advantages(
    task_reward: Tensor,
    penalty: Tensor | None,
    beta: float,
    group_size: int,
    scale_rewards: str,
    reward_mode: str,
) -> Tensor:
    """The advantage ``[..., N]`` of each completion given its task reward and its detached KL penalty
    ``KL_hat`` in the reward (``penalty``; None or ``beta == 0``: no KL in the reward), per ``reward_mode``
    (see the module docstring)."""
    if penalty is None or beta == 0:
        return group_advantages(task_reward, group_size, scale_rewards)
    if reward_mode == "shaped":
        return group_advantages(task_reward - beta * penalty, group_size, scale_rewards)
    if reward_mode == "separate":
        task = group_advantages(task_reward, group_size, scale_rewards)
        return task - beta * leave_one_out(penalty, group_size)
    raise ValueError(f"reward_mode={reward_mode!r} is not one of {', '.join(klmath.REWARD_MODES)}")


BASELINES = ("group", "leave_one_out", "none")
RETURNS = ("sequence", "token")
WHITENS = ("none", "unbiased", "biased")


@dataclass(frozen=True)
class Advantage:
    """The advantage estimator a framework's config selects, as ``advantage_of`` computes it (the frameworks'
    readers fill it; klsweep's own trainer is ``Advantage()`` with its ``scale_rewards``, TRL's GRPO):

    - ``baseline``: what is subtracted from a completion's score: its group's mean (``group``: GRPO,
      Dr.GRPO), the mean of the *other* completions of its group (``leave_one_out``: RLOO; the same as
      ``(x - mean) G / (G - 1)``), or nothing (``none``: REINFORCE++);
    - ``scale``: the centred score divided by (std + ``eps``) of its group, of the step, or not (``none``);
      Bessel's std, as TRL, verl, SkyRL and OpenRLHF take it;
    - ``returns``: ``sequence``: one advantage per completion, from its score (the task reward less the
      penalty's sum); ``token``: each token's return, the task reward less the penalties of that token and
      the ones after it (``gamma`` 1: verl's and SkyRL's REINFORCE++, OpenRLHF's cumulative returns); only
      with ``baseline`` and ``scale`` none unless the KL enters after the normalisation (``separate``);
    - ``whiten``: then ``(x - mean) / sqrt(var + whiten_eps)`` over every completion token of the step:
      ``unbiased`` (Bessel's variance: verl's and SkyRL's ``masked_whiten``), ``biased`` (OpenRLHF: the
      population variance, clamped at ``whiten_eps`` rather than added), ``none``.

    Where the KL in the reward enters is the KL configuration's ``reward_mode``: ``shaped``, in the score
    before the normalisation; ``separate``, after it: klsweep's own advantage (``returns`` sequence: the
    penalty centred by its leave-one-out baseline) or the frameworks' per-token returns (``returns`` token:
    the task reward normalised per ``baseline`` and ``scale``, then the penalties after each token
    subtracted unnormalised: OpenRLHF)."""

    baseline: str = "group"
    scale: str = "group"
    eps: float = EPS
    returns: str = "sequence"
    whiten: str = "none"
    whiten_eps: float = 1e-8

    def __post_init__(self) -> None:
        for name, allowed in (
            ("baseline", BASELINES),
            ("scale", SCALE_REWARDS),
            ("returns", RETURNS),
            ("whiten", WHITENS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is not one of {', '.join(allowed)}")
        if self.baseline != "group" and self.scale != "none":
            raise ValueError(f"a {self.baseline} baseline is never divided by a std (scale none)")

    @property
    def label(self) -> str:
        """A short name: grpo (group std), dr_grpo (no std), rloo, reinforce++, reinforce++ baseline, ...;
        with ``+ whiten`` or ``per-token returns`` where they apply."""
        name = {"leave_one_out": "rloo", "none": "reinforce"}.get(self.baseline, "grpo")
        if self.baseline == "group":
            name = {"group": "grpo", "batch": "grpo batch-std", "none": "dr_grpo"}[self.scale]
        parts = [name]
        if self.returns == "token":
            parts.append("per-token returns")
        if self.whiten != "none":
            parts.append(f"whitened over the step ({self.whiten} var)")
        return ", ".join(parts)

    @property
    def spans_step(self) -> bool:
        """Whether a statistic spans the step's groups (batch std, whitening): the audit then enumerates
        steps of several groups."""
        return self.scale == "batch" or self.whiten != "none"


def _centred(scores: Tensor, spec: Advantage, group_size: int) -> Tensor:
    """Scores ``[..., N]`` less their baseline, divided per ``spec.scale``."""
    if spec.baseline == "leave_one_out":
        return scores - leave_one_out_baseline(scores, group_size)
    if spec.baseline == "group":
        if spec.eps == EPS:  # TRL's own operations, bit for bit
            return group_advantages(scores, group_size, spec.scale)
        scaled = group_advantages(scores, group_size, "none")
        if spec.scale == "none":
            return scaled
        import torch

        spread = scores.unflatten(-1, (-1, group_size)) if spec.scale == "group" else scores.unsqueeze(-2)
        std = nanstd(spread, dim=-1, keepdim=True).expand_as(spread).flatten(-2)
        return scaled / (torch.nan_to_num(std, nan=0.0) + spec.eps)
    return scores


def _whitened(x: Tensor, mask: Tensor, spec: Advantage) -> Tensor:
    """``x`` ``[..., N, T]`` whitened over the completion tokens of each step (``mask``), per ``spec.whiten``."""
    import torch

    m = mask.to(x.dtype).expand_as(x)
    count = m.sum((-2, -1), keepdim=True)
    mean = (x * m).sum((-2, -1), keepdim=True) / count
    var = ((x - mean) ** 2 * m).sum((-2, -1), keepdim=True) / count
    if spec.whiten == "unbiased":
        return (x - mean) * torch.rsqrt(var * count / (count - 1) + spec.whiten_eps) * m
    return (x - mean) * var.clamp(min=spec.whiten_eps).rsqrt() * m


def advantage_of(
    spec: Advantage,
    task_reward: Tensor,
    penalty: Tensor | None,
    mask: Tensor,
    beta: float,
    group_size: int,
    reward_mode: str,
) -> Tensor:
    """The advantage of each completion ``[..., N]`` (``spec.returns`` sequence, no whitening) or of each of
    its tokens ``[..., N, T]``, per ``spec`` (see ``Advantage``), given the task reward ``[..., N]`` and the
    detached KL penalty per token ``[..., N, T]`` (``kl.penalty_tokens``; None or ``beta == 0``: no KL in the
    reward), placed per ``reward_mode``. ``mask`` ``[..., N, T]``: the completion tokens."""
    import torch

    if reward_mode not in klmath.REWARD_MODES:
        raise ValueError(f"reward_mode={reward_mode!r} is not one of {', '.join(klmath.REWARD_MODES)}")
    if penalty is None or beta == 0:
        penalty = torch.zeros(mask.shape, dtype=task_reward.dtype, device=task_reward.device)
    penalty = penalty * mask
    if spec.returns == "sequence":
        total = penalty.sum(-1)
        if reward_mode == "shaped":
            adv = _centred(task_reward - beta * total, spec, group_size)
        else:
            adv = _centred(task_reward, spec, group_size) - beta * leave_one_out(total, group_size)
        adv = torch.nan_to_num(adv, nan=0.0)
        if spec.whiten == "none":
            return adv
        return _whitened(adv.unsqueeze(-1).expand(mask.shape), mask, spec)
    to_go = penalty.flip(-1).cumsum(-1).flip(-1)  # the penalties of each token and the ones after it
    if reward_mode == "shaped":
        if spec.baseline != "none" or spec.scale != "none":
            raise ValueError("per-token returns with the KL shaped in: only without baseline and scale")
        adv = task_reward.unsqueeze(-1) - beta * to_go
    else:
        adv = torch.nan_to_num(_centred(task_reward, spec, group_size), nan=0.0).unsqueeze(-1) - beta * to_go
    adv = adv * mask
    return adv if spec.whiten == "none" else _whitened(adv, mask, spec)


@dataclass(frozen=True)
class Aggregation:
    """How one optimiser step reduces per-token losses ``[..., B, T]`` to ``[...]``, per TRL ``loss_type``:

    - grpo, sapo: each sequence's mean over its tokens, then the mean over sequences;
    - bnpo: the sum over all tokens / the number of tokens of the micro-batch;
    - dr_grpo: the sum / (sequences x ``max_completion_length``);
    - dapo, cispo, vespo: the sum / ``tokens`` (TRL: the completion tokens of the whole optimiser step, per
      process; the accumulation is already in it);
    - luspo: each sequence's sum over its tokens, then the mean over sequences;

    all but dapo/cispo/vespo then divided by ``accumulation`` (gradient-accumulation steps).
    """

    loss_type: str
    accumulation: float = 1.0
    tokens: Any = None  # dapo/cispo/vespo normaliser (a number or a 0-d tensor)
    max_completion_length: int | None = None  # dr_grpo

    def __call__(self, per_token: Tensor, mask: Tensor) -> Tensor:
        x = per_token * mask
        if self.loss_type in ("grpo", "sapo"):
            return (x.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean(-1) / self.accumulation
        if self.loss_type == "bnpo":
            return x.sum((-2, -1)) / mask.sum((-2, -1)).clamp(min=1.0) / self.accumulation
        if self.loss_type == "dr_grpo":
            return x.sum((-2, -1)) / (x.size(-2) * self.max_completion_length) / self.accumulation
        if self.loss_type in ("cispo", "dapo", "vespo"):
            return x.sum((-2, -1)) / self.tokens
        if self.loss_type == "luspo":
            return x.sum(-1).mean(-1) / self.accumulation
        raise ValueError(f"loss_type {self.loss_type!r} is not one of {', '.join(LOSS_TYPES)}")

    def sequences(self, per_sequence: Tensor) -> Tensor:
        """A per-sequence term ``[..., B]`` averaged over the sequences of the step, whatever the loss type:
        the sum / (B x accumulation). (So a sequence-level KL in the loss is not divided by tokens: at the
        same beta it is about mean-length times stronger than the token level under dapo, grpo or bnpo.)"""
        return per_sequence.sum(-1) / (per_sequence.size(-1) * self.accumulation)


def kl_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    config: klmath.KLConfig,
    aggregation: Aggregation,
    behavior_logp: Tensor | None = None,
    sample_weights: Tensor | None = None,
) -> Tensor:
    """The loss-placed KL term of ``config`` (its ``placement`` is ignored), before beta: token level,
    ``kl.token_terms`` aggregated like the policy loss; sequence level, ``kl.surrogate`` averaged over the
    sequences (``Aggregation.sequences``). ``behavior_logp`` feeds the importance weights, if any;
    ``sample_weights`` (``[..., B, T]`` or ``[..., B, 1]``, detached) weigh each sample's terms: TRL's vLLM
    importance-sampling ratio (docs/KL.md, "Generated by vLLM")."""
    import dataclasses

    config = dataclasses.replace(config, placement="loss")
    if config.level == "token":
        terms = klmath.token_terms(logp, ref_logp, mask, config, behavior_logp=behavior_logp)
        return aggregation(terms if sample_weights is None else terms * sample_weights.detach(), mask)
    per_sequence = klmath.surrogate(logp, ref_logp, mask, config, behavior_logp=behavior_logp)
    if sample_weights is not None:
        per_sequence = per_sequence * sequence_weights(sample_weights.detach(), mask)
    return aggregation.sequences(per_sequence)


def sequence_weights(weights: Tensor, mask: Tensor) -> Tensor:
    """A weight per sequence ``[..., B]`` from one per sequence ``[..., B, 1]`` or per token ``[..., B, T]``
    (then the product over the sequence's tokens: the ratio of its probabilities)."""
    import torch

    if weights.size(-1) == 1:
        return weights.squeeze(-1)
    return torch.where(mask.bool(), weights, torch.ones_like(weights)).prod(-1)


def kl_reward_loss(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    config: klmath.KLConfig,
    aggregation: Aggregation,
    baseline: Tensor,
    behavior_logp: Tensor | None = None,
    sample_weights: Tensor | None = None,
) -> Tensor:
    """The reward half as its own term (``config.reward_term``: separate mode, the current policy's
    log-probs), before beta: ``aggregation(stopgrad(w (KL_hat - b)) log pi)``, outside the clipped ratio.
    ``KL_hat`` is ``kl.penalty`` of the detached ``logp`` (the training forward pass), ``b`` [..., B] the
    leave-one-out baseline of each completion (the mean of the other completions' penalties in its group,
    whatever their log-probs: independent of y_i, so it adds no bias wherever E[w grad log pi] = 0), ``w``
    ``kl.importance_weights`` against ``behavior_logp``, times ``sample_weights`` (as in ``kl_loss``). On-policy
    (w = 1, ratio 1) its gradient is the gradient of the separate-mode penalty advantage through
    ``policy_loss``."""
    penalty = klmath.penalty(logp.detach(), ref_logp, mask, config)
    weights = klmath.importance_weights(logp, behavior_logp, mask, config)
    scores = (weights * (penalty - baseline).unsqueeze(-1)).detach()
    if sample_weights is not None:
        scores = scores * sample_weights.detach()
    return aggregation(scores * logp, mask)


def clipped_policy_loss(
    advantages: Tensor,
    logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    aggregation: Aggregation,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
) -> Tensor:
    """TRL's policy loss of grpo, bnpo, dr_grpo, dapo and luspo off-policy (token-level ratio, no ``delta``):
    ``aggregation(-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A))`` with ``r = exp(log pi - old_logp)``.
    At ``old_logp = log pi`` its gradient is ``policy_loss``'s."""
    import torch

    if advantages.dim() == logp.dim() - 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.detach()
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    return aggregation(-torch.min(ratio * advantages, clipped * advantages), mask)


def policy_loss(advantages: Tensor, logp: Tensor, mask: Tensor, aggregation: Aggregation) -> Tensor:
    """``aggregation(-A * log pi)``: on-policy (importance ratio 1, so no clipping is active) its gradient is
    the gradient of TRL's policy loss for every loss type but vespo (cispo: with ``epsilon_high >= 1``; below
    1 TRL's cispo clips the ratio 1 to epsilon_high, scaling the whole loss by that constant); its value is not
    TRL's loss value.
    ``advantages`` ``[..., B]`` (one per sequence) or ``[..., B, T]``."""
    if advantages.dim() == logp.dim() - 1:
        advantages = advantages.unsqueeze(-1)
    return aggregation(-advantages.detach() * logp, mask)


def engine_agreement(
    trainer_logps: Tensor,
    engine_logps: Tensor,
    mask: Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> Tensor:
    """How the generation engine's log-probs of its own samples compare with the training engine's at the same
    weights, as sums over this process's completions (to be added over processes): [units kept, units, sum of
    the ratios, sum of |log-prob difference| over tokens, tokens]. A unit is a sequence (TRL's ``sequence_*``
    modes: the ratio is exp of the summed token log-ratios) or a completion token (``token_*``); its ratio
    pi_trainer/pi_engine is kept when it lies in [clip_min, clip_max] (what TRL's mask modes keep and its
    truncate modes leave unclipped). Tokens the engine could not score (NaN) count as log-ratio 0, as in TRL."""
    import torch

    diff = torch.nan_to_num((trainer_logps - engine_logps).double() * mask, nan=0.0)
    ratio = torch.exp(diff.sum(-1)) if mode.startswith("sequence") else torch.exp(diff[mask.bool()])
    low = -torch.inf if clip_min is None else clip_min
    high = torch.inf if clip_max is None else clip_max
    kept = ((ratio >= low) & (ratio <= high)).sum()
    scored = mask.bool() & ~torch.isnan(trainer_logps - engine_logps)
    gap = (trainer_logps - engine_logps).abs().double()[scored]
    values = [kept, ratio.numel(), ratio.sum(), gap.sum(), gap.numel()]
    return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=mask.device) for v in values])
