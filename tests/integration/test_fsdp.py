"""FSDP2 executed on 2 CPU processes over gloo (``pytest -m fsdp``): ``train.sharding: fsdp`` through klsweep's
real training path (``job.train_run`` in two processes, as a 2-task job runs it), with the test-only switch
``layout.TEST_FSDP_ON_CPU`` that lets accelerate apply its FSDP2 plugin to CPU processes (it does so only for
accelerator processes; docs/DESIGN.md, FSDP2).

One uninterrupted run of the shipped tiny model (policy lag 1, two steps) and the same run resumed from the
sharded checkpoint a preemption saved after step 1: the policy and the reference sharded (DTensors, each rank
a half), each rank writing its own shard, the final checkpoint also whole in Hugging Face format and scored by
``klsweep eval``, each rank's lag buffer restored, and the resumed step 2 equal to the uninterrupted one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from clitools import two_ranks
from runfiles import write_config

from klsweep import store

# The resumed step 2 against the uninterrupted one. Both run the same float32 ops on the same shards in the
# same order (CPU, gloo): equal here to the last bit; the tolerance leaves room for a reduction order that
# differs between two starts (gloo's all-reduce), not for a different trajectory (a lag buffer not restored
# changes the batch; optimizer state not restored changes the update by far more).
RTOL = 1e-5

# Run in each of the two processes: job.train_run, as a training job runs it, with a look at the trainer it
# built (sharding) and, when told, a preemption deferred on rank 1 after step 1 (as the submission layer's
# signal handler defers submitit's): every rank must then save the sharded checkpoint together.
CHILD = """
import json, sys
from pathlib import Path
from transformers import TrainerCallback
from klsweep import job, preemption, trainer_factory

run, preempt = Path(sys.argv[1]), sys.argv[2] == "preempt"
built = []
build = trainer_factory.build_trainer

class Preempt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1 and built[0].accelerator.process_index == 1:
            preemption.defer_to_step_end(lambda: (run / "handler-ran").write_text("1"))

def spy(config, run_dir):
    trainer = build(config, run_dir)
    built.append(trainer)
    if preempt:
        trainer.add_callback(Preempt())
    return trainer

trainer_factory.build_trainer = spy
status = job.train_run(run)
from torch.distributed.tensor import DTensor
t = built[0]
def shares(model):
    params = list(model.parameters())
    return {
        "dtensors": all(isinstance(p, DTensor) for p in params),
        "local": sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params),
        "full": sum(p.numel() for p in params),
    }
print("RESULT " + json.dumps({
    "state": status["state"],
    "distributed_type": str(t.accelerator.distributed_type),
    "policy": shares(t.model),
    "reference": shares(t.ref_model),
}))
"""


def train_two_processes(run: Path, preempt: bool) -> list[dict]:
    """``job.train_run(run)`` on ranks 0 and 1 (gloo, CPU, FSDP2 allowed); each rank's RESULT line."""
    procs = two_ranks(
        [sys.executable, "-c", CHILD, str(run), "preempt" if preempt else "-"],
        env={"KLSWEEP_TEST_FSDP_ON_CPU": "1"},
        stderr=subprocess.PIPE,
    )
    outputs = [p.communicate(timeout=600) for p in procs]
    results = []
    for out, err in outputs:
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert lines, f"no result:\n{out[-3000:]}\n{err[-5000:]}"
        results.append(json.loads(lines[-1].removeprefix("RESULT ")))
    return results


@pytest.mark.fsdp
@pytest.mark.slow
def test_fsdp2_on_two_cpu_processes(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from klsweep import evaluate as ev
    from klsweep.cli import app
    from klsweep.tinymodel import shipped_model_path

    run = tmp_path / "sweep" / "run"
    settings = {
        "train.steps": 2,
        "train.save_steps": 10,  # no periodic save: checkpoint-1 is the preemption's
        "train.learning_rate": 1e-4,
        "train.sharding": "fsdp",
        "offpolicy.lag": 1,
        "kl.beta": 0.1,
    }
    write_config(run, shipped_model_path(), **settings)
    results = train_two_processes(run, preempt=True)

    # FSDP2 applied by accelerate: the policy and the reference are DTensors, each rank holding about half
    for rank in results:
        assert rank["state"] == "done" and rank["distributed_type"] == "DistributedType.FSDP", results
        for model in ("policy", "reference"):
            share = rank[model]
            assert share["dtensors"] and share["local"] < 0.6 * share["full"], (model, share)
    assert (run / "handler-ran").read_text() == "1"  # the preemption's handler ran after the save

    # checkpoint-1 (saved by the preemption): each rank its own shard of the policy and of AdamW, its own lag
    # buffers; no whole weights. checkpoint-2 (final): the same, plus the whole weights for eval.
    first, final = store.checkpoints(run)
    assert (first.name, final.name) == ("checkpoint-1", "checkpoint-2")
    for folder in (first, final):
        for part in ("pytorch_model_fsdp_0", "optimizer_0"):
            assert sorted(p.name for p in (folder / part).iterdir()) == [
                ".metadata",
                "__0_0.distcp",
                "__1_0.distcp",
            ]
        for rank in (0, 1):
            assert (folder / f"klsweep_buffers_rank{rank}.pt").is_file()
    assert not list(first.glob("*.safetensors")) and not (first / "pytorch_model_fsdp.bin").exists()
    assert json.loads((final / store.FINAL_MARKER).read_text())["state"] == "done"
    whole = load_file(final / "model.safetensors")
    initial = load_file(shipped_model_path() / "model.safetensors")
    assert set(initial) <= set(whole)  # (with the tied lm_head, still tied: the same values)
    assert torch.equal(whole["lm_head.weight"], whole["model.embed_tokens.weight"])
    assert any(not torch.equal(whole[k], initial[k].float()) for k in initial)  # trained

    # the requeued job: resume from the preemption's sharded checkpoint, as if checkpoint-2 had never been written
    resumed = tmp_path / "sweep" / "resumed"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / store.CHECKPOINTS_DIR / "checkpoint-2")
    store.write_status(resumed, "running", step=1)
    assert all(r["state"] == "done" for r in train_two_processes(resumed, preempt=False))
    straight, again = store.read_metrics(run), store.read_metrics(resumed)
    assert [r["step"] for r in again] == [1, 2]
    assert again[0] == straight[0]  # step 1 kept from before the preemption
    # each rank's lag buffer restored: step 2 trains the batch generated at step 0 (an empty queue would
    # refill it from the resumed policy, lag 0)
    assert straight[1]["policy_lag"] == again[1]["policy_lag"] == 1.0
    for key in ("loss", "grad_norm", "reward_mean", "entropy", "kl_k3"):
        assert again[1][key] == pytest.approx(straight[1][key], rel=RTOL, abs=1e-8), key
    resumed_whole = load_file(resumed / store.CHECKPOINTS_DIR / "checkpoint-2" / "model.safetensors")
    for k, v in whole.items():
        torch.testing.assert_close(resumed_whole[k], v, rtol=RTOL, atol=1e-7)

    # the final checkpoint is what `klsweep eval` loads
    monkeypatch.chdir(tmp_path)
    base = ev.load_suite("tiny")
    monkeypatch.setattr(ev, "load_suite", lambda name, config_dirs=(): replace(base, limit=4))
    out = CliRunner().invoke(app, ["eval", str(run), "--suite", "tiny", "--cluster", "debug"])
    assert out.exit_code == 0, out.output
    (scored,) = run.glob("eval/*/checkpoint-2/results.json")
    assert json.loads(scored.read_text())["checkpoint"] == "checkpoint-2"


def test_eval_scores_only_checkpoints_with_hugging_face_weights(tmp_path):
    """A sharded FSDP checkpoint (config and shards, no Hugging Face weights) is left out of eval: ``all`` scores
    the final (consolidated) one only; a run with none says why instead of handing lm-eval a folder it cannot
    load."""
    from klsweep.evaluate import runs
    from klsweep.evaluate.suites import EvalError, Suite, load_suite
    from klsweep.tinymodel import shipped_model_path

    run = tmp_path / "run"
    write_config(run, shipped_model_path())
    sharded = run / store.CHECKPOINTS_DIR / "checkpoint-1"
    (sharded / "pytorch_model_fsdp_0").mkdir(parents=True)
    shutil.copy(shipped_model_path() / "config.json", sharded)
    suite = Suite(load_suite("tiny"))
    with pytest.raises(EvalError, match="no complete checkpoint with Hugging Face weights"):
        runs._checkpoint_items(run, suite, "last")
    shutil.copytree(shipped_model_path(), run / store.CHECKPOINTS_DIR / "checkpoint-2")
    assert [i.checkpoint for i in runs._checkpoint_items(run, suite, "all")] == ["checkpoint-2"]


@pytest.mark.fsdp
@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_preemption_of_an_fsdp_job_requeues_and_resumes_from_its_shards(tmp_path, monkeypatch):
    """2 Slurm tasks, ``train.sharding: fsdp``, lag 1: USR2 (what Slurm sends before preemption or the time limit)
    makes every rank write its shard of a checkpoint at the end of the step in progress; the job requeues itself
    and resumes from those shards: every metrics step written once, the steps before the save kept as they were,
    every step after the fill trained on a batch generated one step earlier (each rank's lag buffers back)."""

    import launcher_jobs as jobs

    from klsweep import layout
    from klsweep.tinymodel import shipped_model_path

    monkeypatch.setenv(layout.TEST_FSDP_ON_CPU, "1")  # sbatch hands the job this environment
    lag, steps = 1, 20  # the signal comes after step 2: far from the end, even on a loaded machine
    sweep = tmp_path / "fsdppreempt"
    plan = jobs.make_plan(
        sweep,
        [0],
        **{
            "model.path": str(shipped_model_path()),
            "model.resources.tasks_per_node": 2,
            "train.sharding": "fsdp",
            "train.steps": steps,
            "train.save_steps": 1000,  # the preemption's save only (and the final one)
            "train.keep_checkpoints": None,
            "train.prompts_per_step": 2,
            "train.max_completion_length": 8,
            "train.learning_rate": 1e-4,
            "kl.beta": 0.1,
            "offpolicy.lag": lag,
            "wandb.mode": "disabled",
        },
    )
    run_dir = plan.runs[0].run_dir
    job_id, signalled = jobs.submit_and_signal(sweep, plan, after_steps=2, timeout_s=400)
    run = jobs.follow_to_the_end(sweep, timeout_s=400)
    assert run.state == "done" and run.step == steps, run.log_tail
    assert run.job_id == job_id  # the same job, requeued
    saved = [c for c in store.checkpoints(run_dir) if store.checkpoint_step(c) < steps]
    assert len(saved) == 1 and store.checkpoint_step(saved[0]) >= max(signalled)  # the preemption's save
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(p.name for p in (saved[0] / part).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert not store.has_weights(saved[0]) and store.has_weights(store.checkpoints(run_dir)[-1])
    jobs.assert_resumed_not_restarted(run_dir, steps, signalled, lag)
