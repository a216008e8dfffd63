"""Terminal rendering: rich tables for the CLI; computation lives elsewhere."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

    from klsweep.grid import Plan


def plan_table(plan: Plan, counts: dict[str, Any]) -> Table:
    """A rich table of the runs (the varying axes and the id), with the counts (``planner.summary``) as its
    caption."""
    from rich.table import Table

    t = Table(title=f"sweep {plan.name}: {plan.sweep_dir}", title_justify="left")
    for axis in plan.axes:
        t.add_column(axis)
    t.add_column("id", style="cyan")
    for run in plan.runs:
        t.add_row(*(str(run.params[a]) for a in plan.axes), run.id)
    t.caption = (
        f"{counts['total']} runs, {counts['excluded']} excluded, {counts['done']} already done, "
        f"{counts['to_submit']} to submit; at most {counts['gpu_hours_upper_bound']:g} GPU-hours "
        "(upper bound: every job using its whole time limit)"
    )
    t.caption_justify = "left"
    return t
