r"""The LaTeX tables of a report: one ``<table>.tex`` per table, a ``table`` float ready to ``\input`` in a paper
(``\usepackage{booktabs,graphicx}``), that fits the text width and loses no character (``tex_escape``).
Which columns, alignment and escaping: docs/REPORT.md.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING

from klsweep import store
from klsweep.report.data import D_ID, D_OOD, ID_AVG, OOD_AVG, SE
from klsweep.report.names import fixed_text
from klsweep.report.statistics import LEVEL
from klsweep.report.tables import (
    DASH,
    SHORT,
    TITLES,
    Report,
    captions,
    interval_words,
    numeric_columns,
    status_text,
    view,
    visible,
)

if TYPE_CHECKING:
    import pandas as pd

PREAMBLE = r"\usepackage{booktabs,graphicx}"

_ASCII = {
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
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    '"': r"\texttt{\char34}",
    "`": r"\textasciigrave{}",
    "'": r"\textquotesingle{}",
    "\n": " ",
    "\t": " ",
    "\r": " ",
}
_SYMBOLS = {
    "±": r"$\pm$",
    "Δ": r"$\Delta$",
    "—": "---",
    "–": "--",
    "−": "$-$",
    "×": r"$\times$",
    "÷": r"$\div$",
    "·": r"$\cdot$",
    "≤": r"$\leq$",
    "≥": r"$\geq$",
    "≠": r"$\neq$",
    "≈": r"$\approx$",
    "∞": r"$\infty$",
    "→": r"$\rightarrow$",
    "←": r"$\leftarrow$",
    "↔": r"$\leftrightarrow$",
    "‖": r"$\Vert$",
    "√": r"$\surd$",
    "∈": r"$\in$",
    "µ": r"$\mu$",
    "…": r"\ldots{}",
    "“": "``",
    "”": "''",
    "‘": "`",
    "’": "'",
    "«": r"$\ll$",
    "»": r"$\gg$",
    "•": r"\textbullet{}",
    "°": r"\textdegree{}",
    "€": r"\texteuro{}",
    "£": r"\pounds{}",
    "§": r"\S{}",
    "¶": r"\P{}",
    "©": r"\textcopyright{}",
    "®": r"\textregistered{}",
    "™": r"\texttrademark{}",
    "¡": r"\textexclamdown{}",
    "¿": r"\textquestiondown{}",
    "\u00a0": "~",
    "ß": r"\ss{}",
    "ø": r"\o{}",
    "Ø": r"\O{}",
    "æ": r"\ae{}",
    "Æ": r"\AE{}",
    "œ": r"\oe{}",
    "Œ": r"\OE{}",
    "ł": r"\l{}",
    "Ł": r"\L{}",
    "ı": r"\i{}",
}
# combining marks (after NFD) -> the accent command that works in LaTeX's default (OT1) font encoding
_ACCENTS = {
    "\u0300": "`",
    "\u0301": "'",
    "\u0302": "^",
    "\u0303": "~",
    "\u0304": "=",
    "\u0306": "u",
    "\u0307": ".",
    "\u0308": '"',
    "\u030a": "r",
    "\u030b": "H",
    "\u030c": "v",
    "\u0327": "c",
    "\u0323": "d",
    "\u0331": "b",
}
_GREEK_CAPITALS = {  # the capitals that differ from Latin letters have math commands; the others are Latin
    "ALPHA": "A",
    "BETA": "B",
    "EPSILON": "E",
    "ZETA": "Z",
    "ETA": "H",
    "IOTA": "I",
    "KAPPA": "K",
    "MU": "M",
    "NU": "N",
    "OMICRON": "O",
    "RHO": "P",
    "TAU": "T",
    "CHI": "X",
}
_MINUS = re.compile(r"(?<![\w-])-(?=\d)")  # a leading minus sign of a number
_PM = re.compile(r"^(\S+) ± (\S+)(.*)$")  # "0.512 ± 0.034 (n=2)"


def _greek(ch: str) -> str | None:
    name = unicodedata.name(ch, "")
    m = re.fullmatch(r"GREEK (SMALL|CAPITAL) LETTER (\w+)", name)
    if not m:
        return None
    letter = {"LAMDA": "LAMBDA", "FINAL SIGMA": "SIGMA"}.get(m[2], m[2]).lower()
    if m[1] == "SMALL":
        return "o" if letter == "omicron" else f"$\\{letter}$"
    return _GREEK_CAPITALS.get(m[2]) or f"$\\{letter.capitalize()}$"


def _char(ch: str) -> str:
    if ch.isascii():
        return _ASCII.get(ch, ch)
    if ch in _SYMBOLS:
        return _SYMBOLS[ch]
    greek = _greek(ch)
    if greek is not None:
        return greek
    base, *marks = unicodedata.normalize("NFD", ch)
    if marks and base.isascii() and base.isalpha() and all(m in _ACCENTS for m in marks):
        out = (
            {"i": r"\i", "j": r"\j"}.get(base, base)
            if marks[0] not in ("\u0327", "\u0323", "\u0331")
            else base
        )
        for m in marks:
            out = f"\\{_ACCENTS[m]}{{{out}}}"
        return out
    return f"[U+{ord(ch):04X}]"  # no glyph for it in LaTeX's standard fonts: its code point, never a "?"


def tex_escape(s: str) -> str:
    """``s`` as LaTeX text (ASCII), every character kept (see the module docstring); a control character as its
    escape (``visible``: "\\x1b", never the raw byte, which TeX reads as an invalid character)."""
    out = []
    s = visible(s)
    for i, ch in enumerate(s):
        out.append(_char(ch))
        if ch == "-" and s[i + 1 : i + 2] == "-":  # "--" would become an en dash
            out.append("{}")
    return _MINUS.sub("$-$", "".join(out))


def _cell(value: str, bold: bool) -> str:
    """One cell: "0.512 ± 0.034 (n=2)" as the mean (bold when best) and a small "±0.034 (n=2)"."""
    m = _PM.match(value)
    if m is None:
        text = tex_escape(value)
        return f"\\textbf{{{text}}}" if bold else text
    mean = tex_escape(m[1])
    rest = tex_escape(f"±{m[2]}{m[3]}")
    return (f"\\textbf{{{mean}}}" if bold else mean) + f"{{\\scriptsize\\,{rest}}}"


def _paper_view(report: Report, table: str) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """The columns of ``view`` a paper table keeps (the configuration axes as one ``configuration`` column of
    names: ``names.py``), and the sentences of the method note for what it leaves out."""
    cells, bold = view(report, table)
    notes: list[str] = []
    drop: list[str] = []
    if table in ("main", "stability"):
        drop += [SHORT.get(a, a) for a in report.axes]
        cells, bold = (
            cells.drop(columns=CONFIGURATION, errors="ignore"),
            bold.drop(columns=CONFIGURATION, errors="ignore"),
        )
        names = list((report.main if table == "main" else report.stability)["label"])
        base = cells["status"] == "baseline"
        models = list(report.baseline["model.name"]) if len(report.baseline) > 1 else []
        step0 = [f"step-0 model ({visible(m)})" for m in models] or ["step-0 model"] * int(base.sum())
        cells.insert(0, CONFIGURATION, [*step0[: int(base.sum())], *names])
        bold.insert(0, CONFIGURATION, False)
        drop.append("status")
        notes.append(f"Runs: {status_text(list(report.runs['state']))}.")
    if table == "main":
        drop += [D_ID, D_OOD, f"{ID_AVG} {SE}", f"{OOD_AVG} {SE}"]
        notes.append("The mean per-run eval stderr of each configuration: report.md.")
        if len(report.in_domain) == 1:
            drop.append(ID_AVG)
        if len(report.ood) == 1:
            drop.append(OOD_AVG)
        steps = [s for s in report.main["eval step"] if s != DASH]
        if len(set(steps)) <= 1:
            drop.append("step")
            if steps:
                notes.append(f"Checkpoint evaluated: step {steps[0]}.")
    if table == "stability":
        drop.append("peak KL k1")
        for c in ("diverged", "collapsed"):  # counts; the steps and reasons are in report.md
            cells[c] = cells[c].str.replace(r" \(.*\)$", "", regex=True)
        notes.append("Steps and reasons of divergence and collapse: report.md.")
    if table == "audit":
        drop += ["configurations", "runs"]
    keep = [c for c in cells.columns if c not in drop]
    return cells[keep], bold[keep], notes


CONFIGURATION = "configuration"


def paper_caption(report: Report, table: str) -> str:
    """A paper table's caption: its title and one sentence of what it shows (the method: ``method_note``)."""
    fixed = fixed_text(report.runs, report.axes) if report.axes else ""
    kept = f" ({fixed})" if fixed else ""
    interval = f"mean ± half-width of the t-based {LEVEL:.0%} interval over seeds"
    scores = interval_words(report.main, [*report.in_domain, ID_AVG, *report.ood, OOD_AVG], short=True)
    sentences = {
        "main": f"each configuration's score in domain and out of domain at its last checkpoint{kept}, mean ± "
        f"half the width of {scores or 'its interval'} (n: seeds evaluated / seeds), below the step-0 model's",
        "stability": f"each configuration's final and peak task reward, reward drop, peak KL and lowest entropy{kept}, "
        f"{interval}, and how many of its runs diverged or collapsed",
        "audit": "the expected KL update of each configuration's trainer against the gradient of the reverse and "
        "forward KL, by exact enumeration on a tabular policy (unbiased, in bold: scale 1, cosine 1)",
        "reference": "the study's reported figures (arXiv 2512.21852) beside ours for the configurations that "
        f"match ({interval})",
    }
    return f"{TITLES[table]}: {sentences[table]}."


def method_note(report: Report, table: str, notes: list[str]) -> list[str]:
    """The method a paper table's numbers come from (the report's full caption and what the table leaves out),
    as comment lines of its ``.tex`` file: for the paper's text or a table note, not the caption."""
    import textwrap

    text = " ".join([captions(report)[table], *notes])
    lines = textwrap.wrap(tex_escape(text), 100, break_long_words=False, break_on_hyphens=False)
    return ["% Method (for your text or a table note; docs/REPORT.md):", *(f"%   {line}" for line in lines)]


def _groups(report: Report, table: str, columns: list[str]) -> list[tuple[str, int, int]]:
    """Spanning headers (label, first column, last column): in-domain and out-of-domain scores."""
    if table != "main":
        return []
    out = []
    for label, names in (
        ("in-domain", [*report.in_domain, ID_AVG]),
        ("out of domain", [*report.ood, OOD_AVG]),
    ):
        idx = [i for i, c in enumerate(columns) if c in names]
        if idx:
            out.append((label, min(idx), max(idx)))
    return out


def _tabular(cells: pd.DataFrame, bold: pd.DataFrame, groups: list[tuple[str, int, int]]) -> list[str]:
    columns = list(cells.columns)
    numeric = numeric_columns(cells)
    lines = [f"\\begin{{tabular}}{{{''.join('r' if n else 'l' for n in numeric)}}}", r"\toprule"]
    if groups:
        row, rules, col = [], [], 0
        for label, first, last in groups:
            row += [""] * (first - col) + [f"\\multicolumn{{{last - first + 1}}}{{c}}{{{tex_escape(label)}}}"]
            rules.append(f"\\cmidrule(lr){{{first + 1}-{last + 1}}}")
            col = last + 1
        row += [""] * (len(columns) - col)
        lines += [" & ".join(row) + r" \\", "".join(rules)]
    lines += [" & ".join(tex_escape(str(c)) for c in columns) + r" \\", r"\midrule"]
    for values, marks in zip(cells.to_numpy(), bold.to_numpy(), strict=True):
        lines.append(" & ".join(_cell(str(v), bool(b)) for v, b in zip(values, marks, strict=True)) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return lines


def latex_sections(report: Report) -> list[str]:
    return ["main", "stability", "audit"] + (["reference"] if len(report.reference) else [])


def write_latex(report: Report) -> list[Path]:
    """One ``table`` float per table (``<table>.tex``); see the module docstring."""
    paths = []
    for t in latex_sections(report):
        cells, bold, notes = _paper_view(report, t)
        tex = [
            f"% klsweep report of {tex_escape(report.sweep_dir.name)}: needs {PREAMBLE}",
            *method_note(report, t, notes),
            r"\begin{table}",
            r"\centering",
            r"\small",
            f"\\caption{{{tex_escape(paper_caption(report, t))}}}",
            f"\\label{{tab:klsweep-{_label(report.sweep_dir.name)}-{t}}}",
            r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%",
            *_tabular(cells, bold, _groups(report, t, list(cells.columns))),
            "}",
            r"\end{table}",
            "",
        ]
        path = report.out_dir / f"{t}.tex"
        store.atomic_write_text(path, "\n".join(tex))
        paths.append(path)
    return paths


def _label(name: str) -> str:
    """A \\label key: letters, digits, ``-`` (everything else becomes ``-``)."""
    return re.sub(r"[^A-Za-z0-9-]+", "-", name)
