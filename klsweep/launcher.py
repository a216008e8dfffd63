"""Submit a sweep's runs with submitit (local, Slurm or in-process debug), follow them, cancel them.

    submit(plan, cluster_kind="slurm")      # one job array per resource shape, evals chained with aftercorr
    status(sweep_dir)                       # one scheduler query for the whole sweep
    cancel(sweep_dir, ["3f2a9c01be"])
    submit_eval("results/tiny", cluster="slurm")   # klsweep eval: finished runs and step-0 baselines

Decisions are taken under a file lock on ``results/<sweep>/.lock`` and every submission is recorded in
``jobs.jsonl`` (run id, kind, cluster, job id, submitit folder, time), so two concurrent ``klsweep run`` never
submit a run twice. Locally, a detached supervisor process (``python -m klsweep.launcher SUPERVISE QUEUE``)
starts submitit LocalExecutor jobs in waves, at most ``cluster.max_local_jobs`` (default: the core count) at
once, and starts each run's eval after its training job succeeded; the CLI returns at once.

Training jobs are ``TrainJob`` (submitit checkpointable: on preemption or timeout it calls
``klsweep.job.save_on_preemption()`` and requeues itself, at most ``cluster.max_requeues`` times);
``train_run`` resumes from the run's last checkpoint. Eval jobs are ``EvalJob``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klsweep import evaluate, store
from klsweep.errors import Problem, UserError

CLUSTERS = ("local", "slurm", "debug")
LIVE_SLURM = {
    "PENDING",
    "REQUEUED",
    "CONFIGURING",
    "RESIZING",
    "SUSPENDED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RUNNING",
    "COMPLETING",
    "STAGE_OUT",
    "SIGNALING",
    "STOPPED",
}
RUNNING_SLURM = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}
LOCK_FILE = ".lock"
SUPERVISE = "supervise"


# ---------------------------------------------------------------------------------------------------------
# Job callables (pickled by submitit; run on the compute node)
# ---------------------------------------------------------------------------------------------------------


@dataclass
class TrainJob:
    """Train one run: ``klsweep.job.train_run(run_dir)`` (or ``fn``, for tests), data-parallel when the job has
    several tasks. Checkpointable: submitit calls ``checkpoint`` on preemption/timeout and requeues the job."""

    run_dir: str
    fn: Callable[[Path], Any] | None = None

    def __call__(self) -> Any:
        import submitit

        env = submitit.JobEnvironment()
        if env.num_tasks > 1:
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        if self.fn is None:
            from klsweep.job import train_run

            fn: Callable[[Path], Any] = train_run
        else:
            fn = self.fn
        try:
            return fn(Path(self.run_dir))
        except Exception:
            if env.global_rank == 0 and store.read_status(self.run_dir)["state"] not in store.FINAL_STATES:
                store.write_status(
                    self.run_dir, "failed", reason="exception", error=_tail(traceback.format_exc())
                )
            raise

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        from submitit.helpers import DelayedSubmission

        if self.fn is None:
            from klsweep.job import save_on_preemption

            save_on_preemption()
        return DelayedSubmission(self)


@dataclass
class EvalJob:
    """Evaluate one trained run: ``klsweep.evaluate.eval_run(run_dir, eval_cfg, checkpoints="last")``."""

    run_dir: str
    eval_cfg: dict[str, Any]
    fn: Callable[..., Any] | None = None

    def __call__(self) -> Any:
        if self.fn is None:
            from klsweep.evaluate import eval_run

            return eval_run(Path(self.run_dir), self.eval_cfg, checkpoints="last")
        return self.fn(Path(self.run_dir), self.eval_cfg, checkpoints="last")


def _tail(text: str, n: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


# ---------------------------------------------------------------------------------------------------------
# Submission
# ---------------------------------------------------------------------------------------------------------


@dataclass
class SubmitResult:
    sweep_dir: Path
    cluster: str
    actions: dict[str, str]  # run id -> submit | resume | eval | skip-done | skip-live | skip-failed
    jobs: list[dict[str, Any]] = field(default_factory=list)  # the jobs.jsonl rows written
    sbatch_calls: int = 0

    @property
    def submitted(self) -> list[str]:
        return [r for r, a in self.actions.items() if a in ("submit", "resume", "eval")]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.actions.values():
            out[a] = out.get(a, 0) + 1
        return out


def default_cluster(plan: Any) -> str:
    """The cluster the grid asks for (``cluster.kind`` in its base), ``local`` when it does not say."""
    kinds = {r.config.get("cluster", {}).get("kind", "local") for r in plan.runs}
    if len(kinds) > 1:
        raise UserError(
            Problem(
                "cluster.kind", f"the runs ask for several clusters: {sorted(kinds)}", "one per submission"
            ),
            title="ambiguous cluster",
        )
    return kinds.pop() if kinds else "local"


def submit(
    plan: Any,
    cluster_kind: str = "local",
    wait: bool = False,
    retry_failed: bool = False,
    force: bool = False,
    *,
    chain_eval: bool = True,
    train_fn: Callable[[Path], Any] | None = None,
    eval_fn: Callable[..., Any] | None = None,
) -> SubmitResult:
    """Write the sweep's files and submit what is not done yet; see the module docstring.

    ``chain_eval=False`` submits training only, even when the runs name an eval suite (``klsweep study``
    evaluates the whole sweep afterwards in one job). ``train_fn``/``eval_fn`` replace
    ``klsweep.job.train_run``/``klsweep.evaluate.eval_run`` (tests)."""
    from filelock import FileLock
    from omegaconf import OmegaConf

    if cluster_kind not in CLUSTERS:
        raise UserError(Problem("--cluster", f"unknown cluster {cluster_kind!r}", ", ".join(CLUSTERS)))
    sweep_dir = Path(plan.sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    _prepare_models(plan)
    result = SubmitResult(sweep_dir=sweep_dir, cluster=cluster_kind, actions={})
    with FileLock(str(sweep_dir / LOCK_FILE)):
        _write_sweep_file(plan, cluster_kind)
        rows = _latest_rows(sweep_dir)
        live = _live_jobs(rows.values())
        if force:
            _cancel_rows([r for key, r in rows.items() if key in live])
            live = set()
        train: list[Any] = []
        evals: list[Any] = []  # eval-only (training already done)
        slurm_evals: dict[str, str] = {}

        def eval_state(row: dict[str, Any]) -> str:
            """An eval row's state; one sacct call for all the Slurm ones, at the first need."""
            if row["cluster"] != "slurm":
                return _row_state(row)
            if not slurm_evals:
                slurm_evals.update(
                    _scheduler_states(
                        [r for (_, kind), r in rows.items() if kind == "eval" and r["cluster"] == "slurm"]
                    )
                )
            return slurm_evals[_key(row)]

        for run in plan.runs:
            run_dir = Path(run.run_dir)
            if force and run_dir.exists():
                shutil.rmtree(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            cfg_text = OmegaConf.to_yaml(OmegaConf.create(run.config))
            if (
                not (run_dir / store.CONFIG_FILE).exists()
                or (run_dir / store.CONFIG_FILE).read_text() != cfg_text
            ):
                store.atomic_write_text(run_dir / store.CONFIG_FILE, cfg_text)
            action = _decide(run, rows, live, retry_failed, chain_eval, eval_state)
            result.actions[run.id] = action
            if action in ("submit", "resume"):
                store.write_status(run_dir, "pending", reason=action, error=None, finished_at=None)
                train.append(run)
            elif action == "eval":
                evals.append(run)
        if train or evals:
            submit_fn = {"local": _submit_local, "slurm": _submit_slurm, "debug": _submit_debug}[cluster_kind]
            if not chain_eval:
                train = [_without_eval(r) for r in train]
            result.jobs, result.sbatch_calls = submit_fn(sweep_dir, train, evals, train_fn, eval_fn)
            for row in result.jobs:
                store.append_jsonl(sweep_dir / store.JOBS_FILE, row)
    if wait and cluster_kind != "debug":
        wait_until_final(sweep_dir)
    return result


def _prepare_models(plan: Any) -> None:
    """Build the project's tiny model here, once, if a run uses it: otherwise every job (every rank) would
    build it, or wait on its lock, while holding its allocation."""
    if any(r.config.get("model", {}).get("path") == "tiny" for r in plan.runs):
        from klsweep import tinymodel

        tinymodel.tiny_model_path()


def _without_eval(run: Any) -> Any:
    """The same planned run with no eval chained (its config.yaml on disk keeps its eval settings)."""
    config = {**run.config, "eval": {**run.config.get("eval", {}), "suite": "none"}}
    return dataclasses.replace(run, config=config)


def _wants_eval(run: Any) -> bool:
    return run.config.get("eval", {}).get("suite", "none") not in ("none", "", None)


def _has_eval_results(run_dir: Path) -> bool:
    return any((run_dir / store.EVAL_DIR).glob("*/*/results.json"))


def _decide(
    run: Any,
    rows: dict[tuple[str, str], dict],
    live: set[tuple[str, str]],
    retry_failed: bool,
    chain_eval: bool = True,
    row_state: Callable[[dict[str, Any]], str] | None = None,
) -> str:
    if (run.id, "train") in live:
        return "skip-live"
    run_dir = Path(run.run_dir)
    state = store.read_status(run_dir).get("state", "pending")
    if state in ("done", "diverged"):
        if state == "done" and chain_eval and _wants_eval(run) and not _has_eval_results(run_dir):
            if (run.id, "eval") in live:
                return "skip-live"
            last = rows.get((run.id, "eval"))
            if last is None or retry_failed:
                return "eval"
            return "skip-failed" if (row_state or _row_state)(last) in ("FAILED", "CANCELLED") else "eval"
        return "skip-done"
    if state in ("failed", "cancelled") and not retry_failed:
        return "skip-failed"
    return "resume" if store.checkpoints(run_dir) or state in ("running", "failed", "cancelled") else "submit"


def _write_sweep_file(plan: Any, cluster_kind: str) -> None:
    from omegaconf import OmegaConf

    data = {
        "name": plan.name,
        "cluster": cluster_kind,
        "axes": list(plan.axes),
        "excluded": plan.excluded,
        "runs": {r.id: dict(r.params) for r in plan.runs},
        "grid": plan.grid_text,
    }
    store.atomic_write_text(
        Path(plan.sweep_dir) / store.SWEEP_FILE, OmegaConf.to_yaml(OmegaConf.create(data))
    )


def submission_folder(sweep_dir: Path) -> Path:
    base = time.strftime("%Y%m%d-%H%M%S")
    folder = sweep_dir / "submitit" / base
    k = 1
    while folder.exists():
        k += 1
        folder = sweep_dir / "submitit" / f"{base}-{k}"
    folder.mkdir(parents=True)
    return folder


def job_row(
    run_id: str, kind: str, cluster: str, job_id: str | None, folder: Path, **extra: Any
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "kind": kind,
        "cluster": cluster,
        "job_id": job_id,
        "folder": str(folder),
        "submitted_at": time.time(),
        **extra,
    }


def _resources(run: Any) -> dict[str, Any]:
    return dict(run.config.get("model", {}).get("resources", {}))


def _cluster_cfg(run: Any) -> dict[str, Any]:
    return dict(run.config.get("cluster", {}))


# --- Slurm -------------------------------------------------------------------------------------------------


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
    import json

    return json.dumps([_resources(run), _cluster_cfg(run)], sort_keys=True, default=str)


def _submit_slurm(sweep_dir: Path, train: list, evals: list, train_fn: Any, eval_fn: Any) -> tuple[list, int]:
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
        res, cl = _resources(first), _cluster_cfg(first)
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
            chained = [r for r in t_runs if _wants_eval(r)]
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


# --- debug (in-process) ------------------------------------------------------------------------------------


def _submit_debug(sweep_dir: Path, train: list, evals: list, train_fn: Any, eval_fn: Any) -> tuple[list, int]:
    import submitit

    folder = submission_folder(sweep_dir)
    rows: list[dict[str, Any]] = []
    todo = [(r, ["train", "eval"] if _wants_eval(r) else ["train"]) for r in train] + [
        (r, ["eval"]) for r in evals
    ]
    for run, kinds in todo:
        for kind in kinds:
            ex = submitit.DebugExecutor(folder=folder)
            fn = (
                TrainJob(str(run.run_dir), train_fn)
                if kind == "train"
                else EvalJob(str(run.run_dir), dict(run.config.get("eval", {})), eval_fn)
            )
            job = ex.submit(fn)
            state = "COMPLETED"
            try:
                job.result()
            except Exception:
                state = "FAILED"
            rows.append(job_row(run.id, kind, "debug", job.job_id, folder, state=state))
            if state == "FAILED":
                break
    return rows, 0


# --- local (detached supervisor running submitit LocalExecutor jobs in waves) ------------------------------


def _local_params(res: dict[str, Any], cl: dict[str, Any], eval_job: bool) -> dict[str, Any]:
    timeout_min = float(res.get("eval_timeout_min" if eval_job else "timeout_min", 60))
    p: dict[str, Any] = {
        "timeout_min": timeout_min,
        "tasks_per_node": 1 if eval_job else int(res.get("tasks_per_node", 1)) * int(res.get("nodes", 1)),
        "gpus_per_node": int(res.get("gpus_per_node", 0)),
        # USR2 (checkpoint and requeue) this long before the timeout: 10% of it, within [5 s, 120 s]
        "signal_delay_s": int(min(120, max(5, 6 * timeout_min))),
    }
    if cl.get("setup"):
        p["setup"] = list(cl["setup"])
    return p


def _submit_local(sweep_dir: Path, train: list, evals: list, train_fn: Any, eval_fn: Any) -> tuple[list, int]:
    import cloudpickle

    folder = submission_folder(sweep_dir)
    items: list[dict[str, Any]] = []

    def add(run: Any, kind: str, after: int | None = None) -> None:
        fn = (
            TrainJob(str(run.run_dir), train_fn)
            if kind == "train"
            else EvalJob(str(run.run_dir), dict(run.config["eval"]), eval_fn)
        )
        params = _local_params(_resources(run), _cluster_cfg(run), kind == "eval")
        items.append(
            {
                "run_id": run.id,
                "kind": kind,
                "run_dir": str(run.run_dir),
                "after": after,
                "fn": fn,
                "params": params,
            }
        )

    for run in train:
        add(run, "train")
        if _wants_eval(run):
            add(run, "eval", after=len(items) - 1)
    for run in evals:
        add(run, "eval")
    first = (train or evals)[0]
    cl = _cluster_cfg(first)
    queue = {
        "sweep_dir": str(sweep_dir),
        "folder": str(folder),
        "max_jobs": int(cl.get("max_local_jobs") or os.cpu_count() or 1),
        "max_requeues": int(cl.get("max_requeues", 3)),
        "items": items,
    }
    queue_path = folder / "queue.pkl"
    queue_path.write_bytes(cloudpickle.dumps(queue))
    with open(folder / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "klsweep.launcher", SUPERVISE, str(queue_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
    rows = [job_row(it["run_id"], it["kind"], "local", None, folder, supervisor=proc.pid) for it in items]
    return rows, 0


def supervise(queue_path: str | Path) -> None:
    """The local supervisor: start queued jobs, at most ``max_jobs`` at once; evals after a successful train."""
    import pickle

    import submitit
    from filelock import FileLock

    queue = pickle.loads(Path(queue_path).read_bytes())
    sweep_dir, folder = Path(queue["sweep_dir"]), Path(queue["folder"])
    items: list[dict[str, Any]] = queue["items"]
    ex = submitit.LocalExecutor(folder=folder, max_num_timeout=queue["max_requeues"])
    state = ["waiting"] * len(items)
    jobs: dict[int, Any] = {}

    def record(i: int, job_id: str | None, **extra: Any) -> None:
        with FileLock(str(sweep_dir / LOCK_FILE)):
            it = items[i]
            store.append_jsonl(
                sweep_dir / store.JOBS_FILE,
                job_row(it["run_id"], it["kind"], "local", job_id, folder, **extra),
            )

    while "waiting" in state or "running" in state:
        for i, job in list(jobs.items()):
            if job.done():
                ok = job.paths.result_pickle.exists() and job.exception() is None
                state[i] = "ok" if ok else "failed"
                del jobs[i]
        for i, it in enumerate(items):
            if state[i] != "waiting" or len(jobs) >= queue["max_jobs"]:
                continue
            dep = it["after"]
            if dep is not None and state[dep] in ("waiting", "running"):
                continue
            if (dep is not None and state[dep] != "ok") or (
                it["kind"] == "train" and store.read_status(it["run_dir"]).get("state") == "cancelled"
            ):
                state[i] = "skipped"
                record(i, None, state="SKIPPED")
                continue
            ex.update_parameters(**it["params"])
            jobs[i] = ex.submit(it["fn"])
            state[i] = "running"
            record(i, jobs[i].job_id)
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------------------
# Job states: one scheduler query for a whole sweep
# ---------------------------------------------------------------------------------------------------------


def _latest_rows(sweep_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The latest jobs.jsonl row per (run id, kind)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for row in store.read_jsonl(sweep_dir / store.JOBS_FILE):
        out[(row["run_id"], row["kind"])] = row
    return out


def _pid_alive(pid: int, marker: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return marker in cmdline and stat.rsplit(")", 1)[1].split()[0] != "Z"


def _local_state(row: dict[str, Any]) -> str:
    """A Slurm-like state of a local job, read from the process table and submitit's result file."""
    if row.get("state"):
        return row["state"]
    if row["job_id"] is None:
        return "PENDING" if _pid_alive(int(row["supervisor"]), "klsweep.launcher") else "LOST"
    if _pid_alive(int(row["job_id"]), "submitit"):
        return "RUNNING"
    return _result_state(Path(row["folder"]), row["job_id"])


def _result_state(folder: Path, job_id: str) -> str:
    import pickle

    path = folder / f"{job_id}_0_result.pkl"
    if not path.exists():
        return "CANCELLED" if (folder / f"{job_id}.cancelled").exists() else "FAILED"
    try:
        outcome = pickle.loads(path.read_bytes())[0]
    except Exception:
        return "FAILED"
    return "COMPLETED" if outcome == "success" else "FAILED"


def _run_cmd(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _squeue() -> dict[str, str] | None:
    """Live Slurm jobs of this user (one squeue call): job id -> state; None when squeue is unavailable."""
    out = _run_cmd(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T"])
    if out is None:
        return None
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def _sacct(job_ids: list[str]) -> dict[str, str]:
    """Final or live states of Slurm jobs (one sacct call for all; arrays are queried by their array id)."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    if not job_ids:
        return {}
    bases = sorted({j.split("_")[0] for j in job_ids}, key=lambda s: (len(s), s))
    out = _run_cmd(["sacct", "-X", "--parsable2", "-o", "JobID,State", "-j", ",".join(bases)])
    if out is None:
        return {}
    info = SlurmInfoWatcher().read_info(out)
    return {j: s["State"].split()[0] for j, s in info.items()}


def _scheduler_states(rows: list[dict[str, Any]], live_only: bool = False) -> dict[str, str]:
    """job id -> Slurm-like state, for every row (one scheduler query for the Slurm ones)."""
    states: dict[str, str] = {}
    slurm_ids = [r["job_id"] for r in rows if r["cluster"] == "slurm" and r["job_id"]]
    if slurm_ids:
        if live_only:
            q = _squeue()
            if q is None:  # no squeue: trust accounting
                q = {j: s for j, s in _sacct(slurm_ids).items() if s in LIVE_SLURM}
            states.update({j: q.get(j, "GONE") for j in slurm_ids})
        else:
            acct = _sacct(slurm_ids)
            states.update({j: acct.get(j, "UNKNOWN") for j in slurm_ids})
    for r in rows:
        if r["cluster"] == "local":
            states[_key(r)] = _local_state(r)
        elif r["cluster"] == "debug":
            states[_key(r)] = r.get("state", "COMPLETED")
    return states


def _key(row: dict[str, Any]) -> str:
    return (
        row["job_id"]
        if row["cluster"] == "slurm"
        else f"{row['cluster']}:{row['job_id']}:{row.get('supervisor')}:{row['run_id']}:{row['kind']}"
    )


def _row_state(row: dict[str, Any]) -> str:
    return _scheduler_states([row])[_key(row)]


def _live_jobs(rows: Any) -> set[tuple[str, str]]:
    rows = list(rows)
    states = _scheduler_states(rows, live_only=True)
    return {(r["run_id"], r["kind"]) for r in rows if states.get(_key(r)) in LIVE_SLURM}


# ---------------------------------------------------------------------------------------------------------
# Status
# ---------------------------------------------------------------------------------------------------------


@dataclass
class RunStatus:
    run_id: str
    params: dict[str, Any]  # the sweep's varying axes -> this run's value
    state: str  # pending | running | done | failed | diverged | cancelled
    step: int
    total_steps: int | None
    reward: float | None  # reward_mean of the last metrics row
    elapsed_s: float
    gpu_hours: float
    job_id: str | None
    cluster: str | None
    eval_state: str | None  # None (no eval) | pending | running | done | failed | cancelled | skipped
    log_tail: list[str]  # failed runs: the last lines of the job's stderr (or the recorded traceback)

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def _combine(status_state: str, sched: str | None) -> str:
    if sched in RUNNING_SLURM:
        return "running"
    if sched in LIVE_SLURM:
        return "pending"
    if status_state in ("done", "diverged"):
        return status_state
    if sched is None or sched in ("UNKNOWN", "GONE"):
        return status_state
    if sched == "COMPLETED":
        return status_state if status_state in store.FINAL_STATES else "done"
    if sched.startswith("CANCELLED"):
        return "cancelled"
    if sched == "LOST":
        return status_state if status_state in store.FINAL_STATES else "failed"
    return "failed"  # FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, BOOT_FAIL, DEADLINE


def _last_line(path: Path) -> dict[str, Any] | None:
    import json

    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


def _log_tail(row: dict[str, Any] | None, n: int = 15) -> list[str]:
    if row is None or not row.get("job_id"):
        return []
    path = Path(row["folder"]) / f"{row['job_id']}_0_log.err"
    try:
        return path.read_text(errors="replace").rstrip().splitlines()[-n:]
    except OSError:
        return []


def status(sweep_dir: str | Path) -> list[RunStatus]:
    """The state of every run of a sweep: status.json combined with one batched scheduler query."""
    import yaml

    sweep_dir = Path(sweep_dir)
    sweep_path = sweep_dir / store.SWEEP_FILE
    sweep = yaml.safe_load(sweep_path.read_text()) if sweep_path.exists() else {}
    axes: list[str] = list(sweep.get("axes") or [])
    planned: dict[str, dict] = sweep.get("runs") or {}
    rows = _latest_rows(sweep_dir)
    states = _scheduler_states(list(rows.values()))
    out: list[RunStatus] = []
    for run_dir in store.run_dirs(sweep_dir):
        rid = run_dir.name
        st = store.read_status(run_dir)
        train_row, eval_row = rows.get((rid, "train")), rows.get((rid, "eval"))
        sched = states.get(_key(train_row)) if train_row else None
        state = _combine(st.get("state", "pending"), sched)
        # accounting lags the job: trust a running status written since this submission
        fresh = train_row and float(st.get("updated_at") or 0) >= float(train_row["submitted_at"])
        if state == "pending" and st.get("state") == "running" and fresh:
            state = "running"
        eval_state = None
        if eval_row is not None:
            e_sched = states.get(_key(eval_row))
            eval_state = (
                "done"
                if _has_eval_results(run_dir)
                else "skipped"
                if e_sched == "SKIPPED"
                else _combine("pending", e_sched)
            )
        cfg: dict[str, Any] | None = None  # config.yaml, read at most once, at the first need
        params = planned.get(rid)
        if params is None:
            cfg = _read_config(run_dir)
            params = _axes_from_config(cfg, axes)
        last = _last_line(run_dir / store.METRICS_FILE) or {}
        elapsed = float(st.get("elapsed_s") or 0.0)
        if state == "running" and st.get("started_at"):
            elapsed = max(elapsed, time.time() - float(st["started_at"]))
        res: dict[str, Any] = {}
        if elapsed:
            with contextlib.suppress(OSError):
                res = _resources_of(cfg if cfg is not None else _read_config(run_dir))
        gpus = int(res.get("gpus_per_node", 0)) * int(res.get("nodes", 1))
        tail: list[str] = []
        if state == "failed":
            tail = _log_tail(train_row) or (st.get("error") or "").splitlines()[-15:]
        out.append(
            RunStatus(
                run_id=rid,
                params={a: params.get(a) for a in axes} if axes else dict(params),
                state=state,
                step=int(st.get("step") or last.get("step") or 0),
                total_steps=st.get("total_steps"),
                reward=last.get("reward_mean"),
                elapsed_s=elapsed,
                gpu_hours=elapsed * gpus / 3600.0,
                job_id=train_row["job_id"] if train_row else None,
                cluster=train_row["cluster"] if train_row else None,
                eval_state=eval_state,
                log_tail=tail,
            )
        )
    return out


def _read_config(run_dir: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((run_dir / store.CONFIG_FILE).read_text()) or {}


def _axes_from_config(cfg: dict[str, Any], axes: list[str]) -> dict[str, Any]:
    out = {}
    for a in axes:
        v: Any = cfg
        for part in a.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        out[a] = v
    return out


def _resources_of(cfg: dict[str, Any]) -> dict[str, Any]:
    return (cfg.get("model") or {}).get("resources") or {}


def wait_until_final(
    sweep_dir: str | Path,
    poll_s: float = 2.0,
    on_update: Callable[[list[RunStatus]], None] | None = None,
    timeout_s: float | None = None,
) -> list[RunStatus]:
    """Poll ``status`` until every run (and its eval) is final; returns the last statuses."""
    start = time.time()
    while True:
        runs = status(sweep_dir)
        if on_update is not None:
            on_update(runs)
        if all(r.state in store.FINAL_STATES and r.eval_state not in ("pending", "running") for r in runs):
            return runs
        if timeout_s is not None and time.time() - start > timeout_s:
            raise TimeoutError(f"runs of {sweep_dir} still not final after {timeout_s:.0f} s")
        time.sleep(poll_s)


# ---------------------------------------------------------------------------------------------------------
# Cancel
# ---------------------------------------------------------------------------------------------------------


def _cancel_rows(rows: list[dict[str, Any]]) -> None:
    slurm_ids = [r["job_id"] for r in rows if r["cluster"] == "slurm" and r["job_id"]]
    if slurm_ids:
        _run_cmd(["scancel", *slurm_ids])
        # submitit jobs ignore SIGTERM: Slurm kills them KillWait seconds later. Wait for that, so that no
        # dying job overwrites the 'cancelled' status afterwards.
        deadline = time.time() + 60
        while time.time() < deadline:
            q = _squeue()
            if q is None or not any(j in q for j in slurm_ids):
                break
            time.sleep(0.5)
    pids = []
    for r in rows:
        if r["cluster"] != "local":
            continue
        if r["job_id"] is None:
            continue  # queued in the supervisor: it skips runs whose status is cancelled
        if _pid_alive(int(r["job_id"]), "submitit"):
            Path(r["folder"], f"{r['job_id']}.cancelled").touch()
            os.kill(int(r["job_id"]), signal.SIGINT)  # submitit's local controller stops its tasks
            pids.append(int(r["job_id"]))
    deadline = time.time() + 5
    while pids and time.time() < deadline:
        pids = [p for p in pids if _pid_alive(p, "submitit")]
        time.sleep(0.1)
    for p in pids:
        os.kill(p, signal.SIGKILL)


def cancel(sweep_dir: str | Path, run_ids: list[str] | None = None) -> list[str]:
    """Cancel the live jobs of a sweep (or of the given runs); their status becomes 'cancelled'.
    Returns the run ids cancelled."""
    from filelock import FileLock

    sweep_dir = Path(sweep_dir)
    known = {p.name for p in store.run_dirs(sweep_dir)}
    if run_ids:
        unknown = [r for r in run_ids if r not in known]
        if unknown:
            raise UserError([Problem("RUN", f"no run {r!r} in {sweep_dir}") for r in unknown])
    targets = set(run_ids) if run_ids else known
    with FileLock(str(sweep_dir / LOCK_FILE)):
        rows = [r for key, r in _latest_rows(sweep_dir).items() if key[0] in targets]
        live = _live_jobs(rows)
        rows = [r for r in rows if (r["run_id"], r["kind"]) in live]
        cancelled = sorted(
            {r["run_id"] for r in rows}
            | {r for r in targets if store.read_status(sweep_dir / r).get("state") in ("pending", "running")}
        )
        for rid in cancelled:
            store.write_status(
                sweep_dir / rid, "cancelled", reason="cancelled by user", finished_at=time.time()
            )
        _cancel_rows(rows)
        for rid in cancelled:  # a dying job may have written its own state meanwhile
            if store.read_status(sweep_dir / rid).get("state") != "done":
                store.write_status(sweep_dir / rid, "cancelled", reason="cancelled by user")
    return cancelled


# ---------------------------------------------------------------------------------------------------------
# klsweep eval: the evaluation of finished runs (and a sweep's step-0 baselines) as jobs
# ---------------------------------------------------------------------------------------------------------


@dataclass
class EvalSubmission(evaluate.EvalOutcome):
    """What ``submit_eval`` did: the evaluation's outcome (in-process or waited for) and the jobs submitted."""

    jobs: list[str] = field(default_factory=list)  # scheduler job ids (local/slurm)


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
    request = evaluate.eval_request(Path(target), suite, backend, checkpoints, problems=problems)
    if cluster == "debug":
        done = evaluate.eval_batch(
            [str(r) for r in request.runs], request.eval_cfg, request.checkpoints, request.baselines
        )
        return EvalSubmission(results=done.results, errors=done.errors, skipped=request.skipped)
    return _submit_eval(request, cluster, wait)


def _submit_eval(request: evaluate.EvalRequest, cluster: str, wait: bool) -> EvalSubmission:
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
    if cluster == "local":
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(timeout_min=int(res.get("eval_timeout_min", 60)) * max(1, len(runs)))
        calls.append(("*", ([str(r) for r in runs], cfg, checkpoints, baselines)))
    else:
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
        ex.update_parameters(**slurm_parameters(res, cl, config.get("name", "run"), eval_job=True))
        calls += [(store.BASELINE_DIR, ([], cfg, checkpoints, [b])) for b in baselines]
        calls += [(r.name, ([str(r)], cfg, checkpoints, [])) for r in runs]
    with ex.batch():
        jobs = [ex.submit(evaluate.eval_batch, *args) for _, args in calls]
    rows = []
    for (run_id, _), job in zip(calls, jobs, strict=True):
        ids = [r.name for r in runs] + [store.BASELINE_DIR] if run_id == "*" else [run_id]
        rows += [job_row(i, "eval", cluster, job.job_id, folder, supervisor=None) for i in ids]
    with FileLock(str(sweep_dir / LOCK_FILE)):
        for row in rows:
            store.append_jsonl(sweep_dir / store.JOBS_FILE, row)
    out = EvalSubmission(skipped=request.skipped, jobs=[j.job_id for j in jobs])
    if wait:
        for job in jobs:
            done = job.result()
            out.results += done.results
            out.errors.update(done.errors)
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == SUPERVISE:
        supervise(sys.argv[2])
    else:
        sys.exit(f"usage: python -m klsweep.launcher {SUPERVISE} QUEUE.pkl (started by klsweep run)")
