"""The figures of a report (matplotlib, Agg backend, imported when drawn): each a PNG, with a vector PDF beside
it when the report is asked for LaTeX or PDF (``vector``).

``plot_curves``: ``curves.png``, reward, KL (log scale) and entropy against step as small multiples, each panel
with its own y range, collapses marked; ``plot_eval``: ``eval_bars.png``, the in-domain and OOD averages per
configuration as horizontal bars, one group per configuration, with the step-0 baseline; ``draw_figures``:
both, each in a forked process while the report writes its tables. A figure is
drawn only when its inputs changed (a content hash of its data, ``.<name>.sha256``, beside it), with a fixed
layout computed from its size. Layout, facets and labels: docs/REPORT.md.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import store
from klsweep.report.background import in_background
from klsweep.report.data import ID_AVG, OOD_AVG
from klsweep.report.stability import CURVES
from klsweep.report.tables import (
    DASH,
    KL_KEYS,
    SHORT,
    Report,
    fmt_value,
    kl_on,
    labelled_axes,
    sort_key,
    visible,
)

if TYPE_CHECKING:
    import pandas as pd

FACET_ORDER = (
    "kl.placement",
    "offpolicy.lag",
    "model.name",
    "model.path",
    "task.name",
    "kl.level",
    "kl.importance",
    "offpolicy.num_iterations",
)
MAX_LINES = 4  # configurations in a panel before it is split by one more axis
MAX_PANELS = 12  # rows of panels at most
MAX_BANDS = 6  # min-max bands drawn only in panels with at most this many lines
VECTOR_FORMAT = "pdf"
LINE_IN = 0.16  # inches per line of 8-9 pt text (legend rows, stacked facet labels)


def _figure(*args: Any, **kwargs: Any):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def _plain_text(draw: Callable[..., list[Path]]) -> Callable[..., list[Path]]:
    """``draw`` with every label plain text, as written: no mathtext ("$\\boxed{2}$" in a value is not
    parsed, nor does it fail the figure), no LaTeX."""
    import functools

    @functools.wraps(draw)
    def plain(*args: Any, **kwargs: Any) -> list[Path]:
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
            return draw(*args, **kwargs)

    return plain


def _margins(
    fig: Any, left: float, right: float, top: float, bottom: float, wgap: float, hgap: float
) -> None:
    """A fixed layout (matplotlib's constrained layout costs a draw per save): margins and gaps in inches."""
    w, h = fig.get_size_inches()
    rows, cols = fig.axes[0].get_subplotspec().get_gridspec().get_geometry()
    axes_w = max((w - left - right - wgap * (cols - 1)) / cols, 0.1)
    axes_h = max((h - top - bottom - hgap * (rows - 1)) / rows, 0.1)
    fig.subplots_adjust(
        left=left / w,
        right=1 - right / w,
        top=1 - top / h,
        bottom=bottom / h,
        wspace=wgap / axes_w,
        hspace=hgap / axes_h,
    )


def _stamp(path: Path) -> Path:
    return path.with_name(f".{path.name}.sha256")


def _digest(*parts: Any) -> str:
    """A content hash of a figure's inputs (frames by value, the rest by repr) and of this module's code."""
    import pandas as pd

    h = hashlib.sha256(Path(__file__).read_bytes())
    for part in parts:
        if isinstance(part, pd.DataFrame):
            h.update(repr(list(part.columns)).encode())
            h.update(pd.util.hash_pandas_object(part, index=True).to_numpy().tobytes())
        else:
            h.update(repr(part).encode())
    return h.hexdigest()


def _paths(path: Path, vector: bool) -> list[Path]:
    return [path, path.with_suffix(f".{VECTOR_FORMAT}")] if vector else [path]


def _unchanged(path: Path, digest: str, vector: bool) -> bool:
    """Whether the PNG at ``path`` (and its PDF, when ``vector``) were drawn from inputs with this ``digest``."""
    stamp = _stamp(path)
    return (
        all(p.exists() for p in _paths(path, vector))
        and stamp.exists()
        and stamp.read_text().strip() == digest
    )


def _save(fig: Any, path: Path, digest: str, vector: bool) -> list[Path]:
    """The PNG and, when ``vector``, its vector copy (same name, ``.pdf``; else an older copy is removed, no
    longer what the PNG shows), then the hash of what they show."""
    import matplotlib.pyplot as plt

    pdf = path.with_suffix(f".{VECTOR_FORMAT}")
    _stamp(path).unlink(missing_ok=True)
    try:
        _savefig(fig, path, dpi=100)
        if vector:
            with plt.rc_context({"pdf.fonttype": 42}):  # TrueType fonts: publishers refuse Type 3
                _savefig(fig, pdf)
        else:
            pdf.unlink(missing_ok=True)
    finally:
        plt.close(fig)
    store.atomic_write_text(_stamp(path), digest + "\n")
    return _paths(path, vector)


def _savefig(fig: Any, path: Path, **kwargs: Any) -> None:
    """``fig.savefig(path)`` atomically: into a file of this process beside it, then renamed over it (a full
    disk leaves the old figure, never a truncated one)."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        fig.savefig(tmp, **kwargs)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _key_text(axes: list[str], values: tuple[Any, ...], sep: str = ", ") -> str:
    return sep.join(f"{SHORT.get(a, a)}={visible(fmt_value(v))}" for a, v in zip(axes, values, strict=True))


def _facets(configs: pd.DataFrame, shown: list[str]) -> list[str]:
    """The axes that split the curves into panels: from ``FACET_ORDER`` (then any other labelled axis but the
    estimator and beta, which are what a panel compares), one at a time while a panel holds more than
    ``MAX_LINES`` configurations and the panels stay at most ``MAX_PANELS``."""
    candidates = [a for a in FACET_ORDER if a in shown]
    candidates += [a for a in shown if a not in candidates and a not in ("kl.estimator", "kl.beta")]
    facets: list[str] = []
    while _lines_per_panel(configs, facets) > MAX_LINES:
        for a in candidates:
            if a not in facets and len(_panels(configs, [*facets, a])) <= MAX_PANELS:
                facets.append(a)
                break
        else:
            break
    return facets


def _panels(configs: pd.DataFrame, facets: list[str]) -> list[tuple[Any, ...]]:
    """The panels: every combination of faceted values that some configuration with KL has (a run without KL
    has "no KL" for the KL fields: it belongs to every panel of its other values)."""
    on = configs[configs["kl_on"]] if configs["kl_on"].any() else configs
    keys = {tuple(fmt_value(v) for v in row) for row in on[facets].itertuples(index=False)}
    return sorted(keys, key=sort_key)


def _in_panel(configs: pd.DataFrame, facets: list[str], panel: tuple[Any, ...]) -> pd.Series:
    import pandas as pd

    mask = pd.Series(True, index=configs.index)
    for a, v in zip(facets, panel, strict=True):
        values = configs[a].map(fmt_value)
        wildcard = ~configs["kl_on"] if a in KL_KEYS else False
        mask &= (values == v) | wildcard
    return mask


def _lines_per_panel(configs: pd.DataFrame, facets: list[str]) -> int:
    return max((int(_in_panel(configs, facets, p).sum()) for p in _panels(configs, facets)), default=0)


def _styles(configs: pd.DataFrame, hues: list[str]) -> dict[tuple[Any, ...], tuple[str, dict[str, Any]]]:
    """Per hue key (the configuration's values of the non-faceted axes; for a run without KL only the non-KL
    ones): its legend label and line style. Runs without KL: grey, dashed; the others: distinct colours."""
    import matplotlib

    keys: dict[tuple[Any, ...], bool] = {}
    for row in configs.to_dict("records"):
        keys[_hue_key(row, hues)] = bool(row["kl_on"])
    with_kl = sorted((k for k, on in keys.items() if on), key=sort_key)
    without = sorted((k for k, on in keys.items() if not on), key=sort_key)
    n = len(with_kl)
    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20" if n <= 20 else "viridis"]
    styles = {}
    for i, k in enumerate(with_kl):
        color = cmap(i if n <= 20 else i / max(n - 1, 1))
        styles[k] = (_key_text(hues, k) or "with KL", {"color": color, "ls": "-"})
    for i, k in enumerate(without):
        other = [(a, v) for a, v in zip(hues, k, strict=True) if a not in KL_KEYS]
        label = ", ".join(["no KL", *(_key_text([a], (v,)) for a, v in other)])
        styles[k] = (label, {"color": str(0.15 + 0.5 * i / max(len(without), 1)), "ls": "--"})
    return styles


def _hue_key(row: dict[str, Any], hues: list[str]) -> tuple[Any, ...]:
    return tuple("none" if (a in KL_KEYS and not row["kl_on"]) else fmt_value(row[a]) for a in hues)


def _configs(report: Report) -> pd.DataFrame:
    """One row per configuration: ``config``, its axis values and ``kl_on``."""
    first = report.runs.drop_duplicates("config").set_index("config", drop=False)
    configs = first[["config", *report.axes]].copy()
    configs["kl_on"] = kl_on(first)
    return configs


KL_CURVES = ("kl_k1", "kl_k3")  # drawn on a log scale: one spike must not flatten the rest
FONT = 9  # points: legend, tick and facet labels, readable at 100% zoom of the 100-dpi PNG


def plot_curves(report: Report, metrics: pd.DataFrame, path: Path, vector: bool = True) -> list[Path]:
    """The training curves as small multiples (see the module docstring); the PNG, and its PDF when
    ``vector``."""
    configs = _configs(report)
    shown = labelled_axes(report.runs, report.axes)
    cols = [f"{name} smoothed" for name, _ in CURVES]
    marks = report.runs[["run", "config", "state", "collapse_step", "diverged_step"]]
    digest = _digest(
        configs,
        marks.astype(str),
        metrics[["run", "step", *cols]] if len(metrics) else None,
        shown,
        report.window,
    )
    if _unchanged(path, digest, vector):  # before matplotlib is imported: a warm report never imports it
        return _paths(path, vector)
    return _draw_curves(report, metrics, path, vector, digest, configs, shown, cols)


@_plain_text
def _draw_curves(
    report: Report,
    metrics: pd.DataFrame,
    path: Path,
    vector: bool,
    digest: str,
    configs: pd.DataFrame,
    shown: list[str],
    cols: list[str],
) -> list[Path]:
    import numpy as np
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator as ticks

    facets = _facets(configs, shown)
    hues = [a for a in shown if a not in facets]
    panels = _panels(configs, facets) if facets else [()]
    styles = _styles(configs, hues)
    rows = len(panels)
    legend_rows = math.ceil((len(styles) + 2) / 3) + 1  # its title, then 3 entries a row (and the marks)
    top = 0.15 + 0.2 * legend_rows + 0.3  # the legend, then the column titles
    left = 0.75 + (0.19 * len(facets) + 0.1 if facets else 0)  # y tick labels, the stacked facet values
    # Shared x limits are set by hand below: matplotlib's sharex costs O(panels^2) per draw.
    if rows == 1:
        fig, axs = _figure(2, 2, figsize=(10, 6.4 + top), squeeze=False)
        _margins(fig, left, 0.2, top, 0.55, wgap=0.8, hgap=0.75)
        grid = [list(axs.flat)]
    else:
        fig, axs = _figure(rows, len(CURVES), figsize=(12, 2.0 * rows + top + 0.55), squeeze=False)
        _margins(fig, left, 0.2, top, 0.55, wgap=0.75, hgap=0.22)
        grid = [list(r) for r in axs]
    if not len(metrics):
        for ax in axs.flat:
            ax.text(0.5, 0.5, "no metrics logged yet", ha="center", va="center", transform=ax.transAxes)
        return _save(fig, path, digest, vector)

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
    stops = _stops(report.runs)
    used: dict[tuple[Any, ...], None] = {}
    any_bands = False
    marked: set[str] = set()
    for r, (panel, axes_row) in enumerate(zip(panels, grid, strict=True)):
        members = configs[_in_panel(configs, facets, panel)] if facets else configs
        bands = len(members) <= MAX_BANDS
        any_bands |= bands
        keys = [_hue_key(row, hues) for row in members.to_dict("records")]
        lines = [
            (c, groups[c], styles[k][1]) for c, k in zip(members["config"], keys, strict=True) if c in groups
        ]
        used.update(dict.fromkeys(k for c, k in zip(members["config"], keys, strict=True) if c in groups))
        for c, (ax, (name, title)) in enumerate(zip(axes_row, CURVES, strict=True)):
            mean, lo, hi = series[name]
            # one artist per panel: many Line2D objects make every draw (PNG, PDF, layout) slow
            ax.add_collection(
                LineCollection(
                    [np.column_stack([steps[i], mean[i]]) for _, i, _ in lines],
                    colors=[style["color"] for _, _, style in lines],
                    linestyles=[style["ls"] for _, _, style in lines],
                    lw=1.4,
                )
            )
            if bands:
                for _, i, style in lines:
                    ax.fill_between(steps[i], lo[i], hi[i], color=style["color"], alpha=0.15, lw=0)
            if c == 0:  # the reward panel: where each run collapsed (v) or diverged (x), on its mean curve
                marked |= _mark_stops(ax, lines, stops, steps, mean)
            ax.autoscale_view()
            ax.xaxis.set_major_locator(ticks(4))  # every tick is several artists: few ticks, cheap draws
            if name in KL_CURVES:
                _log_scale(ax, mean, lo, hi, [i for _, i, _ in lines])
            else:
                ax.yaxis.set_major_locator(ticks(4))
            ax.tick_params(labelsize=FONT - 1)
            ax.grid(alpha=0.3)
            if rows == 1 or r == 0:
                ax.set_title(title + (" (log scale)" if name in KL_CURVES else ""), fontsize=FONT + 1)
            if (rows == 1 and c >= 2) or (rows > 1 and r == rows - 1):
                ax.set_xlabel("step", fontsize=FONT)
            if c == 0 and facets:
                ax.set_ylabel(_key_text(facets, panel, "\n"), fontsize=FONT)
    _same_steps(grid, bottom_row_only=rows > 1)
    order = [k for k in styles if k in used]
    handles = [Line2D([], [], lw=2, **styles[k][1]) for k in order]
    labels = [styles[k][0] for k in order]
    for kind in sorted(marked):
        handles.append(Line2D([], [], color="black", ls="", marker=STOP_MARKERS[kind], ms=6))
        labels.append(f"a run {kind} (its step)")
    fig.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.1 / fig.get_size_inches()[1]),
        ncols=max(1, min(len(handles), 3)),
        fontsize=FONT,
        frameon=False,
        title=f"mean over seeds, smoothed over {report.window} steps"
        + (", band: min-max over seeds" if any_bands else "")
        + ("; each panel its own y range" if rows > 1 else ""),
        title_fontsize=FONT,
    )
    return _save(fig, path, digest, vector)


STOP_MARKERS = {"collapsed": "v", "diverged": "x"}


def _stops(runs: pd.DataFrame) -> dict[str, list[tuple[str, float]]]:
    """Per configuration, (kind, step) of each run that collapsed (its reward, the collapse rule) or diverged
    otherwise (a non-finite loss: the step it stopped at)."""
    out: dict[str, list[tuple[str, float]]] = {}
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
            ax.plot([xs[j]], [ys[j]], ls="", marker=STOP_MARKERS[kind], ms=7, mew=1.6, color=style["color"])
            kinds.add(kind)
    return kinds


def _log_scale(ax: Any, mean: Any, lo: Any, hi: Any, rows: list[Any]) -> None:
    """A KL panel on a log scale (symmetric log, linear near 0, where an estimate is not positive), its range
    from the panel's own values."""
    import numpy as np
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    values = np.concatenate([a[i] for a in (mean, lo, hi) for i in rows]) if rows else np.array([])
    values = values[np.isfinite(values)]
    if not len(values):
        return
    top = float(np.max(np.abs(values))) or 1.0
    if values.min() > 0:
        ax.set_yscale("log")
        y0, y1 = values.min() / 1.5, values.max() * 1.5
        ax.set_ylim(y0, y1)
        ax.yaxis.set_major_locator(FixedLocator(_log_ticks(y0, y1)))
    else:
        positive = np.abs(values[values != 0])
        thresh = max(float(np.quantile(positive, 0.1)) if len(positive) else top, top * 1e-4)
        ax.set_yscale("symlog", linthresh=thresh)
        y0, y1 = min(values.min() * 1.5, -thresh), values.max() * 1.5 if values.max() > 0 else thresh
        ax.set_ylim(y0, y1)
        # 0 and a few 1-2-5 values past the linear part on each side: symlog's own ticks crowd around 0, and
        # decades alone leave a panel spanning less than one without a label
        up = _log_ticks(thresh, y1)
        down = [-v for v in _log_ticks(thresh, -y0, most=1)] if y0 < -thresh else []
        ax.yaxis.set_major_locator(FixedLocator([*down, 0.0, *up]))
    ax.yaxis.set_minor_locator(NullLocator())  # minor ticks on a log axis: many artists, slow draws
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # plain text: no mathtext here


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


def draw_figures(
    report: Report, metrics: pd.DataFrame, out: Path, vector: bool = True
) -> Callable[[], list[Path]]:
    """Start drawing ``curves.png`` and ``eval_bars.png`` (and their PDFs when ``vector``) in ``out``, each in
    a forked process while this one goes on (writing the tables: ``background.in_background``); returns the
    call that waits for them and gives their paths. A figure whose process failed is drawn again in that
    call, where its error is raised; with one core both are drawn before this returns."""
    curves = in_background(plot_curves, report, metrics, out / "curves.png", vector)
    bars = in_background(plot_eval, report, out / "eval_bars.png", vector)
    return lambda: [*curves(), *bars()]


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


def clipped_errors(mean: Any, half: Any) -> Any:
    """The (lower, upper) error-bar lengths of scores ``mean`` ± ``half``, clipped to [0, 1] (a score's CI
    past 0 or 1 says nothing); NaN as 0."""
    import numpy as np

    m = np.nan_to_num(np.asarray(mean, dtype=float))
    h = np.nan_to_num(np.asarray(half, dtype=float))
    return np.vstack([np.clip(np.minimum(h, m), 0, None), np.clip(np.minimum(h, 1 - m), 0, None)])


def plot_eval(report: Report, path: Path, vector: bool = True) -> list[Path]:
    """In-domain and OOD averages per configuration (mean ± t-based 95% CI over seeds, clipped to [0, 1]) as
    horizontal bars, one group of two per configuration, labelled in words; the step-0 baseline dashed."""

    df = report.main
    n = len(df)
    shown = labelled_axes(report.runs, report.axes)
    cfg_cols = [SHORT.get(a, a) for a in shown]
    labels = (
        [_key_text(cfg_cols, tuple(row)) for row in df[cfg_cols].itertuples(index=False)]
        if cfg_cols
        else ["all runs"] * n
    )
    base = report.baseline
    cis = [f"{c} ci" for c in (ID_AVG, OOD_AVG)]
    digest = _digest(
        df[[*cfg_cols, ID_AVG, OOD_AVG, *cis]], base[["model.name", ID_AVG, OOD_AVG]], report.eval_label
    )
    if _unchanged(path, digest, vector):  # before matplotlib is imported
        return _paths(path, vector)
    return _draw_eval(report, path, vector, digest, labels)


@_plain_text
def _draw_eval(report: Report, path: Path, vector: bool, digest: str, labels: list[str]) -> list[Path]:
    import numpy as np

    df, base, n = report.main, report.baseline, len(report.main)
    char_in = 0.075  # inches per character of a 9-pt label
    left = 0.3 + char_in * max(map(len, labels), default=0)  # every label whole, however long
    legend_h = 0.22 * math.ceil((2 + 2 * len(base)) / 2) + 0.25
    bottom = 0.6  # the tick labels and the x label (which eval)
    per_config = 0.36  # two bars of 9-pt height and a gap
    height = per_config * n + 0.3 + legend_h + bottom
    fig, ax = _figure(figsize=(left + 6.0, max(height, 2.5)))
    _margins(fig, left, 0.3, legend_h, bottom, wgap=0, hgap=0)
    y = np.arange(n)[::-1]  # the first configuration on top, as in the tables
    bar = 0.38
    for off, col, color in ((bar / 2, ID_AVG, "tab:blue"), (-bar / 2, OOD_AVG, "tab:orange")):
        ax.barh(
            y + off,
            df[col].fillna(0),
            bar,
            xerr=clipped_errors(df[col], df[f"{col} ci"]),
            capsize=2 if n <= 40 else 0,
            color=color,
            label=f"{col} (mean ± 95% CI over seeds)",
        )
    for i, style in zip(range(len(base)), ("--", ":", "-.") * 10, strict=False):
        for col, color in ((ID_AVG, "tab:blue"), (OOD_AVG, "tab:orange")):
            if not math.isnan(base[col].iloc[i]):
                label = f"{col}, step 0 ({visible(base['model.name'].iloc[i])})"
                ax.axvline(base[col].iloc[i], color=color, ls=style, lw=1.2, label=label)
    missing = df[ID_AVG].isna() & df[OOD_AVG].isna()
    for i in np.flatnonzero(missing.to_numpy()):
        ax.text(0.01, y[i], f"{DASH} not scored", ha="left", va="center", fontsize=FONT)
    ax.set_yticks(y, labels, fontsize=FONT)
    ax.tick_params(axis="x", labelsize=FONT)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"score; {visible(report.eval_label)}", fontsize=FONT)
    ax.grid(axis="x", alpha=0.3)
    handles, hlabels = ax.get_legend_handles_labels()
    fig.legend(
        handles,
        hlabels,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.05 / fig.get_size_inches()[1]),
        ncols=2,
        fontsize=FONT,
        frameon=False,
    )
    return _save(fig, path, digest, vector)
