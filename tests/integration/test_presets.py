"""The framework presets (klsweep/conf/preset/) against real TRL on an untrained tiny model: the ``trl`` and
``trl-sequence`` presets have the loss and gradient of TRL 1.16's own KL (``use_bias_correction_kl``, token and
sequence importance level, on- and off-policy), and every preset trains in a tiny grid (``klsweep.grid`` ->
``job.train_run``), logging the share of clamped tokens where it clamps and the scheduled beta where it
decays."""

from __future__ import annotations

import math

import pytest
import torch
from runfiles import TRAIN  # tests/ is on sys.path under pytest
from test_trainer import (  # tests/integration is on sys.path under pytest
    assert_grads_close,
    behaviour_logps,
    dataset,  # noqa: F401 (a fixture)
    generate,
    length_reward,
    loss_and_grads,
    make_trainer,
    model_dir,  # noqa: F401 (a fixture)
    perturb_alike,
)

from klsweep import presets


@pytest.mark.parametrize(
    ("preset", "level", "loss_type", "stale"),
    [
        ("trl", "token", "dapo", False),
        ("trl", "token", "grpo", True),
        ("trl-sequence", "sequence", "grpo", False),
        ("trl-sequence", "sequence", "grpo", True),
    ],
)
def test_trl_preset_trains_what_trl_trains(model_dir, dataset, tmp_path, preset, level, loss_type, stale):  # noqa: F811
    """TRL's GRPOTrainer with its KL on (beta, use_bias_correction_kl: its default) and KLGRPOTrainer with the
    preset, the same batch: the same loss and gradients. ``stale``: the batch's old log-probs are another
    policy's (off-policy: coef_1 != 1); sequence level: TRL's coef_1 is the sequence's mean log-ratio (#6586)."""
    config = presets.kl_config(preset)
    options = dict(loss_type=loss_type, importance_sampling_level=level)
    trl = make_trainer(model_dir, dataset, tmp_path / "trl", None, beta=config.beta, **options)
    assert trl.args.use_bias_correction_kl  # TRL's default
    ours = make_trainer(model_dir, dataset, tmp_path / "ours", config, **options)
    perturb_alike(trl.model, ours.model)
    inputs_trl, inputs_ours = generate(trl, dataset), generate(ours, dataset)
    assert torch.equal(inputs_trl["completion_ids"], inputs_ours["completion_ids"])
    if stale:
        old = behaviour_logps(trl, inputs_trl) + 0.2 * torch.randn_like(inputs_trl["completion_mask"].float())
        inputs_trl["old_per_token_logps"] = old
        inputs_ours["old_per_token_logps"] = old.clone()
    loss_trl, grads_trl = loss_and_grads(trl, inputs_trl)
    loss_ours, grads_ours = loss_and_grads(ours, inputs_ours)
    torch.testing.assert_close(loss_ours, loss_trl, rtol=1e-5, atol=1e-7)
    scale = max(g.abs().max().item() for g in grads_trl)
    assert scale > 1e-4
    assert_grads_close(grads_ours, grads_trl, rtol=1e-5, atol=1e-6 * scale)

    # and not what the detached weights (the trl preset before this fix) train
    import dataclasses

    ours.kl = dataclasses.replace(config, importance_gradient=False)
    _, grads_detached = loss_and_grads(ours, inputs_ours)
    gap = max((a - b).abs().max().item() for a, b in zip(grads_detached, grads_trl, strict=True))
    assert gap > 1e-3 * scale


def test_every_preset_trains_in_a_tiny_grid(tmp_path, model_dir, monkeypatch):  # noqa: F811
    """A grid of every preset on-policy, of the importance-weighted ones at a lag of one step, and verl's abs
    estimator: each run trains to the end with finite KL metrics; clamping presets log ``kl/clamped`` in [0, 1], PipelineRL with
    its final_kl_coef set its decaying ``kl/beta``."""
    from klsweep import job, store, tasks
    from klsweep.config import write_run
    from klsweep.grid import load_plan

    monkeypatch.setattr(tasks, "reward_function", lambda task: length_reward)
    names = presets.names()
    weighted = [n for n in names if presets.kl_config(n).importance not in ("none", "self")]
    grid = tmp_path / "presets.yaml"
    base = {"model": "tiny", "task": "tiny", "eval": "none", "cluster": "local", **TRAIN, "train.steps": 3}
    base.pop("kl.beta")  # each preset's own
    lines = ["name: presettest", "base:"]
    lines += [f"  {k}: {v}" for k, v in base.items()] + [f"  model.path: {model_dir}"]
    lines += ["grid:", f"  - {{preset: [{', '.join(names)}], offpolicy.lag: 0}}"]
    lines += [f"  - {{preset: [{', '.join(weighted)}], offpolicy.lag: 1}}"]
    lines += ["  - {preset: verl, kl.estimator: abs, offpolicy.lag: 0}"]  # verl's abs
    lines += ["  - {preset: pipelinerl, kl.beta_final: 0.0001, offpolicy.lag: 0}"]  # its final_kl_coef
    grid.write_text("\n".join(lines) + "\n")
    plan = load_plan(grid, out=tmp_path / "results")
    # presets that train the same (verl's and SkyRL's k3) are one run
    distinct = [len({presets.kl_config(n) for n in group}) for group in (names, weighted)]
    assert len(plan.runs) == sum(distinct) + 2 and distinct[0] < len(names)
    decayed = 0
    for run in plan.runs:
        write_run(run.run_dir, run.config)
        status = job.train_run(run.run_dir)
        assert status["state"] == "done", (run.params, status.get("error"))
        rows = store.read_metrics(run.run_dir)
        assert [r["step"] for r in rows] == [1, 2, 3]
        config = presets.kl_config(run.params["preset"])  # either of merged presets: the same
        for row in rows:
            assert math.isfinite(row["kl_penalty"]) and math.isfinite(row["loss"]), run.params
            if config.log_ratio_clamp or config.value_clamp:
                assert 0 <= row["kl/clamped"] <= 1
            else:
                assert "kl/clamped" not in row
        if run.config["kl"]["beta_final"] is not None:
            betas = [r["kl/beta"] for r in rows]
            assert betas[0] == pytest.approx(config.beta) and betas[-1] < betas[0]
            decayed += 1
    assert decayed == 1


def test_report_audit_table_names_presets_and_audits_their_forms():
    """The report's audit table: a run with the trl preset's configuration is labelled `trl` and audited with
    its weight's gradient (the preset audit's numbers), in a row apart from the same settings with a detached
    weight (no preset); k1 in the reward at beta 0.1 is the paper's preset, audited as before."""
    import dataclasses

    import pandas as pd
    from test_report import audit_run

    from klsweep import audit
    from klsweep.report.audit_table import audit_table

    trl = {f"kl.{k}": v for k, v in dataclasses.asdict(presets.kl_config("trl")).items()}
    detached = trl | {"kl.importance_gradient": False}
    runs = pd.DataFrame([audit_run(0, **trl), audit_run(1, **detached), audit_run(2), audit_run(3, **trl)])
    table = audit_table(runs)
    assert list(table.columns[:2]) == ["preset", "estimator"]
    by = {(r["preset"], r["KL form"]): r for _, r in table.iterrows()}
    trl_row = by["trl", "importance_gradient=True"]
    assert trl_row["runs"] == 2
    expected = audit.grpo_preset_audit(["trl"])[0]
    assert trl_row["effective scale"] == pytest.approx(expected.effective_scale, rel=1e-9)
    assert by["paper", "—"]["verdict"] == "exact"  # noqa: RUF001 (k1 in the reward at beta 0.1: the paper's)
    detached_row = by["—", "—"]  # noqa: RUF001 (the report's dash: no preset, klsweep's own forms)
    assert detached_row["estimator"] == "k3" and detached_row["runs"] == 1
    assert detached_row["effective scale"] != pytest.approx(expected.effective_scale, rel=1e-3)
