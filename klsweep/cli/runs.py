"""Commands that train and evaluate: train (klsweep/job.py), run, status, cancel (klsweep/submit/), eval
(klsweep/evaluate/, submitted by klsweep/submit/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from klsweep import store
from klsweep.cli.app import (
    AddToFolderOpt,
    ConfigDirOpt,
    GridArg,
    MaxRunsOpt,
    OverridesArg,
    app,
    require_cached,
    says_what_goes_on,
    terminal,
)


@app.command("train")
def train_command(
    config: Annotated[Path, typer.Argument(help="a run config YAML (e.g. a run folder's config.yaml)")],
    overrides: OverridesArg = None,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", help="the run folder (default: results/<name>/<run-id>)")
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", help="the libraries' own output too (TRL's log dicts, warnings, W&B's)"),
    ] = False,
) -> None:
    """Train one run in this process (resuming its folder if it has checkpoints), a line per step; exit 1 if it
    failed."""
    from klsweep import config as config_mod
    from klsweep import grid, job
    from klsweep.console import step_line

    resolved = grid.compose_run_config(config, overrides or [])
    folder = run_dir or Path(grid.DEFAULT_OUT) / resolved["name"] / grid.run_id(resolved)
    config_mod.write_run(folder, resolved)
    console = terminal()
    total = resolved["train"]["steps"]
    status = job.train_run(
        folder, quiet=not verbose,
        on_row=None if verbose else lambda row: console.print(step_line(row, total), highlight=False),
    )  # fmt: skip
    for warning in status.get("warnings") or []:
        console.print(f"warning: {warning}", highlight=False, markup=False, soft_wrap=True)
    terminal().print(f"{folder}: {status['state']}", highlight=False, soft_wrap=True)
    if status.get("reason"):
        terminal().print(status["reason"], highlight=False, soft_wrap=True)
    if status["state"] == "failed":
        terminal(stderr=True).print(status.get("error") or "", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)


@app.command("run")
def run_command(
    grid: GridArg,
    overrides: OverridesArg = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            help="local | slurm | debug (in this process, for pdb); default: the grid's cluster.kind"
        ),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option("--wait", help="show progress until every run is final; exit 1 if one failed"),
    ] = False,
    fail_on_diverged: Annotated[
        bool, typer.Option("--fail-on-diverged", help="--wait: exit 1 also when a run diverged")
    ] = False,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="resubmit failed/cancelled runs")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="cancel, clear and resubmit every run")] = False,
    out: Annotated[Path, typer.Option(help="results root: runs live in OUT/<name>/<run-id>/")] = Path(
        "results"
    ),
    max_runs: MaxRunsOpt = None,
    config_dir: ConfigDirOpt = None,
    add_to_folder: AddToFolderOpt = False,
) -> None:
    """Submit a sweep: every run not done yet (rerunning skips done runs and resumes unfinished ones). With
    --wait (or --cluster debug), exit 1 when a run or its eval failed or was cancelled; diverged runs are
    results (exit 0) unless --fail-on-diverged."""
    from klsweep import grid as grid_mod
    from klsweep import planner, submit
    from klsweep.console import print_failures, print_warning

    plan = grid_mod.load_plan(grid, overrides, out=out, config_dirs=config_dir, max_runs=max_runs)
    planner.check(plan)  # refuses runs that cannot start or fit
    require_cached(plan, grid, overrides)
    cluster = cluster or submit.default_cluster(plan)
    console = terminal()
    for line in planner.inert_axes(plan):  # an axis that changes nothing: said before anything is submitted
        print_warning(console, line)
    res = submit.submit(
        plan, cluster, retry_failed=retry_failed, force=force, add_to_folder=add_to_folder,
        on_build=lambda p: console.print(f"building the tiny model (once, cached in {p})", highlight=False),
    )  # fmt: skip
    with says_what_goes_on(res.sweep_dir if wait and cluster != "debug" else None):
        runs = _said_and_waited(console, plan, res, cluster, wait)
    if runs is None:
        return
    print_failures(console, runs)
    line, code = submit.final_summary(runs, fail_on_diverged=fail_on_diverged)
    console.print(f"{plan.name}: {line}", highlight=False)
    if code:
        raise typer.Exit(code)


def _said_and_waited(console: Any, plan: Any, res: Any, cluster: str, wait: bool) -> list[Any] | None:
    """What `klsweep run` says of its submission and, with --wait (or --cluster debug), the runs once final
    (None: not waited for)."""
    from klsweep import submit
    from klsweep.console import progress_line, status_table, table_width
    from klsweep.printable import counted

    counts = ", ".join(f"{n} {a}" for a, n in sorted(res.counts().items()))
    console.print(
        f"{plan.name}: {counted(len(plan.runs), 'run')} on {cluster}: {counts}; folder {res.sweep_dir}",
        highlight=False,
    )
    for line in res.hints():
        console.print(line, highlight=False, soft_wrap=True)
    if wait and cluster != "debug":
        from rich.progress import Progress

        with Progress(console=console) as bar:
            task = bar.add_task("runs final", total=len(plan.runs))
            runs = submit.wait_until_final(  # the counts per state and the time left, as status --watch
                res.sweep_dir,
                on_update=lambda rs: bar.update(
                    task,
                    completed=sum(r.state in store.FINAL_STATES for r in rs),
                    description=progress_line(rs),
                ),
            )
        console.print(status_table(runs, title=plan.name, width=table_width(console)))
        return runs
    if cluster == "debug":  # in this process: every run is final already
        return submit.status(res.sweep_dir)
    return None


@app.command("status")
def status_command(
    sweep: Annotated[str, typer.Argument(help="a sweep folder, or the name of one under results/")],
    watch: Annotated[
        bool,
        typer.Option(
            "--watch", help="refresh until all runs are final (2 s apart, up to 30 s while nothing changes)"
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the runs as JSON")] = False,
) -> None:
    """The state of every run of a sweep (one scheduler query); for each failed run, why, its log file and the
    log's last lines."""
    from klsweep import submit
    from klsweep.console import print_failures, print_warning, status_table, table_width, watch_view

    sweep_dir = store.resolve_sweep(sweep)
    store.sweep_runs(sweep_dir)  # a folder without runs is said, as report says it (exit 2)
    problem = submit.scheduler_problem(sweep_dir)
    if problem is not None:
        print_warning(terminal(stderr=True), problem)
    if as_json:
        import json

        print(json.dumps([r.as_dict() for r in submit.status(sweep_dir)], indent=2, default=str))
        return
    console = terminal()
    width = table_width(console)
    if watch:
        from rich.live import Live

        with says_what_goes_on(sweep_dir, "stopped watching"), Live(console=console) as live:
            runs = submit.wait_until_final(
                sweep_dir, on_update=lambda rs: live.update(watch_view(rs, sweep_dir.name, width))
            )
    else:
        runs = submit.status(sweep_dir)
        console.print(status_table(runs, title=sweep_dir.name, width=width))
    print_failures(console, runs)


@app.command("cancel")
def cancel_command(
    sweep: Annotated[str, typer.Argument(help="a sweep folder, or the name of one under results/")],
    runs: Annotated[
        list[str] | None, typer.Argument(help="run ids (default: every run of the sweep)")
    ] = None,
) -> None:
    """Cancel a sweep's live jobs (scancel / stop local jobs) and stop what trains their runs; the runs stopped
    become 'cancelled' (exit 1 when one could not be stopped)."""
    from klsweep import submit
    from klsweep.printable import counted, visible

    done = submit.cancel_runs(store.resolve_sweep(sweep), runs or None)
    terminal().print(
        f"cancelled {counted(len(done.cancelled), 'run')}: {' '.join(done.cancelled)}", highlight=False
    )
    if done.ended:
        terminal().print(
            f"{counted(len(done.ended), 'run')} ended before they could be stopped (kept): {' '.join(done.ended)}",
            highlight=False,
        )
    for rid, why in done.not_stopped.items():
        terminal(stderr=True).print(f"not cancelled: {rid}: {visible(why)}", highlight=False, markup=False)
    if done.not_stopped:
        raise typer.Exit(1)


@app.command("eval")
def eval_command(
    target: Annotated[
        str, typer.Argument(help="a sweep folder (or its name under results/), or one run folder")
    ],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="eval.KEY=VALUE changes to the eval settings (eval.limit=150)")
    ] = None,
    suite: Annotated[
        str | None,
        typer.Option(
            help="eval suite: conf/eval/<NAME>.yaml or a --config-dir's eval/ (default: the runs' own, as their "
            "grid set it)"
        ),
    ] = None,
    backend: Annotated[str | None, typer.Option(help="hf | vllm (default: the suite's)")] = None,
    cluster: Annotated[str, typer.Option(help="local | slurm | debug (in this process)")] = "local",
    checkpoints: Annotated[str, typer.Option(help="last | all")] = "last",
    wait: Annotated[bool, typer.Option("--wait", help="wait for the jobs and print their results")] = False,
    config_dir: Annotated[
        list[str] | None,
        typer.Option("--config-dir", help="more config folders: --suite NAME from DIR/eval/"),
    ] = None,
) -> None:
    """Evaluate finished runs' checkpoints (and the sweep's step-0 baselines) with lm-eval, with the eval
    settings of their grid (eval.limit included) unless --suite or eval.KEY=VALUE overrides change them."""
    from klsweep.console import styled
    from klsweep.submit import submit_eval

    path = Path(target) if Path(target).exists() else Path("results") / target
    if path.is_dir():  # offline: the suite's datasets and the baselines' models must be cached
        from klsweep.fetch import require_cached_for_eval
        from klsweep.submit.evals import check_target, eval_request

        check_target(path)  # a folder it cannot write to is said first
        request = eval_request(
            path, suite, backend, checkpoints, overrides or [], config_dirs=config_dir or []
        )
        require_cached_for_eval(request, path)
    console = terminal()
    said: list[str] = []

    def on_progress(p: Any) -> None:  # --wait: a line per checkpoint scored, with the time left
        from klsweep.console import eval_progress_line

        line = eval_progress_line(p)
        if line.split(";")[0] not in said:
            said.append(line.split(";")[0])
            console.print(line, highlight=False)

    outcome = submit_eval(
        path, suite=suite, backend=backend, cluster=cluster, checkpoints=checkpoints, wait=wait,
        overrides=overrides or [], config_dirs=config_dir or [], on_progress=on_progress,
    )  # fmt: skip
    from klsweep.console import scores_table, table_width

    console.print(f"eval: {outcome.eval}", highlight=False, soft_wrap=True)
    for run, why in outcome.skipped.items():
        console.print(f"skipped {run} ({why})", highlight=False)
    if outcome.nothing_left:
        console.print(
            f"nothing left to do: every checkpoint is scored already under this eval ({len(outcome.scored)} "
            "results); eval.KEY=VALUE or --suite for another eval",
            highlight=False,
            soft_wrap=True,
        )
    elif outcome.scored:
        console.print(f"scored already (not evaluated again): {len(outcome.scored)} results", highlight=False)
    if outcome.todo and not outcome.nothing_left:
        console.print(f"to evaluate: {outcome.todo}", highlight=False, soft_wrap=True)
    for job in outcome.jobs:
        console.print(f"submitted eval job {job}", highlight=False)
    if outcome.results or outcome.nothing_left:  # the scores, as lm-eval prints them
        shown = [*outcome.scored, *outcome.results]
        console.print(scores_table(list(dict.fromkeys(shown)), title="scores", width=table_width(console)))
    for run, message in outcome.errors.items():
        console.print(styled(("eval failed", "bold red"), f": {run}: {message}"), highlight=False)
        if run in outcome.logs:
            console.print(f"log: {outcome.logs[run]}", highlight=False, markup=False, soft_wrap=True)
    if outcome.errors:
        raise typer.Exit(1)
