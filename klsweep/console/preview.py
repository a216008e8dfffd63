"""The tables of the commands that look before anything runs: plan (runs, resources, time), keys, grids,
fetch, rehearse."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from klsweep.console.terminal import (
    NARROW,
    axis_labels,
    cell,
    pack_items,
    print_warning,
    prose_width,
    shown_params,
)
from klsweep.printable import counted

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from klsweep.errors import Problem
    from klsweep.fetch import Found
    from klsweep.grid import Plan
    from klsweep.grid.keys import KeyDoc
    from klsweep.grid.shipped import ShippedGrid
    from klsweep.rehearse import Rehearsal


LIST_RUNS_UP_TO = 16  # a plan of more runs is summarised per axis value unless its runs are asked for


def plan_table(plan: Plan, counts: dict[str, Any], width: int | None = None, runs: bool = False) -> Any:
    """The runs of a plan: every run (id, then the varying axes, sorted by configuration) when ``runs`` or
    when there are few; else the runs per value of each axis. The counts (``planner.summary``) are the
    caption."""
    from klsweep.report.terminal import GAP, fitted_table, fitted_tables

    title = f"sweep {plan.name}: {plan.sweep_dir}"
    caption = (
        f"{counted(counts['total'], 'run')}, {counts['excluded']} excluded, "
        + (f"{counts['merged']} merged (the same training), " if counts.get("merged") else "")
        + f"{counts['done']} already done (or diverged), "
        + (f"{counts['failed']} failed or cancelled (run: --retry-failed), " if counts.get("failed") else "")
        + f"{counts['to_submit']} to submit"
    )
    from klsweep.grid.plan import config_first, config_order
    from klsweep.grid.validate import hashable

    shown = {r.id: shown_params(r.params) for r in plan.runs}
    axes = config_first(plan.axes)
    if runs or len(plan.runs) <= LIST_RUNS_UP_TO:
        order = plan.table_order()
        rows = [[r.id, *(cell(shown[r.id].get(a)) for a in axes)] for r in order]
        labels = axis_labels(axes)
        return fitted_tables(
            title, ["run", *labels], rows, width=width, group="model", whole=["run", "model"], short=NARROW,
            caption=caption,
        )  # fmt: skip
    labels = axis_labels(axes, compact=False)
    room = None if width is None else max(20, width - max(map(len, ["axis", *labels])) - GAP)
    rows = []
    for a, label in zip(axes, labels, strict=True):
        per_value: dict[Any, list[Any]] = {}  # each value once (counted), then in configuration order
        for r in plan.runs:
            v = shown[r.id].get(a)
            per_value.setdefault(hashable(v), [v, 0])[1] += 1
        ordered = sorted(per_value.values(), key=lambda vn: config_order({a: vn[0]}, [a]))
        rows.append([label, pack_items([f"{cell(v)} ×{n}" for v, n in ordered], room)])
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


def grids_table(grids: list[ShippedGrid], width: int | None = None) -> Any:
    """``klsweep grids``: each shipped grid's name (what ``klsweep plan NAME`` takes) and what it is."""
    from klsweep.report.terminal import fitted_table

    rows = [[g.name, g.summary] for g in grids]
    caption = "klsweep plan NAME plans one anywhere; klsweep grids cp NAME FILE copies one to edit"
    return fitted_table(
        "shipped grids", ["name", "what it is"], rows, width=width, whole=["name"], caption=caption
    )


def docs_table(pages: dict[str, str], width: int | None = None) -> Any:
    """``klsweep docs``: each page of the shipped documentation (what ``klsweep docs PAGE`` prints) and its
    title."""
    from klsweep.report.terminal import fitted_table

    caption = "klsweep docs PAGE prints one (Markdown); a message's docs/KL.md is the page KL"
    rows = [[name, title] for name, title in pages.items()]
    return fitted_table(
        "klsweep's documentation", ["page", "title"], rows, width=width, whole=["page"], caption=caption
    )


def _size(gb: float) -> str:
    return f"{gb / 1024:.1f} TiB" if gb >= 1024 else f"{gb:.1f} GiB"


def _hours(h: float) -> str:
    return f"{h:,.0f}" if h >= 10 else f"{h:.1f}"


def resources_table(counts: dict[str, Any], width: int | None = None) -> Table:
    """What the plan needs (``planner.summary``): one row per model and launch shape, the sweep's totals and
    its largest per-GPU memory estimate in the caption."""
    from klsweep.report.terminal import fitted_table

    header = [
        "model",
        "runs",
        "GPUs",
        "sharding",
        "micro",
        "generation",
        "lr",
        "GiB/GPU",
        "host GiB",
        "storage",
    ]
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
                row["generation"] + (", numerics fast" if row.get("numerics") == "fast" else ""),
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
    # a sweep of CPU runs only (a local one) uses no GPU: no GPU-hours line (klsweep.cost is a GPU model); one
    # of the tiny model gets its wall time scaled from a measured study (planner.walltime), any other none
    on_gpus = any(row["gpu_memory_gb"] is not None for row in counts["resources"])
    hours = (
        f"at most {_hours(counts['gpu_hours_upper_bound'])} GPU-hours to submit (upper bound: every try, 1 + "
        "cluster.max_requeues, of every job for its whole time limit, eval jobs included); "
        if on_gpus
        else wall_time_line(counts.get("wall_time"))
    )
    caption = f"{hours}checkpoints kept {_size(counts['storage_gb'])}{peak}"
    return fitted_table(
        "resources (estimates: klsweep docs slurm)",
        header,
        rows,
        width=width,
        right=["runs", "GPUs", "micro", "GiB/GPU", "host GiB", "storage"],
        whole=["model", "lr"],  # a model's name is never cut nor folded, nor a learning rate
        optional=["generation", "micro", "storage"],
        caption=caption,
    )


def wall_time_line(wall: dict[str, Any] | None) -> str:
    """A local sweep's wall time (``planner.walltime``) as the resources caption's first words, "" when none."""
    if not wall:
        return ""
    if not wall["workers"]:
        return "nothing to train; "
    from klsweep.planner.walltime import minutes

    parts = [f"training {minutes(wall['train_s'])[6:]}"]
    if wall["eval_s"]:
        parts += [f"eval {minutes(wall['eval_s'])[6:]}", f"report {minutes(wall['report_s'])[6:]}"]
    return (
        f"{minutes(wall['total_s'])} here on {wall['workers']} worker{'s' if wall['workers'] > 1 else ''} "
        f"({', '.join(parts)}), scaled from {wall['calibration']} (a faster or busier machine differs); "
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
        f"estimated to submit (a band: klsweep docs slurm; limit: at most "
        f"{_hours(counts['gpu_hours_upper_bound'])}), of which eval {evals} (at most "
        f"{_hours(counts['eval_gpu_hours_limit'])})"
    )
    return fitted_table(
        "time (estimates: klsweep docs slurm)",
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


def print_refusals(console: Console, problems: list[Problem], command: str) -> None:
    """After an offline plan: what ``klsweep run`` would refuse while the caches lack it (``fetch.cache_refusals``:
    why, then one item a line), and the ``klsweep fetch`` command that gets it, on a line of its own to copy."""
    import textwrap

    from klsweep.fetch.refusal import FETCH_FIRST
    from klsweep.report.tables import visible

    if not problems:
        return
    *missing, last = problems
    print_warning(console, f"{last.where}: {last.what}:", label="run would refuse")
    for p in missing:
        for line in textwrap.wrap(f"- {visible(str(p))}", prose_width(console), initial_indent="  ",
                                  subsequent_indent="    ", break_long_words=False, break_on_hyphens=False):  # fmt: skip
            console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(f"{FETCH_FIRST}:", highlight=False, markup=False, soft_wrap=True)
    console.print(f"  {visible(command)}", highlight=False, markup=False, soft_wrap=True)


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
        f"rehearsal of {rehearsal.name}: {counted(len(rehearsal.runs), 'run')}, {rehearsal.elapsed_s:.0f} s",
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
