"""The report of a sweep: tables (pandas) and plots (matplotlib) a researcher can paste into a paper.

``klsweep report SWEEP``, or ``build_report(sweep_dir, out_dir=None, formats=DEFAULT_FORMATS)`` (md, csv, latex,
html: what ``klsweep study`` writes too): it reads only the files of the results store and writes to
``<sweep>/report/``. One module per stage of the data flow, each
importing only from the stages before it: data -> stability -> statistics -> names -> tables (audit_table, reference,
claims) -> figures (figstyle, curves, evalbars) -> renderers (render, latex, terminal) -> publish; ``build`` runs them. What each stage
computes and why: docs/REPORT.md.

Public API: ``build_report``, ``DEFAULT_FORMATS``, ``Report``, ``rich_tables``, ``read_verdicts``, ``read_expected``, ``verdict_changes``
and ``split_changes`` (this sweep's claims against a committed ``claims.csv``, its fragile verdicts apart), and the stability rule: ``smooth``, ``collapse_step``.
"""

import importlib
from typing import Any

# name -> its module: loaded on first use, so that a caller of one stage (``klsweep.report.terminal``'s
# ``fitted_table``, for the plan's tables) does not import every other (build, claims, figures' callers)
_LAZY = {
    "DEFAULT_FORMATS": "render",
    "build_report": "build",
    "read_expected": "claims",
    "read_verdicts": "claims",
    "split_changes": "claims",
    "verdict_changes": "claims",
    "collapse_step": "stability",
    "smooth": "stability",
    "Report": "tables",
    "rich_tables": "terminal",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = [
    "DEFAULT_FORMATS",
    "Report",
    "build_report",
    "collapse_step",
    "rich_tables",
    "read_expected",
    "read_verdicts",
    "smooth",
    "split_changes",
    "verdict_changes",
]
