"""klsweep rehearse: the covering runs of a grid, and the real path (tiny random models of the paper's
architecture classes, the shipped samples) through training, resume, lm-eval and the report; a broken wire
fails its stage with a located reason."""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from pathlib import Path

import pytest
from clitools import cli

from klsweep import grid, rehearse, store
from klsweep.config import NO_KL

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "sweeps" / "paper.yaml"
ONE_RUN = ["model=qwen2.5-7b", "kl.estimator=k1", "kl.placement=loss", "kl.beta=0.1", "seed=0"]


def test_covering_runs_hold_every_value_of_the_paper_grid():
    plan = grid.load_plan(PAPER)
    chosen = rehearse.covering_runs(plan.runs)
    assert len(chosen) <= 6 < len(plan.runs)
    for key in rehearse.COVERED:
        every = {json.dumps(rehearse.covered_values(r.config)[key]) for r in plan.runs}
        held = {json.dumps(rehearse.covered_values(r.config)[key]) for r in chosen}
        assert held == every, key
    assert json.dumps(NO_KL) in {
        json.dumps(rehearse.covered_values(r.config)["kl.estimator"]) for r in chosen
    }


@pytest.mark.slow
def test_rehearse_the_paper_grid(tmp_path, monkeypatch, capsys):
    """Every paper model's architecture class (qwen2, llama, qwen3) trained, resumed and scored on every eval
    task of the suite; about 75 s on 2 cores."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # a fresh clone: nothing cached, each conf's arch
    start = time.time()
    code, out, err = cli(["rehearse", PAPER], monkeypatch, capsys, columns=80, terminal=True)
    elapsed = time.time() - start
    # the rehearsal passes; `klsweep run` would refuse: the grid is offline and a fresh HF_HOME caches nothing
    # (and without vLLM, train.use_vllm): findings, exit 1
    assert code == 1 and "rehearsal passed, but not the real run from here" in out, out + err
    said = " ".join(out.split())
    assert "the real run would refuse: offline, model Qwen/" in said
    no_vllm = importlib.util.find_spec("vllm") is None
    assert ("the real run would refuse: train.use_vllm needs vllm" in said) == no_vllm
    table = out[out.index("rehearsal of paper") :]
    assert max(len(line) for line in table.splitlines()) <= 80
    folder = tmp_path / "results" / ".rehearsal" / "paper"
    assert not (tmp_path / "results" / "paper").exists()  # apart from the sweep's results
    classes = set()
    for run_dir in sorted(p for p in folder.iterdir() if (p / "config.yaml").is_file()):
        config = json.loads(json.dumps(__import__("yaml").safe_load((run_dir / "config.yaml").read_text())))
        classes.add(json.loads((Path(config["model"]["path"]) / "config.json").read_text())["model_type"])
        metrics = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert metrics == list(range(1, config["train"]["steps"] + 1))  # resumed without a gap or a repeat
        (results,) = run_dir.glob("eval/*/*/results.json")
        scores = json.loads(results.read_text())["metrics"]
        assert set(scores["in_domain"]) == {"klsweep_math500"}
        assert set(scores["ood"]) == {
            f"klsweep_mmlu_college_{s}" for s in ("physics", "chemistry", "biology")
        }
    assert classes == {"qwen2", "llama", "qwen3"}
    assert "byte-level stand-in tokenizer" in out
    engines = " ".join(out[out.index("what each stage ran with") :].split())
    if importlib.util.find_spec("vllm") is None:  # what it replaced where vLLM is not installed
        assert "train HF generate none (for fsdp) a tiny random model for " in engines
        assert "eval lm-eval hf one copy (for 8) a tiny random model for " in engines
        assert (
            "HF generate for vLLM (not installed)" in engines
            and "lm-eval hf for vLLM (not installed)" in engines
        )
        assert "shipped samples for DigitalLearningGmbH/MATH-lighteval" in engines
        assert "HF generate in place of vLLM: vllm does not import here" in out
    else:  # ./dev.sh vllm-test: generation and eval through vLLM (its CPU build here)
        assert "train vLLM " in engines and " CPU colocate none (for fsdp)" in engines
        assert "eval lm-eval vllm, vLLM " in engines and "vLLM (not installed)" not in engines
        assert "vllm_enable_sleep_mode not exercised: not in vLLM's CPU build" in out
    assert (folder / "report").is_dir()
    print(f"rehearsal of sweeps/paper.yaml: {elapsed:.0f} s")


@pytest.mark.vllm
@pytest.mark.slow
def test_rehearse_generates_and_evaluates_through_vllm_where_it_imports(tmp_path, monkeypatch, capsys):
    """Where vllm imports (./dev.sh vllm-test: its CPU build), rehearse trains the paper's off-policy arm (lag 10,
    the qwen3 class) with TRL's colocate vLLM, resumes it and scores it through lm-eval's vllm backend; the
    stage table names vLLM for each stage and replaces nothing but the sharding and sleep mode. With the grid's
    models and datasets cached (the session's caches: tiny stand-ins under the paper's names) the rehearsal
    passes, exit 0: .venv-vllm holds what the real run needs, ray for the eval's 4 model copies included."""
    monkeypatch.chdir(tmp_path)
    one = ["model=qwen3-4b-instruct-2507", "kl.estimator=k3", "kl.placement=both", "kl.beta=0.1",
           "offpolicy.lag=10", "seed=0"]  # fmt: skip
    code, out, err = cli(["rehearse", PAPER, *one], monkeypatch, capsys, columns=80, terminal=True)
    assert code == 0 and "".join(out.split()).endswith("/paper:passed"), out + err
    assert "the real run would" not in out
    assert "needs vllm" not in out
    engines = " ".join(out[out.index("what each stage ran with") :].split())
    for stage in ("train", "resume"):
        assert f"{stage} vLLM " in engines and " CPU colocate none (for fsdp)" in engines
    assert "eval lm-eval vllm, vLLM " in engines and "one copy (for 4)" in engines
    assert "not installed" not in engines and "HF generate" not in engines
    assert "vllm_enable_sleep_mode not exercised: not in vLLM's CPU build" in out
    (run_dir,) = [
        p for p in (tmp_path / "results" / ".rehearsal" / "paper").iterdir() if (p / "config.yaml").is_file()
    ]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 13))  # lag 10: 12 steps, resumed without a gap or a repeat
    (results,) = run_dir.glob("eval/*/*/results.json")
    assert json.loads(results.read_text())["backend"] == "vllm"


def _failed(out: str, stage: str) -> str:
    lines = [line for line in out.splitlines() if f" {stage} failed: " in line]
    assert lines, out
    return lines[0]


def test_too_little_memory_free_for_vllms_engines_is_said_before_starting(tmp_path, monkeypatch, capsys):
    """#44: where vLLM's CPU build would train and evaluate (here as if it were installed) and less memory is free
    than the rehearsal's process and an engine's KV cache (1 GiB for the stand-ins, or VLLM_CPU_KVCACHE_SPACE)
    need, the rehearsal says so with both numbers and writes nothing; before, every engine failed minutes in
    ("Available memory on node 0 (16.62/23.54 GiB) ... less than requested memory for kv")."""
    from klsweep import engines
    from klsweep.rehearse import memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683784 kB\nMemAvailable:    3355443 kB\n")
    assert round(memory.free_gib(str(meminfo)), 1) == 3.2  # what the kernel says is free, read as it is here
    monkeypatch.setattr(engines, "vllm_build", lambda: "vLLM 0.31.0 CPU")
    monkeypatch.setattr(memory, "MEMINFO", str(meminfo))
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    out = tmp_path / "out"
    code, _, err = cli(["rehearse", PAPER, *ONE_RUN, "--out", out], monkeypatch, capsys, columns=200)
    said = " ".join(err.split())
    assert code == 2, err
    assert (
        "3.2 GiB free, but the rehearsal needs about 5 GiB" in said
        and ", 1 GiB (VLLM_CPU_KVCACHE_SPACE" in said
    )
    assert not out.exists()  # nothing written
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")  # the user's size is the one the engines take
    code, _, err = cli(["rehearse", PAPER, *ONE_RUN, "--out", out], monkeypatch, capsys, columns=200)
    assert code == 2 and "needs about 7 GiB" in " ".join(err.split()), err


def test_prompts_that_cannot_fit_fail_training(tmp_path, monkeypatch, capsys):
    code, out, err = cli(
        ["rehearse", PAPER, *ONE_RUN, "train.max_prompt_length=8", "--out", tmp_path], monkeypatch, capsys
    )
    assert code == 1
    line = _failed(out, "train")
    assert (
        "train.max_prompt_length" in line and "longer than 8 tokens" in line and "rehearse-train.log" in line
    )


def test_an_eval_prompt_field_missing_from_the_data_fails_eval(tmp_path, monkeypatch, capsys):
    tasks = tmp_path / "tasks"
    shutil.copytree(REPO / "klsweep" / "evaltasks" / "paper", tasks)
    math500 = tasks / "klsweep_math500.yaml"
    math500.write_text(math500.read_text().replace("{{problem}}", "{{question}}"))
    code, out, err = cli(
        ["rehearse", PAPER, *ONE_RUN, f"eval.include_path={tasks}", "--out", tmp_path / "r"],
        monkeypatch,
        capsys,
    )
    assert code == 1
    line = _failed(out, "eval")
    assert "eval task klsweep_math500" in line and "'question' is undefined" in line


def test_a_chat_template_mismatch_fails(tmp_path, monkeypatch, capsys):
    from klsweep.tinymodel import TinySpec, random_tiny_model

    # a tokenizer without a chat template; the context of the paper's vLLM engines (plan refuses a shorter one)
    model = random_tiny_model(tmp_path / "model", TinySpec(max_position_embeddings=32768))
    for f in model.glob("chat_template.*"):
        f.unlink()
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    code, out, err = cli(
        ["rehearse", PAPER, *ONE_RUN, f"model.path={model}", "model.chat_template=true", "--out", tmp_path / "r"],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 1
    line = _failed(out, "train")
    assert "model.chat_template" in line and "has no chat template" in line


@pytest.mark.slurm
def test_rehearse_on_slurm(tmp_path, monkeypatch, capsys):
    """One short job on the grid's partition (the local test cluster's), the same table back. A grid whose real
    runs fit the test cluster's CPU nodes: the paper's 7B runs on 4 GB without GPUs are refused by the plan's
    check before anything is submitted (the real run would not fit; rehearse checks the real plan)."""
    grid_file = tmp_path / "g.yaml"
    grid_file.write_text(
        ONE_TINY_RUN.replace("  train.steps: 4\n", "  train.steps: 4\n  eval: tiny\n  eval.limit: 4\n")
    )
    code, out, err = cli(
        [
            "rehearse", grid_file, "cluster.partition=debug", "model.resources.cpus_per_task=1",
            "--cluster", "slurm", "--out", tmp_path / "out",
        ],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 0, out + err
    assert "rehearsed on Slurm (log: " in out
    assert any((tmp_path / "out" / "g").glob("*/eval/*/*/results.json"))
    code, out, err = cli(
        [
            "rehearse", PAPER, *ONE_RUN, "cluster.partition=debug", "model.resources.gpus_per_node=0",
            "model.resources.mem_gb=4", "train.sharding=none", "--cluster", "slurm", "--out", tmp_path / "p",
        ],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 2 and "model.resources.mem_gb" in err and not (tmp_path / "p" / ".submitit-paper").exists()


def test_a_sweeps_results_are_never_replaced(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "paper"
    (sweep / "abc").mkdir(parents=True)
    code, out, err = cli(["rehearse", PAPER, *ONE_RUN, "--out", tmp_path], monkeypatch, capsys)
    assert code == 2 and "holds something else than a rehearsal" in err
    assert (sweep / "abc").is_dir()


ONE_TINY_RUN = """\
name: g
base:
  model: tiny
  task: tiny
  cluster: local
  train.steps: 4
  train.save_steps: 2
  train.prompts_per_step: 2
  train.group_size: 2
  train.max_completion_length: 6
grid:
  kl.estimator: k1
  kl.placement: loss
  seed: 0
"""


def test_a_rehearsal_is_never_a_sweep(tmp_path, monkeypatch, capsys):
    """Issue 32 D1 and D14: `rehearse G --out R` then `run G --out R --wait` used to skip the real run as done
    (the rehearsal's 2-step run under the same id) and eval/report scored it; a second rehearsal into the same
    folder meanwhile removed the first one's files. Now the second rehearsal is refused while the first runs,
    and plan, run, status, cancel, eval, report and study refuse the rehearsal's folder (exit 2), writing
    nothing."""
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.yaml").write_text(ONE_TINY_RUN)
    folder = tmp_path / "R" / "g"
    first = subprocess.Popen(
        [sys.executable, "-m", "klsweep", "rehearse", "g.yaml", "--out", "R"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while not list(folder.glob("*/config.yaml")) and first.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        code, out, err = cli(["rehearse", "g.yaml", "--out", "R"], monkeypatch, capsys)
        assert code == 2 and "another `klsweep rehearse` is writing" in err, out + err
        assert first.wait(timeout=600) == 0, first.stdout.read()
    finally:
        first.kill()
    (run_dir,) = [p.parent for p in folder.glob("*/config.yaml")]
    assert (folder / "report" / "report.md").is_file()  # the first one whole
    assert store.read_status(run_dir)["total_steps"] == 2
    before = sorted(str(p) for p in folder.rglob("*"))

    code, out, err = cli(["run", "g.yaml", "--out", "R", "--wait"], monkeypatch, capsys)
    assert code == 2 and "is a rehearsal" in err and f"rm -r {folder}" in err, out + err
    assert "skip-done" not in out and not (folder / store.JOBS_FILE).exists()
    for args in (["plan", "g.yaml", "--out", "R"], ["status", folder], ["cancel", folder], ["eval", folder],
                 ["eval", run_dir], ["report", folder], ["study", "g.yaml", "eval=tiny", "--out", "R"]):  # fmt: skip
        code, out, err = cli(args, monkeypatch, capsys)
        assert code == 2 and "a rehearsal is not a sweep" in err and "Traceback" not in err, (args, out + err)
    assert sorted(str(p) for p in folder.rglob("*")) == before
    assert store.read_status(run_dir)["total_steps"] == 2


def test_a_marked_folder_that_a_sweep_ran_in_is_never_replaced(tmp_path, monkeypatch, capsys):
    """A folder marked as a rehearsal where a sweep was run anyway (an older klsweep): rehearse leaves it."""
    sweep = tmp_path / "paper"
    sweep.mkdir()
    (sweep / rehearse.MARKER).write_text("")
    (sweep / store.JOBS_FILE).write_text("{}\n")
    code, out, err = cli(["rehearse", PAPER, *ONE_RUN, "--out", tmp_path], monkeypatch, capsys)
    assert code == 2 and "holds a sweep's results" in err, out + err
    assert (sweep / store.JOBS_FILE).is_file()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm imports here: nothing refused")
def test_what_the_real_run_would_refuse_is_a_finding(tmp_path, monkeypatch, capsys):
    """Issue 37 item 6: a grid whose eval asks for vLLM rehearsed where vllm does not import passed (lm-eval hf
    in its place) while `klsweep run` then refused it. Now the stage table names every part swapped for a
    stand-in, the refusal is a finding ("the real run would refuse: ...") and the exit code is 1; the same grid
    with the engine that is installed here is ready (exit 0)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.yaml").write_text(
        ONE_TINY_RUN.replace("  train.steps: 4\n", "  train.steps: 4\n  eval: tiny\n")
    )
    code, out, err = cli(
        ["rehearse", "g.yaml", "eval.backend=vllm", "--out", "R"], monkeypatch, capsys, columns=200
    )
    assert code == 1, out + err
    engines = " ".join(out[out.index("what each stage ran with") :].split())
    assert (
        "4 shipped sample problems per task for 64" in engines and "random model" not in engines
    )  # tiny's own
    assert "lm-eval hf for vLLM (not installed)" in engines and "2 steps for 4" in engines
    refusal = next(line for line in out.splitlines() if line.startswith("the real run would refuse: "))
    assert "eval.backend needs vllm" in refusal
    assert (
        out.rstrip()
        .splitlines()[-1]
        .endswith("rehearsal passed, but not the real run from here (1 finding(s) above)")
    )
    code, out, err = cli(["run", "g.yaml", "eval.backend=vllm", "--cluster", "debug"], monkeypatch, capsys)
    assert code == 2 and "vllm" in err  # what the rehearsal said
    code, out, err = cli(["rehearse", "g.yaml", "--out", "R"], monkeypatch, capsys, columns=200)
    assert code == 0 and "the real run would refuse" not in out, out + err
    assert out.rstrip().splitlines()[-1].endswith(": passed")
