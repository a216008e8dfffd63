"""klsweep fetch, offline clusters and python -m klsweep: the needs of sweeps/paper.yaml against caches built
from local files in huggingface_hub's cache layout and datasets' Arrow cache (datasets' own builder); no
network (HF_HUB_OFFLINE=1 throughout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import cli
from hubcache import COMMIT, MODELS, cache_model, populate

from klsweep import fetch

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "sweeps" / "paper.yaml"


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    return home


@pytest.fixture(scope="module")
def tiny_hub_model(tmp_path_factory):
    from klsweep.tinymodel import random_tiny_model

    return random_tiny_model(tmp_path_factory.mktemp("model"))


def test_python_m_klsweep():
    out = subprocess.run(
        [sys.executable, "-m", "klsweep", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    assert "fetch" in out.stdout and "plan" in out.stdout


def test_needs_of_the_paper_grid():
    from klsweep import grid

    plan = grid.load_plan(PAPER)
    items = fetch.needs([r.config for r in plan.runs])
    assert [(n.kind, n.repo, n.config, n.split) for n in items] == [
        *[("model", m, None, None) for m in MODELS],
        ("train data", "DigitalLearningGmbH/MATH-lighteval", None, "train"),
        ("eval data", "HuggingFaceH4/MATH-500", "default", "test"),
        *[("eval data", "cais/mmlu", f"college_{s}", "test") for s in ("physics", "chemistry", "biology")],
    ]


def test_offline_plan_refuses_naming_every_missing_thing(hf_home, monkeypatch, capsys):
    code, out, err = cli(["plan", PAPER], monkeypatch, capsys)
    assert code == 2
    for what in [*MODELS, "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "college_biology"]:
        assert what in err
    assert f"klsweep fetch {PAPER}" in err
    code, out, err = cli(["fetch", PAPER, "--dry-run"], monkeypatch, capsys, columns=80)
    assert code == 0, err
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    for what in [*MODELS, "HuggingFaceH4/MATH-500", "cais/mmlu college_physics test"]:
        assert any(what in line and "would fetch" in line for line in lines), what
    # online, the same grid plans (the jobs would download)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    code, out, err = cli(["plan", PAPER, "cluster.offline=false"], monkeypatch, capsys)
    assert code == 0, err
    # cluster.offline asks for the same check without HF_HUB_OFFLINE: the paper grid sets it
    code, out, err = cli(["plan", PAPER], monkeypatch, capsys)
    assert code == 2 and "Qwen/Qwen2.5-7B" in err


def test_populated_caches_plan_passes_and_nothing_is_fetched_again(
    hf_home, tmp_path, tiny_hub_model, monkeypatch, capsys
):
    populate(hf_home, tiny_hub_model, tmp_path)
    code, out, err = cli(["plan", PAPER], monkeypatch, capsys)
    assert code == 0, err

    def no_download(need):
        raise AssertionError(f"downloaded {need}")

    monkeypatch.setattr(fetch, "_download", no_download)
    code, out, err = cli(["fetch", PAPER], monkeypatch, capsys, columns=80)
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith(("model", "train", "eval"))]
    assert len(rows) == 8 and all(" cached " in r for r in rows), out
    assert all(COMMIT[:8] in r for r in rows if r.startswith("model"))

    # one weight file gone: the model is missing again (an incomplete snapshot does not count)
    snap = hf_home / "hub" / "models--Qwen--Qwen2.5-7B" / "snapshots" / COMMIT
    (snap / "model.safetensors").unlink()
    code, out, err = cli(["plan", PAPER], monkeypatch, capsys)
    assert code == 2 and "Qwen/Qwen2.5-7B" in err and "Llama" not in err


def test_revision_pinned_in_every_run_config(hf_home, tmp_path, tiny_hub_model):
    from klsweep import grid

    cache_model(hf_home, "Qwen/Qwen2.5-7B", tiny_hub_model)
    plan = grid.load_plan(PAPER, ["model=qwen2.5-7b"], out=tmp_path / "results")
    configs = fetch.pin_revisions([r.config for r in plan.runs], [r.run_dir for r in plan.runs])
    assert {c["model"]["revision"] for c in configs} == {COMMIT}
    assert all(r.config["model"]["revision"] is None for r in plan.runs)  # copies: the plan is untouched
    assert [grid.run_id(c) for c in configs] == [r.id for r in plan.runs]  # ids unchanged by the pin
    # a run folder written with another commit keeps it (it resumes on the weights it started with)
    from klsweep.config import run_file_text

    first = plan.runs[0]
    first.run_dir.mkdir(parents=True)
    older = "f" * 40
    (first.run_dir / "config.yaml").write_text(
        run_file_text({**first.config, "model": {**first.config["model"], "revision": older}})
    )
    configs = fetch.pin_revisions([r.config for r in plan.runs], [r.run_dir for r in plan.runs])
    assert configs[0]["model"]["revision"] == older and configs[1]["model"]["revision"] == COMMIT


def test_gated_and_missing_repos_say_what_to_do(hf_home, monkeypatch):
    import httpx
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    monkeypatch.delenv("HF_HUB_OFFLINE")
    response = httpx.Response(403, request=httpx.Request("GET", "https://huggingface.co"))
    errors = {
        "meta-llama/Llama-3.1-8B-Instruct": GatedRepoError("gated", response=response),
        "nobody/nothing": RepositoryNotFoundError("404", response=response),
    }

    def download(need):
        raise errors[need.repo]

    monkeypatch.setattr(fetch, "_download", download)
    found = fetch.fetch([fetch.Need("model", repo) for repo in errors])
    assert [f.state for f in found] == ["failed", "failed"]
    assert (
        "accepted the licence at https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct" in found[0].message
    )
    assert "hf auth login" in found[0].message
    assert "no such repository" in found[1].message


def test_a_job_names_the_model_it_cannot_load(hf_home, tmp_path):
    """Offline with an empty cache, the training job fails with the model's name and the fetch command in its
    reason (not transformers' bare "couldn't connect")."""
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  path: Qwen/Qwen2.5-7B\n  chat_template: false\ntrain:\n  steps: 1\n")
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env["WANDB_MODE"] = "disabled"
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "klsweep", "train", str(config), "wandb.mode=disabled", "--run-dir", str(run_dir)],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 1
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed"
    assert "model Qwen/Qwen2.5-7B could not be loaded" in status["reason"]
    assert "klsweep fetch" in status["reason"]


def test_jobs_of_an_offline_cluster_run_offline():
    assert fetch.job_environment({"cluster": {"offline": True}}) == {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }


def test_offline_eval_refuses_naming_the_suites_datasets(tmp_path, monkeypatch, capsys):
    from klsweep import grid, store
    from klsweep.config import write_run

    plan = grid.load_plan(PAPER, ["model=qwen2.5-7b", "kl.beta=0.0", "seed=0"], out=tmp_path / "results")
    run = plan.runs[0]
    write_run(run.run_dir, run.config)
    store.write_status(run.run_dir, "done")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    code, out, err = cli(["eval", plan.sweep_dir, "--cluster", "debug"], monkeypatch, capsys)
    assert code == 2
    assert "HuggingFaceH4/MATH-500" in err and "cais/mmlu college_biology" in err and "Qwen/Qwen2.5-7B" in err
    assert "klsweep fetch" in err and "sweep.yaml" in err
