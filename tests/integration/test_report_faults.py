"""The report on damaged or odd inputs (issue #32): a metric of Infinity (data: a diverged run) crashes nothing
and stays in its own run; an accuracy that is not a number in [0, 1] is a damaged results.json, set aside with
its reason; caches that are wrong are rebuilt, an unwritable one skipped with a warning; a full disk is one
line and exit 2, nothing half-written; claims are checked against the grid's keys and values up front."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sweepgen
from clitools import cli

from klsweep import report as rp
from klsweep import store


def _sweep(tmp_path: Path, seeds: int = 2) -> Path:
    grid = [{"kl.estimator": e, "kl.placement": "loss", "kl.beta": 0.1} for e in ("k1", "k3")]
    return sweepgen.write_sweep(tmp_path / "s", grid, seeds=seeds, steps=20)


def _runs(sweep: Path, estimator: str) -> list[Path]:
    return sorted(
        d for d in store.run_dirs(sweep) if f"estimator: {estimator}" in (d / "config.yaml").read_text()
    )


def test_an_infinite_kl_is_data_and_stays_in_its_run(tmp_path, monkeypatch, capsys):
    sweep = _sweep(tmp_path)
    run = _runs(sweep, "k1")[0]
    rows = [json.loads(line) for line in (run / store.METRICS_FILE).read_text().splitlines()]
    rows[4]["kl_k3"] = math.inf  # json writes Infinity, as a diverged run's logger would
    (run / store.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = cli(
        ["report", sweep, "--out", tmp_path / "r", "-f", "md,csv,latex,html"], monkeypatch, capsys
    )
    assert code == 0, err
    stab = rp.build_report(sweep, tmp_path / "r2", formats=("csv",), wandb=False).stability
    peak = dict(zip(stab["estimator"], stab["peak KL k3"], strict=True))
    assert peak["k1"] == math.inf and math.isfinite(peak["k3"]) and peak["k3"] > 0  # k3's runs untouched
    assert "inf" in out


def test_an_infinite_accuracy_is_a_damaged_file_set_aside(tmp_path):
    sweep = _sweep(tmp_path)
    run = _runs(sweep, "k1")[0]
    (path,) = (run / store.EVAL_DIR).glob("*/*/results.json")
    path.write_text(path.read_text().replace('"tiny_add": ', '"tiny_add": Infinity, "x": ', 1))
    report = rp.build_report(sweep, tmp_path / "r", formats=("md",), wandb=False)
    assert any(str(path) in s and "not a number in [0, 1]" in s for s in report.set_aside), report.set_aside
    assert report.runs["in-domain avg"].dropna().between(0, 1).all()
    assert report.runs.loc[report.runs["run"] == run.name, "eval_checkpoint"].isna().all()


@pytest.mark.parametrize(
    "field",
    [
        {"checkpoint": "/nonexistent/x", "final_state": "done"},
        {"checkpoint": "../../../{other}/eval/{hash}/checkpoint-20", "final_state": "done"},
        {"checkpoint": "checkpoint-8"},
        {"step": "six"},
        {"step": 2.5},
    ],
)
def test_results_naming_another_checkpoint_are_set_aside(tmp_path, monkeypatch, capsys, field):
    """Issue 44 D6: results.json's `checkpoint` became a path the report read (`"/nonexistent/x"`: a raw
    FileNotFoundError; another run's folder: its samples), `"step": "six"` a raw ValueError. Results name the
    checkpoint of the folder they lie in, and a whole step, or are set aside with the reason."""
    sweep = _sweep(tmp_path)
    run, other = _runs(sweep, "k1")
    (path,) = (run / store.EVAL_DIR).glob("*/*/results.json")
    field = {k: v.format(other=other.name, hash=path.parent.parent.name) if isinstance(v, str) else v
             for k, v in field.items()}  # fmt: skip
    path.write_text(json.dumps({**json.loads(path.read_text()), **field}))
    code, out, err = cli(
        ["report", sweep, "--out", tmp_path / "r", "-f", "md,csv,latex,html"], monkeypatch, capsys
    )
    assert code == 0 and "Traceback" not in err, err
    report = rp.build_report(sweep, tmp_path / "r2", formats=("csv",), wandb=False)
    (aside,) = [s for s in report.set_aside if str(path) in s]
    assert "skipped" in aside and ("checkpoint" in aside or "step" in aside), aside
    assert report.runs.loc[report.runs["run"] == run.name, "eval_checkpoint"].isna().all()
    assert report.runs.loc[report.runs["run"] == other.name, "eval_checkpoint"].notna().all()
    assert "Set aside" in (tmp_path / "r" / "report.md").read_text()


def test_a_lost_last_row_and_a_nan_reward_are_said(tmp_path, monkeypatch, capsys):
    """Issue 44 D11, D12: a metrics.jsonl cut mid-line at its end lost its last row without a note (a torn
    middle line was listed under "Set aside"), and a NaN reward_mean was dropped, the peak and final reward
    changed, without a note. Both are said where the report lists what it set aside; a running run's
    unfinished last line is not damage, and the report says which is which, from its cache too."""
    sweep = _sweep(tmp_path, seeds=2)
    cut, writing = _runs(sweep, "k1")
    nan_run = _runs(sweep, "k3")[0]
    for run in (cut, writing):
        path = run / store.METRICS_FILE
        text = path.read_text()
        path.write_text(text[: len(text) - 30])  # the last line cut mid-line: no newline, not JSON
    store.write_json(writing / store.STATUS_FILE, {"state": "running", "step": 20, "total_steps": 20})
    path = nan_run / store.METRICS_FILE
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[-1]["reward_mean"] = math.nan  # json writes NaN
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r"
    for again in (False, True):  # read afresh, then from the report's cache
        code, stdout, err = cli(["report", sweep, "--out", out, "-f", "md"], monkeypatch, capsys)
        assert code == 0, err
        said = " ".join((stdout + err).split())
        md = " ".join((out / "report.md").read_text().replace("\\", "").split())  # Markdown's escapes
        for text in (said, md):
            assert f"{cut.name}/metrics.jsonl: its last line (line 20) is cut short" in text, (again, text)
            assert "damage, that row is lost" in text
            assert f"{writing.name}/metrics.jsonl: its last line (line 20) is still being written" in text
            assert "(the run is running): not damage" in text
            assert f"{nan_run.name}/metrics.jsonl: 'reward_mean' is NaN in 1 row(s) (step 20)" in text
    store.write_json(writing / store.STATUS_FILE, {"state": "failed", "step": 19, "total_steps": 20})
    report = rp.build_report(sweep, out, formats=("md",), wandb=False)  # metrics from the cache
    (note,) = [s for s in report.set_aside if writing.name in s]
    assert "cut short" in note and "the run is failed" in note, note


def _index(cache: Path) -> dict:
    with np.load(cache) as z:
        return json.loads(bytes(z["index"]).decode())


def _rewrite(cache: Path, index: dict) -> None:
    with np.load(cache) as z:
        pools = {k: z[k] for k in z.files if k != "index"}
    with cache.open("wb") as f:
        np.savez(f, index=np.frombuffer(json.dumps(index).encode(), dtype=np.uint8), **pools)


@pytest.mark.parametrize("kind", ["configs", "metrics"])
def test_a_cache_of_the_wrong_shape_is_rebuilt(tmp_path, kind):
    """The report's caches of its runs' configs and metrics (``filecache.FileCache``): entries of the wrong
    shape or types under the right key and version, and files that are not a cache, are read afresh and
    rewritten; the report is the same."""
    from klsweep.report import data

    sweep = _sweep(tmp_path, seeds=1)
    out = tmp_path / "r"
    expected = rp.build_report(sweep, out, formats=("csv",), wandb=False).runs
    cache = out / (data.CONFIG_CACHE if kind == "configs" else data.METRICS_CACHE)
    index = _index(cache)
    items = index["items"]
    first = next(iter(items.values()))
    wrong_values = (
        {"at": {}, "meta": ["not a config", None]}
        if kind == "configs"
        else {"at": {"values": ["float64", 0, [2, 2]]}, "meta": []}
    )
    for items_now in (
        [],
        "x",
        dict.fromkeys(items, "x"),
        {k: {**v, **wrong_values} for k, v in items.items()},
        {
            k: {**v, "at": {"values": ["float64", 10**12, first["at"].get("values", [0, 0, [1]])[2]]}}
            for k, v in items.items()
        },
    ):
        _rewrite(cache, {**index, "items": items_now})
        got = rp.build_report(sweep, out, formats=("csv",), wandb=False).runs
        cols = ["run", "kl.estimator", "final reward", "collapse_step"]
        assert got[cols].equals(expected[cols]), items_now
        assert _index(cache) == index  # rebuilt
    cache.write_bytes(b"not an npz")
    assert rp.build_report(sweep, out, formats=("csv",), wandb=False).runs[cols].equals(expected[cols])
    assert _index(cache) == index


def _cut_short(cache: Path) -> None:
    data = cache.read_bytes()
    cache.write_bytes(data[: len(data) // 2])


def _flip_a_byte(cache: Path) -> None:
    """One bit of one byte flipped inside the first member's data (the zip's CRC no longer matches)."""
    import zipfile

    with zipfile.ZipFile(cache) as z:
        info = z.infolist()[0]
    data = bytearray(cache.read_bytes())
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size // 2
    data[at] ^= 0x10
    cache.write_bytes(bytes(data))


def _header_of_10_to_the_12(cache: Path) -> None:
    """A well-formed zip (every CRC right) whose index's .npy header declares 10^12 elements."""
    import re
    import zipfile

    with zipfile.ZipFile(cache) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    npy = members["index.npy"]
    n = int.from_bytes(npy[8:10], "little")  # format 1.0: the header's length, then the header
    header = re.sub(rb"'shape': \(\d+,\)", b"'shape': (1000000000000,)", npy[10 : 10 + n])
    header = header.rstrip(b" \n").ljust(n - 1) + b"\n"
    assert b"1000000000000" in header and len(header) == n
    with zipfile.ZipFile(cache, "w") as z:
        for name, data in members.items():
            z.writestr(name, npy[:10] + header + npy[10 + n :] if name == "index.npy" else data)


@pytest.mark.parametrize("cache_name", [".configs.npz", ".metrics.npz", ".collapses.npz", ".outcomes.npz"])
def test_a_damaged_cache_is_rebuilt(tmp_path, monkeypatch, capsys, cache_name):
    """Issue 44 D1: a report cache cut short, with one byte flipped, or whose header declares 10^12 elements
    gave a traceback on every later report (BadZipFile, a CRC error, MemoryError) until the user found the
    hidden file. Each of the four caches, each damage: the report is the same and the cache is rebuilt."""
    sweep = _sweep(tmp_path, seeds=1)
    out = tmp_path / "r"
    cols = ["run", "kl.estimator", "final reward", "collapse_step", "in-domain avg"]
    expected = rp.build_report(sweep, out, formats=("csv",), wandb=False).runs[cols]
    cache = out / cache_name
    whole = _contents(cache)
    for damage in (_cut_short, _flip_a_byte, _header_of_10_to_the_12):
        damage(cache)
        assert _contents(cache) is None
        code, _, err = cli(["report", sweep, "--out", out, "-f", "csv", "-q"], monkeypatch, capsys)
        assert code == 0 and "Traceback" not in err, (damage.__name__, err)
        assert _contents(cache) == whole, damage.__name__  # rebuilt
        damage(cache)
        got = rp.build_report(sweep, out, formats=("csv",), wandb=False).runs[cols]
        assert got.equals(expected), damage.__name__
        assert _contents(cache) == whole, damage.__name__


def _contents(cache: Path) -> tuple[dict, dict[str, bytes]] | None:
    """A cache's index and arrays (its bytes hold the time it was written); None when it cannot be read."""
    try:
        with np.load(cache) as z:
            return _index(cache), {k: z[k].tobytes() for k in z.files if k != "index"}
    except Exception:
        return None


def test_a_read_only_audit_cache_is_a_warning(tmp_path, monkeypatch, capsys):
    from mounts import read_only

    from klsweep.report import audit_table

    sweep = _sweep(tmp_path, seeds=1)
    with read_only(tmp_path / "cache") as cache:
        monkeypatch.setenv("KLSWEEP_CACHE", str(cache))
        audit_table._audit.cache_clear()  # computed once per process: this one must reach the cache
        audit_table._grpo.cache_clear()
        code, _, err = cli(["report", sweep, "--out", tmp_path / "r"], monkeypatch, capsys)
    assert code == 0, err
    assert "warning: audit cache" in err and "not written" in err and "Traceback" not in err
    assert (tmp_path / "r" / "report.md").is_file()


def test_a_full_disk_is_one_line_and_nothing_half_written(tmp_path, monkeypatch, capsys):
    from mounts import full_disk

    sweep = _sweep(tmp_path, seeds=1)
    with full_disk(tmp_path / "full", size="48k") as out:
        code, _, err = cli(["report", sweep, "--out", out, "-f", "md,csv,latex,html"], monkeypatch, capsys)
        left = sorted(p.name for p in out.iterdir())
    assert code == 2 and "Traceback" not in err, err
    assert "report not written" in err and "No space left on device" in err
    assert not [name for name in left if ".tmp" in name], left  # no temporary file left behind


def test_every_problem_of_a_claims_file_in_one_error(tmp_path, monkeypatch, capsys):
    sweep = _sweep(tmp_path, seeds=1)
    claim = "  - {{name: {}, metric: {}, test: {}, direction: greater, a: {}, b: {{kl.estimator: k1}}}}\n"
    path = tmp_path / "claims.yaml"
    path.write_text(
        "claims:\n"
        + claim.format("typo", "in_domain", "welsh", "{kl.estimator: k3}")
        + claim.format("metric", "accuracyy", "welch", "{kl.estimator: k3}")
        + claim.format("k9", "in_domain", "welch", "{kl.estimator: k9}")
        + claim.format("lr", "in_domain", "welch", "{train.learning_rate: 1e-5, kl.estimator: k3}")  # b: k1
    )
    code, _, err = cli(["report", sweep, "--out", tmp_path / "r", "--claims", path], monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err
    text = " ".join(err.split())
    assert "invalid claims: 3 problems" in text, text
    assert "(typo).test: 'welsh'" in text and "did you mean 'welch'" in text  # a reading problem
    assert (
        "claim 'metric': metric: 'accuracyy' is not a column of runs.csv" in text
    )  # and, at once, the runs'
    assert "(k9).a.kl.estimator: 'k9' is not valid (allowed: k1, k2, k3, abs)" in text
    assert not (tmp_path / "r" / "report.md").exists()


def test_the_report_says_its_stages_and_the_time_left_as_its_last_build_took(tmp_path, monkeypatch, capsys):
    """`klsweep report` (and the study's report) said nothing for seconds: each stage is a line on stderr,
    with the time left once the folder has a report whose time it kept (.took.json, read as a number or not
    at all)."""
    sweep = _sweep(tmp_path, seeds=1)
    code, _, err = cli(["report", sweep, "-f", "md"], monkeypatch, capsys)
    assert code == 0, err
    assert "report: reading 2 runs\n" in err and "report: figures, and the tables meanwhile" in err
    assert " left" not in err  # the first report: no time to go by
    took = store.read_json(sweep / store.REPORT_DIR / ".took.json")
    assert took["runs"] == 2 and took["seconds"] > 0
    code, _, err = cli(["report", sweep, "-f", "md"], monkeypatch, capsys)
    assert code == 0 and re.search(
        r"report: reading 2 runs; about \d+ s left \(the last report here took \d+ s\)", err
    )
    took_file = sweep / store.REPORT_DIR / ".took.json"
    deep, long = "[" * 1000, '{"seconds": 3, "runs": 2, "x": "' + "x" * 2000 + '"}'
    for hostile in ('{"seconds": 1e300, "runs": 2}', '{"seconds": [1], "runs": 2}', "[]", "{", deep, long):
        took_file.write_text(hostile)
        code, _, err = cli(["report", sweep, "-f", "md"], monkeypatch, capsys)
        assert code == 0 and "report: reading 2 runs\n" in err and "Traceback" not in err, (hostile, err)
    took_file.unlink()
    os.mkfifo(took_file)  # never opened for reading (a plain open waits for a writer): in a child, timed
    done = subprocess.run(
        [sys.executable, "-m", "klsweep", "report", str(sweep), "-f", "md"], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and "report: reading 2 runs\n" in done.stderr, done.stderr
