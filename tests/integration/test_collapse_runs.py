"""The reward-collapse rule on real runs: the tiny model with a policy that cannot move is never stopped, and a run
an earlier rule stopped stays collapsed in the report (the rule by simulation: tests/unit/test_collapse.py)."""

from __future__ import annotations

import time

import numpy as np

from klsweep import job, store


def test_a_policy_that_cannot_move_is_never_stopped(tmp_path):
    """Issue 27's runs: the tiny model with a learning rate of 1e-12 (k1 in the reward, beta 0.1, the default
    collapse settings and batch), 2 seeds x 150 steps: both end done, no step stopped as collapsed."""
    from omegaconf import OmegaConf

    from klsweep.config import RunConfig, write_run

    started = time.time()
    for seed in (0, 1):
        config = OmegaConf.structured(RunConfig)
        values = {
            "name": "frozen",
            "seed": seed,
            "model.path": "tiny",
            "train.steps": 150,
            "train.save_steps": 1000,
            "train.learning_rate": 1e-12,
            "kl.estimator": "k1",
            "kl.placement": "reward",
            "kl.beta": 0.1,
            "wandb.mode": "disabled",
        }
        for key, value in values.items():
            OmegaConf.update(config, key, value)
        run = tmp_path / f"s{seed}"
        write_run(run, OmegaConf.to_container(config))
        status = job.train_run(run)
        assert status["state"] == "done", status
        rows = store.read_metrics(run)
        assert len(rows) == 150 and all(r["reward_std"] is not None for r in rows)
        assert 0.05 < np.mean([r["reward_mean"] for r in rows]) < 0.9  # a reward that can fall
    print(f"2 frozen runs x 150 steps: {time.time() - started:.0f} s")


def test_a_run_an_earlier_rule_stopped_stays_collapsed_in_the_report(tmp_path):
    """Old run folders: a run whose trainer stopped it for a collapse (status.json) under an earlier version's
    rule is collapsed in the report at that step, though this rule finds no collapse in its curve."""
    import json
    import shutil
    from pathlib import Path

    from klsweep.report import build_report

    sweep = tmp_path / "sweep_tiny"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "sweep_tiny", sweep)
    status = {"state": "diverged", "step": 40, "total_steps": 40, "diverged_step": 40}
    status["reason"] = "reward collapse: mean task reward over the last 10 steps 0.2 < 0.5 x peak 0.45"
    (sweep / "a1-k1rew-s0" / store.STATUS_FILE).write_text(json.dumps(status))
    rep = build_report(sweep, tmp_path / "out", formats=("md",), wandb=False)
    runs = rep.runs.set_index("run")
    assert runs.loc["a1-k1rew-s0", "collapse_step"] == 40 and runs.loc["a1-k1rew-s0", "collapsed"]
    assert not runs.loc["a2-k1rew-s1", "collapsed"]  # its sibling, done: the rule alone decides
