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

from klsweep.report.build import build_report
from klsweep.report.claims import read_expected, read_verdicts, split_changes, verdict_changes
from klsweep.report.render import DEFAULT_FORMATS
from klsweep.report.stability import collapse_step, smooth
from klsweep.report.tables import Report
from klsweep.report.terminal import rich_tables

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
