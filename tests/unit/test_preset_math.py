"""The framework presets and the KL forms they need (klsweep.kl): the gradient forms against their closed
forms on an enumerated tabular policy (verl's straight-through k3+ has exactly k2-in-the-loss's gradient with
k3's value; TRL's non-detached weight adds each token's own score term; OpenRLHF's unbiased_gradient), TRL
#6586 numerically, the clamps and their share, the beta schedule, validation, and `klsweep audit --preset`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from test_audit import run_cli  # tests/unit is on sys.path under pytest

from klsweep import audit, presets
from klsweep import kl as klmath
from klsweep.audit import TabularPolicy, per_sample_gradients
from klsweep.errors import UserError
from klsweep.kl import KLConfig

ISSUE_PRESETS = (
    "trl",
    "verl",
    "verl-k3plus",
    "openrlhf",
    "openrlhf-unbiased",
    "slime",
    "slime-unbiased",
    "skyrl",
    "nemo",
    "nemo-onpolicy",
    "areal",
    "pipelinerl",
)


def policy(length: int = 3, shift: float = 0.0, seed: int = 0) -> TabularPolicy:
    return TabularPolicy.random(3, length, seed, 1.0, shift)


def expected(p: TabularPolicy, config: KLConfig) -> torch.Tensor:
    """E_q[grad surrogate] (q: the behaviour policy, pi on-policy), exact."""
    q = p.token_logp(p.behavior).sum(-1).exp()
    return q @ per_sample_gradients(p, config)


def test_every_preset_of_the_issue_exists_and_cites_its_source():
    assert set(ISSUE_PRESETS) <= set(presets.names())
    for name in presets.names():
        text = (presets.PRESET_DIR / f"{name}.yaml").read_text()
        header = "".join(line for line in text.splitlines() if line.startswith("#"))
        assert name == "paper" or any(ext in header for ext in (".py", ".md", ".yaml")), name
        presets.kl_config(name)  # valid


def test_straight_through_k3_has_k2_in_the_loss_gradient_and_k3_value():
    """verl's k3+: per sample, exactly the gradient of k2 in the loss (so on-policy its expectation too),
    while its value stays k3's (clamped as verl clamps it)."""
    p = policy()
    k3plus = presets.kl_config("verl-k3plus")
    k2 = KLConfig("k2", "loss", "token")
    torch.testing.assert_close(
        per_sample_gradients(p, k3plus), per_sample_gradients(p, k2), rtol=0, atol=1e-12
    )
    logp, ref = p.token_logp(p.theta), p.token_logp(p.ref)
    mask = torch.ones_like(logp, dtype=torch.bool)
    values = klmath.surrogate(logp, ref, mask, k3plus)
    torch.testing.assert_close(values, klmath.estimate(logp, ref, mask, "k3", "token"))
    # the audit says the same: verl-k3plus's row is k2-in-the-loss's, not verl's (plain k3)
    rows = {r.preset: r for r in audit.preset_audit(["verl", "verl-k3plus"])}
    k2_row = next(r for r in audit.audit() if (r.estimator, r.placement, r.level) == ("k2", "loss", "token"))
    assert rows["verl-k3plus"].rel_err_reverse == pytest.approx(k2_row.rel_err_reverse, abs=1e-12)
    assert rows["verl"].rel_err_reverse != pytest.approx(k2_row.rel_err_reverse, abs=1e-3)


def test_weight_with_gradient_adds_each_tokens_own_score_term():
    """TRL's per_token_kl * coef_1 on-policy: grad k3(delta_t) + k3(delta_t) grad log pi(y_t | y_<t), per
    sample; TRL's claim (the unbiased reverse-KL gradient) holds for one-token completions only."""
    p = policy()
    jac = p.token_logp_jacobian()  # [N, L, P]
    delta = p.token_logp(p.theta) - p.token_logp(p.ref)
    k3 = torch.expm1(-delta) + delta
    dk3 = -torch.expm1(-delta)  # d k3 / d log pi
    closed = torch.einsum("nl,nlp->np", dk3 + k3, jac)
    torch.testing.assert_close(per_sample_gradients(p, presets.kl_config("trl")), closed)
    one_token = policy(length=1)
    rows = audit.preset_audit(["trl", "nemo", "slime-unbiased"], length=1)
    assert {r.verdict for r in rows} == {"unbiased reverse KL"}
    assert audit.preset_audit(["trl"], length=3)[0].verdict == "biased"
    # detached (the trl preset before: importance token, no gradient) it is plain k3 in the loss on-policy
    detached = dataclasses.replace(presets.kl_config("trl"), importance_gradient=False)
    torch.testing.assert_close(
        expected(one_token, detached), expected(one_token, KLConfig("k3", "loss")), rtol=0, atol=1e-12
    )


def test_trl_6586_sequence_weight_adds_a_spurious_term():
    """TRL #6586: with importance_sampling_level sequence, coef_1 = exp(mean_t log-ratio) multiplies every
    token's k3; on-policy its gradient adds k3_t x (mean_s grad log pi_s - grad log pi_t) per token. The
    expected gradients differ by exactly that term's expectation, computed here by enumeration."""
    p = policy()
    jac = p.token_logp_jacobian()
    delta = p.token_logp(p.theta) - p.token_logp(p.ref)
    k3 = torch.expm1(-delta) + delta
    spurious = torch.einsum("nl,nlp->np", k3, jac.mean(1, keepdim=True) - jac)
    probs = p.token_logp(p.theta).sum(-1).exp()
    gap = expected(p, presets.kl_config("trl-sequence")) - expected(p, presets.kl_config("trl"))
    torch.testing.assert_close(gap, probs @ spurious, rtol=1e-10, atol=1e-12)
    assert gap.norm() > 1e-2 * expected(p, presets.kl_config("trl")).norm()
    row = audit.preset_audit(["trl-sequence"], length=3)[0]
    assert row.verdict == "biased" and row.importance == "sequence_mean"


def test_unbiased_gradient_is_the_detached_weight_times_k1_times_the_score():
    """OpenRLHF's unbiased_gradient: per token stopgrad(min(w, cap) k1) grad log pi, off-policy too, with k1's
    coefficient whatever the estimator (its PR's tests: k1, k2 and k3 share one corrected gradient) and never
    clamped where the value is."""
    p = policy(shift=0.5)
    config = presets.kl_config("openrlhf-unbiased")
    logp, ref, behavior = (p.token_logp(x) for x in (p.theta, p.ref, p.behavior))
    w = torch.exp(logp - behavior).clamp(max=config.importance_cap)
    closed = torch.einsum("nl,nlp->np", w * (logp - ref), p.token_logp_jacobian())
    torch.testing.assert_close(per_sample_gradients(p, config), closed)
    for estimator in ("k2", "k3"):
        other = dataclasses.replace(config, estimator=estimator)
        torch.testing.assert_close(per_sample_gradients(p, other), closed)
    delta = torch.tensor([[-30.0, 0.5]], dtype=torch.float64, requires_grad=True)  # k1 past the value clamp
    mask = torch.tensor([[True, True]])
    klmath.token_terms(
        delta, torch.zeros_like(delta), mask, dataclasses.replace(config, importance="none")
    ).sum().backward()
    assert delta.grad.tolist() == [[-30.0, 0.5]]


def test_clamps_bound_the_value_zero_the_gradient_and_are_counted():
    config = KLConfig("k3", "loss", "token", log_ratio_clamp=2.0, value_clamp=1.0)
    logp = torch.tensor([[0.0, -5.0, -0.1, 0.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[0.0, 0.0, 0.0, -7.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    terms = klmath.token_terms(logp, ref, mask, config)
    # delta -5 -> clamped to -2 -> k3 = e^2 - 3 = 4.39 -> clamped to 1; delta -0.1: unclamped
    assert terms[0, 1].item() == pytest.approx(1.0)
    assert terms[0, 2].item() == pytest.approx(float(torch.expm1(torch.tensor(0.1)) - 0.1))
    terms.sum().backward()
    assert logp.grad[0, 1].item() == 0 and logp.grad[0, 2].item() != 0 and logp.grad[0, 3].item() == 0
    share = klmath.clamped_share(logp, ref, mask, config)
    assert share.tolist() == [pytest.approx(1 / 3)]  # one of the three unmasked tokens
    penalty = klmath.penalty(logp, ref, mask, config)
    assert penalty.item() == pytest.approx(terms.sum().item())
    assert klmath.clamped_share(logp, ref, mask, KLConfig("k3", "loss")).tolist() == [0.0]


def test_beta_schedule_is_linear_from_beta_to_beta_final():
    """klsweep's decay reaches beta_final at the last step (beta_final_at: last); PipelineRL's linear_decay_coef
    over completed_steps / max_steps (end) is one step short of it at its last step: 0.00055 of 0.001 ->
    0.0001 at 2 steps, 0.00019 at 10, 0.0001009 at 1000. Its default is no decay (final = kl_coef)."""
    assert presets.kl_config("pipelinerl").beta_final is None
    pipelinerl = dataclasses.replace(presets.kl_config("pipelinerl"), beta_final=0.0001)
    assert pipelinerl.beta_final_at == "end"
    last = dataclasses.replace(pipelinerl, beta_final_at="last")
    assert klmath.beta_at(last, 0, 11) == last.beta
    assert klmath.beta_at(last, 10, 11) == pytest.approx(last.beta_final)
    assert klmath.beta_at(last, 5, 11) == pytest.approx((last.beta + last.beta_final) / 2)
    assert klmath.beta_at(pipelinerl, 0, 11) == pipelinerl.beta
    for steps, final in ((2, 0.00055), (10, 0.00019), (1000, 0.0001009)):
        assert klmath.beta_at(pipelinerl, steps - 1, steps) == pytest.approx(final, rel=1e-9), steps
    assert klmath.beta_at(dataclasses.replace(pipelinerl, beta_final=None), 9, 10) == pipelinerl.beta
    assert klmath.beta_at(KLConfig("k3", "loss", beta=0.3), 7, 11) == 0.3


def test_clamp_after_weighting_and_weight_detached_where_clamped():
    """NeMo-RL's calculate_kl: the value clamp on weight x k3 (clamp_weighted), the weight detached where the
    log-ratio clamp bites (clamp_detaches_weight). A weight with gradient keeps the gradient of a clamped k3
    (k3_clamped x grad w) unless the product is clamped; tokens inside every clamp are unchanged."""
    plain = KLConfig(
        "k3", "loss", importance="self", importance_gradient=True, log_ratio_clamp=20.0, value_clamp=10.0
    )
    nemo = dataclasses.replace(plain, clamp_weighted=True, clamp_detaches_weight=True)
    delta = torch.tensor([[-3.0, -25.0, 0.5, 25.0]], dtype=torch.float64)
    mask = torch.ones_like(delta, dtype=torch.bool)
    grads = {}
    for name, config in (("plain", plain), ("nemo", nemo)):
        logp = torch.zeros_like(delta, requires_grad=True)
        terms = klmath.token_terms(logp, -delta, mask, config)
        terms.sum().backward()
        grads[name] = logp.grad[0].tolist()
        assert terms[0, 0].item() == pytest.approx(10.0)  # k3(-3) = 16.1, clamped at 10 either way
    assert grads["plain"][:2] == [10.0, 10.0]  # k3 clamped, x grad w (= grad log pi): 10
    assert grads["nemo"][0] == 0.0 and grads["nemo"][1] == 0.0  # clamped product; detached weight
    assert grads["nemo"][2] == pytest.approx(grads["plain"][2]) != 0  # no clamp bites: the same
    # k3(25) = 24 -> 10 by the value clamp; the log-ratio clamp (20) bites too: no gradient either way
    assert grads["nemo"][3] == 0.0
    # the keys need their clamp; unbiased_gradient's term is never clamped
    with pytest.raises(UserError) as info:
        KLConfig("k3", "loss", clamp_weighted=True, clamp_detaches_weight=True, unbiased_gradient=True)
    assert [p.where for p in info.value.problems] == [
        "clamp_weighted",
        "clamp_detaches_weight",
        "unbiased_gradient",
    ]


def test_new_keys_default_to_todays_computation():
    """Every new key at its default: the surrogate of every configuration is what it was (weights detached,
    no clamp, no straight-through)."""
    p = policy(shift=0.5)
    for imp in klmath.IMPORTANCE:
        config = KLConfig("k3", "both", "token", importance=imp)
        logp, ref, behavior = (p.token_logp(x) for x in (p.theta, p.ref, p.behavior))
        lp = logp.clone().requires_grad_()
        mask = torch.ones_like(lp, dtype=torch.bool)
        delta = lp - ref
        w = klmath.importance_weights(lp, behavior, mask, config)
        old = (
            klmath.estimate(lp, ref, mask, "k3", "token").detach().unsqueeze(-1) * lp
            + torch.expm1(-delta)
            + delta
        ) * w
        torch.testing.assert_close(klmath.token_terms(lp, ref, mask, config, behavior), old)
        assert not w.requires_grad


def test_invalid_new_keys_are_all_reported():
    with pytest.raises(UserError) as info:
        KLConfig(
            "k5",
            "loss",
            importance="geometric",
            log_ratio_clamp=-1,
            value_clamp=float("inf"),
            importance_gradient="yes",
            beta_final=-0.1,
            beta_final_at="first",
            straight_through=True,
            unbiased_gradient=True,
            clamp_weighted="yes",
        )
    fields = {p.where for p in info.value.problems}
    assert fields == {
        "estimator",
        "importance",
        "log_ratio_clamp",
        "value_clamp",
        "importance_gradient",
        "beta_final",
        "beta_final_at",
        "clamp_weighted",
        "straight_through, unbiased_gradient",
    }


def test_name_of_finds_a_runs_preset():
    settings = presets.kl_settings("verl-k3plus")
    assert presets.name_of(settings) == "verl-k3plus"
    assert (
        presets.name_of({**settings, "straight_through": False}) == "skyrl/verl"
    )  # the same k3, clamps, beta
    assert presets.name_of({"estimator": "k2", "placement": "both", "beta": 0.3}) is None


@pytest.mark.parametrize("shift", ["0", "0.5"])
def test_cli_audit_preset_json_runs_for_each_preset(shift):
    out = run_cli("--preset", "all", "--behavior-shift", shift, "--json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert [r["preset"] for r in rows] == list(presets.names())
    assert rows == audit.rows_as_dicts(audit.preset_audit(["all"], behavior_shift=float(shift)))
    out = run_cli("--preset", "trl,verl", "--grpo", "--behavior-shift", shift, "--json")
    assert out.exit_code == 0, out.output
    grpo_rows = json.loads(out.stdout)
    assert [(r["preset"], r["beta"]) for r in grpo_rows] == [("trl", 0.04), ("verl", 0.001)]
    assert {r["behavior_shift"] for r in grpo_rows} == {float(shift)}


def test_cli_audit_filters_and_refuses_what_a_preset_sets():
    out = run_cli("--estimator", "k1", "--placement", "loss", "--csv")
    assert out.exit_code == 0, out.output
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3 and all(",k1,loss," in f",{line}" for line in lines[1:])
    out = run_cli("--preset", "verl", "--importance", "token", "--estimator", "k9")
    assert isinstance(out.exception, UserError)  # klsweep's entry point: exit code 2, the problems
    assert [p.where for p in out.exception.problems] == ["--importance", "estimator"]


def test_help_explains_the_columns():
    out = run_cli("--help")
    for word in ("err rev", "err fwd", "|E g|", "variance", "scale", "cos rev", "--preset", "--estimator"):
        assert word in out.output, word


def test_docs_table_has_every_preset():
    text = (Path(__file__).parents[2] / "docs" / "KL.md").read_text()
    for name in presets.names():
        assert f"`{name}`" in text, name


@pytest.mark.parametrize("name", presets.names())
def test_a_preset_read_without_omegaconf_has_hydras_values(name):
    """``presets.kl_settings`` reads a plain preset file with YAML's loader (OmegaConf costs a report some 50
    ms to import): the values and their types Hydra's reading (OmegaConf) gives the same file."""
    from omegaconf import OmegaConf

    hydra = OmegaConf.to_container(OmegaConf.load(presets.PRESET_DIR / f"{name}.yaml"), resolve=True)
    expected = hydra["kl"]
    got = presets.kl_settings(name)
    assert got == expected
    assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]
