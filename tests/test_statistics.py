"""The report's statistics (``klsweep/report/statistics.py``) and claims (``claims.py``): confidence intervals
that cover at their level, Welch's test against its formula, Fisher's power bound, and the claims table of
synthetic sweeps whose truth is known (``sweepgen``): a clear effect is supported, no effect is not, missing
data is inconclusive; the tables and files that show them."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from klsweep import report as rp
from klsweep.report import statistics as st

sys.path.insert(0, str(Path(__file__).parent))
import sweepgen  # noqa: E402


def test_t_interval_covers_the_true_mean_at_its_level():
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 10):
        hits = 0
        for _ in range(4000):
            x = rng.normal(1.5, 0.3, size=n)
            mean, half, k = st.t_interval(x)
            assert k == n and mean == pytest.approx(x.mean())
            hits += abs(mean - 1.5) <= half
        assert 0.935 < hits / 4000 < 0.965, (n, hits / 4000)  # 95% (binomial sd of the rate: 0.0034)
    # a normal-quantile interval (1.96 s / sqrt(n)) would cover ~70% at n = 2: the t quantile is what widens it
    assert st.t_interval([0.6, 0.8])[1] == pytest.approx(12.706 * 0.1, rel=1e-4)
    assert math.isnan(st.t_interval([0.5])[1]) and st.t_interval([math.nan, 0.5])[2] == 1


def test_welch_matches_its_formula_and_holds_its_level():
    a, b = [0.61, 0.72, 0.66, 0.70], [0.55, 0.52, 0.60]
    w = st.welch(a, b)
    va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 3
    assert w.t == pytest.approx((np.mean(a) - np.mean(b)) / math.sqrt(va + vb))
    assert w.df == pytest.approx((va + vb) ** 2 / (va**2 / 3 + vb**2 / 2))
    assert st.welch(a, b, alternative="greater").p == pytest.approx(w.p / 2)
    from scipy import stats  # scipy's own Welch test agrees

    assert w.p == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert math.isnan(st.welch([0.5], b).p) and math.isnan(st.welch([0.5, 0.5], [0.5, 0.5]).p)
    rng = np.random.default_rng(1)  # under the null, p < 0.05 about 5% of the time
    rejected = np.mean([st.welch(rng.normal(0, 1, 4), rng.normal(0, 3, 6)).p < 0.05 for _ in range(3000)])
    assert 0.035 < rejected < 0.065
    # power: an effect of 10 standard errors is found, one of 0.1 is not
    assert st.welch_power(w, 10 * w.se) > 0.99 and st.welch_power(w, 0.1 * w.se) < 0.1


def test_rate_test_knows_when_no_outcome_could_be_significant():
    p, best = st.rate_test(5, 5, 0, 5)
    assert p < 0.05 and best == p
    p, best = st.rate_test(3, 3, 0, 3)  # the most extreme outcome: p = 0.05, never below
    assert best == pytest.approx(0.05)
    assert math.isnan(st.rate_test(1, 2, 0, 0)[0])


def test_tost_equivalence():
    rng = np.random.default_rng(2)
    a, b = rng.normal(0.5, 0.01, 8), rng.normal(0.5, 0.01, 8)
    assert st.tost(a, b, 0.05)[0] < 0.05  # the same within a margin of 0.05
    assert st.tost(a, b + 0.2, 0.05)[0] > 0.5  # 0.2 apart: not equivalent


LAG0, LAG4 = {"offpolicy.lag": 0}, {"offpolicy.lag": 4}
STABLE = {"_noise": 0.02, "_kl": 0.002}


def _kl(est: str, plc: str, **truth) -> dict:
    return {"kl.estimator": est, "kl.placement": plc, "kl.beta": 0.1, **truth}


def clear_grid() -> list[dict]:
    """The paper's effects, strong: biased configurations (k1 in the loss, k3 in the reward or the loss: the
    audit's verdict with the default settings) collapse and score lower; k1 in the loss scores and drifts like
    no KL on-policy; off-policy, no KL collapses and drifts far more than the KL runs."""
    return [
        _kl("k1", "reward", _skill=0.8, **STABLE, **LAG0),
        _kl("k3", "both", _skill=0.7, **STABLE, **LAG0),
        _kl("k1", "loss", _skill=0.5, _noise=0.02, _kl=0.01, _collapse=True, **LAG0),
        _kl("k3", "loss", _skill=0.3, _collapse=True, **STABLE, **LAG0),
        _kl("k3", "reward", _skill=0.3, _collapse=True, **STABLE, **LAG0),
        {"kl.beta": 0.0, "_skill": 0.5, "_noise": 0.02, "_kl": 0.01, **LAG0},
        {"kl.beta": 0.0, "_skill": 0.5, "_collapse": True, "_noise": 0.02, "_kl": 0.02, **LAG4},
        _kl("k1", "reward", _skill=0.75, **STABLE, **LAG4),
        _kl("k3", "both", _skill=0.75, **STABLE, **LAG4),
    ]


def _claims(tmp_path: Path, grid: list[dict], seeds: int, seed: int = 0) -> tuple[rp.Report, dict[str, str]]:
    sweep = sweepgen.write_sweep(tmp_path / "sweep", grid, seeds=seeds, steps=40, seed=seed)
    rep = rp.build_report(sweep, tmp_path / "report", formats=("md", "csv", "html"))
    return rep, dict(zip(rep.claims["claim"], rep.claims["verdict"], strict=True))


def test_clear_effects_are_supported(tmp_path):
    rep, verdicts = _claims(tmp_path, clear_grid(), seeds=6)
    assert set(verdicts.values()) == {"supported"}, rep.claims[["claim", "verdict", "detail"]].to_string()
    claims = pd.read_csv(tmp_path / "report" / "claims.csv")
    assert {"claim", "verdict", "statistic", "p_value", "test", "n", "detail"} <= set(claims.columns)
    assert len(claims) == 7 and (claims["p_value"] < 0.05).all()
    a = claims.iloc[0]
    assert a["statistic"] == pytest.approx(1.0) and a["n"] == 30  # 18 biased runs all, 12 unbiased none
    for name in ("report.md", "report.html"):
        text = (tmp_path / "report" / name).read_text()
        assert "claims on this sweep" in text and "inconclusive = data missing" in text
        assert "(a) biased KL configurations are unstable on-policy" in text
    # comparisons: k3 in the loss (0.3) against no KL (0.5) at lag 0: a significant difference
    c = rep.comparisons
    k3 = c[(c["configuration"].str.contains("estimator=k3, placement=loss"))]
    row = k3[(k3["reference"] == "no KL") & (k3["metric"] == "in-domain avg")].iloc[0]
    assert row["difference"] == pytest.approx(-0.2, abs=0.05) and row["p"] < 1e-3 and row["n"] == 6
    assert "lag=0" in row["reference configuration"]  # the reference at the same lag
    # bold only where significant: the best in-domain mean (k1 in the reward, 0.8) beats 0.75 and the rest
    md = (tmp_path / "report" / "report.md").read_text()
    best = next(line for line in md.splitlines() if line.startswith("| k1 | reward |") and "| 0 |" in line)
    assert best.count("**") >= 2


def test_no_effect_is_not_supported(tmp_path):
    same = {"_skill": 0.5, "_noise": 0.05, "_kl": 0.005}
    grid = [
        {**_kl(e, p), **same, **lag}
        for e, p in (("k1", "reward"), ("k3", "both"), ("k1", "loss"), ("k3", "loss"))
        for lag in (LAG0, LAG4)
    ] + [{"kl.beta": 0.0, **same, **lag} for lag in (LAG0, LAG4)]
    # each claim is tested at 0.05: with no effect, about 1 claim in 20 reads "supported" by chance (generator
    # seed 0 draws one for (c) in-domain, p = 0.035); seed 1 draws none
    rep, verdicts = _claims(tmp_path, grid, seeds=5, seed=1)
    for claim, verdict in verdicts.items():
        if claim.startswith("(b)"):  # no effect: k1 in the loss is like no KL
            assert verdict in ("supported", "inconclusive"), claim
        else:
            assert verdict in ("not supported", "inconclusive"), (claim, rep.claims.to_string())
    assert verdicts["(a) biased KL configurations are unstable on-policy"] == "not supported"  # 0/10 vs 0/10
    md = (tmp_path / "report" / "report.md").read_text()
    assert "**" not in md.split("## Results")[1].split("## ")[0]  # the same skill everywhere: nothing bold


def test_verdicts_compared_with_a_committed_claims_file(tmp_path):
    """``klsweep study --expect-claims``: this sweep's verdicts against another claims.csv, claim by claim; the
    terminal shows the claims at 80 columns."""
    from rich.console import Console

    from klsweep.errors import UserError

    rep, verdicts = _claims(tmp_path, clear_grid(), seeds=6)
    committed = tmp_path / "report" / "claims.csv"
    assert rp.verdict_changes(rp.read_verdicts(committed), rep.claims) == []
    other = pd.read_csv(committed)
    other.loc[0, "verdict"] = "not supported"
    other = other.drop(index=6)  # a claim the other file lacks
    other.to_csv(tmp_path / "other.csv", index=False)
    changes = rp.verdict_changes(rp.read_verdicts(tmp_path / "other.csv"), rep.claims)
    first, last = rep.claims["claim"].iloc[0], rep.claims["claim"].iloc[6]
    assert changes == [(first, "not supported", "supported"), (last, "missing", "supported")]
    (tmp_path / "bad.csv").write_text("name,value\nx,1\n")
    with pytest.raises(UserError, match="not a readable claims.csv"):
        rp.read_verdicts(tmp_path / "bad.csv")
    console = Console(width=80, record=True)
    console.print(rp.rich_tables(rep, width=80)[-1])
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "(c) unbiased KL configurations are better" in text and "supported" in text and "<0.001" in text


def test_missing_data_is_inconclusive(tmp_path):
    # on-policy only, no no-KL run, one seed: nothing to compare with, no spread
    grid = [_kl("k1", "reward", **LAG0), _kl("k1", "loss", _collapse=True, **LAG0)]
    rep, verdicts = _claims(tmp_path, grid, seeds=1)
    assert set(verdicts.values()) == {"inconclusive"}, rep.claims.to_string()
    d = rep.claims.set_index("claim")["detail"]
    assert "a group has no finished run" in d["(d) KL stabilises off-policy training: fewer unstable runs"]
    # two seeds each: the rate test cannot reach p < 0.05 (2 vs 2 runs): underpowered, not "not supported"
    rep, verdicts = _claims(tmp_path / "two", grid, seeds=2)
    assert verdicts["(a) biased KL configurations are unstable on-policy"] == "inconclusive"
    assert "underpowered" in rep.claims.set_index("claim")["detail"].iloc[0]


def test_environment_section_counts_each_distinct_environment(tmp_path):
    """A sweep whose runs trained on two machines (and one run from before env.json) shows both, with counts."""
    from klsweep import environment, store

    sweep = sweepgen.write_sweep(tmp_path / "sweep", [_kl("k1", "reward"), _kl("k3", "loss")], seeds=2)
    env = {k: f"v-{k}" for k in environment.KEYS}
    runs = sorted(store.run_dirs(sweep))
    for i, run in enumerate(runs[:3]):
        store.write_json(run / store.ENV_FILE, env | {"hostname": "node-b" if i == 2 else "node-a"})
    rep = rp.build_report(sweep, tmp_path / "report", formats=("md", "csv", "html"))
    assert list(rep.environment["hostname"].fillna("-")) == ["node-a", "node-b", "-"]
    assert list(rep.environment["runs"]) == [2, 1, 1]
    md = (tmp_path / "report" / "report.md").read_text()
    section = md.split("## Environment")[1].split("## ")[0]
    assert "| hostname | node-a | node-b | — |" in section and "| runs | 2 | 1 | 1 |" in section
    assert "trained in 2 different environments" in md
    csv = pd.read_csv(tmp_path / "report" / "environment.csv")
    assert len(csv) == 3 and csv["runs"].sum() == 4
