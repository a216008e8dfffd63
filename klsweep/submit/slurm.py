"""The Slurm back end: one job array per resource shape (``sbatch`` once per array), each run's eval chained
to its training task (``aftercorr`` over a whole array, ``afterok`` per job otherwise).

``slurm_parameters`` turns a run's ``model.resources`` and ``cluster`` section into submitit's
``SlurmExecutor`` parameters; ``klsweep eval``'s jobs (``klsweep.submit.evals``) use it too.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from klsweep.errors import Problem, UserError
from klsweep.submit.jobs import EvalJob, TrainJob, cluster_settings, resources, wants_eval
from klsweep.submit.scheduler import job_row, submission_folder


def slurm_parameters(res: dict[str, Any], cl: dict[str, Any], name: str, eval_job: bool) -> dict[str, Any]:
    p: dict[str, Any] = {
        "job_name": f"klsweep-{name}{'-eval' if eval_job else ''}",
        "time": int(res.get("eval_timeout_min" if eval_job else "timeout_min", 60)),
        "nodes": 1 if eval_job else int(res.get("nodes", 1)),
        "ntasks_per_node": 1 if eval_job else int(res.get("tasks_per_node", 1)),
        "cpus_per_task": int(res.get("cpus_per_task", 1)),
        "mem": f"{int(res.get('mem_gb', 4))}GB",
        "array_parallelism": int(cl.get("array_parallelism", 64)),
        "signal_delay_s": 60 if int(res.get("timeout_min", 60)) > 5 else 30,
    }
    if int(res.get("gpus_per_node", 0)):
        p["gpus_per_node"] = int(res["gpus_per_node"])
    for key in ("partition", "account", "qos", "constraint"):
        if cl.get(key):
            p[key] = cl[key]
    if cl.get("setup"):
        p["setup"] = list(cl["setup"])
    if cl.get("additional_parameters"):
        p["additional_parameters"] = dict(cl["additional_parameters"])
    return p


def _group_key(run: Any) -> str:
    return json.dumps([resources(run), cluster_settings(run)], sort_keys=True, default=str)


def submit_slurm(sweep_dir: Path, train: list, evals: list, train_fn: Any, eval_fn: Any) -> tuple[list, int]:
    """Submit the runs to train (their evals chained) and the runs to evaluate only; returns the job rows and
    the number of sbatch calls."""
    import submitit

    folder = submission_folder(sweep_dir)
    rows: list[dict[str, Any]] = []
    calls = 0
    groups: dict[str, tuple[list, list]] = {}
    for run in train:
        groups.setdefault(_group_key(run), ([], []))[0].append(run)
    for run in evals:
        groups.setdefault(_group_key(run), ([], []))[1].append(run)
    for t_runs, e_runs in groups.values():
        first = (t_runs or e_runs)[0]
        res, cl = resources(first), cluster_settings(first)
        name = first.config.get("name", "run")
        try:
            train_ids: list[str] = []
            if t_runs:
                ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=int(cl.get("max_requeues", 3)))
                ex.update_parameters(**slurm_parameters(res, cl, name, eval_job=False))
                jobs = _batch(ex, [TrainJob(str(r.run_dir), train_fn) for r in t_runs])
                calls += 1
                train_ids = [j.job_id for j in jobs]
                rows += [
                    job_row(r.id, "train", "slurm", j.job_id, folder)
                    for r, j in zip(t_runs, jobs, strict=True)
                ]
            chained = [r for r in t_runs if wants_eval(r)]
            by_id = dict(zip([r.id for r in t_runs], train_ids, strict=True))
            eval_batches: list[tuple[list, str | None]] = [(e_runs, None)] if e_runs else []
            if len(chained) > 1 and len(chained) == len(t_runs):
                # aftercorr: eval task i starts once train task i succeeded; a failed train cancels it.
                eval_batches.append((chained, f"aftercorr:{train_ids[0].split('_')[0]}"))
            else:
                eval_batches += [([r], f"afterok:{by_id[r.id]}") for r in chained]
            for runs, dependency in eval_batches:
                params = slurm_parameters(res, cl, name, eval_job=True)
                if dependency:
                    params["dependency"] = dependency
                    params.setdefault("additional_parameters", {})["kill-on-invalid-dep"] = "yes"
                ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
                ex.update_parameters(**params)
                jobs = _batch(
                    ex, [EvalJob(str(r.run_dir), dict(r.config.get("eval", {})), eval_fn) for r in runs]
                )
                calls += 1
                rows += [
                    job_row(r.id, "eval", "slurm", j.job_id, folder) for r, j in zip(runs, jobs, strict=True)
                ]
        except subprocess.CalledProcessError as e:
            raise UserError(
                Problem(
                    "sbatch",
                    f"submission failed: {(e.stderr or b'').decode(errors='replace').strip()}",
                    "check partition/account/qos/constraint in the cluster config",
                ),
                title="Slurm refused the submission",
            ) from e
    return rows, calls


def _batch(ex: Any, fns: list[Any]) -> list[Any]:
    with ex.batch():
        jobs = [ex.submit(fn) for fn in fns]
    return jobs
