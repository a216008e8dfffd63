"""TRL's colocate vLLM generation through klsweep's training path, on vLLM's CPU build (``./dev.sh vllm-test``:
.venv-vllm; marked ``vllm``: skipped where vllm cannot be imported, failed under CI=true).

The stand-in is an untrained tiny Qwen2 whose attention vLLM's CPU kernels accept (one head of 64: head_dim 64;
the shipped tiny model's head_dim 16 is refused). The learning rate is large, so that the policy moves far from
its start within a few steps: a vLLM still generating with stale weights would show it in the per-step mismatch.

Tolerance: the mean absolute per-token log-prob difference between vLLM and the trainer at the same weights was
5e-4 to 7e-4 here (TRL builds the engine without a dtype: vLLM's automatic one, the trainer in float32);
``MISMATCH_TOL`` leaves room for other CPUs. With weights one sync behind, it would be of the order of the
policy's KL to its start, which the test makes several times larger.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from runfiles import kill_after_step_3, write_config

from klsweep import job, store

pytestmark = pytest.mark.vllm

MISMATCH_TOL = 0.01  # mean |log pi_trainer - log pi_vllm| per completion token, at the same weights

_SETUP = """
from klsweep import tasks
from test_vllm import length_reward
tasks.reward_function = lambda task: length_reward
"""


def length_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """Signal for an untrained model (the tiny task's reward is 0 everywhere): the policy moves."""
    return [float(len(c[0]["content"]) % 3) for c in completions]


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny Qwen2 with head_dim 64 (hidden 64, one attention head, one KV head)."""
    from klsweep.tinymodel import TinySpec, random_tiny_model

    return random_tiny_model(
        tmp_path_factory.mktemp("vllm") / "model", TinySpec(num_attention_heads=1, num_key_value_heads=1)
    )


def test_colocate_vllm_trains_with_lag_syncs_weights_each_step_and_resumes(
    tmp_path: Path, stand_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vllm  # noqa: F401  (CI: fails here, not skipped, where vLLM is missing)

    from klsweep import tasks

    monkeypatch.setattr(tasks, "reward_function", lambda task: length_reward)

    run = tmp_path / "run"
    write_config(
        run,
        stand_in,
        **{
            "train.use_vllm": True,
            "train.steps": 6,
            "train.learning_rate": 3e-2,
            "train.max_completion_length": 12,
            "train.max_prompt_length": 128,  # vLLM's context (prompt + completion) within the model's 256
            "offpolicy.lag": 1,
        },
    )
    here = str(Path(__file__).parent)
    path = os.pathsep.join([here, str(Path(here).parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": path}
    kill_after_step_3(run, env, timeout_s=300, setup=_SETUP)
    assert [c.name for c in store.checkpoints(run)] == ["checkpoint-2"]

    status = job.train_run(run)  # resumed from checkpoint-2 in this process: a second vLLM engine
    assert status["state"] == "done", status.get("reason")
    rows = store.read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    # the lag buffer came back with the checkpoint: every batch trained one step after vLLM generated it
    assert [r["policy_lag"] for r in rows] == [0, 1, 1, 1, 1, 1]
    for r in rows:  # TRL synced the weights into vLLM before each generation, also after the resume
        assert r["vllm/logp_mismatch"] < MISMATCH_TOL, r
        assert 0.0 <= r["vllm/kept_fraction"] <= 1.0 and r["vllm/ratio_mean"] > 0
    # ... and the policy moved: with the start's weights in vLLM the mismatch would be at least |KL k1|
    assert abs(rows[-1]["kl_k1"]) > 4 * MISMATCH_TOL, rows[-1]
    assert [c.name for c in store.checkpoints(run)] == ["checkpoint-4", "checkpoint-6"]


def test_colocate_vllm_stops_a_base_model_at_the_tasks_stop_sequence(tmp_path: Path, stand_in: Path) -> None:
    """#34 item 3 with vLLM: ``model.chat_template: false`` hands vLLM's SamplingParams the eval's stop sequences
    of the task (TRL's ``generation_kwargs``: ``stop``; HF generate gets ``stop_strings``, test_job.py) and each
    completion is cut right after the first one it writes: the text after the answer is neither scored nor
    trained, whichever engine generated it."""
    import torch
    import vllm  # noqa: F401  (CI: fails here, not skipped, where vLLM is missing)

    from klsweep import config as config_mod
    from klsweep import tasks, trainer_factory

    run = tmp_path / "run"
    values = {"train.use_vllm": True, "model.chat_template": False, "train.max_completion_length": 48}
    write_config(run, stand_in, **values, **{"train.max_prompt_length": 128})
    config = config_mod.load_run(run)
    stops = tasks.stop_sequences(config.task)
    trainer = trainer_factory.build_trainer(config, run)
    assert trainer.args.generation_kwargs == {"stop": list(stops), "skip_special_tokens": False}
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = [trainer.train_dataset[i] for i in range(4) for _ in range(4)]
    torch.manual_seed(0)
    out = trainer._generate_and_score_completions(rows)
    texts = [
        trainer.processing_class.decode(ids[mask.bool()], skip_special_tokens=True)
        for ids, mask in zip(out["completion_ids"], out["completion_mask"], strict=True)
    ]
    stopped = [t for t in texts if any(s in t for s in stops)]
    assert len(stopped) >= 4, texts  # the random stand-in writes newlines: the case is exercised
    for text in stopped:  # the stop sequence ends the completion: nothing after it is trained
        assert any(text.endswith(s) for s in stops) and sum(text.count(s) for s in stops) == 1, text


def test_colocate_vllm_stops_at_a_special_token_stop_sequence(
    tmp_path: Path, stand_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop sequence that is a special token of the tokenizer (Qwen2.5 base may write <|im_end|>, which is not
    its end id) stops vLLM itself, not only klsweep's cut after it: vLLM matches ``stop`` in its decoded text,
    which leaves special tokens out unless told (it decoded such a completion to max_completion_length)."""
    import vllm  # noqa: F401  (CI: fails here, not skipped, where vLLM is missing)
    from trl import GRPOTrainer

    from klsweep import config as config_mod
    from klsweep import tasks, trainer_factory

    stop = "<|im_start|>"  # special in the stand-in's tokenizer, not one of its end ids (<|im_end|>, <|endoftext|>)
    monkeypatch.setattr(tasks, "stop_sequences", lambda task: (stop,))
    run = tmp_path / "run"
    values = {"train.use_vllm": True, "model.chat_template": False, "train.max_completion_length": 128}
    write_config(run, stand_in, **values, **{"train.max_prompt_length": 128})
    trainer = trainer_factory.build_trainer(config_mod.load_run(run), run)
    (stop_id,) = trainer.processing_class.encode(stop, add_special_tokens=False)
    assert stop_id not in json.loads((stand_in / "generation_config.json").read_text())["eos_token_id"]
    generated: list[list[int]] = []  # vLLM's completions before klsweep's cut
    engine = GRPOTrainer._generate_single_turn

    def spy(self, *args, **kwargs):
        completion_ids, logprobs = engine(self, *args, **kwargs)
        generated.extend(list(ids) for ids in completion_ids)
        return completion_ids, logprobs

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", spy)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    trainer._generate_and_score_completions([trainer.train_dataset[i] for i in range(4) for _ in range(4)])
    written = [ids for ids in generated if stop_id in ids]
    assert len(written) >= 2, generated  # the random stand-in writes it: the case is exercised
    for ids in written:  # vLLM stopped at it: nothing was decoded after it
        assert ids.index(stop_id) == len(ids) - 1, ids


def test_colocate_vllm_on_a_cpu_sizes_its_kv_cache_to_the_run(
    tmp_path: Path, stand_in: Path, monkeypatch
) -> None:
    """#44: without a GPU TRL's colocate engine gets the KV cache its batch needs (``engines.kv_cache_bytes``:
    TRL's max_num_seqs sequences of prompt + completion, in the CPU build's whole GiB), not vLLM's CPU default
    (TRL's vllm_gpu_memory_utilization of the machine's memory less the process's, which a busy machine did
    not have: every rehearsed run failed). The blocks vLLM allocated hold that batch."""
    import vllm  # noqa: F401  (CI: fails here, not skipped, where vLLM is missing)

    from klsweep import config as config_mod
    from klsweep import engines, trainer_factory

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # klsweep's rule, not the environment's
    run = tmp_path / "run"
    write_config(run, stand_in, **{"train.use_vllm": True, "train.max_prompt_length": 128})
    trainer = trainer_factory.build_trainer(config_mod.load_run(run), run)
    cache = trainer.vllm_generation.llm.llm_engine.vllm_config.cache_config
    assert cache.kv_cache_memory_bytes == 2**30  # the CPU build's least: the batch needs well under a MiB
    args = trainer.args
    seqs = args.per_device_train_batch_size * args.steps_per_generation
    assert cache.num_gpu_blocks * cache.block_size >= seqs * args.vllm_max_model_length
    need = engines.kv_cache_bytes(trainer.model.config, args.vllm_max_model_length, seqs)
    assert need == seqs * args.vllm_max_model_length * 2 * 2 * 1 * 64 * 4  # layers, KV heads, head_dim, fp32
    assert engines.KV_CACHE_VARIABLE not in os.environ  # put back: the next engine is sized for its own run


_ONE_WORKER = """
import gc, sys
from pathlib import Path
from klsweep import job, tasks
from test_vllm import length_reward
tasks.reward_function = lambda task: length_reward
for run in sys.argv[1:]:  # vLLM and TRL first imported by the first run, as in a worker
    status = job.train_run(Path(run))
    gc.collect()
    alive = sum(type(o).__name__ == "KLGRPOTrainer" for o in gc.get_objects())
    print("run", Path(run).name, status["state"], len(status["warnings"]), alive, gc.get_freeze_count())
"""


def test_a_warm_worker_releases_each_colocate_runs_trainer_and_engine(tmp_path: Path, stand_in: Path) -> None:
    """A local worker trains run after run in one process: a colocate run's trainer and vLLM engine are gone
    when the run ends, the first one in the process included (vLLM's first import keeps an exception whose
    traceback held the frames building it: that run's model, reference and optimiser stayed alive; and the
    heap vLLM froze as its engine started was never collected), so the next run's engine starts on a free
    device. A fresh process: what vLLM's first import keeps is the point."""
    import subprocess
    import sys

    import vllm  # noqa: F401  (CI: fails here, not skipped, where vLLM is missing)

    runs = []
    for name in ("first", "second"):
        run = tmp_path / name
        values = {"train.use_vllm": True, "train.steps": 2, "train.max_completion_length": 12}
        write_config(run, stand_in, **values, **{"train.max_prompt_length": 128})
        runs.append(str(run))
    here = str(Path(__file__).parent)
    path = os.pathsep.join([here, str(Path(here).parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", _ONE_WORKER, *runs], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line.split() for line in done.stdout.splitlines() if line.startswith("run ")]
    # each run done without a warning, then no trainer alive and nothing left frozen
    assert said == [["run", "first", "done", "0", "0", "0"], ["run", "second", "done", "0", "0", "0"]], said


def test_two_colocate_runs_started_at_the_same_instant_take_ports_of_their_own(
    tmp_path: Path, stand_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#44: two one-process training jobs with TRL's colocate vLLM (submitit's local jobs, klsweep's TrainJob)
    reach TRL's choice of a rendezvous port at the same instant (each waits there for the other). TRL alone
    took the first of four fixed ports found free, the same in both, and the second engine could not bind it;
    each now holds a port of its own (``engines.own_rendezvous_port``) and both train."""
    import submitit
    import vllm  # noqa: F401  (CI: fails here, not skipped, where vLLM is missing)

    from klsweep.submit.jobs import TrainJob

    runs = [tmp_path / f"run{i}" for i in range(2)]
    for run in runs:
        values = {
            "train.use_vllm": True,
            "train.steps": 1,
            "train.save_steps": 1,
            "train.max_prompt_length": 128,
        }
        write_config(run, stand_in, **values)
    gate = tmp_path / "gate"
    gate.mkdir()
    for key in (
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
    ):  # jobs as a node starts them
        monkeypatch.delenv(key, raising=False)

    def train_at_once(run_dir: Path) -> dict:  # pickled by value into each job
        import os
        import time

        from trl.generation import vllm_generation

        from klsweep import job

        choose = vllm_generation.ensure_master_addr_port

        def at_once() -> None:  # the other job is here too: both choose now
            (gate / run_dir.name).touch()
            until = time.time() + 600  # the other job failed on its way: this one goes on alone
            while len(list(gate.iterdir())) < 2 and time.time() < until:
                time.sleep(0.01)
            choose()
            (run_dir.parent / f"{run_dir.name}.port").write_text(os.environ["MASTER_PORT"])

        vllm_generation.ensure_master_addr_port = at_once
        return job.train_run(run_dir)

    executor = submitit.LocalExecutor(folder=tmp_path / "submitit")
    executor.update_parameters(timeout_min=15)
    jobs = [executor.submit(TrainJob(str(run), fn=train_at_once)) for run in runs]
    for j in jobs:
        j.wait()
    states = [store.read_status(run) for run in runs]
    assert [s["state"] for s in states] == ["done", "done"], [s.get("reason") for s in states]
    ports = {(tmp_path / f"{run.name}.port").read_text() for run in runs}
    assert len(ports) == 2, ports


@pytest.mark.parametrize(
    "rope",
    [
        None,
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 32},
    ],
    ids=["plain", "linear", "dynamic", "yarn", "llama3"],
)  # fmt: skip
def test_plan_refuses_the_contexts_vllm_refuses(tmp_path: Path, stand_in: Path, rope: dict | None) -> None:
    """#44: the longest context ``klsweep plan`` lets through for a model (``planner.context_length``) is the
    longest vLLM's own ModelConfig accepts for it: one token more, vLLM refuses (a pydantic ValidationError in
    the job before), and so does plan."""
    import shutil

    from pydantic import ValidationError
    from vllm.config import ModelConfig

    from klsweep import planner

    model = tmp_path / "model"
    shutil.copytree(stand_in, model)
    config = json.loads((model / "config.json").read_text())
    if rope is not None:
        (model / "config.json").write_text(json.dumps({**config, "rope_scaling": rope}))
    longest, _ = planner.context_length({"path": str(model)})
    ModelConfig(model=str(model), max_model_len=longest)
    with pytest.raises(ValidationError, match=f"max_model_len \\({longest + 1}\\) is greater"):
        ModelConfig(model=str(model), max_model_len=longest + 1)
