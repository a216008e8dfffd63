"""The GRPO audit: the exact expected update of the trainer's whole objective (GRPO's advantages per
``scale_rewards`` and ``kl.reward_mode``, the loss type's aggregation; the trainer's own functions in
``klsweep.grpo``) on the tabular policy of ``exact.py``, and the effective KL gradient it contains. See the
package docstring."""

from __future__ import annotations

import functools
import itertools
import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from klsweep import grpo, kl
from klsweep.errors import Problem, UserError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from torch import Tensor

from klsweep.audit.exact import CONFIGS, MAX_SEQUENCES, TOL, TabularPolicy, exact_kl_gradients

GRPO_LOSS_TYPES = tuple(t for t in grpo.LOSS_TYPES if t != "vespo")  # on-policy gradient -A grad log pi
MAX_STEPS = 300_000  # enumerated optimiser steps (multisets of completions)
# Off-policy the audit models TRL's two-sided clipped ratio (grpo.clipped_policy_loss): these loss types use it.
OFF_POLICY_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
GRPO_VERDICTS = ("exact", "rescaled", "forward KL", "zero in expectation", "biased")


@dataclass(frozen=True)
class GRPOAuditRow:
    """One configuration's effective KL gradient in the trainer's objective, against the exact KL gradients.

    ``effective_scale``: the projection of the effective KL gradient ``(E[grad L(beta)] - E[grad L(0)]) / beta``
    on grad KL(pi||ref), over the squared norm of grad KL(pi||ref), in units of the loss type's aggregation
    (a plain score-function term ``x(y) grad log pi(y)`` aggregated like the policy loss has scale 1)."""

    estimator: str
    placement: str
    level: str
    reward_mode: str
    scale_rewards: str
    loss_type: str
    group_size: int
    groups: int  # prompts (groups) per step: only batch scaling depends on it
    beta: float
    behavior_shift: float  # 0: on-policy; else mu = pi + this x noise (logits) samples, TRL's clipped loss
    reward_logp: str  # whose log-ratio the reward-placed penalty uses (kl.reward_logp)
    importance: str  # kl.importance
    importance_cap: float  # kl.importance_cap (0: no cap)
    effective_scale: float
    cos_reverse: float  # cosine between the effective KL gradient and grad KL(pi||ref)
    cos_forward: float  # ... and grad KL(ref||pi)
    rel_err_reverse: float  # ||effective / unit - grad KL(pi||ref)|| / ||grad KL(pi||ref)||
    rel_norm: float  # ||effective / unit|| / ||grad KL(pi||ref)||
    verdict: str
    preset: str = ""  # the framework preset audited (klsweep.presets), "" for a plain configuration
    advantage: str = ""  # a framework's advantage estimator (grpo.Advantage.label), "" for klsweep's own


def _grpo_verdict(row: dict[str, float]) -> str:
    if row["rel_err_reverse"] < TOL:
        return "exact"
    if row["cos_reverse"] > 1 - TOL:
        return "rescaled"
    if row["cos_forward"] > 1 - TOL:
        return "forward KL"
    if row["rel_norm"] < TOL:
        return "zero in expectation"
    return "biased"


def _n_steps(vocab: int, length: int, group_size: int, groups: int) -> int:
    """How many steps ``enumerate_steps`` enumerates: multisets of groups of multisets of sequences."""
    n_groups = math.comb(vocab**length + group_size - 1, group_size)
    return math.comb(n_groups + groups - 1, groups)


def _validate_grpo(options: dict[str, Any]) -> None:
    problems = []

    def is_int(x) -> bool:
        return isinstance(x, numbers.Integral) and not isinstance(x, bool)

    def is_real(x) -> bool:
        return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)

    for name, low in (("vocab", 2), ("length", 1), ("group_size", 2), ("groups", 1)):
        if not is_int(options[name]) or options[name] < low:
            problems.append(Problem(name, f"{options[name]!r} is not valid", f"an integer >= {low}"))
    if not is_int(options["seed"]):
        problems.append(Problem("seed", f"{options['seed']!r} is not valid", "an integer"))
    for name in ("ref_distance", "beta"):
        if not is_real(options[name]) or options[name] <= 0:
            problems.append(Problem(name, f"{options[name]!r} is not valid", "a finite number > 0"))
    for name, allowed in (
        ("scale_rewards", (*grpo.SCALE_REWARDS, "all")),
        ("reward_mode", (*kl.REWARD_MODES, "all")),
        ("loss_type", GRPO_LOSS_TYPES),
        ("reward_logp", (*kl.REWARD_LOGPS, "all", None)),
        ("importance", (*kl.IMPORTANCE, "all", None)),
    ):
        if options[name] not in allowed:
            shown = ", ".join(a for a in allowed if a is not None)
            problems.append(Problem(name, f"{options[name]!r} is not valid", shown))
    shift = options["behavior_shift"]
    if not is_real(shift) or shift < 0:
        problems.append(Problem("behavior_shift", f"{shift!r} is not valid", "a finite number >= 0"))
    elif shift > 0 and options["loss_type"] not in OFF_POLICY_LOSS_TYPES:
        problems.append(
            Problem(
                "loss_type",
                f"{options['loss_type']!r} is not audited off-policy",
                ", ".join(OFF_POLICY_LOSS_TYPES),
            )
        )
    cap = options["importance_cap"]
    if not is_real(cap) or cap < 0:
        problems.append(
            Problem("importance_cap", f"{cap!r} is not valid", "a finite number >= 0 (0: no cap)")
        )
    if not problems:
        vocab, length, g, groups = (options[k] for k in ("vocab", "length", "group_size", "groups"))
        batch = options["scale_rewards"] in ("batch", "all")
        steps = _n_steps(vocab, length, g, groups if batch else 1)
        if vocab**length > MAX_SEQUENCES or steps > MAX_STEPS:
            what = "vocab, length, group_size" + (", groups" if batch else "")
            problems.append(
                Problem(
                    what,
                    f"{steps} optimiser steps to enumerate ({vocab}**{length} sequences, groups of {g}"
                    + (f", {groups} groups a step with batch scaling)" if batch else ")"),
                    f"at most {MAX_STEPS}",
                )
            )
    if problems:
        raise UserError(problems, title="invalid GRPO audit options")


def task_reward_table(n_sequences: int, seed: int) -> Tensor:
    """The task reward of each sequence: 0 or 1 with probability 1/2 each (like a verifier's), drawn from a
    generator seeded with ``seed`` (a stream of its own, not the policy's)."""
    import torch

    g = torch.Generator().manual_seed(seed + 7919)
    return (torch.rand(n_sequences, generator=g, dtype=torch.float64) < 0.5).to(torch.float64)


def _multisets(log_weights: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Every multiset of k of the items 0..n-1 drawn i.i.d. with probabilities exp(log_weights): (items
    [M, k]; log-probabilities [M]: the multinomial coefficient times the product of the items')."""
    import torch

    n = log_weights.numel()
    items = torch.tensor(list(itertools.combinations_with_replacement(range(n), k)), dtype=torch.long)
    items = items.reshape(-1, k)
    # prod over distinct items of count! = prod over positions of (1 + earlier positions holding the same item)
    log_repeats = sum(
        (1 + (items[:, :j] == items[:, j : j + 1]).sum(-1)).to(log_weights.dtype).log() for j in range(k)
    )
    return items, math.lgamma(k + 1) - log_repeats + log_weights[items].sum(-1)


def enumerate_steps(probs: Tensor, group_size: int, groups: int = 1) -> tuple[Tensor, Tensor]:
    """Every optimiser step of ``groups`` groups of ``group_size`` completions drawn i.i.d. from ``probs`` (over
    sequence indices), up to the order of the completions in a group and of the groups in the step, which no
    advantage or aggregation depends on: (indices [S, groups x group_size], group after group; probabilities
    [S], summing to 1). A group is a multiset of sequences and a step a multiset of groups."""
    group_items, group_log_p = _multisets(probs.log(), group_size)
    step_items, step_log_p = _multisets(group_log_p, groups)
    return group_items[step_items].flatten(1), step_log_p.exp()


def _objective_gradient(
    policy: TabularPolicy,
    seqs: Tensor,
    loss_of: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor],
    weights: Tensor | None,
    jac: Tensor | None,
) -> Tensor:
    """The gradient with respect to pi's logits of ``loss_of(logp, ref_logp, mask, behavior_logp)`` [S] (one
    loss per optimiser step, a row of ``seqs``; per-token log-probs [S, n, T]): per step [S, P], or with
    ``weights`` [S]
    the weighted sum [P]. The derivatives with respect to the per-token log-probs are summed per sequence,
    then taken through the Jacobian of the log-probs."""
    import torch

    n_seqs, length = policy.seqs.shape
    logp = policy.token_logp(policy.theta).detach()[seqs].requires_grad_()  # [S, n, T]
    ref = policy.token_logp(policy.ref)[seqs]
    behavior = policy.token_logp(policy.behavior)[seqs]
    loss = loss_of(logp, ref, torch.ones_like(logp, dtype=torch.bool), behavior)
    jac = policy.token_logp_jacobian() if jac is None else jac
    if weights is not None:
        (d_logp,) = torch.autograd.grad(loss @ weights, logp)
        per_seq = torch.zeros(n_seqs, length, dtype=d_logp.dtype)
        per_seq.index_add_(0, seqs.flatten(), d_logp.flatten(0, 1))
        return torch.einsum("nt,ntp->p", per_seq, jac)
    (d_logp,) = torch.autograd.grad(loss.sum(), logp)
    per_seq = torch.zeros(len(seqs), n_seqs, length, dtype=d_logp.dtype)
    per_seq.scatter_add_(1, seqs.unsqueeze(-1).expand(-1, -1, length), d_logp)
    return torch.einsum("snt,ntp->sp", per_seq, jac)


def _aggregation(loss_type: str, seqs: Tensor, length: int) -> grpo.Aggregation:
    """The trainer's aggregation of a step of ``seqs.size(1)`` completions of ``length`` tokens each (dapo's
    normaliser: the step's tokens; dr_grpo's maximum length: ``length``; no gradient accumulation)."""
    return grpo.Aggregation(loss_type, tokens=float(seqs.size(1) * length), max_completion_length=length)


def grpo_gradients(
    policy: TabularPolicy,
    task_reward: Tensor,
    seqs: Tensor,
    config: kl.KLConfig,
    group_size: int,
    scale_rewards: str,
    loss_type: str,
    weights: Tensor | None = None,
    jac: Tensor | None = None,
    off_policy: bool = False,
    advantage: grpo.Advantage | None = None,
) -> Tensor:
    """The gradient with respect to pi's logits of the trainer's objective for each optimiser step (a row of
    ``seqs``: indices of its completions, group after group, sampled from the behaviour policy) [S, P], or
    with ``weights`` [S] their weighted sum [P]. The objective is the trainer's own functions, as
    ``KLGRPOTrainer`` calls them: the policy loss of the advantages ``grpo.advantages`` (task reward; the
    behaviour policy's detached penalty ``kl.estimate`` when the KL is in the reward and not its own term,
    per ``config.reward_mode`` and ``scale_rewards``), ``grpo.policy_loss`` on-policy or TRL's clipped loss
    ``grpo.clipped_policy_loss`` against the behaviour log-probs when ``off_policy``; plus ``config.beta``
    times ``grpo.kl_reward_loss`` (``config.reward_term``: the current penalty less the leave-one-out mean of
    the others' behaviour penalties, importance-weighted) and ``grpo.kl_loss`` when the KL is in the loss;
    all aggregated per ``loss_type`` (``_aggregation``).

    With ``advantage`` (a framework's estimator, ``grpo.Advantage``) the advantages are
    ``grpo.advantage_of`` instead (``scale_rewards`` is then the spec's): the reward-placed penalty per token
    of the behaviour policy's log-probs (the frameworks compute it when the batch is made), always inside the
    advantage (no reward term of its own)."""
    in_reward = config.beta > 0 and config.placement in ("reward", "both")
    in_loss = config.beta > 0 and config.placement in ("loss", "both")
    own_term = in_reward and config.reward_term
    aggregation = _aggregation(loss_type, seqs, policy.seqs.size(1))
    rewards = task_reward[seqs]

    def loss_of(logp: Tensor, ref: Tensor, mask: Tensor, behavior: Tensor) -> Tensor:
        if advantage is not None:
            tokens = kl.penalty_tokens(behavior, ref, mask, config) if in_reward else None
            adv = grpo.advantage_of(
                advantage, rewards, tokens, mask, config.beta, group_size, config.reward_mode
            )
            if off_policy:
                loss = grpo.clipped_policy_loss(adv, logp, behavior, mask, aggregation)
            else:
                loss = grpo.policy_loss(adv, logp, mask, aggregation)
            if in_loss:
                weights_from = behavior if config.importance != "none" else None
                loss = loss + config.beta * grpo.kl_loss(logp, ref, mask, config, aggregation, weights_from)
            return loss
        sampled = kl.penalty(behavior, ref, mask, config) if in_reward else None
        penalty = None if own_term else sampled
        adv = grpo.advantages(rewards, penalty, config.beta, group_size, scale_rewards, config.reward_mode)
        if off_policy:
            loss = grpo.clipped_policy_loss(adv, logp, behavior, mask, aggregation)
        else:
            loss = grpo.policy_loss(adv, logp, mask, aggregation)
        if own_term:
            baseline = grpo.leave_one_out_baseline(sampled, group_size)
            reward_loss = grpo.kl_reward_loss(logp, ref, mask, config, aggregation, baseline, behavior)
            loss = loss + config.beta * reward_loss
        if in_loss:
            weights_from = behavior if config.importance != "none" else None
            loss = loss + config.beta * grpo.kl_loss(logp, ref, mask, config, aggregation, weights_from)
        return loss

    return _objective_gradient(policy, seqs, loss_of, weights, jac)


def grpo_audit(
    vocab: int = 3,
    length: int = 2,
    group_size: int = 4,
    groups: int = 2,
    seed: int = 0,
    ref_distance: float = 1.0,
    beta: float = 0.1,
    scale_rewards: str = "group",
    reward_mode: str = "all",
    loss_type: str = "dapo",
    behavior_shift: float = 0.0,
    reward_logp: str | None = None,
    importance: str | None = None,
    importance_cap: float = 0.0,
) -> list[GRPOAuditRow]:
    """Per configuration (estimator x placement x level, for each reward mode and reward scaling: ``all`` for
    every one), the exact expected update of the trainer's objective on a random tabular policy (vocabulary
    ``vocab``, completions of ``length`` tokens), enumerating every step of G = ``group_size`` completions
    (with ``scale_rewards="batch"``, of ``groups`` groups, which its statistic spans; group and none do not
    depend on the number of groups and enumerate one). The task reward is ``task_reward_table``; the
    effective KL gradient ``(E[grad L(beta)] - E[grad L(0)]) / beta`` is compared with grad KL(pi||ref) and
    grad KL(ref||pi), in the units of the loss type's aggregation (``GRPOAuditRow``).

    Off-policy (``behavior_shift > 0``) the completions are sampled from the behaviour policy mu of
    ``TabularPolicy.random`` and the policy loss is TRL's clipped one against mu's log-probs; rows for each
    ``reward_logp`` and ``importance`` (``None``: every value off-policy; on-policy ``current`` and ``none``,
    the others being the same computation)."""
    _validate_grpo(dict(locals()))
    off_policy = behavior_shift > 0
    modes = kl.REWARD_MODES if reward_mode == "all" else (reward_mode,)

    def every(value: str | None, values: tuple[str, ...], on_policy: str) -> tuple[str, ...]:
        if value is None:
            return values if off_policy else (on_policy,)
        return values if value == "all" else (value,)

    samplings = list(
        itertools.product(
            every(reward_logp, kl.REWARD_LOGPS, "current"), every(importance, kl.IMPORTANCE, "none")
        )
    )
    rows = []
    steps = (vocab, length, seed, ref_distance, behavior_shift, group_size, groups, scale_rewards, loss_type)
    for scaling, n_groups, effective in _scalings(*steps):
        # The KL in the loss ignores the reward mode and reward_logp: computed once per importance.
        loss_rows: dict[tuple[str, str, str], dict[str, float]] = {}
        for logp_from, weighting in samplings:
            for mode in modes:
                for estimator, placement, level in CONFIGS:
                    config = kl.KLConfig(
                        estimator,
                        placement,
                        level,
                        beta=beta,
                        importance=weighting,
                        reward_mode=mode,
                        reward_logp=logp_from,
                        importance_cap=importance_cap,
                    )
                    key = (estimator, level, weighting)
                    if placement == "loss" and key in loss_rows:
                        values = loss_rows[key]
                    else:
                        values = effective(config)
                        if placement == "loss":
                            loss_rows[key] = values
                    rows.append(
                        _row(config, values, scaling, loss_type, group_size, n_groups, behavior_shift)
                    )
    return rows


def _scalings(
    vocab: int,
    length: int,
    seed: int,
    ref_distance: float,
    behavior_shift: float,
    group_size: int,
    groups: int,
    scale_rewards: str,
    loss_type: str,
    advantage: grpo.Advantage | None = None,
) -> Iterator[tuple[str, int, Callable[[kl.KLConfig], dict[str, float]]]]:
    """Per reward scaling (``all``: each), ``(scaling, groups per step, effective)``: ``effective(config)`` is the
    numbers of a ``GRPOAuditRow`` (``_effective``) of ``config``'s effective KL gradient at its beta, every step
    of the tabular policy of these options enumerated (sampled from the behaviour policy, TRL's clipped loss,
    when ``behavior_shift > 0``). With ``advantage`` (a framework's estimator) one scaling, the spec's:
    ``groups`` groups a step where a statistic spans the step (``Advantage.spans_step``)."""
    off_policy = behavior_shift > 0
    policy = TabularPolicy.random(vocab, length, seed, ref_distance, behavior_shift)
    g_reverse, g_forward = exact_kl_gradients(policy)
    jac = policy.token_logp_jacobian()
    reward = task_reward_table(len(policy.seqs), seed)
    pi_probs = policy.token_logp(policy.theta).sum(-1).exp()
    probs = policy.token_logp(policy.behavior).sum(-1).exp()  # the sampling policy (pi on-policy)
    scalings = grpo.SCALE_REWARDS if scale_rewards == "all" else (scale_rewards,)
    for scaling in scalings if advantage is None else (advantage.scale,):
        spans = scaling == "batch" if advantage is None else advantage.spans_step
        n_groups = groups if spans else 1
        seqs, p = enumerate_steps(probs, group_size, n_groups)
        unit = _unit(
            policy, seqs, enumerate_steps(pi_probs, group_size, n_groups)[1], loss_type, g_reverse, jac
        )
        gradient = functools.partial(
            grpo_gradients,
            policy,
            reward,
            seqs,
            group_size=group_size,
            scale_rewards=scaling,
            loss_type=loss_type,
            weights=p,
            jac=jac,
            off_policy=off_policy,
            advantage=advantage,
        )
        g_zero = gradient(kl.KLConfig("k1", "reward", beta=0.0))

        def effective(config: kl.KLConfig, gradient=gradient, g_zero=g_zero, unit=unit) -> dict[str, float]:
            return _effective(((gradient(config) - g_zero) / config.beta) / unit, g_reverse, g_forward)

        yield scaling, n_groups, effective


def _row(
    config: kl.KLConfig,
    values: dict[str, float],
    scaling: str,
    loss_type: str,
    group_size: int,
    groups: int,
    behavior_shift: float,
    preset: str = "",
    advantage: grpo.Advantage | None = None,
) -> GRPOAuditRow:
    """The ``GRPOAuditRow`` of ``config`` with the numbers ``values`` of its effective KL gradient."""
    return GRPOAuditRow(
        estimator=config.estimator,
        placement=config.placement,
        level=config.level,
        reward_mode=config.reward_mode,
        scale_rewards=scaling,
        loss_type=loss_type,
        group_size=group_size,
        groups=groups,
        beta=float(config.beta),
        behavior_shift=float(behavior_shift),
        reward_logp=config.reward_logp,
        importance=config.importance,
        importance_cap=config.importance_cap,
        **values,
        verdict=_grpo_verdict(values),
        preset=preset,
        advantage="" if advantage is None else advantage.label,
    )


def grpo_preset_audit(
    presets: tuple[str, ...] | list[str],
    vocab: int = 3,
    length: int = 2,
    group_size: int = 4,
    groups: int = 2,
    seed: int = 0,
    ref_distance: float = 1.0,
    beta: float | None = None,
    scale_rewards: str = "group",
    loss_type: str = "dapo",
    behavior_shift: float = 0.0,
) -> list[GRPOAuditRow]:
    """``grpo_config_audit`` of each framework preset's whole KL configuration (``klsweep.presets``; ``all``:
    every one), at its own beta unless ``beta`` is given (a schedule's first value)."""
    import dataclasses

    from klsweep import presets as preset_mod

    names = preset_mod.resolve(presets)
    configs = [preset_mod.kl_config(n) for n in names]
    if beta is not None:
        configs = [dataclasses.replace(c, beta=beta) for c in configs]
    return grpo_config_audit(
        list(zip(names, configs, strict=True)),
        vocab=vocab,
        length=length,
        group_size=group_size,
        groups=groups,
        seed=seed,
        ref_distance=ref_distance,
        scale_rewards=scale_rewards,
        loss_type=loss_type,
        behavior_shift=behavior_shift,
    )


def grpo_config_audit(
    configs: list[tuple[str, kl.KLConfig]],
    vocab: int = 3,
    length: int = 2,
    group_size: int = 4,
    groups: int = 2,
    seed: int = 0,
    ref_distance: float = 1.0,
    scale_rewards: str = "group",
    loss_type: str = "dapo",
    behavior_shift: float = 0.0,
    advantage: grpo.Advantage | None = None,
) -> list[GRPOAuditRow]:
    """``grpo_audit`` of whole KL configurations, each labelled (a preset's name, or ""): its reward mode,
    reward log-probs, weighting, gradient forms and clamps, at its own beta (a schedule's first value); one
    row per configuration and reward scaling. The report audits a run that uses the frameworks' forms with it.
    ``advantage``: the advantage estimator a framework's config selects (``grpo.Advantage``; its scaling
    replaces ``scale_rewards``), None for klsweep's own (TRL's GRPO)."""
    probe = dict(locals())
    if advantage is not None:  # the spec's scaling; a statistic over the step enumerates groups like batch
        probe["scale_rewards"] = "batch" if advantage.spans_step else advantage.scale
    probe |= {
        "beta": 0.1,
        "reward_mode": "all",
        "reward_logp": None,
        "importance": None,
        "importance_cap": 0.0,
    }
    _validate_grpo(probe)
    zero = [name or repr(c) for name, c in configs if c.beta <= 0]
    if zero:
        raise UserError(Problem("beta", f"{', '.join(zero)}: beta 0", "a configuration with beta > 0"))
    rows = []
    steps = (vocab, length, seed, ref_distance, behavior_shift, group_size, groups, scale_rewards, loss_type)
    for scaling, n_groups, effective in _scalings(*steps, advantage=advantage):
        for name, config in configs:
            values = effective(config)
            rows.append(
                _row(
                    config, values, scaling, loss_type, group_size, n_groups, behavior_shift, name, advantage
                )
            )
    return rows


def _unit(
    policy: TabularPolicy, seqs: Tensor, p: Tensor, loss_type: str, g_reverse: Tensor, jac: Tensor
) -> float:
    """The unit of the loss type's aggregation: a plain score-function term, stopgrad(KL_hat_k1(y)) log pi
    per token (``kl.token_terms``, reward placement), aggregated like the policy loss, has expected gradient
    exactly unit x grad KL(pi||ref)."""
    aggregation = _aggregation(loss_type, seqs, policy.seqs.size(1))
    plain = kl.KLConfig("k1", "reward", "token")

    def loss_of(logp: Tensor, ref: Tensor, mask: Tensor, behavior: Tensor) -> Tensor:
        return aggregation(kl.token_terms(logp, ref, mask, plain), mask)

    g_plain = _objective_gradient(policy, seqs, loss_of, p, jac)
    return (g_plain @ g_reverse / g_reverse.square().sum()).item()


def _effective(effective: Tensor, g_reverse: Tensor, g_forward: Tensor) -> dict[str, float]:
    """The numbers of a GRPOAuditRow for an effective KL gradient already divided by the unit. A gradient
    zero to ``TOL`` (relative to grad KL(pi||ref)) has cosines 0 by convention: its direction is rounding."""
    norm = (effective.norm() / g_reverse.norm()).item()

    def cos(other: Tensor) -> float:
        return 0.0 if norm < TOL else (effective @ other / (effective.norm() * other.norm())).item()

    return {
        "effective_scale": (effective @ g_reverse / g_reverse.square().sum()).item(),
        "cos_reverse": cos(g_reverse),
        "cos_forward": cos(g_forward),
        "rel_err_reverse": ((effective - g_reverse).norm() / g_reverse.norm()).item(),
        "rel_norm": norm,
    }
