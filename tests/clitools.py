"""`klsweep ARGS` run in a test's process (tests/ is on sys.path under pytest)."""

from __future__ import annotations

import sys


def cli(
    args: list[str], monkeypatch, capsys, columns: int = 400, terminal: bool = False
) -> tuple[int, str, str]:
    """Run `klsweep ARGS` in this process; returns (exit code, stdout, stderr). ``terminal``: rich takes the
    (captured) output for a terminal of ``columns`` columns (TTY_COMPATIBLE), escape codes removed."""
    import re

    from klsweep import cli as cli_mod

    monkeypatch.setenv("COLUMNS", str(columns))
    if terminal:
        monkeypatch.setenv("TTY_COMPATIBLE", "1")
    else:
        monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.setattr(sys, "argv", ["klsweep", *map(str, args)])
    code = 0
    try:
        cli_mod.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    return code, ansi.sub("", out), ansi.sub("", err)


def render(*tables, width: int | None) -> str:
    """What the CLI prints of rich ``tables``: a terminal of ``width`` columns, or (None) a pipe."""
    import io
    import re

    from rich.console import Console

    from klsweep import console as con

    out = io.StringIO()
    c = Console(file=out, width=width or con.PIPE_WIDTH, force_terminal=width is not None, color_system=None)
    for t in tables:
        c.print(t)
    return re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())


def two_ranks(argv: list[str], env: dict[str, str] | None = None, stderr=None) -> list:
    """``argv`` started as ranks 0 and 1 of a 2-process torch.distributed job on this machine (a free port on
    127.0.0.1, RANK/LOCAL_RANK/WORLD_SIZE set; ``env`` added), stdout piped, text mode."""
    import os
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [
        subprocess.Popen(
            argv,
            env={
                **os.environ,
                "PYTHONWARNINGS": "ignore",
                **(env or {}),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
            stdout=subprocess.PIPE,
            stderr=stderr if stderr is not None else subprocess.DEVNULL,
            text=True,
        )
        for rank in (0, 1)
    ]
