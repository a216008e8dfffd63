"""Labels as data: the ``labels:`` list of a grid file (or of a labels file, ``klsweep report --labels``), the
names the report gives configurations in its figures and tables in place of its own ("k1 in reward", "no KL",
"lag 16": ``klsweep.report.names``). Read and checked up front as ``claims:`` are, every problem located
(``labels[i].key``) and reported at once::

    labels:
      - {kl.estimator: k1, kl.placement: reward, label: "k1-R (Schulman)"}   # the configurations it matches
      - {kl.beta: 0, label: GRPO}

An entry's filters (any config key: a value or a list of values) select configurations; its ``label``
replaces the words the report would write for the filters' keys (docs/REPORT.md, "Names").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klsweep.errors import Problem
from klsweep.grid.schema import Schema, lookup

LABEL = "label"
MAX_LABEL = 60  # characters: a legend entry or a table cell, not a paragraph


@dataclass(frozen=True)
class LabelRule:
    """The configurations whose value of each filter key is one of its values are named ``label`` for those
    keys' words."""

    filters: dict[str, list[Any]]
    label: str
    index: int = field(default=0, compare=False)  # its place in the file's list (where a problem is located)


def parse_labels(value: Any, where: str, schema: Schema, problems: list[Problem]) -> list[LabelRule]:
    """``labels:`` as ``LabelRule``s; a problem recorded (not raised) for each bad entry, key by key."""
    from klsweep.grid.claims import parse_filters

    if value is None:
        return []
    example = "- {kl.estimator: k1, kl.placement: reward, label: k1 in reward}"
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        problems.append(Problem(where, "must be a list of labels", example))
        return []
    out: list[LabelRule] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(value):
        at = f"{where}[{i}]"
        before = len(problems)
        label = raw.get(LABEL)
        if not isinstance(label, str) or not label.strip():
            problems.append(Problem(f"{at}.{LABEL}", "missing or empty" if label is None else f"{label!r}",
                                    "the configuration's name in words (a string)"))  # fmt: skip
        elif len(label) > MAX_LABEL or not label.isprintable():
            what = f"{len(label)} characters" if len(label) > MAX_LABEL else "a control character in it"
            problems.append(Problem(f"{at}.{LABEL}", f"{label[:MAX_LABEL]!r}...: {what}",
                                    f"at most {MAX_LABEL} printable characters, on one line"))  # fmt: skip
        filters = {k: v for k, v in raw.items() if k != LABEL}
        if not filters:
            problems.append(Problem(at, "no filter: which configurations it names", example))
            parsed = {}
        else:
            parsed = parse_filters(filters, at, schema, problems, unbiased=False)
        key = repr(sorted((k, sorted(map(repr, v))) for k, v in parsed.items()))
        if parsed and key in seen:
            problems.append(
                Problem(at, f"the same filters as labels[{seen[key]}]", "one label per selection")
            )
        seen.setdefault(key, i)
        if len(problems) == before:
            out.append(LabelRule(parsed, str(label).strip(), i))
    return out


def grid_labels(grid_text: str, where: str, problems: list[Problem] | None = None) -> list[LabelRule]:
    """The label rules of a grid file's text (as a sweep's sweep.yaml keeps it); none when it has none.
    ``problems``: where to record what is wrong (None: raised here)."""
    from klsweep.grid.parse import read_section

    return read_section(grid_text, where, "labels", _parse, problems, "invalid labels")


def read_labels_file(path: str | Path, problems: list[Problem] | None = None) -> list[LabelRule]:
    """The ``labels:`` list of a YAML file (a grid file, or a file holding only ``labels:``)."""
    from klsweep.grid.parse import read_section

    example = "labels: [- {kl.beta: 0, label: no KL}]"
    return read_section(Path(path), str(path), "labels", _parse, problems, "invalid labels", example)


def _parse(value: Any, where: str, problems: list[Problem]) -> list[LabelRule]:
    return parse_labels(value, where, Schema(), problems)


def check_grid_values(
    rules: list[LabelRule], configs: list[dict[str, Any]], where: str, problems: list[Problem], skip: set[str]
) -> None:
    """Each rule against the grid's runs (``configs``: their nested configs): a rule that names no run (a value
    no run has at its key, or values no run has together) is a problem, with the values the grid gives.
    ``skip``: keys the command line set or removed (it may narrow the file's grid)."""
    from klsweep.grid.claims import comparable

    missing = object()
    for rule in rules:
        i = rule.index
        filters = {
            k: v
            for k, v in rule.filters.items()
            if k not in skip and not any(k.startswith(f"{s}.") for s in skip)
        }
        if not filters:
            continue
        values = {k: [lookup(c, k, missing) for c in configs] for k in filters}
        wanted = {k: {comparable(v) for v in vs} for k, vs in filters.items()}
        bad = False
        for k, vs in filters.items():
            present = {comparable(g): g for g in values[k] if g is not missing}
            for v in vs:
                if comparable(v) not in present:
                    bad = True
                    shown = ", ".join(sorted(map(repr, present.values()))) or "none: no run sets it"
                    problems.append(Problem(f"{where}[{i}].{k}", f"{v!r}: no run of this grid has it", shown))
        if not bad and not any(
            all(comparable(values[k][j]) in wanted[k] for k in filters) for j in range(len(configs))
        ):
            problems.append(
                Problem(
                    f"{where}[{i}]",
                    f"no run has these values together ({rule.label!r})",
                    "filters one configuration of the grid has",
                )  # fmt: skip
            )
