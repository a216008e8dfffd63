"""The report of a sweep: tables (pandas) and plots (matplotlib) a researcher can paste into a paper.

``klsweep report SWEEP``, or ``build_report(sweep_dir, out_dir=None, formats=("md",))``: it reads only the
files of the results store and writes to ``<sweep>/report/``. One module per stage of the data flow, each
importing only from the stages before it: data -> stability -> statistics -> tables (audit_table, reference,
claims) -> figures -> renderers (render, latex, terminal) -> publish; ``build`` runs them. What each stage
computes and why: docs/REPORT.md.

Public API: ``build_report``, ``Report``, ``rich_tables``, ``read_verdicts`` and ``verdict_changes`` (this
sweep's claims against a committed ``claims.csv``), and the stability rule: ``smooth``, ``collapse_step``.
"""

from klsweep.report.build import build_report
from klsweep.report.claims import read_verdicts, verdict_changes
from klsweep.report.stability import collapse_step, smooth
from klsweep.report.tables import Report
from klsweep.report.terminal import rich_tables

__all__ = [
    "Report",
    "build_report",
    "collapse_step",
    "rich_tables",
    "read_verdicts",
    "smooth",
    "verdict_changes",
]
