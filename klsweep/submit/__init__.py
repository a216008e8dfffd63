"""Submitting jobs with submitit (local, Slurm or in-process debug), following them, cancelling them.

    submit(plan, cluster_kind="slurm")      # one job array per resource shape, evals chained with aftercorr
    status(sweep_dir)                       # one scheduler query for the whole sweep
    cancel(sweep_dir, ["3f2a9c01be"])
    submit_eval("results/tiny", cluster="slurm")   # klsweep eval: finished runs and step-0 baselines

Two kinds of job: train a run, evaluate a run. What each runs lives below (``klsweep.job``,
``klsweep.evaluate``); this package knows submitit and the schedulers:

- ``jobs``: the job callables (``TrainJob``, checkpointable and requeued; ``EvalJob``) and what a run asks for
- ``sweep``: what of a plan to submit, under the sweep's lock; the sweep's files
- ``slurm``: the Slurm back end (arrays, parameters, dependencies)
- ``local``: the local back end (a detached supervisor, ``python -m klsweep.submit``, and its worker
  processes, each running queued jobs one after the other) and the debug one
- ``scheduler``: the ``jobs.jsonl`` records and one batched scheduler query for their states; stopping jobs
- ``state``: ``RunStatus`` of every run (status.json and the scheduler combined), waiting, cancelling
- ``evals``: ``klsweep eval``'s jobs
- ``joblogs``: each run's ``logs/``, the stdout/stderr of the jobs that worked on it
"""

from klsweep.submit.evals import EvalSubmission, submit_eval
from klsweep.submit.state import (
    RunStatus,
    cancel,
    final_summary,
    scheduler_problem,
    status,
    wait_until_final,
)
from klsweep.submit.sweep import SubmitResult, default_cluster, submit

__all__ = [
    "EvalSubmission",
    "RunStatus",
    "SubmitResult",
    "cancel",
    "default_cluster",
    "final_summary",
    "scheduler_problem",
    "status",
    "submit",
    "submit_eval",
    "wait_until_final",
]
