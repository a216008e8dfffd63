"""The figures of a report (matplotlib, Agg backend, imported when drawn), each a PNG with a vector PDF beside it.

``plot_curves``: ``curves.png``, reward, KL and entropy against step as small multiples; ``plot_eval``:
``eval_bars.png``, the in-domain and OOD averages per configuration with the step-0 baseline; ``draw_figures``:
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


def _unchanged(path: Path, digest: str) -> bool:
    """Whether the PNG and PDF beside ``path`` were drawn from inputs with this ``digest``."""
    stamp = _stamp(path)
    return (
        path.exists()
        and path.with_suffix(f".{VECTOR_FORMAT}").exists()
        and stamp.exists()
        and stamp.read_text().strip() == digest
    )


def _save(fig: Any, path: Path, digest: str) -> list[Path]:
    """The PNG and its vector copy (same name, ``.pdf``), then the hash of what they show."""
    import matplotlib.pyplot as plt

    vector = path.with_suffix(f".{VECTOR_FORMAT}")
    _stamp(path).unlink(missing_ok=True)
    try:
        _savefig(fig, path, dpi=100)
        with plt.rc_context({"pdf.fonttype": 42}):  # TrueType fonts: publishers refuse Type 3
            _savefig(fig, vector)
    finally:
        plt.close(fig)
    store.atomic_write_text(_stamp(path), digest + "\n")
    return [path, vector]


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


@_plain_text
def plot_curves(report: Report, metrics: pd.DataFrame, path: Path) -> list[Path]:
    """The training curves as small multiples (see the module docstring); PNG and PDF."""
    configs = _configs(report)
    shown = labelled_axes(report.runs, report.axes)
    vector = path.with_suffix(f".{VECTOR_FORMAT}")
    cols = [f"{name} smoothed" for name, _ in CURVES]
    digest = _digest(
        configs,
        report.runs[["run", "config"]],
        metrics[["run", "step", *cols]] if len(metrics) else None,
        shown,
        report.window,
    )
    if _unchanged(path, digest):
        return [path, vector]
    import numpy as np
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator as ticks

    facets = _facets(configs, shown)
    hues = [a for a in shown if a not in facets]
    panels = _panels(configs, facets) if facets else [()]
    styles = _styles(configs, hues)
    rows = len(panels)
    legend_rows = math.ceil(len(styles) / 4) + 1  # its title, then 4 entries a row
    top = 0.15 + LINE_IN * legend_rows + 0.3  # the legend, then the column titles
    left = 0.65 + (LINE_IN * len(facets) + 0.1 if facets else 0)  # y tick labels, the stacked facet values
    # Shared limits are set by hand below: matplotlib's sharex/sharey cost O(panels^2) per draw.
    if rows == 1:
        fig, axs = _figure(2, 2, figsize=(10, 6.4 + top), squeeze=False)
        _margins(fig, left, 0.2, top, 0.55, wgap=0.7, hgap=0.75)
        grid = [list(axs.flat)]
    else:
        fig, axs = _figure(rows, len(CURVES), figsize=(11, 1.9 * rows + top + 0.55), squeeze=False)
        _margins(fig, left, 0.2, top, 0.55, wgap=0.6, hgap=0.12)
        grid = [list(r) for r in axs]
    if not len(metrics):
        for ax in axs.flat:
            ax.text(0.5, 0.5, "no metrics logged yet", ha="center", va="center", transform=ax.transAxes)
        return _save(fig, path, digest)

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
    used: dict[tuple[Any, ...], None] = {}
    any_bands = False
    for r, (panel, axes_row) in enumerate(zip(panels, grid, strict=True)):
        members = configs[_in_panel(configs, facets, panel)] if facets else configs
        bands = len(members) <= MAX_BANDS
        any_bands |= bands
        keys = [_hue_key(row, hues) for row in members.to_dict("records")]
        lines = [
            (groups[c], styles[k][1]) for c, k in zip(members["config"], keys, strict=True) if c in groups
        ]
        used.update(dict.fromkeys(k for c, k in zip(members["config"], keys, strict=True) if c in groups))
        for c, (ax, (name, title)) in enumerate(zip(axes_row, CURVES, strict=True)):
            mean, lo, hi = series[name]
            # one artist per panel: many Line2D objects make every draw (PNG, PDF, layout) slow
            ax.add_collection(
                LineCollection(
                    [np.column_stack([steps[i], mean[i]]) for i, _ in lines],
                    colors=[style["color"] for _, style in lines],
                    linestyles=[style["ls"] for _, style in lines],
                    lw=1.3,
                )
            )
            if bands:
                for i, style in lines:
                    ax.fill_between(steps[i], lo[i], hi[i], color=style["color"], alpha=0.15, lw=0)
            ax.autoscale_view()
            ax.xaxis.set_major_locator(ticks(4))  # every tick is several artists: few ticks, cheap draws
            ax.yaxis.set_major_locator(ticks(4))
            ax.grid(alpha=0.3)
            if rows == 1 or r == 0:
                ax.set_title(title, fontsize=10)
            if (rows == 1 and c >= 2) or (rows > 1 and r == rows - 1):
                ax.set_xlabel("step")
            if c == 0 and facets:
                ax.set_ylabel(_key_text(facets, panel, "\n"), fontsize=9)
    _same_limits(grid, by_column=rows > 1, bottom_row_only=rows > 1)
    order = [k for k in styles if k in used]
    handles = [Line2D([], [], lw=1.6, **styles[k][1]) for k in order]
    fig.legend(
        handles,
        [styles[k][0] for k in order],
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.1 / fig.get_size_inches()[1]),
        ncols=max(1, min(len(order), 4)),
        fontsize=8,
        frameon=False,
        title=f"mean over seeds, smoothed over {report.window} steps"
        + (", band: min-max over seeds" if any_bands else ""),
        title_fontsize=8,
    )
    return _save(fig, path, digest)


def draw_figures(report: Report, metrics: pd.DataFrame, out: Path) -> Callable[[], list[Path]]:
    """Start drawing ``curves.png`` and ``eval_bars.png`` (and their PDFs) in ``out``, each in a forked process
    while this one goes on (writing the tables: ``background.in_background``); returns the call that waits for
    them and gives their paths. A figure whose process failed is drawn again in that call, where its error is
    raised; with one core both are drawn before this returns."""
    curves = in_background(plot_curves, report, metrics, out / "curves.png")
    bars = in_background(plot_eval, report, out / "eval_bars.png")
    return lambda: [*curves(), *bars()]


def _same_limits(grid: list[list[Any]], by_column: bool, bottom_row_only: bool) -> None:
    """One x range for every panel, one y range per column (``by_column``), step tick labels on the bottom row
    only (``bottom_row_only``)."""
    import numpy as np

    flat = [ax for row in grid for ax in row]
    x0 = min(ax.dataLim.x0 for ax in flat)
    x1 = max(ax.dataLim.x1 for ax in flat)
    columns = list(zip(*grid, strict=True)) if by_column else [[ax] for ax in flat]
    for column in columns:
        lims = [(ax.dataLim.y0, ax.dataLim.y1) for ax in column if np.isfinite(ax.dataLim.y0)]
        y0, y1 = (min(lo for lo, _ in lims), max(hi for _, hi in lims)) if lims else (0.0, 1.0)
        pad = 0.05 * (y1 - y0) or 0.05 * abs(y0) or 0.05
        for ax in column:
            ax.set_ylim(y0 - pad, y1 + pad)
    if np.isfinite(x0) and x1 > x0:
        pad = 0.03 * (x1 - x0)
        for ax in flat:
            ax.set_xlim(x0 - pad, x1 + pad)
    if bottom_row_only:
        for row in grid[:-1]:
            for ax in row:
                ax.tick_params(labelbottom=False)


@_plain_text
def plot_eval(report: Report, path: Path) -> list[Path]:
    """In-domain and OOD averages per configuration (mean ± t-based 95% CI over seeds); the step-0 baseline
    dashed."""
    import numpy as np

    df = report.main
    n = len(df)
    shown = labelled_axes(report.runs, report.axes)
    cfg_cols = [SHORT.get(a, a) for a in shown]
    ticks = (
        [" / ".join(visible(fmt_value(v)) for v in row) for row in df[cfg_cols].itertuples(index=False)]
        if cfg_cols
        else ["all runs"] * n
    )
    base = report.baseline
    cis = [f"{c} ci" for c in (ID_AVG, OOD_AVG)]
    digest = _digest(
        df[[*cfg_cols, ID_AVG, OOD_AVG, *cis]], base[["model.name", ID_AVG, OOD_AVG]], report.eval_hash
    )
    if _unchanged(path, digest):
        return [path, path.with_suffix(f".{VECTOR_FORMAT}")]
    rotate = n > 4
    width_in = min(max(6.0, 0.32 * n + 2), 30.0)
    tick_h = 0.065 * max(map(len, ticks), default=0) if rotate else 0.2
    legend_h = LINE_IN * math.ceil((2 + 2 * len(base)) / 2) + 0.2
    height = 4.0 + tick_h + 0.45 + legend_h
    fig, ax = _figure(figsize=(width_in, height))
    _margins(fig, 0.75, 0.2, legend_h, tick_h + 0.45, wgap=0, hgap=0)
    x = np.arange(n)
    width = 0.4
    for off, col, color in ((-width / 2, ID_AVG, "tab:blue"), (width / 2, OOD_AVG, "tab:orange")):
        ax.bar(
            x + off,
            df[col].fillna(0),
            width,
            yerr=df[f"{col} ci"].fillna(0),
            capsize=2 if n <= 40 else 0,
            color=color,
            label=f"{col} (mean ± 95% CI over seeds)",
        )
    for i, style in zip(range(len(base)), ("--", ":", "-.") * 10, strict=False):
        for col, color in ((ID_AVG, "tab:blue"), (OOD_AVG, "tab:orange")):
            if not math.isnan(base[col].iloc[i]):
                label = f"{col}, step 0 ({visible(base['model.name'].iloc[i])})"
                ax.axhline(base[col].iloc[i], color=color, ls=style, lw=1, label=label)
    missing = df[ID_AVG].isna() & df[OOD_AVG].isna()
    for i in np.flatnonzero(missing.to_numpy()):
        ax.text(x[i], 0, DASH, ha="center", va="bottom")
    ax.set_xticks(x, ticks, rotation=90 if rotate else 0, fontsize=7)
    ax.set_xlabel(" / ".join(cfg_cols) or "configuration")
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylabel(f"score (eval {report.eval_hash or 'none'})")
    ax.grid(axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.05 / height),
        ncols=2,
        fontsize=8,
        frameon=False,
    )
    return _save(fig, path, digest)
