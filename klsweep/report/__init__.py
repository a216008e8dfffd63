"""The report of a sweep: tables (pandas) and plots (matplotlib) a researcher can paste into a paper.

``klsweep report SWEEP [--format md|csv|latex|html ...] [--out DIR] [--eval-hash H]``, or from Python
``build_report(sweep_dir, out_dir=None, formats=("md",))``. It reads only the files of the results store
(``klsweep/store.py``, ``docs/DESIGN.md``): each run's ``config.yaml``, ``status.json``, ``metrics.jsonl`` and
``eval/<eval-hash>/<checkpoint>/results.json``, and the sweep's step-0 baseline. Written to ``<sweep>/report/``:

- the main table (``main``): one row per configuration (the dotted config keys whose values differ between
  runs, seeds excepted), each in-domain and out-of-domain metric as mean ± sample std over the seeds evaluated,
  ``n`` = seeds evaluated / seeds, the in-domain and OOD averages and their change (Δ) from the step-0 baseline
  of the same model; the best value of each column in bold. One eval hash for the whole table: the one given,
  else the newest present; per run its last evaluated checkpoint under that hash.
- the stability table (``stability``): final and peak task reward (``reward_mean``), peak KL (``kl_k1``,
  ``kl_k3``), lowest entropy, divergence and collapse, per configuration over seeds.
- the KL gradient audit (``audit``, from ``klsweep.audit``): for each KL configuration in the sweep, whether its
  expected gradient is the reverse-KL gradient.
- the study's reported numbers (``results/paper_reference.csv``) beside ours, where model, task and
  configuration match.
- plots: ``curves.png`` (reward, KL k1, KL k3, entropy against step: mean over seeds, min-max band) and
  ``eval_bars.png`` (in-domain and OOD averages per configuration, ± std).

Definitions (also printed in the report):

- Smoothing: every curve is a trailing mean over ``window`` steps (default 10).
- Collapse: after the peak of the smoothed reward, the smoothed reward falls below ``collapse_fraction``
  (default 0.5) times that peak and stays below it to the last logged step; the collapse step is the first
  step of that final stretch. A run whose peak smoothed reward is not positive cannot collapse.
- Divergence: what the trainer recorded: ``status.json`` state ``diverged`` with ``diverged_step`` and ``reason``.

Partial sweeps are reported as they stand: every run is counted in its configuration's status (pending,
running, done, failed, diverged, cancelled); a value with no data yet is "—".
"""

from __future__ import annotations

import html
import math
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import store
from klsweep.errors import Problem, UserError
from klsweep.report.audit_table import _audit_table
from klsweep.report.data import (
    D_ID,
    D_OOD,
    ID_AVG,
    OOD_AVG,
    _attach_deltas,
    _attach_evals,
    _baseline,
    _load_runs,
)
from klsweep.report.reference import REFERENCE_CSV, _reference_table
from klsweep.report.stability import (
    COLLAPSE_FRACTION,
    CURVES,
    WINDOW,
    _attach_stability,
    collapse_step,
    smooth,
)
from klsweep.report.tables import (
    DASH,
    SHORT,
    TITLES,
    Report,
    _captions,
    _fmt_value,
    _label_configs,
    _main_table,
    _runs_view,
    _stability_table,
    _status_text,
    _view,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Report", "build_report", "collapse_step", "rich_tables", "smooth"]

FORMATS = ("md", "csv", "latex", "html")


# ---------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------


def build_report(
    sweep_dir: str | Path,
    out_dir: str | Path | None = None,
    formats: Sequence[str] = ("md",),
    *,
    eval_hash: str | None = None,
    window: int = WINDOW,
    collapse_fraction: float = COLLAPSE_FRACTION,
    reference_csv: str | Path | None = REFERENCE_CSV,
) -> Report:
    """Read every run of the sweep, build the tables and plots, write them in ``formats`` to ``out_dir``
    (default ``<sweep>/report/``). UserError when the sweep does not exist or has no runs, a format or the
    eval hash is unknown."""
    sweep = store.resolve_sweep(sweep_dir)
    formats = _check_formats(formats)
    if window < 1 or not 0 < collapse_fraction < 1:
        raise UserError(
            [Problem("window", f"{window}", "an integer >= 1")] * (window < 1)
            + [Problem("collapse_fraction", f"{collapse_fraction}", "0 < x < 1")]
            * (not 0 < collapse_fraction < 1)
        )
    dirs = store.run_dirs(sweep)
    if not dirs:
        raise UserError(
            Problem(
                str(sweep),
                "has no runs (no sub-folder with a config.yaml)",
                "plan and launch it: `klsweep run`",
            ),
            title="nothing to report",
        )
    out = Path(out_dir) if out_dir is not None else sweep / store.REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)

    runs, configs, axes, metrics = _load_runs(dirs)
    chosen, in_domain, ood = _attach_evals(sweep, runs, configs, eval_hash)
    _attach_stability(runs, metrics, window, collapse_fraction)
    baseline = _baseline(sweep, chosen, in_domain, ood)
    _attach_deltas(runs, baseline)
    runs = _label_configs(runs, axes)
    report = Report(
        sweep_dir=sweep,
        out_dir=out,
        eval_hash=chosen,
        axes=axes,
        in_domain=in_domain,
        ood=ood,
        runs=runs,
        main=_main_table(runs, axes, in_domain, ood),
        baseline=baseline,
        stability=_stability_table(runs, axes),
        audit=_audit_table(runs),
        reference=_reference_table(runs, axes, in_domain + ood, reference_csv),
        window=window,
        collapse_fraction=collapse_fraction,
    )
    report.paths += _plot_curves(report, metrics, out / "curves.png")
    report.paths += _plot_eval(report, out / "eval_bars.png")
    for fmt in formats:
        report.paths += _WRITERS[fmt](report)
    return report


def _check_formats(formats: Sequence[str]) -> list[str]:
    wanted = [
        f.strip().lower()
        for item in ([formats] if isinstance(formats, str) else formats)
        for f in item.split(",")
    ]
    wanted = [f for f in wanted if f]
    bad = [f for f in wanted if f not in FORMATS]
    if bad or not wanted:
        raise UserError(
            [Problem("--format", f"unknown format {f!r}", ", ".join(FORMATS)) for f in bad]
            or [Problem("--format", "no format given", ", ".join(FORMATS))]
        )
    return list(dict.fromkeys(wanted))


# ---------------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------
# Stability
# ---------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------------------


def _shown_path(path: Path) -> str:
    """The path relative to the working directory when it is below it (reports get committed and shared)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------------------------------------
# Formatting: one view of each table per output format
# ---------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------------------------------------


def _summary(report: Report) -> list[str]:
    r = report.runs
    lines = [
        f"Sweep `{_shown_path(report.sweep_dir)}`: {len(r)} runs in {r['config'].nunique()} configurations "
        f"({_status_text(list(r['state']))}).",
        "Configuration axes: "
        + (", ".join(f"{SHORT.get(a, a)} (`{a}`)" for a in report.axes) or "none")
        + ".",
        f"Eval hash: {report.eval_hash or 'none yet'}; in-domain: {', '.join(report.in_domain) or DASH}; "
        f"out of domain: {', '.join(report.ood) or DASH}.",
        f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} by `klsweep report`.",
    ]
    return lines


def _md_table(cells: pd.DataFrame, bold: pd.DataFrame) -> str:
    def esc(s: Any) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = [
        "| " + " | ".join(esc(c) for c in cells.columns) + " |",
        "|" + "|".join("---" for _ in cells.columns) + "|",
    ]
    for values, marks in zip(cells.to_numpy(), bold.to_numpy(), strict=True):
        lines.append(
            "| "
            + " | ".join(f"**{esc(v)}**" if b else esc(v) for v, b in zip(values, marks, strict=True))
            + " |"
        )
    return "\n".join(lines)


def _sections(report: Report) -> list[str]:
    return ["main", "stability", "audit"] + (["reference"] if len(report.reference) else [])


def _write_md(report: Report) -> list[Path]:
    caps = _captions(report)
    parts = [f"# klsweep report: {report.sweep_dir.name}", "", *_summary(report), ""]
    for t in _sections(report):
        cells, bold = _view(report, t)
        parts += [f"## {TITLES[t]}", "", caps[t], "", _md_table(cells, bold), ""]
        if t == "main":
            parts += ["![In-domain and OOD averages per configuration](eval_bars.png)", ""]
        if t == "stability":
            parts += ["![Training curves per configuration](curves.png)", ""]
    if not len(report.reference):
        parts += [
            f"## {TITLES['reference']}",
            "",
            "No configuration of this sweep matches a reported figure.",
            "",
        ]
    runs = _runs_view(report)
    parts += ["## Runs", "", _md_table(runs, runs.map(lambda _: False)), ""]
    path = report.out_dir / "report.md"
    store.atomic_write_text(path, "\n".join(parts))
    return [path]


def _write_csv(report: Report) -> list[Path]:
    paths = []
    for name in ("main", "baseline", "stability", "audit", "reference", "runs"):
        path = report.out_dir / f"{name}.csv"
        store.atomic_write_text(path, getattr(report, name).to_csv(index=False))
        paths.append(path)
    return paths


def _styler(cells: pd.DataFrame, bold: pd.DataFrame, fmt: str):
    """A table's view (``_view``) as a pandas Styler for ``fmt`` (latex or html), best values bold."""
    if fmt == "latex":  # escape here (±, Δ, — included), so the Styler gets LaTeX already
        cells = cells.map(_tex_escape).rename(columns=_tex_escape)
        bold.columns = cells.columns
        styler = cells.style.hide(axis="index")
    else:
        styler = cells.style.hide(axis="index").format(escape="html").format_index(escape="html", axis=1)
    return styler.apply(lambda _: bold.replace({True: "font-weight: bold;", False: ""}), axis=None)


def _write_latex(report: Report) -> list[Path]:
    """One ``table`` float per table (booktabs rules: needs ``\\usepackage{booktabs}``), ready to \\input;
    columns of numbers right-aligned."""
    caps = _captions(report)
    paths = []
    for t in _sections(report):
        cells, bold = _view(report, t)
        numeric = [cells[c].map(lambda v: v == DASH or bool(_NUMBER.match(v))).all() for c in cells.columns]
        tex = _styler(cells, bold, "latex").to_latex(
            hrules=True,
            convert_css=True,
            environment="table",
            position_float="centering",
            caption=_tex_escape(f"{TITLES[t]}. {caps[t]}"),
            label=f"tab:klsweep-{report.sweep_dir.name}-{t}",
            column_format="".join("r" if x else "l" for x in numeric),
        )
        path = report.out_dir / f"{t}.tex"
        store.atomic_write_text(
            path, f"% klsweep report of {report.sweep_dir.name}: needs \\usepackage{{booktabs}}\n{tex}"
        )
        paths.append(path)
    return paths


def _tex_escape(s: str) -> str:
    table = {
        "\\": r"\textbackslash{}",
        "&": r"\&",
        "%": r"\%",
        "$": r"\$",
        "#": r"\#",
        "_": r"\_",
        "{": r"\{",
        "}": r"\}",
        "~": r"\textasciitilde{}",
        "^": r"\textasciicircum{}",
        "±": r"$\pm$",
        "Δ": r"$\Delta$",
        "—": "---",
        "–": "--",
    }
    s = "".join(table.get(ch, ch if ch.isascii() else "?") for ch in s)
    return _MINUS.sub("$-$", s)


_NUMBER = re.compile(r"^[+-]?\d")
_MINUS = re.compile(r"(?<![\w-])-(?=\d)")  # a leading minus sign of a number


def _write_html(report: Report) -> list[Path]:
    caps = _captions(report)
    body = [f"<h1>klsweep report: {html.escape(report.sweep_dir.name)}</h1>"]
    body += [f"<p>{html.escape(line).replace('`', '')}</p>" for line in _summary(report)]
    for t in _sections(report):
        body += [
            f"<h2>{html.escape(TITLES[t])}</h2>",
            f"<p>{html.escape(caps[t])}</p>",
            _styler(*_view(report, t), "html").set_table_attributes('class="klsweep"').to_html(),
        ]
        if t == "main":
            body.append('<img src="eval_bars.png" alt="In-domain and OOD averages per configuration">')
        if t == "stability":
            body.append('<img src="curves.png" alt="Training curves per configuration">')
    runs = _runs_view(report)
    body += ["<h2>Runs</h2>", runs.to_html(index=False, classes="klsweep", na_rep=DASH)]
    doc = (
        '<!doctype html>\n<html><head><meta charset="utf-8"><title>klsweep report</title><style>'
        "body{font-family:sans-serif;max-width:1400px;margin:auto}"
        "table.klsweep{border-collapse:collapse;font-size:13px}"
        "table.klsweep td,table.klsweep th{border-bottom:1px solid #ccc;padding:2px 8px}"
        "img{max-width:100%}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    path = report.out_dir / "report.html"
    store.atomic_write_text(path, doc)
    return [path]


_WRITERS = {"md": _write_md, "csv": _write_csv, "latex": _write_latex, "html": _write_html}


TERMINAL_COLUMNS = {
    "main": ("status", "n", ID_AVG, OOD_AVG, D_ID, D_OOD),  # status left-aligned, the rest right
    "stability": ("status", "final reward", "peak reward", "peak KL k3", "diverged", "collapsed"),
}


def rich_tables(report: Report) -> list[Any]:
    """The main and stability tables for the terminal, as rich Tables: the configuration columns and a few
    summary columns (every column is in the files); best values in bold."""
    from rich.markup import escape
    from rich.table import Table

    tables = []
    for t, summary in TERMINAL_COLUMNS.items():
        cells, bold = _view(report, t)
        cols = [SHORT.get(a, a) for a in report.axes] or ["configuration"]
        cols += [c for c in summary if c in cells]
        cells, bold = cells[cols], bold[cols]
        table = Table(title=f"{TITLES[t]}: {report.sweep_dir.name}", title_justify="left")
        for c in cols:
            table.add_column(str(c), overflow="fold", justify="right" if c in summary[1:] else "left")
        for values, marks in zip(cells.to_numpy(), bold.to_numpy(), strict=True):
            table.add_row(
                *(f"[bold]{escape(v)}[/bold]" if b else escape(v) for v, b in zip(values, marks, strict=True))
            )
        tables.append(table)
    return tables


# ---------------------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------------------


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
