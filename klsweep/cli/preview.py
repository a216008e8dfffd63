"""Commands that look before anything runs: plan, fetch, rehearse, config, keys, grids (klsweep/grid/,
klsweep/planner/, klsweep/fetch/, klsweep/rehearse/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from klsweep.cli.app import (
    AddToFolderOpt,
    ConfigDirOpt,
    GridArg,
    MaxRunsOpt,
    OutOpt,
    OverridesArg,
    app,
    terminal,
)
from klsweep.errors import UserError


@app.command("plan")
def plan_command(
    grid: GridArg,
    overrides: OverridesArg = None,
    out: OutOpt = Path("results"),
    config_dir: ConfigDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    runs: Annotated[
        bool, typer.Option("--runs", help="list every run (a long plan is summarised per axis value)")
    ] = False,
    max_runs: MaxRunsOpt = None,
    add_to_folder: AddToFolderOpt = False,
) -> None:
    """Show the runs a grid file expands to and what they need (validated, and refused when a run cannot start
    or fit its GPUs; nothing is written or submitted). Offline, what `klsweep run` would refuse while the
    caches lack it follows the plan, with the `klsweep fetch` command that gets it."""
    from klsweep import console, fetch, planner
    from klsweep import grid as grid_mod
    from klsweep.submit.sweep import check_folder

    plan = grid_mod.load_plan(grid, overrides, out=out, config_dirs=config_dir, max_runs=max_runs)
    check_folder(plan, add_to_folder)  # as run and study refuse it
    summary = planner.summary(plan)
    command = fetch.fetch_command(grid, overrides, out)
    refused = fetch.cache_refusals(fetch.plan_configs(plan), command)  # a preview: shown, not raised
    summary["warnings"] += fetch.node_local_warnings(r.config for r in plan.runs)
    summary["run_would_refuse"] = [str(p) for p in refused[:-1]]
    summary["fetch_command"] = command if refused else None
    estimates = summary.pop("estimates")
    if as_json:
        import json

        runs = [
            {
                "id": r.id,
                "params": r.params,
                "estimate": e.as_json() if (e := estimates.get(r.id)) else None,
                "limit": e.limit_json() if e else None,
            }
            for r in plan.table_order()  # the table's order: `klsweep config GRID N` is its row N
        ]
        print(json.dumps({"name": plan.name, "runs": runs, **summary}, indent=2, default=str))
    else:
        out = terminal()
        width = console.table_width(out)
        out.print(console.plan_table(plan, summary, width=width, runs=runs))
        if summary["seeds"] is not None:  # the study's pilot and budget (the grid's seeds:)
            out.print(summary["seeds"]["line"], highlight=False, markup=False)
        out.print(console.resources_table(summary, width=width))
        console.print_time(out, summary, width=width)
        for line in summary["notes"]:
            console.print_warning(out, line, label="note")
        console.print_refusals(out, refused, command)


@app.command("fetch")
def fetch_command(
    grid: GridArg,
    overrides: OverridesArg = None,
    out: OutOpt = Path("results"),
    config_dir: ConfigDirOpt = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="list what would be fetched and what is cached; download nothing"),
    ] = False,
) -> None:
    """Download every model, training set and eval set the grid's runs load into the local caches (HF_HOME,
    HF_DATASETS_CACHE), for clusters whose nodes cannot reach the hub, at the commits the runs' folders under
    OUT recorded; what is cached and loads is not fetched again, what is incomplete is repaired."""
    from klsweep import fetch
    from klsweep import grid as grid_mod
    from klsweep.console import fetch_table, table_width

    plan = grid_mod.load_plan(grid, overrides, out=out, config_dirs=config_dir)
    items = fetch.needs(fetch.plan_configs(plan))
    console = terminal()
    if not dry_run:
        console.print(f"fetching into {fetch.hub_cache()} and {fetch.datasets_cache()}", highlight=False)
    found = fetch.fetch(
        items,
        dry_run=dry_run,
        on_item=None if dry_run else lambda f: console.print(f"{f.state}: {f.need.label}", highlight=False),
    )
    console.print(fetch_table(found, width=table_width(console)))
    failed = [f for f in found if f.state == "failed"]
    if failed:
        from klsweep.errors import Problem

        raise UserError(
            [Problem(f"{f.need.kind} {f.need.label}", f.message) for f in failed], title="not fetched"
        )


@app.command("rehearse")
def rehearse_command(
    grid: GridArg,
    overrides: OverridesArg = None,
    out: Annotated[
        Path, typer.Option(help="where rehearsals live: OUT/<name>/ (never a sweep's results)")
    ] = Path("results/.rehearsal"),
    cluster: Annotated[
        str, typer.Option(help="local (this process) | slurm (one short job on the grid's partition)")
    ] = "local",
    config_dir: ConfigDirOpt = None,
) -> None:
    """Rehearse a sweep before it runs: a few covering runs, each with a tiny random model of its architecture
    and the shipped data samples, through plan, training, checkpoint, resume, eval (the grid's suite) and
    report; then what the real run needs that is missing here. Exit 1 unless every stage passed and
    `klsweep run` of the grid would not refuse here."""
    from klsweep.console import (
        rehearsal_engines,
        rehearsal_notes,
        rehearsal_table,
        rehearsal_verdict,
        table_width,
    )
    from klsweep.errors import Problem
    from klsweep.rehearse import rehearse, rehearse_on_slurm

    if cluster not in ("local", "slurm"):
        raise UserError(Problem("--cluster", f"{cluster!r}", "local, slurm"))
    console = terminal()
    if cluster == "slurm":
        result, log = rehearse_on_slurm(grid, overrides, out=out, config_dirs=config_dir)
        console.print(f"rehearsed on Slurm (log: {log})", highlight=False, soft_wrap=True)
    else:
        result = rehearse(
            grid, overrides, out=out, config_dirs=config_dir,
            on_run=lambda r: console.print(f"rehearsed {r.run_id}: {'passed' if r.passed else 'FAILED'}", highlight=False),
        )  # fmt: skip
    console.print(rehearsal_table(result, width=table_width(console)))
    console.print(rehearsal_engines(result, width=table_width(console)))
    for line in rehearsal_notes(result):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(rehearsal_verdict(result), highlight=False, markup=False)  # wrapped at the terminal
    if not result.ready:
        raise typer.Exit(1)


@app.command("config")
def config_command(
    grid: GridArg,
    run: Annotated[
        str, typer.Argument(help="a run id (or its start), or a row of the plan table from 0 (plan --runs)")
    ],
    overrides: OverridesArg = None,
    out: OutOpt = Path("results"),
    config_dir: ConfigDirOpt = None,
) -> None:
    """Print one run's resolved config: the config.yaml its job gets, on stdout (`klsweep train` takes it as it
    is); the run's id and folder on stderr."""
    from klsweep import grid as grid_mod
    from klsweep.config import run_file_text

    plan = grid_mod.load_plan(grid, overrides, out=out, config_dirs=config_dir)
    found = plan.find(run)
    terminal(stderr=True).print(f"run {found.id}: {found.run_dir}", highlight=False, soft_wrap=True)
    print(run_file_text(found.config), end="")


@app.command("keys")
def keys_command(
    under: Annotated[
        str | None, typer.Argument(help="only the keys of this section (e.g. train) or this key")
    ] = None,
) -> None:
    """Every key of grid files and overrides: its default (under the default config groups), its help, its
    type and the values allowed."""
    from klsweep.console import keys_table, table_width
    from klsweep.grid.keys import describe

    console = terminal()
    console.print(keys_table(describe(under or ""), width=table_width(console)))


grids_app = typer.Typer(
    help="The grids that ship with klsweep: list them (no subcommand), copy one to edit (cp).",
    no_args_is_help=False,
    rich_markup_mode=None,
)
app.add_typer(grids_app, name="grids")


@grids_app.callback(invoke_without_command=True)
def grids_command(ctx: typer.Context) -> None:
    """The grids that ship with klsweep: `klsweep plan NAME` (run, study, ...) takes one by its name
    anywhere; `klsweep grids cp NAME FILE` copies one to edit."""
    if ctx.invoked_subcommand is not None:
        return
    from klsweep.console import grids_table, table_width
    from klsweep.grid.shipped import shipped

    console = terminal()
    console.print(grids_table(shipped(), width=table_width(console)))


@grids_app.command("cp")
def grids_copy_command(
    name: Annotated[str, typer.Argument(help="a shipped grid's name (klsweep grids)")],
    dest: Annotated[Path, typer.Argument(help="the file to write, or a folder to hold NAME.yaml")] = Path(
        "."
    ),
    force: Annotated[bool, typer.Option("--force", help="overwrite DEST if it exists")] = False,
) -> None:
    """Copy a shipped grid to edit it (then: klsweep plan FILE)."""
    from klsweep.grid.shipped import copy

    written = copy(name, dest, force=force)
    terminal().print(f"wrote {written}: klsweep plan {written}", highlight=False, soft_wrap=True)
