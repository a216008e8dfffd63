"""The figures of a report (matplotlib, Agg backend, imported when drawn), from the runs frame and the tables:

- ``curves.png``: task reward, KL k1, KL k3 and entropy against step: per configuration the mean over seeds of
  the smoothed curve (``stability.py``) with a min-max band (up to 20 configurations; beyond, the lines alone);
- ``eval_bars.png``: the in-domain and OOD averages per configuration (mean ± std over seeds), the step-0
  baseline of each model as a dashed line.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.report.data import ID_AVG, OOD_AVG
from klsweep.report.stability import CURVES
from klsweep.report.tables import DASH, SHORT, Report, _fmt_value

if TYPE_CHECKING:
    import pandas as pd


def _figure(*args: Any, **kwargs: Any):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def _close(fig: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def _plot_curves(report: Report, metrics: pd.DataFrame, path: Path) -> list[Path]:
    """Reward, KL k1, KL k3, entropy against step: per configuration the mean over seeds of the smoothed
    curve, with a min-max band (up to 20 configurations; beyond, the lines alone)."""
    import numpy as np
    from matplotlib.collections import LineCollection

    labels = report.runs.drop_duplicates("config").set_index("config")["label"]
    n_configs = len(labels)
    legend_rows = math.ceil(n_configs / 3) if 0 < n_configs <= 20 and len(metrics) else 0
    height = 8 + 0.22 * legend_rows
    fig, axs = _figure(2, 2, figsize=(12, height), squeeze=False)
    if len(metrics):
        cfg = report.runs.set_index("run")["config"]
        m = metrics.assign(config=metrics["run"].map(cfg))
        cols = [f"{name} smoothed" for name, _ in CURVES]
        agg = m.groupby(["config", "step"], sort=True)[cols].agg(["mean", "min", "max"])
        config = agg.index.get_level_values("config").to_numpy()
        steps = agg.index.get_level_values("step").to_numpy()
        groups = np.split(np.arange(len(config)), np.flatnonzero(np.diff(config)) + 1)
        colors = _colors(n_configs)
        for ax, (name, title) in zip(axs.flat, CURVES, strict=True):
            mean, lo, hi = (agg[(f"{name} smoothed", stat)].to_numpy() for stat in ("mean", "min", "max"))
            if n_configs > 20:  # one artist for all lines: fast, and no band (it would hide the lines)
                lines = [np.column_stack([steps[i], mean[i]]) for i in groups]
                ax.add_collection(
                    LineCollection(lines, colors=[colors[config[i[0]]] for i in groups], lw=0.8)
                )
                ax.autoscale_view()
            for i in groups if n_configs <= 20 else ():
                c = config[i[0]]
                ax.plot(steps[i], mean[i], color=colors[c], lw=1.2, label=labels[c])
                ax.fill_between(steps[i], lo[i], hi[i], color=colors[c], alpha=0.2, lw=0)
            ax.set_title(f"{title} (smoothed, {report.window} steps)")
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    else:
        for ax in axs.flat:
            ax.text(0.5, 0.5, "no metrics logged yet", ha="center", va="center", transform=ax.transAxes)
    if legend_rows:
        handles, names = axs.flat[0].get_legend_handles_labels()
        fig.legend(handles, names, loc="lower center", ncol=min(3, n_configs), fontsize=8, frameon=False)
    elif n_configs > 20:
        fig.text(
            0.5, 0.01, f"{n_configs} configurations: no legend (see the tables)", ha="center", fontsize=8
        )
    # Fixed margins (inches) rather than tight_layout, which draws the figure once more.
    fig.subplots_adjust(
        left=0.06, right=0.98, top=1 - 0.4 / height, bottom=(0.6 + 0.22 * legend_rows) / height, hspace=0.3
    )
    fig.savefig(path, dpi=100)
    _close(fig)
    return [path]


def _colors(n: int) -> list[Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20" if n <= 20 else "viridis"]
    return [cmap(i if n <= 20 else i / max(n - 1, 1)) for i in range(n)]


def _plot_eval(report: Report, path: Path) -> list[Path]:
    """In-domain and OOD averages per configuration (mean ± std over seeds); the step-0 baseline dashed."""
    import numpy as np

    df = report.main
    n = len(df)
    cfg_cols = [SHORT.get(a, a) for a in report.axes]
    ticks = (
        [" / ".join(_fmt_value(v) for v in row) for row in df[cfg_cols].itertuples(index=False)]
        if cfg_cols
        else ["all runs"] * n
    )
    rotate = n > 4
    bottom = 0.6 + (0.065 * max(map(len, ticks), default=0) if rotate else 0.2)  # inches for the tick labels
    width_in, height = min(max(6.0, 0.3 * n + 2), 30.0), 4.5 + bottom
    fig, ax = _figure(figsize=(width_in, height))
    x = np.arange(n)
    width = 0.4
    for off, col, color in ((-width / 2, ID_AVG, "tab:blue"), (width / 2, OOD_AVG, "tab:orange")):
        ax.bar(
            x + off,
            df[col].fillna(0),
            width,
            yerr=df[f"{col} std"].fillna(0),
            capsize=2 if n <= 40 else 0,
            color=color,
            label=col,
        )
    base = report.baseline
    for i, style in zip(range(len(base)), ("--", ":", "-.") * 10, strict=False):
        for col, color in ((ID_AVG, "tab:blue"), (OOD_AVG, "tab:orange")):
            if not math.isnan(base[col].iloc[i]):
                label = f"{col}, step 0 ({base['model.name'].iloc[i]})"
                ax.axhline(base[col].iloc[i], color=color, ls=style, lw=1, label=label)
    missing = df[ID_AVG].isna() & df[OOD_AVG].isna()
    for i in np.flatnonzero(missing.to_numpy()):
        ax.text(x[i], 0, DASH, ha="center", va="bottom")
    ax.set_xticks(x, ticks, rotation=90 if rotate else 0, fontsize=7)
    ax.set_xlabel(" / ".join(cfg_cols) or "configuration")
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylabel(f"score (eval {report.eval_hash or 'none'})")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.subplots_adjust(
        left=0.8 / width_in, right=1 - 0.2 / width_in, top=1 - 0.3 / height, bottom=bottom / height
    )
    fig.savefig(path, dpi=100)
    _close(fig)
    return [path]
