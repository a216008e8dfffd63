"""Tables in the terminal: the report's results and stability tables as rich Tables (``klsweep report`` and
``klsweep study`` print them), from the same views as the files (``tables.py``), and the layout every klsweep
table shares (``fitted_table``, used by ``klsweep.console`` for the plan and status tables too).

Layout: compact (no vertical rules, two spaces between columns), sized to the width given: a table that
would not fit drops its optional columns, then takes shorter headers (both named in the caption), before
anything is wrapped; identifiers (run ids, model names) are never cut nor folded. ``width=None`` (output to a
pipe or a file) keeps every column at its full width.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from klsweep.collapse import OUTCOME_WORDS
from klsweep.printable import visible
from klsweep.report.data import D_ID, D_OOD, ID_AVG, OOD_AVG
from klsweep.report.tables import (
    CI_METHOD,
    DASH,
    SHORT,
    STEP0_LEAD,
    TITLES,
    Report,
    fmt_p,
    interval_words,
    is_uninformative,
    step0_warnings,
    view,
)

GAP = 2  # characters between two columns: one of padding, one of (blank) rule


def _text(cell: Any) -> Any:
    """A cell, title or caption as rich shows it: a str is text as written (not rich markup: "[/INST]",
    "[bold]" and "[link=...]" print as they are), its control characters made visible (``visible``); a rich
    Text is the caller's styled text."""
    from rich.text import Text

    return cell if isinstance(cell, Text) else Text(visible(cell))


def _plain(cell: Any) -> str:
    from rich.text import Text

    return cell.plain if isinstance(cell, Text) else visible(cell)


def _width(header: str, cells: Sequence[Any]) -> int:
    """A column's natural width: its widest cell, or its header's longest word (headers wrap at spaces)."""
    words = max((len(w) for w in header.split()), default=0)
    return max([words, *(len(_plain(c)) for c in cells)])


def fitted_table(
    title: str,
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    width: int | None,
    right: Sequence[str] = (),
    whole: Sequence[str] = (),
    optional: Sequence[str] = (),
    short: Mapping[str, str] | None = None,
    caption: str = "",
) -> Any:
    """A rich Table of ``rows`` (str cells, printed as written: ``_text``; or rich Text) under ``header``. ``right``: right-aligned columns;
    ``whole``: columns never wrapped nor cut (ids, model names); ``optional``: columns dropped, in this order,
    while the table is wider than ``width`` (None: no limit), and then named in the caption; ``short``: shorter
    headers (e.g. "place" for "placement") used when it is still wider, and then spelled out in the caption.
    Only then are cells wrapped."""
    from rich import box

    header = list(header)
    cells = {h: [r[i] for r in rows] for i, h in enumerate(header)}
    widths = {h: _width(h, cells[h]) for h in header}
    shown = list(header)
    dropped: list[str] = []
    for col in optional:
        if width is None or _natural(widths, shown) <= width:
            break
        if col in shown:
            shown.remove(col)
            dropped.append(col)
    names = {h: h for h in header}
    if width is not None and _natural(widths, shown) > width:
        names |= {h: s for h, s in (short or {}).items() if h in shown and _width(s, cells[h]) < widths[h]}
        widths = {h: _width(names[h], cells[h]) for h in header}
    notes = [f"{names[h]}: {h}" for h in shown if names[h] != h]
    if dropped:
        notes.append(
            f"not shown at {width} columns: {', '.join(dropped)} (a wider terminal or a pipe shows them)"
        )
    if notes:
        note = "; ".join(notes)
        caption = f"{caption.rstrip('.')}; {note}" if caption else note  # not "collapsed (0%).; not shown"
    t = _Table(
        title=_text(title) if title else None,
        title_justify="left",
        caption=_text(caption) if caption else None,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
    for h in shown:
        keep = h in whole or width is None
        t.add_column(
            _text(names[h]),
            justify="right" if h in right else "left",
            no_wrap=keep,
            min_width=widths[h] if keep else None,
            overflow="fold",
        )
    index = [header.index(h) for h in shown]
    for r in rows:
        t.add_row(*(_text(r[i]) for i in index))
    return t


def _table_class() -> type:
    from rich.table import Table

    class FittedTable(Table):
        """A Table whose title and caption wrap at the width it is printed in (the terminal's; a pipe's: not
        at all), not at the table's own: a narrow table's caption is not folded into a column of words."""

        def __rich_console__(self, console: Any, options: Any) -> Any:
            from rich.text import Text

            title, caption = self.title, self.caption
            self.title = self.caption = None
            try:
                if title:
                    yield Text(title, style="italic") if isinstance(title, str) else title
                yield from super().__rich_console__(console, options)
                if caption:
                    yield Text(caption, style="dim") if isinstance(caption, str) else caption
            finally:
                self.title, self.caption = title, caption

    return FittedTable


def _Table(**kwargs: Any) -> Any:
    """A ``FittedTable`` (rich is imported when a table is made, not when this module is)."""
    return _table_class()(**kwargs)


def _natural(widths: dict[str, int], columns: Sequence[str]) -> int:
    return sum(widths[h] for h in columns) + GAP * (len(columns) - 1)


def fitted_tables(
    title: str,
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    width: int | None,
    group: str,
    optional: Sequence[str] = (),
    **kwargs: Any,
) -> Any:
    """``fitted_table``, or, when the table is wider than ``width`` even without its optional columns and the
    ``group`` column (e.g. a model's long name) takes several values: one table per value, titled with it and
    without that column (a rich Group)."""
    from rich.console import Group

    header = list(header)
    if width is None or group not in header:
        return fitted_table(title, header, rows, width=width, optional=optional, **kwargs)
    widths = {h: _width(h, [r[i] for r in rows]) for i, h in enumerate(header)}
    g = header.index(group)
    values = list(dict.fromkeys(_plain(r[g]) for r in rows))
    if _natural(widths, [h for h in header if h not in optional]) <= width or len(values) < 2:
        return fitted_table(title, header, rows, width=width, optional=optional, **kwargs)
    rest = [h for h in header if h != group]
    tables = [
        fitted_table(
            f"{title}: {group} {v}" if title else f"{group} {v}",
            rest,
            [[c for i, c in enumerate(r) if i != g] for r in rows if _plain(r[g]) == v],
            width=width,
            optional=optional,
            **kwargs,
        )
        for v in values
    ]
    for t in tables[:-1]:  # the caption once, under the last
        t.caption = None
    return Group(*tables)


def _mean_std(mean: Any, std: Any, fmt: str, std_fmt: str) -> str:
    """ "0.70±0.14" (no spaces: a number's cell stays one unbreakable word); "—" when there is none.
    ``fmt`` "sig": two significant digits of the mean, the spread to as many decimals."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return DASH
    if not math.isfinite(mean):  # a diverged metric (a KL of Infinity in metrics.jsonl): data, shown as such
        return format(mean, "+" if fmt.startswith("+") else "")
    if fmt == "sig":
        decimals = max(0, 1 - math.floor(math.log10(abs(mean)))) if mean else 2
        fmt = std_fmt = f".{decimals}f"
    s = format(mean, fmt)
    if std is not None and not (isinstance(std, float) and math.isnan(std)):
        s += "±" + format(std, std_fmt)
    return s


def _config_cells(report: Report, cells: Any) -> tuple[list[str], list[list[str]]]:
    cols = [SHORT.get(a, a) for a in report.axes] or ["configuration"]
    return cols, [[str(v) for v in row] for row in cells[cols].to_numpy()]


def _bold(text: str, bold: bool) -> Any:
    from rich.text import Text

    return Text(text, style="bold" if bold else "")


def rich_tables(report: Report, width: int | None = None) -> list[Any]:
    """The results and the stability tables for the terminal (every column and the exact cells are in the
    files): the configuration columns, runs evaluated, the averages and their change from step 0 as mean±the
    half-width of the 95% CI over seeds (over seeds and problems where the runs have per-problem outcomes; a
    narrow terminal drops n and the averages before the Δ columns), then a warning line per configuration that
    ends below its step-0 model in domain (``step0_warnings``); final and peak reward, peak KL, runs diverged
    and collapsed. A significantly best mean in bold."""
    tables = []
    # results: the configuration rows of the main view (the step-0 baseline goes to the caption)
    cells, bold = view(report, "main")
    keep = (cells["status"] != "baseline").to_numpy()
    cells, bold = cells[keep].reset_index(drop=True), bold[keep].reset_index(drop=True)
    df = report.main.reset_index(drop=True)
    cfg_cols, cfg_rows = _config_cells(report, cells)
    metrics = [ID_AVG, OOD_AVG, D_ID, D_OOD]
    rows = []
    for i, cfg in enumerate(cfg_rows):
        row: list[Any] = [*cfg, f"{df['evaluated'][i]}/{df['runs'][i]}"]
        for c in metrics:
            fmt = "+.2f" if c in (D_ID, D_OOD) else ".2f"
            cell = _mean_std(df[c][i], df[f"{c} ci"][i], fmt, ".2f")
            if cell != DASH and is_uninformative(df.get(f"{c} {CI_METHOD}", [None] * len(df))[i]):
                cell += (
                    "±n/i"  # its interval is wider than the score's range: not given (the caption says so)
                )
            row.append(_bold(cell, bool(bold[c][i])))
        rows.append(row)
    base = [
        f"{_fmt_model(b)}in-domain {_mean_std(b[ID_AVG], None, '.2f', '')}, OOD {_mean_std(b[OOD_AVG], None, '.2f', '')}"
        for _, b in report.baseline.iterrows()
    ]
    words = interval_words(report.main, metrics)
    caption = (
        f"eval: {report.eval_label}; mean±half the width of {words or 'its 95% interval'} (the Δ paired with "
        "the step-0 model on the same problems; main.csv: ci method)"
        + ("; ±n/i: that interval, not informative, not given" if "not informative" in words else "")
        + "; n: runs evaluated/runs"
    )
    if base:
        caption += "; Δ: change from the step-0 baseline (" + "; ".join(base) + ")"
    tables.append(
        fitted_tables(
            f"{TITLES['main']}: {report.sweep_dir.name}",
            [*cfg_cols, "n", ID_AVG, OOD_AVG, D_ID, D_OOD],
            rows,
            width=width,
            right=["n", *metrics],
            whole=["model"],
            group="model",
            optional=["n", OOD_AVG, ID_AVG],
            caption=caption,
        )
    )
    for loud, text in step0_warnings(report):
        tables.append(_warning(loud, text))
    # stability
    cells, _ = view(report, "stability")
    df = report.stability.reset_index(drop=True)
    cfg_cols, cfg_rows = _config_cells(report, cells)
    stats = [c for c in ("final reward", "peak reward", "peak KL k3") if c in df]
    rows = []
    for i, cfg in enumerate(cfg_rows):
        row = list(cfg)
        for c in stats:
            fmt = ("sig", "") if "KL" in c else (".2f", ".2f")
            row.append(_mean_std(df[c][i], df[f"{c} ci"][i], *fmt))
        with_metrics = int(df["with metrics"][i])
        row.append(f"{df['diverged'][i]}/{df['runs'][i]}")
        row.append(f"{df['collapsed'][i]}/{with_metrics}" if with_metrics else DASH)
        rows.append(row)
    tables.append(
        fitted_tables(
            f"{TITLES['stability']}: {report.sweep_dir.name}",
            [*cfg_cols, *stats, "diverged", "collapsed"],
            rows,
            width=width,
            right=[*stats, "diverged", "collapsed"],
            whole=["model"],
            group="model",
            optional=["peak KL k3", "peak reward"],
            caption="mean±95% CI half-width over seeds; diverged: of the runs, collapsed: of those with metrics (steps and "
            f"reasons: the report's files). Collapse rule (klsweep docs collapse): {report.collapse_rule.rstrip('.')}. "
            + OUTCOME_WORDS,
        )
    )
    if len(report.claims):
        from klsweep.report.statistics import FRAGILE, MC_Z, MIN_SEEDS, TOO_FEW
        from klsweep.report.tables import decide_column, verdict_text

        claims = report.claims.rename(columns={"replication se": "se"})
        rows = [
            [c.claim, verdict_text(c.verdict, c.replication, c.se, d),
             _mean_std(c.replication, c.se, ".2f", ".2f"), fmt_p(c.p_holm)]
            for c, d in zip(claims[["claim", "verdict", "replication", "se", "p_holm"]].itertuples(),
                            decide_column(claims), strict=True)
        ]  # fmt: skip
        tables.append(
            fitted_table(
                f"The study's claims: {report.sweep_dir.name}",
                ["claim", "verdict", "repl.", "p holm"],
                rows,
                width=width,
                right=["repl.", "p holm"],
                whole=["repl.", "p holm"],  # the verdict wraps: what would decide it can be long
                caption="p holm: adjusted for the claims' number (Holm); verdicts at 0.05 (tests, raw p-values, the "
                "decision rule: report.md, claims.csv); repl.: the share of bootstrap resamples of the runs giving "
                f"the same verdict ± its Monte Carlo standard error, fragile under {FRAGILE:g} or within "
                f"{MC_Z:g} errors of it; {TOO_FEW}: a side with fewer than {MIN_SEEDS} runs, no verdict"
                + (
                    f"; {OUTCOME_WORDS}"
                    if any(str(d).startswith("unstable:") for d in report.claims.get("detail", []))
                    else ""
                ),
            )
        )
    return tables


def _warning(loud: bool, text: str) -> Any:
    """A ``step0_warnings`` line as the terminal shows it: its lead-in bold, a no-KL one's in red."""
    from rich.text import Text

    line = Text(STEP0_LEAD[loud] + " ", style="bold red" if loud else "bold yellow")
    line.append(visible(text), style="red" if loud else "")
    return line


def _fmt_model(baseline_row: Any) -> str:
    name = baseline_row.get("model.name")
    return f"{name}: " if isinstance(name, str) and name else ""
