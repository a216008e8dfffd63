"""The report of a sweep: tables (pandas) and plots (matplotlib) a researcher can paste into a paper.

``klsweep report SWEEP [--format md|csv|latex|html ...] [--out DIR] [--eval-hash H] [--wandb/--no-wandb]``, or from Python
``build_report(sweep_dir, out_dir=None, formats=("md",))``. It reads only the files of the results store and
writes to ``<sweep>/report/``: ``report.md``, ``report.html`` (self-contained: figures embedded), one
``<table>.csv`` / ``<table>.tex`` per table, ``curves.png`` and ``eval_bars.png``, each with a vector
``.pdf`` beside it. Partial sweeps are reported as they stand: every run is counted in its
configuration's status (pending, running, done, failed, diverged, cancelled); a value with no data yet is "—".

One module per stage of the data flow; each imports only from the ones listed before it:

- ``data.py``: everything read from the store: runs, configs, metrics, eval results, the step-0 baseline, Δ;
- ``stability.py``: smoothing and the collapse rule (their definitions), the per-run stability columns;
- ``statistics.py``: t-based confidence intervals over seeds, Welch's test, TOST, Fisher's exact test and the
  power of each; the claims' decision rule;
- ``tables.py``: ``Report``; the main and stability tables; the view of every table (cells, bold, title,
  caption) that all renderers print; ``audit_table.py``: the KL gradient audit
  with the sweep's settings (group size, reward scaling, reward mode, loss type, beta); ``reference.py``: the study's
  reported numbers beside ours (``paper_reference.csv``, package data); ``claims.py``: each configuration
  against its references and the study's claims with their verdicts (``claims.csv``); the Environment table
  (each run's ``env.json``);
- ``figures.py``: the curves (small multiples) and the eval bars, PNG and PDF;
- ``latex.py``: the paper tables (``<table>.tex``); ``render.py``: the files, one writer per format (md, csv,
  latex, html); ``terminal.py``: the rich tables;
- ``publish.py``: the report logged to W&B beside the runs, when they mirrored there;
- ``build.py``: ``build_report``, load -> tables -> figures -> renderers -> W&B.

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
