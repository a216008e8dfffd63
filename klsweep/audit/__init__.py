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
configuration: it enumerates every optimiser step of G completions of the tabular policy (as
multisets, with their multinomial probabilities), with a random 0/1 task reward per sequence, and computes the
expected gradient of the trainer's objective with the trainer's own functions (``klsweep.grpo``: advantages
per ``scale_rewards`` and ``kl.reward_mode``, the policy loss and the KL loss aggregated per loss type), at beta
and at 0. The effective KL gradient ``(E[grad L(beta)] - E[grad L(0)]) / beta`` is compared with the exact
gradients of KL(pi||ref) and KL(ref||pi), in units of the loss type's aggregation: ``effective_scale`` 1 and
``cos_reverse`` 1 mean beta means what it says (``separate`` k1 in the reward: exactly, at any beta;
``shaped``: not, see docs/KL.md). Default V=3, L=2, G=4: ~0.5 s per scaling, ~15 s with batch scaling
(2 groups a step). With ``behavior_shift > 0`` it is off-policy: steps sampled from the behaviour policy, TRL's
clipped ratio, rows for each ``kl.reward_logp`` and ``kl.importance`` (~8 s).

Presets (``klsweep audit --preset NAME``, ``preset_audit`` and ``grpo_preset_audit``): the same audits of a
framework's whole KL configuration (``klsweep.presets``), one row per preset; ``select`` keeps the rows of an
estimator and a placement (``--estimator``, ``--placement``).

Modules: ``exact`` (the tabular policy and the estimator audit), ``objective`` (the GRPO audit), ``cache``
(both kept on disk). Their tables are rendered by ``klsweep.console``.
"""

from __future__ import annotations

from klsweep.audit.cache import cached_audit, cached_grpo_audit
from klsweep.audit.exact import (
    CONFIGS,
    MAX_SEQUENCES,
    TOL,
    VERDICTS,
    AuditRow,
    TabularPolicy,
    audit,
    exact_kl_gradients,
    per_sample_gradients,
    preset_audit,
    rows_as_dicts,
    select,
    verdicts,
)
from klsweep.audit.objective import (
    GRPO_LOSS_TYPES,
    GRPO_VERDICTS,
    MAX_STEPS,
    OFF_POLICY_LOSS_TYPES,
    GRPOAuditRow,
    enumerate_steps,
    grpo_audit,
    grpo_config_audit,
    grpo_gradients,
    grpo_preset_audit,
    task_reward_table,
)

__all__ = [
    "AuditRow",
    "CONFIGS",
    "GRPOAuditRow",
    "GRPO_LOSS_TYPES",
    "GRPO_VERDICTS",
    "MAX_SEQUENCES",
    "MAX_STEPS",
    "OFF_POLICY_LOSS_TYPES",
    "TOL",
    "TabularPolicy",
    "VERDICTS",
    "audit",
    "cached_audit",
    "cached_grpo_audit",
    "enumerate_steps",
    "exact_kl_gradients",
    "grpo_audit",
    "grpo_config_audit",
    "grpo_gradients",
    "grpo_preset_audit",
    "per_sample_gradients",
    "preset_audit",
    "rows_as_dicts",
    "select",
    "task_reward_table",
    "verdicts",
]
