"""Output to a pipe: lines not padded to a table's width (`klsweep keys | grep`), and a reader that goes away
(`klsweep report ... | head`) neither fails the command nor stops its files being written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from clitools import cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sweep_tiny"


def test_keys_lines_are_not_padded_in_a_pipe(monkeypatch, capsys):
    code, out, _ = cli(["keys", "train"], monkeypatch, capsys)
    assert code == 0 and "train.learning_rate" in out
    assert [line for line in out.splitlines() if line.endswith(" ")] == []


def test_report_into_a_closed_pipe_keeps_its_files_and_exits_0(tmp_path):
    out = tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("COLUMNS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "klsweep", "report", FIXTURE, "--out", out],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline()  # `| head -1`: one line read, the pipe closed
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    assert b"BrokenPipe" not in err and b"Traceback" not in err
    assert (
        (out / "report.md").is_file() and (out / "curves.png").is_file() and (out / "eval_bars.png").is_file()
    )
