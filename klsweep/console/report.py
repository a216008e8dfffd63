"""A report as the CLI shows it: its tables, then what it set aside, its warnings and the files written."""

from __future__ import annotations

from typing import TYPE_CHECKING

from klsweep.console.terminal import print_warning, table_width

if TYPE_CHECKING:
    from rich.console import Console

    from klsweep.report import Report


def print_report(console: Console, err: Console, report: Report, tables: bool = True) -> None:
    """A report as the CLI shows it: its rich tables (when ``tables``: ``print_report_tables``), what is not
    there yet, what it set aside and its warnings (on ``err``), the files written and its W&B run."""
    if tables:
        print_report_tables(console, report)
    if report.eval_note:
        print_warning(err, report.eval_note, "eval")
    for line in report.missing:
        print_warning(err, line, "missing")
    for line in report.set_aside:
        print_warning(err, line, "set aside")
    for line in report.warnings:
        print_warning(err, line)
    for path in report.paths:
        console.print(str(path), highlight=False, soft_wrap=True)
    if report.wandb_run is not None:
        console.print(f"W&B: {report.wandb_run}", highlight=False, soft_wrap=True)


def print_report_tables(console: Console, report: Report) -> None:
    """A report's rich tables, at the console's width."""
    from klsweep.report import rich_tables

    for table in rich_tables(report, width=table_width(console)):
        console.print(table)
