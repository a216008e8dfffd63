"""The files of a report, one writer per format (``WRITERS``), each printing the views of ``tables.py``:

- ``md``: ``report.md`` (summary, every table with its caption, the figures, the claims with their verdicts,
  the comparisons with the references, the environments, the runs);
- ``csv``: the numeric tables (``main``, ``baseline``, ``stability``, ``audit``, ``reference``, ``comparisons``,
  ``claims`` (claim, group, verdict, test, statistic, p_value, p_holm, n, detail; only with claims), ``environment``, ``runs``);
- ``latex``: one ``table`` float per table (``<table>.tex``), ready to ``\\input`` (``latex.py``);
- ``html``: ``report.html``, the same sections as ``report.md`` in one self-contained file: the figures
  embedded as data URIs, numbers right-aligned.
"""

from __future__ import annotations

import base64
import html
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import store
from klsweep.report.latex import latex_sections, write_latex
from klsweep.report.tables import (
    DASH,
    SHORT,
    TITLES,
    Report,
    captions,
    csv_cell,
    numeric_columns,
    runs_view,
    status_text,
    view,
    visible,
)

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("md", "csv", "latex", "html")
# sections of report.md and report.html after the paper tables (not LaTeX tables), and what each says when empty
EXTRA_SECTIONS = ("claims", "comparisons", "environment")
NONE = {
    "claims": "No claims: the grid file states none (`claims:`; or `klsweep report --claims FILE`).",
    "comparisons": "No configuration has a reference (no KL, k1 in the reward) sharing its other axes.",
    "environment": "No run recorded its environment (env.json) yet.",
}


def _shown_path(path: Path) -> str:
    """The path relative to the working directory when it is below it (reports get committed and shared)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _summary(report: Report) -> list[str]:
    r = report.runs
    path = visible(_shown_path(report.sweep_dir)).replace("`", "'")  # a code span: no backtick inside
    lines = [
        f"Sweep `{path}`: {len(r)} runs in {r['config'].nunique()} configurations "
        f"({status_text(list(r['state']))}).",
        "Configuration axes: "
        + (", ".join(f"{SHORT.get(a, a)} (`{a}`)" for a in report.axes) or "none")
        + ".",
        f"Eval hash: {report.eval_hash or 'none yet'}; in-domain: {visible(', '.join(report.in_domain)) or DASH}; "
        f"out of domain: {visible(', '.join(report.ood)) or DASH}.",
        f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} by `klsweep report`.",
    ]
    if len(report.claims):
        verdicts = report.claims["verdict"].value_counts()
        lines.insert(
            -1,
            "The study's claims on this sweep: "
            + ", ".join(
                f"{verdicts[v]} {v}" for v in ("supported", "not supported", "inconclusive") if v in verdicts
            )
            + f" (of {len(report.claims)} tests; section below).",
        )
    env = report.environment
    envs = int(env["python"].notna().sum()) if "python" in env else 0  # not counting runs with none recorded
    if envs > 1:
        lines.insert(-1, f"The runs trained in {envs} different environments (see Environment).")
    return lines


# what Markdown (CommonMark, GitHub's) would read as markup in a line of text or a table cell
_MD_MARKUP = re.compile(r"([\\`*_\[\]|#~!])")
# a list marker opening a line ("- x" in "- - x")
_MD_LIST = re.compile(r"^(\s*)(?:([-+])|(\d{1,9})([.)]))(?=\s|$)")


def md_text(text: Any) -> str:
    """``text`` as Markdown shows it as written: control characters visible (``visible``: a "\\r" cannot
    start a line of its own, "# heading" after it stays text), HTML escaped ("<script>" is text), Markdown's
    markup characters and a leading list marker backslash-escaped (no emphasis, link, image, code or cell
    break)."""
    s = html.escape(visible(text), quote=False)
    s = _MD_MARKUP.sub(r"\\\1", s)
    return _MD_LIST.sub(lambda m: f"{m[1]}\\{m[2]}" if m[2] else f"{m[1]}{m[3]}\\{m[4]}", s, count=1)


def _md_table(cells: pd.DataFrame, bold: pd.DataFrame) -> str:
    esc = md_text

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


def _write_md(report: Report) -> list[Path]:
    caps = captions(report)
    parts = [f"# klsweep report: {md_text(report.sweep_dir.name)}", "", *_summary(report), ""]
    for t in latex_sections(report):
        cells, bold = view(report, t)
        parts += [f"## {TITLES[t]}", "", caps[t], "", _md_table(cells, bold), ""]
        if t == "main":
            parts += ["![In-domain and OOD averages per configuration](eval_bars.png)", ""]
        if t == "stability":
            parts += ["![Training curves per configuration](curves.png)", ""]
    note = _reference_note(report)
    if note is not None:
        parts += [f"## {TITLES['reference']}", "", note, ""]
    for t in EXTRA_SECTIONS:
        cells, bold = view(report, t)
        parts += [f"## {TITLES[t]}", "", caps[t], "", _md_table(cells, bold) if len(cells) else NONE[t], ""]
    runs = runs_view(report)
    parts += ["## Runs", "", _md_table(runs, runs.map(lambda _: False)), ""]
    if report.missing:
        parts += ["## Not there yet", "", *(f"- {md_text(line)}" for line in report.missing), ""]
    if report.set_aside:
        parts += [
            "## Set aside (unreadable files)",
            "",
            *(f"- {md_text(line)}" for line in report.set_aside),
            "",
        ]
    path = report.out_dir / "report.md"
    store.atomic_write_text(path, "\n".join(parts))
    return [path]


def _write_csv(report: Report) -> list[Path]:
    paths = []
    for name in (
        "main",
        "baseline",
        "stability",
        "audit",
        "reference",
        "comparisons",
        "claims",
        "environment",
        "runs",
    ):
        path = report.out_dir / f"{name}.csv"
        if name == "claims" and not len(report.claims):  # no claims, no table (nor a stale one)
            path.unlink(missing_ok=True)
            continue
        table = getattr(report, name)
        store.atomic_write_text(path, table.map(csv_cell).rename(columns=csv_cell).to_csv(index=False))
        paths.append(path)
    return paths


def _reference_note(report: Report) -> str | None:
    """What the reference section says when no figure of the study matches this sweep (md and HTML)."""
    if len(report.reference):
        return None
    return "No configuration of this sweep matches a reported figure."


def _html_table(cells: pd.DataFrame, bold: pd.DataFrame | None = None) -> str:
    """A table's view as HTML: numeric columns right-aligned (class ``num``), best values bold."""
    numeric = numeric_columns(cells)
    marks = bold.to_numpy() if bold is not None else [[False] * len(cells.columns)] * len(cells)

    def cls(num: bool) -> str:
        return ' class="num"' if num else ""

    def th(c: Any, num: bool) -> str:
        return f"<th{cls(num)}>{html.escape(visible(c))}</th>"

    def td(v: Any, num: bool, b: bool) -> str:
        text = html.escape(DASH if v is None or (isinstance(v, float) and v != v) else visible(v))
        return f"<td{cls(num)}>{f'<b>{text}</b>' if b else text}</td>"

    rows = [
        "<tr>" + "".join(td(v, n, bool(b)) for v, n, b in zip(values, numeric, m, strict=True)) + "</tr>"
        for values, m in zip(cells.to_numpy(), marks, strict=True)
    ]
    head = "<tr>" + "".join(th(c, n) for c, n in zip(cells.columns, numeric, strict=True)) + "</tr>"
    return f'<table class="klsweep"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _data_uri(path: Path) -> str:
    """The image as a data URI (``report.html`` is one file, images included)."""
    mime = {".png": "image/png", ".svg": "image/svg+xml"}[path.suffix]
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def _write_html(report: Report) -> list[Path]:
    """``report.html``: the sections of ``report.md`` in one self-contained file (the figures embedded)."""
    caps = captions(report)
    body = [f"<h1>klsweep report: {html.escape(visible(report.sweep_dir.name))}</h1>"]
    body += [f"<p>{html.escape(line).replace('`', '')}</p>" for line in _summary(report)]
    figures = {
        "main": ("eval_bars.png", "In-domain and OOD averages per configuration"),
        "stability": ("curves.png", "Training curves per configuration"),
    }
    for t in latex_sections(report):
        body += [
            f"<h2>{html.escape(TITLES[t])}</h2>",
            f"<p>{html.escape(caps[t])}</p>",
            _html_table(*view(report, t)),
        ]
        if t in figures and (report.out_dir / figures[t][0]).is_file():
            name, alt = figures[t]
            body.append(f'<img src="{_data_uri(report.out_dir / name)}" alt="{html.escape(alt)}">')
    note = _reference_note(report)
    if note is not None:
        body += [f"<h2>{html.escape(TITLES['reference'])}</h2>", f"<p>{html.escape(note)}</p>"]
    for t in EXTRA_SECTIONS:
        cells, bold = view(report, t)
        body += [
            f"<h2>{html.escape(TITLES[t])}</h2>",
            f"<p>{html.escape(caps[t])}</p>",
            _html_table(cells, bold) if len(cells) else f"<p>{html.escape(NONE[t])}</p>",
        ]
    body += ["<h2>Runs</h2>", _html_table(runs_view(report))]
    doc = (
        '<!doctype html>\n<html><head><meta charset="utf-8"><title>klsweep report: '
        + html.escape(visible(report.sweep_dir.name))
        + "</title><style>"
        "body{font-family:sans-serif;max-width:1400px;margin:auto}"
        "table.klsweep{border-collapse:collapse;font-size:13px;margin-bottom:1em}"
        "table.klsweep td,table.klsweep th{border-bottom:1px solid #ccc;padding:2px 8px;text-align:left}"
        "table.klsweep .num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}"
        "img{max-width:100%}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    path = report.out_dir / "report.html"
    store.atomic_write_text(path, doc)
    return [path]


WRITERS = {"md": _write_md, "csv": _write_csv, "latex": write_latex, "html": _write_html}
