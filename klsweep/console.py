"""Terminal rendering: rich tables for the CLI; computation lives elsewhere."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

    from klsweep.grid import Plan
    from klsweep.submit import RunStatus


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


def status_table(runs: list[RunStatus], title: str = "") -> Any:
    """A rich table of ``klsweep.submit.status`` rows (failed runs' log tails are printed separately by the
    CLI). A run diverged by a reward collapse shows as ``collapsed``, as the report counts it."""
    from rich.table import Table

    t = Table(title=title or None)
    axes = list(runs[0].params) if runs else []
    t.add_column("run", no_wrap=True, min_width=10)  # an id is never cut
    for col in [*axes, "state", "step", "reward", "elapsed", "GPU-h", "job", "eval"]:
        t.add_column(
            col.split(".")[-1],  # kl.estimator -> estimator: the table stays narrow
            justify="right" if col in ("step", "reward", "elapsed", "GPU-h") else "left",
            no_wrap=col in ("state", "step"),
        )
    colour = {
        "done": "green",
        "failed": "red",
        "unreadable": "red",
        "diverged": "magenta",
        "collapsed": "magenta",
        "cancelled": "yellow",
        "running": "cyan",
    }
    for r in runs:
        step = f"{r.step}/{r.total_steps}" if r.total_steps else str(r.step)
        reward = "" if r.reward is None else f"{r.reward:.3f}"
        shown = "collapsed" if r.collapsed else r.state  # as the report calls it
        state = f"[{colour.get(shown, 'white')}]{shown}[/]"
        t.add_row(r.run_id, *(str(r.params.get(a)) for a in axes), state, step, reward,
                  f"{r.elapsed_s / 60:.1f}m", f"{r.gpu_hours:.2f}", r.job_id or "", r.eval_state or "")  # fmt: skip
    return t
