"""The KL math of klsweep: the estimators k1/k2/k3, their placement (reward, loss, both), their level (token,
sequence), importance weighting for off-policy samples, and a forward-KL estimate for monitoring. This is the
only implementation of the estimators in the project; the trainer and both audits (``klsweep audit``,
``klsweep audit --grpo``) call it.

What is exact, and where. ``surrogate`` is the *per-sample* KL-gradient estimate of a configuration; its
expectation, on-policy, is what the table of docs/KL.md states (``klsweep audit`` proves it by enumeration).
The trainer uses these functions as they are for the loss half (``placement`` loss, and the loss half of
both). For the reward half it uses ``estimate`` (the detached penalty) and GRPO's advantages
(``klsweep.grpo``): with ``reward_mode="separate"`` the expected update of the KL part is exactly beta times
the expectation of ``surrogate``'s reward term (aggregated like the policy loss); with ``reward_mode="shaped"``
it is not (the penalty is normalised with the task reward: see docs/KL.md, "beta in the reward"). Off-policy,
``reward_logp`` says whose log-ratio the reward half uses (``KLConfig.reward_term``; docs/KL.md, "Off-policy").

Notation (see docs/KL.md): for a sampled completion y, per unmasked token t,
``delta_t = log pi_theta(y_t | y_<t) - log pi_ref(y_t | y_<t)``; ``k1 = delta``, ``k2 = delta**2 / 2``,
``k3 = exp(-delta) - 1 + delta``. Token level: ``KL_hat(y) = sum_t k(delta_t)``; sequence level:
``KL_hat(y) = k(sum_t delta_t)``.

``surrogate`` returns, per sequence, the scalar whose gradient is the configuration's KL-gradient estimate for
that sample (before beta and before averaging over the batch):

- ``reward``: ``stopgrad(KL_hat(y)) * log pi_theta(y)`` (score function: the penalty reaches the parameters
  only through log pi, as a reward does);
- ``loss``: ``KL_hat(y)``, differentiated directly (pathwise);
- ``both``: the sum of the two.

Importance weighting, for samples drawn from a behaviour policy mu (``behavior_logp``) rather than pi_theta;
the weights are detached (unless ``importance_gradient``), so they reweight the gradient without adding terms
to it:

- ``none``: no weight.
- ``sequence``: every term of the sequence is multiplied by ``w(y) = stopgrad(pi_theta(y) / mu(y))``. Then
  ``E_mu[w grad surrogate] = E_pi[grad surrogate]``: every configuration has exactly its on-policy expected
  gradient (so the on-policy unbiased ones are unbiased again), at the price of the variance of ``w``.
- ``token``: the term at token t is multiplied by ``stopgrad(pi_theta(y_t|y_<t) / mu(y_t|y_<t))``, the
  weighting of TRL's ``use_bias_correction_kl`` (which, unlike this, does not detach it). This corrects the
  distribution of each token given its prefix, but not the distribution of the prefix itself, so it is exact
  only for length-1 completions; ``klsweep audit --behavior-shift`` shows what it leaves biased.

``importance_cap`` > 0 truncates the weights at the cap (``importance_weights``): a bias where w > cap.

``sequence_mean`` weights every token by the geometric mean of the sequence's per-token ratios,
``exp(mean_t log(pi_theta/mu))``: TRL's ``importance_sampling_level: sequence`` (GSPO's ratio), which with
``use_bias_correction_kl`` multiplies each token's KL by it (TRL issue #6586; docs/KL.md). ``self`` weights
each token by ``pi_theta / stopgrad(pi_theta)``, 1 whatever the sampling policy: with ``importance_gradient``
only its gradient counts (NeMo-RL's KL without ``use_on_policy_kl_approximation``).

The frameworks' own forms (their presets: klsweep/conf/preset/, docs/KL.md, "What each framework's KL does"):

- ``importance_gradient``: the weight keeps its gradient (TRL's ``per_token_kl * coef_1``, slime's
  ``--use-unbiased-kl``). On-policy its value is 1 and the term at token t becomes
  ``grad k(delta_t) + k(delta_t) grad log pi_theta(y_t | y_<t)``: the pathwise term plus each token's own
  score term (not the later tokens').
- ``straight_through``: the loss-placed term has the value of the estimator and the gradient of k2 (verl's
  ``+`` suffix, e.g. ``low_var_kl+``): ``k2 - stopgrad(k2) + stopgrad(k)``.
- ``unbiased_gradient``: the loss-placed term has the gradient of ``stopgrad(w delta_t) log pi_theta(y_t | y_<t)``
  per token and the (clamped) estimator's value (OpenRLHF's ``--algo.kl.unbiased_gradient``, PR #1309,
  ``compute_approx_kl`` in openrlhf 0.11.2: a detached weight capped at ``KL_IS_WEIGHT_CLIP`` = 10 times k1
  times grad log pi, for every estimator, and not clamped where the estimate's value is), ``w`` the importance
  weight of ``importance`` capped at ``importance_cap``.
- ``log_ratio_clamp`` > 0 clamps the log-ratio to +-that before the estimator, ``value_clamp`` > 0 clamps the
  estimator's value (verl and SkyRL: 20 and 10 on k3; NeMo-RL: 20 and 10 on every estimator; OpenRLHF and
  AReaL: the value at 10; PipelineRL's shipped configs: the log-ratio at 5), wherever the configured penalty is
  computed (reward and loss). A clamp stops the gradient *through the estimator* where it bites; a weight
  that keeps its gradient (``importance_gradient``) still carries ``k_clamped * grad w`` there, unless
  ``clamp_detaches_weight``. ``clamped_share`` says how many units were clamped (the trainer's
  ``kl/clamped`` metric, at the sampled log-probs, where every weight is 1).
- ``clamp_weighted``: the loss half's value clamp applies to the weighted term ``w * k`` instead of to ``k``
  before the weight (NeMo-RL's ``calculate_kl``; slime's ``low_var_kl`` with ``--use-unbiased-kl``): where
  ``|w k|`` exceeds the clamp the term has no gradient at all.
- ``clamp_detaches_weight``: where the log-ratio clamp bites, the loss half's weight is detached (NeMo-RL's
  ``calculate_kl``): such a token has no gradient at all.
- ``beta_final`` (not None): beta decays linearly from ``beta`` at the first step towards it; ``beta_final_at``
  says where it arrives: ``last``, at the last step (klsweep's), or ``end``, at step ``steps``, one past the
  last, so never reached (PipelineRL's ``kl_coef`` to ``final_kl_coef`` over completed_steps / max_steps);
  ``beta_at`` gives the coefficient of a step.

Masked positions (``mask`` false) never affect a value or a gradient, whatever they hold (nan and inf
included): they are removed with ``torch.where``, never by multiplication.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING

from klsweep.errors import Problem, UserError

if TYPE_CHECKING:
    from torch import Tensor

ESTIMATORS = ("k1", "k2", "k3")  # Schulman's, the audits' full tables
ESTIMATOR_CHOICES = (*ESTIMATORS, "abs")  # every valid kl.estimator (abs: |delta|, verl's "abs")
PLACEMENTS = ("reward", "loss", "both")
LEVELS = ("token", "sequence")
IMPORTANCE = ("none", "token", "sequence")  # the audits' "all"
# every valid kl.importance (sequence_mean: TRL's sequence level; self: pi_theta/stopgrad(pi_theta), NeMo-RL's)
IMPORTANCE_CHOICES = (*IMPORTANCE, "sequence_mean", "self")
REWARD_MODES = ("separate", "shaped")  # how a penalty in the reward enters GRPO's advantage (klsweep.grpo)
REWARD_LOGPS = ("current", "behavior")  # whose log-ratio the reward-placed penalty uses (separate mode)
BETA_FINAL_AT = ("last", "end")  # where a decaying beta reaches beta_final: the last step, or one past it


@dataclass(frozen=True)
class KLConfig:
    """One KL configuration. Invalid values raise ``UserError`` listing every problem at once."""

    estimator: str  # k1 | k2 | k3
    placement: str  # reward | loss | both
    level: str = "token"  # token | sequence
    beta: float = 0.0  # coefficient of the KL term (>= 0); the trainer applies it, not surrogate()
    importance: str = "none"  # none | token | sequence: stop-gradient pi_theta/mu weighting off-policy
    # separate | shaped: how the reward-placed penalty enters GRPO's advantage (klsweep.grpo.advantages):
    # separate: its own leave-one-out-centred advantage, no std scaling, so the expected KL update is exactly
    # beta x E[stopgrad(KL_hat) grad log pi]; shaped: added to the task reward and normalised with it (TRL
    # reward functions, verl's use_kl_in_reward).
    reward_mode: str = "separate"
    # current | behavior: whose log-probs the reward-placed penalty is evaluated with, in separate mode.
    # current: the detached log-probs of the training forward pass, the reward half its own term
    # beta * stopgrad(w (KL_hat - b)) log pi outside the clipped ratio, weighted by ``importance``;
    # behavior: the sampling policy's, inside the advantage (and so the clipped ratio), no weight.
    # On-policy the two are the same computation. Shaped mode always uses the behaviour's.
    reward_logp: str = "current"
    importance_cap: float = 0.0  # > 0: the importance weights are min(w, cap) (biased where w > cap)
    # The frameworks' forms (module docstring); the defaults are klsweep's own computation.
    importance_gradient: bool = False  # the loss half's weight keeps its gradient (TRL, slime)
    straight_through: bool = False  # loss half: the estimator's value, k2's gradient (verl's "+")
    unbiased_gradient: bool = False  # loss half: stopgrad(w k) log pi per token (OpenRLHF PR #1309)
    log_ratio_clamp: float = 0.0  # > 0: delta clamped to +-this before the estimator (0: none)
    value_clamp: float = 0.0  # > 0: the estimator's value clamped to +-this (0: none)
    clamp_weighted: bool = False  # loss half: value_clamp applies to w x k, not to k (NeMo-RL)
    clamp_detaches_weight: bool = False  # loss half: w detached where the log-ratio clamp bites (NeMo-RL)
    beta_final: float | None = None  # not None: beta decays linearly to this (at beta_final_at)
    beta_final_at: str = "last"  # last: beta_final at the last step; end: one past it (PipelineRL)

    @property
    def reward_term(self) -> bool:
        """Whether the reward half is its own loss term (``grpo.kl_reward_loss``) rather than part of the
        advantage: separate mode with the current policy's log-probs."""
        return (
            self.placement in ("reward", "both")
            and self.reward_mode == "separate"
            and self.reward_logp == "current"
        )

    def __post_init__(self) -> None:
        problems = [
            Problem(name, f"{value!r} is not valid", ", ".join(allowed))
            for name, value, allowed in (
                ("estimator", self.estimator, ESTIMATOR_CHOICES),
                ("placement", self.placement, PLACEMENTS),
                ("level", self.level, LEVELS),
                ("importance", self.importance, IMPORTANCE_CHOICES),
                ("reward_mode", self.reward_mode, REWARD_MODES),
                ("reward_logp", self.reward_logp, REWARD_LOGPS),
                ("beta_final_at", self.beta_final_at, BETA_FINAL_AT),
            )
            if value not in allowed
        ]
        beta = self.beta
        if (
            isinstance(beta, bool)
            or not isinstance(beta, numbers.Real)
            or not math.isfinite(beta)
            or beta < 0
        ):
            problems.append(Problem("beta", f"{beta!r} is not valid", "a finite number >= 0"))
        for name in ("importance_cap", "log_ratio_clamp", "value_clamp"):
            cap = getattr(self, name)
            if (
                isinstance(cap, bool)
                or not isinstance(cap, numbers.Real)
                or not math.isfinite(cap)
                or cap < 0
            ):
                what = "cap" if name == "importance_cap" else "clamp"
                problems.append(
                    Problem(name, f"{cap!r} is not valid", f"a finite number >= 0 (0: no {what})")
                )
        flags = ("importance_gradient", "straight_through", "unbiased_gradient", "clamp_weighted")
        for name in (*flags, "clamp_detaches_weight"):
            if not isinstance(getattr(self, name), bool):
                problems.append(Problem(name, f"{getattr(self, name)!r} is not valid", "true, false"))
        final = self.beta_final
        if final is not None and (
            isinstance(final, bool)
            or not isinstance(final, numbers.Real)
            or not math.isfinite(final)
            or final < 0
        ):
            problems.append(
                Problem(
                    "beta_final", f"{final!r} is not valid", "null (constant beta) or a finite number >= 0"
                )
            )
        if self.straight_through and self.unbiased_gradient:
            problems.append(
                Problem("straight_through, unbiased_gradient", "both true", "at most one gradient form")
            )
        for name, needs in (("clamp_weighted", "value_clamp"), ("clamp_detaches_weight", "log_ratio_clamp")):
            if getattr(self, name) is True and getattr(self, needs) == 0:
                problems.append(Problem(name, f"true with {needs} 0", f"false, or a {needs} > 0"))
        if self.unbiased_gradient and (self.clamp_weighted is True or self.clamp_detaches_weight is True):
            problems.append(
                Problem(
                    "unbiased_gradient", "true with clamp_weighted or clamp_detaches_weight",
                    "one of them (unbiased_gradient's term is never clamped)",
                )
            )  # fmt: skip
        if problems:
            raise UserError(problems, title="invalid KL configuration")


def estimator_value(delta: Tensor, estimator: str) -> Tensor:
    """The per-element estimator k(delta) of KL(pi_theta || pi_ref), delta = log pi_theta - log pi_ref."""
    import torch

    if estimator == "k1":
        return delta
    if estimator == "k2":
        return 0.5 * delta**2
    if estimator == "k3":
        return torch.expm1(-delta) + delta
    if estimator == "abs":
        return delta.abs()
    raise ValueError(f"estimator {estimator!r} is not one of {ESTIMATOR_CHOICES}")


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    import torch

    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _clamped_value(delta: Tensor, estimator: str, log_ratio_clamp: float, value_clamp: float) -> Tensor:
    """k(delta) with the clamps of a configuration (0: none): delta to +-log_ratio_clamp, then the value to
    +-value_clamp."""
    if log_ratio_clamp > 0:
        delta = delta.clamp(-log_ratio_clamp, log_ratio_clamp)
    value = estimator_value(delta, estimator)
    return value.clamp(-value_clamp, value_clamp) if value_clamp > 0 else value


def _estimate(
    delta: Tensor,
    mask: Tensor,
    estimator: str,
    level: str,
    log_ratio_clamp: float = 0.0,
    value_clamp: float = 0.0,
) -> Tensor:
    """KL_hat per sequence [B] from a masked (zero where masked) log-ratio [B, T], clamped per element (token
    level) or per sequence (sequence level)."""
    if level == "token":
        return _masked(_clamped_value(delta, estimator, log_ratio_clamp, value_clamp), mask).sum(-1)
    if level == "sequence":
        return _clamped_value(delta.sum(-1), estimator, log_ratio_clamp, value_clamp)
    raise ValueError(f"level {level!r} is not one of {LEVELS}")


def estimate(logp: Tensor, ref_logp: Tensor, mask: Tensor, estimator: str, level: str) -> Tensor:
    """KL_hat(y) per sequence [B]: token level sum_t k(delta_t), sequence level k(sum_t delta_t), over the
    unmasked tokens. Differentiable with respect to ``logp``."""
    mask = mask.bool()
    delta = _masked(logp, mask) - _masked(ref_logp, mask)
    return _estimate(delta, mask, estimator, level)


def penalty(logp: Tensor, ref_logp: Tensor, mask: Tensor, config: KLConfig) -> Tensor:
    """The configured penalty KL_hat(y) per sequence [B]: ``estimate`` with ``config``'s estimator, level and
    clamps. Differentiable with respect to ``logp`` (its gradient is the estimator's, not a gradient form's)."""
    mask = mask.bool()
    delta = _masked(logp, mask) - _masked(ref_logp, mask)
    return _estimate(delta, mask, config.estimator, config.level, config.log_ratio_clamp, config.value_clamp)


def penalty_tokens(logp: Tensor, ref_logp: Tensor, mask: Tensor, config: KLConfig) -> Tensor:
    """The configured penalty per token [B, T], zero where masked: token level each token's clamped
    estimate (``penalty`` is their sum); sequence level the sequence's estimate on its last unmasked token
    (where a framework's per-token returns would place an outcome). Differentiable like ``penalty``."""
    import torch

    mask = mask.bool()
    delta = _masked(logp, mask) - _masked(ref_logp, mask)
    if config.level == "token":
        value = _clamped_value(delta, config.estimator, config.log_ratio_clamp, config.value_clamp)
        return _masked(value, mask)
    total = _estimate(delta, mask, config.estimator, "sequence", config.log_ratio_clamp, config.value_clamp)
    last = mask.cumsum(-1) == mask.sum(-1, keepdim=True)
    last = last & mask
    return torch.where(last, total.unsqueeze(-1), torch.zeros((), dtype=total.dtype, device=total.device))


def clamped_share(logp: Tensor, ref_logp: Tensor, mask: Tensor, config: KLConfig) -> Tensor:
    """Per sequence [B], the share of its units (unmasked tokens, or the sequence at sequence level) where a
    clamp of ``config`` is active: the log-ratio beyond ``log_ratio_clamp`` or the value beyond
    ``value_clamp``. Zero without clamps."""
    import torch

    mask = mask.bool()
    delta = (_masked(logp, mask) - _masked(ref_logp, mask)).detach()
    if config.level == "sequence":
        delta, mask = delta.sum(-1, keepdim=True), mask.any(-1, keepdim=True)
    hit = torch.zeros_like(delta, dtype=torch.bool)
    if config.log_ratio_clamp > 0:
        hit = hit | (delta.abs() > config.log_ratio_clamp)
        delta = delta.clamp(-config.log_ratio_clamp, config.log_ratio_clamp)
    if config.value_clamp > 0:
        hit = hit | (estimator_value(delta, config.estimator).abs() > config.value_clamp)
    hit = hit & mask
    return hit.sum(-1).to(logp.dtype) / mask.sum(-1).clamp(min=1).to(logp.dtype)


def beta_at(config: KLConfig, step: int, steps: int) -> float:
    """The KL coefficient of optimiser step ``step`` (0-based) of ``steps``: ``beta``, or with ``beta_final``
    set the linear interpolation from ``beta`` at step 0 to ``beta_final`` at step ``steps - 1``
    (``beta_final_at: last``) or at step ``steps``, never trained (``end``: PipelineRL's
    ``kl_coef + (final_kl_coef - kl_coef) * completed_steps / max_steps``)."""
    span = steps if config.beta_final_at == "end" else steps - 1
    if config.beta_final is None or span < 1:
        return config.beta
    fraction = min(max(step, 0), steps - 1) / span
    return config.beta + (config.beta_final - config.beta) * fraction


def _loss_value(delta: Tensor, config: KLConfig, weights: Tensor | None = None) -> Tensor:
    """The loss-placed term of ``delta`` (per token, or per sequence when ``delta`` is the sequence's log-ratio
    [B, 1]): the clamped estimator, with k2's gradient when ``straight_through``, times ``weights`` (None: 1).
    ``clamp_detaches_weight``: the weight is detached where the log-ratio clamp bites; ``clamp_weighted``: the
    value clamp applies to the weighted term (NeMo-RL's ``calculate_kl``)."""
    import torch

    c = config
    after = c.clamp_weighted and c.value_clamp > 0
    value = _clamped_value(delta, c.estimator, c.log_ratio_clamp, 0.0 if after else c.value_clamp)
    if c.straight_through:
        k2 = 0.5 * delta**2
        value = k2 - k2.detach() + value.detach()
    if weights is not None:
        if c.clamp_detaches_weight and c.log_ratio_clamp > 0:
            weights = torch.where(delta.abs() > c.log_ratio_clamp, weights.detach(), weights)
        value = value * weights
    return value.clamp(-c.value_clamp, c.value_clamp) if after else value


def token_terms(
    logp: Tensor, ref_logp: Tensor, mask: Tensor, config: KLConfig, behavior_logp: Tensor | None = None
) -> Tensor:
    """Per-token terms [B, T] of ``surrogate`` (its sum over T), zero at masked positions, for a trainer that
    aggregates per token like TRL's loss types.

    The score-function part at token t is ``stopgrad(KL_hat(y)) * log pi_theta(y_t | y_<t)``. The pathwise
    part is ``k(delta_t)`` at token level; at sequence level, where KL_hat belongs to the whole sequence, each
    of the n unmasked tokens carries an equal share ``k(sum delta) / n``. Importance weights multiply each
    token's term (see the module docstring).
    """
    import torch

    mask = mask.bool()
    lp = _masked(logp, mask)
    delta = lp - _masked(ref_logp, mask)

    c = config
    kl_hat = _estimate(delta, mask, c.estimator, c.level, c.log_ratio_clamp, c.value_clamp)
    weights = None if c.importance == "none" else importance_weights(lp, behavior_logp, mask, c)

    terms = torch.zeros_like(lp)
    if c.placement in ("reward", "both"):
        reward = kl_hat.detach().unsqueeze(-1) * lp
        terms = terms + (reward if weights is None else reward * weights.detach())
    if c.placement in ("loss", "both"):
        n = mask.sum(-1, keepdim=True).clamp(min=1).to(lp.dtype)
        if c.unbiased_gradient:
            # the value of the (clamped) estimate, the gradient of stopgrad(w x coefficient) x log pi: k1's
            # coefficient whatever the estimator and never clamped, at token level (OpenRLHF)
            if c.level == "token":
                value = _clamped_value(delta, c.estimator, c.log_ratio_clamp, c.value_clamp)
                coefficient = delta
            else:
                value = coefficient = kl_hat.unsqueeze(-1) / n
            if weights is not None:
                coefficient = coefficient * weights
            loss = value.detach() + coefficient.detach() * (lp - lp.detach())
        elif c.level == "token":
            loss = _loss_value(delta, c, weights)
        else:
            loss = _loss_value(delta.sum(-1, keepdim=True), c, weights) / n
        terms = terms + loss
    return _masked(terms, mask)


def importance_weights(logp: Tensor, behavior_logp: Tensor | None, mask: Tensor, config: KLConfig) -> Tensor:
    """The weights of ``config.importance``: per token ``pi_theta(y_t|y_<t) / mu(y_t|y_<t)`` [B, T]
    (``token``), the sequence's ``pi_theta(y) / mu(y)`` [B, 1] (``sequence``), the geometric mean of its
    per-token ratios [B, 1] (``sequence_mean``, TRL's sequence level), ``pi_theta / stopgrad(pi_theta)`` (``self``)
    or 1 (``none``), capped at
    ``config.importance_cap`` when it is > 0 (a truncation: less variance, and a bias where w > cap). Detached,
    unless ``config.importance_gradient`` (the reward half detaches them whatever it says)."""
    import torch

    if config.importance == "none":
        return torch.ones((), dtype=logp.dtype, device=logp.device)
    if config.importance == "self":
        behavior_logp = logp.detach()
    if behavior_logp is None:
        raise ValueError(f"importance={config.importance!r} needs behavior_logp (the sampling policy's)")
    mask = mask.bool()
    log_ratio = _masked(logp, mask) - _masked(behavior_logp, mask)
    if not config.importance_gradient:
        log_ratio = log_ratio.detach()
    if config.importance == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True)
    elif config.importance == "sequence_mean":
        n = mask.sum(-1, keepdim=True).clamp(min=1).to(log_ratio.dtype)
        log_ratio = log_ratio.sum(-1, keepdim=True) / n
    weights = torch.exp(log_ratio)
    return weights.clamp(max=config.importance_cap) if config.importance_cap > 0 else weights


def surrogate(
    logp: Tensor, ref_logp: Tensor, mask: Tensor, config: KLConfig, behavior_logp: Tensor | None = None
) -> Tensor:
    """Per sequence [B], the scalar whose gradient (through ``logp``) is this configuration's estimate of the
    KL gradient for that sample, before beta and before averaging over the batch. ``logp``, ``ref_logp`` and
    ``behavior_logp`` are per-token log-probabilities [B, T] of the sampled tokens under pi_theta, pi_ref and
    the sampling policy mu; ``mask`` [B, T] marks the completion tokens."""
    return token_terms(logp, ref_logp, mask, config, behavior_logp).sum(-1)


def forward_estimate(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """Per sequence [B], an estimate of the forward KL(pi_ref || pi_theta) from completions sampled from pi_theta:
    ``sum_t (r_t log r_t - r_t + 1)`` with ``r_t = pi_ref(y_t|y_<t) / pi_theta(y_t|y_<t)`` over the unmasked
    tokens. Each term is >= 0, and given its prefix its expectation under pi_theta is the forward KL of the
    next-token distributions, ``KL(pi_ref(.|y_<t) || pi_theta(.|y_<t))`` (``-r + 1`` has mean 0 and lowers the
    variance). Summed over positions this is the forward KL along pi_theta's prefixes: exactly KL(ref || pi)
    for one-token completions; for longer ones the prefixes follow pi_theta, not pi_ref. A monitoring metric
    (``kl/forward``), never a training term."""
    import torch

    mask = mask.bool()
    neg_delta = _masked(ref_logp, mask) - _masked(logp, mask)  # log r
    return _masked(neg_delta * torch.exp(neg_delta) - torch.expm1(neg_delta), mask).sum(-1)
