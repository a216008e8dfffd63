"""The Typer app all of klsweep's commands hang on, the options they share, the CLI's console, and `main`
(the console script: a UserError is one clear message and exit code 2)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from klsweep.errors import UserError

app = typer.Typer(
    name="klsweep",
    help="Sweep KL estimators x placements x levels x beta x models x lag x seeds for GRPO; evaluate; report.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion: tab completion of commands and options (bash, zsh, fish)
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
AddToFolderOpt = Annotated[
    bool,
    typer.Option(
        "--add-to-folder",
        help="add this grid's runs to a sweep folder that holds runs it does not have (another grid of the "
        "same name:, or other overrides); without it that is refused",
    ),
]
MaxRunsOpt = Annotated[
    int | None,
    typer.Option("--max-runs", help="refuse grids of more runs (default: $KLSWEEP_MAX_RUNS, else 100,000)"),
]


def terminal(stderr: bool = False):
    from klsweep.console import cli_console

    return cli_console(stderr)


def require_cached(plan, grid: Path, overrides: list[str] | None) -> None:
    """Offline (cluster.offline or HF_HUB_OFFLINE=1): refuse while the caches lack what the runs load, at the
    commits their folders recorded."""
    from klsweep.fetch import fetch_command, plan_configs, require_cached

    require_cached(plan_configs(plan), fetch_command(grid, overrides, Path(plan.sweep_dir).parent))


@contextlib.contextmanager
def says_what_goes_on(sweep_dir: Path | None = None, what: str = "interrupted") -> Iterator[None]:
    """Around what a command does once a sweep's jobs were submitted (``run --wait``, ``study``, ``status
    --watch``): on Ctrl-C, say which of the sweep's runs go on without this command and how to stop them
    (``console.print_going_on``), then exit 130 as an interrupted command does. The sweep: ``sweep_dir``, or
    the one a ``submit.Interrupted`` names."""
    from klsweep import submit

    try:
        yield
    except KeyboardInterrupt as e:
        folder = e.sweep_dir if isinstance(e, submit.Interrupted) else sweep_dir
        if folder is None:  # before anything was submitted
            raise
        from klsweep.console import print_going_on

        print_going_on(terminal(stderr=True), submit.status(folder), folder, what)
        raise typer.Exit(130) from None


def main() -> None:
    """Console-script entry: run the app, turning UserError into a clear message and exit code 2."""
    try:
        app()
    except UserError as e:
        from klsweep.console import error_line

        terminal(stderr=True).print(error_line(e), highlight=False)
        sys.exit(2)
