"""The KL gradient audit table: for each KL configuration in the sweep, what the trainer's expected KL update is
with the sweep's real settings, from the exact enumeration of ``klsweep.audit.grpo_audit`` (the GRPO audit:
estimator, placement, level, reward mode, beta, group size G, ``scale_rewards`` and loss type of the runs). Each
run gets the verdict of its own sampling: on-policy runs the on-policy audit; off-policy runs (lag > 0 or
several iterations) the off-policy audit (behaviour shift ``OFF_POLICY_SHIFT``) with their ``kl.reward_logp``,
``kl.importance`` and ``kl.importance_cap``, and also the off-policy audit of the bare estimator. Audits are
cached on disk (``klsweep.audit.cached_grpo_audit``) and computed once per process.

A run whose KL configuration is a framework preset's (``klsweep.presets.name_of``) is labelled with its name
(a ``preset`` column, when one is). A run that uses one of the frameworks' KL forms (``KL_FORMS``: a weight that
keeps its gradient, straight-through, clamps ...) is audited with its whole configuration
(``klsweep.audit.grpo_config_audit``), in a row of its own."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from klsweep.config import KL_FORMS, NO_KL
from klsweep.report.tables import DASH, sort_key

if TYPE_CHECKING:
    import pandas as pd

OFF_POLICY_SHIFT = 0.5  # the behaviour policy of the off-policy audits: mu = pi + this x noise (logits)
# Off-policy runs are also keyed by these (on-policy they change nothing): dotted config key -> column.
SAMPLING = {"kl.importance": "importance", "kl.reward_logp": "reward logp", "kl.importance_cap": "cap"}

# The run settings a row is keyed by, before the sampling: dotted config key -> column.
SETTINGS = {
    "kl.estimator": "estimator",
    "kl.placement": "placement",
    "kl.level": "level",
    "kl.reward_mode": "reward mode",
    "kl.beta": "beta",
    "train.group_size": "G",
    "train.scale_rewards": "scale_rewards",
    "train.loss_type": "loss type",
}


# A run that sets one of the frameworks' KL forms away from its default (config.KL_FORMS), or weighs with one of
# the frameworks' weightings, is audited with its whole KL configuration, in a row of its own.
FORM_WEIGHTS = ("sequence_mean", "self")


def audit_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per KL configuration in the sweep (the ``SETTINGS`` of its runs and whether they are on- or
    off-policy, with the importance weighting), with the GRPO audit of the trainer's expected update:
    ``effective scale`` (1: the KL part of the update is beta x grad KL(pi||ref) in the policy loss's units),
    the cosines with grad KL(pi||ref) and grad KL(ref||pi), the relative error against the former, the verdict
    (off-policy rows: of the off-policy audit with their reward log-probs, weighting and cap); ``unbiased`` =
    the verdict is exact. Off-policy rows add the bare estimator's off-policy verdict."""
    import pandas as pd

    run_configs = _kl_configs(runs)
    keys = _keys(runs, run_configs)
    configs = dict(zip(keys, run_configs, strict=True))
    with_preset = any(k[-2] != DASH for k in keys)  # the columns of the frameworks' presets and forms, only
    with_forms = any(k[-1] != DASH for k in keys)  # where a run has them: the table of other sweeps as it was
    counts: dict[tuple[Any, ...], list[int]] = {}
    for k, c in zip(keys, runs["config"], strict=True):
        counts.setdefault(k, []).append(c)
    off_policy = (
        {(r.estimator, r.placement, r.level, r.importance): r for r in _audit(OFF_POLICY_SHIFT, "all")}
        if any(k[len(SETTINGS)] != "on-policy" and k[0] != NO_KL for k in counts)
        else {}
    )
    rows = []
    for k in sorted(counts, key=sort_key):
        values, (imp, logp, cap) = k[: len(SETTINGS)], k[len(SETTINGS) : len(SETTINGS) + 3]
        preset, forms = k[-2:]
        est, plc, lvl, mode, beta, g, scale, loss_type = values
        row: dict[str, Any] = {"preset": preset} if with_preset else {}
        row |= dict(zip(SETTINGS.values(), values, strict=True))
        off = est != NO_KL and imp != "on-policy"
        row |= {
            "sampling": (_sampling(imp, logp, cap) if off else "on-policy" if est != NO_KL else DASH),
            **({"KL form": forms} if with_forms else {}),
            "configurations": len(set(counts[k])),
            "runs": len(counts[k]),
        }
        sampling = (OFF_POLICY_SHIFT, logp, imp, cap) if off else (0.0, None, None, 0.0)
        if est == NO_KL:
            audited = None
        elif forms != DASH:
            audited = _grpo_config(configs[k], g, scale, loss_type, OFF_POLICY_SHIFT if off else 0.0)
        else:
            audited = _grpo(g, scale, mode, loss_type, beta, *sampling)
        a = audited.get((est, plc, lvl)) if isinstance(audited, dict) else None
        if a is None:
            verdict = (
                "no KL term (beta = 0)"
                if est == NO_KL
                else f"not audited: {audited}"
                if isinstance(audited, str)
                else "not audited"
            )
            row |= {
                "effective scale": math.nan,
                "cos reverse": math.nan,
                "cos forward": math.nan,
                "rel. err. reverse": math.nan,
                "verdict": verdict,
                "unbiased": DASH,
            }
        else:
            row |= {
                "effective scale": a.effective_scale,
                "cos reverse": a.cos_reverse,
                "cos forward": a.cos_forward,
                "rel. err. reverse": a.rel_err_reverse,
                "verdict": a.verdict,
                "unbiased": "yes" if a.verdict == "exact" else "no",
            }
        o = off_policy.get((est, plc, lvl, imp))
        row["off-policy estimator verdict"] = o.verdict if o is not None else DASH
        rows.append(row)
    return pd.DataFrame(rows)


def _sampling(importance: str, reward_logp: str, cap: Any) -> str:
    """How an off-policy row's runs weigh their samples, in words."""
    weights = "no importance weights" if importance == "none" else f"importance={importance}"
    capped = f" capped at {cap:g}" if isinstance(cap, int | float) and cap > 0 else ""
    return f"off-policy, {weights}{capped}, {reward_logp} log-probs in the reward"


def _kl_configs(runs: pd.DataFrame) -> list[Any]:
    """Per run, its ``klsweep.kl.KLConfig`` (the run's ``kl.*`` columns over the defaults), or None when they are
    not a valid one."""
    import dataclasses

    from klsweep import presets
    from klsweep.config import KLSection
    from klsweep.errors import UserError

    fields = {f.name for f in dataclasses.fields(KLSection)}
    columns = [c for c in runs.columns if c.startswith("kl.") and c[3:] in fields]
    out = []
    for values in runs[columns].astype(object).itertuples(index=False):
        given = {c[3:]: _plain(v) for c, v in zip(columns, values, strict=True)}
        given = {n: v for n, v in given.items() if v is not None or n == "beta_final"}
        try:
            out.append(presets.config_of(given))
        except (UserError, TypeError):
            out.append(None)
    return out


def _form(config: Any) -> str:
    """The frameworks' KL forms a configuration uses, in words, or DASH (klsweep's own)."""
    if config is None:
        return DASH
    used = [
        f"{key[3:]}={getattr(config, key[3:])}"
        for key, default in KL_FORMS.items()
        if getattr(config, key[3:]) != default
    ]
    if config.importance in FORM_WEIGHTS:
        used.insert(0, f"importance={config.importance}")
    return ", ".join(used) or DASH


def _keys(runs: pd.DataFrame, configs: list[Any] | None = None) -> list[tuple[Any, ...]]:
    """Per run: the audit row it belongs to (its ``SETTINGS`` values, then "on-policy" and two dashes, or its
    ``SAMPLING`` values; then its preset's name and its frameworks' KL forms, or dashes). ``configs``: the
    runs' ``_kl_configs`` where the caller has them."""
    from klsweep import presets

    off = (runs["offpolicy.lag"].fillna(0).astype(float) > 0) | (
        runs["offpolicy.num_iterations"].fillna(1).astype(float) > 1
    )
    no_kl = runs["kl.beta"].fillna(0).astype(float) == 0
    settings = runs[list(SETTINGS)].astype(object).to_numpy()
    sampling = runs[list(SAMPLING)].astype(object).to_numpy()
    configs = _kl_configs(runs) if configs is None else configs
    names = {c: presets.name_of_config(c) for c in set(configs) if c is not None}
    return [
        ((NO_KL,) * 3 + (DASH,) * 5 + (NO_KL, DASH, DASH, DASH, DASH))
        if nk
        else (
            *(_plain(v) for v in values),
            *((_plain(v) for v in how) if o else ("on-policy", DASH, DASH)),
            (names.get(c) if c is not None else None) or DASH,
            _form(c),
        )
        for nk, o, values, how, c in zip(no_kl, off, settings, sampling, configs, strict=True)
    ]


def run_unbiased(runs: pd.DataFrame, audit: pd.DataFrame) -> list[str]:
    """Per run, the ``unbiased`` verdict of its audit row: "yes", "no", or DASH (no KL, not audited)."""
    keys = _keys(runs)
    order = sorted(set(keys), key=sort_key)  # the audit's rows, in the order ``audit_table`` built them
    verdicts = dict(zip(order, audit["unbiased"], strict=True)) if len(audit) == len(order) else {}
    return [verdicts.get(k, DASH) for k in keys]


def _plain(v: Any) -> Any:
    """A config value as a plain, hashable Python value (numpy scalars unwrapped; NaN as None)."""
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and math.isnan(v) else v


@functools.cache
def _grpo(
    group_size: Any,
    scale_rewards: Any,
    reward_mode: Any,
    loss_type: Any,
    beta: Any,
    behavior_shift: float = 0.0,
    reward_logp: Any = None,
    importance: Any = None,
    importance_cap: Any = 0.0,
) -> dict | str:
    """{(estimator, placement, level): GRPOAuditRow} of ``klsweep.audit.grpo_audit`` with these settings and
    its default policy (off-policy: ``behavior_shift`` > 0, one reward_logp and importance), or why it cannot
    be audited (settings it rejects, e.g. a group too large to enumerate, a loss type it does not model)."""
    from klsweep import audit
    from klsweep.errors import UserError

    try:
        rows = audit.cached_grpo_audit(
            group_size=int(group_size),
            scale_rewards=scale_rewards,
            reward_mode=reward_mode,
            loss_type=loss_type,
            beta=float(beta),
            behavior_shift=behavior_shift,
            reward_logp=reward_logp,
            importance=importance,
            importance_cap=float(importance_cap),
        )
    except (UserError, TypeError, ValueError) as e:
        problems = getattr(e, "problems", None)
        return "; ".join(map(str, problems)) if problems else str(e)
    return {(r.estimator, r.placement, r.level): r for r in rows}


@functools.cache
def _grpo_config(
    config: Any, group_size: Any, scale_rewards: Any, loss_type: Any, behavior_shift: float
) -> dict | str:
    """Like ``_grpo``, for one whole KL configuration (``klsweep.audit.grpo_config_audit``): {(estimator,
    placement, level): GRPOAuditRow}, or why it cannot be audited."""
    from klsweep import audit
    from klsweep.errors import UserError

    try:
        rows = audit.grpo_config_audit(
            [("", config)],
            group_size=int(group_size),
            scale_rewards=scale_rewards,
            loss_type=loss_type,
            behavior_shift=behavior_shift,
        )
    except (UserError, TypeError, ValueError) as e:
        problems = getattr(e, "problems", None)
        return "; ".join(map(str, problems)) if problems else str(e)
    return {(r.estimator, r.placement, r.level): r for r in rows}


@functools.cache
def _audit(behavior_shift: float, importance: str) -> tuple[Any, ...]:
    """``klsweep.audit.audit`` with its default policy (deterministic: computed once per process)."""
    from klsweep import audit

    return tuple(audit.cached_audit(behavior_shift=behavior_shift, importance=importance))
