"""The estimator audit: the exact expected gradient of every KL configuration (estimator x placement x level) on
a random tabular autoregressive policy, enumerated exhaustively, against the exact gradients of the reverse and
forward KL; on- and off-policy (with importance weights). ``TabularPolicy`` and the exact KL gradients are
shared with the GRPO audit (``objective.py``). See the package docstring for the verdicts."""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from klsweep import kl
from klsweep.errors import Problem, UserError

if TYPE_CHECKING:
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
    preset: str = ""  # the framework preset audited (klsweep.presets), "" for a plain configuration


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

    imps = kl.IMPORTANCE if importance == "all" else (importance,)
    configs = [("", kl.KLConfig(e, p, lv, importance=imp)) for imp in imps for e, p, lv in CONFIGS]
    return _rows(policy, configs, behavior_shift)


def preset_audit(
    presets: tuple[str, ...] | list[str],
    vocab: int = 3,
    length: int = 3,
    seed: int = 0,
    ref_distance: float = 1.0,
    behavior_shift: float = 0.0,
) -> list[AuditRow]:
    """One row per framework preset (``klsweep.presets``; ``all``: every one): the exact expected gradient of
    its whole KL configuration (estimator, placement, level, importance weighting, the gradient forms and
    clamps of ``klsweep.kl``) against the exact KL gradients, on-policy or, with ``behavior_shift > 0``, from
    the behaviour policy's samples with the preset's own weighting."""
    from klsweep import presets as preset_mod

    names = preset_mod.resolve(presets)
    return config_audit(
        [(n, preset_mod.kl_config(n)) for n in names], vocab, length, seed, ref_distance, behavior_shift
    )


def config_audit(
    configs: list[tuple[str, kl.KLConfig]],
    vocab: int = 3,
    length: int = 3,
    seed: int = 0,
    ref_distance: float = 1.0,
    behavior_shift: float = 0.0,
) -> list[AuditRow]:
    """``preset_audit`` of whole KL configurations, each labelled (a preset's name, a framework config's term):
    one row each, with its own weighting off-policy."""
    _validate(vocab, length, seed, ref_distance, behavior_shift, "none")
    policy = TabularPolicy.random(vocab, length, seed, ref_distance, behavior_shift)
    return _rows(policy, configs, behavior_shift)


def _rows(
    policy: TabularPolicy, configs: list[tuple[str, kl.KLConfig]], behavior_shift: float
) -> list[AuditRow]:
    """The audit row of each (preset name or "", configuration) on ``policy``."""
    g_reverse, g_forward = exact_kl_gradients(policy)
    jac = policy.token_logp_jacobian()
    q = policy.token_logp(policy.behavior).sum(-1).exp()  # sampling distribution (pi if behavior_shift == 0)
    rows = []
    for name, config in configs:
        per_sample = per_sample_gradients(policy, config, jac)
        mean = q @ per_sample
        variance = (q @ per_sample.square().sum(-1) - mean.square().sum()).clamp(min=0)
        rel_rev = ((mean - g_reverse).norm() / g_reverse.norm()).item()
        rel_fwd = ((mean - g_forward).norm() / g_forward.norm()).item()
        rel_norm = (mean.norm() / g_reverse.norm()).item()
        rows.append(
            AuditRow(
                estimator=config.estimator,
                placement=config.placement,
                level=config.level,
                importance=config.importance,
                behavior_shift=float(behavior_shift),
                rel_err_reverse=rel_rev,
                rel_err_forward=rel_fwd,
                rel_norm=rel_norm,
                grad_variance=variance.item(),
                verdict=_verdict(rel_rev, rel_fwd, rel_norm),
                preset=name,
            )
        )
    return rows


def select(rows: list[Any], estimator: str | None = None, placement: str | None = None) -> list[Any]:
    """The rows (``AuditRow`` or ``GRPOAuditRow``) of this estimator and placement (None: any); ``UserError``
    for a value that is not one, listing both problems at once."""
    problems = []
    for name, value, allowed in (
        ("estimator", estimator, kl.ESTIMATOR_CHOICES),
        ("placement", placement, kl.PLACEMENTS),
    ):
        if value is not None and value not in allowed:
            problems.append(Problem(name, f"{value!r} is not valid", ", ".join(allowed)))
    if problems:
        raise UserError(problems, title="invalid audit filter")
    return [
        r
        for r in rows
        if (estimator is None or r.estimator == estimator) and (placement is None or r.placement == placement)
    ]


def verdicts(**options: Any) -> dict[tuple[str, str, str], str]:
    """{(estimator, placement, level): verdict} for ``audit(**options)`` (one importance setting)."""
    if options.get("importance") == "all":
        raise UserError(Problem("importance", "'all' is not valid here", ", ".join(kl.IMPORTANCE)))
    return {(r.estimator, r.placement, r.level): r.verdict for r in audit(**options)}


def rows_as_dicts(rows: list[Any]) -> list[dict[str, Any]]:
    """The rows (``AuditRow`` or ``GRPOAuditRow``) as plain dicts (JSON, CSV, pandas)."""
    return [asdict(r) for r in rows]
