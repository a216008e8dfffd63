"""The `klsweep` command line: a thin skin over the library, one module per group of commands on one Typer
`app` (app.py). Each command parses its arguments, calls one library function, and prints. Heavy imports (torch, trl, lm_eval, submitit) happen inside the commands so
that `klsweep --help` is instant.

Expected mistakes raise ``klsweep.errors.UserError``: printed without a traceback, exit code 2.
"""

from klsweep.cli import audit, preview, runs, study, support  # noqa: F401  (each registers its commands on app)
from klsweep.cli.app import app, main

__all__ = ["app", "main"]
