"""Interop with the tools researchers already use, on real runs of the project's tiny model: lm-eval reads
klsweep's eval folders (its own results file, ``lm_eval.utils.make_table``) and runs the shipped task YAMLs from
any folder; W&B gets a readable run name, its files at ``<run>/wandb/offline-run-*`` (what ``wandb sync``
takes), and the eval scores on the same run (W&B offline here: tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from clitools import cli  # tests/ is on sys.path under pytest

from klsweep import evaluate, job, store


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from klsweep.tinymodel import random_tiny_model

    return random_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def wandb_records(path: Path) -> list:
    """The records of a W&B transaction log (``run-<id>.wandb``: a 7-byte file header, then LevelDB log
    records in 32 KiB blocks: crc32c, length, type (1 full, 2 first, 3 middle, 4 last), data)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, parts, records = path.read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0:
            break
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
    return records


def _history(records: list) -> dict[str, object]:
    """Every logged key (W&B stores ``eval/x`` as the nested key ``eval``, ``x``) and its last value."""
    return {
        item.key or "/".join(item.nested_key): json.loads(item.value_json)
        for r in records
        if r.HasField("history")
        for item in r.history.item
    }


def test_wandb_run_is_named_by_its_axes_and_gets_the_eval_scores(tmp_path, model_dir, monkeypatch):
    from omegaconf import OmegaConf

    from klsweep import tasks
    from klsweep.config import RunConfig, write_run

    monkeypatch.setattr(
        tasks,
        "reward_function",
        lambda task: lambda completions, **kw: [float(len(c[0]["content"]) % 3) for c in completions],
    )
    sweep = tmp_path / "results" / "interop"
    run = sweep / "0123456789"
    config = OmegaConf.structured(RunConfig)
    for key, value in {
        "name": "interop",
        "model.path": str(model_dir),
        "train.steps": 2,
        "train.save_steps": 2,
        "train.prompts_per_step": 2,
        "train.group_size": 4,
        "train.max_completion_length": 6,
        "kl.beta": 0.1,
        "kl.estimator": "k1",
        "kl.placement": "both",
        "offpolicy.lag": 0,
        "wandb.mode": "offline",
    }.items():
        OmegaConf.update(config, key, value)
    write_run(run, OmegaConf.to_container(config))
    # what `klsweep run` writes: the sweep's varying axes and each run's values of them
    params = {"kl.estimator": "k1", "kl.placement": "both", "offpolicy.lag": 0, "seed": 0}
    store.atomic_write_text(
        sweep / store.SWEEP_FILE, json.dumps({"name": "interop", "runs": {run.name: params}})
    )
    assert job.train_run(run)["state"] == "done"

    folders = sorted((run / "wandb").glob("offline-run-*"))
    assert len(folders) == 1 and not (run / "wandb" / "wandb").exists()  # no doubled folder
    train_records = wandb_records(next(folders[0].glob("run-*.wandb")))
    (run_record,) = [r.run for r in train_records if r.HasField("run")]
    assert run_record.display_name == "estimator=k1 placement=both lag=0 seed=0"
    assert run_record.run_id == "interop-0123456789"  # the run's hash stays the W&B id
    # no copy of the process's output offline (W&B's service spent ~1 s CPU a tiny study run on it): the job's
    # log is the run's logs/
    assert not [r for r in train_records if r.HasField("output_raw") or r.HasField("output")]
    assert not list(folders[0].rglob("output.log"))

    suite = replace(evaluate.load_suite("tiny"), limit=4)
    (results_path,) = evaluate.eval_run(run, suite)
    results = store.read_json(results_path)
    assert "wandb_error" not in results

    folders = sorted((run / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all(
        f.name.endswith("-interop-0123456789") for f in folders
    )  # same run, resumed
    # wandb-core writes the transaction log behind run.finish(): on a loaded machine its last records may land
    # after finish returns (seen once in a full suite under load 9: the eval's history empty), so read until
    # they are there
    deadline = time.monotonic() + 60
    while not (values := _history(wandb_records(next(folders[1].glob("run-*.wandb"))))) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert {
        "eval/step",
        "eval/tiny_add",
        "eval/tiny_sub",
        "eval/tiny_rev",
        "eval/in_domain_avg",
        "eval/ood_avg",
    } <= set(values)
    assert values["eval/tiny_add"] == pytest.approx(results["metrics"]["in_domain"]["tiny_add"])
    assert values["eval/step"] == results["step"] == 2

    # lm-eval's own results file beside klsweep's summary, readable by lm-eval's tooling
    from lm_eval.utils import get_latest_filename, get_results_filenames, make_table

    files = [str(p) for p in results_path.parent.iterdir()]
    (latest,) = get_results_filenames(files)
    assert Path(get_latest_filename([latest])).name == results["lm_eval_results"][0]
    lm_results = json.loads(Path(latest).read_text())
    table = make_table(lm_results)
    for task in ("tiny_add", "tiny_sub", "tiny_rev"):
        assert task in table
    assert "exact_match" in table and str(store.checkpoints(run)[-1]) in lm_results["model_name"]
    assert lm_results["results"]["tiny_add"]["exact_match,first-number"] == pytest.approx(
        results["metrics"]["in_domain"]["tiny_add"]
    )


def test_training_without_a_sweep_file_names_the_run_by_its_kl_settings(tmp_path):
    from dataclasses import asdict

    from klsweep import tracking
    from klsweep.config import RunConfig

    config = asdict(RunConfig())
    config["kl"] |= {"estimator": "k3", "placement": "loss", "beta": 0.05}
    assert (
        tracking.wandb_name(config, tmp_path / "abc") == "estimator=k3 placement=loss beta=0.05 lag=0 seed=0"
    )
    config["kl"]["beta"] = 0.0
    assert tracking.wandb_name(config, tmp_path / "abc") == "no-KL lag=0 seed=0"
    assert tracking.training_mode(tmp_path / "abc") is None  # no W&B run: eval logs nothing
    assert tracking.log_eval(tmp_path / "abc", config, {"metrics": {}}) is None


@pytest.mark.slow
def test_shipped_task_yamls_run_with_lm_eval_from_any_folder(tmp_path, model_dir):
    """``lm_eval --include_path <klsweep>/evaltasks/tiny --tasks tiny_add`` from an unrelated working folder."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_eval",
            "run",
            "--model",
            "hf",
            "--model_args",
            f"pretrained={model_dir}",
            "--include_path",
            str(evaluate.TASKS_DIR / "tiny"),
            "--tasks",
            "tiny_add",
            "--limit",
            "2",
            "--device",
            "cpu",
            "--output_path",
            str(elsewhere / "out"),
        ],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FileNotFoundError" not in proc.stderr
    (out,) = (elsewhere / "out").rglob("results_*.json")
    assert json.loads(out.read_text())["n-samples"]["tiny_add"]["effective"] == 2


def _written_records(path: Path, timeout_s: float = 30.0) -> list:
    """The records of a W&B transaction log once W&B's service has written them: its writer may still be
    flushing when ``finish()`` returns in this process (the file holds only its header then)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not (records := wandb_records(path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return records


def _mirror_training_offline(run: Path, config: dict) -> None:
    """What a run's training leaves when it mirrors to W&B offline (``klsweep.job``): its W&B run under
    ``<run>/wandb/offline-run-*``, with a metric."""
    import wandb

    from klsweep import tracking

    mirror = wandb.init(
        project=config["wandb"]["project"],
        group=config["name"],
        id=tracking.wandb_id(config["name"], run),
        dir=str(run),
        mode="offline",
    )
    mirror.log({"task_reward/mean": 0.5})
    mirror.finish()


def test_report_is_logged_to_wandb_beside_the_runs(tmp_path, monkeypatch, capsys):
    """``klsweep report`` of a sweep whose runs mirrored to W&B: a W&B run of job_type report in their project
    and group, with the main table, the stability table and the claims as W&B tables, the figures as images,
    and the report's files as an artifact (offline here: all in ``<report>/wandb/offline-run-*``).
    ``--no-wandb`` logs nothing; a W&B that cannot log warns and the report is written anyway."""
    import yaml
    from sweepgen import write_sweep

    monkeypatch.setenv("WANDB_MODE", "offline")
    grid = [{"kl.estimator": e, "kl.placement": "loss", "kl.beta": 0.1} for e in ("k1", "k3")]
    sweep = write_sweep(tmp_path / "wbreport", grid, seeds=2, steps=20)
    first = store.run_dirs(sweep)[0]
    config = yaml.safe_load((first / store.CONFIG_FILE).read_text())
    _mirror_training_offline(first, config)

    claims = tmp_path / "claims.yaml"  # the sweep's own hypotheses: its claims table goes to W&B too
    claims.write_text(
        "claims:\n  - {name: k1 beats k3 in domain, metric: in_domain, test: welch, direction: greater,\n"
        "     a: {kl.estimator: k1}, b: {kl.estimator: k3}}\n"
    )
    # runs mirrored offline: --wandb logs the report offline beside them (a plain report does not: below)
    args = ["report", sweep, "--format", "md,html", "--quiet", "--wandb", "--claims", claims]
    code, done, err = cli(args, monkeypatch, capsys)
    # the synthetic runs have results.json without lm-eval's samples: the one note the report gives
    assert code == 0 and all("without per-problem outcomes" in line for line in err.splitlines()), err
    (folder,) = (sweep / "report" / "wandb").glob("offline-run-*")
    assert f"W&B: {folder}" in done.splitlines()
    records = _written_records(next(folder.glob("run-*.wandb")))
    (run_record,) = [r.run for r in records if r.HasField("run")]
    assert (run_record.job_type, run_record.run_group, run_record.display_name) == (
        "report",
        "wbreport",
        "report",
    )
    assert run_record.project == config["wandb"]["project"]
    logged = _history(records)
    assert {logged[f"{t}/_type"] for t in ("main", "stability", "claims")} == {"table-file"}
    assert {logged[f"{f}/_type"] for f in ("curves", "eval_bars")} == {"image-file"}
    assert logged["main/nrows"] == 2  # one row per configuration

    media = folder / "files" / "media"
    (main_file,) = (media / "table").glob("main_*.table.json")
    main = json.loads(main_file.read_text())
    assert len(main["data"]) == 2 and {"tiny_add", "tiny_sub", "tiny_rev"} <= set(main["columns"])
    (claims_file,) = (media / "table").glob("claims_*.table.json")
    assert json.loads(claims_file.read_text())["data"]
    assert len(list((media / "images").glob("curves_*.png"))) == 1
    for name in ("report.md", "report.html"):
        assert (folder / "files" / name).read_bytes() == (sweep / "report" / name).read_bytes()
    (artifact,) = [r.artifact for r in records if r.HasField("artifact") and r.artifact.type == "report"]
    assert artifact.name == "wbreport-report"
    entries = {e.path for e in artifact.manifest.contents}
    assert {"report.md", "report.html", "curves.png", "eval_bars.png"} <= entries  # PDFs: with latex or pdf

    # --no-wandb, or no flag (the runs mirrored offline only): nothing more logged
    for flags in (["--no-wandb"], []):
        code, again, _ = cli(["report", sweep, "--quiet", *flags], monkeypatch, capsys)
        assert code == 0 and "W&B" not in again
    assert len(list((sweep / "report" / "wandb").glob("offline-run-*"))) == 1
    code, _, _ = cli(["report", sweep, "--out", tmp_path / "plain", "--quiet"], monkeypatch, capsys)
    assert (
        code == 0
        and (tmp_path / "plain" / "report.md").is_file()
        and not (tmp_path / "plain" / "wandb").exists()
    )

    # W&B cannot write its files (a file where its folder goes): a warning, and the report all the same
    out = tmp_path / "elsewhere"
    out.mkdir()
    (out / "wandb").write_text("not a folder")
    code, _, err = cli(["report", sweep, "--out", out, "--quiet", "--wandb"], monkeypatch, capsys)
    assert code == 0 and "warning: W&B" in err and (out / "report.md").is_file()
