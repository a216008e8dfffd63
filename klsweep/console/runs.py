"""The runs as they go: a training step's line, the progress line, the status table (``--watch`` too) and
the failures under it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.console.terminal import NARROW, axis_labels, cell, shown_params
from klsweep.printable import counted

if TYPE_CHECKING:
    from rich.console import Console

    from klsweep.submit import EvalProgress, RunStatus


def step_line(row: dict[str, Any], total: int) -> str:
    """``klsweep train``'s line for one step's metrics row: step, task reward, the k1 and k3 KL estimates,
    loss, seconds."""

    def num(key: str) -> str:
        v = row.get(key)
        return "—" if v is None else f"{v:.3g}"

    return (
        f"step {row['step']}/{total}  reward {num('reward_mean')}  kl k1 {num('kl_k1')} k3 {num('kl_k3')}  "
        f"loss {num('loss')}  {num('step_time')} s"
    )


COLOUR = {
    "done": "green",
    "failed": "red",
    "unreadable": "red",
    "incomplete": "red",
    "diverged": "magenta",
    "collapsed": "magenta",
    "cancelled": "yellow",
    "running": "cyan",
}


def progress_line(runs: list[RunStatus], eta: bool = True) -> str:
    """The runs per state, running first, and (``eta``) the time left as ``submit.progress`` estimates it:
    ``3 running, 10 pending, 53 done; about 4 min left``."""
    from klsweep.submit import progress

    counts, left = progress(runs)
    line = ", ".join(f"{n} {state}" for state, n in counts.items())
    if eta and left is not None:
        line += f"; about {_duration(left)} left"
    return line


def eval_progress_line(p: EvalProgress) -> str:
    """An evaluation waited for, as ``submit.EvalProgress`` says it: ``eval: 1 of 3 checkpoints scored; about
    40 s left`` (no time left until one is scored: lm-eval's start comes first)."""
    line = f"eval: {p.scored} of {counted(p.total, 'checkpoint')} scored"
    if p.left_s is not None and p.scored < p.total:
        line += f"; about {_duration(p.left_s)} left"
    return line


def _duration(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 90
        else f"{seconds / 60:.0f} min"
        if seconds < 5400
        else f"{seconds / 3600:.1f} h"
    )


def watch_view(runs: list[RunStatus], title: str = "", width: int | None = None) -> Any:
    """``klsweep status --watch``: the counts and time left over the status table, running runs first."""
    from rich.console import Group
    from rich.text import Text

    return Group(Text(progress_line(runs)), status_table(runs, title, width, running_first=True))


def status_table(
    runs: list[RunStatus], title: str = "", width: int | None = None, running_first: bool = False
) -> Any:
    """``klsweep.submit.status`` rows, sorted by configuration: the run id, the varying axes, state, what the
    scheduler says beyond it (``_scheduler_notes``: a column on a pipe, a mark and a legend in a terminal), step,
    reward, eval; elapsed time (the run's training loop) and its jobs' start-up apart (when recorded), GPU-hours (when any) and the scheduler's job id while they fit (failed runs' log
    tails are printed separately by the CLI). A run diverged by a reward collapse shows as ``collapsed``, as
    the report counts it. ``running_first``: the running runs on top (``--watch``)."""
    from rich.text import Text

    from klsweep.collapse import OUTCOME_WORDS
    from klsweep.grid.plan import config_first, config_order
    from klsweep.report.terminal import fitted_tables

    axes = config_first(list(runs[0].params)) if runs else []
    shown = {r.run_id: shown_params(r.params) for r in runs}
    gpu = any(r.gpu_hours for r in runs)
    startup = any(r.startup_s for r in runs)
    order = sorted(
        runs,
        key=lambda r: (running_first and r.state != "running", config_order(shown[r.run_id], axes), r.run_id),
    )
    sched, marks, legend = _scheduler_notes(order, width)  # marks numbered down the table
    header = [
        "run",
        *axis_labels(axes),
        "state",
        *(["scheduler"] if sched else []),
        "step",
        "reward",
        "eval",
        "elapsed",
        *(["start-up"] if startup else []),
        *(["GPU-h"] if gpu else []),
        "job",
    ]
    rows = []
    for r in order:
        rows.append(
            [
                r.run_id,
                *(cell(shown[r.run_id].get(a)) for a in axes),
                Text.assemble(
                    (state := "collapsed" if r.collapsed else r.state, COLOUR.get(state, "")),
                    marks.get(r.run_id, ""),
                ),
                *([sched.get(r.run_id, "")] if sched else []),
                f"{r.step}/{r.total_steps}" if r.total_steps else str(r.step),
                "" if r.reward is None else f"{r.reward:.3f}",
                r.eval_state or "",
                _minutes(r.elapsed_s),
                *([_minutes(r.startup_s)] if startup else []),
                *([f"{r.gpu_hours:.2f}"] if gpu else []),
                r.job_id or "",
            ]
        )  # fmt: skip
    return fitted_tables(
        title,
        header,
        rows,
        width=width,
        group="model",  # too wide with the model's name: one table per model
        right=["step", "reward", "elapsed", "start-up", "GPU-h"],
        whole=["run", "model", "job", "state", "step"],
        optional=["job", "start-up", "GPU-h", "elapsed", "eval"],
        short=NARROW,
        caption="; ".join(
            filter(None, [legend, OUTCOME_WORDS if any(r.state == "diverged" for r in runs) else ""])
        ),
    )


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}m" if seconds < 6000 else f"{seconds / 3600:.1f}h"


def print_failures(console: Console, runs: list[RunStatus]) -> None:
    """Print what follows the status table for each failed, unreadable or incomplete run, and each failed eval,
    sorted by run id: a ``--- <run id> (<state>) ---`` line, why (the exception's type and message, wrapped to
    the terminal; what is missing), where its log is (the job's stderr in the run's ``logs/``, never cut or
    wrapped, so it can be copied) and the log's last lines as written."""
    said = ("failed", "unreadable", "incomplete")
    for r in sorted(runs, key=lambda r: r.run_id):
        failed_eval = r.state not in said and r.eval_state in ("failed", "partial")
        if r.state not in said and not failed_eval:
            continue
        state = f"eval {r.eval_state}" if failed_eval else r.state
        console.print(f"--- {r.run_id} ({state}) ---", highlight=False, markup=False)
        why = r.eval_error if failed_eval else r.reason
        if why:
            console.print(why, style="red", highlight=False, markup=False)
        whole = ([f"log: {r.log}"] if r.log else []) + [line for line in r.log_tail if line != why]
        for line in whole:
            console.print(line, highlight=False, markup=False, soft_wrap=True)


GOING_ON_SHOWN = 8  # run ids named when runs go on after an interrupt; the rest counted


def print_going_on(
    console: Console, runs: list[RunStatus], sweep_dir: Any, what: str = "interrupted"
) -> None:
    """What a command that waited on a sweep (``run --wait``, ``study``, ``status --watch``) says when it is
    interrupted (Ctrl-C): its runs' jobs do not stop with it (local ones run in their own session, Slurm's on
    the cluster), so which runs go on (training, or their eval) and the command that stops them."""
    from klsweep.console.terminal import print_warning

    going = [r for r in runs if r.state in LIVE or r.eval_state in LIVE]
    if not going:
        print_warning(console, "no run of the sweep goes on", label=what)
        return
    ids = [r.run_id for r in going]
    named = ", ".join(ids[:GOING_ON_SHOWN]) + (
        f" and {len(ids) - GOING_ON_SHOWN} more" if len(ids) > GOING_ON_SHOWN else ""
    )
    counts = ", ".join(
        f"{n} {kind}"
        for kind, n in (
            ("training", sum(r.state == "running" for r in going)),
            ("waiting to train", sum(r.state == "pending" for r in going)),
            ("evaluated", sum(r.state not in LIVE for r in going)),
        )
        if n
    )
    print_warning(
        console,
        f"{counted(len(going), 'run')} go{'es' if len(going) == 1 else ''} on in the background ({counts}): {named}. "
        f"`klsweep cancel {sweep_dir}` stops them; `klsweep status {sweep_dir}` shows them",
        label=what,
    )


LIVE = ("pending", "running")  # a run's (or its eval's) states whose job goes on


_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def _scheduler_notes(runs: list[RunStatus], width: int | None) -> tuple[dict[str, str], dict[str, str], str]:
    """What the scheduler says beyond klsweep's state (``RunStatus.scheduler``: ``PENDING (Resources)``,
    ``TIMEOUT``), shown only where it says something: on a pipe (``width`` None) a ``scheduler`` column; in a
    terminal a mark after the state (``pending¹``) and a legend (``scheduler: ¹ PENDING (Resources)``), which
    stays narrow however long Slurm's words. Returns the column's cells, the marks and the legend."""
    said = {r.run_id: r.scheduler for r in runs if r.scheduler}
    if width is None:
        return said, {}, ""
    marks: dict[str, str] = {}
    for note in said.values():
        marks.setdefault(note, str(len(marks) + 1).translate(_SUPERSCRIPT))
    legend = ", ".join(f"{mark} {note}" for note, mark in marks.items())
    return {}, {rid: marks[note] for rid, note in said.items()}, f"scheduler: {legend}" if legend else ""


def scores_table(paths: list[Path], title: str = "", width: int | None = None) -> Any:
    """``klsweep eval``'s scores, as lm-eval prints its table: one row per run (or baseline), checkpoint and
    task, the metric's value and its standard error, from each checkpoint's results.json."""
    from klsweep import store
    from klsweep.report.terminal import fitted_table

    rows = []
    for path in sorted(paths):
        results = store.read_json(path)
        checkpoint_dir = Path(path).parent
        owner = checkpoint_dir.parents[2]  # <run>/eval/<hash>/<checkpoint>/results.json
        name = f"{store.BASELINE_DIR} {owner.name}" if owner.parent.name == store.BASELINE_DIR else owner.name
        stderr = results.get("stderr") or {}
        for domain, label in (("in_domain", "in"), ("ood", "ood")):
            for task, value in (results.get("metrics", {}).get(domain) or {}).items():
                se = stderr.get(task)
                rows.append(
                    [
                        name,
                        results.get("checkpoint", checkpoint_dir.name),
                        label,
                        task,
                        "—" if value is None else f"{value:.4f}",
                        "—" if se is None else f"{se:.4f}",
                    ]
                )
    metric = next((store.read_json(p).get("metric") for p in paths[:1]), None) or "value"
    return fitted_table(
        title,
        ["run", "checkpoint", "domain", "task", metric, "stderr"],
        rows,
        width=width,
        right=[metric, "stderr"],
        whole=["run"],
        optional=["stderr", "domain"],
    )
