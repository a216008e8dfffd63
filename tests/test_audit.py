"""klsweep.audit and `klsweep audit`: exact expected gradients of every configuration, KL.md's verdict table,
off-policy importance weighting, and the command line."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from klsweep import audit, kl
from klsweep.errors import UserError

# KL.md, "What each configuration's expected gradient is, on-policy": the verdict column.
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
    assert isinstance(out.exception, UserError)
    assert needle in str(out.exception)


def test_cli_exit_code_2_without_traceback():
    def klsweep_audit(*args):
        cmd = [sys.executable, "-m", "klsweep.cli", "audit", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1])

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
