"""Problem-level statistics on real lm-eval samples: a sweep of two configurations x three seeds of the shipped
tiny model (each seed's weights perturbed by its own noise, the second configuration's more), evaluated by
``evaluate.eval_many`` with the tiny suite; the report reads each run's ``samples_<task>.jsonl``, gives the
averages hierarchical bootstrap intervals, tests an accuracy claim paired on the problems, keeps the outcomes
in its cache, and falls back to the per-run method, saying so, where a run's samples are missing."""

from __future__ import annotations

import math
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from klsweep import evaluate as ev
from klsweep import report as rp
from klsweep import store
from klsweep.config import RunConfig
from klsweep.report import problems
from klsweep.report.data import ID_AVG, OOD_AVG
from klsweep.report.evalbars import interval_text
from klsweep.report.problems import OUTCOME_CACHE, load_outcomes
from klsweep.report.tables import BY_PROBLEMS, BY_SEEDS, CI_METHOD

CLAIM = {
    "name": "a more accurate than b",
    "metric": "in_domain",
    "test": "welch",
    "direction": "greater",
    "a": {"model.name": "a"},
    "b": {"model.name": "b"},
}


def perturbed_run(sweep: Path, name: str, config: str, seed: int, noise: float) -> Path:
    """A finished run whose final checkpoint is the shipped tiny model with N(0, noise) added to every weight
    (its own seed): a real model that answers some problems the others do not."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from klsweep.tinymodel import tiny_model_path

    source = tiny_model_path()
    checkpoint = sweep / name / store.CHECKPOINTS_DIR / "checkpoint-10"
    model = AutoModelForCausalLM.from_pretrained(source)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise)
    model.save_pretrained(checkpoint)
    AutoTokenizer.from_pretrained(source).save_pretrained(checkpoint)
    run = sweep / name
    cfg = asdict(RunConfig())
    cfg["name"], cfg["seed"] = sweep.name, seed
    cfg["model"] |= {"name": config, "path": str(source)}
    store.atomic_write_text(run / store.CONFIG_FILE, yaml.safe_dump(cfg, sort_keys=False))
    store.write_status(run, "done", step=10)
    return run


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sweep = tmp_path_factory.mktemp("problems") / "sweep"
    runs = [
        perturbed_run(sweep, f"{config}-s{seed}", config, seed, noise)
        for config, noise in (("a", 0.02), ("b", 0.2))
        for seed in (
            0,
            1,
            2,
        )  # 3: with 2, the t part of the interval is wider than the range
    ]
    ev.eval_many(runs, replace(ev.load_suite("tiny"), limit=16))
    return sweep


def test_report_reads_real_samples_and_tests_paired_on_the_problems(
    sweep: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump({"claims": [CLAIM]}))
    out = tmp_path / "report"
    r = rp.build_report(sweep, out, formats=("md", "csv"), claims=claims, wandb=False)
    # the outcomes lm-eval wrote give each run's accuracy as its results.json does
    notes: list[str] = []
    outcomes = load_outcomes(sweep, r.runs, r.eval_hash, {ID_AVG: r.in_domain, OOD_AVG: r.ood}, notes)
    assert notes == [] and set(outcomes) == {ID_AVG, OOD_AVG}
    for avg in (ID_AVG, OOD_AVG):
        m = outcomes[avg]
        assert m.values.shape == (6, 16 * len(m.tasks))
        np.testing.assert_allclose(m.values.sum(axis=1), r.runs[avg].to_numpy(float), atol=1e-9)
    # the seeds differ on some problems and the problems differ: a spread over both to resample
    add = outcomes[ID_AVG].values
    assert (add != add[:1]).any() and (add.min(axis=0) != add.max(axis=0)).any() and 0 < add.mean() < 1 / 16
    assert (r.main[f"{ID_AVG} {CI_METHOD}"] == BY_PROBLEMS).all()
    # the eval bars' legend says which interval the whiskers are (it said "over seeds": issue 43 item 6)
    assert interval_text(r.main, [ID_AVG, OOD_AVG]) == "whisker: 95% interval over seeds × problems"
    # one interval per quantity (issue 51): a task's score has its average's method; a single in-domain task's
    # interval is its average's
    assert (r.main[f"tiny_add {CI_METHOD}"] == BY_PROBLEMS).all() and len(r.in_domain) == 1
    assert r.main["tiny_add ci"].tolist() == r.main[f"{ID_AVG} ci"].tolist()
    assert (r.main[f"{ID_AVG} low"] <= r.main[ID_AVG]).all() and (
        r.main[ID_AVG] <= r.main[f"{ID_AVG} high"]
    ).all()
    row = r.claims.iloc[0]
    assert "paired on the problems" in row["test"] and "paired on 16 problems" in row["detail"]
    assert 0 <= row["replication"] <= 1 and 0 <= row["p_value"] <= 1
    # the cache holds them: a second report reads the same numbers from it, not a samples file
    assert (out / OUTCOME_CACHE).is_file()
    monkeypatch.setattr(problems, "_read_run", lambda *a: pytest.fail("read afresh, not from the cache"))
    again = rp.build_report(sweep, out, formats=("csv",), claims=claims, wandb=False)
    assert again.claims.equals(r.claims) and again.main.equals(r.main)


def test_missing_samples_fall_back_to_the_per_run_method_and_say_so(sweep: Path, tmp_path: Path) -> None:
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy, ignore=shutil.ignore_patterns("checkpoints"))
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump({"claims": [CLAIM]}))
    out = tmp_path / "report"
    first = rp.build_report(copy, out, formats=("csv",), claims=claims, wandb=False)
    assert "paired on the problems" in first.claims.iloc[0]["test"]
    # an old run, evaluated before the samples were written: read afresh, not from the cache
    (sample,) = (copy / "b-s1" / store.EVAL_DIR).glob("*/checkpoint-10/samples_tiny_add.jsonl")
    sample.unlink()
    r = rp.build_report(copy, out, formats=("csv",), claims=claims, wandb=False)
    methods = dict(zip(r.main["model"], r.main[f"{ID_AVG} {CI_METHOD}"], strict=True))
    assert methods == {"a": BY_PROBLEMS, "b": BY_SEEDS}
    assert math.isnan(r.main.set_index("model").at["b", f"{ID_AVG} low"])
    (note,) = [m for m in r.missing if "without per-problem outcomes" in m]
    assert "b-s1" in note and "over seeds only" in note
    assert r.claims.iloc[0]["test"].startswith("Welch's t-test")
    # a damaged samples file and a damaged cache: the run named, the cache rebuilt, the report written
    (sample,) = (copy / "a-s0" / store.EVAL_DIR).glob("*/checkpoint-10/samples_tiny_sub.jsonl")
    sample.write_text(sample.read_text()[:-40])
    (out / OUTCOME_CACHE).write_bytes(b"not an npz")
    r = rp.build_report(copy, out, formats=("csv",), claims=claims, wandb=False)
    assert any("unreadable" in m and "a-s0" in m for m in r.missing), r.missing
    assert set(r.main[f"{ID_AVG} {CI_METHOD}"]) == {BY_SEEDS}
    with np.load(out / OUTCOME_CACHE) as z:
        # a-s1, a-s2, b-s0, b-s2: docs (int64) and scores (float64) of 3 tasks; a-s0, b-s1: their reasons kept
        assert len(z["float64"]) == len(z["int64"]) == 4 * 3 * 16
