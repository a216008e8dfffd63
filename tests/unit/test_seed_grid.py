"""A grid's seed rule (issue 49, item 2): its ``seeds:`` keys checked up front (exit 2, every problem with where
and what is allowed), and `klsweep plan` showing the study's pilot and budget (the grid's seeds, which
--max-runs counts)."""

from __future__ import annotations

import json
from pathlib import Path

from clitools import cli
from gridfiles import write

GRID = """\
name: seeded
base: {{model: tiny, task: tiny, eval: tiny, kl.beta: 1, kl.estimator: k1, kl.placement: loss}}
grid:
  - seed: range(6)
  - kl.beta: 0.0
    seed: range({b})
seeds: {seeds}
claims:
  - name: k1 in the loss drops its reward more than no KL
    metric: reward_drop
    test: welch
    direction: greater
{effect}    a: {{kl.beta: 1}}
    b: {{kl.beta: 0}}
"""


def _grid(tmp_path: Path, seeds: str = "{pilot: 3}", b: int = 4, effect: str = "    effect: 0.1\n") -> Path:
    return write(tmp_path, GRID.format(seeds=seeds, b=b, effect=effect))


def test_plan_shows_the_pilot_and_the_budget(tmp_path: Path, monkeypatch, capsys) -> None:
    grid = _grid(tmp_path)
    code, out, err = cli(["plan", grid, "--out", tmp_path / "res"], monkeypatch, capsys)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "seeds: klsweep study trains a pilot of 6 runs (the first 3 seeds of each configuration)" in flat
    assert "for power 0.9 at its effect, up to a budget of 10 runs (the grid's seeds" in flat
    code, out, _ = cli(["plan", grid, "--out", tmp_path / "res", "--json"], monkeypatch, capsys)
    seeds = json.loads(out)["seeds"]
    assert {k: seeds[k] for k in ("pilot", "target", "pilot_runs", "budget_runs")} == {
        "pilot": 3,
        "target": 0.9,
        "pilot_runs": 6,
        "budget_runs": 10,
    }
    # --max-runs counts the budget, not the pilot
    code, _, err = cli(["plan", grid, "--out", tmp_path / "res", "--max-runs", "9"], monkeypatch, capsys)
    assert code == 2 and "10 runs" in err
    # seeds chosen on the command line: the rule is off (no pilot of 3 from one seed)
    code, out, err = cli(["plan", grid, "seed=0", "--out", tmp_path / "res"], monkeypatch, capsys)
    assert code == 0, err
    assert "seeds: klsweep study" not in out


def test_a_bad_seed_rule_is_refused_with_every_problem(tmp_path: Path, monkeypatch, capsys) -> None:
    def refused(grid: Path) -> str:
        code, _, err = cli(["plan", grid, "--out", tmp_path / "res"], monkeypatch, capsys)
        assert code == 2, err
        return " ".join(err.split())

    flat = refused(_grid(tmp_path, seeds="{pilot: 1, target: 1.5, pilots: 3}"))
    assert "seeds.pilots: unknown seeds key 'pilots'; did you mean 'pilot'? (allowed: pilot, target)" in flat
    assert "seeds.pilot: 1 (allowed: an integer >= 2" in flat
    assert "seeds.target: 1.5 (allowed: a power in [0.5, 1)" in flat
    assert not (tmp_path / "res").exists()
    # a configuration with fewer seeds than the pilot, and a Welch claim with no effect to size it at
    flat = refused(_grid(tmp_path, b=2, effect=""))
    assert "seeds.pilot: 3, but 1 configuration of the grid has fewer seeds: kl.beta=0.0" in flat
    assert "(2 seeds)" in flat
    assert "claims (k1 in the loss drops its reward more than no KL).effect: missing: the seed rule" in flat
    assert "seeds: 3: must be a mapping (allowed: seeds: {pilot: 3, target: 0.9})" in refused(
        _grid(tmp_path, seeds="3")
    )
