"""``eval_bars.png``: whether training helped, at a glance. Per configuration (one row each, named as the paper
does: ``names.py``) its score in domain and out of domain as a bar (the mean over seeds) with its 95% interval
(seeds x problems where every run has per-problem outcomes, else the t-interval over seeds; none from one
seed), beside the step-0 model's score (a dashed line) and its change from it (Δ, in a column right of each
panel; bold where its 95% interval excludes 0). A configuration's bar has its colour in the curves. Which eval:
the file's metadata and the report's caption. Layout: docs/REPORT.md, "Figures".
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.printable import visible
from klsweep.report import figstyle
from klsweep.report.data import D_ID, D_OOD, ID_AVG, OOD_AVG
from klsweep.report.figstyle import CHAR_IN, FONT, LINE_IN, plain_text
from klsweep.report.names import DASH, fmt_value
from klsweep.report.tables import CI_METHOD, interval_words

if TYPE_CHECKING:
    import pandas as pd

    from klsweep.report.tables import Report

PANELS = ((ID_AVG, D_ID, "in domain"), (OOD_AVG, D_OOD, "out of domain"))
MINUS = "\u2212"


def clipped_errors(mean: Any, half: Any) -> Any:
    """The (lower, upper) error-bar lengths of scores ``mean`` ± ``half``, clipped to [0, 1] (a score's CI
    past 0 or 1 says nothing); NaN as 0."""
    import numpy as np

    m = np.nan_to_num(np.asarray(mean, dtype=float))
    h = np.nan_to_num(np.asarray(half, dtype=float))
    return np.vstack([np.clip(np.minimum(h, m), 0, None), np.clip(np.minimum(h, 1 - m), 0, None)])


def interval_text(main: pd.DataFrame, columns: list[str]) -> str:
    """What the whiskers of ``columns`` are, in words (``tables.interval_words``, as the tables' captions say
    it; none where an interval is not informative): "" when none is drawn nor left out."""
    words = interval_words(main, columns, short=True)  # a legend's line: the report's caption has the rest
    return f"whisker: {words[4:]}" if words.startswith("the ") else words


def _panels(report: Report) -> list[tuple[str, str, str]]:
    """The panels with a score: in domain, out of domain (a sweep without OOD tasks has one)."""
    df = report.main
    shown = [p for p in PANELS if df[p[0]].notna().any() or report.baseline[p[0]].notna().any()]
    return shown or [PANELS[0]]


def _title(report: Report, column: str, words: str) -> str:
    tasks = report.in_domain if column == ID_AVG else report.ood
    if len(tasks) == 1:
        return f"{words}: {tasks[0]}"
    return f"{words}: {len(tasks)} tasks" if tasks else words


def _steps0(report: Report) -> list[float]:
    """Per configuration (row of ``main``), the index of the step-0 row of its model in ``baseline``."""
    base = report.baseline
    if not len(base):
        return []
    models = list(base["model.name"].map(fmt_value))
    if "model" in report.main and len(models) > 1:
        return [models.index(m) if m in models else 0 for m in report.main["model"].map(fmt_value)]
    return [0] * len(report.main)


def plot_eval(report: Report, path: Path, vector: bool = True) -> list[Path]:
    """The eval bars (see the module docstring); the PNG, and its PDF when ``vector``."""
    df = report.main
    style = figstyle.styles(report)
    labels = list(df["label"]) if "label" in df else ["all runs"] * len(df)
    colours = [style.by_name[style.of[c]]["color"] for c in _configs(report)]
    stats = [f"{c}{s}" for c, _, _ in PANELS for s in ("", " n", " ci")] + [
        f"{d}{s}" for _, d, _ in PANELS for s in ("", " ci")
    ]
    methods = [f"{c} {CI_METHOD}" for c, _, _ in PANELS if f"{c} {CI_METHOD}" in df]
    hashed = figstyle.digest(
        __file__,
        df[[c for c in stats + methods if c in df]],
        report.baseline[["model.name", ID_AVG, OOD_AVG]],
        labels,
        colours,
        report.eval_label,
        report.in_domain,
        report.ood,
    )
    if figstyle.unchanged(path, hashed, vector):  # before matplotlib is imported
        return figstyle.paths(path, vector)
    return _draw_eval(report, path, vector, hashed, labels, colours)


def _configs(report: Report) -> list[Any]:
    """The configuration of each row of ``main`` (its rows are in configuration order)."""
    return sorted(report.runs["config"].unique())


def _delta(value: float, half: float) -> tuple[str, bool]:
    """A Δ as printed ("+0.03", "−0.22"; "—" when none) and whether its interval excludes 0."""
    if value is None or value != value:
        return DASH, False
    text = f"{value:+.2f}".replace("-", MINUS) if round(value, 2) != 0 else "0.00"
    return text, bool(half == half and abs(value) > half)


def _legend(whiskers: str, seeds: list[int], baselines: int) -> list[str]:
    """The legend's entries: what a bar, a whisker and the dashed line are."""
    keys = ["bar: mean over " + (f"{seeds[0]} seed" + "s" * (seeds[0] > 1) if len(seeds) == 1 else "seeds")]
    if whiskers:
        keys.append(whiskers)
    if baselines:
        step0 = "step-0 model" + (" (each row its own)" if baselines > 1 else "")
        keys.append(f"{step0}; Δ: change from it" + (" (bold: its interval excludes 0)" if whiskers else ""))
    return keys


@plain_text
def _draw_eval(
    report: Report, path: Path, vector: bool, hashed: str, labels: list[str], colours: list[str]
) -> list[Path]:
    import numpy as np
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    df, base, n = report.main, report.baseline, len(report.main)
    panels = _panels(report)
    shown = [visible(t) for t in labels]
    left = 0.15 + CHAR_IN * max(map(len, shown), default=0)  # every label whole, however long
    delta_w = 0.5  # the Δ column right of each panel
    panel_w = min(2.3, (figstyle.WIDTH - left - 0.1 - len(panels) * (delta_w + 0.1)) / len(panels))
    panel_w = max(panel_w, 1.6)
    width = left + len(panels) * (panel_w + delta_w) + 0.1 * (len(panels) - 1) + 0.1
    whiskers = interval_text(df, [c for c, _, _ in panels])
    seeds = sorted({int(v) for c, _, _ in panels for v in df[f"{c} n"].dropna()} - {0})
    keys = _legend(whiskers, seeds, len(base))
    ncols = len(keys) if sum(len(k) + 6 for k in keys) * CHAR_IN < width - 0.3 else 1
    legend_h = LINE_IN * 1.35 * math.ceil(len(keys) / ncols) + 0.12
    top = legend_h + 0.32  # the legend, then the panels' titles
    bottom = 0.42  # tick labels and the x label
    height = 0.23 * n + 0.2 + top + bottom  # a row: one 8-pt label, one bar
    fig, axs = figstyle.figure(1, len(panels), figsize=(width, max(height, 1.8)), squeeze=False)
    figstyle.margins(fig, left, 0.1 + delta_w, top, bottom, wgap=delta_w + 0.1, hgap=0)
    y = np.arange(n)[::-1]  # the first configuration on top, as in the tables
    rows0 = _steps0(report)
    for k, (ax, (col, dcol, words)) in enumerate(zip(axs[0], panels, strict=True)):
        mean = df[col].to_numpy(dtype=float)
        half = df[f"{col} ci"].to_numpy(dtype=float)
        has = (df[f"{col} n"].fillna(0).to_numpy() >= 2) & np.isfinite(half)  # no interval from one seed
        ax.barh(y, np.nan_to_num(mean), 0.68, color=colours, edgecolor="none")
        if has.any():
            ax.errorbar(
                mean[has], y[has], xerr=clipped_errors(mean[has], half[has]), fmt="none", ecolor="black",
                elinewidth=0.9, capsize=1.8 if n <= 40 else 0, capthick=0.9,
            )  # fmt: skip
        for i in np.flatnonzero(np.isnan(mean)):
            ax.text(0.01, y[i], f"{DASH} not scored", ha="left", va="center", fontsize=FONT)
        if len(base):
            at = base[col].to_numpy(dtype=float)
            if len(set(rows0)) <= 1:
                if math.isfinite(at[0]):
                    ax.axvline(at[0], color="black", ls="--", lw=1.0, zorder=3)
            else:  # one step-0 model per row: a mark at its own
                for i, b in enumerate(rows0):
                    if math.isfinite(at[b]):
                        ax.plot([at[b]] * 2, [y[i] - 0.42, y[i] + 0.42], color="black", ls="--", lw=1.0)
        for i, (value, ci) in enumerate(zip(df[dcol], df[f"{dcol} ci"], strict=True)):
            text, clear = _delta(
                float(value) if value is not None else math.nan, float(ci) if ci is not None else math.nan
            )
            ax.text(1.0 + 0.06 / panel_w, y[i], text, transform=ax.get_yaxis_transform(), ha="left",
                    va="center", fontsize=FONT, fontweight="bold" if clear else "normal")  # fmt: skip
        ax.text(1.0 + 0.06 / panel_w, n - 0.4, "Δ", transform=ax.get_yaxis_transform(), ha="left",
                va="bottom", fontsize=FONT)  # fmt: skip
        ax.set_yticks(y, shown if k == 0 else [""] * n, fontsize=FONT)
        ax.tick_params(axis="y", length=0)
        ax.tick_params(axis="x", labelsize=FONT, length=2.5, pad=2)
        ax.set_ylim(-0.6, n - 0.4)
        ax.set_xlim(0, 1)
        ax.set_xticks([0, 0.25, 0.5, 0.75, 1], ["0", "0.25", "0.5", "0.75", "1"])
        ax.set_xlabel("score", fontsize=FONT)
        ax.set_title(visible(_title(report, col, words)), fontsize=FONT + 1, loc="left")
        ax.grid(axis="x", alpha=0.3, lw=0.5)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    handles: list[Any] = [Patch(color="#999999")]
    if whiskers:
        handles.append(Line2D([], [], color="black", lw=0.9, marker="|", ms=5))
    if len(base):
        handles.append(Line2D([], [], color="black", ls="--", lw=1.0))
    fig.legend(
        handles,
        keys,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.06 / fig.get_size_inches()[1]),
        ncols=ncols,
        fontsize=FONT,
        frameon=False,
        handlelength=1.8,
        columnspacing=1.2,
    )
    about = (
        f"klsweep report of {report.sweep_dir.name}: score per configuration in domain "
        f"({', '.join(report.in_domain) or DASH}) and out of domain ({', '.join(report.ood) or DASH}), "
        f"beside the step-0 model; eval: {report.eval_label}"
    )
    return figstyle.save(fig, path, hashed, vector, about=visible(about))
