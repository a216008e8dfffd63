"""klsweep.audit and `klsweep audit`: exact expected gradients of every configuration, docs/KL.md's verdict
table, off-policy importance weighting, the GRPO audit of the trainer's whole objective (exact enumeration
against Monte Carlo, the reward modes' scales), and the command line."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from klsweep import audit, grpo, kl
from klsweep.errors import UserError

# docs/KL.md, "What each configuration's expected gradient is, on-policy": the verdict column.
KL_MD = {
    ("k1", "reward", "token"): "unbiased reverse KL",
    ("k1", "reward", "sequence"): "unbiased reverse KL",
    ("k1", "loss", "token"): "zero in expectation",
    ("k1", "loss", "sequence"): "zero in expectation",
    ("k1", "both", "token"): "unbiased reverse KL",
    ("k1", "both", "sequence"): "unbiased reverse KL",
    ("k2", "reward", "token"): "biased",
    ("k2", "reward", "sequence"): "biased",
    ("k2", "loss", "token"): "biased",
    ("k2", "loss", "sequence"): "unbiased reverse KL",
    ("k2", "both", "token"): "biased",
    ("k2", "both", "sequence"): "biased",
    ("k3", "reward", "token"): "biased",
    ("k3", "reward", "sequence"): "biased",
    ("k3", "loss", "token"): "biased",
    ("k3", "loss", "sequence"): "forward KL",
    ("k3", "both", "token"): "unbiased reverse KL",
    ("k3", "both", "sequence"): "unbiased reverse KL",
}
UNBIASED = {k for k, v in KL_MD.items() if v == "unbiased reverse KL"}
REPO = Path(__file__).resolve().parents[2]
SIZES = [(3, 3, 0), (2, 4, 1), (4, 2, 2), (2, 2, 3), (3, 4, 4)]


@pytest.mark.parametrize(("vocab", "length", "seed"), SIZES)
def test_on_policy_verdicts_are_kl_md_table(vocab, length, seed):
    rows = audit.audit(vocab=vocab, length=length, seed=seed)
    assert [(r.estimator, r.placement, r.level) for r in rows] == list(KL_MD)
    assert {(r.estimator, r.placement, r.level): r.verdict for r in rows} == KL_MD
    for r in rows:
        if r.verdict == "unbiased reverse KL":
            assert r.rel_err_reverse < 1e-10 and r.rel_err_forward > 0.01
        elif r.verdict == "forward KL":
            assert r.rel_err_forward < 1e-10 and r.rel_err_reverse > 0.01
        elif r.verdict == "zero in expectation":
            assert r.rel_norm < 1e-10 and r.rel_err_reverse == pytest.approx(1.0)
        else:  # biased: clearly, not by rounding
            assert min(r.rel_err_reverse, r.rel_err_forward) > 0.01 and r.rel_norm > 0.01
        assert r.grad_variance > 0


@pytest.mark.parametrize("ref_distance", [0.05, 3.0])
def test_verdicts_hold_near_and_far_from_the_reference(ref_distance):
    assert audit.verdicts(ref_distance=ref_distance, seed=5) == KL_MD


def test_length_one_collapses_levels():
    # One token: token and sequence levels coincide, so k2-in-loss is unbiased and k3-in-loss is forward KL.
    v = audit.verdicts(vocab=4, length=1)
    for est, placement in zip(kl.ESTIMATORS, kl.PLACEMENTS, strict=True):
        assert v[(est, placement, "token")] == v[(est, placement, "sequence")]
    assert v[("k2", "loss", "token")] == "unbiased reverse KL"
    assert v[("k3", "loss", "token")] == "forward KL"


def test_per_sample_gradients_match_plain_autograd():
    policy = audit.TabularPolicy.random(2, 3, seed=7, ref_distance=1.0, behavior_shift=0.5)
    jac = torch.autograd.functional.jacobian(policy.token_logp, policy.theta).flatten(2)
    torch.testing.assert_close(policy.token_logp_jacobian(), jac)
    for est, placement, level in [
        ("k3", "both", "sequence"),
        ("k2", "loss", "token"),
        ("k1", "reward", "token"),
    ]:
        config = kl.KLConfig(est, placement, level, importance="sequence")
        got = audit.per_sample_gradients(policy, config)
        behavior_logp = policy.token_logp(policy.behavior)
        for i in range(len(policy.seqs)):
            theta = policy.theta.detach().requires_grad_()
            logp = policy.token_logp(theta)[i : i + 1]
            ones = torch.ones_like(logp, dtype=torch.bool)
            s = kl.surrogate(
                logp, policy.token_logp(policy.ref)[i : i + 1], ones, config, behavior_logp[i : i + 1]
            )
            torch.testing.assert_close(got[i], torch.autograd.grad(s.sum(), theta)[0].flatten())


def test_exact_kl_gradient_matches_finite_differences():
    policy = audit.TabularPolicy.random(2, 2, seed=0, ref_distance=1.0, behavior_shift=0.0)
    g_rev, _ = audit.exact_kl_gradients(policy)

    def reverse_kl(theta):
        lp = policy.token_logp(theta).sum(-1)
        return (lp.exp() * (lp - policy.token_logp(policy.ref).sum(-1))).sum()

    eps = 1e-6
    for j in range(policy.theta.numel()):
        e = torch.zeros_like(policy.theta).flatten()
        e[j] = eps
        e = e.reshape(policy.theta.shape)
        fd = (reverse_kl(policy.theta + e) - reverse_kl(policy.theta - e)) / (2 * eps)
        assert fd.item() == pytest.approx(g_rev[j].item(), abs=1e-8)


def test_exact_variance_matches_monte_carlo():
    policy = audit.TabularPolicy.random(3, 3, seed=0, ref_distance=1.0, behavior_shift=0.0)
    config = kl.KLConfig("k3", "loss", "token")
    row = next(r for r in audit.audit() if (r.estimator, r.placement, r.level) == ("k3", "loss", "token"))
    per_sample = audit.per_sample_gradients(policy, config)
    pi = policy.token_logp(policy.theta).sum(-1).exp()
    idx = torch.multinomial(pi, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    mc = per_sample[idx].var(0).sum().item()
    assert mc == pytest.approx(row.grad_variance, rel=0.03)


def test_off_policy_sequence_weights_restore_unbiasedness_and_no_weights_do_not():
    on = audit.verdicts(seed=1)
    none = audit.verdicts(seed=1, behavior_shift=0.5, importance="none")
    seq = audit.verdicts(seed=1, behavior_shift=0.5, importance="sequence")
    assert seq == on == KL_MD
    assert set(none.values()) == {"biased"}
    # token weights fix each token given its prefix, not the prefix: k1-in-loss (token level) is pure noise
    # again, but nothing is unbiased for L >= 2 ...
    token = audit.verdicts(seed=1, behavior_shift=0.5, importance="token")
    assert token == dict.fromkeys(KL_MD, "biased") | {("k1", "loss", "token"): "zero in expectation"}
    # ... but exact for a single token, where they are the sequence weights
    one = audit.verdicts(vocab=4, length=1, seed=1, behavior_shift=0.5, importance="token")
    assert one == audit.verdicts(vocab=4, length=1, seed=1)


def test_sequence_weights_cost_variance():
    rows = audit.audit(seed=2, behavior_shift=1.0, importance="all")
    assert len(rows) == 54 and {r.importance for r in rows} == set(kl.IMPORTANCE)
    on = {(r.estimator, r.placement, r.level): r for r in audit.audit(seed=2)}
    for r in rows:
        if r.importance == "sequence":
            # same expectation as on-policy: same errors
            assert r.rel_err_reverse == pytest.approx(on[(r.estimator, r.placement, r.level)].rel_err_reverse)


def test_bad_options_are_reported_together():
    with pytest.raises(UserError) as info:
        audit.audit(vocab=1, length=0, seed=1.5, ref_distance=0.0, behavior_shift=-1.0, importance="bogus")
    assert {p.where for p in info.value.problems} == {
        "vocab",
        "length",
        "seed",
        "ref_distance",
        "behavior_shift",
        "importance",
    }
    with pytest.raises(UserError, match="too many"):
        audit.audit(vocab=4, length=5)
    with pytest.raises(UserError, match="importance"):
        audit.verdicts(importance="all")


# --- command line -----------------------------------------------------------------------------------------


def run_cli(*args: str):
    """`klsweep audit ARGS` in this process (the library is already imported: fast)."""
    from typer.testing import CliRunner

    from klsweep.cli import app

    return CliRunner().invoke(app, ["audit", *args], env={"COLUMNS": "200"})


def test_cli_json_agrees_with_library():
    out = run_cli("--json", "--vocab", "2", "--length", "4", "--seed", "1")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    want = audit.rows_as_dicts(audit.audit(vocab=2, length=4, seed=1))
    assert len(rows) == 18
    for got, exp in zip(rows, want, strict=True):
        for key in ("estimator", "placement", "level", "verdict", "importance"):
            assert got[key] == exp[key]
        for key in ("rel_err_reverse", "rel_err_forward", "grad_variance", "behavior_shift"):
            assert got[key] == pytest.approx(exp[key], abs=1e-12)
    assert {(r["estimator"], r["placement"], r["level"]): r["verdict"] for r in rows} == KL_MD


def test_cli_csv_and_table():
    out = run_cli("--csv", "--behavior-shift", "0.5", "--importance", "all")
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert len(rows) == 54 and rows[0]["importance"] == "none" and rows[-1]["importance"] == "sequence"
    seq = {
        (r["estimator"], r["placement"], r["level"]): r["verdict"]
        for r in rows
        if r["importance"] == "sequence"
    }
    assert seq == KL_MD
    table = run_cli()
    assert table.exit_code == 0, table.output
    for verdict in audit.VERDICTS:
        assert verdict in table.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--vocab", "1"], "vocab"),
        (["--importance", "some"], "importance"),
        (["--ref-distance", "-1"], "ref_distance"),
        (["--json", "--csv"], "--json"),
    ],
)
def test_cli_bad_options_raise_user_error(args, needle):
    out = run_cli(*args)
    if "--json" in args:  # the refusal as JSON on stdout, exit 2 (tests/unit/test_framework_files.py)
        assert out.exit_code == 2 and needle in json.loads(out.stdout)["error"]
        return
    assert isinstance(out.exception, UserError)
    assert needle in str(out.exception)


def test_cli_exit_code_2_without_traceback():
    def klsweep_audit(*args):
        cmd = [sys.executable, "-m", "klsweep.cli", "audit", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])

    out = klsweep_audit("--vocab", "1", "--importance", "some")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "vocab" in out.stderr and "'some'" in out.stderr and "2 problems" in out.stderr
    out = klsweep_audit("--length", "x")  # typer's own parse error
    assert out.returncode == 2 and "length" in out.stderr


def test_cached_audit_is_the_audit_and_survives_a_damaged_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KLSWEEP_CACHE", str(tmp_path))
    fresh = audit.audit()
    first = audit.cached_audit()
    (entry,) = (tmp_path / "audit").glob("*.json")
    assert first == fresh
    assert audit.cached_audit() == fresh  # read back from the file
    entry.write_text("{not json")
    assert audit.cached_audit() == fresh  # recomputed, not trusted
    assert audit.cached_audit(behavior_shift=0.5) != fresh  # options are part of the key


# ------------------------------------------------------------------------------------------------ GRPO audit


def grpo_rows(**options) -> dict[tuple[str, str, str, str, str], audit.GRPOAuditRow]:
    return {
        (r.estimator, r.placement, r.level, r.reward_mode, r.scale_rewards): r
        for r in audit.grpo_audit(**options)
    }


@pytest.mark.parametrize("beta", [1e-3, 0.1, 1.0, 10.0])
def test_separate_k1_in_the_reward_has_scale_one_at_any_beta(beta):
    rows = grpo_rows(beta=beta, scale_rewards="all", vocab=2, length=2)
    for scale in grpo.SCALE_REWARDS:
        for level in kl.LEVELS:
            r = rows["k1", "reward", level, "separate", scale]
            assert r.effective_scale == pytest.approx(1.0, abs=1e-6)
            assert r.cos_reverse == pytest.approx(1.0, abs=1e-6)
            assert r.verdict == "exact"
        # the same estimator in both places: the total derivative, at the policy loss's unit (token level)
        assert rows["k3", "both", "token", "separate", scale].verdict == "exact"


def test_separate_k1_in_the_reward_has_scale_one_on_the_default_policy():
    rows = grpo_rows(beta=0.1)  # V=3, L=2, G=4, dapo, group scaling
    r = rows["k1", "reward", "token", "separate", "group"]
    assert abs(r.effective_scale - 1) < 1e-6 and abs(r.cos_reverse - 1) < 1e-6


def test_shaped_without_std_is_scaled_by_one_minus_one_over_g():
    """The inclusive group mean: E[(x_i - mean_j x_j) grad log pi(y_i)] = (1 - 1/G) E[x_i grad log pi(y_i)]."""
    for g in (2, 4, 5):
        r = grpo_rows(group_size=g, vocab=2, length=2, scale_rewards="none", reward_mode="shaped")
        row = r["k1", "reward", "token", "shaped", "none"]
        assert row.effective_scale == pytest.approx(1 - 1 / g, abs=1e-9)
        assert row.cos_reverse == pytest.approx(1.0, abs=1e-9) and row.verdict == "rescaled"


def test_shaped_with_group_scaling_amplifies_small_betas():
    """Normalised with the task reward, the penalty's weight per unit beta grows as beta shrinks."""
    scales = [
        grpo_rows(beta=b, reward_mode="shaped")["k1", "reward", "token", "shaped", "group"].effective_scale
        for b in (0.01, 0.1, 1.0)
    ]
    assert scales[0] > scales[1] > scales[2] and scales[0] > 5
    separate = [
        grpo_rows(beta=b, reward_mode="separate")[
            "k1", "reward", "token", "separate", "group"
        ].effective_scale
        for b in (0.01, 1.0)
    ]
    assert separate == pytest.approx([1.0, 1.0], abs=1e-9)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "luspo", "dr_grpo"])
def test_sequence_level_loss_is_per_sequence_and_token_level_per_token(loss_type):
    """k2 in the loss at sequence level is the reverse-KL gradient, divided by sequences: scale = L under a
    per-token aggregation, 1 under luspo (sum over tokens, mean over sequences)."""
    length = 3
    rows = grpo_rows(vocab=2, length=length, loss_type=loss_type, reward_mode="separate")
    r = rows["k2", "loss", "sequence", "separate", "group"]
    assert r.effective_scale == pytest.approx(1.0 if loss_type == "luspo" else length, rel=1e-9)
    assert r.cos_reverse == pytest.approx(1.0, abs=1e-9)
    assert rows["k1", "loss", "token", "separate", "group"].verdict == "zero in expectation"
    assert rows["k1", "reward", "token", "separate", "group"].verdict == "exact"


def test_groups_matter_only_for_batch_scaling():
    policy = audit.TabularPolicy.random(2, 2, 0, 1.0, 0.0)
    reward = audit.task_reward_table(4, 0)
    probs = policy.token_logp(policy.theta).sum(-1).exp()
    config = kl.KLConfig("k3", "both", "token", beta=0.3, reward_mode="shaped")
    expected = {}
    for groups in (1, 2):
        seqs, p = audit.enumerate_steps(probs, 3, groups)
        assert p.sum().item() == pytest.approx(1.0, abs=1e-12)
        for scale in grpo.SCALE_REWARDS:
            expected[scale, groups] = audit.grpo_gradients(policy, reward, seqs, config, 3, scale, "dapo", p)
    for scale in ("group", "none"):
        torch.testing.assert_close(expected[scale, 1], expected[scale, 2], rtol=1e-10, atol=1e-14)
    assert not torch.allclose(expected["batch", 1], expected["batch", 2])
    torch.testing.assert_close(expected["batch", 1], expected["group", 1], rtol=1e-10, atol=1e-14)


def test_multisets_weigh_steps_like_ordered_enumeration():
    """The multiset enumeration gives the expectation of every order-blind function of a step that the
    enumeration of every ordered step gives."""
    import itertools

    probs = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    g, groups = 2, 2
    seqs, p = audit.enumerate_steps(probs, g, groups)
    values = torch.tensor([1.0, -2.0, 5.0], dtype=torch.float64)

    def f(step: torch.Tensor) -> torch.Tensor:  # order-blind within and across groups, not separable
        groups_sum = values[step].view(*step.shape[:-1], groups, g).sum(-1)
        return groups_sum.max(-1).values * values[step].std(-1)

    ordered = torch.tensor(list(itertools.product(range(3), repeat=g * groups)))
    p_ordered = probs[ordered].prod(-1)
    assert (p @ f(seqs)).item() == pytest.approx((p_ordered @ f(ordered)).item(), rel=1e-12)


@pytest.mark.parametrize(
    ("estimator", "placement", "level", "reward_mode", "scale"),
    [
        ("k1", "reward", "token", "shaped", "group"),
        ("k3", "both", "sequence", "separate", "group"),
        ("k3", "reward", "token", "shaped", "batch"),
        ("k2", "both", "token", "shaped", "none"),
    ],
)
def test_grpo_audit_agrees_with_monte_carlo(estimator, placement, level, reward_mode, scale):
    """Sample steps of the tabular policy, compute each one's update with the same objective, average: the
    exact expectation lies within a few standard errors, for the update and the effective KL gradient."""
    policy = audit.TabularPolicy.random(3, 2, 1, 1.0, 0.0)
    reward = audit.task_reward_table(9, 1)
    probs = policy.token_logp(policy.theta).sum(-1).exp()
    g, groups = 4, 2 if scale == "batch" else 1
    config = kl.KLConfig(estimator, placement, level, beta=0.2, reward_mode=reward_mode)
    zero = kl.KLConfig(estimator, placement, level, beta=0.0, reward_mode=reward_mode)
    seqs, p = audit.enumerate_steps(probs, g, groups)
    exact = audit.grpo_gradients(policy, reward, seqs, config, g, scale, "dapo", p)
    exact_kl = (exact - audit.grpo_gradients(policy, reward, seqs, zero, g, scale, "dapo", p)) / 0.2

    gen = torch.Generator().manual_seed(0)
    n = 20_000
    sampled = torch.multinomial(probs, n * g * groups, replacement=True, generator=gen).view(n, g * groups)
    per_step = audit.grpo_gradients(policy, reward, sampled, config, g, scale, "dapo")
    per_step_kl = (per_step - audit.grpo_gradients(policy, reward, sampled, zero, g, scale, "dapo")) / 0.2
    for mc, want in ((per_step, exact), (per_step_kl, exact_kl)):
        mean, se = mc.mean(0), mc.std(0) / n**0.5
        z = (mean - want).abs() / se.clamp(min=1e-12)
        assert z.max() < 4.5, z
        assert (mean - want).norm() < 0.1 * want.norm()  # and the signal is well above the noise


def test_grpo_audit_rejects_bad_options_together():
    with pytest.raises(UserError) as info:
        audit.grpo_audit(
            group_size=1, beta=0.0, scale_rewards="groups", reward_mode="normalised", loss_type="vespo"
        )
    where = {p.where for p in info.value.problems}
    assert where == {"group_size", "beta", "scale_rewards", "reward_mode", "loss_type"}
    text = str(info.value)
    assert "separate, shaped, all" in text and "group, batch, none, all" in text
    with pytest.raises(UserError, match="at most"):
        audit.grpo_audit(vocab=3, length=3, group_size=8, scale_rewards="batch")


def test_cli_grpo_json_rows_carry_the_keys():
    out = run_cli("--grpo", "--json", "--vocab", "2", "--scale-rewards", "none", "--beta", "0.5")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert len(rows) == 36
    for key in (
        "estimator",
        "placement",
        "level",
        "reward_mode",
        "scale_rewards",
        "effective_scale",
        "cos_reverse",
        "cos_forward",
    ):
        assert all(key in r for r in rows), key
    want = audit.rows_as_dicts(audit.grpo_audit(vocab=2, scale_rewards="none", beta=0.5))
    assert rows == want


def test_cli_grpo_table_fits_80_columns_piped_and_in_a_terminal():
    import os
    import re

    cmd = [sys.executable, "-m", "klsweep.cli", "audit", "--grpo", "--vocab", "2"]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TTY_COMPATIBLE", "NO_COLOR")}
    for extra in ({}, {"COLUMNS": "80", "TTY_COMPATIBLE": "1"}):  # piped; a terminal 80 columns wide
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**env, **extra}, cwd=REPO)
        assert out.returncode == 0, out.stderr
        text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout)
        assert ("\x1b[" in out.stdout) == bool(extra)  # colours only in the terminal
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= 80
        assert any(line.split()[:4] == ["k1", "reward", "token", "1.000"] for line in lines)
        assert "reward_mode separate, scale_rewards group" in text
        assert "reward_mode shaped, scale_rewards group" in text
        assert "E[grad L(beta)]" in text  # not eaten as markup
    off = subprocess.run(
        [*cmd, "--behavior-shift", "0.5"], capture_output=True, text=True, timeout=120, env=env
    )
    assert off.returncode == 0, off.stderr
    assert max(len(line) for line in off.stdout.splitlines()) <= 80
    assert "off-policy (behaviour shift 0.5)" in off.stdout
    assert "reward_logp current, importance sequence" in off.stdout


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--beta", "0.1"], ["--beta", "without --grpo"]),
        (["--grpo", "--importance", "tokens"], ["importance", "none, token, sequence, all"]),
        (
            ["--grpo", "--behavior-shift", "0.5", "--loss-type", "cispo"],
            ["loss_type", "not audited off-policy"],
        ),
        (["--reward-logp", "current"], ["--reward-logp", "without --grpo"]),
        (["--grpo", "--reward-mode", "normalised", "--group-size", "1"], ["reward_mode", "group_size"]),
    ],
)
def test_cli_grpo_bad_options_exit_2(args, needles):
    cmd = [sys.executable, "-m", "klsweep.cli", "audit", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    for needle in needles:
        assert needle in out.stderr


# --- the GRPO audit off-policy ----------------------------------------------------------------------------

OFF_POLICY_EXACT = {("k1", "reward"), ("k1", "both"), ("k3", "both")}  # with current + sequence weights


def test_cli_grpo_off_policy_json_has_every_reward_logp_and_importance_and_only_current_sequence_is_exact():
    """The issue's "done when": token-level separate rows for k1/k3 x reward/loss/both x reward_logp x
    importance; current + sequence exact (scale 1, cosine 1 to 1e-6) for k1 in the reward, k1 in both, k3 in
    both; behaviour + none visibly not."""
    out = run_cli("--grpo", "--behavior-shift", "0.5", "--json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    for key in ("reward_logp", "importance", "behavior_shift", "estimator", "placement", "level"):
        assert all(key in r for r in rows), key
    table = {
        (r["estimator"], r["placement"], r["reward_logp"], r["importance"]): r
        for r in rows
        if r["level"] == "token" and r["reward_mode"] == "separate" and r["estimator"] in ("k1", "k3")
    }
    assert set(table) == {
        (e, p, lp, imp)
        for e in ("k1", "k3")
        for p in kl.PLACEMENTS
        for lp in kl.REWARD_LOGPS
        for imp in kl.IMPORTANCE
    }
    assert {r["behavior_shift"] for r in rows} == {0.5}
    for estimator, placement in OFF_POLICY_EXACT:
        exact = table[estimator, placement, "current", "sequence"]
        assert abs(exact["effective_scale"] - 1) < 1e-6 and exact["cos_reverse"] > 1 - 1e-6
        assert exact["verdict"] == "exact"
        today = table[estimator, placement, "behavior", "none"]
        assert today["rel_err_reverse"] > 0.1 and today["verdict"] != "exact"
        # no weight, or token weights: not exact either
        for imp in ("none", "token"):
            assert table[estimator, placement, "current", imp]["rel_err_reverse"] > 1e-3
    assert audit.rows_as_dicts(audit.grpo_audit(behavior_shift=0.5)) == rows


def test_grpo_audit_reward_logp_and_importance_change_nothing_on_policy():
    base = audit.grpo_audit(scale_rewards="none", reward_mode="separate")
    assert {(r.reward_logp, r.importance, r.behavior_shift) for r in base} == {("current", "none", 0.0)}
    for reward_logp in kl.REWARD_LOGPS:
        for importance in kl.IMPORTANCE:
            rows = audit.grpo_audit(
                scale_rewards="none", reward_mode="separate", reward_logp=reward_logp, importance=importance
            )
            for a, b in zip(rows, base, strict=True):
                assert a.effective_scale == pytest.approx(b.effective_scale, abs=1e-12)
                assert a.verdict == b.verdict


def test_grpo_audit_off_policy_sequence_weights_give_the_on_policy_table():
    """Sequence weights outside the clipped ratio restore every configuration's on-policy expected update."""
    on = {(r.estimator, r.placement, r.level): r for r in audit.grpo_audit(reward_mode="separate", seed=1)}
    off = audit.grpo_audit(
        reward_mode="separate", seed=1, behavior_shift=1.0, reward_logp="current", importance="sequence"
    )
    for r in off:
        want = on[r.estimator, r.placement, r.level]
        assert r.effective_scale == pytest.approx(want.effective_scale, abs=1e-9)
        assert r.verdict == want.verdict


def test_grpo_audit_capped_weights_bring_bias_back():
    def k1_reward(cap: float) -> audit.GRPOAuditRow:
        rows = audit.grpo_audit(
            reward_mode="separate",
            behavior_shift=0.5,
            reward_logp="current",
            importance="sequence",
            importance_cap=cap,
        )
        return next(r for r in rows if (r.estimator, r.placement, r.level) == ("k1", "reward", "token"))

    assert k1_reward(1e6).verdict == "exact"  # a cap no weight reaches
    capped = k1_reward(2.0)
    assert capped.importance_cap == 2.0 and capped.verdict != "exact" and capped.rel_err_reverse > 1e-3


@pytest.mark.parametrize(
    ("estimator", "placement", "reward_logp", "importance"),
    [
        ("k1", "reward", "current", "sequence"),
        ("k3", "both", "behavior", "none"),
        ("k3", "both", "current", "token"),
    ],
)
def test_grpo_audit_off_policy_agrees_with_monte_carlo(estimator, placement, reward_logp, importance):
    """Steps sampled from the behaviour policy, each one's update by the same objective (clipped ratio
    against mu), averaged: the exact expectation lies within a few standard errors."""
    policy = audit.TabularPolicy.random(3, 2, 1, 1.0, 0.5)
    reward = audit.task_reward_table(9, 1)
    mu = policy.token_logp(policy.behavior).sum(-1).exp()
    g = 4
    config = kl.KLConfig(estimator, placement, beta=0.2, reward_logp=reward_logp, importance=importance)
    zero = kl.KLConfig(estimator, placement, beta=0.0)
    seqs, p = audit.enumerate_steps(mu, g)

    def kl_part(steps, weights=None):
        args = (policy, reward, steps)
        beta = audit.grpo_gradients(*args, config, g, "group", "dapo", weights, None, True)
        return (beta - audit.grpo_gradients(*args, zero, g, "group", "dapo", weights, None, True)) / 0.2

    exact = kl_part(seqs, p)
    n = 20_000
    gen = torch.Generator().manual_seed(0)
    sampled = torch.multinomial(mu, n * g, replacement=True, generator=gen).view(n, g)
    mc = kl_part(sampled)
    mean, se = mc.mean(0), mc.std(0) / n**0.5
    z = (mean - exact).abs() / se.clamp(min=1e-12)
    assert z.max() < 4.5, z
    assert (mean - exact).norm() < 0.1 * exact.norm()


def test_kl_md_off_policy_table_is_the_audits():
    """docs/KL.md's off-policy table, regenerated from `klsweep audit --grpo --behavior-shift 0.5`."""
    options = {"behavior_shift": 0.5, "reward_mode": "separate"}
    rows = {
        (r.estimator, r.placement, r.level, r.reward_logp, r.importance): r
        for r in audit.grpo_audit(**options)
    }
    capped = audit.grpo_audit(**options, reward_logp="current", importance="sequence", importance_cap=2.0)
    capped = {(r.estimator, r.placement, r.level): r for r in capped}
    columns = [("behavior", "none"), ("behavior", "sequence"), *(("current", i) for i in kl.IMPORTANCE)]

    def cell(r: audit.GRPOAuditRow, err: bool = False) -> str:
        if r.rel_norm < audit.TOL:
            return "0"
        if r.verdict == "exact":
            return "**1.000 (1.000)**"
        return f"{r.effective_scale:.3f} ({r.cos_reverse:.3f})" + (
            f", err {r.rel_err_reverse:.3f}" if err else ""
        )

    text = (REPO / "docs" / "KL.md").read_text()
    for level in kl.LEVELS:
        for estimator in ("k1", "k3"):
            for placement in kl.PLACEMENTS:
                if level == "sequence" and placement == "loss":
                    continue
                name = f"{estimator} in both" if placement == "both" else f"{estimator} in the {placement}"
                name += ", sequence" if level == "sequence" else ""
                cells = [cell(rows[estimator, placement, level, *c]) for c in columns]
                cells.append(cell(capped[estimator, placement, level], err=True))
                assert f"| {name} | {' | '.join(cells)} |" in text, name


def test_cached_audit_recomputes_an_entry_of_the_wrong_types(tmp_path, monkeypatch) -> None:
    import json

    monkeypatch.setenv("KLSWEEP_CACHE", str(tmp_path))
    fresh = audit.cached_audit()
    (entry,) = (tmp_path / "audit").glob("*.json")
    rows = json.loads(entry.read_text())
    for damaged in (
        [],
        {"a": 1},
        [dict(rows[0], rel_err_reverse="0.1")],
        [dict(rows[0], verdict=3)],
        [rows[0] | {"x": 1}],
    ):
        entry.write_text(json.dumps(damaged))
        assert audit.cached_audit() == fresh, damaged  # valid JSON, wrong shape: recomputed, not trusted


def test_cached_audit_on_a_read_only_cache_warns_and_gives_the_audit(tmp_path, monkeypatch) -> None:
    from mounts import read_only

    from klsweep.audit.cache import CacheWarning

    fresh = audit.audit()
    with read_only(tmp_path / "ro") as cache:
        monkeypatch.setenv("KLSWEEP_CACHE", str(cache))
        with pytest.warns(CacheWarning, match="not written"):
            assert audit.cached_audit() == fresh
        assert not any(cache.iterdir())


def test_grpo_audit_models_the_advantage_estimator_a_framework_file_selects(tmp_path):
    """verl's RLOO with the KL in the reward trains beta x E[KL_hat grad log pi] exactly (the leave-one-out
    baseline is independent of the sample, and nothing is divided by a std): the audit says exact, where
    the group-std model said "scale 157.7, cos 0.84, biased". Its Dr.GRPO (no std) rescales by 1 - 1/G. An
    estimator the audit cannot model is said, with the plain estimator audit alone."""
    from klsweep.audit.frameworks import audit_config

    def audit(*lines):
        path = tmp_path / "overrides.txt"
        path.write_text("\n".join(("algorithm.use_kl_in_reward=true", *lines)) + "\n")
        return audit_config("verl", path)

    out, rows = audit("algorithm.adv_estimator=rloo")
    assert [(r.advantage, r.verdict) for r in rows] == [("rloo", "exact")]
    out, rows = audit("algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=false")
    assert [r.verdict for r in rows] == ["rescaled"] and abs(rows[0].effective_scale - 0.75) < 1e-9
    out, rows = audit("algorithm.adv_estimator=opo")
    assert rows and not hasattr(rows[0], "advantage")  # the estimator audit's rows
    assert any("cannot model opo" in w for w in out["warnings"])


def test_the_audit_header_says_what_v_l_and_the_ref_distance_are(monkeypatch, capsys):
    """`audit --preset`'s header `V=3, L=3, seed=0, ref distance 1.0` is explained in one line (it never was)."""
    from clitools import cli

    code, out, _ = cli(["audit", "--preset", "verl"], monkeypatch, capsys)
    flat = " ".join(out.split())
    assert code == 0 and "ref distance 1.0" in flat
    assert "V=3: a tabular policy over 3 tokens; L=3: completions of 3 tokens, all 27 enumerated" in flat, (
        flat
    )
    assert "the reference's logits are the policy's + 1 x standard normal noise" in flat, flat


@pytest.mark.parametrize("columns", [80, 200])
def test_the_preset_table_says_what_sets_two_rows_apart(monkeypatch, capsys, columns):
    """`audit --preset all` read `nemo k3 loss token` and `verl k3 loss token`, `slime` and `slime-unbiased`, as
    the same configuration (what differs only in docs/KL.md): their importance weight, clamps and gradient form
    are shown, in the table's columns where the width holds them, else in a table of their own, with what
    each means."""
    from clitools import cli

    code, out, _ = cli(["audit", "--preset", "all"], monkeypatch, capsys, columns=columns)
    assert code == 0
    rows: dict[str, list[str]] = {}
    for line in out.splitlines():  # every line of a preset, in either table
        words = line.split()
        if words and words[0] in ("nemo", "verl", "verl-k3plus", "slime", "slime-unbiased", "trl"):
            rows.setdefault(words[0], []).extend(w for w in words[1:] if not w.replace(".", "").isdigit())
    assert "self+grad" in rows["nemo"] and "sg(w)" in rows["nemo"] and "d±20" in rows["verl"]
    assert "w·k±10" in rows["nemo"] and "k±10" in rows["verl"] and "st" in rows["verl-k3plus"]
    assert "token+grad" in rows["slime-unbiased"] and "token+grad" not in rows["slime"]
    assert len({" ".join(words) for words in rows.values()}) == len(rows)  # no two read the same
    flat = " ".join(out.split())
    for said in ("weight: the loss half's importance weight", "clamp: d±c: the log-ratio d clamped",
                 "form: st: straight-through"):  # fmt: skip
        assert said in flat, said
    assert (columns == 80) == ("what sets the presets apart" in flat)
