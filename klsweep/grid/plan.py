"""What a grid becomes: a ``Plan`` whose runs (``PlannedRun``) are each identified by the ``run_id`` of their
resolved config."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klsweep import config as config_mod


@dataclass
class PlannedRun:
    id: str
    params: dict[str, Any]  # dotted axis key -> this run's value (group axes: the option's name)
    # The complete, resolved RunConfig as plain (JSON-able) data. Read-only: the sections a run does not change
    # are shared with the other runs of its plan (copy before changing one).
    config: dict[str, Any]
    run_dir: Path
    # the ids this run had before configurations that train the same thing were merged (a no-KL run crossed
    # with estimators: ``config.kl_off_hashed_at``): run folders under them are moved to ``id`` on submit
    aliases: list[str] = field(default_factory=list)


@dataclass
class Plan:
    name: str
    sweep_dir: Path
    runs: list[PlannedRun]
    axes: list[str]  # dotted keys whose value varies across runs
    excluded: int  # runs dropped by `exclude:`
    grid_text: str  # the grid file as written
    merged: int = 0  # configurations that train the same thing as another one of the plan, merged into it
    # the shipped config-group files a user's folder replaces (``compose.shadowed``), one line each
    shadowed: list[str] = field(default_factory=list)
    swept: list[str] = field(
        default_factory=list
    )  # dotted keys written with several values (axes as written)
    seed_rule: Any = (
        None  # the grid's ``seeds:`` (``seeds.SeedRule``): the study's pilot and budget; None: none
    )

    def table_order(self) -> list[PlannedRun]:
        """The runs as ``klsweep plan`` lists them (``--runs``, ``--json``): configuration by configuration
        (``config_first`` axes, ``config_order``), then by id."""
        axes = config_first(self.axes)
        key = {r.id: config_order(config_mod.without_kl_when_off(r.params), axes) for r in self.runs}
        return sorted(self.runs, key=lambda r: (key[r.id], r.id))

    def find(self, which: str) -> PlannedRun:
        """The run ``which`` names: its id, the start of one run's id, or its index in the plan table's order
        (0-based: ``table_order``, as ``klsweep plan --runs`` and ``--json`` list the runs). ``UserError`` when
        it names none or several."""
        from klsweep.errors import Problem, UserError

        if which.isdigit() and len(which) < 10 and int(which) < len(self.runs):
            return self.table_order()[int(which)]
        hits = [r for r in self.runs if r.id.startswith(which)] if which else []
        if len(hits) == 1:
            return hits[0]
        what = f"names {len(hits)} runs" if hits else "is no run id of the plan"
        shown = hits or self.table_order()
        ids = ", ".join(r.id for r in shown[:6]) + (", ..." if len(shown) > 6 else "")
        allowed = f"a run id ({ids}), or an index 0..{len(self.runs) - 1}"
        raise UserError(Problem(which, what, allowed), title="no such run")


def config_order(params: dict[str, Any], axes: list[str]) -> tuple[Any, ...]:
    """Configuration order: axis by axis, numbers before names, numbers by value, "no KL" last."""
    return tuple(
        (
            v is None,
            v == config_mod.NO_KL,
            isinstance(v, str),
            v if isinstance(v, int | float) and not isinstance(v, bool) else str(v),
        )
        for v in (params.get(a) for a in axes)
    )


def config_first(axes: list[str]) -> list[str]:
    """The axes in table order: the configuration's, then the seed (rows sorted so read configuration by
    configuration)."""
    return [a for a in axes if a != "seed"] + [a for a in axes if a == "seed"]


def run_id(config: dict, memo: dict[tuple, Any] | None = None, legacy: bool = False) -> str:
    """First 10 hex chars of sha256 over the canonical JSON of ``config`` without ``config.COSMETIC_KEYS``,
    without the keys of ``config.id_omitted_at(config)`` that hold that value (``train.trl: {}``: a run that
    passes nothing to TRL keeps the id it had before the key existed; ``kl.reward_logp`` on-policy), and with
    each key of ``config.ID_HASHED_AT`` at that value whatever it holds (``train.use_vllm``: how a run is
    computed, not what), and, in a run without KL (``kl.beta`` 0), each KL-only key at its default
    (``config.kl_off_hashed_at``): the no-KL runs that differ only in keys that then do nothing are one run.
    ``legacy``: the id before that last rule (the folders of runs trained under it: ``PlannedRun.aliases``).
    ``memo`` (one per plan) keeps the JSON of each top-level section object seen: runs that share a section
    (``PlannedRun.config``) have it written once. The text is the same as ``json.dumps(..., sort_keys=True)`` of
    the whole."""
    parts = []
    omitted = config_mod.id_omitted_at(config)
    kl_off = _NOTHING if legacy else config_mod.kl_off_hashed_at(config)
    rules, hashed = _rules(omitted, kl_off, memo)
    for key in sorted(config):
        if key in config_mod.COSMETIC_KEYS:
            continue
        value = config[key]
        # what is omitted from a section may depend on the others (kl.reward_logp on offpolicy.lag); a section
        # object shared by runs is known by its identity, a flat one of scalars (kl, offpolicy: a copy in every
        # run that sets one of its keys) by its content, types included (1 and 1.0 are written apart)
        memo_key: tuple = (key, id(value), rules)
        hit = memo.get(memo_key) if memo is not None else None
        if (hit is None or hit[0] is not value) and isinstance(value, dict):
            values = tuple(value.values())
            content = (key, rules, tuple(value), values, tuple(map(type, values)))
            try:
                hit = memo.get(content) if memo is not None else None
                memo_key = content
            except TypeError:  # a value that cannot be hashed: by identity
                pass
            else:
                if hit is not None:  # the same content: the same text
                    hit = (value, hit[1])
        if hit is not None and hit[0] is value:
            text = hit[1]
        else:
            inner = _section_rules(key, rules, omitted, hashed, memo)
            text = _canonical(_without_cosmetic(value, inner))
            if memo is not None and isinstance(value, dict | list):
                memo[memo_key] = (value, text)
        name = _KEYS.get(key) or _KEYS.setdefault(key, json.dumps(key))
        parts.append(f"{name}:{text}")
    return hashlib.sha256(("{" + ",".join(parts) + "}").encode()).hexdigest()[:10]


_ABSENT = object()
_KEYS: dict[str, str] = {}  # a section's name as JSON
_NOTHING: dict[str, Any] = {}


def _rules(omitted: dict[str, Any], kl_off: dict[str, Any], memo: dict | None) -> tuple[str, dict[str, Any]]:
    """A run's rules in words (what is omitted, what hashed at a value: how they differ from the rules every
    run has), and the keys hashed at a value. Most runs of a plan share them (``config.id_omitted_at`` and
    ``kl_off_hashed_at`` return shared mappings), so each section's part is found once (``_section_rules``)."""
    memo_key = ("rules", id(omitted), id(kl_off))
    hit = memo.get(memo_key) if memo is not None else None
    if hit is not None and hit[0] is omitted and hit[1] is kl_off:
        return hit[2], hit[3]
    hashed = {**config_mod.ID_HASHED_AT, **kl_off}
    rules = repr(
        (
            [(k, v) for k, v in omitted.items() if config_mod.ID_OMITTED_AT.get(k, _ABSENT) != v],
            [(k, v) for k, v in hashed.items() if config_mod.ID_HASHED_AT.get(k, _ABSENT) != v],
        )
    )
    if memo is not None:  # the memo holds both mappings: their ids name no other while it lives
        memo[memo_key] = (omitted, kl_off, rules, hashed)
    return rules, hashed


def _section_rules(
    prefix: str, rules: str, omitted: dict[str, Any], hashed: dict[str, Any], memo: dict | None
) -> list[tuple[str, Any, str]]:
    """The keys inside section ``prefix`` that the id leaves out or hashes at a value: (key below the section,
    value, "omit" | "hash-at" | "omit-at"), cosmetic ones first, then ``hashed`` (a key both hashed at and
    omitted at its default, kl.importance_cap, is then omitted), then ``omitted``."""
    memo_key = ("rules", prefix, rules)
    if memo is not None and memo_key in memo:
        return memo[memo_key]
    start = prefix + "."
    inner = [(k[len(start) :], None, "omit") for k in config_mod.COSMETIC_KEYS if k.startswith(start)]
    inner += [(k[len(start) :], v, "hash-at") for k, v in hashed.items() if k.startswith(start)]
    inner += [(k[len(start) :], v, "omit-at") for k, v in omitted.items() if k.startswith(start)]
    if memo is not None:
        memo[memo_key] = inner
    return inner


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _without_cosmetic(value: Any, inner: list[tuple[str, Any, str]]) -> Any:
    """A section without its cosmetic keys (``model.name``, ``model.resources``) and its keys omitted at a value
    that hold it, its keys hashed at a value at that value (``_section_rules``), copied on the way down: the
    caller's dict is never touched."""
    if not isinstance(value, dict) or not inner:
        return value
    kept = dict(value)
    for key, at, how in inner:
        *parents, leaf = key.split(".")
        node = kept
        for part in parents:
            if not isinstance(node.get(part), dict):
                break
            node[part] = dict(node[part])
            node = node[part]
        else:
            if how == "hash-at":
                if leaf in node:
                    node[leaf] = at
            elif how == "omit" or node.get(leaf, at) == at:
                node.pop(leaf, None)
    return kept
