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
from klsweep.fetch import download as fetching

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


def test_offline_plan_previews_and_run_refuses_naming_every_missing_thing(
    hf_home, tmp_path, monkeypatch, capsys
):
    """Nothing cached, offline: `plan` prints the whole plan (its runs, resources and time tables), then what
    `run` would refuse and the `klsweep fetch` command, and exits 0 (issue 43 item 3); `run` refuses, exit 2."""
    code, out, err = cli(["plan", PAPER], monkeypatch, capsys)
    assert code == 0, err
    lines = out.splitlines()
    for table in ("sweep paper:", "resources (estimates", "time (estimates"):
        assert any(line.startswith(table) for line in lines), (table, out)
    refusals = out[out.index("run would refuse: offline (cluster.offline or HF_HUB_OFFLINE=1)") :]
    items = [line for line in refusals.splitlines() if line.startswith("  - ")]
    for what in [*MODELS, "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "college_biology"]:
        assert any(what in line for line in items), (what, refusals)
    assert refusals.rstrip().endswith(f"\n  klsweep fetch {PAPER}"), refusals  # a line to copy
    code, out, err = cli(["plan", PAPER, "--json"], monkeypatch, capsys)
    data = json.loads(out)
    assert (
        code == 0 and data["fetch_command"] == f"klsweep fetch {PAPER}" and len(data["run_would_refuse"]) == 8
    )
    code, out, err = cli(["run", PAPER, "--out", tmp_path / "results"], monkeypatch, capsys)
    assert code == 2
    for what in [*MODELS, "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "college_biology"]:
        assert what in err
    assert f"klsweep fetch {PAPER}" in err and not (tmp_path / "results").exists()
    code, out, err = cli(["fetch", PAPER, "--dry-run"], monkeypatch, capsys, columns=80)
    assert code == 0, err
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    for what in [*MODELS, "HuggingFaceH4/MATH-500", "cais/mmlu college_physics test"]:
        assert any(what in line and "would fetch" in line for line in lines), what
    # online, the same grid plans (the jobs would download), and says nothing is refused
    monkeypatch.delenv("HF_HUB_OFFLINE")
    code, out, err = cli(["plan", PAPER, "cluster.offline=false"], monkeypatch, capsys)
    assert code == 0 and "would refuse" not in out, err
    # cluster.offline asks for the same check without HF_HUB_OFFLINE: the paper grid sets it
    code, out, err = cli(["plan", PAPER], monkeypatch, capsys)
    assert code == 0 and "  - model Qwen/Qwen2.5-7B: not in the cache" in out
    code, out, err = cli(["run", PAPER, "--out", tmp_path / "results"], monkeypatch, capsys)
    assert code == 2 and "Qwen/Qwen2.5-7B" in err


def test_populated_caches_plan_passes_and_nothing_is_fetched_again(
    hf_home, tmp_path, tiny_hub_model, monkeypatch, capsys
):
    populate(hf_home, tiny_hub_model, tmp_path)
    code, out, err = cli(["plan", PAPER], monkeypatch, capsys)
    assert code == 0, err

    def no_download(need):
        raise AssertionError(f"downloaded {need}")

    monkeypatch.setattr(fetching, "_download", no_download)
    code, out, err = cli(["fetch", PAPER], monkeypatch, capsys, columns=80)
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith(("model", "train", "eval"))]
    assert len(rows) == 8 and all(" cached " in r for r in rows), out
    assert all(COMMIT[:8] in r for r in rows if r.startswith("model"))

    assert "would refuse" not in cli(["plan", PAPER], monkeypatch, capsys)[1]

    # one weight file gone: the model is missing again (an incomplete snapshot does not count)
    snap = hf_home / "hub" / "models--Qwen--Qwen2.5-7B" / "snapshots" / COMMIT
    (snap / "model.safetensors").unlink()
    code, out, err = cli(["run", PAPER, "--out", tmp_path / "results"], monkeypatch, capsys)
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

    monkeypatch.setattr(fetching, "hub_unreachable", lambda: None)  # the hub answers
    monkeypatch.setattr(fetching, "_download", download)
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
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    status = _failed_training(tmp_path, "path: Qwen/Qwen2.5-7B\n  chat_template: false", env)
    assert "model Qwen/Qwen2.5-7B could not be loaded" in status["reason"]
    assert "klsweep fetch" in status["reason"]


def _failed_training(tmp_path: Path, model: str, env: dict[str, str]) -> dict:
    """`klsweep train` of a one-step run whose `model:` section is ``model``, in ``env``: it fails (exit 1);
    its status.json."""
    config = tmp_path / "run.yaml"
    config.write_text(f"model:\n  {model}\ntrain:\n  steps: 1\n")
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "klsweep", "train", str(config), "wandb.mode=disabled", "--run-dir", str(run_dir)],
        capture_output=True, text=True, env={**env, "WANDB_MODE": "disabled"}, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed"
    return status


def _drop_tensor(weights: Path, name: str) -> None:
    """``weights`` (a safetensors file) rewritten without the tensor ``name``."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(weights))
    del tensors[name]
    save_file(tensors, str(weights), metadata={"format": "pt"})


def test_a_job_refuses_weights_that_lack_parameters(tmp_path, tiny_hub_model):
    """Issue 44 D4: a model whose safetensors lacks a tensor of its architecture (transformers would initialise
    it at random and train on) fails its run before step 1, naming the parameter (it trained to `done`)."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_hub_model, model)
    _drop_tensor(model / "model.safetensors", "model.layers.0.mlp.down_proj.weight")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    status = _failed_training(tmp_path, f"path: {model}", env)
    assert status["step"] == 0
    run_dir = tmp_path / "run"
    assert "NotLoaded" in status["reason"] and f"model {model}" in status["reason"], status["reason"]
    assert "missing 1 of the model's parameters (model.layers.0.mlp.down_proj.weight)" in status["reason"]
    assert not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip()


def test_jobs_of_an_offline_cluster_run_offline():
    assert fetch.offline([{"cluster": {"offline": True}}])  # the function (fetch/refusal.py is the module)
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


# ------------------------------------------------------------------------ what a check calls cached loads


def _copy_caches(source: Path, home: Path) -> None:
    """A copy of the session's populated caches (tests/conftest.py: hf_caches), snapshot links kept."""
    import shutil

    shutil.copytree(source, home, symlinks=True)


def _snapshot(home: Path, repo: str) -> Path:
    return home / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / COMMIT


def _no_tokenizer(home):
    (_snapshot(home, "Qwen/Qwen2.5-7B") / "tokenizer.json").unlink()
    return "Qwen/Qwen2.5-7B", "tokenizer.json is missing"


def _no_chat_template(home):  # model.chat_template is true for the instruct models
    (_snapshot(home, "meta-llama/Llama-3.1-8B-Instruct") / "chat_template.jinja").unlink()
    return "meta-llama/Llama-3.1-8B-Instruct", "chat_template.jinja is missing"


def _truncated_weights(home):
    blob = (_snapshot(home, "Qwen/Qwen3-4B-Instruct-2507") / "model.safetensors").resolve()
    data = blob.read_bytes()
    blob.write_bytes(data[: len(data) // 2])
    return "Qwen/Qwen3-4B-Instruct-2507", "model.safetensors does not load"


def _garbage_config(home):
    (_snapshot(home, "Qwen/Qwen2.5-7B") / "config.json").resolve().write_text("<html>rate limited</html>")
    return "Qwen/Qwen2.5-7B", "config.json is not JSON"


def _arrow_gone(home):
    for arrow in (home / "datasets" / "HuggingFaceH4___math-500").rglob("*.arrow"):
        arrow.unlink()
    return "HuggingFaceH4/MATH-500 default test", "math-500-test.arrow is missing"


def _weightless(home):  # issue 44 D4: a weight file of the right format holding none of the model's tensors
    import numpy as np
    from safetensors.numpy import save_file

    blob = (_snapshot(home, "Qwen/Qwen2.5-7B") / "model.safetensors").resolve()
    save_file({"w": np.zeros(2, np.float32)}, str(blob))
    return "Qwen/Qwen2.5-7B", "model.safetensors: missing 27 of the model's parameters (lm_head.weight"


def _weights_lack_one(home):  # one layer's norm gone from a model's weights (the index's shards likewise)
    _drop_tensor(
        (_snapshot(home, "Qwen/Qwen3-4B-Instruct-2507") / "model.safetensors").resolve(), "model.norm.weight"
    )
    return "Qwen/Qwen3-4B-Instruct-2507", "missing 1 of the model's parameters (model.norm.weight)"


@pytest.mark.parametrize(
    "damage",
    [
        _no_tokenizer,
        _no_chat_template,
        _truncated_weights,
        _garbage_config,
        _arrow_gone,
        _weightless,
        _weights_lack_one,
    ],
)
def test_partial_caches_are_refused_and_fetch_repairs_them(
    damage, hf_home, hf_caches, tiny_hub_model, tmp_path, monkeypatch, capsys
):
    """A cache that holds something of a model or dataset but not what loads (weights that do not cover the
    model's parameters among them): offline `plan` names what is missing as what `run` would refuse, `run`
    refuses it, `fetch` does not call it cached, and fetching again (the hub faked at the download, as
    snapshot_download/load_dataset fill the cache) repairs it: the broken files are fetched anew."""
    from hubcache import DATASETS, cache_dataset

    _copy_caches(hf_caches, hf_home)
    what, why = damage(hf_home)
    code, out, err = cli(["plan", PAPER], monkeypatch, capsys)
    assert code == 0, err
    refused = [line for line in out.splitlines() if line.startswith("  - ")]
    assert len(refused) == 1 and what in refused[0] and why in refused[0], out
    assert "incomplete in the cache" in refused[0]
    code, out, err = cli(["run", PAPER, "--out", tmp_path / "results"], monkeypatch, capsys)
    assert code == 2, out
    assert what in err and why in err and "incomplete in the cache" in err
    code, out, err = cli(["fetch", PAPER], monkeypatch, capsys)  # offline here: nothing can be fetched
    assert code == 2 and what in err and why in err and "HF_HUB_OFFLINE is set here" in err
    assert "cached" not in err

    def hub_download(need):  # what the hub's clients do: fetch the files the snapshot lacks; reuse a dataset
        if need.kind == "model":  # folder that has its dataset_info.json
            snap = _snapshot(hf_home, need.repo)
            for f in tiny_hub_model.iterdir():
                if not (snap / f.name).is_file():
                    blob = snap.parents[1] / "blobs" / f"{f.name}-fetched"
                    blob.write_bytes(f.read_bytes())
                    (snap / f.name).unlink(missing_ok=True)
                    (snap / f.name).symlink_to(os.path.relpath(blob, snap))
            return
        import shutil

        repo, config, split, rows = next(
            d for d in DATASETS if d[0] == need.repo and d[1] == (need.config or "default")
        )
        fresh = tmp_path / "fresh"
        cache_dataset(fresh, repo, config, split, rows, tmp_path)
        prepared = next((fresh / "datasets").glob("*___*/*/*/*/dataset_info.json")).parent
        target = hf_home / "datasets" / prepared.relative_to(fresh / "datasets")
        if not (target / "dataset_info.json").is_file():
            shutil.copytree(prepared, target, dirs_exist_ok=True)

    monkeypatch.setattr(fetching, "hub_unreachable", lambda: None)
    monkeypatch.setattr(fetching, "_download", hub_download)
    code, out, err = cli(["fetch", PAPER], monkeypatch, capsys)
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith(("model", "train", "eval"))]
    assert [r for r in rows if " fetched " in r] == [r for r in rows if what in r], out
    assert all(" cached " in r for r in rows if what not in r), out
    code, out, err = cli(["plan", PAPER], monkeypatch, capsys)
    assert code == 0 and "would refuse" not in out, err


def test_a_hub_id_without_a_namespace_is_a_hub_id(
    hf_home, hf_caches, tiny_hub_model, tmp_path, monkeypatch, capsys
):
    """`model.path=gpt2`: a hub id unless a folder gpt2 is here (as transformers reads it); offline, a missing
    one is refused, saying how the path was read."""
    import shutil

    _copy_caches(hf_caches, hf_home)
    monkeypatch.chdir(tmp_path)
    # vLLM's contexts within the stand-in's 256 positions, which plan checks once the local folder is there
    small = ["train.max_prompt_length=128", "train.max_completion_length=64", "eval.max_model_len=null"]
    args = ["plan", PAPER, "model=qwen2.5-7b", "model.path=gpt2", *small]
    code, out, err = cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert "model gpt2" in out and "'gpt2' read as a hub id: there is no local path 'gpt2' here" in out
    assert not fetch.Need("model", "gpt2").local and fetch.Need("model", "./gpt2").local
    shutil.copytree(tiny_hub_model, tmp_path / "gpt2")  # a folder of that name: the local model
    assert fetch.Need("model", "gpt2").local
    code, out, err = cli(args, monkeypatch, capsys)
    assert code == 0 and "would refuse" not in out, err


@pytest.mark.parametrize("path", ["/nonexistent/model", "./relmissing", "acme/has space"])
def test_offline_a_model_path_neither_cached_nor_a_folder_is_refused(
    path, hf_home, hf_caches, tmp_path, monkeypatch, capsys
):
    """Issue 44 D9: offline, a `model.path` that is no hub id in the cache and no folder here is named as what
    `run` refuses (`plan` shows it), like a model missing from the cache; `run` refuses it before any job."""
    _copy_caches(hf_caches, hf_home)
    monkeypatch.chdir(tmp_path)
    args = [PAPER, "model=qwen2.5-7b", f"model.path={path}"]
    code, out, err = cli(["plan", *args], monkeypatch, capsys)
    assert code == 0, err
    refused = " ".join(line.strip() for line in out[out.index("run would refuse") :].splitlines())
    assert f"- model {path}: no such folder here: {(tmp_path / path).resolve()}" in refused, refused
    code, out, err = cli(["run", *args, "--out", tmp_path / "results"], monkeypatch, capsys)
    assert code == 2 and f"model {path}: no such folder here" in err, err
    assert not (tmp_path / "results").exists()


def test_offline_checks_and_fetch_use_the_commits_runs_recorded(
    hf_home, hf_caches, tmp_path, monkeypatch, capsys
):
    """Runs submitted at commit A, the cache's main now at B: `plan`/`run` refuse (the jobs load A) and
    `fetch` does not call it cached."""
    from klsweep import grid
    from klsweep.config import write_run

    _copy_caches(hf_caches, hf_home)
    results = tmp_path / "results"
    over = ["model=qwen2.5-7b", "kl.beta=0.0", "seed=0"]
    plan = grid.load_plan(PAPER, over, out=results)
    older = "a" * 40
    run = plan.runs[0]
    write_run(run.run_dir, {**run.config, "model": {**run.config["model"], "revision": older}})
    code, out, err = cli(["plan", PAPER, *over, "--out", results], monkeypatch, capsys)
    assert code == 0, err
    assert f"- model Qwen/Qwen2.5-7B@{older}" in out and f"--out {results}" in out, out
    code, out, err = cli(["run", PAPER, *over, "--out", results], monkeypatch, capsys)
    assert code == 2, out
    assert f"Qwen/Qwen2.5-7B@{older}" in err and f"--out {results}" in err, err
    code, out, err = cli(["fetch", PAPER, *over, "--out", results], monkeypatch, capsys)
    assert code == 2 and f"Qwen/Qwen2.5-7B@{older}" in err, err


def test_fetch_errors_are_told_by_their_type_not_their_text(hf_home, monkeypatch):
    """A dataset whose id says "gated" or "offline" gets the advice of the error it raised; datasets' own
    error raised from huggingface_hub's is told by the one underneath."""
    import httpx
    from datasets.exceptions import DatasetGenerationError, DatasetNotFoundError
    from huggingface_hub.errors import GatedRepoError

    response = httpx.Response(403, request=httpx.Request("GET", "https://huggingface.co"))

    def gated():
        try:
            raise GatedRepoError("403", response=response)
        except GatedRepoError as e:
            raise DatasetNotFoundError("Dataset 'someone/maths' is a gated dataset") from e

    errors = {
        "someone/gated-offline-maths": lambda: (_ for _ in ()).throw(
            DatasetGenerationError("An error occurred while generating someone/gated-offline-maths")
        ),
        "someone/maths": gated,
    }

    def download(need):
        errors[need.repo]()

    monkeypatch.setattr(fetching, "hub_unreachable", lambda: None, raising=False)  # the hub answers
    monkeypatch.setattr(fetching, "_download", download)
    found = fetch.fetch([fetch.Need("train data", repo, split="train") for repo in errors])
    assert found[0].message.startswith("datasets.exceptions.DatasetGenerationError: An error occurred")
    assert "accepted the licence at https://huggingface.co/datasets/someone/maths" in found[1].message


def test_no_network_is_said_once_and_fast(tmp_path):
    """The hub unreachable (HF_ENDPOINT on a closed port here): `klsweep fetch` says so in a few seconds, once,
    names what it could not fetch and exits 2 (not five retries a file and raw connection errors)."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: connections are refused
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=f"http://127.0.0.1:{port}", COLUMNS="80")
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "klsweep", "fetch", str(PAPER), "model=qwen2.5-7b"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240,
    )  # fmt: skip
    elapsed = time.monotonic() - start
    assert out.returncode == 2, out.stderr
    assert elapsed < 90, elapsed  # the grid's plan and Python's start included; 8 items x 5 retries before
    assert out.stderr.count("cannot be reached") == 1 and "Traceback" not in out.stderr, out.stderr
    for what in ("Qwen/Qwen2.5-7B", "HuggingFaceH4/MATH-500", "cais/mmlu college_physics test"):
        assert what in out.stderr
    assert f"http://127.0.0.1:{port}" in out.stderr


def test_offline_eval_refuses_a_partial_cache(hf_home, hf_caches, tmp_path, monkeypatch, capsys):
    from klsweep import grid, store
    from klsweep.config import write_run

    _copy_caches(hf_caches, hf_home)
    what, why = _arrow_gone(hf_home)
    plan = grid.load_plan(PAPER, ["model=qwen2.5-7b", "kl.beta=0.0", "seed=0"], out=tmp_path / "results")
    run = plan.runs[0]
    write_run(run.run_dir, run.config)
    store.write_status(run.run_dir, "done")
    code, out, err = cli(["eval", plan.sweep_dir, "--cluster", "debug"], monkeypatch, capsys)
    assert code == 2, out
    assert what in err and why in err and "cais/mmlu" not in err
