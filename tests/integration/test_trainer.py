"""KLGRPOTrainer against real TRL on an untrained tiny model: every placement and level trains and logs the KL
metrics; k3/loss/token equals TRL's built-in KL (loss and gradients); the KL part of the gradient equals the
gradient of ``kl.surrogate`` for each placement and reward mode; shaped mode is the pre-change trainer bit for
bit; klsweep.grpo's advantages are TRL's and its policy-loss surrogate has TRL's gradient for every loss type
(what the GRPO audit relies on); lag and num_iterations; on-policy is plain TRL."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from pre_grpo import old_group_advantages  # tests/ is on sys.path under pytest

from klsweep import grpo
from klsweep import kl as klmath
from klsweep.kl import KLConfig

BATCH = 8  # completions per step: 2 prompts x 4
GROUP = 4
LENGTH = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from klsweep.tinymodel import random_tiny_model

    return random_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def dataset():
    from datasets import Dataset

    questions = [f"{a}+{b}=" for a in range(8) for b in range(5)]
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": q}] for q in questions],
            "answer": [str(eval(q[:-1])) for q in questions],
        }
    )


def length_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """A reward with spread in every group: the completion's length modulo 3."""
    return [float(len(c[0]["content"]) % 3) for c in completions]


def make_config(out: Path, **overrides):
    from trl import GRPOConfig

    settings = dict(
        output_dir=str(out),
        per_device_train_batch_size=BATCH,
        num_generations=GROUP,
        max_completion_length=LENGTH,
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        bf16=False,
        use_cpu=True,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    settings.update(overrides)
    return GRPOConfig(**settings)


def make_trainer(
    model_dir,
    dataset,
    out,
    kl: KLConfig | None,
    lag: int = 0,
    generation: str = "fast",
    stop=(),
    numerics: str = "exact",
    **overrides,
):
    """KLGRPOTrainer (``kl`` given; generating with ``klsweep.fastgen`` unless ``generation="hf"``, so that every
    comparison with plain TRL below is fed by both engines; TRL's numerics unless ``numerics="fast"``) or plain
    TRL GRPOTrainer (``kl`` None; then pass ``beta``; HF generate)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from klsweep.trainer import KLGRPOTrainer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    args = make_config(out, **overrides)
    common = dict(reward_funcs=length_reward, args=args, train_dataset=dataset, processing_class=tokenizer)
    if kl is None:
        return GRPOTrainer(model, **common)
    return KLGRPOTrainer(
        model, kl=kl, lag=lag, generation=generation, stop_sequences=stop, numerics=numerics, **common
    )


def generate(trainer, dataset, seed: int = 0) -> dict:
    """One generated, scored batch of two prompts x GROUP completions (train mode, on-policy)."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop, which these tests bypass
    rows = [dataset[0]] * GROUP + [dataset[1]] * GROUP
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions(rows)


def loss_and_grads(trainer, inputs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grads = [p.grad.detach().clone() for p in trainer.model.parameters() if p.requires_grad]
    trainer.model.zero_grad()
    return loss.detach(), grads


def independent_logps(model, inputs) -> torch.Tensor:
    """Per-token log-probs of the completions by a plain forward (no fused head), with gradients."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
    T = inputs["completion_ids"].size(1)
    logp = torch.log_softmax(logits[:, -T:].float(), dim=-1)
    return logp.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)


def behaviour_logps(trainer, inputs) -> torch.Tensor:
    """The policy's no-grad per-token log-probs of the batch, the forward ``_rollout`` runs at generation."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        return trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attention, inputs["completion_ids"].size(1), batch_size=BATCH
        )[0]


def stale_batch(model_dir, dataset, out, config: KLConfig) -> tuple:
    """A lag-1 trainer and a batch of its pipeline fill, generated by the policy before it moved on (a random
    step): an off-policy batch (its prompts the trainer's first, read from its dataloader)."""
    trainer = make_trainer(model_dir, dataset, out, config, lag=1, loss_type="dapo")
    inputs = generate(trainer, dataset)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return trainer, inputs


def perturb_alike(a, b, scale: float = 0.05) -> None:
    """Moves two copies of the policy away from the reference by the same noise, so that the KL is not zero."""
    with torch.no_grad():
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            noise = scale * torch.randn_like(p)
            p.add_(noise)
            q.add_(noise)


def assert_grads_close(actual, expected, rtol=1e-5, atol=1e-7):
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------------------------ training


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("placement", ["reward", "loss", "both"])
def test_each_placement_and_level_trains_and_logs(model_dir, dataset, tmp_path, placement, level):
    estimator = "k1" if level == "sequence" else "k3"
    trainer = make_trainer(
        model_dir, dataset, tmp_path, KLConfig(estimator, placement, level, beta=0.1), max_steps=2
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    logs = [row for row in trainer.state.log_history if "loss" in row]
    assert len(logs) == 2
    for row in logs:
        for key in ("kl/k1", "kl/k3", "kl/forward", "kl/penalty", "task_reward/mean", "task_reward/std"):
            assert isinstance(row[key], float), key
        assert row["kl/k3"] >= 0 and row["kl/forward"] >= 0
    assert logs[0]["kl/k1"] == pytest.approx(0.0, abs=1e-5)  # step 0: the policy is the reference
    assert logs[0]["kl/forward"] == pytest.approx(0.0, abs=1e-5)
    assert logs[1]["kl/k3"] > 0 and logs[1]["kl/forward"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


def test_rejects_trl_beta(model_dir, dataset, tmp_path):
    with pytest.raises(ValueError, match="beta"):
        make_trainer(model_dir, dataset, tmp_path, KLConfig("k3", "loss", beta=0.1), beta=0.1)


def test_on_policy_is_plain_trl(model_dir, dataset, tmp_path):
    """lag 0, num_iterations 1, beta 0 (KL in the reward: advantages recomputed): the same updates as TRL."""
    plain = make_trainer(model_dir, dataset, tmp_path / "plain", None, beta=0.0)
    ours = make_trainer(model_dir, dataset, tmp_path / "ours", KLConfig("k1", "reward", beta=0.0))
    for trainer in (plain, ours):
        torch.manual_seed(0)
        trainer.train()
    for a, b in zip(plain.model.parameters(), ours.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    losses = [[row["loss"] for row in t.state.log_history if "loss" in row] for t in (plain, ours)]
    assert losses[0] == losses[1]


@pytest.mark.parametrize("stop", [(), (*"0123456789+=aeiou", "<|im_end|>")])
def test_fast_generation_feeds_the_same_batch_as_hf_generate(model_dir, dataset, tmp_path, stop):
    """klsweep.fastgen in place of HF generate: the same completions (cut at the same stop sequences), the same
    masks, rewards and reference log-probs, for every trainer setting TRL passes (temperature, top-p/k, min-p,
    repetition penalty)."""
    warp = dict(temperature=1.3, top_p=0.9, top_k=20, min_p=0.02, repetition_penalty=1.2)
    batches = []
    for generation in ("hf", "fast"):
        trainer = make_trainer(
            model_dir, dataset, tmp_path / generation, KLConfig("k3", "loss", beta=0.1), generation=generation,
            stop=stop, **warp
        )  # fmt: skip
        batches.append(generate(trainer, dataset, seed=3))
    hf, fast = batches
    for key in ("prompt_ids", "completion_ids", "completion_mask", "task_reward", "ref_per_token_logps"):
        assert torch.equal(hf[key], fast[key]), key
    if stop:  # the stop sequences cut some completions short
        assert (fast["completion_mask"].sum(1) < LENGTH).any()


def test_fast_numerics_keep_every_kl_configurations_loss_and_gradient(model_dir, dataset, tmp_path):
    """``numerics="fast"`` (klsweep.fastpass) against TRL's numerics, both fed the same completions (generated
    by the exact trainer, with its reference log-probs and advantages): the fast pass's reference log-probs
    within float32 rounding of TRL's, and for every estimator in every placement, each level and reward mode,
    the loss and every parameter's gradient within 1e-4 of the largest (each trainer's own training forward:
    the reward half's baseline too, in separate mode), and the logged reward penalty."""
    config = KLConfig("k3", "both", beta=0.5)
    plain = dict(activation_checkpointing=False)  # as klsweep's runs on CPUs (klsweep.layout)
    exact = make_trainer(model_dir, dataset, tmp_path / "exact", config, **plain)
    fast = make_trainer(model_dir, dataset, tmp_path / "fast", config, numerics="fast", **plain)
    assert exact.lean_why_not == "train.numerics is exact" and fast.lean_why_not is None
    perturb_alike(exact.model, fast.model)
    inputs = generate(exact, dataset)
    fast.model.train()  # as generate leaves the exact one
    fast.current_gradient_accumulation_steps = 1
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        ref = fast._get_per_token_logps_and_entropies(fast.ref_model, ids, attention, LENGTH)[0]
    torch.testing.assert_close(ref, inputs["ref_per_token_logps"], rtol=0, atol=2e-5)
    # every estimator in every placement (token level, separate mode), and k3 at sequence level and in shaped
    # mode in each placement they change
    configs = [(e, p, "token", "separate") for p in ("loss", "reward", "both") for e in ("k1", "k2", "k3")]
    configs += [("k3", p, "sequence", "separate") for p in ("loss", "reward", "both")]
    configs += [("k3", p, "token", "shaped") for p in ("reward", "both")]
    for estimator, placement, level, mode in configs:
        config = KLConfig(estimator, placement, level, beta=0.5, reward_mode=mode)
        exact.kl = fast.kl = config
        batch = generate(exact, dataset)
        assert torch.equal(batch["completion_ids"], inputs["completion_ids"])
        loss_exact, grads_exact = loss_and_grads(exact, batch)
        loss_fast, grads_fast = loss_and_grads(fast, batch)
        torch.testing.assert_close(loss_fast, loss_exact, rtol=1e-4, atol=1e-6, msg=str(config))
        scale = max(g.abs().max().item() for g in grads_exact)
        assert scale > 1e-4  # a real signal
        assert_grads_close(grads_fast, grads_exact, rtol=0, atol=1e-4 * scale)
        if placement != "loss":
            assert fast._metrics["train"]["kl/reward_penalty"][-1] == pytest.approx(
                exact._metrics["train"]["kl/reward_penalty"][-1], rel=1e-4, abs=1e-6
            )


def test_fast_numerics_train_and_log_every_row(model_dir, dataset, tmp_path):
    """A short run on fast numerics: klsweep.fastpass computes every log-prob (TRL's pass is never called),
    generation shares each prompt's prefill, and the metrics TRL and klsweep log are all there, entropy
    included."""
    from trl import GRPOTrainer

    trainer = make_trainer(
        model_dir, dataset, tmp_path, KLConfig("k3", "both", beta=0.1), numerics="fast", max_steps=2,
        activation_checkpointing=False,
    )  # fmt: skip
    called = []
    original = GRPOTrainer._get_per_token_logps_and_entropies

    def spy(self, *args, **kwargs):
        called.append(1)
        return original(self, *args, **kwargs)

    GRPOTrainer._get_per_token_logps_and_entropies = spy
    try:
        trainer.train()
    finally:
        GRPOTrainer._get_per_token_logps_and_entropies = original
    assert not called
    assert all(g is None or g.share_prompts for g in trainer._fast_generators.values())
    assert trainer._fast_generators
    logs = [row for row in trainer.state.log_history if "loss" in row]
    assert len(logs) == 2
    for row in logs:
        for key in ("entropy", "kl/k1", "kl/k3", "kl/reward_penalty", "task_reward/mean", "grad_norm"):
            assert isinstance(row[key], float) and row[key] == row[key], key


def test_fast_numerics_fall_back_where_they_do_not_apply(model_dir, dataset, tmp_path):
    """With activation checkpointing TRL's pass computes (warned), and generation prefills every row."""
    with pytest.warns(UserWarning, match="activation checkpointing"):
        trainer = make_trainer(
            model_dir, dataset, tmp_path, KLConfig("k3", "loss", beta=0.1), numerics="fast",
            activation_checkpointing=True,
        )  # fmt: skip
    assert trainer.lean_why_not == "activation checkpointing"
    generate(trainer, dataset)
    assert all(not g.share_prompts for g in trainer._fast_generators.values() if g is not None)


def test_training_prompts_are_tokenized_once_all_together(model_dir, dataset, tmp_path):
    """In training, the first tokenization renders every distinct prompt of the training set in one call of
    TRL's: each one's ids are the ones TRL gives it alone, and no prompt of the set is rendered again."""
    from trl import GRPOTrainer

    trainer = make_trainer(model_dir, dataset, tmp_path, KLConfig("k3", "loss", beta=0.1))
    trainer.model.train()
    prompts = [dataset[i]["prompt"] for i in (3, 0, 3)]
    assert trainer._tokenize_prompts(prompts)[0] == GRPOTrainer._tokenize_prompts(trainer, prompts)[0]
    assert len(trainer._prompt_ids) == len(dataset)
    every = [dataset[i]["prompt"] for i in range(len(dataset))]
    expected = [GRPOTrainer._tokenize_prompts(trainer, [p])[0][0] for p in every]
    trainer.processing_class = None  # rendering again would fail
    assert trainer._tokenize_prompts(every)[0] == expected


def test_prompt_ids_kept_are_trls(model_dir, dataset, tmp_path):
    """The prompts' token ids the trainer keeps are the ones TRL's tokenization gives, in the batch's order,
    repeated prompts included; a prompt seen before is not rendered again."""
    from trl import GRPOTrainer

    trainer = make_trainer(model_dir, dataset, tmp_path, KLConfig("k3", "loss", beta=0.1))
    prompts = [dataset[i]["prompt"] for i in (3, 0, 3, 7, 0)]
    expected = GRPOTrainer._tokenize_prompts(trainer, prompts)
    assert trainer._tokenize_prompts(prompts) == expected
    assert len(trainer._prompt_ids) == 3
    trainer.processing_class = None  # rendering again would fail
    assert trainer._tokenize_prompts(prompts[:2]) == (expected[0][:2], None, {})


# ------------------------------------------------------------------------------------------------ exactness


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo"])
def test_k3_loss_token_equals_trl_builtin_kl(model_dir, dataset, tmp_path, loss_type):
    beta = 0.3
    trl = make_trainer(
        model_dir,
        dataset,
        tmp_path / "trl",
        None,
        beta=beta,
        use_bias_correction_kl=False,
        loss_type=loss_type,
    )
    ours = make_trainer(
        model_dir, dataset, tmp_path / "ours", KLConfig("k3", "loss", "token", beta=beta), loss_type=loss_type
    )
    perturb_alike(trl.model, ours.model)
    inputs_trl, inputs_ours = generate(trl, dataset), generate(ours, dataset)
    assert torch.equal(inputs_trl["completion_ids"], inputs_ours["completion_ids"])
    torch.testing.assert_close(inputs_trl["ref_per_token_logps"], inputs_ours["ref_per_token_logps"])
    loss_trl, grads_trl = loss_and_grads(trl, inputs_trl)
    loss_ours, grads_ours = loss_and_grads(ours, inputs_ours)
    torch.testing.assert_close(loss_ours, loss_trl, rtol=1e-6, atol=1e-7)
    # the same loss computed two ways: float32 rounding of the order of 1e-7 x the largest gradient (a flat
    # atol of 1e-8 held on one CPU, not on another, for a gradient element of 1e-4 near a cancellation)
    scale = max(g.abs().max().item() for g in grads_trl)
    assert scale > 1e-4  # a real signal
    assert_grads_close(grads_ours, grads_trl, rtol=1e-5, atol=1e-6 * scale)
    assert ours._metrics["train"]["kl/k3"][-1] > 0


@pytest.mark.parametrize(("reward_mode", "scale_rewards"), [("shaped", "none"), ("separate", "group")])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("placement", ["reward", "loss", "both"])
def test_kl_gradient_is_surrogate_gradient(
    model_dir, dataset, tmp_path, placement, level, reward_mode, scale_rewards
):
    """grad(loss at beta) - grad(loss at beta 0), same batch, equals beta x the gradient of kl.surrogate with
    the trainer's baselines and normalisers. Exact because on-policy (ratio 1, no clipping) the policy loss is
    linear in the advantages, and the KL part of the advantage does not depend on beta's effect on the std:
    - separate (with TRL's default group scaling): the advantage of sequence y changes by
      -beta (KL_hat(y) - the mean of the other KL_hat of its group), a score-function term with a
      leave-one-out baseline, unscaled;
    - shaped, with scale_rewards="none" (no std to rescale it): by -beta (KL_hat(y) - its group's mean).
    The dapo loss divides everything by the number of completion tokens N. A KL in the loss is divided by N at
    token level, by the number of sequences at sequence level."""
    beta = 0.5
    config = KLConfig("k3", placement, level, beta=beta, reward_mode=reward_mode)
    trainer = make_trainer(
        model_dir, dataset, tmp_path, config, scale_rewards=scale_rewards, loss_type="dapo"
    )
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    inputs_beta = generate(trainer, dataset)
    trainer.kl = dataclasses.replace(config, beta=0.0)
    inputs_zero = generate(trainer, dataset)
    assert torch.equal(inputs_beta["completion_ids"], inputs_zero["completion_ids"])
    _, grads_zero = loss_and_grads(trainer, inputs_zero)
    trainer.kl = config
    _, grads_beta = loss_and_grads(trainer, inputs_beta)
    difference = [b - z for b, z in zip(grads_beta, grads_zero, strict=True)]

    # The expected gradient, from an independent forward and kl.surrogate.
    model = trainer.model
    model.zero_grad()
    logp = independent_logps(model, inputs_beta)
    mask = inputs_beta["completion_mask"]
    ref = inputs_beta["ref_per_token_logps"]
    n_tokens = mask.sum()
    objective = torch.zeros(())
    if placement in ("reward", "both"):
        surrogate = klmath.surrogate(logp, ref, mask, dataclasses.replace(config, placement="reward"))
        kl_hat = klmath.estimate(logp, ref, mask, "k3", level).detach().view(-1, GROUP)
        if reward_mode == "shaped":
            baseline = kl_hat.mean(1, keepdim=True).expand(-1, GROUP)
        else:
            baseline = (kl_hat.sum(1, keepdim=True) - kl_hat) / (GROUP - 1)
        objective = objective + (surrogate - baseline.flatten() * (logp * mask).sum(-1)).sum() / n_tokens
    if placement in ("loss", "both"):
        surrogate = klmath.surrogate(logp, ref, mask, dataclasses.replace(config, placement="loss"))
        objective = objective + surrogate.sum() / (n_tokens if level == "token" else surrogate.numel())
    (beta * objective).backward()
    expected = [p.grad.detach().clone() for p in model.parameters() if p.requires_grad]
    scale = max(e.abs().max().item() for e in expected)
    assert scale > 1e-4  # a real signal
    # float32: the difference of two gradients carries rounding of the order of 1e-7 x their size
    assert_grads_close(difference, expected, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("scale_rewards", ["group", "batch"])
def test_shaped_reproduces_the_pre_change_advantages_bit_for_bit(model_dir, dataset, tmp_path, scale_rewards):
    """reward_mode="shaped" is the trainer as it was: the penalised reward normalised by the code that
    KLGRPOTrainer._group_advantages held (tests/pre_grpo.py), to the bit."""
    beta = 0.3
    config = KLConfig("k3", "reward", "sequence", beta=beta, reward_mode="shaped")
    trainer = make_trainer(model_dir, dataset, tmp_path, config, scale_rewards=scale_rewards)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    inputs = generate(trainer, dataset)
    behavior = behaviour_logps(trainer, inputs)
    penalty = klmath.estimate(
        behavior, inputs["ref_per_token_logps"], inputs["completion_mask"], "k3", "sequence"
    )
    want = old_group_advantages(inputs["task_reward"] - beta * penalty, GROUP, scale_rewards)
    assert torch.equal(inputs["advantages"], want)
    assert inputs["advantages"].abs().sum() > 0


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_group_advantages_are_trls_bit_for_bit(model_dir, dataset, tmp_path, scale_rewards):
    """Without a KL in the reward the trainer keeps TRL's advantages; klsweep.grpo computes the same bits, so
    the separate mode's task part and the audit's advantages are TRL's."""
    trainer = make_trainer(
        model_dir, dataset, tmp_path, KLConfig("k1", "loss", beta=0.1), scale_rewards=scale_rewards
    )
    inputs = generate(trainer, dataset)
    assert inputs["task_reward"].unique().numel() > 1
    assert torch.equal(
        inputs["advantages"], grpo.group_advantages(inputs["task_reward"], GROUP, scale_rewards)
    )


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo", "luspo", "cispo", "sapo"])
def test_grpo_policy_loss_has_trls_gradient(model_dir, dataset, tmp_path, loss_type):
    """On-policy, the gradient of TRL's policy loss (the trainer's at beta 0) is the gradient of
    grpo.policy_loss: aggregate(-A log pi) with the trainer's aggregation, for each loss type the GRPO audit
    accepts. (cispo clips the ratio at epsilon_high, TRL's default 0.2 scaling the whole loss by it: a
    constant, as ScaleRL's epsilon_high >= 1 shows.)"""
    extra = {"epsilon_high": 5.0} if loss_type == "cispo" else {}
    trainer = make_trainer(
        model_dir, dataset, tmp_path, KLConfig("k1", "reward", beta=0.0), loss_type=loss_type, **extra
    )
    inputs = generate(trainer, dataset)
    _, grads = loss_and_grads(trainer, inputs)
    model = trainer.model
    model.zero_grad()
    logp = independent_logps(model, inputs)
    mask = inputs["completion_mask"]
    grpo.policy_loss(inputs["advantages"], logp, mask, trainer._aggregation(inputs)).backward()
    expected = [p.grad.detach().clone() for p in model.parameters() if p.requires_grad]
    scale = max(e.abs().max().item() for e in expected)
    assert scale > 1e-4
    assert_grads_close(grads, expected, rtol=1e-4, atol=1e-5 * scale)


# ------------------------------------------------------------------------------------------------ off-policy


@pytest.mark.parametrize(
    ("lag", "num_iterations", "expected"), [(2, 1, [0, 1, 2, 2, 2]), (1, 2, [0, 1, 2, 3, 2])]
)
def test_lag_and_iterations(model_dir, dataset, tmp_path, lag, num_iterations, expected):
    """The batch trained at step t was generated by the policy of step t-k (recorded with each batch)."""
    trainer = make_trainer(
        model_dir,
        dataset,
        tmp_path,
        KLConfig("k1", "reward", beta=0.1),
        lag=lag,
        num_iterations=num_iterations,
        max_steps=len(expected),
    )
    trainer.train()
    logs = [row for row in trainer.state.log_history if "loss" in row]
    assert [row["policy_lag"] for row in logs] == expected
    assert len(trainer._lag_queue) == lag


def record_prompts(trainer) -> tuple[list[list[str]], list[set[tuple[int, ...]]]]:
    """Spies on the trainer: the prompts of every batch it generates from now on, in order (``_rollout``),
    and the prompt token ids of every batch it trains on (``_compute_loss``)."""
    generated: list[list[str]] = []
    trained: list[set[tuple[int, ...]]] = []
    rollout, compute_loss = trainer._rollout, trainer._compute_loss

    def spy_rollout(inputs):
        generated.append([row["prompt"][0]["content"] for row in inputs[::GROUP]])
        return rollout(inputs)

    def spy_loss(model, inputs):
        trained.append({tuple(ids) for ids in inputs["prompt_ids"].tolist()})
        return compute_loss(model, inputs)

    trainer._rollout, trainer._compute_loss = spy_rollout, spy_loss
    return generated, trained


def test_lag_fill_reads_fresh_prompts_in_data_order(model_dir, dataset, tmp_path):
    """At lag k every fill batch holds new prompts: the generations read the data in the order an on-policy
    run reads it, k rounds ahead, so the batch trained at step t holds the on-policy run's step-t prompts; a
    resume from a checkpoint reads on from where the saved run was."""
    config = KLConfig("k1", "reward", beta=0.1)
    lag, steps = 2, 5
    on_policy = make_trainer(model_dir, dataset, tmp_path / "on", config, max_steps=steps + lag)
    order, on_policy_trained = record_prompts(on_policy)
    on_policy.train()

    lagged = make_trainer(model_dir, dataset, tmp_path / "lag", config, lag=lag, max_steps=steps)
    generated, trained = record_prompts(lagged)
    lagged.train()
    assert generated == order  # rounds 0..k first (the fill), then one round ahead a step
    assert len({tuple(p) for p in generated[: lag + 1]}) == lag + 1
    assert trained == on_policy_trained[:steps]

    resume = tmp_path / "resume"
    saved = make_trainer(
        model_dir, dataset, resume, config, lag=lag, max_steps=2, save_strategy="steps", save_steps=2
    )
    first, _ = record_prompts(saved)
    saved.train()
    resumed = make_trainer(model_dir, dataset, resume, config, lag=lag, max_steps=steps)
    rest, _ = record_prompts(resumed)
    resumed.train(resume_from_checkpoint=str(resume / "checkpoint-2"))
    assert first + rest == order


def test_lag_uses_behaviour_logps(model_dir, dataset, tmp_path):
    """A batch in flight carries the log-probs of the policy that generated it, which the ratio is taken
    against: after an update they differ from the current policy's."""
    trainer = make_trainer(model_dir, dataset, tmp_path, KLConfig("k3", "loss", beta=0.1), lag=1, max_steps=2)
    trainer.train()
    (pending,) = trainer._lag_queue  # generated at step 1, not trained yet
    assert pending["policy_version"].unique().tolist() == [1]
    ids = torch.cat([pending["prompt_ids"], pending["completion_ids"]], dim=1)
    attention = torch.cat([pending["prompt_mask"], pending["completion_mask"]], dim=1)
    with torch.no_grad():
        current = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attention, pending["completion_ids"].size(1)
        )[0]
    mask = pending["completion_mask"].bool()
    assert not torch.allclose(current[mask], pending["old_per_token_logps"][mask])


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("importance", ["token", "sequence"])
def test_off_policy_importance_weighted_kl_gradient(model_dir, dataset, tmp_path, importance, level):
    """A stale batch (lag 1) trained by an updated policy: the KL-in-loss gradient is beta x the gradient of
    kl.surrogate with the generating policy's log-probs as behavior_logp (the importance weights)."""
    beta = 0.5
    config = KLConfig("k3", "loss", level, beta=beta, importance=importance)
    trainer, inputs = stale_batch(model_dir, dataset, tmp_path, config)
    _, grads_beta = loss_and_grads(trainer, inputs)
    trainer.kl = dataclasses.replace(config, beta=0.0)
    _, grads_zero = loss_and_grads(trainer, inputs)
    difference = [b - z for b, z in zip(grads_beta, grads_zero, strict=True)]

    model = trainer.model
    model.zero_grad()
    logp = independent_logps(model, inputs)
    mask = inputs["completion_mask"]
    behavior = inputs["old_per_token_logps"]
    weights = torch.exp((logp.detach() - behavior) * mask)
    assert not torch.allclose(weights[mask.bool()], torch.ones(())), "the batch should be off-policy"
    surrogate = klmath.surrogate(logp, inputs["ref_per_token_logps"], mask, config, behavior_logp=behavior)
    normaliser = mask.sum() if level == "token" else surrogate.numel()
    (beta * surrogate.sum() / normaliser).backward()
    expected = [p.grad.detach().clone() for p in model.parameters() if p.requires_grad]
    scale = max(e.abs().max().item() for e in expected)
    assert_grads_close(difference, expected, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize(
    ("placement", "reward_logp", "importance"),
    [
        ("reward", "current", "sequence"),
        ("both", "current", "token"),
        ("reward", "current", "none"),
        ("both", "behavior", "none"),
    ],
)
def test_off_policy_kl_gradient_follows_the_audit(
    model_dir, dataset, tmp_path, placement, reward_logp, importance
):
    """A stale batch (lag 1) trained by an updated policy: grad(beta) - grad(0) is beta x the gradient of the
    objective the GRPO audit enumerates off-policy (klsweep.audit.grpo_gradients with off_policy): with current
    log-probs, grpo.kl_reward_loss (the current penalty less the leave-one-out mean of the other completions'
    behaviour penalties, weighted) outside the clipped ratio, plus grpo.kl_loss; with behaviour log-probs, the
    penalty in the advantage through TRL's clipped ratio (grpo.clipped_policy_loss)."""
    beta = 0.5
    config = KLConfig("k3", placement, "token", beta=beta, importance=importance, reward_logp=reward_logp)
    trainer, inputs = stale_batch(model_dir, dataset, tmp_path, config)
    _, grads_beta = loss_and_grads(trainer, inputs)
    task_only = grpo.group_advantages(inputs["task_reward"], GROUP, "group")
    trainer.kl = dataclasses.replace(config, beta=0.0)
    _, grads_zero = loss_and_grads(trainer, {**inputs, "advantages": task_only})
    difference = [b - z for b, z in zip(grads_beta, grads_zero, strict=True)]

    model = trainer.model
    model.zero_grad()
    logp = independent_logps(model, inputs)
    mask = inputs["completion_mask"]
    ref, behavior = inputs["ref_per_token_logps"], inputs["old_per_token_logps"]
    assert (logp.detach() - behavior)[mask.bool()].abs().max() > 0.2, "the batch should be off-policy"
    aggregation = grpo.Aggregation("dapo", tokens=mask.sum())
    penalty = klmath.estimate(behavior, ref, mask, "k3", "token")
    if reward_logp == "current":
        baseline = grpo.leave_one_out_baseline(penalty, GROUP)
        torch.testing.assert_close(inputs["kl_baseline"], baseline)
        objective = grpo.kl_reward_loss(logp, ref, mask, config, aggregation, baseline, behavior)
    else:
        assert "kl_baseline" not in inputs
        with_penalty = grpo.advantages(inputs["task_reward"], penalty, beta, GROUP, "group", "separate")
        torch.testing.assert_close(inputs["advantages"], with_penalty)
        objective = (
            grpo.clipped_policy_loss(with_penalty, logp, behavior, mask, aggregation)
            - grpo.clipped_policy_loss(task_only, logp, behavior, mask, aggregation)
        ) / beta
    if placement == "both":
        weights_from = behavior if importance != "none" else None
        objective = objective + grpo.kl_loss(logp, ref, mask, config, aggregation, weights_from)
    (beta * objective).backward()
    expected = [p.grad.detach().clone() for p in model.parameters() if p.requires_grad]
    scale = max(e.abs().max().item() for e in expected)
    assert scale > 1e-4
    assert_grads_close(difference, expected, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("reward_logp", ["behavior", "current"])
def test_pipeline_fill_reward_half(model_dir, dataset, tmp_path, reward_logp):
    """Steps 0..lag train on batches of the initial policy, which is the reference: with the behaviour's
    log-probs the reward half's penalty is exactly zero there; with the current policy's it is zero at step 0
    only (the policy has moved by step 1)."""
    lag = 2
    config = KLConfig("k1", "reward", beta=0.1, reward_logp=reward_logp)
    trainer = make_trainer(model_dir, dataset, tmp_path, config, lag=lag, max_steps=lag + 2)
    trainer.train()
    used = [row["kl/reward_penalty"] for row in trainer.state.log_history if "loss" in row]
    assert len(used) == lag + 2
    assert abs(used[0]) < 1e-6
    if reward_logp == "behavior":
        assert all(abs(u) < 1e-6 for u in used[: lag + 1])
    else:
        assert all(abs(u) > 1e-5 for u in used[1 : lag + 1])
    assert abs(used[lag + 1]) > 1e-5  # the first batch generated by a trained policy


def test_leave_one_out_baseline_is_the_whole_groups_when_a_group_is_split_across_micro_batches(
    model_dir, dataset, tmp_path
):
    """With the current log-probs the penalty is known only in each micro-batch's forward pass, but TRL shuffles
    the generation batch and splits it into micro-batches, so a group's completions land in different ones. The
    baseline is computed when the batch is generated, over the whole group (the mean of the others' behaviour
    penalties), and travels with each completion: after the split it is still the whole group's."""
    config = KLConfig("k1", "reward", beta=0.1)
    trainer = make_trainer(
        model_dir,
        dataset,
        tmp_path,
        config,
        per_device_train_batch_size=BATCH // 2,
        gradient_accumulation_steps=2,
    )
    trainer.model.train()
    torch.manual_seed(1)
    trainer._prepare_inputs([dataset[0]] * GROUP + [dataset[1]] * GROUP)
    micro = trainer._buffered_inputs
    assert len(micro) == 2 and all(len(m["completion_ids"]) == BATCH // 2 for m in micro)
    prompts = [tuple(p.tolist()) for m in micro for p in m["prompt_ids"]]
    half = BATCH // 2
    assert len(set(prompts[:half])) == len(set(prompts[half:])) == 2  # both groups are split
    with torch.no_grad():
        penalty = torch.cat(
            [
                klmath.estimate(
                    independent_logps(trainer.model, m),
                    m["ref_per_token_logps"],
                    m["completion_mask"],
                    "k1",
                    "token",
                )
                for m in micro
            ]
        )
    baseline = torch.cat([m["kl_baseline"] for m in micro])
    for i, prompt in enumerate(prompts):
        others = [j for j, q in enumerate(prompts) if q == prompt and j != i]
        assert len(others) == GROUP - 1
        torch.testing.assert_close(baseline[i], penalty[others].mean(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("placement", ["reward", "both"])
def test_one_pass_baseline_is_the_generation_time_one_bit_for_bit(model_dir, dataset, tmp_path, placement):
    """On-policy with the whole batch in one micro-batch, no behaviour forward is run when the batch is
    generated: the reward half's leave-one-out baseline is computed from the training forward instead. Loss and
    gradients are the same bits as with the baseline of a behaviour forward at generation (the computation of
    the split-batch case), after TRL's shuffle of the batch."""
    from trl.trainer.utils import shuffle_sequence_dict

    config = KLConfig("k3", placement, beta=0.5)
    trainer = make_trainer(model_dir, dataset, tmp_path, config, loss_type="dapo")
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    policy_forwards = []
    forward = trainer._get_per_token_logps_and_entropies

    def counted(model, *args, **kwargs):
        policy_forwards.append(model is trainer.model)
        return forward(model, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counted
    inputs = generate(trainer, dataset)
    trainer._get_per_token_logps_and_entropies = forward
    assert policy_forwards == [False]  # the reference's only
    assert "kl_baseline" not in inputs
    behavior = behaviour_logps(trainer, inputs)
    penalty = klmath.estimate(
        behavior, inputs["ref_per_token_logps"], inputs["completion_mask"], "k3", "token"
    )
    torch.manual_seed(2)
    shuffled = shuffle_sequence_dict({**inputs, "kl_baseline": grpo.leave_one_out_baseline(penalty, GROUP)})
    assert not torch.equal(shuffled["kl_index"], torch.arange(BATCH))
    loss_at_generation, grads_at_generation = loss_and_grads(trainer, shuffled)
    del shuffled["kl_baseline"]
    loss_one_pass, grads_one_pass = loss_and_grads(trainer, shuffled)
    assert torch.equal(loss_one_pass, loss_at_generation)
    assert all(torch.equal(a, b) for a, b in zip(grads_one_pass, grads_at_generation, strict=True))
    assert trainer._metrics["train"]["kl/reward_penalty"][-1] > 0


# ------------------------------------------------------------------------------------------------ vLLM


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_the_vllm_importance_ratio_weighs_every_kl_term_as_it_weighs_the_policy_loss(
    model_dir, dataset, tmp_path, level
):
    """Generated by vLLM (TRL's vllm_importance_sampling_correction, on by default), TRL weighs its policy loss
    by the ratio of the training engine's probabilities to vLLM's, and drops a sequence whose ratio is out of
    bounds (sequence_mask: ratio 0). klsweep's KL terms (the loss half and the separate reward half, its own
    term) get the same weight, so that every term estimates the expectation under the training policy, as a
    run generating with HF does (docs/KL.md, "Generated by vLLM"). vLLM is not installed here: a batch
    generated by HF, handed over with TRL's flags set as use_vllm sets them and a ratio of our choosing."""
    config = KLConfig("k3", "both", level, beta=0.3, reward_mode="separate")
    assert config.reward_term
    trainer = make_trainer(model_dir, dataset, tmp_path, config, loss_type="dapo")
    assert trainer.vllm_importance_sampling_correction  # TRL's default, which klsweep keeps
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # the KL is not zero
    inputs = generate(trainer, dataset)
    loss, grads = loss_and_grads(trainer, inputs)
    trainer.use_vllm = True  # what _compute_loss reads of it

    def weighted(ratio: torch.Tensor, **changed) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return loss_and_grads(trainer, {**inputs, **changed, "importance_sampling_ratio": ratio})

    ones = torch.ones(BATCH, 1)
    loss_1, grads_1 = weighted(ones)
    torch.testing.assert_close(loss_1, loss)
    assert_grads_close(grads_1, grads)
    loss_c, grads_c = weighted(0.5 * ones)  # every term, not the policy loss alone
    torch.testing.assert_close(loss_c, 0.5 * loss)
    assert_grads_close(grads_c, [0.5 * g for g in grads])

    # the second group out of bounds: it leaves every term, as if its completions had no tokens
    dropped = torch.cat([torch.ones(GROUP, 1), torch.zeros(GROUP, 1)])
    loss_d, grads_d = weighted(dropped)
    mask = inputs["completion_mask"].clone()
    mask[GROUP:] = 0
    trainer.use_vllm = False
    loss_m, grads_m = loss_and_grads(trainer, {**inputs, "completion_mask": mask})
    torch.testing.assert_close(loss_d, loss_m)
    assert_grads_close(grads_d, grads_m)
    assert not torch.allclose(loss_d, loss)


def test_saved_checkpoint_files_follow_the_umask(model_dir, dataset, tmp_path):
    """Issue 47 item 13: safetensors wrote the weights 0600 while every other file follows the umask, so a
    colleague sharing the results folder could not evaluate them. Every file a save writes (the checkpoint's
    and the consolidated weights' path, ``Trainer._save``) has the mode ``open`` gives."""
    import os
    import stat

    trainer = make_trainer(model_dir, dataset, tmp_path / "out", KLConfig("k1", "reward", beta=0.1))
    old = os.umask(0o002)
    try:
        trainer.save_model(str(tmp_path / "saved"))
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "saved").iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o664}, modes
