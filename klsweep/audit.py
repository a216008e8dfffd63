"""Exact audits by enumeration: the bias and variance of every KL configuration's gradient, and the expected
update of the trainer's whole GRPO objective.

A random tabular autoregressive policy (vocabulary V, completion length L; one row of logits per prefix, the
rows being the parameters) is enumerated exhaustively: all V**L sequences, in float64. For each of the 18
configurations (estimator x placement x level) the expected gradient ``E_{y~q}[grad surrogate(y)]`` is
computed exactly, with ``klsweep.kl.surrogate`` itself, and compared with the exact gradients of
KL(pi || ref) (reverse, the intended one) and KL(ref || pi) (forward). ``q`` is pi itself (on-policy) or,
with ``behavior_shift > 0``, a behaviour policy mu whose logits are pi's plus ``behavior_shift`` times noise
(off-policy, with ``importance`` weighting none, token or sequence). The reference policy's logits are pi's
plus ``ref_distance`` times noise.

Verdicts: "unbiased reverse KL" (relative error against the reverse-KL gradient below ``TOL``), "forward KL"
(likewise against the forward-KL gradient), "zero in expectation" (``||E g||`` below ``TOL`` relative to the
reverse-KL gradient), otherwise "biased". On-policy, for every V >= 2, L >= 2 and seed, they are the table of
docs/KL.md. (With L = 1 token and sequence level coincide: k2 in the loss is then unbiased, k3 in the loss forward.)

Off-policy, without weights no configuration is unbiased. Sequence weights give every configuration exactly its
on-policy expected gradient (the on-policy table again), with a larger variance. Token weights (TRL's
correction) fix each token's distribution given its prefix but not the prefix's: k1 in the loss at token level
is zero in expectation again, but nothing is unbiased for L >= 2.

Run it: ``klsweep audit`` (``--behavior-shift 0.5 --importance all`` for the off-policy tables), or
``klsweep.audit.audit(vocab=3, length=3)`` from Python. CPU, well under a second.

The GRPO audit (``grpo_audit``, ``klsweep audit --grpo``) asks what the trainer really does with a
configuration, on-policy: it enumerates every optimiser step of G completions of the tabular policy (as
multisets, with their multinomial probabilities), with a random 0/1 task reward per sequence, and computes the
expected gradient of the trainer's objective with the trainer's own functions (``klsweep.grpo``: advantages
per ``scale_rewards`` and ``kl.reward_mode``, the policy loss and the KL loss aggregated per loss type), at beta
and at 0. The effective KL gradient ``(E[grad L(beta)] - E[grad L(0)]) / beta`` is compared with the exact
gradients of KL(pi||ref) and KL(ref||pi), in units of the loss type's aggregation: ``effective_scale`` 1 and
``cos_reverse`` 1 mean beta means what it says (``separate`` k1 in the reward: exactly, at any beta;
``shaped``: not, see docs/KL.md). Default V=3, L=2, G=4: ~0.5 s per scaling, ~15 s with batch scaling
(2 groups a step).
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from klsweep import grpo, kl, store
from klsweep.errors import Problem, UserError

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import Tensor

VERDICTS = ("unbiased reverse KL", "forward KL", "zero in expectation", "biased")
TOL = 1e-6  # exact float64 enumeration: an unbiased configuration's error is ~1e-15
MAX_SEQUENCES = 256  # vocab**length; the per-token Jacobian is (V**L * L) x (#prefixes * V)
CONFIGS = tuple(itertools.product(kl.ESTIMATORS, kl.PLACEMENTS, kl.LEVELS))


@dataclass(frozen=True)
class AuditRow:
    """One configuration's expected gradient, compared with the exact KL gradients."""

    estimator: str
    placement: str
    level: str
    importance: str  # weighting of the off-policy samples (none on-policy)
    behavior_shift: float  # 0: on-policy
    rel_err_reverse: float  # ||E g - grad KL(pi||ref)|| / ||grad KL(pi||ref)||
    rel_err_forward: float  # ||E g - grad KL(ref||pi)|| / ||grad KL(ref||pi)||
    rel_norm: float  # ||E g|| / ||grad KL(pi||ref)||
    grad_variance: float  # trace of the covariance of the per-sample gradient, exact
    verdict: str


def _validate(vocab, length, seed, ref_distance, behavior_shift, importance) -> None:
    problems = []

    def is_int(x) -> bool:
        return isinstance(x, numbers.Integral) and not isinstance(x, bool)

    def is_real(x) -> bool:
        return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)

    if not is_int(vocab) or vocab < 2:
        problems.append(Problem("vocab", f"{vocab!r} is not valid", "an integer >= 2"))
    if not is_int(length) or length < 1:
        problems.append(Problem("length", f"{length!r} is not valid", "an integer >= 1"))
    if not problems and vocab**length > MAX_SEQUENCES:
        problems.append(
            Problem("vocab, length", f"{vocab}**{length} sequences is too many", f"at most {MAX_SEQUENCES}")
        )
    if not is_int(seed):
        problems.append(Problem("seed", f"{seed!r} is not valid", "an integer"))
    if not is_real(ref_distance) or ref_distance <= 0:
        problems.append(Problem("ref_distance", f"{ref_distance!r} is not valid", "a finite number > 0"))
    if not is_real(behavior_shift) or behavior_shift < 0:
        problems.append(Problem("behavior_shift", f"{behavior_shift!r} is not valid", "a finite number >= 0"))
    if importance not in (*kl.IMPORTANCE, "all"):
        problems.append(
            Problem("importance", f"{importance!r} is not valid", ", ".join((*kl.IMPORTANCE, "all")))
        )
    if problems:
        raise UserError(problems, title="invalid audit options")


def _verdict(rel_err_reverse: float, rel_err_forward: float, rel_norm: float) -> str:
    if rel_err_reverse < TOL:
        return "unbiased reverse KL"
    if rel_err_forward < TOL:
        return "forward KL"
    if rel_norm < TOL:
        return "zero in expectation"
    return "biased"


@dataclass
class TabularPolicy:
    """All V**L sequences of a tabular autoregressive policy, with its reference and behaviour policies."""

    theta: Tensor  # [#prefixes, V] pi's logits: the parameters
    ref: Tensor  # [#prefixes, V] reference logits
    behavior: Tensor  # [#prefixes, V] behaviour (sampling) logits
    seqs: Tensor  # [N, L] every sequence
    rows: Tensor  # [N, L] the parameter row (prefix) that generates token t of each sequence

    @classmethod
    def random(cls, vocab: int, length: int, seed: int, ref_distance: float, behavior_shift: float):
        import torch

        n_prefixes = sum(vocab**t for t in range(length))
        g = torch.Generator().manual_seed(seed)
        theta, ref_noise, behavior_noise = (
            torch.randn(n_prefixes, vocab, generator=g, dtype=torch.float64) for _ in range(3)
        )
        seqs = torch.tensor(list(itertools.product(range(vocab), repeat=length)), dtype=torch.long)
        seqs = seqs.reshape(-1, length)
        # Prefixes of length t occupy rows offset_t .. offset_t + V**t - 1, indexed by their base-V code.
        rows = torch.empty_like(seqs)
        code = torch.zeros(len(seqs), dtype=torch.long)
        for t in range(length):
            rows[:, t] = sum(vocab**s for s in range(t)) + code
            code = code * vocab + seqs[:, t]
        return cls(
            theta, theta + ref_distance * ref_noise, theta + behavior_shift * behavior_noise, seqs, rows
        )

    def token_logp(self, logits: Tensor) -> Tensor:
        """[N, L] log-probability of each token of every sequence under the policy with these logits."""
        return logits.log_softmax(-1)[self.rows, self.seqs]

    def token_logp_jacobian(self) -> Tensor:
        """[N, L, #prefixes * V]: d token_logp(theta)[n, t] / d theta, which is nonzero only in the row of
        the token's prefix, where it is onehot(token) - softmax(row) (the log-softmax derivative)."""
        import torch

        n, length = self.seqs.shape
        n_rows, vocab = self.theta.shape
        local = torch.nn.functional.one_hot(self.seqs, vocab) - self.theta.softmax(-1)[self.rows]
        jac = torch.zeros(n, length, n_rows, vocab, dtype=self.theta.dtype)
        jac[torch.arange(n)[:, None], torch.arange(length), self.rows] = local
        return jac.flatten(2)


def per_sample_gradients(policy: TabularPolicy, config: kl.KLConfig, jac: Tensor | None = None) -> Tensor:
    """[N, P]: the gradient of ``kl.surrogate`` for each sequence, with respect to pi's logits (flattened).

    Each sequence's surrogate depends only on its own row of per-token log-probs, so one backward pass gives
    every sample's d surrogate / d logp, and the chain rule through the Jacobian of the log-probs (``jac``,
    computed when not given) gives every sample's gradient."""
    import torch

    lp = policy.token_logp(policy.theta).detach().requires_grad_()
    ref_logp = policy.token_logp(policy.ref)
    behavior_logp = policy.token_logp(policy.behavior)
    mask = torch.ones_like(lp, dtype=torch.bool)
    surr = kl.surrogate(lp, ref_logp, mask, config, behavior_logp)
    (d_lp,) = torch.autograd.grad(surr.sum(), lp)
    return torch.einsum("nl,nlp->np", d_lp, policy.token_logp_jacobian() if jac is None else jac)


def exact_kl_gradients(policy: TabularPolicy) -> tuple[Tensor, Tensor]:
    """The exact gradients [P] of KL(pi || ref) (reverse) and KL(ref || pi) (forward) w.r.t. pi's logits."""
    import torch

    theta = policy.theta.detach().requires_grad_()
    seq_logp = policy.token_logp(theta).sum(-1)
    ref_seq_logp = policy.token_logp(policy.ref).sum(-1)
    reverse = (seq_logp.exp() * (seq_logp - ref_seq_logp)).sum()
    forward = (ref_seq_logp.exp() * (ref_seq_logp - seq_logp)).sum()
    (g_reverse,) = torch.autograd.grad(reverse, theta, retain_graph=True)
    (g_forward,) = torch.autograd.grad(forward, theta)
    return g_reverse.flatten(), g_forward.flatten()


def audit(
    vocab: int = 3,
    length: int = 3,
    seed: int = 0,
    ref_distance: float = 1.0,
    behavior_shift: float = 0.0,
    importance: str = "none",
) -> list[AuditRow]:
    """One row per configuration (estimator x placement x level), in the order of ``CONFIGS``; with
    ``importance="all"``, the 18 rows for each of none, token and sequence in turn."""
    _validate(vocab, length, seed, ref_distance, behavior_shift, importance)
    policy = TabularPolicy.random(vocab, length, seed, ref_distance, behavior_shift)
    g_reverse, g_forward = exact_kl_gradients(policy)
    jac = policy.token_logp_jacobian()
    q = policy.token_logp(policy.behavior).sum(-1).exp()  # sampling distribution (pi if behavior_shift == 0)

    rows = []
    for imp in kl.IMPORTANCE if importance == "all" else (importance,):
        for estimator, placement, level in CONFIGS:
            per_sample = per_sample_gradients(
                policy, kl.KLConfig(estimator, placement, level, importance=imp), jac
            )
            mean = q @ per_sample
            variance = (q @ per_sample.square().sum(-1) - mean.square().sum()).clamp(min=0)
            rel_rev = ((mean - g_reverse).norm() / g_reverse.norm()).item()
            rel_fwd = ((mean - g_forward).norm() / g_forward.norm()).item()
            rel_norm = (mean.norm() / g_reverse.norm()).item()
            rows.append(
                AuditRow(
                    estimator=estimator,
                    placement=placement,
                    level=level,
                    importance=imp,
                    behavior_shift=float(behavior_shift),
                    rel_err_reverse=rel_rev,
                    rel_err_forward=rel_fwd,
                    rel_norm=rel_norm,
                    grad_variance=variance.item(),
                    verdict=_verdict(rel_rev, rel_fwd, rel_norm),
                )
            )
    return rows


def verdicts(**options: Any) -> dict[tuple[str, str, str], str]:
    """{(estimator, placement, level): verdict} for ``audit(**options)`` (one importance setting)."""
    if options.get("importance") == "all":
        raise UserError(Problem("importance", "'all' is not valid here", ", ".join(kl.IMPORTANCE)))
    return {(r.estimator, r.placement, r.level): r.verdict for r in audit(**options)}


def rows_as_dicts(rows: list[AuditRow] | list[GRPOAuditRow]) -> list[dict[str, Any]]:
    """The rows as plain dicts (JSON, CSV, pandas)."""
    return [asdict(r) for r in rows]


VERDICT_STYLES = {
    "unbiased reverse KL": "green",
    "forward KL": "yellow",
    "zero in expectation": "magenta",
    "biased": "red",
}


def tables(rows: list[AuditRow], title: str = "") -> list:
    """The rows as rich Tables, one per importance weighting, the verdict coloured. Errors are relative to the
    exact gradient of the reverse (``err rev``) and forward (``err fwd``) KL; ``|E g|`` is the expected
    gradient's norm relative to the reverse-KL gradient's."""
    from rich import box
    from rich.table import Table

    off_policy = any(r.behavior_shift > 0 for r in rows)
    out = []
    for importance in dict.fromkeys(r.importance for r in rows):
        full_title = f"{title}, importance weights: {importance}" if off_policy else title
        t = Table(title=full_title or None, box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
        for name in ("est", "placement", "level"):
            t.add_column(name)
        for name in ("err rev", "err fwd", "|E g|", "variance"):
            t.add_column(name, justify="right")
        t.add_column("verdict", no_wrap=True)
        for r in rows:
            if r.importance == importance:
                values = (r.rel_err_reverse, r.rel_err_forward, r.rel_norm, r.grad_variance)
                verdict = f"[{VERDICT_STYLES[r.verdict]}]{r.verdict}[/]"
                t.add_row(r.estimator, r.placement, r.level, *(f"{x:.3f}" for x in values), verdict)
        out.append(t)
    return out


def cached_audit(behavior_shift: float = 0.0, importance: str = "none") -> list[AuditRow]:
    """``audit`` of the default policy, kept on disk under ``store.cache_dir()/audit/`` and keyed by the code of
    ``kl.py``, ``grpo.py`` and ``audit.py``, torch's version and the options: reports then need not import
    torch."""
    return _cached(AuditRow, audit, behavior_shift=behavior_shift, importance=importance)


def cached_grpo_audit(**options: Any) -> list[GRPOAuditRow]:
    """``grpo_audit(**options)``, kept on disk like ``cached_audit``."""
    return _cached(GRPOAuditRow, grpo_audit, **options)


def _cached(row_type: type, compute: Callable[..., list], **options: Any) -> list:
    import hashlib
    import json
    from importlib.metadata import version
    from pathlib import Path

    key = hashlib.sha256(
        "\0".join(
            [
                *(Path(m.__file__).read_text() for m in (kl, grpo)),
                Path(__file__).read_text(),
                version("torch"),
                compute.__name__,
                repr(sorted(options.items())),
            ]
        ).encode()
    ).hexdigest()[:16]
    path = store.cache_dir() / "audit" / f"{key}.json"
    if path.exists():
        try:
            return [row_type(**row) for row in store.read_json(path)]
        except (OSError, TypeError, json.JSONDecodeError):
            pass  # a stale or damaged cache entry is recomputed
    rows = compute(**options)
    store.write_json(path, rows_as_dicts(rows))
    return rows


# ---------------------------------------------------------------------------------------------------------
# The GRPO audit: the expected update of the trainer's whole objective
# ---------------------------------------------------------------------------------------------------------

GRPO_LOSS_TYPES = tuple(t for t in grpo.LOSS_TYPES if t != "vespo")  # on-policy gradient -A grad log pi
MAX_STEPS = 300_000  # enumerated optimiser steps (multisets of completions)
GRPO_VERDICTS = ("exact", "rescaled", "forward KL", "zero in expectation", "biased")
GRPO_VERDICT_STYLES = dict(zip(GRPO_VERDICTS, ("green", "cyan", "yellow", "magenta", "red"), strict=True))


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
    effective_scale: float
    cos_reverse: float  # cosine between the effective KL gradient and grad KL(pi||ref)
    cos_forward: float  # ... and grad KL(ref||pi)
    rel_err_reverse: float  # ||effective / unit - grad KL(pi||ref)|| / ||grad KL(pi||ref)||
    rel_norm: float  # ||effective / unit|| / ||grad KL(pi||ref)||
    verdict: str


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
    ):
        if options[name] not in allowed:
            problems.append(Problem(name, f"{options[name]!r} is not valid", ", ".join(allowed)))
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
    loss_of: Callable[[Tensor, Tensor, Tensor], Tensor],
    weights: Tensor | None,
    jac: Tensor | None,
) -> Tensor:
    """The gradient with respect to pi's logits of ``loss_of(logp, ref_logp, mask)`` [S] (one loss per
    optimiser step, a row of ``seqs``; per-token log-probs [S, n, T]): per step [S, P], or with ``weights`` [S]
    the weighted sum [P]. The derivatives with respect to the per-token log-probs are summed per sequence,
    then taken through the Jacobian of the log-probs."""
    import torch

    n_seqs, length = policy.seqs.shape
    logp = policy.token_logp(policy.theta).detach()[seqs].requires_grad_()  # [S, n, T]
    ref = policy.token_logp(policy.ref)[seqs]
    loss = loss_of(logp, ref, torch.ones_like(logp, dtype=torch.bool))
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
) -> Tensor:
    """The gradient with respect to pi's logits of the trainer's on-policy objective for each optimiser step
    (a row of ``seqs``: indices of its completions, group after group) [S, P], or with ``weights`` [S] their
    weighted sum [P]. The objective is the trainer's own functions: ``grpo.policy_loss`` of the advantages
    ``grpo.advantages`` (task reward, the detached penalty ``kl.estimate`` when the KL is in the reward,
    ``config.reward_mode``, ``scale_rewards``), plus ``config.beta`` times ``grpo.kl_loss`` when it is in the
    loss, aggregated per ``loss_type`` (``_aggregation``)."""
    in_reward = config.beta > 0 and config.placement in ("reward", "both")
    in_loss = config.beta > 0 and config.placement in ("loss", "both")
    aggregation = _aggregation(loss_type, seqs, policy.seqs.size(1))
    rewards = task_reward[seqs]

    def loss_of(logp: Tensor, ref: Tensor, mask: Tensor) -> Tensor:
        penalty = kl.estimate(logp.detach(), ref, mask, config.estimator, config.level) if in_reward else None
        adv = grpo.advantages(rewards, penalty, config.beta, group_size, scale_rewards, config.reward_mode)
        loss = grpo.policy_loss(adv, logp, mask, aggregation)
        if in_loss:
            loss = loss + config.beta * grpo.kl_loss(logp, ref, mask, config, aggregation)
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
) -> list[GRPOAuditRow]:
    """Per configuration (estimator x placement x level, for each reward mode and reward scaling: ``all`` for
    every one), the exact expected update of the trainer's objective on a random tabular policy (vocabulary
    ``vocab``, completions of ``length`` tokens), enumerating every step of G = ``group_size`` completions
    (with ``scale_rewards="batch"``, of ``groups`` groups, which its statistic spans; group and none do not
    depend on the number of groups and enumerate one). The task reward is ``task_reward_table``; the
    effective KL gradient ``(E[grad L(beta)] - E[grad L(0)]) / beta`` is compared with grad KL(pi||ref) and
    grad KL(ref||pi), in the units of the loss type's aggregation (``GRPOAuditRow``)."""
    _validate_grpo(dict(locals()))
    policy = TabularPolicy.random(vocab, length, seed, ref_distance, 0.0)
    g_reverse, g_forward = exact_kl_gradients(policy)
    jac = policy.token_logp_jacobian()
    reward = task_reward_table(len(policy.seqs), seed)
    probs = policy.token_logp(policy.theta).sum(-1).exp()
    modes = kl.REWARD_MODES if reward_mode == "all" else (reward_mode,)
    scalings = grpo.SCALE_REWARDS if scale_rewards == "all" else (scale_rewards,)

    rows = []
    for scaling in scalings:
        n_groups = groups if scaling == "batch" else 1
        seqs, p = enumerate_steps(probs, group_size, n_groups)
        unit = _unit(policy, seqs, p, loss_type, g_reverse, jac)
        no_kl = kl.KLConfig("k1", "reward", beta=0.0)
        g_zero = grpo_gradients(policy, reward, seqs, no_kl, group_size, scaling, loss_type, p, jac)
        loss_rows: dict[tuple[str, str], dict[str, float]] = {}  # the KL in the loss ignores the reward mode
        for mode in modes:
            for estimator, placement, level in CONFIGS:
                if placement == "loss" and (estimator, level) in loss_rows:
                    values = loss_rows[estimator, level]
                else:
                    config = kl.KLConfig(estimator, placement, level, beta=beta, reward_mode=mode)
                    g_beta = grpo_gradients(
                        policy, reward, seqs, config, group_size, scaling, loss_type, p, jac
                    )
                    values = _effective(((g_beta - g_zero) / beta) / unit, g_reverse, g_forward)
                    if placement == "loss":
                        loss_rows[estimator, level] = values
                rows.append(
                    GRPOAuditRow(
                        estimator=estimator,
                        placement=placement,
                        level=level,
                        reward_mode=mode,
                        scale_rewards=scaling,
                        loss_type=loss_type,
                        group_size=group_size,
                        groups=n_groups,
                        beta=float(beta),
                        **values,
                        verdict=_grpo_verdict(values),
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

    def loss_of(logp: Tensor, ref: Tensor, mask: Tensor) -> Tensor:
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


GRPO_LEGEND = """\
scale: the effective KL gradient, (E[grad L(beta)] - E[grad L(0)]) / beta,
  projected on grad KL(pi||ref) over its squared norm, in units of the loss
  type's aggregation: 1 when beta means what it says.
cos rev, cos fwd: its cosines with grad KL(pi||ref) and grad KL(ref||pi).
err rev: its relative error against grad KL(pi||ref) (exact: below 1e-6;
  rescaled: the reverse-KL direction at another scale)."""


def grpo_tables(rows: list[GRPOAuditRow]) -> list:
    """The rows as rich Tables, one per reward mode and reward scaling, narrow enough for 80 columns:
    ``scale`` is ``effective_scale``, ``cos rev``/``cos fwd`` the cosines with grad KL(pi||ref) and
    grad KL(ref||pi), ``err rev`` the relative error of effective / unit against grad KL(pi||ref)."""
    from rich import box
    from rich.table import Table

    out = []
    for mode, scaling in dict.fromkeys((r.reward_mode, r.scale_rewards) for r in rows):
        t = Table(
            title=f"reward_mode {mode}, scale_rewards {scaling}",
            box=box.SIMPLE_HEAD,
            padding=0,
            pad_edge=False,
        )
        for name in ("est", "placement", "level"):
            t.add_column(name, no_wrap=True)
        for name in ("scale", "cos rev", "cos fwd", "err rev"):
            t.add_column(name, justify="right", no_wrap=True)
        t.add_column("verdict", no_wrap=True)
        for r in rows:
            if (r.reward_mode, r.scale_rewards) == (mode, scaling):
                verdict = f"[{GRPO_VERDICT_STYLES[r.verdict]}]{r.verdict}[/]"
                numbers = (r.effective_scale, r.cos_reverse, r.cos_forward, r.rel_err_reverse)
                t.add_row(r.estimator, r.placement, r.level, *(f"{x:.3f}" for x in numbers), verdict)
        out.append(t)
    return out
