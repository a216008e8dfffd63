"""The report refuses a claim whose two sides share runs (issue #47 item 11), as the plan does: a claims file
given to `klsweep report --claims`, or a sweep planned before the plan refused them. Exit 2, the claim, its
runs and the filters that select them named, with the claims' other problems; nothing written."""

from __future__ import annotations

import sweepgen
from clitools import cli

from klsweep import store

KL = {"estimator": "k3", "placement": "loss", "beta": 0.1}
CLAIM = "  - {{name: {}, metric: in_domain, test: welch, direction: greater, a: {}, b: {}}}\n"


def test_a_claim_whose_sides_share_runs_is_refused_by_the_report(tmp_path, monkeypatch, capsys):
    grid = [
        {"kl.estimator": e, "kl.placement": p, "kl.beta": 0.1}
        for e in ("k1", "k3")
        for p in ("reward", "loss")
    ]
    sweep = sweepgen.write_sweep(tmp_path / "s", grid + [{"kl.beta": 0.0}], seeds=2, steps=10)
    k3_loss = sorted(  # with a KL term: the no-KL runs' KL keys (k3, loss by default) read as "no KL"
        d.name
        for d in store.run_dirs(sweep)
        if all(f"{k}: {v}\n" in (d / store.CONFIG_FILE).read_text() for k, v in KL.items())
    )
    claims = tmp_path / "claims.yaml"
    claims.write_text(
        "claims:\n"
        + CLAIM.format("crossing", "{kl.estimator: k3}", "{kl.placement: loss}")
        + CLAIM.format("no KL", "{kl.estimator: k1}", "{kl.beta: 0}")  # the no-KL runs are not k1's
        + "  - {name: typo, metric: in_domain, test: welsh, direction: greater, a: {seed: 0}, b: {seed: 1}}\n"
    )
    out = tmp_path / "r"
    code, _, err = cli(["report", sweep, "--out", out, "--claims", claims], monkeypatch, capsys)
    said = " ".join(err.split())
    assert code == 2 and "Traceback" not in err, err
    assert "invalid claims: 2 problems" in said, said
    assert "did you mean 'welch'" in said
    assert (
        f"claims (crossing).b: a and b overlap: 2 run(s) on both sides ({', '.join(k3_loss)}), those with "
        "kl.estimator: k3, kl.placement: loss" in said
    ), said
    assert "(no KL)" not in said and not (out / "report.md").exists()
