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


def test_every_command_prints_an_escape_in_a_folder_name_visibly(tmp_path, monkeypatch, capsys):
    """Issue 44 D7: `klsweep status` printed a run folder's name raw in the lines under its table (a real ESC
    reached the terminal; the table's cell was escaped), `report` the paths it wrote, `cancel` the runs it
    cancelled. Every line of every command goes through one escaping (the CLI's console): an ESC in a folder's
    name, a results folder's, a run's reason reads `\\x1b` in plan, run, status, eval, cancel and report."""
    import shutil

    from klsweep import grid as grid_mod
    from klsweep import store

    esc = "\x1b[2J"  # clear the screen: not a colour, which the tests' cli() takes for rich's own
    where = tmp_path / f"w{esc}"
    where.mkdir()
    grid = write(
        where,
        "name: esc\nbase: {model: tiny, task: tiny, eval: tiny, train.steps: 2}\ngrid: {seed: range(2)}\n",
    )
    out = where / f"results{esc}"
    outputs = {}

    def run(*args):
        code, stdout, err = cli(list(args), monkeypatch, capsys, columns=100)
        outputs[args[0]] = stdout + err
        return code, stdout + err

    assert run("plan", grid, "--out", out)[0] == 0
    plan = grid_mod.load_plan(grid, out=out)
    sweep = Path(plan.sweep_dir)
    for r in plan.runs:  # failed before: run skips them, status says why
        Path(r.run_dir).mkdir(parents=True)
        store.write_status(r.run_dir, "failed", step=1, reason=f"RuntimeError: boom{esc}", error=None)
    code, said = run("run", grid, "--out", out)
    assert code == 0 and "skip-failed" in said, said
    waiting = sweep / f"waiting{esc}run"  # a folder of its own: status and cancel name it
    shutil.copytree(plan.runs[0].run_dir, waiting)
    store.write_status(waiting, "pending")
    assert run("status", sweep)[0] == 0
    code, said = run("eval", waiting, "--cluster", "debug")
    assert code != 0 and "no complete checkpoint" in said, said
    code, said = run("cancel", sweep, waiting.name)
    assert code == 0 and "cancelled 1 run:" in said, said
    assert run("report", sweep, "--out", where / f"report{esc}")[0] == 0
    for command, text in outputs.items():
        assert "\x1b" not in text and "\\x1b[2J" in text, (command, text)
    assert "boom\\x1b[2J" in outputs["status"] and "waiting\\x1b[2Jrun" in outputs["cancel"]
