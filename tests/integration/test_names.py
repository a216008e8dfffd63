"""Names print as written (docs/FAULTS.md): axis values and claim names holding rich markup, ANSI escapes,
control characters, HTML, Markdown, spreadsheet formulas or matplotlib mathtext reach the terminal, report.md,
report.html, the CSV, the LaTeX and the figures as text, and crash none of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import sweepgen
from clitools import cli
from gridfiles import write

# the axis values: rich markup (a closing tag alone crashed rich), a link, mathtext (crashed matplotlib)
VALUES = ["[/INST]", "[link=file:///etc/passwd]x[/link]", "$\\boxed{2}$"]
NAMES = [
    "[/INST] closes",
    "[bold]b[/bold]",
    "=cmd|' /C calc'!A0",
    "@SUM(1)",
    "\x1b[31mred\x1b[0m",
    "<script>alert(1)</script>",
    "x\r# heading",
    "bell\x07\x08",
]
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")  # anything but a tab and a newline


def _sweep(tmp_path: Path) -> tuple[Path, Path]:
    grid = [{"task.system_prompt": v, "kl.beta": 0.1} for v in VALUES]
    sweep = sweepgen.write_sweep(tmp_path / "names", grid, seeds=2, steps=20)
    claims = [
        {"name": n, "metric": "in_domain", "test": "welch", "direction": "greater",
         "a": {"task.system_prompt": VALUES[0]}, "b": {"task.system_prompt": VALUES[1]}}
        for n in NAMES
    ]  # fmt: skip
    path = tmp_path / "claims.yaml"
    path.write_text(json.dumps({"claims": claims}))
    return sweep, path


def test_report_prints_names_as_written_in_every_format(tmp_path, monkeypatch, capsys):
    sweep, claims = _sweep(tmp_path)
    odd = sweep / "<img src=x onerror=alert(2)>\r# set aside"  # a run folder that cannot be read: set aside
    odd.mkdir()
    (odd / "config.yaml").write_text("model: [\n")
    out = tmp_path / "r"
    args = ["report", sweep, "--out", out, "--claims", claims, "-f", "md,csv,latex,html"]
    code, stdout, err = cli(args, monkeypatch, capsys)
    assert code == 0, err
    # the terminal: markup printed, not applied nor fatal; escapes and control characters visible
    for text in [*VALUES, "[bold]b[/bold]", "\\x1b[31mred\\x1b[0m", "x\\r# heading", "bell\\x07\\x08"]:
        assert text in stdout, text
    assert not CONTROL.search(stdout) and not CONTROL.search(err)
    # report.md: no HTML, no heading, no control character; the names escaped for Markdown
    md = (out / "report.md").read_text()
    assert "<script>" not in md and "<img" not in md and "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert not CONTROL.search(md) and not any(line.startswith("# heading") for line in md.splitlines())
    assert "\\[bold\\]b\\[/bold\\]" in md and "x\\\\r\\# heading" in md
    assert "&lt;img src=x onerror=alert(2)&gt;\\\\r\\# set aside" in md  # a set-aside folder's name too
    assert not any(line.startswith("# set aside") for line in md.splitlines())
    # report.html: escaped, no control character
    page = (out / "report.html").read_text()
    assert "<script>" not in page and "<img src=x" not in page and "&lt;img src=x" in page
    assert not CONTROL.search(page)
    # claims.csv: formulas neutralised as OWASP recommends (a leading '), no control character
    csv = (out / "claims.csv").read_text()
    assert "\n'=cmd|' /C calc'!A0," in csv and "\n'@SUM(1)," in csv
    assert not CONTROL.search(csv)
    # LaTeX: no control character reaches TeX; the figures were drawn with the mathtext value as text
    for tex in out.glob("*.tex"):
        assert not CONTROL.search(tex.read_text()), tex
    assert (out / "curves.png").is_file() and (out / "eval_bars.png").is_file()


def test_plan_prints_markup_in_a_value_as_written(tmp_path, monkeypatch, capsys):
    text = "name: m\ngrid:\n  task.system_prompt: ['[/INST]', '[bold]b', '[link=file:///etc/passwd]x']\n"
    code, stdout, err = cli(["plan", write(tmp_path, text), "--out", tmp_path / "res"], monkeypatch, capsys)
    assert code == 0, err
    for v in ("[/INST]", "[bold]b", "[link=file:///etc/passwd]x"):
        assert v in stdout


def test_task_names_in_the_report_summary_print_as_written(tmp_path, monkeypatch, capsys):
    """The summary's task names come from results.json (a colleague's folder holds anything): report.md
    escaped them for nothing but control characters (`<img ...>` was HTML, `*x*` emphasis, a `\\r` + `# t` a
    heading); report.html now also lists the runs set aside and not there yet, as report.md does."""
    tasks = ("<img src=x onerror=alert(3)>", "*em*\r# t")
    grid = [{"kl.estimator": e, "kl.beta": 0.1} for e in ("k1", "k3")]
    sweep = sweepgen.write_sweep(
        tmp_path / "tasks", grid, seeds=2, steps=20, in_domain=tasks[:1], ood=tasks[1:]
    )
    out = tmp_path / "r"
    code, _, err = cli(["report", sweep, "--out", out, "-f", "md,html"], monkeypatch, capsys)
    assert code == 0, err
    md = (out / "report.md").read_text()
    summary = next(line for line in md.splitlines() if line.startswith("Eval: "))
    assert "in-domain: &lt;img src=x onerror=alert(3)&gt;;" in summary, summary
    assert "out of domain: \\*em\\*\\\\r\\# t." in summary, summary
    assert "<img" not in md and not CONTROL.search(md)
    page = (out / "report.html").read_text()
    assert (
        "<img src=x" not in page and "&lt;img src=x onerror=alert(3)&gt;" in page and not CONTROL.search(page)
    )
