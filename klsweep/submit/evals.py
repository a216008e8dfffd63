"""Submitting ``klsweep eval``: the evaluation of finished runs (and a sweep's step-0 baselines) as jobs.

``klsweep.evaluate`` decides what to evaluate (``eval_request``) and what a job runs (``eval_batch``); this
module decides where: in this process (debug), one submitit local job for everything (lm-eval loaded once),
or one Slurm job per run and per baseline. The jobs are recorded in the sweep's ``jobs.jsonl`` as ``eval``
jobs, like the evals chained to training by ``klsweep.submit.submit``.
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klsweep import engines, evaluate, store
from klsweep.errors import Problem
from klsweep.submit import joblogs
from klsweep.submit.scheduler import LOCK_FILE, job_row, submission_folder
from klsweep.submit.slurm import SubmissionRefused, chunks, max_array_size, sbatch, slurm_parameters
from klsweep.submit.sweep import CLUSTERS


@dataclass
class EvalSubmission(evaluate.EvalOutcome):
    """What ``submit_eval`` did: the evaluation's outcome (in-process or waited for) and the jobs submitted."""

    jobs: list[str] = field(default_factory=list)  # scheduler job ids (local/slurm)
    logs: dict[str, str] = field(default_factory=dict)  # a failed run's folder -> its eval job's log (wait)


def submit_eval(
    target: Path,
    suite: str | None = None,
    backend: str | None = None,
    cluster: str = "local",
    checkpoints: str = "last",
    wait: bool = False,
) -> EvalSubmission:
    """``klsweep eval``: evaluate a run folder, or a sweep's finished runs (done or diverged) and its step-0
    baselines (one per model); see ``klsweep.evaluate.eval_request`` for ``suite`` and ``backend``.
    ``cluster`` debug evaluates in this process; local submits one submitit job for everything (lm-eval
    loaded once); slurm one job per run and per baseline. ``wait``: wait for the jobs and collect their
    outcome."""
    problems = []
    if cluster not in CLUSTERS:
        problems.append(Problem("--cluster", f"unknown cluster {cluster!r}", ", ".join(CLUSTERS)))
    if Path(target).is_dir():
        store.check_writable(target, str(target), "a sweep or run folder you can write to (results go there)")
    request = evaluate.eval_request(Path(target), suite, backend, checkpoints, problems=problems)
    configs = [evaluate.run_config(r) for r in request.runs] + [c for _, c in request.baselines]
    engines.require({**c, "eval": request.eval_cfg} for c in configs)  # the jobs run in this environment
    if cluster == "debug":
        done = evaluate.eval_batch(
            [str(r) for r in request.runs], request.eval_cfg, request.checkpoints, request.baselines
        )
        return EvalSubmission(results=done.results, errors=done.errors, skipped=request.skipped)
    return _submit(request, cluster, wait)


def _submit(request: evaluate.EvalRequest, cluster: str, wait: bool) -> EvalSubmission:
    """Submit the evaluation with submitit and record the jobs in the sweep's jobs.jsonl."""
    import submitit
    from filelock import FileLock

    runs, baselines = request.runs, request.baselines
    cfg, checkpoints = request.eval_cfg, request.checkpoints
    if not runs:  # the baselines are those of the runs' models: none without runs
        return EvalSubmission(skipped=request.skipped)
    sweep_dir = Path(baselines[0][0]) if baselines else runs[0].parent
    folder = submission_folder(sweep_dir)
    config = evaluate.run_config(runs[0])
    res, cl = dict(config["model"].get("resources", {})), dict(config.get("cluster", {}))
    calls: list[tuple[str, tuple[Any, ...]]] = []  # (run id, job arguments)
    # each run's part of the job's log in its logs/ (one job evaluates several runs: their parts copied)
    own_log = functools.partial(joblogs.kept, kind="eval")
    if cluster == "local":
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(timeout_min=int(res.get("eval_timeout_min", 60)) * max(1, len(runs)))
        shared = functools.partial(own_log, shared=len(runs) + len(baselines) > 1)
        calls.append(("*", ([str(r) for r in runs], cfg, checkpoints, baselines, shared)))
    else:
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
        ex.update_parameters(**slurm_parameters(res, cl, config.get("name", "run"), eval_job=True))
        calls += [(store.BASELINE_DIR, ([], cfg, checkpoints, [b], own_log)) for b in baselines]
        calls += [(r.name, ([str(r)], cfg, checkpoints, [], own_log)) for r in runs]
    jobs: list[Any] = []
    refused: SubmissionRefused | None = None
    if cluster == "local":
        with ex.batch():
            jobs = [ex.submit(evaluate.eval_batch, *args) for _, args in calls]
    else:
        for piece in chunks(calls, max_array_size()):
            try:
                jobs += sbatch(ex, [functools.partial(evaluate.eval_batch, *args) for _, args in piece])
            except SubmissionRefused as e:
                refused = e
                break
    rows = []
    for (run_id, _), job in zip(calls, jobs, strict=False):
        ids = [r.name for r in runs] + [store.BASELINE_DIR] if run_id == "*" else [run_id]
        rows += [job_row(i, "eval", cluster, job.job_id, folder, supervisor=None) for i in ids]
    with FileLock(str(sweep_dir / LOCK_FILE)):
        for row in rows:
            store.append_jsonl(sweep_dir / store.JOBS_FILE, row)
    if refused is not None:
        if not jobs:
            shutil.rmtree(folder, ignore_errors=True)
        raise SubmissionRefused(refused.said, len(calls) - len(jobs), rows) from refused
    out = EvalSubmission(skipped=request.skipped, jobs=[j.job_id for j in jobs])
    if wait:
        for job in jobs:
            done = job.result()
            out.results += done.results
            out.errors.update(done.errors)
        by_run = {row["run_id"]: row for row in rows}
        for failed in out.errors:
            log = joblogs.run_log(failed, by_run.get(Path(failed).name))
            if log is not None:
                out.logs[failed] = str(log)
    return out
