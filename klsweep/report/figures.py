"""The figures of a report (matplotlib, Agg backend, imported when drawn): each a PNG, with a vector PDF beside
it when the report is asked for LaTeX or PDF (``vector``).

``curves.plot_curves``: ``curves.png``, reward, KL (log scale) and entropy against step as small multiples;
``evalbars.plot_eval``: ``eval_bars.png``, each configuration's score in domain and out of domain beside the
step-0 model's, with its change from it; ``figstyle``: what they share (size, fonts, one colour-blind-safe
colour per configuration in both, saving only what changed). ``draw_figures``: both, each in a forked process
while the report writes its tables. Layout, facets and names: docs/REPORT.md, "Figures".
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from klsweep.report.background import in_background
from klsweep.report.curves import plot_curves
from klsweep.report.evalbars import plot_eval

if TYPE_CHECKING:
    import pandas as pd

    from klsweep.report.tables import Report


def draw_figures(
    report: Report, metrics: pd.DataFrame, out: Path, vector: bool = True
) -> Callable[[], list[Path]]:
    """Start drawing ``curves.png`` and ``eval_bars.png`` (and their PDFs when ``vector``) in ``out``, each in
    a forked process while this one goes on (writing the tables: ``background.in_background``); returns the
    call that waits for them and gives their paths. A figure whose process failed is drawn again in that
    call, where its error is raised; with one core both are drawn before this returns."""
    curves = in_background(plot_curves, report, metrics, out / "curves.png", vector)
    bars = in_background(plot_eval, report, out / "eval_bars.png", vector)
    return lambda: [*curves(), *bars()]
