"""Every key a grid may set, described (``klsweep keys``): its type, its default, the values allowed and its help,
read from where each is defined: RunConfig's fields and their help (``klsweep.config``), the value checks
(``validate.CHECKS``; KL values as ``klsweep.kl.KLConfig`` judges them; the open mappings' entries), and the
config groups' options. A default is the value a run gets when its grid leaves the key alone: RunConfig's
default under the default config-group choices (``klsweep/conf/config.yaml``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, is_dataclass
from typing import Any

from klsweep.errors import Problem, UserError
from klsweep.grid.compose import Composer
from klsweep.grid.schema import GROUPS, Schema, lookup, walk_fields
from klsweep.grid.validate import CHECKS, NAME_ALLOWED, SBATCH, SBATCH_ALLOWED, TRL

GROUP_HELP = {
    "model": "config group: the model and its resources (klsweep/conf/model/)",
    "task": "config group: the training task (klsweep/conf/task/)",
    "cluster": "config group: where jobs run (klsweep/conf/cluster/)",
    "eval": "config group: the eval suite (klsweep/conf/eval/)",
    "preset": "config group: a library's default KL configuration (klsweep/conf/preset/); null: none",
}


@dataclass(frozen=True)
class KeyDoc:
    key: str  # dotted, as grid files and overrides write it
    type: str
    default: Any
    allowed: str  # "" where the type says it
    help: str


def describe(prefix: str = "") -> list[KeyDoc]:
    """The config groups, then every leaf key of RunConfig in its order; only those under ``prefix`` when given
    (a section such as ``train``, or a key). ``UserError`` when no key is under it."""
    problems: list[Problem] = []
    schema = Schema()
    composer = Composer([], schema, problems)
    composed = composer.compose(())
    if composed is None:
        raise UserError(problems, title="the default config cannot be composed")
    defaults, picked = json.loads(composed[0]), composed[1]
    docs = [
        KeyDoc(g, "config group", picked.get(g), ", ".join(composer.group_options(g)), GROUP_HELP[g])
        for g in GROUPS
    ]
    for key, t, f in walk_fields():
        if is_dataclass(t):
            continue
        type_name = schema.type_name(key)
        docs.append(KeyDoc(key, type_name, lookup(defaults, key), _allowed(key), f.metadata.get("help", "")))
    shown = [d for d in docs if not prefix or d.key == prefix or d.key.startswith(prefix + ".")]
    if not shown:
        sections = sorted({d.key.split(".")[0] for d in docs})
        raise UserError(Problem(prefix, "no key is under it", f"a section ({', '.join(sections)}) or a key"))
    return shown


def _allowed(key: str) -> str:
    if key == "name":
        return NAME_ALLOWED
    if key == TRL:
        return "GRPOConfig options klsweep does not set (klsweep.trlargs); +train.trl.NAME=VALUE"
    if key == SBATCH:
        return SBATCH_ALLOWED
    if key.startswith("kl."):
        return _kl_allowed(key[3:])
    check = CHECKS.get(key)
    return check[1] if check is not None else ""


def _kl_allowed(name: str) -> str:
    """What ``klsweep.kl.KLConfig`` allows for one of its fields (its message for a value it refuses)."""
    from klsweep import config as config_mod
    from klsweep.kl import KLConfig

    probe = dict(vars(config_mod.KLSection()), **{name: object()})
    try:
        KLConfig(**probe)
    except UserError as e:
        return e.problems[0].allowed
    return ""
