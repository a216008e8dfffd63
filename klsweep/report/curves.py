"""``curves.png``: the training curves of a report as small multiples: reward, KL k1 and k3 (log scale) and
entropy against step, one row of panels per value of the faceted axes (``figstyle.facets``), each panel with
its own y range, one line per configuration (the mean over seeds of the smoothed curve) with a min-max band
over its seeds where it has two or more, collapses and divergences marked. Layout: docs/REPORT.md, "Figures".
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.report import figstyle
from klsweep.report.figstyle import FONT, LINE_IN, WIDTH, in_panel, panels, plain_text
from klsweep.report.stability import CURVES
from klsweep.report.tables import visible

if TYPE_CHECKING:
    import pandas as pd

    from klsweep.report.tables import Report

MAX_BANDS = 6  # min-max bands drawn only in panels with at most this many lines
KL_CURVES = ("kl_k1", "kl_k3")  # drawn on a log scale: one spike must not flatten the rest
STOP_MARKERS = {"collapsed": "v", "diverged": "x"}
PAD = 0.04  # of a panel's range (in its scale), above and below its data


def plot_curves(report: Report, metrics: pd.DataFrame, path: Path, vector: bool = True) -> list[Path]:
    """The training curves as small multiples (see the module docstring); the PNG, and its PDF when
    ``vector``."""
    configs = figstyle.configs_frame(report)
    style = figstyle.styles(report)
    cols = [f"{name} smoothed" for name, _ in CURVES]
    marks = report.runs[["run", "config", "state", "collapse_step", "diverged_step"]]
    hashed = figstyle.digest(
        __file__,
        configs,
        marks.astype(str),
        metrics[["run", "step", *cols]] if len(metrics) else None,
        style,
        _row_labels(report, configs, style),
        report.window,
    )
    if figstyle.unchanged(
        path, hashed, vector
    ):  # before matplotlib is imported: a warm report never imports it
        return figstyle.paths(path, vector)
    return _draw_curves(report, metrics, path, vector, hashed, configs, style, cols)


def _row_labels(report: Report, configs: pd.DataFrame, style: figstyle.Styles) -> list[str]:
    """Each row's label: its facets' values in words, one a line ("KL in reward", "lag 16")."""
    if not style.facets:
        return [""]
    out = []
    for panel in panels(configs, style.facets):
        members = configs[in_panel(configs, style.facets, panel)]
        with_kl = members[members["kl_on"]]
        config = (with_kl if len(with_kl) else members)["config"].iloc[0]
        lines = [report.names.name(config, [a], explicit=True, force_kl=False) for a in style.facets]
        out.append("\n".join(dict.fromkeys(visible(line) for line in lines)))
    return out


def _seeds_with_metrics(report: Report, metrics: pd.DataFrame) -> dict[Any, int]:
    have = set(metrics["run"]) if len(metrics) else set()
    runs = report.runs[report.runs["run"].isin(have)]
    return runs.groupby("config")["run"].nunique().to_dict()


@plain_text
def _draw_curves(
    report: Report,
    metrics: pd.DataFrame,
    path: Path,
    vector: bool,
    hashed: str,
    configs: pd.DataFrame,
    style: figstyle.Styles,
    cols: list[str],
) -> list[Path]:
    import numpy as np
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    facets = style.facets
    rows_of = panels(configs, facets) if facets else [()]
    row_labels = _row_labels(report, configs, style)
    rows = len(rows_of)
    entries = len(style.by_name) + 2
    legend_cols = 3
    legend_rows = math.ceil(entries / legend_cols) + 1  # its title, then the entries (and the marks)
    # the legend, then the column titles: a KL column's on two lines (its name, then its scale), so that the
    # titles of neighbouring panels never run into each other
    top = 0.1 + LINE_IN * 1.25 * legend_rows + 0.3 + LINE_IN * 1.25
    label_lines = max((s.count("\n") + 1 for s in row_labels if s), default=0)
    left = 0.45 + (LINE_IN * 1.2 * label_lines + 0.1 if facets else 0)  # y tick labels, stacked facet values
    bottom = 0.45
    # Shared x limits are set by hand below: matplotlib's sharex costs O(panels^2) per draw.
    if rows == 1:
        fig, axs = figstyle.figure(2, 2, figsize=(WIDTH, 4.4 + top + bottom), squeeze=False)
        figstyle.margins(fig, left, 0.15, top, bottom, wgap=0.55, hgap=0.6)
        grid = [list(axs.flat)]
    else:
        fig, axs = figstyle.figure(
            rows, len(CURVES), figsize=(WIDTH, 1.45 * rows + top + bottom), squeeze=False
        )
        figstyle.margins(fig, left, 0.15, top, bottom, wgap=0.42, hgap=0.2)
        grid = [list(r) for r in axs]
    if not len(metrics):
        for ax in axs.flat:
            ax.text(0.5, 0.5, "no metrics logged yet", ha="center", va="center", transform=ax.transAxes,
                    fontsize=FONT)  # fmt: skip
        return figstyle.save(fig, path, hashed, vector)

    cfg = report.runs.set_index("run")["config"]
    m = metrics.assign(config=metrics["run"].map(cfg))
    agg = m.groupby(["config", "step"], sort=True)[cols].agg(["mean", "min", "max"])
    config = agg.index.get_level_values("config").to_numpy()
    steps = agg.index.get_level_values("step").to_numpy()
    groups = {config[i[0]]: i for i in np.split(np.arange(len(config)), np.flatnonzero(np.diff(config)) + 1)}
    series = {
        name: tuple(agg[(f"{name} smoothed", stat)].to_numpy() for stat in ("mean", "min", "max"))
        for name, _ in CURVES
    }
    seeds = _seeds_with_metrics(report, metrics)
    stops = _stops(report.runs)
    used: dict[str, None] = {}
    any_bands = False
    marked: set[str] = set()
    linear: dict[tuple[int, int], list[float | None]] = {}  # a KL title's panels: their symlog linear parts
    for r, (panel, axes_row) in enumerate(zip(rows_of, grid, strict=True)):
        members = configs[in_panel(configs, facets, panel)] if facets else configs
        lines = [(c, groups[c], style.by_name[style.of[c]]) for c in members["config"] if c in groups]
        used.update(dict.fromkeys(style.of[c] for c, _, _ in lines))
        # a band only from two seeds or more: one seed's min-max is its own line
        banded = [(c, i, s) for c, i, s in lines if seeds.get(c, 0) >= 2] if len(lines) <= MAX_BANDS else []
        any_bands |= bool(banded)
        for c, (ax, (name, title)) in enumerate(zip(axes_row, CURVES, strict=True)):
            mean, lo, hi = series[name]
            # one artist per panel: many Line2D objects make every draw (PNG, PDF, layout) slow
            ax.add_collection(
                LineCollection(
                    [np.column_stack([steps[i], mean[i]]) for _, i, _ in lines],
                    colors=[s["color"] for _, _, s in lines],
                    linestyles=[s["ls"] for _, _, s in lines],
                    lw=1.2,
                )
            )
            for _, i, s in banded:
                ax.fill_between(steps[i], lo[i], hi[i], color=s["color"], alpha=0.15, lw=0)
            if c == 0:  # the reward panel: where each run collapsed (v) or diverged (x), on its mean curve
                marked |= _mark_stops(ax, lines, stops, steps, mean)
            ax.autoscale_view()
            ax.xaxis.set_major_locator(
                MaxNLocator(4, integer=True)
            )  # steps are whole; few ticks, cheap draws
            if name in KL_CURVES:
                thresh = _log_scale(ax, mean, lo, hi, [i for _, i, _ in lines], [i for _, i, _ in banded])
                linear.setdefault((0, c), []).append(thresh)
            else:
                ax.yaxis.set_major_locator(MaxNLocator(4))
            ax.tick_params(labelsize=FONT, length=2.5, pad=2)
            ax.grid(alpha=0.3, lw=0.5)
            if rows == 1 or r == 0:
                ax.set_title(title, fontsize=FONT + 1)  # a KL panel's scale is named below, once drawn
            if (rows == 1 and c >= 2) or (rows > 1 and r == rows - 1):
                ax.set_xlabel("step", fontsize=FONT)
            if c == 0 and facets:
                ax.set_ylabel(row_labels[r], fontsize=FONT)
    for (r, c), thresholds in linear.items():
        ax = grid[r][c]
        ax.set_title(f"{ax.get_title()}\n{scale_name(thresholds)}", fontsize=FONT + 1)
    _same_steps(grid, bottom_row_only=rows > 1)
    order = [k for k in style.by_name if k in used]
    handles = [Line2D([], [], lw=1.6, **style.by_name[k]) for k in order]
    labels = [visible(k) for k in order]
    for kind in sorted(marked):
        handles.append(Line2D([], [], color="black", ls="", marker=STOP_MARKERS[kind], ms=5))
        labels.append(f"a run {kind} (its step)")
    fig.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.08 / fig.get_size_inches()[1]),
        ncols=max(1, min(len(handles), legend_cols)),
        fontsize=FONT,
        frameon=False,
        handlelength=2.4,
        columnspacing=1.2,
        title=f"mean over seeds, smoothed over {report.window} steps"
        + (", band: min-max over seeds" if any_bands else "")
        + ("; each panel its own y range" if rows > 1 else ""),
        title_fontsize=FONT,
    )
    return figstyle.save(fig, path, hashed, vector, about=_about(report, style))


def _about(report: Report, style: figstyle.Styles) -> str:
    rows = f"; rows: {', '.join(style.facets)}" if style.facets else ""
    return f"klsweep report of {report.sweep_dir.name}: training curves per configuration{rows}"


def _stops(runs: pd.DataFrame) -> dict[Any, list[tuple[str, float]]]:
    """Per configuration, (kind, step) of each run that collapsed (its reward, the collapse rule) or diverged
    otherwise (a non-finite loss: the step it stopped at)."""
    out: dict[Any, list[tuple[str, float]]] = {}
    for row in runs[["config", "state", "collapse_step", "diverged_step"]].itertuples(index=False):
        if row.collapse_step is not None and row.collapse_step == row.collapse_step:  # not None, not NaN
            out.setdefault(row.config, []).append(("collapsed", float(row.collapse_step)))
        elif (
            row.state == "diverged"
            and row.diverged_step is not None
            and row.diverged_step == row.diverged_step
        ):
            out.setdefault(row.config, []).append(("diverged", float(row.diverged_step)))
    return out


def _mark_stops(ax: Any, lines: list, stops: dict, steps: Any, mean: Any) -> set[str]:
    """The markers of ``_stops`` on the panel's mean curves, in each configuration's colour; the kinds drawn."""
    import numpy as np

    kinds = set()
    for config, i, style in lines:
        for kind, step in stops.get(config, []):
            xs, ys = steps[i], mean[i]
            if not len(xs):
                continue
            j = min(int(np.searchsorted(xs, step)), len(xs) - 1)
            ax.plot([xs[j]], [ys[j]], ls="", marker=STOP_MARKERS[kind], ms=6, mew=1.4, color=style["color"])
            kinds.add(kind)
    return kinds


def scale_name(thresholds: list[float | None]) -> str:
    """What a KL column's title says of its y scale (``_log_scale``'s linear parts, one per panel, None where
    nothing was drawn): ``log scale`` where every panel is on a log scale (no 0 tick), else ``symlog (linear
    within ±t)`` (``linear near 0`` where panels differ): a symlog axis has a 0 tick and negative values. Short:
    it is the second line of a narrow panel's title."""
    linear = sorted({t for t in thresholds if t})
    if not linear:
        return "log scale"
    return f"symlog (linear within ±{linear[0]:.2g})" if len(linear) == 1 else "symlog (linear near 0)"


def _log_scale(ax: Any, mean: Any, lo: Any, hi: Any, lines: list[Any], banded: list[Any]) -> float | None:
    """A KL panel on a log scale (symmetric log, linear near 0, where an estimate is not positive), its range
    from the values drawn (the lines, and the bands of ``banded``), padded by ``PAD`` of it in that scale: the
    axis starts at the data, no empty band below its lowest tick. Its symlog linear part's half-width (0.0: a
    log scale; None: nothing drawn)."""
    import numpy as np
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    drawn = [mean[i] for i in lines] + [a[i] for a in (lo, hi) for i in banded]
    values = np.concatenate(drawn) if drawn else np.array([])
    values = values[np.isfinite(values)]
    if not len(values):
        return None
    vmin, vmax = float(values.min()), float(values.max())
    if vmax == vmin:  # one value: a range around it, in its scale
        vmax = vmin * 2 if vmin > 0 else vmin + 1.0
    thresh = 0.0
    if vmin > 0:
        ax.set_yscale("log")
    else:
        top = max(abs(vmin), abs(vmax))
        positive = np.abs(values[values != 0])
        thresh = max(float(np.quantile(positive, 0.1)) if len(positive) else top, top * 1e-4)
        ax.set_yscale("symlog", linthresh=thresh)
    y0, y1 = _padded(ax, vmin, vmax)
    ax.set_ylim(y0, y1)
    if thresh:
        # 0 and a few 1-2-5 values past the linear part on each side: symlog's own ticks crowd around 0, and
        # decades alone leave a panel spanning less than one without a label
        up = _log_ticks(thresh, y1, most=2) if y1 > thresh else []
        down = [-v for v in _log_ticks(thresh, -y0, most=1)] if y0 < -thresh else []
        ticks = [*down, *([0.0] if y0 <= 0 <= y1 else []), *up]
    else:
        ticks = _log_ticks(y0, y1)
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())  # minor ticks on a log axis: many artists, slow draws
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # plain text: no mathtext here
    return thresh


def _padded(ax: Any, lo: float, hi: float) -> tuple[float, float]:
    """[lo, hi] widened by ``PAD`` of its span on each side, in the y axis's scale (log, symlog)."""
    transform = ax.yaxis.get_transform()
    t0, t1 = transform.transform([lo, hi])
    pad = PAD * (t1 - t0)
    y0, y1 = transform.inverted().transform([t0 - pad, t1 + pad])
    return float(y0), float(y1)


def _log_ticks(lo: float, hi: float, most: int = 4) -> list[float]:
    """At most ``most`` tick values of the 1-2-5 series within [lo, hi] (0 < lo < hi), spread over the range:
    decades where there are two or more, else 1-2-5 values."""
    if not 0 < lo < hi:
        return []
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    series = [(m, m * 10.0**e) for e in range(first, last + 1) for m in (1, 2, 5)]
    inside = [(m, v) for m, v in series if lo <= v <= hi]
    decades = [v for m, v in inside if m == 1]
    ticks = decades if len(decades) >= 2 else [v for _, v in inside]
    if not ticks:  # a range inside one 1-2-5 step: one value in its middle, rounded to a digit
        middle = float(f"{math.sqrt(lo * hi):.1g}")
        ticks = [middle] if lo <= middle <= hi else []
    step = max(1, math.ceil(len(ticks) / most))
    return ticks[::-1][::step][::-1]


def _same_steps(grid: list[list[Any]], bottom_row_only: bool) -> None:
    """One x range for every panel (each keeps its own y range: one run's spike must not flatten the others),
    step tick labels on the bottom row only (``bottom_row_only``)."""
    import numpy as np

    flat = [ax for row in grid for ax in row]
    x0 = min(ax.dataLim.x0 for ax in flat)
    x1 = max(ax.dataLim.x1 for ax in flat)
    for ax in flat:
        if ax.get_yscale() == "linear":
            y0, y1 = ax.dataLim.y0, ax.dataLim.y1
            if not (np.isfinite(y0) and np.isfinite(y1)):
                y0, y1 = 0.0, 1.0
            pad = 0.05 * (y1 - y0) or 0.05 * abs(y0) or 0.05
            ax.set_ylim(y0 - pad, y1 + pad)
    if np.isfinite(x0) and x1 > x0:
        pad = 0.03 * (x1 - x0)
        for ax in flat:
            ax.set_xlim(x0 - pad, x1 + pad)
    if bottom_row_only:
        for row in grid[:-1]:
            for ax in row:
                ax.tick_params(labelbottom=False)
