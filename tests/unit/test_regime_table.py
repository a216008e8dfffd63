"""bench/regime_table.py (issue 49): the exploration's table works on any sweep whose keys vary (not only the
learning rate), names each arm with its β and lag where they vary (two arms never print alike), and counts a
bound as above 0 only when it is above 0 by more than the printed rounding."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

BENCH = Path(__file__).parents[2] / "bench"


def _sweep(tmp_path: Path) -> Path:
    """Four configurations at one learning rate (not a column of runs.csv): k1 in the loss at β 1 and β 3, no KL
    at lag 0 and 16; two runs each, the sampled reward rising from 0.2 to 0.4."""
    sweep = tmp_path / "regime"
    arms = [("k1", "loss", 1.0, 0, 0.05), ("k1", "loss", 3.0, 0, 3e-16), ("no KL", "no KL", 0.0, 0, 0.05),
            ("no KL", "no KL", 0.0, 16, -0.02)]  # fmt: skip
    runs, main = [], []
    for i, (est, plc, beta, lag, low) in enumerate(arms):
        label = f"config {i}"
        for seed in (0, 1):
            run = f"r{i}s{seed}"
            rows = [{"step": s, "reward_mean": 0.2 if s <= 20 else 0.4} for s in range(1, 61)]
            (sweep / run).mkdir(parents=True)
            (sweep / run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            runs.append({"run": run, "seed": seed, "kl.estimator": est, "kl.placement": plc, "kl.beta": beta,
                         "offpolicy.lag": lag, "train.group_size": 8, "peak KL k3": 0.1, "collapsed": False,
                         "label": label})  # fmt: skip
        main.append({"label": label, "Δ in-domain": 0.1, "Δ in-domain low": low, "Δ in-domain high": 0.2,
                     "Δ in-domain ci": 0.05, "Δ OOD": 0.0, "Δ OOD low": -0.1, "Δ OOD high": 0.1,
                     "Δ OOD ci": 0.1})  # fmt: skip
    (sweep / "report").mkdir()
    pd.DataFrame(runs).to_csv(sweep / "report" / "runs.csv", index=False)
    pd.DataFrame(main).to_csv(sweep / "report" / "main.csv", index=False)
    return sweep


def test_regime_table_on_a_beta_and_lag_sweep(tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(BENCH))
    import regime_table

    monkeypatch.setattr(sys, "argv", ["regime_table.py", str(_sweep(tmp_path))])
    regime_table.main()  # no KeyError: 'train.learning_rate' (it does not vary here)
    lines = capsys.readouterr().out.splitlines()[2:]
    cells = {line.split(" | ")[1]: [c.strip() for c in line.strip("| ").split(" | ")] for line in lines}
    assert set(cells) == {
        "k1 in loss, β 1, lag 0",
        "k1 in loss, β 3, lag 0",
        "no KL, lag 0",
        "no KL, lag 16",
    }, lines
    assert all(c[0] == "—" for c in cells.values())  # only the arms vary
    # Δ in-domain's lower bound: 0.05 is above 0; 3e-16 reads +0.00 and is not; -0.02 is not
    assert [cells[a][-1] for a in ("k1 in loss, β 1, lag 0", "k1 in loss, β 3, lag 0", "no KL, lag 0", "no KL, lag 16")] == [
        "yes", "no", "yes", "no",
    ]  # fmt: skip
