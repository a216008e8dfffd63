"""Terminal rendering for the CLI; computation lives elsewhere. One module per group of commands, as in
``klsweep/cli/``: ``terminal`` (the console, its width, wrapped sentences, the cells tables share), ``preview``
(plan, keys, grids, fetch, rehearse), ``runs`` (steps, progress, status), ``audit``, ``report``.

Every table is laid out by ``report.terminal.fitted_table``: sized to the terminal (80 columns read well: only
the axes that vary, short headers, optional columns dropped and named before anything wraps), run ids and model
names never cut, rows sorted by configuration. On a pipe or in a file the console is ``COLUMNS`` wide when it
is set, else as wide as the lines (``cli_console``): plain, full-width tables, nothing wrapped or cut; warnings
are sentences, wrapped between words at the console's width, 80 on a pipe without ``COLUMNS``
(``print_warning``). A long plan is summarised (runs per axis value); ``klsweep plan --runs`` lists every run.
"""

from typing import Any

from klsweep.console.preview import (
    LIST_RUNS_UP_TO,
    docs_table,
    fetch_table,
    grids_table,
    keys_table,
    plan_table,
    print_refusals,
    print_time,
    rehearsal_engines,
    rehearsal_notes,
    rehearsal_table,
    rehearsal_verdict,
    resources_table,
    time_table,
)
from klsweep.console.report import print_report, print_report_tables
from klsweep.console.runs import (
    COLOUR,
    eval_progress_line,
    print_failures,
    print_going_on,
    progress_line,
    scores_table,
    status_table,
    step_line,
    watch_view,
)
from klsweep.console.terminal import (
    COMPACT,
    NARROW,
    PIPE_WIDTH,
    axis_label,
    axis_labels,
    cell,
    cli_console,
    columns,
    error_line,
    pack_items,
    print_warning,
    prose_width,
    shown_params,
    styled,
    table_width,
)
from klsweep.printable import counted

# `klsweep audit`'s tables, loaded on first use: they import klsweep.audit (its exact enumeration, the GRPO
# objective), which no other command needs
_AUDIT = (
    "GRPO_LEGEND",
    "GRPO_VERDICT_STYLES",
    "VERDICT_STYLES",
    "audit_tables",
    "checked_lines",
    "grpo_audit_tables",
    "print_audit",
    "print_framework_audit",
)


def __getattr__(name: str) -> Any:
    if name in _AUDIT:
        from klsweep.console import audit

        return getattr(audit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "docs_table",
    "scores_table",
    "PIPE_WIDTH",
    "cli_console",
    "table_width",
    "columns",
    "COMPACT",
    "NARROW",
    "axis_label",
    "shown_params",
    "cell",
    "pack_items",
    "axis_labels",
    "prose_width",
    "print_warning",
    "styled",
    "error_line",
    "counted",
    "LIST_RUNS_UP_TO",
    "plan_table",
    "keys_table",
    "grids_table",
    "resources_table",
    "time_table",
    "print_refusals",
    "print_time",
    "fetch_table",
    "rehearsal_table",
    "rehearsal_engines",
    "rehearsal_notes",
    "rehearsal_verdict",
    "step_line",
    "COLOUR",
    "progress_line",
    "eval_progress_line",
    "watch_view",
    "status_table",
    "print_failures",
    "print_going_on",
    "VERDICT_STYLES",
    "audit_tables",
    "checked_lines",
    "GRPO_VERDICT_STYLES",
    "GRPO_LEGEND",
    "grpo_audit_tables",
    "print_audit",
    "print_framework_audit",
    "print_report",
    "print_report_tables",
]
