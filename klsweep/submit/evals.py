"""Submitting ``klsweep eval``: what to evaluate (``eval_request``) and where (the evaluation jobs).

``eval_request`` checks the command's request (``TARGET``, ``--suite``, ``--backend``, ``--checkpoints``);
each job runs ``klsweep.evaluate.eval_batch``: in this process (debug), the runs split over ``min(cores, runs)``
submitit local jobs running side by side (lm-eval loaded once per job), or one Slurm job per run and per
baseline. The jobs are recorded in the sweep's ``jobs.jsonl`` as ``eval``
jobs, like the evals chained to training by ``klsweep.submit.submit``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from klsweep import engines, evaluate, store
from klsweep.config import EvalSection, ModelSection
from klsweep.environment import usable_cores
from klsweep.errors import Problem, UserError
from klsweep.submit import joblogs
from klsweep.submit.scheduler import (
    LOCK_FILE,
    controller_problem,
    job_row,
    process_start,
    submission_folder,
)
from klsweep.submit.slurm import SubmissionRefused, chunks, max_array_size, sbatch, slurm_parameters
from klsweep.submit.state import poll_delay, stale_reason, time_left
from klsweep.submit.sweep import CLUSTERS

EVALUATED_STATES = ("done", "diverged")  # the run states klsweep eval evaluates


@dataclass
class EvalSubmission(evaluate.EvalOutcome):
    """What ``submit_eval`` did: the evaluation's outcome (in-process or waited for) and the jobs submitted."""

    jobs: list[str] = field(default_factory=list)  # scheduler job ids (local/slurm)
    logs: dict[str, str] = field(default_factory=dict)  # a failed run's folder -> its eval job's log (wait)
    eval: str = ""  # which eval, in words (``evaluate.eval_label``): suite, problems per task, eval hash
    # the results.json of the runs and baselines scored already under these settings: not evaluated again
    scored: list[Path] = field(default_factory=list)
    todo: str = ""  # what is evaluated, in words: "2 runs and the step-0 baseline of tiny"

    @property
    def nothing_left(self) -> bool:
        """Every run and baseline of the request was scored already: no job, no evaluation."""
        return bool(self.scored) and not self.jobs and not self.results and not self.errors


@dataclass
class EvalProgress:
    """How far an evaluation that is waited for has come: the checkpoints (and step-0 baselines) scored of
    those it scores, and the seconds left at the pace of those scored (``submit.time_left``: its jobs' time so
    far, lm-eval's start included, over the checkpoints they scored; None until one is)."""

    scored: int
    total: int
    left_s: float | None
    jobs: int  # jobs still running


def check_target(target: Path) -> None:
    """An eval writes into its target folder: refuse (exit 2) one this process cannot write to, before any
    other check reads it; and a rehearsal's folder (``store.refuse_rehearsal``)."""
    if Path(target).is_dir():
        store.check_writable(target, str(target), "a sweep or run folder you can write to (results go there)")
        store.refuse_rehearsal(target)


def submit_eval(
    target: Path,
    suite: str | None = None,
    backend: str | None = None,
    cluster: str = "local",
    checkpoints: str = "last",
    wait: bool = False,
    jobs: int | None = None,
    overrides: Sequence[str] = (),
    config_dirs: Sequence[str] = (),
    on_progress: Callable[[EvalProgress], None] | None = None,
) -> EvalSubmission:
    """``klsweep eval``: evaluate a run folder, or a sweep's finished runs (done or diverged) and its step-0
    baselines (one per model); see ``eval_request`` for ``suite``, ``backend`` and ``overrides``.
    ``cluster`` debug evaluates in this process; local splits the runs and baselines over ``jobs`` submitit
    jobs run side by side (default ``min(cores, runs)``; lm-eval loaded once per job); slurm one job per run
    and per baseline. ``wait``: wait for the jobs and collect their outcome. ``config_dirs``: more config folders
    whose ``eval/`` may hold ``suite`` (``--config-dir``). ``on_progress``: called while it waits for the jobs,
    every few seconds (``EvalProgress``)."""
    problems = []
    if cluster not in CLUSTERS:
        problems.append(Problem("--cluster", f"unknown cluster {cluster!r}", ", ".join(CLUSTERS)))
    check_target(target)
    request = eval_request(
        Path(target), suite, backend, checkpoints, overrides, problems=problems, config_dirs=config_dirs
    )
    _check_inside(Path(target), request)
    engines.require(  # the jobs run in this environment
        {"model": asdict(evaluate.run_config(r).model), "eval": request.eval_cfg} for r in request.runs
    )
    todo, already = _left_to_do(request)
    what = [f"{len(todo.runs)} run{'s' if len(todo.runs) != 1 else ''}"] if todo.runs else []
    what += [f"the step-0 baseline of {m.name}" for _, m in todo.baselines]
    if not todo.runs and not todo.baselines:
        out = EvalSubmission(skipped=request.skipped, scored=already)
    elif cluster == "debug":
        done = evaluate.eval_batch(
            [str(r) for r in todo.runs], todo.eval_cfg, todo.checkpoints, todo.baselines
        )
        out = EvalSubmission(
            results=done.results, errors=done.errors, skipped=request.skipped, scored=already
        )
    else:
        out = _submit(todo, cluster, wait, jobs, resources_of=request.runs[0], on_progress=on_progress)
        out.scored = already
    out.eval = request.label
    out.todo = " and ".join(what)
    return out


def _left_to_do(request: EvalRequest) -> tuple[EvalRequest, list[Path]]:
    """The request less the runs and baselines scored already under its settings (``evaluate.scored``: every
    checkpoint it would score has its results.json), and their results.json."""
    suite = evaluate.Suite(evaluate.as_eval_section(request.eval_cfg))
    runs, already = [], []
    for run in request.runs:
        found = evaluate.scored(run, suite, request.checkpoints)
        if found is None:
            runs.append(run)
        else:
            already += found
    baselines = []
    for sweep_dir, model in request.baselines:
        path = evaluate.baseline_results(Path(sweep_dir), model, suite)
        if path.is_file():
            already.append(path)
        else:
            baselines.append((sweep_dir, model))
    return dataclasses.replace(request, runs=runs, baselines=baselines), already


@dataclass
class EvalRequest:
    """What ``klsweep eval`` evaluates, checked and resolved (``eval_request``)."""

    runs: list[Path]  # a sweep's finished runs, or the one run folder
    skipped: dict[str, str]  # run folder -> why it is left out (its state)
    baselines: list[tuple[str, ModelSection]]  # (sweep folder, a run's model) per model of a sweep
    eval_cfg: dict[str, Any]  # the EvalSection as a dict
    checkpoints: str  # last | all

    @property
    def label(self) -> str:
        """Which eval, in words (``evaluate.eval_label``): suite, problems per task, eval hash."""
        settings = evaluate.eval_settings(evaluate.as_eval_section(self.eval_cfg))
        return evaluate.eval_label(settings, evaluate.eval_hash(settings))


def _targets(target: Path) -> tuple[list[Path], dict[str, str], Path | None]:
    """(runs to evaluate, runs left out -> why, the sweep folder or None for a single run). A run whose
    status.json or config.yaml cannot be read is left out, named with what to do; a single run raises."""
    if (target / store.CONFIG_FILE).is_file():
        evaluate.run_config(target)  # UnreadableFile
        return [target], {}, None
    runs = store.run_dirs(target)
    if not runs:
        raise UserError(
            Problem(
                "TARGET",
                f"{target} is neither a run folder nor a sweep with runs",
                "results/<sweep>[/<run-id>]",
            )
        )
    chosen, skipped = [], {}
    for run in runs:
        try:
            status = store.read_status(run)
            evaluate.run_config(run)
        except store.UnreadableFile as e:
            skipped[str(run)] = f"unreadable: {e.message}"
            continue
        state = status.get("state", "pending")
        stale = store.stale_end(run, status)
        if stale is not None:  # nothing to score where it ended: an earlier checkpoint is not its result
            skipped[str(run)] = stale_reason(status, *stale)
        elif state in EVALUATED_STATES:
            chosen.append(run)
        else:
            skipped[str(run)] = state
    return chosen, skipped, target


def _runs_eval(runs: list[Path], suite: str | None, config_dirs: Sequence[str] = ()) -> EvalSection:
    """The runs' own eval settings (their grid's: ``eval.limit`` and every other key it set), or those of the
    suite ``suite`` names: the runs' own when they are of that suite, else ``eval/<suite>.yaml`` of
    ``config_dirs`` or ``conf/``."""
    own = [evaluate.run_config(r).eval for r in runs]
    same = bool(own) and all(o == own[0] for o in own)
    if suite is not None and not (same and own[0].suite == suite):
        return evaluate.load_suite(suite, config_dirs)
    if not own:
        raise UserError(
            Problem("TARGET", "no readable run to take the eval settings from", "pass --suite NAME")
        )
    if not same:
        raise UserError(Problem("--suite", "the runs have different eval settings", "pass --suite NAME"))
    return evaluate.as_eval_section(own[0])


def eval_request(
    target: Path,
    suite: str | None = None,
    backend: str | None = None,
    checkpoints: str = "last",
    overrides: Sequence[str] = (),
    *,
    problems: Sequence[Problem] = (),
    config_dirs: Sequence[str] = (),
) -> EvalRequest:
    """``klsweep eval``'s request: a run folder, or a sweep's finished runs (done or diverged) and its step-0
    baselines (one per model). ``suite`` names ``eval/<suite>.yaml`` of ``config_dirs`` (``--config-dir``) or
    ``conf/`` (default: the runs' own eval settings, as their grid set them; the runs' own too when ``suite``
    names their suite); ``overrides`` (``eval.limit=150``, ...) and ``backend`` change them. Unknown task names
    fail here, before anything is submitted.
    ``problems``: the caller's own findings about the request (the submission layer's ``--cluster``),
    reported with these in one ``UserError``."""
    target = Path(target)
    problems = list(problems)
    if checkpoints not in evaluate.CHECKPOINT_CHOICES:
        problems.append(Problem("--checkpoints", f"{checkpoints!r}", ", ".join(evaluate.CHECKPOINT_CHOICES)))
    if backend is not None and backend not in evaluate.BACKENDS:
        problems.append(Problem("--backend", f"unknown backend {backend!r}", ", ".join(evaluate.BACKENDS)))
    if not target.is_dir():
        problems.append(Problem("TARGET", f"no such folder: {target}", "results/<sweep>[/<run-id>]"))
    if problems:
        raise UserError(problems, title="invalid eval request")
    runs, skipped, sweep_dir = _targets(target)
    readable = [r for r in store.run_dirs(target) if not skipped.get(str(r), "").startswith("unreadable")]
    cfg = _runs_eval(runs or readable, suite, config_dirs)
    if backend is not None:
        cfg.backend = backend
    cfg = evaluate.with_overrides(evaluate.as_eval_section(cfg), list(overrides))
    evaluate.resolve_tasks(cfg)
    models: dict[str, ModelSection] = {}
    for run in runs:
        model = evaluate.run_config(run).model
        models.setdefault(evaluate.model_key(model), model)
    baselines = [(str(sweep_dir), m) for m in models.values()] if sweep_dir is not None else []
    return EvalRequest(runs, skipped, baselines, asdict(cfg), checkpoints)


def local_eval_jobs(runs: int, jobs: int | None = None) -> int:
    """How many local eval jobs: ``jobs``, else one per core this process may use; never more than runs."""
    return max(1, min(jobs or usable_cores(), runs))


def _check_inside(target: Path, request: EvalRequest) -> None:
    """``UserError`` (exit 2, before anything is written) when a folder the evaluation writes in (a run's, the
    baselines', their ``eval/<hash>/`` and its checkpoint folders) or what is in it is a symbolic link out of
    the sweep folder (``TARGET``, or a run folder's sweep): klsweep writes only inside it."""
    root = target.parent if (target / store.CONFIG_FILE).is_file() else target
    baselines = [Path(b[0]) / store.BASELINE_DIR / evaluate.model_key(b[1]) for b in request.baselines]
    hash_ = evaluate.eval_hash(evaluate.eval_settings(evaluate.as_eval_section(request.eval_cfg)))
    scored = [f / store.EVAL_DIR / hash_ for f in [*request.runs, *baselines]]
    below = [c for h in scored if h.is_dir() for c in sorted(h.iterdir()) if c.is_dir()]
    store.refuse_links_out(root, [target, *request.runs, *baselines, *scored, *below])


def _submit(
    request: EvalRequest,
    cluster: str,
    wait: bool,
    n_jobs: int | None = None,
    resources_of: Path | None = None,
    on_progress: Callable[[EvalProgress], None] | None = None,
) -> EvalSubmission:
    """Submit the evaluation with submitit and record the jobs in the sweep's jobs.jsonl. ``resources_of``: the
    run whose resources and cluster settings the jobs take (default: the request's first run)."""
    import submitit
    from filelock import FileLock

    runs, baselines = request.runs, request.baselines
    cfg, checkpoints = request.eval_cfg, request.checkpoints
    if not runs and not baselines:
        return EvalSubmission(skipped=request.skipped)
    sweep_dir = Path(baselines[0][0]) if baselines else runs[0].parent
    down = controller_problem() if cluster == "slurm" else None
    if down is not None:
        raise SubmissionRefused(down, len(runs) + len(baselines), [])
    folder = submission_folder(sweep_dir)
    config = evaluate.run_config(resources_of or runs[0])
    res, cl = asdict(config.model.resources), asdict(config.cluster)
    calls: list[tuple[list[str], tuple[Any, ...]]] = []  # (run ids in jobs.jsonl, job arguments)
    # each run's part of the job's log in its logs/ (one job evaluates several runs: their parts copied)
    own_log = functools.partial(joblogs.kept, kind="eval")
    if cluster == "local":
        ex = _detached_executor(folder)
        # the work dealt round-robin (baselines first) to jobs that run side by side, each loading lm-eval once
        k = local_eval_jobs(len(runs), n_jobs)
        threads = max(1, usable_cores() // k)  # each job's share: torch's default, every core, oversubscribes
        work: list[tuple[str, Any]] = [("baseline", b) for b in baselines] + [("run", r) for r in runs]
        per_job = max(len(work[i::k]) for i in range(k))
        ex.update_parameters(timeout_min=int(res.get("eval_timeout_min", 60)) * per_job)
        for i in range(k):
            part = work[i::k]
            mine = [str(r) for kind, r in part if kind == "run"]
            bases = [b for kind, b in part if kind == "baseline"]
            ids = [Path(r).name for r in mine] + ([store.BASELINE_DIR] if bases else [])
            shared = functools.partial(own_log, shared=len(part) > 1)
            calls.append((ids, (mine, cfg, checkpoints, bases, shared, threads)))
    else:
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
        ex.update_parameters(**slurm_parameters(res, cl, config.name, eval_job=True))
        calls += [([store.BASELINE_DIR], ([], cfg, checkpoints, [b], own_log)) for b in baselines]
        calls += [([r.name], ([str(r)], cfg, checkpoints, [], own_log)) for r in runs]
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
    for (ids, _), job in zip(calls, jobs, strict=False):
        # a local job by its pid and start (its command line is empty until its program is loaded)
        start = {"job_start": process_start(int(job.job_id))} if cluster == "local" else {}
        rows += [job_row(i, "eval", cluster, job.job_id, folder, supervisor=None, **start) for i in ids]
    with FileLock(str(sweep_dir / LOCK_FILE)):
        for row in rows:
            store.append_jsonl(sweep_dir / store.JOBS_FILE, row)
    if refused is not None:
        if not jobs:
            shutil.rmtree(folder, ignore_errors=True)
        raise SubmissionRefused(refused.said, len(calls) - len(jobs), rows) from refused
    out = EvalSubmission(skipped=request.skipped, jobs=[j.job_id for j in jobs])
    if wait:
        if on_progress is not None:
            _follow(jobs, _results_of(request), on_progress)
        for (_, args), job in zip(calls, jobs, strict=False):
            try:
                done = job.result()
            except (
                Exception
            ) as e:  # killed, out of memory, or failed where the job records nothing (full disk)
                done = _ended_unscored(job, e, *args[:4])
            out.results += done.results
            out.errors.update(done.errors)
        by_run = {row["run_id"]: row for row in rows}
        for failed in out.errors:
            log = joblogs.run_log(failed, by_run.get(Path(failed).name))
            if log is not None:
                out.logs[failed] = str(log)
    return out


def _results_of(request: EvalRequest) -> list[Path]:
    """The results.json the request's evaluation writes: each run's checkpoints' and each baseline's."""
    suite = evaluate.Suite(evaluate.as_eval_section(request.eval_cfg))
    paths = [p for run in request.runs for p in evaluate.results_paths(run, suite, request.checkpoints)]
    return paths + [evaluate.baseline_results(Path(s), m, suite) for s, m in request.baselines]


def _follow(jobs: list[Any], results: list[Path], on_progress: Callable[[EvalProgress], None]) -> None:
    """Call ``on_progress`` until every job has ended: the results written of ``results`` and the time left at
    their pace (every job started when submitted; a job's time counts until it ends)."""
    import time

    start = last_change = time.time()
    ended: dict[int, float] = {}
    seen = -1
    while True:
        now = time.time()
        for i, job in enumerate(jobs):
            if i not in ended and _ended(job):
                ended[i] = now
        scored = sum(p.is_file() for p in results)
        if scored != seen:
            seen, last_change = scored, now
        running = len(jobs) - len(ended)
        spent = sum(ended.get(i, now) - start for i in range(len(jobs)))
        left = time_left(spent, scored, len(results) - scored, running)
        on_progress(EvalProgress(scored, len(results), left, running))
        if not running:
            return
        time.sleep(min(5.0, poll_delay(now - last_change)))


def _ended(job: Any) -> bool:
    """Whether a job has ended; one whose state cannot be had has (its result says why: ``_ended_unscored``)."""
    try:
        return bool(job.done())
    except Exception:
        return True


def _detached_executor(folder: Path) -> Any:
    """submitit's local executor, each job's controller started in a session of its own, as training's
    supervisor is: Ctrl-C of the command that waits for the jobs (SIGINT to its process group), or its
    terminal closing, stops the waiting, not the evals (docs/FAULTS.md)."""
    import submitit
    from submitit.local import local as submitit_local

    class Detached(submitit.LocalExecutor):
        def _submit_command(self, command: str) -> Any:
            submitit_local.subprocess = _OwnSession()  # type: ignore[assignment]
            try:
                return super()._submit_command(command)
            finally:
                submitit_local.subprocess = subprocess

    return Detached(folder=folder)


class _OwnSession:
    """``subprocess`` as submitit's local executor sees it while it starts a job: every process in a new
    session."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, **kwargs: Any) -> subprocess.Popen:  # noqa: N802 (subprocess's name)
        return subprocess.Popen(*args, **{**kwargs, "start_new_session": True})


def _ended_unscored(
    job: Any,
    error: Exception,
    run_dirs: list[str],
    cfg: dict[str, Any],
    checkpoints: str,
    baselines: list[tuple[str, ModelSection]],
) -> evaluate.EvalOutcome:
    """What an eval job that ended without its outcome did: the runs (and baselines) it scored before it
    ended, and why each other one is not scored, recorded in the run's ``status.json`` (``eval_error``, what
    ``klsweep status`` shows) where it can still be written."""
    why = _why_ended(job, error)
    suite = evaluate.Suite(evaluate.as_eval_section(cfg))
    out = evaluate.EvalOutcome()
    for sweep_dir, model in baselines:
        path = evaluate.baseline_results(Path(sweep_dir), model, suite)
        if path.is_file():
            out.results.append(path)
        else:
            out.errors[f"{sweep_dir}/{store.BASELINE_DIR}"] = why
    for run in run_dirs:
        found = evaluate.scored(Path(run), suite, checkpoints)
        if found is not None:
            out.results += found
            continue
        out.errors[run] = f"{Path(run).name}: {why}"
        with contextlib.suppress(OSError, store.UnreadableFile):  # a full disk: status derives it
            store.write_status(run, store.read_status(run)["state"], eval_error=out.errors[run])
    return out


def _why_ended(job: Any, error: Exception) -> str:
    """Why an eval job ended without its outcome, in one line: the error it failed with (its traceback's last
    line), or how its process ended."""
    from submitit.core.utils import FailedJobError

    if isinstance(error, FailedJobError):
        parts = str(error).split("----------------------\n")  # submitit's message: the trace between rulers
        trace = parts[1] if len(parts) > 2 else ""
        last = next((line.strip() for line in reversed(trace.splitlines()) if line.strip()), "")
        return f"its eval job {job.job_id} failed: {last or type(error).__name__}"
    code = getattr(getattr(job, "_process", None), "returncode", None)
    how = "ended"
    if isinstance(code, int) and code < 0:
        with contextlib.suppress(ValueError):
            how = f"was killed ({signal.Signals(-code).name})"
    return (
        f"its eval job {job.job_id} {how} before it scored it, leaving no result (killed? out of memory? "
        "a full disk?)"
    )
