"""What the terminal shows: the status and report tables at 80 columns (a terminal) and piped (full width, no
line wrapped), run ids and model names never cut, one label for the runs without KL, the help's flags and
``--version``."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from clitools import render
from typer.testing import CliRunner

from klsweep import console as con
from klsweep import report as rp
from klsweep.cli import app
from klsweep.submit import RunStatus

FIXTURE = Path(__file__).parents[1] / "fixtures" / "sweep_tiny"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def paper_like_runs() -> list[RunStatus]:
    """The rows `klsweep status` gets for a paper-sized sweep: six axes, no-KL runs, GPU hours, Slurm ids."""
    runs = []
    for i, (model, est, plc, beta, lag, seed) in enumerate(
        [
            ("qwen3-4b-instruct-2507", "k3", "reward", 0.3, 10, 2),
            ("qwen3-4b-instruct-2507", "k3", "loss", 0.0, 0, 0),  # beta 0: no KL, whatever est/placement hold
            ("llama-3.1-8b-instruct", "k1", "both", 0.05, 0, 1),
            ("qwen2.5-7b", "k1", "reward", 1.0, 0, 0),
            ("llama-3.1-8b-instruct", "k1", "both", 0.05, 0, 0),
        ]
    ):
        params = {
            "model": model,
            "kl.estimator": est,
            "kl.placement": plc,
            "kl.beta": beta,
            "offpolicy.lag": lag,
        }
        runs.append(
            status_row(
                f"{i}cd5e4e3c{i}",
                params | {"seed": seed},
                state=["done", "running", "failed", "diverged", "pending"][i],
                step=100,
                total_steps=500,
                reward=0.26 + i / 100,
                elapsed_s=3600.0 * (i + 1),
                gpu_hours=8.0 * (i + 1),
                job_id=f"123456_{i}{i}",
                cluster="slurm",
                eval_state=["done", None, None, "done", None][i],
            )
        )
    return runs


def status_row(run_id: str, params: dict, **fields) -> RunStatus:
    """A row of ``klsweep.submit.status``: a done local run unless ``fields`` say otherwise."""
    defaults = dict(state="done", step=0, total_steps=None, reward=None, elapsed_s=0.0, gpu_hours=0.0,
                    job_id=None, cluster="local", eval_state=None, log_tail=[])  # fmt: skip
    return RunStatus(run_id=run_id, params=params, **(defaults | fields))


@pytest.mark.parametrize("width", [80, None])
def test_status_table_reads_at_80_columns_and_piped(width):
    runs = paper_like_runs()
    out = render(con.status_table(runs, title="paper", width=width), width=width)
    lines = out.splitlines()
    if width:
        assert max(len(line) for line in lines) <= 80, out
        assert "not shown at 80 columns" in out  # what was dropped is named
    else:
        assert "not shown" not in out and all(r.job_id in out for r in runs)  # full width: every column
    assert "…" not in out
    header = next(line.split() for line in lines if line.split()[:1] == ["run"])
    axes = ["est.", "placement", "beta", "lag", "seed"]
    # too wide for 80 columns with the model's name: one table per model, titled with it
    assert header[: 7 + (width is None)] == ["run", *(["model"] if width is None else []), *axes, "state"]
    ids = {r.run_id for r in runs}
    rows = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in ids}
    assert set(rows) == ids  # every id whole, one row each
    title = ""
    for line in lines:
        if line.startswith("paper"):
            title = line
        elif line.split() and line.split()[0] in ids:
            r = next(r for r in runs if r.run_id == line.split()[0])
            assert r.params["model"] in (title.split() if width else line.split())  # model names whole
            assert r.state in line
    assert (
        "no KL" in rows["1cd5e4e3c1"] and "k3" not in rows["1cd5e4e3c1"] and "loss" not in rows["1cd5e4e3c1"]
    )
    assert "done" in rows["0cd5e4e3c0"].split()[-6:]  # the eval column
    # sorted by configuration: llama (seed 0, then 1), qwen2.5, qwen3 (k3 before no KL)
    assert [line.split()[0] for line in lines if line.split() and line.split()[0] in rows] == [
        "4cd5e4e3c4", "2cd5e4e3c2", "3cd5e4e3c3", "0cd5e4e3c0", "1cd5e4e3c1"
    ]  # fmt: skip


@pytest.mark.parametrize("width", [80, None])
def test_status_table_shows_what_slurm_says_beyond_the_state(width):
    """Slurm's state and pending reason where they add to klsweep's: a mark after the state and a legend at
    80 columns (however long Slurm's word), a ``scheduler`` column on a pipe; nothing when the scheduler's
    state only repeats klsweep's (COMPLETED for done, FAILED for failed, a pending job with no reason yet)."""
    runs = paper_like_runs()
    ordinary = render(con.status_table(runs, title="paper", width=width), width=width)
    runs[0].job_state = "COMPLETED"
    runs[1].job_state = "RUNNING"
    assert render(con.status_table(runs, title="paper", width=width), width=width) == ordinary
    assert "scheduler" not in ordinary
    runs[2].job_state = "TIMEOUT"  # failed
    runs[4].job_state, runs[4].job_reason = "PENDING", "QOSMaxJobsPerUserLimit"
    out = render(con.status_table(runs, title="paper", width=width), width=width)
    row = {line.split()[0]: line for line in out.splitlines() if line.split()}
    if width:
        assert max(len(line) for line in out.splitlines()) <= 80, out
        assert " pending¹ " in row[runs[4].run_id] and " failed² " in row[runs[2].run_id]  # down the table
        assert "scheduler: ¹ PENDING (QOSMaxJobsPerUserLimit), ² TIMEOUT" in " ".join(out.split()), out
    else:
        assert re.search(r" failed +TIMEOUT ", row[runs[2].run_id]), out
        assert re.search(r" pending +PENDING \(QOSMaxJobsPerUserLimit\) ", row[runs[4].run_id]), out
        assert "scheduler" in row["run"]


@pytest.mark.parametrize("width", [80, None])
def test_report_tables_read_at_80_columns_and_piped(tmp_path, width):
    rep = rp.build_report(FIXTURE, tmp_path, formats=("md",))
    out = render(*rp.rich_tables(rep, width=width), width=width)
    if width:
        assert max(len(line) for line in out.splitlines()) <= 80, out
    # every number on one line; its 95% CI over 2 seeds (12.7 x 0.1 = ±1.27) is wider than the score's range:
    # not given, "±n/i" and the caption says why (issue 49), never "0.70±1.27"
    k1 = next(line for line in out.splitlines() if line.split()[:2] == ["k1", "reward"])
    assert "2/3" in k1 and "0.70±n/i" in k1 and "+0.50±n/i" in k1 and "1.27" not in out
    assert "not informative with 2 seeds" in " ".join(out.split())
    stab = [line for line in out.splitlines() if line.split()[:2] == ["k3", "reward"]][-1]
    assert "1/3" in stab and "1/2" in stab  # diverged of the runs, collapsed of those with metrics
    assert "in-domain 0.20, OOD 0.10" in " ".join(out.split())  # the step-0 baseline, in the caption
    for header in ("estimator", "placement", "diverged", "collapsed", "OOD"):
        assert header in out


def test_no_kl_reads_the_same_in_the_report(tmp_path):
    """A beta = 0 run: 'no KL' in the report as in plan and status (config.without_kl_when_off)."""
    import shutil

    import yaml

    sweep = tmp_path / "s"
    shutil.copytree(FIXTURE, sweep)
    run = sweep / "a1-k1rew-s0"
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["kl"]["beta"] = 0.0
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    rep = rp.build_report(sweep, tmp_path / "r", formats=("md",))
    out = render(*rp.rich_tables(rep, width=80), width=80)
    assert "no KL" in out and "none" not in out
    assert "no KL" in (tmp_path / "r" / "report.md").read_text()


def test_help_flags_and_version():
    runner = CliRunner()
    help_text = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "80"}).output
    assert "--wait" in help_text and "--fail-on-diverged" in help_text
    assert "<bool>" not in help_text
    assert max(len(line) for line in help_text.splitlines()) <= 80
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and re.fullmatch(r"klsweep \d+\.\d+\.\d+\S*\n", version.output)


@pytest.mark.parametrize("width", [80, None])
def test_time_table_reads_at_80_columns_and_piped(tmp_path, width):
    """The paper plan's time table (klsweep.cost's estimates): every model whole, the estimate beside the limit
    at 80 columns (optional columns dropped first); every column on a pipe."""
    from klsweep import grid, planner

    plan = grid.load_plan(Path(__file__).resolve().parents[2] / "sweeps" / "paper.yaml", out=tmp_path)
    counts = planner.summary(plan)
    text = render(con.time_table(counts, width=width), width=width)
    lines = text.splitlines()
    header = next(line.split() for line in lines if line.split()[:1] == ["model"])
    assert {"s/step", "h/run", "USR2", "GPU-h", "limit"} <= set(header)  # the GPU's name goes first at 80
    for model in ("qwen2.5-7b", "llama-3.1-8b-instruct", "qwen3-4b-instruct-2507"):
        row = next(line.split() for line in lines if line.split()[:1] == [model])
        assert any(cell.endswith("/24" if "qwen3" not in model else "/16") for cell in row)  # h/run of limit
    if width:
        assert max(len(line) for line in lines) <= 80
    else:
        assert {"GPU", "gen", "jobs"} <= set(header) and "h100-80gb" in text
    # the band: a step's and the GPU-hours' low and high ends, the preemption signal's delay (derived)
    row = next(line.split() for line in lines if line.split()[:1] == ["qwen2.5-7b"])
    low, high = (float(x) for x in next(c for c in row if re.fullmatch(r"\d+-\d+", c)).split("-"))
    assert 0 < low < high
    assert str(next(r for r in counts["resources"] if r["model"] == "qwen2.5-7b")["signal_delay_s"]) in row
    assert re.search(r"[\d,]+-[\d,]+ GPU-hours estimated", " ".join(text.split()))
    assert "…" not in text


def test_report_on_a_pipe_fits_the_columns_asked_for(tmp_path, monkeypatch, capsys):
    """`COLUMNS=80 klsweep report SWEEP | less`: the tables fit 80 columns (optional columns dropped and named);
    without a width asked for, a pipe gets every column at full width."""
    import sweepgen
    from clitools import cli

    sweep = sweepgen.write_sweep(tmp_path / "wide", sweepgen.wide_grid(), seeds=2)
    code, narrow, _ = cli(["report", sweep, "--out", tmp_path / "r"], monkeypatch, capsys, columns=80)
    assert code == 0 and "Results" in narrow
    assert max(map(len, narrow.splitlines())) <= 80, narrow
    assert "not shown at 80 columns" in narrow
    code, wide, _ = cli(["report", sweep, "--out", tmp_path / "r"], monkeypatch, capsys, columns=400)
    assert code == 0 and max(map(len, wide.splitlines())) > 80 and "not shown at" not in wide


def test_a_warning_on_a_pipe_without_columns_wraps_at_80_and_keeps_a_long_path_whole(monkeypatch):
    from rich.console import Console

    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    piped = Console(file=out, width=con.PIPE_WIDTH, color_system=None)  # cli_console's on a pipe
    path = "/a/folder/name/long/enough/" * 4
    con.print_warning(piped, "word " * 40 + f"see {path} for more")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("warning: word") and all(line.startswith("  ") for line in lines[1:])
    assert [line for line in lines if len(line) > 80] == [f"  {path}"]  # the one word longer than a line
    assert (
        " ".join(out.getvalue().split())
        == "warning: " + " ".join(("word " * 40).split()) + f" see {path} for more"
    )


def test_a_caption_ending_a_sentence_then_the_dropped_columns():
    from klsweep.report.terminal import fitted_table

    rows = [["k1", "x" * 30, "y" * 30, "z" * 30]]
    table = fitted_table(
        "t", ["a", "b", "c", "d"], rows, width=80, optional=["d"], caption="collapsed 0 of 700 (0%)."
    )
    flat = " ".join(render(table, width=80).split())
    assert "collapsed 0 of 700 (0%); not shown at 80 columns: d" in flat


@pytest.mark.parametrize("width", [80, None])
def test_status_of_a_five_axis_sweep_wraps_no_cell_at_80_columns(width):
    """The tiny study's shape (estimator, placement, lag, importance, beta, seed; collapsed runs at 300 steps):
    too wide for 80 columns with every column, so the optional ones go (eval last), then the headers shorten
    (spelled out in the caption); no cell is wrapped. Piped: every column, full headers."""
    runs = [
        status_row(
            f"{i:02d}a0b1c2d3",
            {
                "kl.estimator": est,
                "kl.placement": plc,
                "offpolicy.lag": lag,
                "kl.importance": imp,
                "kl.beta": beta,
                "seed": i,
            },  # fmt: skip
            state="diverged" if i % 2 else "done",
            step=97 if i % 2 else 300,
            total_steps=300,
            reward=0.25,
            elapsed_s=600.0,
            job_id=f"3072{i}",
            eval_state="done",
            reason="reward collapse at step 97" if i % 2 else None,
        )
        for i, (est, plc, lag, imp, beta) in enumerate(
            [
                ("k1", "reward", 0, "none", 1.0),
                ("k3", "both", 16, "sequence", 1.0),
                ("k3", "loss", 0, "none", 0.0),
            ]
        )
    ]
    out = render(con.status_table(runs, title="tiny", width=width), width=width)
    rows = [line.split() for line in out.splitlines() if line[:2].isdigit()]
    assert len(rows) == 3  # one line a run: no cell wrapped
    expected = [("done", "300/300"), ("collapsed", "97/300"), ("done", "300/300")]
    for row, (state, step) in zip(rows, expected, strict=True):
        assert state in row and step in row
    if width:
        assert max(map(len, out.splitlines())) <= 80
        header = next(line.split() for line in out.splitlines() if line.startswith("run"))
        assert header == ["run", "est.", "place", "lag", "IS", "beta", "seed", "state", "step", "reward"]
        flat = " ".join(out.split())
        assert "place: placement; IS: importance; not shown at 80 columns: job, elapsed, eval" in flat
    else:
        assert "placement" in out and "importance" in out and "not shown" not in out and "30720" in out


def test_plan_axis_values_wrap_onto_lines_not_into_escapes(tmp_path):
    """At 80 columns the model axis of sweeps/paper.yaml's summary does not fit one line: its values continue on
    the next line of the cell (a value's own control characters are made visible, the layout's line breaks are
    not: the cell printed a literal '\\n' once names were escaped)."""
    from klsweep import grid, planner

    plan = grid.load_plan(Path(__file__).parents[2] / "sweeps" / "paper.yaml", out=tmp_path)
    text = render(con.plan_table(plan, planner.summary(plan), width=80), width=80)
    assert "\\n" not in text, text
    model = [line for line in text.splitlines() if "qwen" in line or "llama" in line]
    assert len(model) == 2 and model[0].startswith("model ") and "qwen3-4b-instruct-2507 ×150" in model[1]


def test_a_narrow_tables_caption_wraps_at_the_terminals_width_not_the_tables():
    from clitools import render

    from klsweep.report.terminal import fitted_table

    caption = "a caption of many words, " * 6 + "and its end"
    table = fitted_table(
        "a title longer than the table is wide", ["a", "b"], [["1", "2"]], width=80, caption=caption
    )
    text = render(table, width=80)
    lines = text.rstrip("\n").splitlines()
    assert lines[0].rstrip() == "a title longer than the table is wide"  # the title whole, on one line
    assert max(len(line.rstrip()) for line in lines[-3:]) > 60  # not folded at the table's 4 columns
    assert " ".join(" ".join(lines).split()).endswith(caption)
    piped = render(table, width=None)
    assert caption in piped  # a pipe: one line


# every control character rich drops (\r, BEL, backspace, VT, FF), an escape and a bidi override
CONTROLS = "a\rb\x07c\x08d\x0be\x0cf\x1bg\u202eh"
ESCAPED = "a\\rb\\x07c\\x08d\\x0be\\x0cf\\x1bg\\u202eh"


def test_every_control_character_prints_as_its_escape(monkeypatch, capsys):
    """Issue 47 item 14: rich drops \\r, BEL, backspace, VT and FF from the text it is given, before the CLI's
    console made the control characters of what it prints visible: an error line naming a folder `a\\rb\\x07c`
    read `abc`. Every one reads as its escape, in an error line, a plain line, a styled one and a table's cell."""
    from clitools import cli
    from rich.table import Table

    code, out, err = cli(["status", CONTROLS], monkeypatch, capsys)
    assert code == 2 and ESCAPED in err, repr(err)
    console = con.cli_console()
    table = Table(title=CONTROLS)
    table.add_column(CONTROLS)
    table.add_row(CONTROLS)
    for printed in (CONTROLS, con.styled(("error", "bold red"), f": {CONTROLS}"), table):
        console.print(printed)
        out = capsys.readouterr().out
        assert out.count(ESCAPED) == (3 if printed is table else 1), repr(out)
        assert not re.search("[\x00-\x09\x0b-\x1f\x7f\u202e]", out), repr(out)


def test_every_refusal_starts_with_one_prefix(tmp_path):
    """A bad grid, a mistyped option and a bad `audit --json` all start `Error: ` on stderr, the prefix click
    gives a mistyped option (a bad grid read `error: ` and a mistyped option `Error: `), exit code 2."""
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("estimator: [k9]\n")
    cases = [
        ["plan", str(bad)],
        ["plan", str(tmp_path / "missing.yaml")],
        ["plan", "--bogus"],
        ["audit", "--json", "--preset", "nosuch"],
    ]
    for args in cases:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys\nfrom klsweep.cli import main\nsys.argv[0] = 'klsweep'\nmain()",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, (args, done.stderr)
        said = [line for line in done.stderr.splitlines() if "rror" in line]
        assert said and all(line.startswith("Error: ") for line in said), (args, done.stderr)


def test_counted_says_one_run_and_two_runs():
    assert [con.counted(n, "run") for n in (0, 1, 2)] == ["0 runs", "1 run", "2 runs"]
    assert con.counted(1, "was", "were") == "1 was" and con.counted(3, "was", "were") == "3 were"


def test_counts_read_one_run_and_two_runs():
    """What an interrupted command says of the runs that go on: `1 run goes on`, `2 runs go on` (it read
    `1 run(s) go on`)."""
    said = []
    for n in (1, 2):
        out = io.StringIO()
        console = con.cli_console()
        console.file = out
        runs = [status_row(f"r{i}", {"model": "tiny"}, state="running") for i in range(n)]
        con.print_going_on(console, runs, "results/tiny")
        said.append(" ".join(out.getvalue().split()))
    assert "1 run goes on in the background" in said[0], said[0]
    assert "2 runs go on in the background" in said[1], said[1]
