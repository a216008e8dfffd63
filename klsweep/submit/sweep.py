"""Submitting a sweep: which of a plan's runs to train, resume, evaluate or skip, decided under the sweep's
lock, and the sweep's own files (``sweep.yaml``, each run's ``config.yaml``, the ``jobs.jsonl`` records).

Decisions are taken under a file lock on ``results/<sweep>/.lock`` and every submission is recorded in
``jobs.jsonl`` (run id, kind, cluster, job id, submitit folder, time), so two concurrent ``klsweep run`` never
submit a run twice; a run whose training lock a process holds (``store.trainer_of``: a trainer the records do
not know of) is live too (``skip-live``). A sweep or run folder that is a symbolic link out of the results
folder is refused (exit 2) before anything is written. The back ends (``klsweep.submit.local``,
``klsweep.submit.slurm``) submit the jobs.

No run claims a job it does not have: when the scheduler refuses a submission
(``klsweep.submit.slurm.SubmissionRefused``), the jobs submitted before the refusal are recorded and every other
run is rolled back (its status as it was, a run folder made by this call removed, likewise ``sweep.yaml`` and
the sweep folder when nothing was submitted). A run whose status.json cannot be read is set aside
(``skip-unreadable``, named with what to do) and the others are submitted.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klsweep import engines, store
from klsweep.config import run_differences, run_file_text
from klsweep.errors import Problem, UserError
from klsweep.submit.jobs import has_eval_results, wants_eval
from klsweep.submit.local import submit_debug, submit_local
from klsweep.submit.scheduler import (
    LOCK_FILE,
    cancel_rows,
    key,
    latest_rows,
    live_jobs,
    row_state,
    scheduler_states,
)
from klsweep.submit.slurm import SubmissionRefused, submit_slurm
from klsweep.submit.state import stale_reason

CLUSTERS = ("local", "slurm", "debug")


@dataclass
class SubmitResult:
    sweep_dir: Path
    cluster: str
    # run id -> submit | resume | eval | skip-done | skip-live | skip-failed | skip-unreadable | skip-other |
    # skip-incomplete
    actions: dict[str, str]
    jobs: list[dict[str, Any]] = field(default_factory=list)  # the jobs.jsonl rows written
    sbatch_calls: int = 0
    unreadable: dict[str, str] = field(default_factory=dict)  # run id -> the file, what is wrong, what to do
    # run id -> what is wrong with a run that is not the grid's or not finished after all, and what is done
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def submitted(self) -> list[str]:
        return [r for r, a in self.actions.items() if a in ("submit", "resume", "eval")]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.actions.values():
            out[a] = out.get(a, 0) + 1
        return out

    def hints(self, failed_runs: bool = True) -> list[str]:
        """What the user may want to do about the runs not submitted: one line each (``failed_runs=False``:
        not the failed or cancelled runs', which the caller says itself)."""
        lines = []
        failed = self.counts().get("skip-failed", 0) if failed_runs else 0
        if failed:
            lines.append(
                f"{failed} run(s) failed or were cancelled before and were not resubmitted: "
                "rerun with --retry-failed to resubmit them"
            )
        lines += [f"run {rid} set aside: {message}" for rid, message in self.unreadable.items()]
        lines += [f"run {rid}: {message}" for rid, message in self.notes.items()]
        return lines


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
    retry_failed: bool = False,
    force: bool = False,
    *,
    add_to_folder: bool = True,
    chain_eval: bool = True,
    train_fn: Callable[[Path], Any] | None = None,
    eval_fn: Callable[..., Any] | None = None,
    on_build: Callable[[Path], None] | None = None,
) -> SubmitResult:
    """Write the sweep's files and submit what is not done yet; see the module docstring.

    ``add_to_folder=False`` (the CLI's default) refuses a folder holding runs the plan does not have
    (``check_folder``). ``chain_eval=False`` submits training only, even when the runs name an eval suite (``klsweep study``
    evaluates the whole sweep afterwards in one job). ``train_fn``/``eval_fn`` replace
    ``klsweep.job.train_run``/``klsweep.evaluate.eval_run`` (tests). ``on_build(folder)`` is called before the
    tiny model is built here (once, ~15 s on a CPU), to say so."""
    from filelock import FileLock

    if cluster_kind not in CLUSTERS:
        raise UserError(Problem("--cluster", f"unknown cluster {cluster_kind!r}", ", ".join(CLUSTERS)))
    # before anything is written (the eval too when it is not chained: klsweep study evaluates afterwards)
    engines.require(r.config for r in plan.runs)
    sweep_dir = Path(plan.sweep_dir)
    store.check_writable(sweep_dir, str(sweep_dir), "a results folder you can write to: --out DIR")
    store.refuse_rehearsal(sweep_dir)  # its done runs are a rehearsal's tiny ones: never skipped as done
    _check_inside(plan)
    check_folder(plan, add_to_folder)
    sweep_existed = sweep_dir.exists()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    _prepare_models(plan, on_build)
    plan = _pinned(plan)
    result = SubmitResult(sweep_dir=sweep_dir, cluster=cluster_kind, actions={})
    undo = _Undo(sweep_dir)
    refused: SubmissionRefused | None = None
    with FileLock(str(sweep_dir / LOCK_FILE)):
        undo.keep(sweep_dir / store.SWEEP_FILE)
        write_sweep_file(plan, cluster_kind)
        rows = latest_rows(sweep_dir)
        live = live_jobs(rows.values())
        adopt_merged(plan, live)
        if force:
            cancel_rows([r for k, r in rows.items() if k in live])
            live = set()
        train: list[Any] = []
        evals: list[Any] = []  # eval-only (training already done)
        slurm_evals: dict[str, str] = {}

        def eval_state(row: dict[str, Any]) -> str:
            """An eval row's state; one sacct call for all the Slurm ones, at the first need."""
            if row["cluster"] != "slurm":
                return row_state(row)
            if not slurm_evals:
                slurm_evals.update(
                    scheduler_states(
                        [r for (_, kind), r in rows.items() if kind == "eval" and r["cluster"] == "slurm"]
                    )
                )
            return slurm_evals[key(row)]

        for run in plan.runs:
            run_dir = Path(run.run_dir)
            if force and run_dir.exists() and _trainer_gone(run_dir):
                shutil.rmtree(run_dir)
            undo.keep_run(run.id, run_dir)
            other = _another_run(run, run_dir)  # before config.yaml is rewritten: what the folder trained
            if other is not None:
                result.actions[run.id], result.notes[run.id] = "skip-other", other
                continue
            run_dir.mkdir(parents=True, exist_ok=True)
            cfg_text = run_file_text(run.config)
            if _text(run_dir / store.CONFIG_FILE) != cfg_text:  # also repairs a config.yaml cut short
                store.atomic_write_text(run_dir / store.CONFIG_FILE, cfg_text)
            try:
                action, note = _decide(run, rows, live, retry_failed, chain_eval, eval_state)
            except store.UnreadableFile as e:
                action, note = "skip-unreadable", None
                result.unreadable[run.id] = e.message
            result.actions[run.id] = action
            if note is not None:
                result.notes[run.id] = note
            if action in ("submit", "resume"):
                store.write_status(run_dir, "pending", reason=action, error=None, finished_at=None)
                train.append(run)
            elif action == "eval":
                evals.append(run)
        if train or evals:
            submit_fn = {"local": submit_local, "slurm": submit_slurm, "debug": submit_debug}[cluster_kind]
            if not chain_eval:
                train = [_without_eval(r) for r in train]
            try:
                result.jobs, result.sbatch_calls = submit_fn(sweep_dir, train, evals, train_fn, eval_fn)
            except SubmissionRefused as e:
                for row in e.rows:  # these jobs exist
                    store.append_jsonl(sweep_dir / store.JOBS_FILE, row)
                undo.roll_back(keep={r["run_id"] for r in e.rows})
                refused = e
            else:
                for row in result.jobs:
                    store.append_jsonl(sweep_dir / store.JOBS_FILE, row)
    if refused is not None:
        if not sweep_existed and not store.run_dirs(sweep_dir) and not refused.rows:
            shutil.rmtree(sweep_dir, ignore_errors=True)  # made by this call, for nothing
        raise refused
    return result


def _check_inside(plan: Any) -> None:
    """``UserError`` (exit 2, before anything is written) when the sweep folder, a run folder or what is in them
    is a symbolic link out of the results folder (``--out``): klsweep writes only inside it."""
    sweep_dir = Path(plan.sweep_dir)
    store.refuse_links_out(sweep_dir.parent, [sweep_dir, *(Path(r.run_dir) for r in plan.runs)])


def _another_run(run: Any, run_dir: Path) -> str | None:
    """Why the run folder holds another run than the grid's ``run``, or None: it trained something (a state
    past pending, a checkpoint, a metrics row) under a config.yaml that differs from the grid's in keys the
    run id sees (``config.run_differences``: a rehearsal's folder copied in, train.steps 2 against 8). Such a
    folder is neither skipped as done nor trained over: its config.yaml is left as it is. A config.yaml that
    cannot be read is rewritten, as before (the run's status and checkpoints say the rest)."""
    config_file = run_dir / store.CONFIG_FILE
    if not config_file.is_file():
        return None
    try:
        trained = (
            store.read_status(run_dir).get("state", "pending") != "pending"
            or bool(store.checkpoints(run_dir))
            or (run_dir / store.METRICS_FILE).is_file()
        )
        differ = run_differences(run_dir, run.config) if trained else []
    except store.UnreadableFile:
        return None
    if not differ:
        return None
    shown = "; ".join(f"{key} {_value(was)} there, {_value(now)} in the grid" for key, was, now in differ[:4])
    more = f" and {len(differ) - 4} more" if len(differ) > 4 else ""
    return (
        f"not the grid's run: its folder trained another configuration ({shown}{more}); neither skipped as "
        f"done nor trained over, its config.yaml kept. Move it away (mv {run_dir} ELSEWHERE) or remove it, "
        "then rerun to train the grid's run"
    )


def _value(v: Any) -> str:
    return "(none)" if v is None else repr(v) if isinstance(v, str) else str(v)


def _trainer_gone(run_dir: Path, wait_s: float = 10.0) -> bool:
    """Whether no process holds the run's training lock, waiting up to ``wait_s`` for a trainer just stopped
    (``--force``) to exit."""
    deadline = time.time() + wait_s
    while store.trainer_of(run_dir) is not None:
        if time.time() > deadline:
            return False
        time.sleep(0.2)
    return True


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


class _Undo:
    """What ``submit`` changed before the back end submitted, so that it can be put back when the scheduler
    refuses: the run folders it made, the status.json files it wrote, sweep.yaml."""

    def __init__(self, sweep_dir: Path):
        self.sweep_dir = sweep_dir
        self.files: dict[Path, bytes | None] = {}  # file -> its bytes before (None: it did not exist)
        self.runs: dict[str, tuple[Path, bool]] = {}  # run id -> (its folder, whether it existed)

    def keep(self, path: Path) -> None:
        try:
            self.files[path] = path.read_bytes()
        except OSError:
            self.files[path] = None

    def keep_run(self, run_id: str, run_dir: Path) -> None:
        self.runs[run_id] = (run_dir, run_dir.exists())
        if run_dir.exists():
            self.keep(run_dir / store.STATUS_FILE)

    def roll_back(self, keep: set[str]) -> None:
        """Put back every run but those in ``keep`` (they got a job), and sweep.yaml when no run got one."""
        for run_id, (run_dir, existed) in self.runs.items():
            if run_id in keep:
                continue
            if not existed:
                shutil.rmtree(run_dir, ignore_errors=True)
            else:
                self._restore(run_dir / store.STATUS_FILE)
        if not keep:
            self._restore(self.sweep_dir / store.SWEEP_FILE)

    def _restore(self, path: Path) -> None:
        if path not in self.files:
            return
        before = self.files[path]
        if before is None:
            path.unlink(missing_ok=True)
        elif _text(path) is None or path.read_bytes() != before:
            store.atomic_write_text(path, before.decode())


def _prepare_models(plan: Any, on_build: Callable[[Path], None] | None = None) -> None:
    """Build the project's tiny model here, once, if a run uses it: otherwise every job (every rank) would
    build it, or wait on its lock, while holding its allocation."""
    if any(r.config.get("model", {}).get("path") == "tiny" for r in plan.runs):
        from klsweep import tinymodel

        tinymodel.tiny_model_path(on_build=on_build)


def _pinned(plan: Any) -> Any:
    """The plan with each hub model's commit recorded in its runs' configs (``klsweep.fetch.pin_revisions``)."""
    from klsweep.fetch import pin_revisions

    configs = pin_revisions([r.config for r in plan.runs], [Path(r.run_dir) for r in plan.runs])
    runs = [
        r if c is r.config else dataclasses.replace(r, config=c)
        for r, c in zip(plan.runs, configs, strict=True)
    ]
    return dataclasses.replace(plan, runs=runs)


def _without_eval(run: Any) -> Any:
    """The same planned run with no eval chained (its config.yaml on disk keeps its eval settings)."""
    config = {**run.config, "eval": {**run.config.get("eval", {}), "suite": "none"}}
    return dataclasses.replace(run, config=config)


def _decide(
    run: Any,
    rows: dict[tuple[str, str], dict],
    live: set[tuple[str, str]],
    retry_failed: bool,
    chain_eval: bool = True,
    eval_row_state: Callable[[dict[str, Any]], str] | None = None,
) -> tuple[str, str | None]:
    """What to do with a run, and a line to say of it (a done run not finished after all) or None."""
    run_dir = Path(run.run_dir)
    if (run.id, "train") in live or store.trainer_of(run_dir) is not None:  # its trainer's lock: live
        return "skip-live", None
    status = store.read_status(run_dir)
    state = status.get("state", "pending")
    stale = store.stale_end(run_dir, status)
    if stale is not None:  # its final checkpoint gone or not whole, never scored: not finished
        if stale[1] is None and not retry_failed:
            return "skip-incomplete", stale_reason(status, *stale)
        return "resume", stale_reason(status, *stale, submitted=True)
    if state in store.TRAINED_STATES:
        if state == "done" and chain_eval and wants_eval(run) and not has_eval_results(run_dir):
            if (run.id, "eval") in live:
                return "skip-live", None
            last = rows.get((run.id, "eval"))
            if last is None or retry_failed:
                return "eval", None
            failed = (eval_row_state or row_state)(last) in ("FAILED", "CANCELLED")
            return ("skip-failed" if failed else "eval"), None
        return "skip-done", None
    if state in store.STOPPED_STATES and not retry_failed:
        return "skip-failed", None
    trained = store.checkpoints(run_dir) or state in ("running", "failed", "cancelled")
    return ("resume" if trained else "submit"), None


MERGED_DIR = "merged"  # under a sweep: the folders of runs merged into another one (no run folder of its own)


def adopt_merged(plan: Any, live: set[tuple[str, str]]) -> None:
    """The folders of runs trained under an id their run had before merging (``PlannedRun.aliases``: no-KL
    runs crossed with estimators): the first that holds a config.yaml is moved to the run's id, when that
    folder does not exist yet, so the run resumes (or is done); the others, the same training again, are moved
    to ``<sweep>/merged/`` where no report counts them as seeds. A folder whose trainer is live stays."""
    sweep_dir = Path(plan.sweep_dir)
    for run in plan.runs:
        for old in run.aliases:
            src = sweep_dir / old
            if not (src / store.CONFIG_FILE).is_file() or src.is_symlink():
                continue
            if (old, "train") in live or store.trainer_of(src) is not None:
                continue
            if not Path(run.run_dir).exists():
                src.rename(run.run_dir)
            else:
                (sweep_dir / MERGED_DIR).mkdir(exist_ok=True)
                src.rename(sweep_dir / MERGED_DIR / old)


ADD_FLAG = "--add-to-folder"


def other_grids_runs(plan: Any) -> list[str]:
    """The runs of the plan's sweep folder (its run folders, and the runs its ``sweep.yaml`` lists) that are not
    this plan's: another grid's of the same ``name:``, or this grid's under other overrides. A grid that only
    adds runs (more seeds, tiny-full over tiny) has none; nor has a plan all of whose runs the folder holds
    already (a subset rerun, e.g. ``seed=0``, or the first grid again after another was added to the folder):
    it adds nothing to the folder, so nothing of two grids is mixed by it."""
    sweep_dir = Path(plan.sweep_dir)
    ids = {r.id for r in plan.runs}
    ours = ids | {a for r in plan.runs for a in r.aliases}
    listed = store.read_sweep_file(sweep_dir).get("runs")
    there = {p.name for p in store.run_dirs(sweep_dir) if p.name != MERGED_DIR}
    folder = there | (set(map(str, listed)) if isinstance(listed, dict) else set())
    if ids and ids <= folder:
        return []
    return sorted(folder - ours)


def check_folder(plan: Any, add_to_folder: bool = False) -> None:
    """``UserError`` (exit 2, before anything is written) when the sweep folder holds runs this plan does not
    have (``other_grids_runs``), unless ``add_to_folder``: two grids of one ``name:`` would train into one
    folder and report as one sweep. Which runs are whose is said by run id."""
    store.refuse_rehearsal(plan.sweep_dir)  # a rehearsal's folder: said as such first
    if add_to_folder:
        return
    others = other_grids_runs(plan)
    if not others:
        return
    from klsweep.printable import visible

    sweep_dir = Path(plan.sweep_dir)
    ids = [r.id for r in plan.runs]
    there = sum(Path(r.run_dir).exists() for r in plan.runs)
    shown = ", ".join(visible(o) for o in others[:6]) + (
        f" and {len(others) - 6} more" if len(others) > 6 else ""
    )
    mine = ", ".join(ids[:6]) + (f" and {len(ids) - 6} more" if len(ids) > 6 else "")
    raise UserError(
        Problem(
            str(sweep_dir),
            f"holds {len(others)} run(s) of another grid named {plan.name!r} (or of this one with other "
            f"overrides), not in this plan: {shown}; this grid's {len(ids)} run(s): {mine} ({there} of them "
            "there already). Both would train into one folder and report as one sweep",
            f"another name: for this grid (name: in the file, or name=NEW), another --out, or {ADD_FLAG} to "
            "add this grid's runs to that folder",
        ),
        title="another grid's folder",
    )


def write_sweep_file(plan: Any, cluster_kind: str) -> None:
    """``<sweep>/sweep.yaml``: the plan's name, axes, exclusions, runs' parameters and grid text, appended to
    what it held (never rewritten smaller): the runs it listed stay listed, beside the plan's; an earlier grid
    text that differs is kept under ``earlier_grids``."""
    from omegaconf import OmegaConf

    old = store.read_sweep_file(plan.sweep_dir)
    runs = old.get("runs") if isinstance(old.get("runs"), dict) else {}
    runs = {str(k): v for k, v in runs.items() if isinstance(v, dict)}
    runs.update({r.id: dict(r.params) for r in plan.runs})
    axes = (
        [a for a in old.get("axes") or [] if isinstance(a, str)] if isinstance(old.get("axes"), list) else []
    )
    earlier = old.get("earlier_grids") if isinstance(old.get("earlier_grids"), list) else []
    earlier = [t for t in earlier if isinstance(t, str)]
    if isinstance(old.get("grid"), str) and old["grid"] != plan.grid_text and old["grid"] not in earlier:
        earlier.append(old["grid"])
    data = {
        "name": plan.name,
        "cluster": cluster_kind,
        "axes": [*axes, *(a for a in plan.axes if a not in axes)],
        "excluded": plan.excluded,
        "runs": runs,
        "grid": plan.grid_text,
    }
    if earlier:
        data["earlier_grids"] = earlier
    store.atomic_write_text(
        Path(plan.sweep_dir) / store.SWEEP_FILE, OmegaConf.to_yaml(OmegaConf.create(data))
    )
