"""The Slurm back end: one job array per resource shape (``sbatch`` once per array), split into arrays of at
most the cluster's ``MaxArraySize`` (``scontrol show config``), each run's eval chained to its training task
(``aftercorr`` over a whole array, ``afterok`` per job otherwise).

When Slurm refuses an sbatch (an invalid partition, account or QOS, a limit) the submission stops there with
``SubmissionRefused``: what Slurm said, and the rows of the jobs submitted before the refusal (they exist), so
that the caller records those and rolls back the rest (``klsweep.submit.sweep``).

``slurm_parameters`` turns a run's ``model.resources`` and ``cluster`` section into submitit's
``SlurmExecutor`` parameters; ``klsweep eval``'s jobs (``klsweep.submit.evals``) use it too.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from klsweep.config import SBATCH_OPTION_ALLOWED, sbatch_option_problem, tasks_per_node
from klsweep.errors import Problem, UserError
from klsweep.planner import default_signal_delay, job_signal_delay
from klsweep.submit.jobs import EvalJob, TrainJob, cluster_settings, resources, wants_eval
from klsweep.submit.scheduler import DOWN, controller_problem, job_row, run_cmd, submission_folder

DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default, when scontrol cannot say
# what sbatch says when the controller is down or unreachable (not a refusal of the job)
CONTROLLER_DOWN = ("Unable to contact slurm controller", "Zero Bytes were transmitted or received")


class SubmissionRefused(UserError):
    """Slurm refused an sbatch. ``rows``: the jobs.jsonl rows of the jobs submitted before (they exist)."""

    def __init__(self, stderr: str, runs: int, rows: list[dict[str, Any]]):
        self.rows = rows
        self.said = said = " ".join(stderr.split()) or "(nothing on stderr)"
        down = said.startswith(DOWN) or any(text in said for text in CONTROLLER_DOWN)
        problems = [
            Problem(
                "sbatch",
                f"{DOWN}, so no job of {runs} run(s) was submitted: {said.removeprefix(DOWN + ': ')}"
                if down
                else f"Slurm refused the job{' array' if runs > 1 else ''} of {runs} run(s): {said}",
                "the same command once `scontrol ping` says UP: nothing in the sweep needs changing"
                if down
                else "cluster settings this cluster accepts: cluster.partition, account, qos, constraint, "
                "model.resources (see `sinfo`, `sacctmgr show assoc user=$USER`)",
            )
        ]
        if rows:
            kept = len({r["run_id"] for r in rows})
            problems.append(
                Problem("sbatch", f"{kept} run(s) submitted before the refusal keep their jobs (jobs.jsonl)")
            )
        super().__init__(problems, title=DOWN if down else "Slurm refused the submission")


@functools.cache
def max_array_size() -> int:
    """The cluster's ``MaxArraySize`` (``scontrol show config``): an array holds at most this many tasks."""
    out = run_cmd(["scontrol", "show", "config"]) or ""
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", out, re.MULTILINE)
    return int(found.group(1)) if found else DEFAULT_MAX_ARRAY_SIZE


def chunks(items: list[Any], size: int) -> list[list[Any]]:
    """``items`` in consecutive pieces of at most ``size``."""
    size = max(1, size)
    return [items[i : i + size] for i in range(0, len(items), size)]


def slurm_parameters(
    res: dict[str, Any], cl: dict[str, Any], name: str, eval_job: bool, signal_delay_s: int | None = None
) -> dict[str, Any]:
    """submitit's parameters of a job; ``signal_delay_s``: a training job's (``klsweep.planner.
    job_signal_delay``), else ``cluster.signal_delay_s`` for a training job, ``planner.default_signal_delay``
    for an eval job (it has no checkpoint to save)."""
    if signal_delay_s is None:
        chosen = None if eval_job else cl.get("signal_delay_s")
        signal_delay_s = int(chosen or default_signal_delay(res))
    p: dict[str, Any] = {
        "job_name": f"klsweep-{name}{'-eval' if eval_job else ''}",
        "time": int(res.get("eval_timeout_min" if eval_job else "timeout_min", 60)),
        "nodes": 1 if eval_job else int(res.get("nodes", 1)),
        "ntasks_per_node": 1 if eval_job else tasks_per_node(res),  # one process per GPU by default
        "cpus_per_task": int(res.get("cpus_per_task", 1)),
        "mem": f"{int(res.get('mem_gb', 4))}GB",
        "array_parallelism": int(cl.get("array_parallelism", 64)),
        "signal_delay_s": signal_delay_s,
    }
    if int(res.get("gpus_per_node", 0)):
        p["gpus_per_node"] = int(res["gpus_per_node"])
    for key in ("partition", "account", "qos", "constraint"):
        if cl.get(key):
            p[key] = cl[key]
    if cl.get("setup"):
        p["setup"] = list(cl["setup"])
    if cl.get("additional_parameters"):
        extra = dict(cl["additional_parameters"])
        bad = [problem for k in extra if (problem := sbatch_option_problem(k))]
        if bad:  # a config.yaml written by hand (the grid refuses these at plan time)
            raise UserError(
                [Problem("cluster.additional_parameters", b, SBATCH_OPTION_ALLOWED) for b in bad],
                title="not an sbatch option",
            )
        p["additional_parameters"] = extra
    return p


def _group_key(run: Any) -> str:
    return json.dumps([resources(run), cluster_settings(run)], sort_keys=True, default=str)


def submit_slurm(sweep_dir: Path, train: list, evals: list, train_fn: Any, eval_fn: Any) -> tuple[list, int]:
    """Submit the runs to train (their evals chained) and the runs to evaluate only; returns the job rows and
    the number of sbatch calls."""
    import submitit

    down = controller_problem()  # at once, rather than sbatch's own timeouts and retries
    if down is not None:
        raise SubmissionRefused(down, len(train) + len(evals), [])
    folder = submission_folder(sweep_dir)
    rows: list[dict[str, Any]] = []
    calls = 0
    groups: dict[str, tuple[list, list]] = {}
    for run in train:
        groups.setdefault(_group_key(run), ([], []))[0].append(run)
    for run in evals:
        groups.setdefault(_group_key(run), ([], []))[1].append(run)
    size = max_array_size()
    pieces = []  # (runs to train, runs to evaluate only): each at most one array of each kind
    for t_runs, e_runs in groups.values():
        pieces += [(t, []) for t in chunks(t_runs, size)] + [([], e) for e in chunks(e_runs, size)]
    for t_runs, e_runs in pieces:
        first = (t_runs or e_runs)[0]
        res, cl = resources(first), cluster_settings(first)
        name = first.config.get("name", "run")
        runs_now = len(t_runs or e_runs)
        try:
            train_ids: list[str] = []
            if t_runs:
                ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=int(cl.get("max_requeues", 3)))
                delay = max(job_signal_delay(r.config) for r in t_runs)  # the array's slowest to save
                ex.update_parameters(**slurm_parameters(res, cl, name, eval_job=False, signal_delay_s=delay))
                jobs = sbatch(ex, [TrainJob(str(r.run_dir), train_fn) for r in t_runs])
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
                jobs = sbatch(
                    ex, [EvalJob(str(r.run_dir), dict(r.config.get("eval", {})), eval_fn) for r in runs]
                )
                calls += 1
                rows += [
                    job_row(r.id, "eval", "slurm", j.job_id, folder) for r, j in zip(runs, jobs, strict=True)
                ]
        except SubmissionRefused as e:  # with the rows of the arrays submitted before this one
            if not rows:
                shutil.rmtree(folder, ignore_errors=True)
            raise SubmissionRefused(e.said, runs_now, rows) from e
    return rows, calls


def sbatch(ex: Any, fns: list[Any]) -> list[Any]:
    """Submit ``fns`` as one sbatch (an array when several); ``SubmissionRefused`` (with no rows) when Slurm
    refuses it. submitit prints sbatch's stderr before raising: it is kept for the message instead."""
    from submitit.core.utils import FailedJobError

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), ex.batch():
            jobs = [ex.submit(fn) for fn in fns]
    except (FailedJobError, subprocess.CalledProcessError) as e:
        said = getattr(e, "stderr", None) or str(e) or stderr.getvalue()
        if isinstance(said, bytes):
            said = said.decode(errors="replace")
        raise SubmissionRefused(said, len(fns), []) from e
    return jobs
