"""Terminal rendering: rich tables for the CLI; computation lives elsewhere."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from klsweep.audit import GRPO_VERDICTS

if TYPE_CHECKING:
    from rich.table import Table

    from klsweep.audit import AuditRow, GRPOAuditRow
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
        f"{counts['to_submit']} to submit"
    )
    t.caption_justify = "left"
    return t


def _size(gb: float) -> str:
    return f"{gb / 1024:.1f} TiB" if gb >= 1024 else f"{gb:.1f} GiB"


def resources_table(counts: dict[str, Any]) -> Table:
    """A rich table of what the plan needs (``planner.summary``): one row per model and launch shape, the
    sweep's totals and its largest per-GPU memory estimate in the caption."""
    from rich.table import Table

    t = Table(title="resources (estimates: slurm/README.md)", title_justify="left")
    for col in ("model", "runs", "GPUs", "sharding", "micro", "GiB/GPU", "GPU-h", "storage"):
        t.add_column(
            col,
            justify="left" if col in ("model", "sharding") else "right",
            overflow="fold" if col == "model" else "ellipsis",  # a model's name is never cut
        )
    for row in counts["resources"]:
        mem = row["gpu_memory_gb"]
        t.add_row(
            str(row["model"]),
            str(row["runs"]),
            "CPU" if mem is None else row["gpus"],
            row["sharding"],
            "all" if row["micro_batch_size"] is None else str(row["micro_batch_size"]),
            "—" if mem is None else f"{mem:.1f}/{row['of_gb']:g}",
            f"{row['gpu_hours']:.0f}",
            _size(row["storage_gb"]),
        )
    largest = counts["largest_gpu_memory"]
    peak = (
        ""
        if largest is None
        else f"; largest per GPU: {largest['gpu_memory_gb']:g} of {largest['of_gb']:g} GiB "
        f"({largest['model']}, run {largest['run']})"
    )
    t.caption = (
        f"at most {counts['gpu_hours_upper_bound']:g} GPU-hours to submit (upper bound: every job using its "
        f"whole time limit); checkpoints kept {_size(counts['storage_gb'])}{peak}"
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


VERDICT_STYLES = {
    "unbiased reverse KL": "green",
    "forward KL": "yellow",
    "zero in expectation": "magenta",
    "biased": "red",
}


def audit_tables(rows: list[AuditRow], title: str = "") -> list:
    """The rows as rich Tables, one per importance weighting, the verdict coloured. Errors are relative to the
    exact gradient of the reverse (``err rev``) and forward (``err fwd``) KL; ``|E g|`` is the expected
    gradient's norm relative to the reverse-KL gradient's."""
    from rich import box
    from rich.table import Table

    off_policy = any(r.behavior_shift > 0 for r in rows)
    out = []
    for importance in dict.fromkeys(r.importance for r in rows):
        full_title = f"{title}, importance weights: {importance}" if off_policy else title
        t = Table(title=full_title or None, box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
        for name in ("est", "placement", "level"):
            t.add_column(name)
        for name in ("err rev", "err fwd", "|E g|", "variance"):
            t.add_column(name, justify="right")
        t.add_column("verdict", no_wrap=True)
        for r in rows:
            if r.importance == importance:
                values = (r.rel_err_reverse, r.rel_err_forward, r.rel_norm, r.grad_variance)
                verdict = f"[{VERDICT_STYLES[r.verdict]}]{r.verdict}[/]"
                t.add_row(r.estimator, r.placement, r.level, *(f"{x:.3f}" for x in values), verdict)
        out.append(t)
    return out


GRPO_VERDICT_STYLES = dict(zip(GRPO_VERDICTS, ("green", "cyan", "yellow", "magenta", "red"), strict=True))


GRPO_LEGEND = """\
scale: the effective KL gradient, (E[grad L(beta)] - E[grad L(0)]) / beta,
  projected on grad KL(pi||ref) over its squared norm, in units of the loss
  type's aggregation: 1 when beta means what it says.
cos rev, cos fwd: its cosines with grad KL(pi||ref) and grad KL(ref||pi).
err rev: its relative error against grad KL(pi||ref) (exact: below 1e-6;
  rescaled: the reverse-KL direction at another scale)."""


def grpo_audit_tables(rows: list[GRPOAuditRow]) -> list:
    """The rows as rich Tables, one per reward mode and reward scaling, narrow enough for 80 columns:
    ``scale`` is ``effective_scale``, ``cos rev``/``cos fwd`` the cosines with grad KL(pi||ref) and
    grad KL(ref||pi), ``err rev`` the relative error of effective / unit against grad KL(pi||ref)."""
    from rich import box
    from rich.table import Table

    out = []
    for mode, scaling in dict.fromkeys((r.reward_mode, r.scale_rewards) for r in rows):
        t = Table(
            title=f"reward_mode {mode}, scale_rewards {scaling}",
            box=box.SIMPLE_HEAD,
            padding=0,
            pad_edge=False,
        )
        for name in ("est", "placement", "level"):
            t.add_column(name, no_wrap=True)
        for name in ("scale", "cos rev", "cos fwd", "err rev"):
            t.add_column(name, justify="right", no_wrap=True)
        t.add_column("verdict", no_wrap=True)
        for r in rows:
            if (r.reward_mode, r.scale_rewards) == (mode, scaling):
                verdict = f"[{GRPO_VERDICT_STYLES[r.verdict]}]{r.verdict}[/]"
                numbers = (r.effective_scale, r.cos_reverse, r.cos_forward, r.rel_err_reverse)
                t.add_row(r.estimator, r.placement, r.level, *(f"{x:.3f}" for x in numbers), verdict)
        out.append(t)
    return out
