"""Interop with the tools researchers already use, on real runs of the project's tiny model: lm-eval reads
klsweep's eval folders (its own results file, ``lm_eval.utils.make_table``) and runs the shipped task YAMLs from
any folder; W&B gets a readable run name, its files at ``<run>/wandb/offline-run-*`` (what ``wandb sync``
takes), and the eval scores on the same run (W&B offline here: tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

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
    from klsweep.config import RunConfig

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
    job.write_run_config(run, OmegaConf.to_container(config))
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

    suite = replace(evaluate.load_suite("tiny"), limit=4)
    (results_path,) = evaluate.eval_run(run, suite)
    results = store.read_json(results_path)
    assert "wandb_error" not in results

    folders = sorted((run / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all(
        f.name.endswith("-interop-0123456789") for f in folders
    )  # same run, resumed
    eval_records = wandb_records(next(folders[1].glob("run-*.wandb")))
    values = _history(eval_records)
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
