"""Synthetic finished sweeps for the report's tests: run folders as training and evaluation write them
(config.yaml, status.json, metrics.jsonl, eval/<hash>/<checkpoint>/results.json, the step-0 baseline), with
curves and scores drawn from a seeded generator, for any grid of configurations."""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import asdict
from itertools import product
from pathlib import Path
from typing import Any

import yaml

from klsweep import store
from klsweep.config import RunConfig
from klsweep.evaluate import as_eval_section, eval_settings

HASH = "5ynth3t1c0"


def tiny_grid() -> list[dict[str, Any]]:
    """The shape of sweeps/tiny.yaml: k1, k3 x reward, loss, both x lag 0, 4 (beta 0.1, token level) and the
    no-KL baseline at lag 0 and 4: 14 configurations."""
    grid = [
        {"kl.estimator": e, "kl.placement": p, "offpolicy.lag": lag, "kl.beta": 0.1}
        for e, p, lag in product(["k1", "k3"], ["reward", "loss", "both"], [0, 4])
    ]
    return grid + [{"kl.beta": 0.0, "offpolicy.lag": lag} for lag in (0, 4)]


def wide_grid() -> list[dict[str, Any]]:
    """k1, k2, k3 x reward, loss, both x lag 0, 2, 4, 8, plus no KL per lag: 40 configurations."""
    grid = [
        {"kl.estimator": e, "kl.placement": p, "offpolicy.lag": lag, "kl.beta": 0.1}
        for e, p, lag in product(["k1", "k2", "k3"], ["reward", "loss", "both"], [0, 2, 4, 8])
    ]
    return grid + [{"kl.beta": 0.0, "offpolicy.lag": lag} for lag in (0, 2, 4, 8)]


def _set(config: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
        node = node[p]
    node[leaf] = value


def write_sweep(
    sweep: Path,
    grid: list[dict[str, Any]],
    seeds: int = 2,
    steps: int = 60,
    in_domain: tuple[str, ...] = ("tiny_add",),
    ood: tuple[str, ...] = ("tiny_sub", "tiny_rev"),
    seed: int = 0,
) -> Path:
    """Write every configuration of ``grid`` (dotted overrides of RunConfig) x ``seeds`` as finished, evaluated
    runs of ``sweep``, and a step-0 baseline per model. Returns ``sweep``.

    A configuration may also set its truth (keys starting with "_", not config keys): ``_skill`` (the mean eval
    score; default drawn from U(0.2, 0.8)), ``_noise`` (the seeds' eval spread, default 0.05), ``_kl`` (the
    slope of the KL curves per step), ``_collapse`` (True: the reward falls to ~0 after 60% of the steps)."""
    rng = random.Random(seed)
    models: dict[str, dict[str, Any]] = {}
    for ci, overrides in enumerate(grid):
        skill = rng.uniform(0.2, 0.8)
        truth = {k: overrides[k] for k in overrides if k.startswith("_")}
        overrides = {k: v for k, v in overrides.items() if not k.startswith("_")}
        skill = truth.get("_skill", skill)
        kl_slope = truth.get("_kl", 0.002 + 0.001 * ci)
        for s in range(seeds):
            config = asdict(RunConfig())
            config["name"], config["seed"] = sweep.name, s
            config["train"]["steps"] = steps
            config["eval"] |= {"suite": "tiny", "in_domain": list(in_domain), "ood": list(ood)}
            for key, value in overrides.items():
                _set(config, key, value)
            run_id = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]
            run = sweep / run_id
            run.mkdir(parents=True)
            (run / store.CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
            rows = []
            for step in range(1, steps + 1):
                reward = skill * min(1.0, step / (steps / 2)) + rng.gauss(0, 0.03)
                if truth.get("_collapse") and step > 0.6 * steps:
                    reward = 0.01 * skill
                rows.append(
                    json.dumps(
                        {
                            "step": step,
                            "time": 1.7e9 + step,
                            "elapsed_s": float(step),
                            "reward_mean": reward,
                            "kl_k1": kl_slope * step + rng.gauss(0, 0.002),
                            "kl_k3": kl_slope / 2 * step * (1 + rng.gauss(0, 0.05) if "_kl" in truth else 1),
                            "entropy": 1.0 + 0.5 * math.exp(-step / (20 + ci)),
                            "loss": 0.0,
                        }
                    )
                )
            (run / store.METRICS_FILE).write_text("\n".join(rows) + "\n")
            store.write_json(run / store.STATUS_FILE, {"state": "done", "step": steps, "total_steps": steps})
            noise = truth.get("_noise", 0.05)
            values = {t: min(1.0, max(0.0, skill + rng.gauss(0, noise))) for t in (*in_domain, *ood)}
            _write_eval(run, f"checkpoint-{steps}", steps, values, in_domain, ood, _settings(config))
            models.setdefault(config["model"]["name"], config)
    for name, config in models.items():
        base = sweep / store.BASELINE_DIR / name.replace("/", "--")
        base.mkdir(parents=True)
        (base / store.CONFIG_FILE).write_text(yaml.safe_dump({"model": config["model"]}, allow_unicode=True))
        values = dict.fromkeys((*in_domain, *ood), 0.2)
        _write_eval(base, "step-0", 0, values, in_domain, ood, _settings(config))
    return sweep


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    """The eval settings results.json records for a run of ``config`` (what the report matches its grid's by)."""
    return eval_settings(as_eval_section(config["eval"]))


def _write_eval(
    folder: Path,
    checkpoint: str,
    step: int,
    values: dict[str, float],
    in_domain: tuple,
    ood: tuple,
    settings: dict[str, Any],
) -> None:
    store.write_json(
        folder / store.EVAL_DIR / HASH / checkpoint / "results.json",
        {
            "suite": "tiny",
            "eval_hash": HASH,
            "checkpoint": checkpoint,
            "step": step,
            "backend": "hf",
            "metric": "exact_match",
            "metrics": {
                "in_domain": {t: values[t] for t in in_domain},
                "ood": {t: values[t] for t in ood},
            },
            "stderr": dict.fromkeys(values, 0.01),
            "settings": settings,
            "lm_eval_version": "0.4.13",
            "created_at": 1.7e9,
        },
    )
