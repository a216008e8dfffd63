"""Commands that read results: report (klsweep/report/) and study (train -> eval -> report,
klsweep/study.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from klsweep import store
from klsweep.cli.app import AddToFolderOpt, ConfigDirOpt, OverridesArg, app, says_what_goes_on, terminal


@app.command("report")
def report_command(
    sweep: Annotated[str, typer.Argument(help="a sweep folder, or the name of one under results/")],
    fmt: Annotated[
        list[str] | None,
        typer.Option(
            "--format",
            "-f",
            help="md | csv | latex | html | pdf (the figures' PDF copies, latex too); repeat or "
            "comma-separate (default: md, csv, latex, html: what klsweep study writes)",
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="where to write (default: <sweep>/report/)")] = None,
    eval_hash: Annotated[
        str | None, typer.Option(help="the eval to report, by hash (default: the one the runs' grid names)")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the paths written")] = False,
    wandb: Annotated[
        bool | None,
        typer.Option(
            "--wandb/--no-wandb",
            help="log the report to W&B (default: when the runs mirrored online; --wandb: offline too)",
        ),
    ] = None,
    claims: Annotated[
        Path | None,
        typer.Option(
            help="a YAML file with a claims: list to test (default: the sweep's grid file's claims)"
        ),
    ] = None,
    labels: Annotated[
        Path | None,
        typer.Option(
            help="a YAML file with a labels: list naming the configurations (default: the sweep's grid file's)"
        ),
    ] = None,
) -> None:
    """Tables (results, stability, KL gradient audit, the study's numbers) and plots of a sweep, as it stands;
    logged to W&B beside the runs when they mirrored online (--wandb: offline too)."""
    from klsweep.console import print_report, print_report_tables
    from klsweep.report import DEFAULT_FORMATS, build_report

    console = terminal()
    said = terminal(stderr=True)  # the stages, and the time left, beside the tables
    report = build_report(
        sweep, out_dir=out, formats=fmt or DEFAULT_FORMATS, eval_hash=eval_hash, wandb=wandb, claims=claims,
        labels=labels,
        on_tables=None if quiet else lambda r: print_report_tables(console, r),  # while the figures are drawn
        on_progress=None if quiet else lambda line: said.print(line, highlight=False, markup=False),
    )  # fmt: skip
    print_report(console, terminal(stderr=True), report, tables=False)


@app.command("study")
def study_command(
    grid: Annotated[
        Path,
        typer.Argument(help="the grid file or a shipped grid's name, e.g. tiny (it must name an eval suite)"),
    ],
    overrides: OverridesArg = None,
    cluster: Annotated[
        str | None, typer.Option(help="local | slurm | debug; default: the grid's cluster.kind")
    ] = None,
    out: Annotated[Path, typer.Option(help="results root: runs live in OUT/<name>/<run-id>/")] = Path(
        "results"
    ),
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="resubmit failed/cancelled runs")
    ] = False,
    expect_claims: Annotated[
        Path | None,
        typer.Option(
            help="a claims.csv (e.g. results/tiny/report/claims.csv in a clone of the repository, read before the study "
            "overwrites it): compare this study's verdicts with it; exit 1 when one it calls robust differs "
            "(not fragile there: replication - 2 of its Monte Carlo errors >= 0.9; a file without the error: "
            "replication >= 0.9; without the column: every verdict)"
        ),
    ] = None,
    config_dir: ConfigDirOpt = None,
    add_to_folder: AddToFolderOpt = False,
) -> None:
    """Train every run of a grid, evaluate them all (and the step-0 baseline), write the report. Exit 1 when
    a run failed, was cancelled or never started (diverged runs are results: exit 0)."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from klsweep.console import (
        eval_progress_line,
        print_failures,
        print_report,
        progress_line,
        status_table,
        styled,
        table_width,
    )
    from klsweep.printable import visible
    from klsweep.report.statistics import FRAGILE
    from klsweep.study import run_study

    console = terminal()
    start = time.time()
    progress = Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task("runs final", total=None)

    def on_stage(stage: str) -> None:
        console.print(styled((f"{time.time() - start:6.0f}s", "bold"), f" {stage}"), highlight=False)

    last: list[str] = []

    def show(line: str, done: int, total: int) -> None:
        """A progress line: in a terminal the bar's; in a log file a line whenever it changes beyond its time
        left."""
        if not console.is_terminal:
            if line.split(";")[0] != (last[-1] if last else None):
                last.append(line.split(";")[0])
                console.print(f"{time.time() - start:6.0f}s   {line}", highlight=False)
            return
        if not progress.live.is_started:
            progress.start()
        progress.update(task, total=total, completed=done, description=line)

    def on_progress(runs: list) -> None:
        show(progress_line(runs), sum(r.state in store.FINAL_STATES for r in runs), len(runs))

    def on_eval_progress(p: Any) -> None:  # submit.EvalProgress: the same bar, its own line
        show(eval_progress_line(p), p.scored, p.total)

    with says_what_goes_on():  # Ctrl-C: which runs go on, how to stop them
        try:
            res = run_study(
                grid,
                overrides,
                cluster=cluster,
                out=out,
                retry_failed=retry_failed,
                on_stage=on_stage,
                on_progress=on_progress,
                on_eval_progress=on_eval_progress,
                expect_claims=expect_claims,
                config_dirs=config_dir,
                add_to_folder=add_to_folder,
            )
        finally:
            progress.stop()
    width = table_width(console)
    console.print(status_table(res.runs, title=res.sweep_dir.name, width=width))
    print_failures(console, res.runs)  # a run's failed eval too, with why
    errors = res.eval.errors if res.eval is not None else {}
    for where, why in sorted(errors.items()):  # the step-0 baseline's: no run of its own to say it
        if Path(where).name == store.BASELINE_DIR:
            console.print("--- step-0 baseline (eval failed) ---", highlight=False, markup=False)
            console.print(visible(why), style="red", highlight=False, markup=False)
    if res.report is not None:
        print_report(console, terminal(stderr=True), res.report)
    line, code = res.summary()
    took = f"{time.time() - start:.0f} s"
    if res.report is None:  # no run trained to its end: nothing evaluated, no report
        line += "; nothing to evaluate, no report written"
    if code:
        console.print(styled((f"study not done ({took}): ", "bold red"), visible(line)), highlight=False)
    else:
        console.print(f"study done in {took}: {visible(line)}", highlight=False)
    if res.claim_changes is not None:
        ours = res.report.claims.get("claim", []) if res.report.claims is not None else []
        fragile = res.fragile_changes or []
        n = len({*ours, *(c for c, _, _ in [*res.claim_changes, *fragile])})
        if not res.claim_changes:
            same = f"{n - len(fragile)} of {n}" if fragile else f"all {n}"
            console.print(f"claims: {same} verdicts as in {expect_claims}", highlight=False)
        else:
            console.print(
                styled(
                    (
                        f"claims: {len(res.claim_changes)} of {n} verdicts robust in {expect_claims} "
                        "differ (a claim on one side only reads missing on the other):",
                        "bold red",
                    )
                ),
                highlight=False,
            )
            for claim, want, got in res.claim_changes:
                console.print(f"  {visible(claim)}: expected {want}, got {got}", highlight=False)
        if fragile:
            console.print(
                f"claims: {len(fragile)} expected-fragile (replication under {FRAGILE:g} there, or within 2 "
                "Monte Carlo errors of it) changed:",
                highlight=False,
            )
            for claim, want, got in fragile:
                console.print(f"  {visible(claim)}: expected {want}, got {got}", highlight=False)
        if res.cpu_note:
            console.print(f"note: {res.cpu_note}", highlight=False)
        if res.claim_changes:
            raise typer.Exit(1)
    if code:
        raise typer.Exit(code)
