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

from klsweep.errors import UserError

app = typer.Typer(
    name="klsweep",
    help="Sweep KL estimators x placements x levels x beta x models x lag x seeds for GRPO; evaluate; report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

OverridesArg = Annotated[list[str] | None, typer.Argument(help="key=value overrides in Hydra's grammar")]


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr)


# ---------------------------------------------------------------------------------------------------------
# Commands. Each section is owned by one module; keep the bodies thin.
# ---------------------------------------------------------------------------------------------------------


def main() -> None:
    """Console-script entry: run the app, turning UserError into a clear message and exit code 2."""
    try:
        app()
    except UserError as e:
        _console(stderr=True).print(f"[bold red]error[/]: {e}", highlight=False, markup=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
