"""Configuration names (``klsweep.report.names``) and the grid's ``labels:`` map (``klsweep.grid.labels``): the
paper's words ("k1 in reward", "k3 in both", "no KL"), the variants named readably, a user's label replacing
the words of the keys it selects, and every bad label refused up front, located, all at once (issue 43 item 6).
"""

from __future__ import annotations

import pandas as pd
import pytest
from gridfiles import write

from klsweep import grid
from klsweep.config import NO_KL
from klsweep.grid.labels import LabelRule, read_labels_file
from klsweep.report.names import Names

AXES = ["kl.estimator", "kl.placement", "kl.beta", "kl.importance", "offpolicy.lag"]


def _runs(rows: list[dict]) -> pd.DataFrame:
    """One run per configuration (``config`` 0..), the KL fields of a beta-0 run reading "no KL"."""
    out = []
    for i, r in enumerate(rows):
        row = {"run": f"r{i}", "config": i, "kl.estimator": "k3", "kl.placement": "loss", "kl.beta": 1.0,
               "kl.importance": "none", "offpolicy.lag": 0, **r}  # fmt: skip
        if row["kl.beta"] == 0:
            row.update({k: NO_KL for k in ("kl.estimator", "kl.placement", "kl.importance")})
        out.append(row)
    return pd.DataFrame(out)


TINY = [
    {"kl.estimator": "k1", "kl.placement": "reward"},
    {"kl.estimator": "k3", "kl.placement": "both"},
    {"kl.estimator": "k3", "kl.placement": "loss"},
    {"kl.estimator": "k1", "kl.placement": "reward", "kl.importance": "sequence", "offpolicy.lag": 16},
    {"kl.beta": 0.0},
    {"kl.beta": 0.0, "offpolicy.lag": 16},
]


def test_configurations_are_named_as_the_paper_does():
    """Legends read "estimator=k1, placement=loss, importance=none" (issue 43 item 6): now the paper's words,
    the defaults (lag 0, no importance weights) left out, beta left to the caption when every KL run has it."""
    names = Names(_runs(TINY), AXES)
    assert [names.name(c) for c in range(6)] == [
        "k1 in reward",
        "k3 in both",
        "k3 in loss",
        "k1 in reward, lag 16, sequence IS",
        "no KL",
        "no KL, lag 16",
    ]
    # a panel's row label writes the defaults; a legend without the faceted placement keeps the estimator
    assert (
        names.name(0, ["kl.placement", "offpolicy.lag"], explicit=True, force_kl=False)
        == "KL in reward, lag 0"
    )
    assert names.name(3, ["kl.estimator", "kl.importance"], force_kl=True) == "k1, sequence IS"
    assert names.name(4, ["kl.estimator", "kl.importance"], force_kl=True) == "no KL"
    # the estimator fixed: still "k1 in loss", not "KL in loss"; beta named when it varies between KL runs
    runs = _runs(
        [
            {"kl.estimator": "k1", "kl.placement": p, "kl.beta": b}
            for p in ("loss", "reward")
            for b in (0.1, 0.3)
        ]
    )
    assert [Names(runs, AXES).name(c) for c in range(4)] == [
        "k1 in loss, β=0.1", "k1 in loss, β=0.3", "k1 in reward, β=0.1", "k1 in reward, β=0.3",
    ]  # fmt: skip
    # only beta 0 against one KL configuration: the KL one by its estimator and placement
    assert [Names(_runs([{}, {"kl.beta": 0.0}]), ["kl.beta"]).name(c) for c in (0, 1)] == [
        "k3 in loss",
        "no KL",
    ]
    assert Names(_runs([{}]), []).name(0) == "all runs"


def test_label_rules_replace_the_words_of_the_keys_they_select():
    rules = [
        LabelRule({"kl.estimator": ["k1"], "kl.placement": ["reward"]}, "Schulman"),
        LabelRule({"kl.beta": [0]}, "GRPO"),
        LabelRule({"offpolicy.lag": [16]}, "async"),
    ]
    names = Names(_runs(TINY), AXES, rules)
    assert [names.name(c) for c in range(6)] == [
        "Schulman",
        "k3 in both",
        "k3 in loss",
        "Schulman, async, sequence IS",
        "GRPO",
        "GRPO, async",
    ]
    assert names.bound() == {"kl.estimator", "kl.placement"}  # a figure never splits them
    # two configurations a rule names alike are told apart by the report's own words
    same = Names(_runs(TINY), AXES, [LabelRule({"kl.estimator": ["k3"]}, "k3 (any)")])
    assert [same.unique(list(range(6)))[c] for c in (1, 2)] == [
        "k3 (any) (k3 in both)",
        "k3 (any) (k3 in loss)",
    ]


BASE = "name: l\nbase: {model: tiny, task: tiny}\ngrid: {seed: range(2), kl.estimator: [k1, k3], kl.beta: [0, 0.1]}\n"


def test_labels_are_validated_up_front(tmp_path):
    """A grid's ``labels:`` are checked with the rest of the grid (as ``claims:`` are): every bad entry
    located, all at once, exit 2 from the CLI; a good map plans."""
    good = (
        BASE + "labels:\n  - {kl.estimator: k1, kl.beta: 0.1, label: k1-R}\n  - {kl.beta: 0, label: GRPO}\n"
    )
    assert len(grid.load_plan(write(tmp_path, good), out=tmp_path / "r").runs) == 6
    bad = (
        BASE + "labels:\n"
        "  - {kl.estimatr: k1, label: a}\n"
        "  - {kl.estimator: k9, label: b}\n"
        "  - {kl.estimator: k1, label: ''}\n"
        "  - {label: no filter}\n"
        "  - {kl.beta: 0.2, label: c}\n"
        "  - {kl.estimator: k1, label: d}\n"
        "  - {kl.estimator: k1, label: e}\n"
        f"  - {{kl.estimator: k3, label: {'x' * 61}}}\n"
        "  - {unbiased: true, label: f}\n"
    )
    with pytest.raises(grid.UserError) as e:
        grid.load_plan(write(tmp_path, bad, "bad.yaml"), out=tmp_path / "r")
    text = " ".join(str(e.value).split())
    for where, what in [
        ("labels[0].kl.estimatr", "did you mean 'kl.estimator'"),
        ("labels[1].kl.estimator", "'k9' is not valid"),
        ("labels[2].label", "''"),
        ("labels[3]", "no filter"),
        ("labels[5]", "the same filters as labels[2]"),
        ("labels[7].label", "61 characters"),
        ("labels[8].unbiased", "unknown"),
        ("labels[4].kl.beta", "0.2: no run of this grid has it"),
    ]:
        assert where in text and what in text, (where, what, text)
    together = BASE + "labels:\n  - {kl.estimator: k3, kl.beta: 0, label: g}\n"
    with pytest.raises(grid.UserError, match="no run has these values together"):
        grid.load_plan(write(tmp_path, together, "t.yaml"), out=tmp_path / "r")


def test_a_labels_file_for_the_report(tmp_path):
    path = write(tmp_path, "labels:\n  - {kl.beta: 0, label: GRPO}\n", "labels.yaml")
    assert read_labels_file(path) == [LabelRule({"kl.beta": [0.0]}, "GRPO")]
    with pytest.raises(grid.UserError, match="no top-level `labels:` list"):
        read_labels_file(write(tmp_path, "claims: []\n", "x.yaml"))
