"""The `klsweep` command line: a thin skin over the library. Each command parses its arguments, calls one
library function, and prints. Heavy imports (torch, trl, lm_eval, submitit) happen inside the commands so
that `klsweep --help` is instant.

Expected mistakes raise ``klsweep.errors.UserError``: printed without a traceback, exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from klsweep import store
from klsweep.errors import UserError

app = typer.Typer(
    name="klsweep",
    help="Sweep KL estimators x placements x levels x beta x models x lag x seeds for GRPO; evaluate; report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's own help: flags read `--wait` (typer's rich panels print `--wait <bool>`), plain text that reads
    # at 80 columns and in a pipe
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"klsweep {version('klsweep')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit"),
    ] = False,
) -> None:
    """Sweep KL estimators x placements x levels x beta x models x lag x seeds for GRPO; evaluate; report."""


OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(help="key=value overrides in Hydra's grammar (also +key=v, ++key=v, ~key)"),
]
GridArg = Annotated[
    Path, typer.Argument(help="the grid file, or a shipped grid's name (klsweep grids): tiny, paper, ...")
]
OutOpt = Annotated[Path, typer.Option(help="results root: runs live in OUT/<name>/<run-id>/")]
ConfigDirOpt = Annotated[
    list[str] | None, typer.Option("--config-dir", help="more config-group folders (model/, task/, ...)")
]
MaxRunsOpt = Annotated[
    int | None,
    typer.Option("--max-runs", help="refuse grids of more runs (default: $KLSWEEP_MAX_RUNS, else 100,000)"),
]


def _console(stderr: bool = False):
    from klsweep.console import cli_console

    return cli_console(stderr)


# ---------------------------------------------------------------------------------------------------------
# Commands. Each section is owned by one module; keep the bodies thin.
# ---------------------------------------------------------------------------------------------------------


# --- audit (klsweep/audit/) -------------------------------------------------------------------------------


@app.command("audit")
def audit_command(
    vocab: Annotated[int, typer.Option(help="vocabulary size V of the tabular policy")] = 3,
    length: Annotated[
        int | None,
        typer.Option(help="completion length L (all V**L sequences are enumerated) [default: 3; --grpo: 2]"),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of the random policy, reference and behaviour policy")] = 0,
    ref_distance: Annotated[
        float, typer.Option(help="reference logits = policy logits + this x noise")
    ] = 1.0,
    behavior_shift: Annotated[
        float, typer.Option(help="> 0: off-policy, samples from logits + this x noise (a stale policy)")
    ] = 0.0,
    importance: Annotated[
        str | None,
        typer.Option(
            help="off-policy weighting pi/mu: none | token | sequence | all [default: none; --grpo "
            "off-policy: all]"
        ),
    ] = None,
    reward_logp: Annotated[
        str | None,
        typer.Option(help="--grpo off-policy: current | behavior | all [default: all]"),
    ] = None,
    importance_cap: Annotated[
        float | None, typer.Option(help="--grpo: cap of the importance weights, 0: none [default: 0]")
    ] = None,
    grpo: Annotated[
        bool,
        typer.Option(
            "--grpo",
            help="audit the trainer's whole GRPO objective (advantages, reward mode, loss aggregation): the "
            "effective KL gradient per unit beta",
        ),
    ] = False,
    group_size: Annotated[
        int | None, typer.Option(help="--grpo: completions per group G [default: 4]")
    ] = None,
    groups: Annotated[
        int | None, typer.Option(help="--grpo: groups per step, for --scale-rewards batch [default: 2]")
    ] = None,
    beta: Annotated[float | None, typer.Option(help="--grpo: the KL coefficient [default: 0.1]")] = None,
    scale_rewards: Annotated[
        str | None, typer.Option(help="--grpo: group | batch | none | all [default: group]")
    ] = None,
    reward_mode: Annotated[
        str | None, typer.Option(help="--grpo: separate | shaped | all [default: all]")
    ] = None,
    loss_type: Annotated[str | None, typer.Option(help="--grpo: a TRL loss type [default: dapo]")] = None,
    preset: Annotated[
        str | None,
        typer.Option(
            help="audit framework presets' whole KL configurations instead (klsweep/conf/preset/): NAME, "
            "NAME,NAME or all; with --grpo at the preset's beta unless --beta"
        ),
    ] = None,
    estimator: Annotated[
        str | None, typer.Option(help="show only this estimator's rows: k1 | k2 | k3 | abs")
    ] = None,
    placement: Annotated[
        str | None, typer.Option(help="show only this placement's rows: reward | loss | both")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the rows as a JSON list")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="print the rows as CSV")] = False,
) -> None:
    """Exact bias and variance of every KL configuration's gradient, by enumerating a small tabular policy;
    with --grpo, the exact expected update of the trainer's whole GRPO objective; with --preset, of a
    framework's configuration.

    Columns: err rev / err fwd (rel_err_reverse, rel_err_forward): |E g - grad KL| / |grad KL| against the
    reverse KL(pi||ref) and forward KL(ref||pi) gradients; |E g| (rel_norm): the expected gradient's norm over
    the reverse-KL gradient's; variance: the trace of the per-sample gradient's covariance. --grpo: scale
    (effective_scale): the effective KL gradient per unit beta projected on grad KL(pi||ref), 1 when beta
    means what it says; cos rev / cos fwd: its cosines with the two KL gradients. docs/KL.md explains the
    verdicts."""
    from klsweep import audit, presets
    from klsweep.console import print_audit
    from klsweep.errors import Problem

    grpo_options = {
        "group_size": group_size,
        "groups": groups,
        "beta": beta,
        "scale_rewards": scale_rewards,
        "reward_mode": reward_mode,
        "loss_type": loss_type,
        "reward_logp": reward_logp,
        "importance_cap": importance_cap,
    }
    if grpo:
        grpo_options |= {"behavior_shift": behavior_shift, "importance": importance}
    given = {k: v for k, v in grpo_options.items() if v is not None}
    problems = []
    if as_json and as_csv:
        problems.append(Problem("--json, --csv", "both given", "at most one of them"))
    if given and not grpo:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in given)
        problems.append(Problem(flags, "given without --grpo", "add --grpo"))
    set_by_preset = {"importance": importance} | {
        k: given.get(k) for k in ("reward_mode", "reward_logp", "importance_cap")
    }
    if preset is not None and any(v is not None for v in set_by_preset.values()):
        flags = ", ".join(f"--{k.replace('_', '-')}" for k, v in set_by_preset.items() if v is not None)
        problems.append(Problem(flags, "given with --preset, which sets them", "leave them out"))
    names = [n.strip() for n in preset.split(",")] if preset is not None else []
    for check in (lambda: audit.select([], estimator, placement), lambda: presets.resolve(names)):
        try:
            check()
        except UserError as e:
            problems.extend(e.problems)
    if problems:
        raise UserError(problems)
    if preset is not None:
        keep = {
            k: given[k] for k in ("group_size", "groups", "beta", "scale_rewards", "loss_type") if k in given
        }
        if grpo:
            length = 2 if length is None else length
            rows = audit.grpo_preset_audit(
                names,
                vocab,
                length,
                seed=seed,
                ref_distance=ref_distance,
                behavior_shift=behavior_shift,
                **keep,
            )
        else:
            length = 3 if length is None else length
            rows = audit.preset_audit(names, vocab, length, seed, ref_distance, behavior_shift)
    elif grpo:
        length = 2 if length is None else length
        rows = audit.grpo_audit(vocab=vocab, length=length, seed=seed, ref_distance=ref_distance, **given)
    else:
        length = 3 if length is None else length
        importance = "none" if importance is None else importance
        rows = audit.audit(vocab, length, seed, ref_distance, behavior_shift, importance)
    rows = audit.select(rows, estimator, placement)
    if not rows:
        raise UserError(Problem("--estimator, --placement", "no audited row has them", "another filter"))
    fmt = "json" if as_json else "csv" if as_csv else "table"
    print_audit(_console(), rows, fmt, vocab, length, seed, ref_distance)


# --- plan (klsweep/grid/, klsweep/planner.py) -------------------------------------------------------------


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
) -> None:
    """Show the runs a grid file expands to and what they need (validated, and refused when a run cannot start
    or fit its GPUs; nothing is written or submitted)."""
    from klsweep import console, fetch, planner
    from klsweep import grid as grid_mod

    plan = grid_mod.load_plan(grid, overrides, out=out, config_dirs=config_dir, max_runs=max_runs)
    summary = planner.summary(plan)
    _require_cached(plan, grid, overrides)
    summary["warnings"] += fetch.node_local_warnings(r.config for r in plan.runs)
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
        out = _console()
        width = console.table_width(out)
        out.print(console.plan_table(plan, summary, width=width, runs=runs))
        out.print(console.resources_table(summary, width=width))
        console.print_time(out, summary, width=width)


def _require_cached(plan, grid: Path, overrides: list[str] | None) -> None:
    """Offline (cluster.offline or HF_HUB_OFFLINE=1): refuse while the caches lack what the runs load, at the
    commits their folders recorded."""
    from klsweep.fetch import fetch_command, plan_configs, require_cached

    require_cached(plan_configs(plan), fetch_command(grid, overrides, Path(plan.sweep_dir).parent))


# --- fetch (klsweep/fetch.py) -----------------------------------------------------------------------------


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
    console = _console()
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
    console = _console()
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
    _console(stderr=True).print(f"run {found.id}: {found.run_dir}", highlight=False, soft_wrap=True)
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

    console = _console()
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

    console = _console()
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
    _console().print(f"wrote {written}: klsweep plan {written}", highlight=False, soft_wrap=True)


# --- train (klsweep/job.py) ------------------------------------------------------------------------------


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
    console = _console()
    total = resolved["train"]["steps"]
    status = job.train_run(
        folder, quiet=not verbose,
        on_row=None if verbose else lambda row: console.print(step_line(row, total), highlight=False),
    )  # fmt: skip
    for warning in status.get("warnings") or []:
        console.print(f"warning: {warning}", highlight=False, markup=False, soft_wrap=True)
    _console().print(f"{folder}: {status['state']}", highlight=False, soft_wrap=True)
    if status.get("reason"):
        _console().print(status["reason"], highlight=False, soft_wrap=True)
    if status["state"] == "failed":
        _console(stderr=True).print(status.get("error") or "", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)


# --- report (klsweep/report/) ---------------------------------------------------------------------------


@app.command("report")
def report_command(
    sweep: Annotated[str, typer.Argument(help="a sweep folder, or the name of one under results/")],
    fmt: Annotated[
        list[str] | None,
        typer.Option(
            "--format",
            "-f",
            help="md | csv | latex | html | pdf (the figures' PDF copies, latex too); repeat or comma-separate",
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
) -> None:
    """Tables (results, stability, KL gradient audit, the study's numbers) and plots of a sweep, as it stands;
    logged to W&B beside the runs when they mirrored online (--wandb: offline too)."""
    from klsweep.console import print_report, print_report_tables
    from klsweep.report import build_report

    console = _console()
    report = build_report(
        sweep, out_dir=out, formats=fmt or ["md"], eval_hash=eval_hash, wandb=wandb, claims=claims,
        on_tables=None if quiet else lambda r: print_report_tables(console, r),  # while the figures are drawn
    )  # fmt: skip
    print_report(console, _console(stderr=True), report, tables=False)


# --- eval (klsweep/evaluate/, submitted by klsweep/submit/) --------------------------------------------


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
    from rich.markup import escape

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
    outcome = submit_eval(
        path, suite=suite, backend=backend, cluster=cluster, checkpoints=checkpoints, wait=wait,
        overrides=overrides or [], config_dirs=config_dir or [],
    )  # fmt: skip
    console = _console()
    console.print(f"eval: {escape(outcome.eval)}", highlight=False, soft_wrap=True)
    for run, why in outcome.skipped.items():
        console.print(f"skipped {run} ({why})", highlight=False)
    for job in outcome.jobs:
        console.print(f"submitted eval job {job}", highlight=False)
    for result in outcome.results:
        console.print(str(result), highlight=False, soft_wrap=True)
    for run, message in outcome.errors.items():
        console.print(f"[bold red]eval failed[/]: {escape(run)}: {escape(message)}", highlight=False)
        if run in outcome.logs:
            console.print(f"log: {outcome.logs[run]}", highlight=False, markup=False, soft_wrap=True)
    if outcome.errors:
        raise typer.Exit(1)


# --- run / status / cancel (klsweep/submit/) -------------------------------------------------------------


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
) -> None:
    """Submit a sweep: every run not done yet (rerunning skips done runs and resumes unfinished ones). With
    --wait (or --cluster debug), exit 1 when a run or its eval failed or was cancelled; diverged runs are
    results (exit 0) unless --fail-on-diverged."""
    from klsweep import grid as grid_mod
    from klsweep import planner, submit
    from klsweep.console import print_failures, progress_line, status_table, table_width

    plan = grid_mod.load_plan(grid, overrides, out=out, config_dirs=config_dir, max_runs=max_runs)
    planner.check(plan)  # refuses runs that cannot start or fit
    _require_cached(plan, grid, overrides)
    cluster = cluster or submit.default_cluster(plan)
    console = _console()
    res = submit.submit(
        plan, cluster, retry_failed=retry_failed, force=force,
        on_build=lambda p: console.print(f"building the tiny model (once, cached in {p})", highlight=False),
    )  # fmt: skip
    counts = ", ".join(f"{n} {a}" for a, n in sorted(res.counts().items()))
    console.print(
        f"{plan.name}: {len(plan.runs)} runs on {cluster}: {counts}; folder {res.sweep_dir}", highlight=False
    )
    for line in res.hints():
        console.print(line, highlight=False, markup=False, soft_wrap=True)
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
    elif cluster == "debug":  # in this process: every run is final already
        runs = submit.status(res.sweep_dir)
    else:
        return
    print_failures(console, runs)
    line, code = submit.final_summary(runs, fail_on_diverged=fail_on_diverged)
    console.print(f"{plan.name}: {line}", highlight=False)
    if code:
        raise typer.Exit(code)


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
        print_warning(_console(stderr=True), problem)
    if as_json:
        import json

        print(json.dumps([r.as_dict() for r in submit.status(sweep_dir)], indent=2, default=str))
        return
    console = _console()
    width = table_width(console)
    if watch:
        from rich.live import Live

        with Live(console=console) as live:
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
    """Cancel a sweep's live jobs (scancel / stop local jobs); their runs become 'cancelled'."""
    from klsweep import submit

    cancelled = submit.cancel(store.resolve_sweep(sweep), runs or None)
    _console().print(f"cancelled {len(cancelled)} run(s): {' '.join(cancelled)}", highlight=False)


# --- study (klsweep/study.py) -------------------------------------------------------------------------------


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
            help="a claims.csv (e.g. the committed results/tiny/report/claims.csv, read before the study "
            "overwrites it): compare this study's verdicts with it; exit 1 when one it calls robust differs "
            "(replication >= 0.8, or no replication column)"
        ),
    ] = None,
    config_dir: ConfigDirOpt = None,
) -> None:
    """Train every run of a grid, evaluate them all (and the step-0 baseline), write the report."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from klsweep.console import print_failures, print_report, progress_line, status_table, table_width
    from klsweep.report.statistics import FRAGILE
    from klsweep.report.tables import visible
    from klsweep.study import run_study

    console = _console()
    start = time.time()
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task("runs final", total=None)

    def on_stage(stage: str) -> None:
        console.print(f"[bold]{time.time() - start:6.0f}s[/] {stage}", highlight=False)

    last: list[str] = []

    def on_progress(runs: list) -> None:
        summary = progress_line(runs, eta=False)
        if not console.is_terminal:  # a log file: one line whenever something changed
            if summary != (last[-1] if last else None):
                last.append(summary)
                console.print(f"{time.time() - start:6.0f}s   {progress_line(runs)}", highlight=False)
            return
        if not progress.live.is_started:
            progress.start()
        done = sum(r.state in store.FINAL_STATES for r in runs)
        progress.update(task, total=len(runs), completed=done, description=progress_line(runs))

    try:
        res = run_study(
            grid,
            overrides,
            cluster=cluster,
            out=out,
            retry_failed=retry_failed,
            on_stage=on_stage,
            on_progress=on_progress,
            expect_claims=expect_claims,
            config_dirs=config_dir,
        )
    finally:
        progress.stop()
    width = table_width(console)
    console.print(status_table(res.runs, title=res.sweep_dir.name, width=width))
    print_failures(console, res.runs)
    print_report(console, _console(stderr=True), res.report)
    console.print(f"study done in {time.time() - start:.0f} s", highlight=False)
    if res.claim_changes is not None:
        ours = res.report.claims.get("claim", []) if res.report.claims is not None else []
        fragile = res.fragile_changes or []
        n = len({*ours, *(c for c, _, _ in [*res.claim_changes, *fragile])})
        if not res.claim_changes:
            same = f"{n - len(fragile)} of {n}" if fragile else f"all {n}"
            console.print(f"claims: {same} verdicts as in {expect_claims}", highlight=False)
        else:
            console.print(
                f"[bold red]claims: {len(res.claim_changes)} of {n} verdicts robust in {expect_claims} "
                "differ (a claim on one side only reads missing on the other):[/]",
                highlight=False,
            )
            for claim, want, got in res.claim_changes:
                console.print(
                    f"  {visible(claim)}: expected {want}, got {got}", highlight=False, markup=False
                )
        if fragile:
            console.print(
                f"claims: {len(fragile)} expected-fragile (replication under {FRAGILE:g} there) changed:",
                highlight=False,
            )
            for claim, want, got in fragile:
                console.print(
                    f"  {visible(claim)}: expected {want}, got {got}", highlight=False, markup=False
                )
        if res.cpu_note:
            console.print(f"note: {res.cpu_note}", highlight=False, markup=False)
        if res.claim_changes:
            raise typer.Exit(1)


def main() -> None:
    """Console-script entry: run the app, turning UserError into a clear message and exit code 2."""
    try:
        app()
    except UserError as e:
        from rich.markup import escape

        from klsweep.report.tables import visible

        text = "\n".join(visible(line) for line in str(e).split("\n"))  # a name's control characters visible
        _console(stderr=True).print(f"[bold red]error[/]: {escape(text)}", highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
