"""Every shipped grid (sweeps/*.yaml) opens with a how-to-run comment and plans without a problem."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from klsweep import grid, planner
from klsweep.grid.claims import read_claims_file

REPO = Path(__file__).resolve().parents[2]
SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))


def test_the_three_sweeps_are_shipped():
    assert {p.stem for p in SWEEPS} >= {"paper", "tiny", "presets"}


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_shipped_sweep_plans(path, tmp_path):
    assert path.read_text().startswith(
        (
            "# how to run: klsweep run sweeps/",
            "# how to run: klsweep study sweeps/",
            "# how to run: klsweep study ",
        )
    )
    plan = grid.load_plan(path, out=tmp_path)
    assert plan.name == path.stem
    assert plan.runs and len({r.id for r in plan.runs}) == len(plan.runs)
    assert all(set(r.params) == set(plan.axes) for r in plan.runs)
    assert len(planner.check(plan)) == len(plan.runs)  # every run can start and fits its GPUs
    assert not any(tmp_path.iterdir())


def test_paper_sweep_is_the_study(tmp_path):
    plan = grid.load_plan(Path(__file__).parents[2] / "sweeps" / "paper.yaml", out=tmp_path)
    runs = [r.config for r in plan.runs]
    assert {c["task"]["name"] for c in runs} == {"math"}
    assert {c["eval"]["suite"] for c in runs} == {"paper"}
    assert {c["cluster"]["kind"] for c in runs} == {"slurm"}
    assert {c["train"]["group_size"] for c in runs} == {5}
    assert {c["train"]["sharding"] for c in runs} == {"fsdp"}
    # compute nodes load from the caches alone (klsweep fetch first): every job runs HF_HUB_OFFLINE=1 (#34)
    assert {c["cluster"]["offline"] for c in runs} == {True}
    assert {c["train"]["vllm_importance_sampling"] for c in runs} == {"token_truncate"}  # not TRL's default
    assert {c["seed"] for c in runs} == {0, 1, 2}
    # the eval writes as long as the paper's wordiest model needs: Qwen3-4B-Instruct-2507's MATH-500 answers
    # run past 2,048 tokens (its card recommends 16,384), and a cut answer has no box and scores 0
    assert {c["eval"]["max_gen_toks"] for c in runs} == {16384}
    # ... and lm-eval's vLLM is sized for it (#34 item 4): room for a prompt and those 16,384 tokens, not the
    # models' own 131,072/262,144-token context (KV cache reserved for one sequence that long), and its share of
    # the GPU named
    assert {c["eval"]["max_model_len"] for c in runs} == {20480}
    assert {c["eval"]["gpu_memory_utilization"] for c in runs} == {0.9}
    assert {c["kl"]["beta"] for c in runs} == {0.0, 0.05, 0.1, 0.3, 1.0}
    kl_runs = [c for c in runs if c["kl"]["beta"] > 0]
    assert {(c["kl"]["estimator"], c["kl"]["placement"]) for c in kl_runs} == {
        (e, p) for e in ("k1", "k3") for p in ("reward", "loss", "both")
    }
    lags = {(c["model"]["name"], c["offpolicy"]["lag"]) for c in runs}
    assert lags == {
        ("qwen2.5-7b", 0),
        ("llama-3.1-8b-instruct", 0),
        ("qwen3-4b-instruct-2507", 0),
        ("qwen3-4b-instruct-2507", 10),
    }
    per_model = Counter(c["model"]["name"] for c in runs)
    assert per_model == {"qwen2.5-7b": 75, "llama-3.1-8b-instruct": 75, "qwen3-4b-instruct-2507": 150}
    assert planner.gpu_hours(plan.runs) > 0


def test_paper_eval_hands_vllm_its_length_and_memory_share(tmp_path):
    """The paper sweep's eval section, as an eval job reads it, reaches lm-eval's vllm model arguments with
    max_model_len and gpu_memory_utilization (#34 item 4: without them vLLM reserved the model's whole context)."""
    from klsweep.config import ModelSection
    from klsweep.evaluate import as_eval_section, running

    plan = grid.load_plan(REPO / "sweeps" / "paper.yaml", out=tmp_path)
    config = plan.runs[0].config
    cfg = as_eval_section(config["eval"])
    assert cfg.backend == "vllm"
    model = ModelSection(name=config["model"]["name"], path=config["model"]["path"])
    item = running.Item(model.path, model, tmp_path, "checkpoint-500", 500, {})
    args = running.vllm_model_args(item, cfg)
    assert (args["max_model_len"], args["gpu_memory_utilization"]) == (20480, 0.9)
    assert args["max_gen_toks"] == 16384
    assert args["max_model_len"] - args["max_gen_toks"] >= 4096  # MATH-500's longest prompt fits beside


def test_tiny_sweeps_main_job_and_full_reproduction(tmp_path):
    """sweeps/tiny.yaml (the README's main job) is study v6: fast numerics, a seed rule, the on-policy arm
    (10 seeds), the beta arm at 2 and 3 (the paper's two biased configurations and two exact ones, 5 seeds) and
    the lag arm (6 seeds). sweeps/tiny-full.yaml is study v5's full reproduction as v5 ran it (its committed
    report): exact numerics, beta 0.3 and 1, 184 runs, v5's claims."""
    main = grid.load_plan(REPO / "sweeps" / "tiny.yaml", out=tmp_path)
    full = grid.load_plan(REPO / "sweeps" / "tiny-full.yaml", out=tmp_path)
    assert len(main.runs) == 128 and len(full.runs) == 184
    assert main.seed_rule is not None and main.seed_rule.pilot == 3
    assert {r.config["train"]["numerics"] for r in main.runs} == {"fast"}
    assert {r.config["train"]["numerics"] for r in full.runs} == {"exact"}
    for beta in (2, 3):  # `unbiased: false` in the beta arm is exactly k1 in the loss and k3 in the reward
        arm = Counter(
            (c["kl"]["estimator"], c["kl"]["placement"], c["offpolicy"]["lag"])
            for c in (r.config for r in main.runs)
            if c["kl"]["beta"] == beta
        )
        assert arm == {
            (e, p, 0): 5 for e, p in (("k1", "loss"), ("k3", "reward"), ("k1", "reward"), ("k3", "both"))
        }
    # study v4's lag arm: what the off-policy audit calls exact at lag 16 but k1 in both, plus no KL
    lagged = {
        (c["kl"]["estimator"], c["kl"]["placement"], c["kl"]["reward_logp"], c["kl"]["importance"])
        for c in (r.config for r in main.runs)
        if c["offpolicy"]["lag"] and c["kl"]["beta"]
    }
    assert lagged == {(e, p, "current", "sequence") for e, p in (("k1", "reward"), ("k3", "both"))}
    for plan in (main, full):
        seeds = Counter(
            (c["offpolicy"]["lag"], c["kl"]["beta"], c["seed"]) for c in (r.config for r in plan.runs)
        )
        assert {s for lag, beta, s in seeds if lag == 0 and beta in (0, 1)} == set(range(10))
        assert {s for lag, beta, s in seeds if lag == 16 or beta == 0.3} == set(range(6))
    for plan in (main, full):
        assert {r.config["model"]["path"] for r in plan.runs} == {"tiny"}
        assert {r.config["offpolicy"]["lag"] for r in plan.runs} == {0, 16}
        assert {r.config["eval"]["limit"] for r in plan.runs} == {100}
        assert {r.config["kl"]["reward_mode"] for r in plan.runs} == {"separate"}
        assert any(r.config["kl"]["beta"] == 0 for r in plan.runs)
        assert planner.gpu_hours(plan.runs) == 0
    assert {r.config["kl"]["placement"] for r in full.runs if r.config["kl"]["beta"]} == {
        "reward",
        "loss",
        "both",
    }
    assert {r.config["kl"]["beta"] for r in main.runs} == {0.0, 1.0, 2.0, 3.0}
    assert {r.config["kl"]["beta"] for r in full.runs} == {0.0, 0.3, 1.0}
    # v6's claims: (a) as the paper states it, at beta 3 and 2, its dose-response, k3 in the loss apart;
    # (b), (c); (d) on the peak KL and the reward drop (an any-of group)
    claims = read_claims_file(REPO / "sweeps" / "tiny.yaml")
    assert len(claims) == 15 and len(read_claims_file(REPO / "sweeps" / "tiny-full.yaml")) == 9
    assert (claims[0].metric, claims[0].test, claims[0].a["kl.beta"]) == ("reward_drop", "welch", [3])
    assert not any(c.metric == "unstable" for c in claims)  # (d)'s count: untestable at this scale (STUDY.md)
    assert {c.group for c in claims if c.name.startswith("(d)")} == {
        "(d) KL regularisation can help stabilise off-policy training"
    }
    assert len(read_claims_file(REPO / "sweeps" / "paper.yaml")) == 17


def test_example_run_config_composes() -> None:
    from klsweep import grid

    config = grid.compose_run_config(REPO / "examples" / "run_tiny.yaml", ["train.steps=5"])
    assert config["kl"]["estimator"] == "k1" and config["kl"]["placement"] == "reward"
    assert config["train"]["steps"] == 5 and config["model"]["path"] == "tiny"


def test_the_committed_studies_keep_their_run_ids(tmp_path):
    """Every run id of sweeps/tiny.yaml and sweeps/tiny-full.yaml is the one the committed reports name
    (results/*/report/runs.csv): a key added to RunConfig is left out of the id at its default
    (config.ID_OMITTED_AT, e.g. the frameworks' KL forms), or the studies would no longer find their runs."""
    import csv

    for sweep in ("tiny", "tiny-full"):
        ids = {r.id for r in grid.load_plan(REPO / "sweeps" / f"{sweep}.yaml", out=tmp_path).runs}
        with open(REPO / "results" / sweep / "report" / "runs.csv", newline="") as f:
            committed = {row["run"] for row in csv.DictReader(f)}
        assert ids == committed, sweep
