"""``job.train_run`` end to end on an untrained tiny model: the run folder's files, resume after a kill,
divergence (non-finite, reward collapse), failure, and the ``klsweep train`` command."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import pytest
from clitools import two_ranks
from runfiles import kill_after_step_3, write_config  # tests/ is on sys.path under pytest

from klsweep import config as config_mod
from klsweep import environment, job, store, tracking, trainer_factory
from klsweep.monitor import ROW_KEYS, RunMonitor


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from klsweep.tinymodel import random_tiny_model

    return random_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def length_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """Signal for an untrained model (the tiny task's reward is 0 everywhere)."""
    return [float(len(c[0]["content"]) % 3) for c in completions]


def test_train_run_writes_the_contract_files(tmp_path, model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from klsweep import tasks

    monkeypatch.setattr(tasks, "reward_function", lambda task: length_reward)
    run = tmp_path / "run"
    write_config(run, model_dir, **{"wandb.mode": "offline", "kl.placement": "both"})
    status = job.train_run(run)

    assert status["state"] == "done", status.get("error")
    assert status == store.read_status(run)
    assert status["step"] == status["total_steps"] == 3
    assert status["finished_at"] >= status["started_at"] and status["elapsed_s"] > 0
    # the run's own time (its training loop) and the start-up before it (the trainer built, W&B opened) apart,
    # together the attempt's time (a run's elapsed counted its worker's start-up: k1 0.7 min, k3 0.2 min)
    assert status["startup_s"] > 0 and status["trained_from"] > status["attempt_started_at"]
    took = status["finished_at"] - status["attempt_started_at"]
    assert status["elapsed_s"] + status["startup_s"] == pytest.approx(took, abs=0.5)
    assert status["elapsed_s"] < took - status["startup_s"] + 0.5
    rows = store.read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        for key in ("step", "time", "elapsed_s", *ROW_KEYS):
            assert key in row, key
        for key in (
            "reward_mean",
            "kl_k1",
            "kl_k3",
            "kl_forward",
            "kl_penalty",
            "entropy",
            "loss",
            "grad_norm",
        ):
            assert isinstance(row[key], float), key
    assert rows[-1]["kl_k3"] > 0 and rows[-1]["kl_forward"] > 0
    assert [c.name for c in store.checkpoints(run)] == ["checkpoint-2", "checkpoint-3"]
    last = store.checkpoints(run)[-1]
    assert status["final_checkpoint"] == "checkpoint-3"
    assert store.read_json(last / store.FINAL_MARKER) == {"state": "done", "step": 3, "reason": None}
    assert not (store.checkpoints(run)[0] / store.FINAL_MARKER).exists()
    assert {r["prompts_too_long"] for r in rows} == {0.0}  # the tiny task's prompts all fit 512 tokens
    for name in ("config.json", "model.safetensors", "tokenizer.json", "trainer_state.json", "optimizer.pt"):
        assert (last / name).is_file(), name
    AutoModelForCausalLM.from_pretrained(last)
    AutoTokenizer.from_pretrained(last)
    assert any((run / "wandb").rglob("*.wandb"))
    env = store.read_json(run / store.ENV_FILE)  # the environment it trained in
    assert set(env) == set(environment.KEYS) and env["torch threads"] == 1 and env["numpy"]
    assert job.train_run(run) == status  # a done run is left as it is


def test_run_config_reward_mode_default_and_folders_written_before_it(tmp_path, model_dir):
    from omegaconf import OmegaConf

    config = write_config(tmp_path / "new", model_dir)
    assert config["kl"]["reward_mode"] == "separate"
    assert config_mod.load_run(tmp_path / "new").kl.reward_mode == "separate"
    del config["kl"]["reward_mode"]  # a run folder written before the key existed trained shaped
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / store.CONFIG_FILE).write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    assert config_mod.load_run(tmp_path / "old").kl.reward_mode == "shaped"


def test_a_folder_written_before_reward_logp_is_the_same_run_only_where_its_id_is(tmp_path, model_dir):
    """Such a folder trained with the behaviour's log-probs: off-policy it is the run of reward_logp behavior,
    not of current (the default, another id); on-policy, where the two are the same computation, of both."""
    from omegaconf import OmegaConf

    from klsweep.errors import UserError

    config = write_config(tmp_path / "new", model_dir, **{"kl.placement": "reward", "kl.beta": 0.1})
    assert config["kl"]["reward_logp"] == "current" and config["kl"]["importance_cap"] == 0.0
    for lag, same in ((0, {"current", "behavior"}), (4, {"behavior"})):
        new = {**config, "offpolicy": {**config["offpolicy"], "lag": lag}}
        kl_before = {k: v for k, v in config["kl"].items() if k not in ("reward_logp", "importance_cap")}
        folder = tmp_path / f"old-{lag}"
        folder.mkdir()
        (folder / store.CONFIG_FILE).write_text(OmegaConf.to_yaml(OmegaConf.create({**new, "kl": kl_before})))
        assert config_mod.load_run(folder).kl.reward_logp == "behavior"
        for logp in ("current", "behavior"):
            run = {**new, "kl": {**new["kl"], "reward_logp": logp}}
            if logp in same:
                config_mod.write_run(folder, run)  # the same run: its folder is left as it is
            else:
                with pytest.raises(UserError, match="different config"):
                    config_mod.write_run(folder, run)


def test_a_folder_written_before_train_trl_is_the_same_run(tmp_path, model_dir):
    from omegaconf import OmegaConf

    config = write_config(tmp_path / "new", model_dir)
    assert config["train"]["trl"] == {}
    old = {**config, "train": {k: v for k, v in config["train"].items() if k != "trl"}}
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / store.CONFIG_FILE).write_text(OmegaConf.to_yaml(OmegaConf.create(old)))
    assert config_mod.load_run(tmp_path / "old").train.trl == {}
    config_mod.write_run(tmp_path / "old", config)  # not "a different config": its checkpoints are this run's


def test_train_run_dir_takes_a_change_the_run_id_does_not_see_as_klsweep_run_does(tmp_path, model_dir):
    """`klsweep train --run-dir` on a folder whose config differs only in keys the run id does not see (how
    the run is computed: train.use_vllm, micro_batch_size, keep_checkpoints; wandb): refused as "a different
    config" before. Now the same run, as `klsweep run` finds it: config.yaml rewritten with the new values and
    the run trained from there. A key the id sees is still refused, named, and the folder left as it was."""
    from typer.testing import CliRunner

    from klsweep import grid
    from klsweep.cli import app
    from klsweep.errors import UserError

    run = tmp_path / "run"
    before = write_config(run, model_dir, **{"train.keep_checkpoints": 2})
    neutral = ["train.micro_batch_size=4", "train.keep_checkpoints=1", "wandb.mode=offline"]
    result = CliRunner().invoke(app, ["train", str(run / store.CONFIG_FILE), *neutral, "--run-dir", str(run)])
    assert result.exit_code == 0, (result.output, result.exception)
    after = config_mod.read_run_file(run)
    assert (after["train"]["micro_batch_size"], after["train"]["keep_checkpoints"]) == (4, 1)
    assert after["wandb"]["mode"] == "offline"
    assert grid.run_id(after) == grid.run_id(before)  # what makes it the same run
    assert store.read_status(run)["state"] == "done"
    assert [c.name for c in store.checkpoints(run)] == ["checkpoint-3"]  # keep_checkpoints=1 applied

    text = (run / store.CONFIG_FILE).read_text()
    changed = {**after, "kl": {**after["kl"], "beta": 0.3}, "train": {**after["train"], "use_vllm": True}}
    with pytest.raises(UserError, match=r"different config \(kl\.beta differ\)"):
        config_mod.write_run(run, changed)
    assert (run / store.CONFIG_FILE).read_text() == text


def test_resume_after_kill(tmp_path, model_dir):
    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.steps": 6, "offpolicy.lag": 1})
    kill_after_step_3(run, {**os.environ, "PYTHONWARNINGS": "ignore"}, timeout_s=120)
    assert store.read_status(run)["state"] == "running"
    assert [c.name for c in store.checkpoints(run)] == ["checkpoint-2"]
    assert (store.checkpoints(run)[0] / "klsweep_buffers_rank0.pt").is_file()
    assert max(r["step"] for r in store.read_metrics(run)) >= 3

    status = job.train_run(run)
    assert status["state"] == "done", status.get("error")
    assert status["step"] == 6
    steps = [r["step"] for r in store.read_metrics(run)]
    assert steps == [1, 2, 3, 4, 5, 6]  # strictly increasing, none twice
    # the lag buffer came back with the checkpoint: no second pipeline fill after the resume
    assert [r["policy_lag"] for r in store.read_metrics(run)] == [0, 1, 1, 1, 1, 1]
    assert [c.name for c in store.checkpoints(run)] == ["checkpoint-4", "checkpoint-6"]  # the last 2 kept


def test_a_checkpoint_without_trainer_state_is_not_resumed(tmp_path, model_dir):
    """A save cut short (the trainer state is written last) is skipped: the run resumes from the one before."""
    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.steps": 4, "offpolicy.lag": 1})
    assert job.train_run(run)["state"] == "done"
    (run / "checkpoints" / "checkpoint-4" / store.TRAINER_STATE).unlink()
    store.write_status(run, "running")
    status = job.train_run(run)
    assert status["state"] == "done", status.get("error")
    assert [r["step"] for r in store.read_metrics(run)] == [1, 2, 3, 4]  # steps 3-4 retrained, none twice
    assert (run / "checkpoints" / "checkpoint-4" / store.TRAINER_STATE).is_file()


def test_non_finite_weights_diverge(tmp_path, model_dir, monkeypatch):
    from klsweep import tasks

    monkeypatch.setattr(tasks, "reward_function", lambda task: length_reward)
    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.steps": 5, "train.learning_rate": 1e30})
    status = job.train_run(run)
    assert status["state"] == "diverged", status
    assert status["diverged_step"] == 2
    assert "non-finite" in status["reason"]
    assert status["error"] is None
    final = run / "checkpoints" / status["final_checkpoint"]  # the state it ended in is saved and marked
    assert store.read_json(final / store.FINAL_MARKER)["state"] == "diverged"
    assert store.checkpoints(run)[-1] == final


def test_reward_collapse_diverges(tmp_path, model_dir, monkeypatch):
    """The run stops at the collapse, saves the state it ended in, marked diverged, and eval scores that one."""
    from dataclasses import replace

    from klsweep import evaluate, tasks

    def falling_reward(prompts, completions, answer, trainer_state, **kwargs):
        return [1.0 if trainer_state.global_step < 2 else 0.0] * len(completions)

    monkeypatch.setattr(tasks, "reward_function", lambda task: falling_reward)
    run = tmp_path / "run"
    values = {"train.steps": 8, "train.collapse_window": 2, "train.collapse_fraction": 0.5}
    write_config(run, model_dir, **values)
    status = job.train_run(run)
    assert status["state"] == "diverged", status
    assert status["diverged_step"] == 4  # windowed means 1, 1, 0.5, 0
    assert "collapse" in status["reason"]
    assert [r["step"] for r in store.read_metrics(run)] == [1, 2, 3, 4]
    # the state at the diverged step is saved and marked: eval scores what the run ended as
    assert [c.name for c in store.checkpoints(run)] == ["checkpoint-2", "checkpoint-4"]
    assert status["final_checkpoint"] == "checkpoint-4"
    marker = store.read_json(run / "checkpoints" / "checkpoint-4" / store.FINAL_MARKER)
    assert marker == {"state": "diverged", "step": 4, "reason": status["reason"]}
    assert (run / "checkpoints" / "checkpoint-4" / store.TRAINER_STATE).is_file()
    (results,) = evaluate.eval_run(run, replace(evaluate.load_suite("tiny"), limit=2))
    assert results.parent.name == "checkpoint-4"
    scored = store.read_json(results)
    assert (scored["checkpoint"], scored["step"], scored["final_state"]) == ("checkpoint-4", 4, "diverged")


def test_reward_collapse_rule():
    from klsweep.collapse import REASON, Rule, find_collapse

    def collapse(rewards, window, stds=0.0):
        n = len(rewards)
        found = find_collapse(range(1, n + 1), rewards, [stds] * n, Rule(window, 0.5, 5.5, 16))
        return found and found.step

    assert collapse([1.0, 1.0, 0.4], window=1) == 3
    assert collapse([1.0, 1.0, 0.6], window=1) is None
    assert collapse([0.0, 0.0, 0.0], window=1) is None  # no peak to fall from
    # a window with a missing reward is partial, never judged (issue 49): the windows of steps 1-2 and 4-5 are
    assert collapse([1.0, 1.0, None, 0.0, 0.0], window=2) == 5
    assert collapse([1.0, None, math.nan, 0.0, 0.0], window=2) is None  # no full window before the fall
    assert collapse([1.0], window=2) is None
    assert collapse([0.19, 0.0, 0.0], window=10) is None  # inside the first window: never judged
    assert collapse([0.19] * 10 + [0.0] * 6, window=10) == 16  # steps 7-16: 0.076 < 0.5 x 0.19
    assert collapse([0.19] * 10 + [0.0] * 6, window=10, stds=0.4) is None  # 16 completions: within the noise
    found = find_collapse(range(1, 4), [1.0, 1.0, 0.4], [0.0] * 3, Rule(1, 0.5, 5.5, 16))
    assert found.reason.startswith(REASON) and "0.5 x peak 1" in found.reason


def test_nan_loss_stops_the_run(tmp_path, model_dir):
    from transformers import TrainerControl, TrainerState

    from klsweep.config import RunConfig

    monitor = RunMonitor(tmp_path, RunConfig(), [], 0.0, time.time(), is_main=True)
    state, control = TrainerState(), TrainerControl()
    state.global_step = 1
    monitor.on_log(state, control, {"loss": 0.5, "grad_norm": 1.0, "task_reward/mean": 0.5})
    assert monitor.diverged is None and not control.should_training_stop
    state.global_step = 2
    monitor.on_log(state, control, {"loss": math.nan, "grad_norm": 1.0, "task_reward/mean": 0.5})
    assert monitor.diverged == (2, "non-finite loss (nan)")
    assert control.should_training_stop and control.should_save  # its final state is saved
    rows = store.read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["loss"] is None


def test_the_monitor_stops_a_run_where_the_rule_finds_the_collapse_on_the_whole_run(tmp_path):
    """The monitor judges a step at a time (collapse.CollapseScan) what the report judges on the whole run
    (find_collapse): the run stops at that step and no earlier, the rows of an earlier attempt included."""
    from transformers import TrainerControl, TrainerState

    from klsweep.collapse import Rule, find_collapse
    from klsweep.config import RunConfig

    config = RunConfig()
    rule = Rule.of(config.train)
    # a missing reward early (its windows are partial), a missing spread every other step, then the fall
    rewards = [0.6, 0.5, None] + [0.6, 0.5, 0.55, 0.5] * 6 + [0.3, 0.1] + [0.0] * 20
    stds = ([0.3, None] * len(rewards))[: len(rewards)]
    want = find_collapse(range(1, len(rewards) + 1), rewards, stds, rule)
    assert want is not None and want.step > 12
    kept = [{"step": i + 1, "reward_mean": rewards[i], "reward_std": stds[i]} for i in range(12)]
    monitor = RunMonitor(tmp_path, config, kept, 0.0, time.time(), is_main=True)
    state, control = TrainerState(), TrainerControl()
    for i in range(12, len(rewards)):
        state.global_step = i + 1
        logs = {"loss": 0.1, "grad_norm": 1.0, "task_reward/mean": rewards[i], "task_reward/std": stds[i]}
        monitor.on_log(state, control, logs)
        if control.should_training_stop:
            break
    assert monitor.diverged == (want.step, want.reason)


@pytest.mark.parametrize(("keep", "kept"), [(None, [1, 2, 3, 4]), ("default", [3, 4]), (3, [2, 3, 4])])
def test_keep_checkpoints(tmp_path, model_dir, keep, kept):
    values = {"train.steps": 4, "train.save_steps": 1}
    if keep != "default":
        values["train.keep_checkpoints"] = keep
    run = tmp_path / "run"
    write_config(run, model_dir, **values)
    assert job.train_run(run)["state"] == "done"
    assert [store.checkpoint_step(c) for c in store.checkpoints(run)] == kept


def _weights(checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(checkpoint / "model.safetensors")


def test_gradient_accumulation_gives_the_same_update(tmp_path, model_dir, monkeypatch):
    """One step over 8 completions in micro-batches of 2 (4 accumulated passes) or all at once: the same
    weights after the step, up to float error (and the step did move them)."""
    from klsweep import tasks

    monkeypatch.setattr(tasks, "reward_function", lambda task: length_reward)
    values = {"train.steps": 1, "train.save_steps": 1, "kl.placement": "both", "kl.beta": 0.5}
    after = {}
    for micro in (None, 2):
        run = tmp_path / f"micro-{micro}"
        write_config(run, model_dir, **values, **{"train.micro_batch_size": micro})
        assert job.train_run(run)["state"] == "done"
        after[micro] = _weights(store.checkpoints(run)[-1])
    before = _weights(model_dir)
    moved = max((after[None][k] - before[k]).abs().max().item() for k in before)
    assert moved > 1e-4
    for key, value in after[None].items():
        assert (value - after[2][key]).abs().max().item() < 1e-5, key


def test_learning_rate_schedule_and_warmup(tmp_path, model_dir):
    def rates(**values) -> list[float]:
        run = tmp_path / str(len(list(tmp_path.iterdir())))
        write_config(run, model_dir, **{"train.steps": 4, "train.save_steps": 4, **values})
        assert job.train_run(run)["state"] == "done"
        return [r["learning_rate"] for r in store.read_metrics(run)]

    assert rates() == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])  # transformers' default: linear decay to 0
    assert rates(**{"train.lr_scheduler_type": "constant"}) == pytest.approx([1e-3] * 4)
    warm = rates(**{"train.lr_scheduler_type": "constant_with_warmup", "train.warmup_ratio": 0.5})
    assert warm == pytest.approx([0.0, 5e-4, 1e-3, 1e-3])
    # a warm-up that transformers' constant schedule would ignore (it trained at 1e-3 from step 1, issue 41):
    # refused, with the schedule that has one, before anything is trained
    from klsweep.errors import UserError

    run = tmp_path / "ignored"
    write_config(run, model_dir, **{"train.lr_scheduler_type": "constant", "train.warmup_steps": 2})
    with pytest.raises(UserError) as e:
        trainer_factory.build_trainer(config_mod.load_run(run), run)
    (problem,) = e.value.problems
    assert problem.where == "train.warmup_steps" and "constant_with_warmup" in problem.allowed


def test_epsilon_does_nothing_on_policy(tmp_path, model_dir, monkeypatch):
    """train.epsilon's help says so (issue 41: a key another key's default makes inert): on-policy (lag 0,
    one iteration) TRL's importance ratio is 1, nothing is clipped, and two runs that differ only in the clip
    range train the same, step for step (a reward with signal, so the clipped term has an advantage)."""
    from klsweep import tasks

    monkeypatch.setattr(tasks, "reward_function", lambda task: length_reward)

    def metrics(epsilon: float) -> list[dict]:
        run = tmp_path / f"eps-{epsilon}"
        write_config(run, model_dir, **{"train.steps": 3, "train.save_steps": 3, "train.epsilon": epsilon})
        assert job.train_run(run)["state"] == "done"
        keys = ("reward_mean", "loss", "grad_norm", "kl_k3", "clip_ratio")
        return [{k: r.get(k) for k in keys} for r in store.read_metrics(run)]

    narrow, wide = metrics(0.05), metrics(0.5)
    assert narrow == wide and len(narrow) == 3
    assert all(r["clip_ratio"] in (0, None) for r in narrow)


def test_a_base_model_trains_on_plain_text_prompts(tmp_path, model_dir):
    """model.chat_template false: the task's prompts are plain text (no chat template in training, as in
    eval); the tiny reward reads plain-text completions."""
    run = tmp_path / "run"
    write_config(run, model_dir, **{"model.chat_template": False, "train.steps": 1, "train.save_steps": 1})
    assert job.train_run(run)["state"] == "done"
    assert store.read_metrics(run)[0]["reward_mean"] is not None


def test_a_base_model_stops_at_the_tasks_stop_sequence(tmp_path, model_dir):
    """model.chat_template false: training generation (HF generate, TRL's generation_kwargs) stops at the eval's
    stop sequence of the task (tiny: a newline) and each completion is cut right after it: the text after the
    answer is neither scored nor trained. A chat model's completions are not cut."""
    import torch

    from klsweep import tasks

    stops = tasks.TINY_STOP_SEQUENCES
    texts = {}
    for chat in (False, True):
        run = tmp_path / f"chat-{chat}"
        write_config(run, model_dir, **{"model.chat_template": chat, "train.max_completion_length": 48})
        trainer = trainer_factory.build_trainer(config_mod.load_run(run), run)
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        rows = [trainer.train_dataset[i] for i in range(4) for _ in range(4)]
        torch.manual_seed(0)
        out = trainer._generate_and_score_completions(rows)
        texts[chat] = [
            trainer.processing_class.decode(ids[mask.bool()], skip_special_tokens=True)
            for ids, mask in zip(out["completion_ids"], out["completion_mask"], strict=True)
        ]
    assert trainer.args.generation_kwargs is None  # a chat model's generation is TRL's own
    base = texts[False]
    stopped = [t for t in base if any(s in t for s in stops)]
    assert len(stopped) >= 4, base  # the random model writes newlines: the case is exercised
    for text in stopped:  # the stop sequence ends the completion: nothing after it is trained
        assert any(text.endswith(s) for s in stops) and sum(text.count(s) for s in stops) == 1, text
    assert any(t.count("\n") > 1 or not t.endswith("\n") for t in texts[True] if "\n" in t)


def test_prompts_longer_than_max_prompt_length_are_dropped(tmp_path, model_dir):
    """Too long for every prompt: the run fails saying so (the count is a metrics column otherwise)."""
    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.max_prompt_length": 3})
    status = job.train_run(run)
    assert status["state"] == "failed"
    assert "train.max_prompt_length" in status["error"] and "longer than 3 tokens" in status["error"]


def test_reference_is_loaded_not_a_deepcopy_of_the_policy(tmp_path, model_dir, monkeypatch):
    """The reference is loaded from the model's files in the compute dtype (on a GPU, straight onto it), not a
    deepcopy of the policy (a whole host copy per process: ~15 GB per rank at 7B, #34): no model is deep-copied
    while the trainer is built, and the reference has the weights of the policy as loaded, in memory of its
    own."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM, PreTrainedModel

    deep_copied = []
    real = copy.deepcopy

    def watching(obj, *args, **kwargs):
        if isinstance(obj, PreTrainedModel):
            deep_copied.append(type(obj).__name__)
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(copy, "deepcopy", watching)
    run = tmp_path / "run"
    write_config(run, model_dir, **{"model.dtype": "bfloat16", "train.steps": 1})
    trainer = trainer_factory.build_trainer(config_mod.load_run(run), run)
    assert deep_copied == []
    loaded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).state_dict()
    reference = trainer.accelerator.unwrap_model(trainer.ref_model).state_dict()
    assert reference.keys() == loaded.keys()
    assert all(torch.equal(reference[k], loaded[k]) and reference[k].dtype == torch.bfloat16 for k in loaded)
    policy = {p.data_ptr() for p in trainer.model.parameters()}
    assert not policy & {p.data_ptr() for p in trainer.ref_model.parameters()}


def test_bf16_compute_trains_float32_master_weights(tmp_path, model_dir, monkeypatch):
    """``model.dtype: bfloat16``: forward and backward run under bf16 autocast, the policy's weights (and so its
    AdamW update) stay float32, and the frozen reference is held in bf16. At the paper's lr 1e-6 one step moves
    nearly every weight; the same update applied to bf16 weights (the policy's dtype before) rounds away on most
    of them, as bf16's resolution at |w| ~ 1e-2 is ~1e-4."""
    import torch

    from klsweep import tasks

    monkeypatch.setattr(tasks, "reward_function", lambda task: length_reward)
    run = tmp_path / "run"
    write_config(run, model_dir, **{"model.dtype": "bfloat16", "train.learning_rate": 1e-6, "train.steps": 1})
    trainer = trainer_factory.build_trainer(config_mod.load_run(run), run)
    policy = trainer.model
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    assert {p.dtype for p in trainer.ref_model.parameters()} == {torch.bfloat16}
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    computed: set[torch.dtype] = set()
    hook = policy.model.layers[0].mlp.register_forward_hook(lambda m, i, out: computed.add(out.dtype))
    trainer.train()
    hook.remove()
    assert computed == {torch.bfloat16}

    after = dict(policy.named_parameters())
    total = sum(p.numel() for p in before.values())
    moved = sum((after[n].detach() != p).sum().item() for n, p in before.items())
    assert moved / total > 0.9
    in_bf16 = sum(
        ((p.bfloat16() + (after[n].detach() - p).bfloat16()) != p.bfloat16()).sum().item()
        for n, p in before.items()
    )
    assert in_bf16 / total < 0.1


def test_fsdp_shards_each_decoder_layer_on_gpus_and_is_refused_on_a_cpu(tmp_path, model_dir, monkeypatch):
    """``train.sharding: fsdp`` gives accelerate an FSDP2 plugin (transformers' ``fsdp``/``fsdp_config``) that
    shards the policy per decoder layer, with FSDP's activation checkpointing and sharded checkpoints (each rank
    its own shard). accelerate applies an FSDP plugin only to accelerator processes (a CPU run would silently
    train unsharded), so a CPU run is refused unless the tests allow it (tests/integration/test_fsdp.py trains
    it on 2 CPU processes)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    from klsweep import layout
    from klsweep.errors import UserError

    lay = layout.layout("auto", "fsdp", gpu=True)
    assert (lay.compute, lay.policy, lay.reference) == ("bfloat16", "float32", "bfloat16")
    values = layout.training_arguments(lay, gpu=True, world=8)
    assert values["bf16"] and values["fsdp"] and not values["activation_checkpointing"]
    # transformers checks bf16 against the machine: build the arguments as a CPU process would
    args = GRPOConfig(output_dir=str(tmp_path), **{**values, "bf16": False, "use_cpu": True})
    assert not args.activation_checkpointing  # with FSDP's own, the Trainer refuses to start
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward and plugin.activation_checkpointing
    assert "SHARDED_STATE_DICT" in str(plugin.state_dict_type)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    wraps = fsdp2_prepare_auto_wrap_policy(plugin, model)
    units = [m for m in model.modules() if wraps(m)]
    assert len(units) == model.config.num_hidden_layers
    assert {type(m).__name__ for m in units} == set(model._no_split_modules)

    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.sharding": "fsdp"})
    monkeypatch.delenv(layout.TEST_FSDP_ON_CPU, raising=False)
    with pytest.raises(UserError, match="train.sharding: fsdp needs GPUs"):
        trainer_factory.build_trainer(config_mod.load_run(run), run)


def test_failure_is_recorded(tmp_path, model_dir):
    run = tmp_path / "run"
    write_config(run, model_dir, **{"model.path": str(tmp_path / "no-such-model")})
    status = job.train_run(run)
    assert status["state"] == "failed"
    assert "no-such-model" in status["error"]


def test_wandb_mode_and_tags(monkeypatch, tmp_path):
    from klsweep.config import RunConfig

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert tracking.resolve_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x")
    assert tracking.resolve_mode("auto") == "online"
    assert tracking.resolve_mode("disabled") == "disabled"
    tags = tracking.tags(RunConfig())
    assert tags == [
        "estimator=k3",
        "placement=loss",
        "level=token",
        "beta=0",
        "lag=0",
        "seed=0",
        "model=tiny",
    ]


def test_train_command(tmp_path, model_dir, monkeypatch):
    from typer.testing import CliRunner

    from klsweep.cli import app

    yaml = tmp_path / "run.yaml"
    yaml.write_text(
        f"name: clitest\nmodel:\n  path: {model_dir}\ntrain:\n  steps: 1\n  prompts_per_step: 2\n"
        "  group_size: 4\n  max_completion_length: 4\nwandb:\n  mode: disabled\n"
    )
    result = CliRunner().invoke(app, ["train", str(yaml), "kl.beta=0.1", "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "done" in result.output
    assert store.read_status(tmp_path / "r")["state"] == "done"

    monkeypatch.chdir(tmp_path)  # the default run folder: results/<name>/<run-id>
    bad = CliRunner().invoke(app, ["train", str(yaml), f"model.path={tmp_path}/missing"])
    assert bad.exit_code == 1


@pytest.mark.slow
def test_data_parallel_two_processes(tmp_path, model_dir):
    """WORLD_SIZE=2 on a CPU (gloo): one run, two ranks; rank 0 alone writes the folder's files. With a policy
    lag each rank reads its share of the prompts ahead (the trainer's second dataloader) and keeps its own
    lag buffer."""

    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.steps": 2, "kl.placement": "both", "offpolicy.lag": 1})
    code = "import sys, json; from klsweep import job; print(json.dumps(job.train_run(sys.argv[1])['state']))"
    procs = two_ranks([sys.executable, "-c", code, str(run)])
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(out.strip().endswith('"done"') for out in outputs), outputs
    assert store.read_status(run)["state"] == "done"
    rows = store.read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["policy_lag"] for r in rows] == [0, 1]
    for rank in (0, 1):  # each rank's lag buffer is its own
        assert (store.checkpoints(run)[-1] / f"klsweep_buffers_rank{rank}.pt").is_file()


def test_train_trl_options_reach_the_trainers_grpo_config(tmp_path, model_dir):
    """`klsweep train` with TRL options passed through: the trainer's GRPOConfig (saved in each checkpoint)
    holds them beside klsweep's own; config.yaml records them."""
    import torch
    from typer.testing import CliRunner

    from klsweep.cli import app
    from klsweep.errors import UserError

    yaml = tmp_path / "run.yaml"
    yaml.write_text(
        f"name: trltest\nmodel:\n  path: {model_dir}\ntrain:\n  steps: 1\n  save_steps: 1\n  prompts_per_step: 2\n"
        "  group_size: 4\n  max_completion_length: 4\n  trl: {weight_decay: 0.25}\nwandb:\n  mode: disabled\n"
    )
    run = tmp_path / "r"
    overrides = ["+train.trl.top_k=3", "train.trl.repetition_penalty=1.5", "kl.beta=0.1"]
    result = CliRunner().invoke(app, ["train", str(yaml), *overrides, "--run-dir", str(run)])
    assert result.exit_code == 0, result.output
    assert store.read_status(run)["state"] == "done"
    args = torch.load(run / "checkpoints" / "checkpoint-1" / "training_args.bin", weights_only=False)
    assert (args.top_k, args.repetition_penalty, args.weight_decay) == (3, 1.5, 0.25)
    assert (args.num_generations, args.temperature, args.beta) == (4, 1.0, 0.0)  # klsweep's own
    assert config_mod.load_run(run).train.trl == {"weight_decay": 0.25, "top_k": 3, "repetition_penalty": 1.5}
    trainer = trainer_factory.build_trainer(config_mod.load_run(run), run)
    assert (trainer.generation_config.top_k, trainer.generation_config.repetition_penalty) == (3, 1.5)

    bad = CliRunner().invoke(
        app, ["train", str(yaml), "train.trl.temperature=0.5", "--run-dir", str(tmp_path / "b")]
    )
    assert isinstance(bad.exception, UserError)  # exit 2 in the console script (klsweep.cli.main)
    assert "'temperature' is set by klsweep from train.temperature (allowed: use train.temperature)" in str(
        bad.exception
    )
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "mode, correction, trl_mode",
    [
        ("token_truncate", True, "token_truncate"),
        ("off", False, None),
        (None, True, "sequence_mask"),  # klsweep's default: TRL 1.16's
    ],
)
def test_vllm_importance_sampling_reaches_the_trainers_grpo_config(
    tmp_path, model_dir, mode, correction, trl_mode
):
    """train.vllm_importance_sampling sets TRL's correction and mode (what KLGRPOTrainer reads to weigh its KL
    terms); TRL's own names for it are refused in train.trl; an unknown mode exits 2 naming the allowed ones."""
    from klsweep import grid
    from klsweep.errors import UserError

    run = tmp_path / "run"
    values = {} if mode is None else {"train.vllm_importance_sampling": mode}
    config = write_config(run, model_dir, **values)
    trainer = trainer_factory.build_trainer(config_mod.load_run(run), run)
    assert trainer.vllm_importance_sampling_correction is correction
    if trl_mode is not None:
        assert trainer.args.vllm_importance_sampling_mode == trl_mode
    assert (grid.run_id(config) == grid.run_id(write_config(tmp_path / "d", model_dir))) is (mode is None)

    refused = tmp_path / "refused"
    write_config(refused, model_dir, **{"train.trl": {"vllm_importance_sampling_mode": "token_mask"}})
    with pytest.raises(UserError, match="set by klsweep from train.vllm_importance_sampling"):
        trainer_factory.build_trainer(config_mod.load_run(refused), refused)


def test_a_run_stopped_right_after_its_last_save_ends_there(model_dir, tmp_path):
    """A job stopped right after it saved the last step (a preemption or a kill before its final status): the
    next start finds the run trained to ``train.steps`` and ends it there, done, without training. It used
    to resume, and transformers' loop trains a step before it checks: step 4 of a 3-step run, its own
    checkpoint-4 (seen in CI as a Slurm FSDP run ending at step 9 of 8)."""
    run = tmp_path / "run"
    write_config(run, model_dir, **{"train.steps": 3, "train.save_steps": 3})
    first = job.train_run(run)
    assert first["state"] == "done" and first["final_checkpoint"] == "checkpoint-3"
    rows = store.read_metrics(run)
    # as a preemption's save leaves it: the checkpoint without the final marker, the run still running
    (last,) = store.checkpoints(run)
    (last / store.FINAL_MARKER).unlink()
    store.write_status(run, "running", step=3)
    again = job.train_run(run)
    assert again["state"] == "done" and again["step"] == 3 and again["final_checkpoint"] == "checkpoint-3"
    assert [c.name for c in store.checkpoints(run)] == ["checkpoint-3"]
    assert store.read_metrics(run) == rows  # nothing trained, nothing rewritten
    assert store.read_json(last / store.FINAL_MARKER) == {"state": "done", "step": 3, "reason": None}
    assert store.final_checkpoint(run) == "checkpoint-3"
