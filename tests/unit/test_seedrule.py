"""The seed rule (issue 49, item 2): its arithmetic on synthetic pilots whose spread is known, checked against
the power computed here directly (scipy), and its simulated false-positive rate."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from klsweep.errors import Problem
from klsweep.grid.claims import parse_claims
from klsweep.grid.schema import Schema
from klsweep.grid.seeds import SeedRule
from klsweep.report.seedrule import decide, rule_text, seeds_by_configuration

ALPHA = 0.05


def _claims(*raw: dict) -> list:
    problems: list[Problem] = []
    claims = parse_claims(list(raw), "claims", Schema(), problems)
    assert not problems, problems
    return claims


def _pilot(sides: dict[str, list[float]], collapsed: dict[str, list[bool]] | None = None) -> pd.DataFrame:
    """A pilot's runs table: per configuration (its ``offpolicy.lag`` names it here) its runs' reward drops."""
    rows = []
    for lag, values in sides.items():
        flags = (collapsed or {}).get(lag, [False] * len(values))
        for seed, (v, c) in enumerate(zip(values, flags, strict=True)):
            rows.append(
                {
                    "run": f"{lag}-{seed}",
                    "seed": seed,
                    "offpolicy.lag": int(lag),
                    "state": "done",
                    "collapsed": c,
                    "reward drop": v,
                }
            )
    return pd.DataFrame(rows)


WELCH = {
    "name": "a drops more than b",
    "metric": "reward_drop",
    "test": "welch",
    "direction": "greater",
    "effect": 0.1,
    "a": {"offpolicy.lag": 16},
    "b": {"offpolicy.lag": 0},
}

RATE = {k: v for k, v in WELCH.items() if k != "effect"} | {"metric": "unstable", "test": "fisher"}


def _welch_power(sd: float, n: int, effect: float, level: float) -> float:
    """One-sided Welch power, both sides of SD ``sd`` and ``n`` runs (equal: df = 2(n - 1))."""
    se = math.sqrt(2 * sd**2 / n)
    return float(stats.nct.sf(stats.t.ppf(1 - level, 2 * (n - 1)), 2 * (n - 1), effect / se))


def _decide(runs: pd.DataFrame, claims: list, pilot: int, budget: int, fresh: int = 0) -> list:
    configuration = {r: r.split("-")[0] for r in runs["run"]}
    budgets = dict.fromkeys(set(configuration.values()), budget)
    return decide(runs, None, claims, SeedRule(pilot, 0.9), configuration, budgets, fresh=fresh)


def test_welch_seeds_are_the_fewest_that_reach_the_target_at_the_effect() -> None:
    """Pilot SD 0.1 on both sides (3 seeds each: m - 0.1, m, m + 0.1), effect 0.1: the rule's N is the
    smallest n whose one-sided Welch power at 0.1 is >= 0.9, whatever the pilot's means (0.5 apart here)."""
    runs = _pilot({"16": [0.9, 1.0, 1.1], "0": [0.4, 0.5, 0.6]})
    (d,) = _decide(runs, _claims(WELCH), pilot=3, budget=40)
    want = next(n for n in range(3, 41) if _welch_power(0.1, n, 0.1, ALPHA) >= 0.9)
    assert 15 <= want <= 25
    assert d.decided and d.seeds == want == d.needed
    assert d.sd_a == pytest.approx(0.1) and d.sd_b == pytest.approx(0.1)
    assert d.power == pytest.approx(_welch_power(0.1, want, 0.1, ALPHA))
    assert _welch_power(0.1, want - 1, 0.1, ALPHA) < 0.9
    # the same pilot spread, the sides' means swapped: the same seeds (its variances decide, not its effect)
    swapped = _pilot({"16": [0.4, 0.5, 0.6], "0": [0.9, 1.0, 1.1]})
    assert _decide(swapped, _claims(WELCH), pilot=3, budget=40)[0].seeds == want
    # two claims: the level is ALPHA / 2, so more seeds
    other = dict(WELCH, name="b drops less", direction="less", a=WELCH["b"], b=WELCH["a"])
    both = _decide(runs, _claims(WELCH, other), pilot=3, budget=40)
    assert both[0].seeds == next(n for n in range(3, 41) if _welch_power(0.1, n, 0.1, ALPHA / 2) >= 0.9)


def test_a_claim_the_budget_cannot_power_reads_inconclusive_with_the_seeds_that_would_decide_it() -> None:
    runs = _pilot({"16": [0.9, 1.0, 1.1], "0": [0.4, 0.5, 0.6]})
    (d,) = _decide(runs, _claims(WELCH), pilot=3, budget=10)
    want = next(n for n in range(3, 41) if _welch_power(0.1, n, 0.1, ALPHA) >= 0.9)
    assert not d.decided and d.seeds == 10 and d.needed == want
    assert d.power == pytest.approx(_welch_power(0.1, 10, 0.1, ALPHA))
    assert f"inconclusive at 10 seeds; {want} would decide it" in d.line()
    # a pilot that already powers it: no seed added
    (tight,) = _decide(_pilot({"16": [0.99, 1.0, 1.01], "0": [0.49, 0.5, 0.51]}), _claims(WELCH), 3, 10)
    assert tight.decided and tight.seeds == 3


def test_a_collapse_does_not_inflate_the_spread_that_sizes_the_claim() -> None:
    """Issue 49: "power 0.05 at an effect of 0.1" beside an observed +0.27, the SD inflated by collapses. A
    collapsed pilot run is left out of the SD (counted as a rate): the seeds are those of the stable runs."""
    stable = _pilot({"16": [0.9, 1.0, 1.1], "0": [0.4, 0.5, 0.6]})
    with_collapse = _pilot(
        {"16": [0.9, 1.0, 1.1, 0.05], "0": [0.4, 0.5, 0.6, 0.99]},
        collapsed={"16": [False, False, False, True], "0": [False, False, False, True]},
    )
    (a,) = _decide(stable, _claims(WELCH), pilot=3, budget=40)
    (b,) = _decide(with_collapse, _claims(WELCH), pilot=4, budget=40)
    assert b.sd_a == pytest.approx(0.1) and b.sd_b == pytest.approx(0.1)  # the plain SDs: 0.46, 0.24
    assert b.seeds == a.seeds
    assert b.unstable == "a 1/4; b 1/4" and "unstable in the pilot: a 1/4; b 1/4" in b.line()


def test_fisher_seeds_from_b_s_pilot_rate_and_the_exact_power() -> None:
    from klsweep.report.statistics import rate_power

    claim = dict(RATE, name="a has more unstable runs")
    runs = _pilot({"16": [0.1, 0.2, 0.3], "0": [0.1, 0.2, 0.3]}, collapsed={"16": [True, False, False]})
    (d,) = _decide(runs, _claims(claim), pilot=3, budget=30, fresh=200)
    # b 0/3: a's rate at the default effect 0.5
    want = next(n for n in range(3, 31) if rate_power(n, n, 0.5, 0.0, ALPHA) >= 0.9)
    assert d.rate_b == 0 and d.effect == 0.5 and d.decided and d.seeds == want
    assert 0 <= d.false_positive <= 0.05  # Fisher's exact test is conservative


def test_equivalence_seeds_at_no_difference_within_the_margin() -> None:
    claim = {k: v for k, v in WELCH.items() if k != "effect"}
    claim |= {"name": "a is like b", "test": "tost", "direction": "equivalent", "margin": 0.1}
    runs = _pilot({"16": [0.9, 1.0, 1.1], "0": [0.4, 0.5, 0.6]})
    (d,) = _decide(runs, _claims(claim), pilot=3, budget=60)

    def power(n: int) -> float:  # P(|D| < margin - t se), D ~ se T
        se, df = math.sqrt(2 * 0.01 / n), 2 * (n - 1)
        return max(0.0, 2 * stats.t.cdf(0.1 / se - stats.t.ppf(1 - ALPHA, df), df) - 1)

    assert d.decided and d.seeds == next(n for n in range(3, 61) if power(n) >= 0.9)


def test_the_false_positive_rate_is_simulated_reproducibly_near_the_level() -> None:
    runs = _pilot({"16": [0.9, 1.0, 1.1], "0": [0.4, 0.5, 0.6]})
    (d,) = _decide(runs, _claims(WELCH), pilot=3, budget=12, fresh=400)
    assert 0.02 <= d.false_positive <= 0.09, d.false_positive
    assert _decide(runs, _claims(WELCH), pilot=3, budget=12, fresh=400)[0].false_positive == d.false_positive
    assert "false-positive rate" in d.line()
    assert "simulated studies with no true difference" in rule_text(SeedRule(3, 0.9))


def test_each_configuration_gets_the_most_any_of_its_claims_asks_never_past_its_budget() -> None:
    runs = _pilot({"16": [0.9, 1.0, 1.1], "0": [0.4, 0.5, 0.6], "8": [0.1, 0.2, 0.3]})
    loose = dict(WELCH, name="loose", effect=0.5)
    decisions = _decide(runs, _claims(WELCH, loose), pilot=3, budget=40)
    budgets = {"16": 40, "0": 12, "8": 40}
    seeds = seeds_by_configuration(decisions, budgets, pilot=3)
    assert decisions[1].seeds < decisions[0].seeds
    assert seeds == {"16": decisions[0].seeds, "0": 12, "8": 3}


def test_a_rate_already_at_its_bound_adds_no_seeds() -> None:
    """Fewer unstable runs than a side with none: no count can show it (the study's (d) at lag 16, 0/6 against
    0/6): the pilot is kept, and the line says why."""
    claim = dict(RATE, name="a has fewer unstable runs", direction="less")
    runs = _pilot({"16": [0.1, 0.2, 0.3], "0": [0.1, 0.2, 0.3]})
    (d,) = _decide(runs, _claims(claim), pilot=3, budget=30)
    assert (d.seeds, d.decided, d.needed) == (3, False, None)
    assert (
        "inconclusive at 3 seeds (the pilot kept): b's pilot rate is 0: no number of seeds can show a's less"
        in d.line()
    )


def test_the_decision_kept_beside_the_sweep_reads_back_and_a_bad_one_is_refused(tmp_path) -> None:
    """The study writes the decision (seeds.json) for the report; the report reads a file it did not write:
    anything but the rule's own shape (not JSON, another shape, a FIFO) is a ValueError (a warning there)."""
    import os
    import subprocess
    import sys

    from klsweep.report.seedrule import DECISION_FILE, read_decision, write_decision, write_table

    assert read_decision(tmp_path) is None
    runs = _pilot({"16": [0.9, 1.0, 1.1], "0": [0.4, 0.5, 0.6]})
    decisions = _decide(runs, _claims(WELCH), pilot=3, budget=10)
    write_decision(tmp_path, SeedRule(3, 0.9), decisions, {"16": 10, "0": 10}, name=lambda c: f"lag {c}")
    lines, rows = read_decision(tmp_path)
    assert lines == [rule_text(SeedRule(3, 0.9)), decisions[0].line()]
    assert rows[0]["seeds"] == 10 and rows[0]["configurations"] == ["lag 0", "lag 16"]
    (csv,) = write_table(tmp_path / "report", rows)
    assert pd.read_csv(csv)["configurations"].tolist() == ["lag 0; lag 16"]
    assert write_table(tmp_path / "report", None) == [] and not csv.exists()
    path = tmp_path / DECISION_FILE
    for text in ("{not json", '{"rule": 1, "lines": [], "claims": []}', '["a"]'):
        path.write_text(text)
        with pytest.raises(ValueError, match="seeds.json"):
            read_decision(tmp_path)
    path.write_bytes(b" " * (17 << 20))
    with pytest.raises(ValueError, match="larger than 16 MiB"):
        read_decision(tmp_path)
    path.unlink()
    os.mkfifo(path)  # a plain open would wait for a writer for ever: in a child, under a timeout
    probe = "from klsweep.report.seedrule import read_decision as r; import sys\n"
    probe += "try: r(sys.argv[1])\nexcept ValueError as e: print(e)"
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert "not readable" in out.stdout and "FIFO" in out.stdout, out
