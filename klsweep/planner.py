"""Resource estimates of a ``Plan``: what its runs will cost (GPU-hours today; per-run GPU memory,
storage and topology checks belong here too). It reads a plan made by ``klsweep.grid``; it never builds
or changes one, and it submits nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from klsweep.grid import Plan, PlannedRun


def gpu_hours(runs: list[PlannedRun]) -> float:
    """Upper bound of the GPU-hours of ``runs``: every job using its whole time limit."""
    total = 0.0
    for run in runs:
        r = run.config["model"]["resources"]
        total += r["gpus_per_node"] * r["nodes"] * r["timeout_min"] / 60
    return total


def summary(plan: Plan) -> dict[str, Any]:
    """Counts of the plan: total, excluded, done (status.json says done under the out folder), to submit;
    and the GPU-hours upper bound of the runs to submit."""
    from klsweep import store

    todo = [r for r in plan.runs if store.read_status(r.run_dir).get("state") != "done"]
    return {
        "sweep_dir": str(plan.sweep_dir),
        "axes": plan.axes,
        "total": len(plan.runs),
        "excluded": plan.excluded,
        "done": len(plan.runs) - len(todo),
        "to_submit": len(todo),
        "gpu_hours_upper_bound": round(gpu_hours(todo), 1),
    }
