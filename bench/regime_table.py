"""The exploration behind study v5 (sweeps/tiny-regime.yaml) as one table: for each setting and arm, whether the
training improves the model and its sampled reward.

    klsweep study sweeps/tiny-regime.yaml --out /tmp/regime
    python bench/regime_table.py /tmp/regime/tiny-regime

Reads the sweep's report (``report/main.csv``: each configuration's Δ from its step-0 model, its interval paired
on the problems; ``report/runs.csv``: each run's settings, peak KL and whether it collapsed) and each run's
``metrics.jsonl`` (the sampled task reward). Prints a Markdown table, one row per configuration: the setting
(the values of every config key that varies between the runs and is not the arm's: learning rate, batch,
warm-up, ...; "—" when only the arm varies), the arm (estimator and placement, with β and lag and any other KL
key where they vary: two arms are never printed alike), Δ in-domain and Δ OOD with their 95%
intervals, the sampled reward's mean over the first and the last 20 steps (the mean over seeds and its 95%
t-interval for the rise), the peak KL (k3) and the runs that collapsed. ``criterion``: yes where Δ in-domain's
interval lies above 0 and the sampled reward rose (the rise's interval above 0), each lower bound above 0 by
more than the printed rounding (``ROUNDING``: a bound of 3e-16 reads +0.00 and is not above 0): study v5's
condition for its no-KL and unbiased arms (issue 41).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klsweep import store  # noqa: E402
from klsweep.report.statistics import t_interval  # noqa: E402

WINDOW = 20  # steps averaged at each end of a run


def reward_ends(run: Path) -> tuple[float, float] | None:
    """A run's mean sampled task reward over its first and its last ``WINDOW`` logged steps."""
    if not (run / store.METRICS_FILE).is_file():
        return None
    rewards = [  # the rows every reader keeps (klsweep.store.metrics)
        r["reward_mean"] for r in store.read_metrics(run) if isinstance(r.get("reward_mean"), int | float)
    ]
    if len(rewards) < 2 * WINDOW:
        return None
    return sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW


ARM_KEYS = (
    "kl.estimator",
    "kl.placement",
    "kl.beta",
    "offpolicy.lag",
)  # the arm: what the KL term is, and its lag
ROUNDING = 0.005  # the tables print 2 decimals: a bound is above 0 when it reads above 0 (not 3e-16: "+0.00")
SHORT_KEYS = {
    "train.learning_rate": "lr",
    "train.prompts_per_step": "prompts",
    "train.group_size": "completions",
    "train.warmup_steps": "warm-up",
    "kl.beta": "β",
    "offpolicy.lag": "lag",
}


def varying(runs) -> list[str]:
    """The config keys (dotted columns of runs.csv) whose values differ between the runs, seeds excepted."""
    return [c for c in runs.columns if "." in c and c != "seed" and runs[c].astype(str).nunique() > 1]


def _value(key: str, value) -> str:
    if key == "train.learning_rate":
        return f"{float(value):.0e}"
    if isinstance(value, float) and value == value and value.is_integer():
        return str(int(value))
    return str(value)


def setting(row: dict, keys: list[str]) -> str:
    """The run's values of the varying keys that are not its arm's (``ARM_KEYS``): "lr 1e-04, completions 8";
    "—" when only the arm varies."""
    parts = [
        f"{SHORT_KEYS.get(k, k)} {_value(k, row[k])}"
        for k in keys
        if k not in ARM_KEYS and not k.startswith("kl.")
    ]
    return ", ".join(parts) or "—"


def arm(row: dict, keys: list[str]) -> str:
    """The KL arm in the paper's words, with its β and lag where they vary ("k1 in loss, β 3, lag 16"), and any
    other varying KL key; "no KL" (β 0) with its lag where that varies."""
    off = float(row["kl.beta"]) == 0
    text = "no KL" if off else f"{row['kl.estimator']} in {row['kl.placement']}"
    extra = [
        k for k in keys if k.startswith(("kl.", "offpolicy.")) and k not in ("kl.estimator", "kl.placement")
    ]
    for k in extra:
        if off and k.startswith("kl."):
            continue
        text += f", {SHORT_KEYS.get(k, k)} {_value(k, row[k])}"
    return text


def above_zero(low: float) -> bool:
    """Whether a lower bound lies above 0 by more than rounding (``ROUNDING``)."""
    return low == low and low >= ROUNDING


def interval(mean: float, low: float, high: float, ci: float) -> str:
    if not math.isnan(low):
        return f"{mean:+.2f} [{low:+.2f}, {high:+.2f}]"
    return f"{mean:+.2f} ± {ci:.2f}"


def main() -> None:
    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, help="the sweep's folder (its report/ written by klsweep report)")
    args = parser.parse_args()
    runs = pd.read_csv(args.sweep / "report" / "runs.csv")
    main_table = pd.read_csv(args.sweep / "report" / "main.csv").set_index("label")
    keys = varying(runs)
    rows = []
    for label, group in runs.groupby("label", sort=False):
        first = group.iloc[0].to_dict()
        ends = [e for e in (reward_ends(args.sweep / r) for r in group["run"]) if e is not None]
        rise = t_interval([b - a for a, b in ends])
        m = main_table.loc[label]
        d_id = (m["Δ in-domain"], m.get("Δ in-domain low", math.nan), m.get("Δ in-domain high", math.nan))
        d_ood = (m["Δ OOD"], m.get("Δ OOD low", math.nan), m.get("Δ OOD high", math.nan))
        helps = above_zero(d_id[1] if not math.isnan(d_id[1]) else d_id[0] - m["Δ in-domain ci"])
        rose = above_zero(rise[0] - rise[1]) if rise[2] >= 2 else False
        rows.append(
            (
                setting(first, keys),
                arm(first, keys),
                len(group),
                interval(*d_id, m["Δ in-domain ci"]),
                interval(*d_ood, m["Δ OOD ci"]),
                f"{sum(a for a, _ in ends) / len(ends):.2f} → {sum(b for _, b in ends) / len(ends):.2f}"
                if ends
                else "—",
                f"{group['peak KL k3'].mean():.2f}",
                f"{int(group['collapsed'].fillna(False).astype(bool).sum())}/{len(group)}",
                "yes" if helps and rose else "no",
            )
        )
    rows.sort(key=lambda r: (r[0], r[1]))
    head = (
        "setting (the varying keys)",
        "arm",
        "runs",
        "Δ in-domain [95% CI]",
        "Δ OOD [95% CI]",
        f"sampled reward, first → last {WINDOW} steps",
        "peak KL (k3)",
        "collapsed",
        "criterion",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")


if __name__ == "__main__":
    main()
