"""How the report names a configuration, the way the paper does: "k1 in reward", "k3 in both", "no KL", then
what else sets it apart ("β=0.3", "lag 16", "sequence IS"), in every figure, the LaTeX tables and the
``label`` column; a grid's ``labels:`` (``klsweep.grid.labels``) replaces words of its choosing.

A name is made of *phrases*, one per slot: the KL slot (estimator and placement; all the KL fields of a run
without KL, which read "no KL"), then one per other axis (``SLOTS``). A phrase is written only for the axes a
name shows (``labelled_axes``: a KL field the same in every run with KL is left to the caption); a default
(lag 0, importance none, level token, one iteration, the separate KL advantage) is left out of a compact name
(a legend entry, a bar's label) unless nothing else is left, and written in an explicit one (a panel's row
label). A label rule that matches the configuration replaces the phrases of the slots its keys fall in.
Rules and words: docs/REPORT.md, "Names".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from klsweep.config import NO_KL
from klsweep.report.data import nan_to_none

if TYPE_CHECKING:
    import pandas as pd

    from klsweep.grid.labels import LabelRule

DASH = "—"

# Short column names of the configuration axes.
SHORT = {
    "model.name": "model",
    "model.path": "model path",
    "task.name": "task",
    "kl.estimator": "estimator",
    "kl.placement": "placement",
    "kl.level": "level",
    "kl.beta": "beta",
    "kl.importance": "importance",
    "kl.reward_mode": "reward mode",
    "offpolicy.lag": "lag",
    "offpolicy.num_iterations": "iterations",
}

KL_KEYS = ("kl.estimator", "kl.placement", "kl.level", "kl.beta", "kl.importance")
KL = "kl"  # the slot of the estimator and the placement (and of every KL field of a run without KL)
SLOTS = (
    "model.name",
    "model.path",
    "task.name",
    KL,
    "kl.level",
    "kl.beta",
    "kl.reward_mode",
    "offpolicy.lag",
    "offpolicy.num_iterations",
    "kl.importance",
)  # their order in a name; any other axis after them, by its key
IMPORTANCE = {
    "token": "token IS",
    "sequence": "sequence IS",
    "sequence_mean": "geo-mean IS",
    "self": "self IS",
}


def fmt_value(v: Any) -> str:
    v = nan_to_none(v)
    if v is None:
        return DASH
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def sort_key(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Configuration order: numbers before names, "no KL" after the KL configurations."""
    return tuple((v is None, v == NO_KL, isinstance(v, str), v if v is not None else 0) for v in values)


def matches(v: Any, wanted: Any) -> bool:
    """A run's value against a filter's (YAML) value: numbers by value, the rest as text."""
    v = nan_to_none(v)
    if isinstance(wanted, bool) or isinstance(v, bool):
        return str(v).lower() == str(wanted).lower()
    if isinstance(wanted, int | float) and not isinstance(v, str | type(None)):
        try:
            return float(v) == float(wanted)
        except (TypeError, ValueError):
            return False
    return fmt_value(v) == fmt_value(wanted)


def kl_on(runs: pd.DataFrame) -> pd.Series:
    """Per run: whether it trains with a KL term (beta > 0). A bool Series even when empty: an empty object
    Series would index a frame's columns, not its rows (a report before any run finished)."""
    return runs["kl.beta"].map(lambda b: nan_to_none(b) is not None and float(b) != 0).astype(bool)


def labelled_axes(runs: pd.DataFrame, axes: list[str]) -> list[str]:
    """The axes a figure or a paper table labels: every configuration axis but a KL field that varies only
    because the runs without KL (beta = 0) show it as "no KL" (e.g. level "token" for every KL run)."""
    on = runs[kl_on(runs)]
    return [a for a in axes if a not in KL_KEYS or on[a].map(fmt_value).nunique() > 1]


def fixed_text(runs: pd.DataFrame, axes: list[str]) -> str:
    """What the labels leave out: "level = token, beta = 0.1 in every run with KL" (or "")."""
    on = runs[kl_on(runs)]
    fixed = [a for a in axes if a not in labelled_axes(runs, axes) and len(on)]
    if not fixed:
        return ""
    values = ", ".join(f"{SHORT.get(a, a)} = {fmt_value(on[a].iloc[0])}" for a in fixed)
    return f"{values} in every run with KL"


def slot(key: str, with_kl: bool) -> str:
    """The slot of a config key's phrase in the name of a configuration with (or without) KL."""
    if key in ("kl.estimator", "kl.placement") or (not with_kl and key.startswith("kl.")):
        return KL
    return key


def _kl_phrase(values: dict[str, Any], keys: set[str], with_kl: bool) -> str:
    if not with_kl:
        return NO_KL
    estimator, placement = fmt_value(values.get("kl.estimator")), fmt_value(values.get("kl.placement"))
    if {"kl.estimator", "kl.placement"} <= keys:
        return f"{estimator} in {placement}"
    if "kl.estimator" in keys:
        return estimator
    if "kl.placement" in keys:
        return f"KL in {placement}"
    return "with KL"


def phrase(key: str, value: Any, explicit: bool) -> str:
    """The words of one axis value outside the KL slot; "" for a default left out of a compact name."""
    v = fmt_value(value)
    if key == "kl.level":
        return f"{v}-level" if explicit or v != "token" else ""
    if key == "kl.beta":
        return f"β={v}"
    if key == "kl.importance":
        return IMPORTANCE.get(v, f"{v} IS") if v != "none" else "no IS" if explicit else ""
    if key == "kl.reward_mode":
        return {"shaped": "shaped KL", "separate": "separate KL advantage" if explicit else ""}.get(
            v, f"KL {v}"
        )
    if key == "offpolicy.lag":
        return f"lag {v}" if explicit or v != "0" else ""
    if key == "offpolicy.num_iterations":
        return f"{v} iterations" if v != "1" else "1 iteration" if explicit else ""
    if key in ("model.name", "model.path"):
        return v
    return f"{SHORT.get(key, key)}={v}"


class Names:
    """The names of a report's configurations (``runs``: one row per run, with ``config``; ``configs``: each
    run's flattened config, for rules on keys that are not columns of ``runs``)."""

    def __init__(
        self,
        runs: pd.DataFrame,
        axes: list[str],
        rules: list[LabelRule] | None = None,
        configs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.rules = list(rules or [])
        self.shown = labelled_axes(runs, axes) if len(runs) else list(axes)
        first = runs.drop_duplicates("config")
        on = kl_on(first)
        self.kl_varies = on.nunique() > 1
        self.values: dict[Any, dict[str, Any]] = {}
        self.with_kl: dict[Any, bool] = {}
        self.matched: dict[Any, list[LabelRule]] = {}
        for (_, row), kl in zip(first.iterrows(), on, strict=True):
            own = {**(configs or {}).get(row["run"], {}), **row.to_dict()}
            self.values[row["config"]] = own
            self.with_kl[row["config"]] = bool(kl)
            self.matched[row["config"]] = [
                r
                for r in self.rules
                if all(any(matches(own.get(k), w) for w in vs) for k, vs in r.filters.items())
            ]

    def bound(self) -> set[str]:
        """The axes a label rule names together with another shown axis: a figure keeps them in one name (it
        never splits them between a panel's row label and its legend)."""
        out: set[str] = set()
        for r in self.rules:
            keys = [k for k in r.filters if k in self.shown]
            if len(keys) > 1:
                out.update(keys)
        return out

    def name(
        self,
        config: Any,
        axes: list[str] | None = None,
        *,
        explicit: bool = False,
        force_kl: bool | None = None,
        rules: bool = True,
    ) -> str:
        """The configuration's name over ``axes`` (default: every labelled axis, the KL slot named whenever some
        configurations have KL and others not). ``explicit``: defaults written too (a row label).
        ``force_kl``: the KL slot named whole ("k1 in loss", the estimator and placement that do not vary
        too), and even when no KL axis is among ``axes`` if some configurations have no KL (default: for a
        full name; the KL axes left out of ``axes`` but shown, a figure's facets, stay out). ``rules``: the
        label rules' words (else the report's own)."""
        shown = self.shown if axes is None else [a for a in axes if a in self.shown]
        force = (axes is None) if force_kl is None else force_kl
        values, with_kl = self.values[config], self.with_kl[config]
        slots: dict[str, list[str]] = {}  # slot -> the shown keys in it
        for a in shown:
            slots.setdefault(slot(a, with_kl), []).append(a)
        if force and (KL in slots or self.kl_varies):  # "k1 in loss", not "KL in loss", when k1 is fixed
            slots[KL] = [a for a in ("kl.estimator", "kl.placement") if a in shown or a not in self.shown]
        order = sorted(slots, key=lambda s: (SLOTS.index(s) if s in SLOTS else len(SLOTS), s))
        words: dict[str, str] = {}
        taken: set[str] = set()
        for rule in self.matched[config] if rules else []:
            covered = {slot(k, with_kl) for k in rule.filters}
            if covered & set(order) and not covered & taken:
                words[min(covered & set(order), key=order.index)] = rule.label
                taken |= covered
        for explicit_now in [explicit] if explicit else [False, True]:
            parts = [
                words[s]
                if s in words
                else ""
                if s in taken
                else _kl_phrase(values, set(slots[s]), with_kl)
                if s == KL
                else phrase(s, values.get(s), explicit_now)
                for s in order
            ]
            text = ", ".join(p for p in parts if p)
            if text:
                return text
        return "all runs"

    def unique(self, configs: list[Any]) -> dict[Any, str]:
        """The full name of each configuration; names a label rule made the same get the report's own name
        after them, in parentheses, so that no two configurations read alike."""
        names = {c: self.name(c) for c in configs}
        counts: dict[str, int] = {}
        for n in names.values():
            counts[n] = counts.get(n, 0) + 1
        return {c: n if counts[n] == 1 else f"{n} ({self.name(c, rules=False)})" for c, n in names.items()}
