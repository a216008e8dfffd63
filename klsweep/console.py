"""Terminal rendering for the CLI: its console (``cli_console``) and the plan, resources, status and audit tables;
computation lives elsewhere.

Every table is laid out by ``report.terminal.fitted_table``: sized to the terminal (80 columns read well: only
the axes that vary, short headers, optional columns dropped and named before anything wraps), run ids and model
names never cut, rows sorted by configuration. On a pipe or in a file the console is ``COLUMNS`` wide when it
is set, else as wide as the lines (``cli_console``): plain, full-width tables, nothing wrapped or cut; warnings are sentences, wrapped between
words at the console's width, 80 on a pipe without ``COLUMNS`` (``print_warning``). A long plan is
summarised (runs per axis value); ``klsweep plan --runs`` lists every run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from klsweep.audit import GRPO_VERDICTS

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from klsweep.audit import AuditRow, GRPOAuditRow
    from klsweep.fetch import Found
    from klsweep.grid import Plan
    from klsweep.grid.keys import KeyDoc
    from klsweep.grid.shipped import ShippedGrid
    from klsweep.rehearse import Rehearsal
    from klsweep.report import Report
    from klsweep.submit import RunStatus

PIPE_WIDTH = 100_000  # a pipe or a file: lines as long as they are (rich's default there would be 80)
LIST_RUNS_UP_TO = 16  # a plan of more runs is summarised per axis value unless its runs are asked for


def cli_console(stderr: bool = False) -> Console:
    """The terminal's console; when the output is not a terminal, one of the width ``COLUMNS`` asks for, or
    else one no line of which is wrapped."""
    from rich.console import Console

    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(file=_Unpadded(stderr), width=_columns() or PIPE_WIDTH)  # type: ignore[arg-type]


class _Unpadded:
    """stdout or stderr (looked up at each write) for a pipe or a file: lines without the spaces rich pads a
    table's rows with to its width (``klsweep keys | grep``); a pipe its reader closed is not an error."""

    def __init__(self, stderr: bool):
        self.stderr = stderr

    @property
    def stream(self) -> Any:
        import sys

        return sys.stderr if self.stderr else sys.stdout

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        import re

        try:
            return self.stream.write(re.sub(r" +(?=\n)", "", text))
        except BrokenPipeError:
            self._closed()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._closed()

    def _closed(self) -> None:
        """The reader went away (``klsweep report ... | head``): what is left to print goes nowhere, and the
        command goes on (the report's files are written) and exits as it would have."""
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.stream.fileno())
        os.close(devnull)

    def isatty(self) -> bool:
        return False


def table_width(console: Console) -> int | None:
    """The width tables are fitted to: the terminal's, or on a pipe ``COLUMNS`` when it is set; else none
    (full width)."""
    return console.width if console.is_terminal else _columns()


def _columns() -> int | None:
    """``COLUMNS`` from the environment when it is a width (e.g. ``COLUMNS=80 klsweep report ... | less``)."""
    import os

    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) >= 20 else None


COMPACT = {"kl.estimator": "est."}  # headers narrower than the report's where a column's values are short
# headers taken when a table is still too wide without its optional columns (spelled out in its caption)
NARROW = {"placement": "place", "importance": "IS", "iterations": "iters", "reward mode": "mode"}


def axis_label(axis: str, compact: bool = True) -> str:
    """A column header for a dotted axis key: compact (a column of short values), else the report's short
    name, else its last part."""
    from klsweep.report.tables import SHORT

    return (compact and COMPACT.get(axis)) or SHORT.get(axis, axis.split(".")[-1])


def _shown(params: dict[str, Any]) -> dict[str, Any]:
    from klsweep.config import without_kl_when_off

    return without_kl_when_off(params)


def _value(v: Any) -> str:
    return "—" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _pack(items: list[str], room: int | None) -> Text:
    """``items`` joined by ", ", on lines of at most ``room`` characters, never breaking an item: a cell whose
    line breaks are the layout's (each item as written, its control characters visible: ``visible``)."""
    from rich.text import Text

    from klsweep.report.tables import visible

    lines = [""]
    for item in map(visible, items):
        line = f"{lines[-1]}, {item}" if lines[-1] else item
        if room is not None and lines[-1] and len(line) + 1 > room:
            lines[-1] += ","
            lines.append(item)
        else:
            lines[-1] = line
    return Text("\n".join(lines))


def _labels(axes: list[str], compact: bool = True) -> list[str]:
    labels = [axis_label(a, compact) for a in axes]
    # two axes with the same last part (a.x, b.x) keep their full keys
    return [a if labels.count(lab) > 1 else lab for a, lab in zip(axes, labels, strict=True)]


def plan_table(plan: Plan, counts: dict[str, Any], width: int | None = None, runs: bool = False) -> Any:
    """The runs of a plan: every run (id, then the varying axes, sorted by configuration) when ``runs`` or
    when there are few; else the runs per value of each axis. The counts (``planner.summary``) are the
    caption."""
    from klsweep.report.terminal import GAP, fitted_table, fitted_tables

    title = f"sweep {plan.name}: {plan.sweep_dir}"
    caption = (
        f"{counts['total']} runs, {counts['excluded']} excluded, "
        + (f"{counts['merged']} merged (the same training), " if counts.get("merged") else "")
        + f"{counts['done']} already done (or diverged), "
        + (f"{counts['failed']} failed or cancelled (run: --retry-failed), " if counts.get("failed") else "")
        + f"{counts['to_submit']} to submit"
    )
    from klsweep.grid.plan import config_first, config_order

    shown = {r.id: _shown(r.params) for r in plan.runs}
    axes = config_first(plan.axes)
    if runs or len(plan.runs) <= LIST_RUNS_UP_TO:
        order = plan.table_order()
        rows = [[r.id, *(_value(shown[r.id].get(a)) for a in axes)] for r in order]
        labels = _labels(axes)
        return fitted_tables(
            title, ["run", *labels], rows, width=width, group="model", whole=["run", "model"], short=NARROW,
            caption=caption,
        )  # fmt: skip
    labels = _labels(axes, compact=False)
    room = None if width is None else max(20, width - max(map(len, ["axis", *labels])) - GAP)
    rows = []
    for a, label in zip(axes, labels, strict=True):
        per_value: dict[Any, int] = {}
        for r in sorted(plan.runs, key=lambda r: config_order({a: shown[r.id].get(a)}, [a])):
            v = shown[r.id].get(a)
            per_value[v] = per_value.get(v, 0) + 1
        rows.append([label, _pack([f"{_value(v)} ×{n}" for v, n in per_value.items()], room)])
    return fitted_table(
        title,
        ["axis", "runs per value"],
        rows,
        width=width,
        caption=f"{caption}; --runs lists each run",
    )


def keys_table(docs: list[KeyDoc], width: int | None = None) -> Any:
    """``klsweep keys``: each key (never cut), its default as YAML writes it, its help with its type and the
    values allowed."""
    import json

    from klsweep.report.terminal import fitted_table

    def default(v: Any) -> str:
        return (v or "''") if isinstance(v, str) else json.dumps(v)

    rows = [  # text, not rich markup (fitted_table): "klsweep[vllm]" and "[bool]" are shown as written
        [d.key, default(d.default), f"{d.help} [{d.type}{': ' + d.allowed if d.allowed else ''}]"]
        for d in docs
    ]
    caption = (
        "set with key=value (grid: base: or an axis); + adds inside train.trl, cluster.additional_parameters"
    )
    return fitted_table(
        "keys of grid files and overrides", ["key", "default", "help"], rows, width=width, whole=["key"],
        caption=caption,
    )  # fmt: skip


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


def grids_table(grids: list[ShippedGrid], width: int | None = None) -> Any:
    """``klsweep grids``: each shipped grid's name (what ``klsweep plan NAME`` takes) and what it is."""
    from klsweep.report.terminal import fitted_table

    rows = [[g.name, g.summary] for g in grids]
    caption = "klsweep plan NAME plans one anywhere; klsweep grids cp NAME FILE copies one to edit"
    return fitted_table(
        "shipped grids", ["name", "what it is"], rows, width=width, whole=["name"], caption=caption
    )


def _size(gb: float) -> str:
    return f"{gb / 1024:.1f} TiB" if gb >= 1024 else f"{gb:.1f} GiB"


def _hours(h: float) -> str:
    return f"{h:,.0f}" if h >= 10 else f"{h:.1f}"


def resources_table(counts: dict[str, Any], width: int | None = None) -> Table:
    """What the plan needs (``planner.summary``): one row per model and launch shape, the sweep's totals and
    its largest per-GPU memory estimate in the caption."""
    from klsweep.report.terminal import fitted_table

    header = ["model", "runs", "GPUs", "sharding", "micro", "lr", "GiB/GPU", "host GiB", "storage"]
    rows = []
    for row in counts["resources"]:
        mem, host = row["gpu_memory_gb"], row.get("host_memory_gb")
        rows.append(
            [
                str(row["model"]),
                str(row["runs"]),
                "CPU" if mem is None else str(row["gpus"]),
                row["sharding"],
                "all" if row["micro_batch_size"] is None else str(row["micro_batch_size"]),
                ", ".join(row["learning_rate"]),
                "—" if mem is None else f"{mem:.1f}/{row['of_gb']:g}",
                "—" if host is None else f"{host:.0f}/{row['mem_gb']:g}",
                _size(row["storage_gb"]),
            ]
        )
    largest = counts["largest_gpu_memory"]
    peak = (
        ""
        if largest is None
        else f"; largest per GPU: {largest['gpu_memory_gb']:g} of {largest['of_gb']:g} GiB "
        f"({largest['model']}, run {largest['run']})"
    )
    caption = (
        f"at most {_hours(counts['gpu_hours_upper_bound'])} GPU-hours to submit (upper bound: every try, 1 + "
        f"cluster.max_requeues, of every job for its whole time limit, eval jobs included); checkpoints kept "
        f"{_size(counts['storage_gb'])}{peak}"
    )
    return fitted_table(
        "resources (estimates: slurm/README.md)",
        header,
        rows,
        width=width,
        right=["runs", "GPUs", "micro", "GiB/GPU", "host GiB", "storage"],
        whole=["model", "lr"],  # a model's name is never cut nor folded, nor a learning rate
        optional=["micro", "storage"],
        caption=caption,
    )


def time_table(counts: dict[str, Any], width: int | None = None) -> Table | None:
    """The time estimate (``planner.summary``, ``klsweep.cost``) beside the limits, one row per model and
    launch shape: the GPU, the slowest step as a band (low-high) and its generation part, training hours of a
    run (the band's high end) against a job's time limit, the jobs a run may need, the preemption signal's
    delay (USR2 s), the estimated GPU-hours (low-high) and those at the limits; the totals (training and eval)
    in the caption. None when no run has GPUs."""
    from klsweep.report.terminal import fitted_table

    shown = [r for r in counts["resources"] if r.get("step_seconds_low") is not None]
    if not shown:
        return None
    header = ["model", "runs", "GPU", "s/step", "gen s", "h/run", "jobs", "USR2 s", "GPU-h", "limit"]
    rows = [
        [
            str(r["model"]),
            str(r["runs"]),
            str(r["gpu"]),
            f"{r['step_seconds_low']:.0f}-{r['step_seconds_high']:.0f}",
            f"{r['generation_seconds']:.0f}",
            f"{r['train_hours_high']:.1f}/{r['limit_hours']:g}",
            str(r["jobs"]),
            str(r["signal_delay_s"]),
            f"{_hours(r['gpu_hours_estimate_low'])}-{_hours(r['gpu_hours_estimate_high'])}",
            _hours(r["gpu_hours"]),
        ]
        for r in shown
    ]
    evals = (
        f"~{_hours(counts['eval_gpu_hours_estimate'])}"
        if counts["eval_estimated"]
        else "not estimated (a task of unknown size)"
    )
    caption = (
        f"{_hours(counts['gpu_hours_estimate_low'])}-{_hours(counts['gpu_hours_estimate_high'])} GPU-hours "
        f"estimated to submit (a band: slurm/README.md; limit: at most "
        f"{_hours(counts['gpu_hours_upper_bound'])}), of which eval {evals} (at most "
        f"{_hours(counts['eval_gpu_hours_limit'])})"
    )
    return fitted_table(
        "time (estimates: slurm/README.md)",
        header,
        rows,
        width=width,
        right=["runs", "s/step", "gen s", "h/run", "jobs", "USR2 s", "GPU-h", "limit"],
        whole=["model"],
        optional=["GPU", "gen s", "jobs"],
        caption=caption,
    )


def print_time(console: Console, counts: dict[str, Any], width: int | None = None) -> None:
    """``klsweep plan``'s time table and its warnings (``planner.warnings``), each a ``warning:`` line."""

    table = time_table(counts, width=width)
    if table is not None:
        console.print(table)
    for line in counts["warnings"]:
        print_warning(console, line)


def prose_width(console: Console) -> int:
    """The width sentences wrap at: the console's (the terminal's, or ``COLUMNS``), but 80 on a pipe without
    ``COLUMNS``, whose console is as wide as the lines (for the tables)."""
    return console.width if console.is_terminal or _columns() else 80


def print_warning(console: Console, line: str, label: str = "warning") -> None:
    """``LABEL: LINE`` (label in yellow), wrapped at ``prose_width`` between words (continued two spaces in; a
    word longer than a line, such as a path, is kept whole)."""
    import textwrap

    from rich.markup import escape

    from klsweep.report.tables import visible

    first, *rest = textwrap.wrap(
        f"{label}: {visible(line)}",  # a folder's or a claim's name as written, its control characters visible
        prose_width(console),
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    console.print(f"[yellow]{label}[/]{escape(first.removeprefix(label))}", highlight=False, soft_wrap=True)
    for part in rest:
        console.print(part, highlight=False, markup=False, soft_wrap=True)


COLOUR = {
    "done": "green",
    "failed": "red",
    "unreadable": "red",
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
    reward, eval; elapsed time, GPU-hours (when any) and the scheduler's job id while they fit (failed runs' log
    tails are printed separately by the CLI). A run diverged by a reward collapse shows as ``collapsed``, as
    the report counts it. ``running_first``: the running runs on top (``--watch``)."""
    from rich.text import Text

    from klsweep.collapse import OUTCOME_WORDS
    from klsweep.grid.plan import config_first, config_order
    from klsweep.report.terminal import fitted_tables

    axes = config_first(list(runs[0].params)) if runs else []
    shown = {r.run_id: _shown(r.params) for r in runs}
    gpu = any(r.gpu_hours for r in runs)
    order = sorted(
        runs,
        key=lambda r: (running_first and r.state != "running", config_order(shown[r.run_id], axes), r.run_id),
    )
    sched, marks, legend = _scheduler_notes(order, width)  # marks numbered down the table
    header = [
        "run",
        *_labels(axes),
        "state",
        *(["scheduler"] if sched else []),
        "step",
        "reward",
        "eval",
        "elapsed",
        *(["GPU-h"] if gpu else []),
        "job",
    ]
    rows = []
    for r in order:
        rows.append(
            [
                r.run_id,
                *(_value(shown[r.run_id].get(a)) for a in axes),
                Text.assemble(
                    (state := "collapsed" if r.collapsed else r.state, COLOUR.get(state, "")),
                    marks.get(r.run_id, ""),
                ),
                *([sched.get(r.run_id, "")] if sched else []),
                f"{r.step}/{r.total_steps}" if r.total_steps else str(r.step),
                "" if r.reward is None else f"{r.reward:.3f}",
                r.eval_state or "",
                f"{r.elapsed_s / 60:.1f}m" if r.elapsed_s < 6000 else f"{r.elapsed_s / 3600:.1f}h",
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
        right=["step", "reward", "elapsed", "GPU-h"],
        whole=["run", "model", "job", "state", "step"],
        optional=["job", "GPU-h", "elapsed", "eval"],
        short=NARROW,
        caption="; ".join(
            filter(None, [legend, OUTCOME_WORDS if any(r.state == "diverged" for r in runs) else ""])
        ),
    )


def print_failures(console: Console, runs: list[RunStatus]) -> None:
    """Print what follows the status table for each failed or unreadable run, and each failed eval, sorted by
    run id: a ``--- <run id> (<state>) ---`` line, why (the exception's type and message, wrapped to the
    terminal), where its log is (the job's stderr in the run's ``logs/``, never cut or wrapped, so it can be
    copied) and the log's last lines as written."""
    for r in sorted(runs, key=lambda r: r.run_id):
        failed_eval = r.state not in ("failed", "unreadable") and r.eval_state in ("failed", "partial")
        if r.state not in ("failed", "unreadable") and not failed_eval:
            continue
        state = f"eval {r.eval_state}" if failed_eval else r.state
        console.print(f"--- {r.run_id} ({state}) ---", highlight=False, markup=False)
        why = r.eval_error if failed_eval else r.reason
        if why:
            console.print(why, style="red", highlight=False, markup=False)
        whole = ([f"log: {r.log}"] if r.log else []) + [line for line in r.log_tail if line != why]
        for line in whole:
            console.print(line, highlight=False, markup=False, soft_wrap=True)


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


VERDICT_STYLES = {
    "unbiased reverse KL": "green",
    "forward KL": "yellow",
    "zero in expectation": "magenta",
    "biased": "red",
}


def audit_tables(rows: list[AuditRow], title: str = "") -> list:
    """The rows as rich Tables, one per importance weighting (preset rows: one table, a ``preset`` column
    first), the verdict coloured. Errors are relative to the exact gradient of the reverse (``err rev``) and
    forward (``err fwd``) KL; ``|E g|`` is the expected gradient's norm relative to the reverse-KL gradient's."""
    from rich import box
    from rich.table import Table

    off_policy = any(r.behavior_shift > 0 for r in rows)
    presets = any(r.preset for r in rows)
    out = []
    for importance in ("",) if presets else dict.fromkeys(r.importance for r in rows):
        full_title = f"{title}, importance weights: {importance}" if off_policy and not presets else title
        t = Table(title=full_title or None, box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
        for name in ("preset", "est", "placement", "level") if presets else ("est", "placement", "level"):
            t.add_column(name, no_wrap=True)
        for name in ("err rev", "err fwd", "|E g|", "variance"):
            t.add_column(name, justify="right")
        t.add_column("verdict", no_wrap=True)
        for r in rows:
            if presets or r.importance == importance:
                values = (r.rel_err_reverse, r.rel_err_forward, r.rel_norm, r.grad_variance)
                verdict = f"[{VERDICT_STYLES[r.verdict]}]{r.verdict}[/]"
                names = (r.preset,) if presets else ()
                t.add_row(*names, r.estimator, r.placement, r.level, *(f"{x:.3f}" for x in values), verdict)
        out.append(t)
    return out


GRPO_VERDICT_STYLES = dict(zip(GRPO_VERDICTS, ("green", "cyan", "yellow", "magenta", "red"), strict=True))


GRPO_LEGEND = """\
scale: the effective KL gradient, (E[grad L(beta)] - E[grad L(0)]) / beta,
  projected on grad KL(pi||ref) over its squared norm, in units of the loss
  type's aggregation: 1 when beta means what it says.
cos rev, cos fwd: its cosines with grad KL(pi||ref) and grad KL(ref||pi).
err rev: its relative error against grad KL(pi||ref) (exact: below 1e-6;
  rescaled: the reverse-KL direction at another scale)."""


def grpo_audit_tables(rows: list[GRPOAuditRow]) -> list:
    """The rows as rich Tables, one per reward mode and reward scaling (off-policy: and per reward_logp and
    importance), narrow enough for 80 columns:
    ``scale`` is ``effective_scale``, ``cos rev``/``cos fwd`` the cosines with grad KL(pi||ref) and
    grad KL(ref||pi), ``err rev`` the relative error of effective / unit against grad KL(pi||ref)."""
    from rich import box
    from rich.table import Table

    out = []

    presets = any(r.preset for r in rows)

    def table_of(r: GRPOAuditRow) -> tuple[str, ...]:
        if presets:
            return ("", r.scale_rewards)
        sampling = (r.reward_logp, r.importance) if r.behavior_shift > 0 else ()
        return (r.reward_mode, r.scale_rewards, *sampling)

    for key in dict.fromkeys(map(table_of, rows)):
        title = f"reward_mode {key[0]}, scale_rewards {key[1]}" if key[0] else f"scale_rewards {key[1]}"
        if len(key) > 2:
            title += f",\nreward_logp {key[2]}, importance {key[3]}"
        t = Table(
            title=title,
            box=box.SIMPLE_HEAD,
            padding=0,
            pad_edge=False,
        )
        for name in ("preset", "est", "placement", "level") if presets else ("est", "placement", "level"):
            t.add_column(name, no_wrap=True)
        for name in ("scale", "cos rev", "cos fwd", "err rev"):
            t.add_column(name, justify="right", no_wrap=True)
        t.add_column("verdict", no_wrap=True)
        for r in rows:
            if table_of(r) == key:
                verdict = f"[{GRPO_VERDICT_STYLES[r.verdict]}]{r.verdict}[/]"
                numbers = (r.effective_scale, r.cos_reverse, r.cos_forward, r.rel_err_reverse)
                names = (r.preset,) if presets else ()
                t.add_row(*names, r.estimator, r.placement, r.level, *(f"{x:.3f}" for x in numbers), verdict)
        out.append(t)
    return out


def fetch_table(found: list[Found], width: int | None = None) -> Any:
    """``klsweep fetch``'s table: one line per model or dataset, its state, commit and size."""
    from klsweep.fetch import size_text
    from klsweep.report.terminal import fitted_table

    rows = [
        [f.need.kind, f.need.label, f.state, (f.commit or "")[:8], size_text(f.size) if f.size else ""]
        for f in found
    ]
    counts = ", ".join(
        f"{sum(f.state == s for f in found)} {s}" for s in dict.fromkeys(f.state for f in found)
    )
    return fitted_table(
        "", ["kind", "what", "state", "commit", "size"], rows, width=width, right=["size"],
        optional=["commit", "size"], caption=counts or "nothing to fetch",
    )  # fmt: skip


def rehearsal_table(rehearsal: Rehearsal, width: int | None = None) -> Any:
    """``klsweep rehearse``'s table: one line per rehearsed run, one column per stage (passed, failed,
    skipped), the covered values; the failures' reasons and logs are printed below it (``rehearsal_notes``)."""
    from klsweep.rehearse import STAGES
    from klsweep.report.terminal import fitted_table

    rows = [[r.run_id, *(r.stages.get(s, "") for s in STAGES), r.label] for r in rehearsal.runs]
    return fitted_table(
        f"rehearsal of {rehearsal.name}: {len(rehearsal.runs)} runs, {rehearsal.elapsed_s:.0f} s",
        ["run", *STAGES, "model estimator placement level reward-mode lag"], rows, width=width,
        whole=["run"],
    )  # fmt: skip


def rehearsal_engines(rehearsal: Rehearsal, width: int | None = None) -> Any:
    """``klsweep rehearse``'s second table: what each stage ran with (engine, sharding) and what that replaced,
    one line per stage and distinct setting over the rehearsed runs."""
    from klsweep.report.terminal import fitted_table

    rows = list(
        dict.fromkeys(
            (stage, *how) for r in rehearsal.runs for stage, how in r.ran_with.items() if r.stages.get(stage)
        )
    )
    return fitted_table(
        "what each stage ran with", ["stage", "engine", "sharding", "in place of"], [list(r) for r in rows],
        width=width,
    )  # fmt: skip


def rehearsal_notes(rehearsal: Rehearsal) -> list[str]:
    """One line per failure (run, stage, reason, log) and per note (what was swapped or not exercised)."""
    lines = []
    for r in rehearsal.runs:
        for stage, reason in r.reasons.items():
            lines.append(f"{r.run_id} {stage} failed: {reason} (log: {r.logs.get(stage, '-')})")
        lines += [f"{r.run_id}: {note}" for note in dict.fromkeys(r.notes)]
    return lines


def rehearsal_verdict(rehearsal: Rehearsal) -> str:
    """``klsweep rehearse``'s last lines: the rehearsal's outcome, then what the real run would refuse or
    lack here (``Rehearsal.findings``: exit 1) and what its jobs would download (``cautions``)."""
    lines = [f"here: {c}" for c in rehearsal.cautions]
    lines += rehearsal.findings
    outcome = "passed" if rehearsal.passed else "FAILED"
    if rehearsal.passed and rehearsal.findings:
        outcome = (
            f"rehearsal passed, but not the real run from here ({len(rehearsal.findings)} finding(s) above)"
        )
    return "\n".join([*lines, f"{rehearsal.folder}: {outcome}"])


def print_audit(
    console: Console, rows: list, fmt: str, vocab: int, length: int, seed: int, ref_distance: float
) -> None:
    """``klsweep audit``'s rows: ``json`` (a list) or ``csv`` on stdout, plain; else the rich tables under a
    heading that names the settings (the GRPO audit's with their legend)."""
    import sys

    from klsweep.audit import GRPOAuditRow, rows_as_dicts

    if fmt == "json":
        import json

        print(json.dumps(rows_as_dicts(rows), indent=2))
    elif fmt == "csv":
        import csv

        dicts = rows_as_dicts(rows)
        writer = csv.DictWriter(sys.stdout, fieldnames=list(dicts[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(dicts)
    elif isinstance(rows[0], GRPOAuditRow):
        r = rows[0]
        off = (
            f"off-policy (behaviour shift {r.behavior_shift:g})\n" if r.behavior_shift > 0 else "on-policy: "
        )
        console.print(
            f"GRPO audit, {off}V={vocab}, L={length}, G={r.group_size}, {r.loss_type}, beta {r.beta:g},"
            f" seed {seed}, ref distance {ref_distance:g}",
            markup=False,
        )
        console.print(*grpo_audit_tables(rows))
        console.print(GRPO_LEGEND, markup=False, highlight=False)
    else:
        shift = rows[0].behavior_shift
        policy = "on-policy" if shift == 0 else f"off-policy, behaviour shift {shift}"
        title = (
            f"KL gradient audit: V={vocab}, L={length}, seed={seed}, ref distance {ref_distance}, {policy}"
        )
        console.print(*audit_tables(rows, title=title))


def print_report(console: Console, err: Console, report: Report, tables: bool = True) -> None:
    """A report as the CLI shows it: its rich tables (when ``tables``: ``print_report_tables``), what is not
    there yet, what it set aside and its warnings (on ``err``), the files written and its W&B run."""
    if tables:
        print_report_tables(console, report)
    if report.eval_note:
        print_warning(err, report.eval_note, "eval")
    for line in report.missing:
        print_warning(err, line, "missing")
    for line in report.set_aside:
        print_warning(err, line, "set aside")
    for line in report.warnings:
        print_warning(err, line)
    for path in report.paths:
        console.print(str(path), highlight=False, soft_wrap=True)
    if report.wandb_run is not None:
        console.print(f"W&B: {report.wandb_run}", highlight=False, soft_wrap=True)


def print_report_tables(console: Console, report: Report) -> None:
    """A report's rich tables, at the console's width."""
    from klsweep.report import rich_tables

    for table in rich_tables(report, width=table_width(console)):
        console.print(table)
