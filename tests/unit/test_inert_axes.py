"""An axis that changes nothing in any run is said by `klsweep plan` (and `klsweep run`, before submitting):
kl.* keys without a KL (beta 0: the runs merge, one per seed), keys a setting of every run makes inert
(``config.inert``), and keys the run id leaves out (the runs merge). The KL rules of ``config.inert`` are checked
against klsweep's own KL math: the two values of an inert key give the same loss terms and gradients."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from clitools import cli
from gridfiles import write

from klsweep import config, grid, grpo, kl, planner

NO_BETA = """\
name: nobeta
grid:
  kl.estimator: k1,k3
  kl.placement: reward,loss
  seed: range(2)
"""


def test_estimators_without_beta_are_said_to_change_nothing(tmp_path, monkeypatch, capsys):
    code, out, _ = cli(["plan", write(tmp_path, NO_BETA), "--out", tmp_path / "r"], monkeypatch, capsys)
    assert code == 0
    assert (
        "warning: kl.estimator, kl.placement vary but kl.beta is 0 in every run: they change nothing; "
        "set kl.beta" in " ".join(out.split())
    )
    code, out, _ = cli(
        ["plan", write(tmp_path, NO_BETA), "--json", "--out", tmp_path / "r"], monkeypatch, capsys
    )
    assert code == 0 and any(
        "kl.beta is 0 in every run" in w for w in __import__("json").loads(out)["warnings"]
    )


def test_a_beta_axis_with_a_no_kl_arm_and_the_shipped_grids_warn_of_nothing(tmp_path):
    crossed = NO_BETA + "  kl.beta: 0,0.1\n"
    assert planner.inert_axes(grid.load_plan(write(tmp_path, crossed), out=tmp_path)) == []
    for name in ("tiny", "tiny-full", "paper", "starter", "presets", "baseline"):
        assert planner.inert_axes(grid.load_plan(name, ["cluster.offline=false"], out=tmp_path)) == [], name


@pytest.mark.parametrize(
    ("axis", "base", "said"),
    [
        ("kl.reward_mode: separate,shaped", "kl.placement: loss", "kl.placement is loss in every run"),
        ("kl.straight_through: false,true", "kl.placement: reward", "kl.placement is reward in every run"),
        ("kl.importance_cap: 0,2", "kl.importance: none", "kl.importance is none in every run"),
        ("kl.importance_gradient: false,true", "kl.importance: none", "kl.importance is none in every run"),
        ("kl.reward_logp: current,behavior", "kl.placement: both", "on-policy (offpolicy.lag 0"),
        ("train.vllm_importance_sampling: token_mask,off", "seed: 0", "train.use_vllm is false in every run"),
        ("train.trl.vllm_model_impl: vllm,transformers", "seed: 0", "train.use_vllm is false in every run"),
        ("train.micro_batch_size: 4,8", "seed: 0", "the run id leaves it out"),
        ("eval: tiny,none", "seed: 0", "the run id leaves it out"),
    ],
)
def test_an_axis_a_setting_makes_inert_is_said(tmp_path, axis, base, said):
    text = f"name: inert\nbase:\n  kl.beta: 0.1\n  {base}\ngrid:\n  {axis}\n  seed: range(2)\n"
    warnings = planner.inert_axes(grid.load_plan(write(tmp_path, text), out=tmp_path))
    assert len(warnings) == 1 and said in warnings[0] and warnings[0].startswith(axis.split(":")[0]), warnings


def test_an_axis_inert_in_some_runs_only_is_not_said(tmp_path):
    text = "name: some\nbase:\n  kl.beta: 0.1\ngrid:\n  kl.placement: loss,reward\n  kl.reward_mode: separate,shaped\n"
    assert planner.inert_axes(grid.load_plan(write(tmp_path, text), out=tmp_path)) == []


# (key, its two values, the setting that makes it inert): each rule of config.inert for the KL math
KL_RULES = [
    ("estimator", ("k1", "k3"), {"beta": 0.0}),
    ("straight_through", (False, True), {"placement": "reward"}),
    ("unbiased_gradient", (False, True), {"placement": "reward"}),
    ("importance_gradient", (False, True), {"placement": "reward", "importance": "token"}),
    ("importance_gradient", (False, True), {"importance": "none"}),
    ("importance_cap", (0.0, 0.5), {"importance": "none", "unbiased_gradient": True}),
    ("reward_mode", ("separate", "shaped"), {"placement": "loss"}),
]


def kl_objective(c: kl.KLConfig, logp, ref, behavior, mask, task):
    """The trainer's objective for one batch as ``KLGRPOTrainer._rollout`` and ``_compute_loss`` put it
    together: the policy loss of the advantages (with the KL penalty inside them where the reward half is not
    its own term), the loss half (``grpo.kl_loss``), the reward half as its own term (``grpo.kl_reward_loss``);
    no KL term without a KL (``_kl_on``)."""
    agg = grpo.Aggregation("dapo", 1.0, mask.sum().double(), logp.size(-1))
    kl_on = c.beta > 0 or bool(c.beta_final)
    in_advantage = kl_on and c.placement in ("reward", "both") and not c.reward_term
    penalty = kl.penalty(behavior, ref, mask, c) if in_advantage else None
    total = grpo.policy_loss(
        grpo.advantages(task, penalty, c.beta, 2, "group", c.reward_mode), logp, mask, agg
    )
    if kl_on and c.placement in ("loss", "both"):
        total = total + c.beta * grpo.kl_loss(
            logp, ref, mask, c, agg, behavior if c.importance != "none" else None
        )
    if kl_on and c.reward_term:
        baseline = grpo.leave_one_out_baseline(kl.penalty(logp.detach(), ref, mask, c), 2)
        total = total + c.beta * grpo.kl_reward_loss(logp, ref, mask, c, agg, baseline, behavior)
    return total


@pytest.mark.parametrize(("key", "values", "setting"), KL_RULES)
def test_the_kl_keys_said_inert_change_no_loss_term(key, values, setting):
    torch.manual_seed(0)
    logp = torch.randn(4, 5, dtype=torch.float64).clamp(max=-0.1)
    ref, behavior = logp + 0.3 * torch.randn_like(logp), logp + 0.2 * torch.randn_like(logp)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[0, 3:] = False
    task = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    base = {"estimator": "k3", "placement": "both", "beta": 0.1, "importance": "token"} | setting
    runs = [
        {"kl": dataclasses.asdict(config.KLSection()) | base | {key: v}, "offpolicy": {"lag": 4}}
        for v in values
    ]
    assert all(config.inert(r, f"kl.{key}") is not None for r in runs), (key, setting)
    found = []
    for run in runs:
        lp = logp.clone().requires_grad_(True)
        loss = kl_objective(kl.KLConfig(**run["kl"]), lp, ref, behavior, mask, task)
        (grad,) = torch.autograd.grad(loss, lp)
        found.append((loss.detach(), grad))
    assert torch.allclose(found[0][0], found[1][0], atol=1e-12, rtol=0)
    assert torch.allclose(found[0][1], found[1][1], atol=1e-12, rtol=0)


def test_the_objective_of_the_check_sees_a_key_that_matters():
    """The check above can fail: the same objective tells k1 from k3, and an importance cap from none."""
    torch.manual_seed(0)
    logp = torch.randn(4, 5, dtype=torch.float64).clamp(max=-0.1)
    ref, behavior = logp + 0.3 * torch.randn_like(logp), logp + 0.2 * torch.randn_like(logp)
    mask = torch.ones(4, 5, dtype=torch.bool)
    task = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    for key, values in (("estimator", ("k1", "k3")), ("importance_cap", (0.0, 0.5))):
        grads = []
        for v in values:
            c = kl.KLConfig(
                **{"estimator": "k3", "placement": "both", "beta": 0.1, "importance": "token", key: v}
            )
            lp = logp.clone().requires_grad_(True)
            grads.append(torch.autograd.grad(kl_objective(c, lp, ref, behavior, mask, task), lp)[0])
        assert not torch.allclose(grads[0], grads[1]), key


def test_inert_agrees_with_the_run_id_merge():
    """The keys a run without KL hashes at their defaults are exactly those ``inert`` says beta 0 makes inert."""
    no_kl = {"kl": {"beta": 0.0}}
    assert set(config.kl_off_hashed_at(no_kl)) == {
        k for k in config.KL_ONLY_KEYS if config.inert(no_kl, k) == ("kl.beta is 0", "set kl.beta")
    }
