"""The report in the terminal: the main and stability tables as rich Tables (``klsweep report`` prints them),
from the same views as the files (``tables.py``)."""

from __future__ import annotations

from typing import Any

from klsweep.report.data import D_ID, D_OOD, ID_AVG, OOD_AVG
from klsweep.report.tables import SHORT, TITLES, Report, _view

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
