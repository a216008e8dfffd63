"""The runs a claim's side selects (``klsweep.report.claims``): right, and computed once per filter value for a
whole table, not once per claim and run (#32 D20: 2,000 claims x 200 runs took 47.6 s)."""

from __future__ import annotations

import itertools

import pandas as pd

from klsweep.report import claims as rc


def _runs(n: int) -> tuple[pd.DataFrame, dict[str, dict]]:
    runs = pd.DataFrame(
        {
            "run": [f"r{i}" for i in range(n)],
            "kl.estimator": [("k1", "k2", "k3")[i % 3] for i in range(n)],
            "kl.beta": [(0.0, 0.1, 1.0)[i % 3 != 0 and 1 + i % 2] for i in range(n)],
            "unbiased": [("yes", "no", "n/a")[i % 3] for i in range(n)],
        }
    )
    configs = {f"r{i}": {"offpolicy.lag": (0, 16)[i % 2]} for i in range(n)}  # a key runs.csv lacks
    return runs, configs


FILTERS = [
    {
        "kl.estimator": [e],
        "kl.beta": [b],
        "offpolicy.lag": [lag],
        **({"unbiased": [u]} if u is not None else {}),
    }
    for e, b, lag, u in itertools.product(["k1", "k3"], [0, 0.1, 1], [0, 16], [True, False, None])
]


def test_a_side_is_every_run_matching_each_filter():
    runs, configs = _runs(60)
    sides = rc._Sides(runs, configs)
    for f in FILTERS:
        got = list(sides.side(f)["run"])
        want = [
            r["run"]
            for _, r in runs.iterrows()
            if r["kl.estimator"] in f["kl.estimator"]
            and float(r["kl.beta"]) == float(f["kl.beta"][0])
            and configs[r["run"]]["offpolicy.lag"] == f["offpolicy.lag"][0]
            and ("unbiased" not in f or {"yes": True, "no": False}.get(r["unbiased"]) is f["unbiased"][0])
        ]
        assert got == want, f


def test_each_filter_value_is_compared_with_the_runs_once_whatever_the_claims(monkeypatch):
    runs, configs = _runs(200)
    calls = 0
    same = rc.matches

    def counting(v, wanted):
        nonlocal calls
        calls += 1
        return same(v, wanted)

    monkeypatch.setattr(rc, "matches", counting)
    distinct = {(k, repr(v)) for f in FILTERS for k, vs in f.items() for v in vs}
    for claims in (len(FILTERS), 2000):
        calls = 0
        sides = rc._Sides(runs, configs)
        for i in range(claims):
            sides.side(FILTERS[i % len(FILTERS)])
        assert calls == len(distinct) * len(runs), claims  # not claims x runs x filters
