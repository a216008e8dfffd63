"""Submitting jobs with submitit (local, Slurm or in-process debug), following them, cancelling them.

    submit(plan, cluster_kind="slurm")      # one job array per resource shape, evals chained with aftercorr
    status(sweep_dir)                       # one scheduler query for the whole sweep
    cancel(sweep_dir, ["3f2a9c01be"])
    submit_eval("results/tiny", cluster="slurm")   # klsweep eval: finished runs and step-0 baselines

Two kinds of job: train a run, evaluate a run. What each runs lives below (``klsweep.job``,
``klsweep.evaluate``); this package knows submitit and the schedulers. Its modules (jobs, sweep, slurm, local,
scheduler, state, evals, joblogs) and how they work: docs/DESIGN.md (Modules, Submission).
"""

from klsweep.submit.evals import EvalProgress, EvalSubmission, submit_eval
from klsweep.submit.state import (
    Cancelled,
    Interrupted,
    RunStatus,
    cancel,
    cancel_runs,
    final_summary,
    progress,
    scheduler_problem,
    status,
    time_left,
    wait_until_final,
)
from klsweep.submit.sweep import SubmitResult, default_cluster, submit

__all__ = [
    "Cancelled",
    "EvalProgress",
    "EvalSubmission",
    "Interrupted",
    "RunStatus",
    "SubmitResult",
    "cancel",
    "cancel_runs",
    "default_cluster",
    "final_summary",
    "progress",
    "scheduler_problem",
    "status",
    "submit",
    "submit_eval",
    "time_left",
    "wait_until_final",
]
