"""The files of a report, one writer per format (``_WRITERS``), each printing the views of ``tables.py``:

- ``md``: ``report.md`` (summary, every table with its caption, the figures, the runs);
- ``csv``: the numeric tables (``main``, ``baseline``, ``stability``, ``audit``, ``reference``, ``runs``);
- ``latex``: one booktabs ``table`` float per table (``<table>.tex``), ready to ``\\input``;
- ``html``: ``report.html``, the same sections as ``report.md``.
"""

from __future__ import annotations

import html
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import store
from klsweep.report.tables import (
    DASH,
    SHORT,
    TITLES,
    Report,
    _captions,
    _runs_view,
    _status_text,
    _view,
)

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("md", "csv", "latex", "html")


def _shown_path(path: Path) -> str:
    """The path relative to the working directory when it is below it (reports get committed and shared)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


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
    if report.set_aside:
        parts += ["## Set aside (unreadable files)", "", *(f"- {line}" for line in report.set_aside), ""]
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
