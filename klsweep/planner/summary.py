"""What ``klsweep plan`` says of a plan: the counts, the resources and time tables' numbers (``summary``) and
the warnings (``warnings``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from klsweep import config as config_mod
from klsweep import cost, engines, fastgen, trlargs
from klsweep.planner import walltime
from klsweep.planner.check import check, run_label
from klsweep.planner.needs import AT_RISK, SIGNAL_MARGIN_S, Estimate, gpu_hours
from klsweep.planner.shape import model_type
from klsweep.printable import counted

if TYPE_CHECKING:
    from collections.abc import Mapping

    from klsweep.grid import Plan, PlannedRun


STORAGE_WARN_GB = 10 * 1024  # checkpoints past 10 TiB are flagged


def learning_rates(runs: list[PlannedRun]) -> list[str]:
    """The learning rates the runs train at, with their schedule and its warm-up (``3e-04 constant``,
    ``1e-04 constant_with_warmup (warm-up 30 steps)``: ``trlargs.schedule_text``): a model's config group may
    set its own (``klsweep/conf/model/tiny.yaml``), a grid's keys set theirs over it."""
    seen = {(float(t["learning_rate"]), trlargs.schedule_text(t)) for t in (r.config["train"] for r in runs)}
    return [text for _, text in sorted(seen)]


def _state(run_dir: Any) -> str | None:
    """A run's state as `klsweep run` decides by it: its status', but a done run whose final checkpoint is gone
    or not whole (``store.stale_end``) is not done (`run` trains it again)."""
    from klsweep import store

    status = store.read_status(run_dir)
    state = status.get("state")
    stale = store.stale_end(run_dir, status) is not None
    return "incomplete" if stale else state


def summary(plan: Plan) -> dict[str, Any]:
    """Counts of the plan (total, excluded, merged: configurations that train the same thing as a run of the plan,
    done: status.json says done or diverged under the out folder, failed: failed or cancelled, both skipped by
    ``klsweep run``, the second unless ``--retry-failed``; to submit: the others), the
    GPU-hours upper bound of the runs to submit, the checkpoint storage of every run, the largest per-GPU memory
    estimate, one row per model and launch shape (``resources``: runs, GPUs, sharding, micro-batch,
    learning rates, largest per-GPU estimate, GPU-hours, storage) and each run's estimate (``estimates``: run
    id -> ``Estimate``).
    Raises ``check``'s ``UserError``, and ``store.refuse_rehearsal``'s when the out folder holds a
    rehearsal."""
    from klsweep import store

    estimates = check(plan)
    store.refuse_rehearsal(plan.sweep_dir)  # its runs are not done, whatever they say: `run` refuses it
    # as `klsweep run` decides (submit.sweep): trained runs are skipped, failed and cancelled ones too unless
    # --retry-failed
    # only the runs whose folder exists have a status (one listing, not one open() per run of a large plan)
    present = set(os.listdir(plan.sweep_dir)) if os.path.isdir(plan.sweep_dir) else set()
    states = {r.id: _state(r.run_dir) if r.run_dir.name in present else "pending" for r in plan.runs}
    todo = [r for r in plan.runs if states[r.id] not in (*store.TRAINED_STATES, *store.STOPPED_STATES)]
    shapes: dict[tuple, list[PlannedRun]] = {}
    paths = generation_paths(plan)
    numerics = numerics_paths(plan)
    for run in plan.runs:
        c = run.config
        res = c["model"]["resources"]
        key = (
            c["model"].get("name"),
            f"{res.get('nodes', 1)}x{res.get('gpus_per_node', 0)}",
            c["train"].get("sharding", "none"),
            c["train"].get("micro_batch_size"),
            paths[run.id],
            numerics[run.id],
        )
        shapes.setdefault(key, []).append(run)
    resources = []
    for (model, gpus, sharding, micro, (generation, why), (computed, how)), runs in shapes.items():
        ests = [estimates[r.id] for r in runs if r.id in estimates]
        resources.append(
            {
                "model": model,
                "runs": len(runs),
                "gpus": gpus,
                "sharding": sharding,
                "micro_batch_size": micro,
                "generation": generation,
                "generation_why": why,
                "numerics": computed,
                "numerics_why": how,
                "learning_rate": learning_rates(runs),
                "gpu_memory_gb": max((e.peak_gb for e in ests if e.gpus), default=None),
                "of_gb": next((e.gpu_memory_gb for e in ests if e.gpus), None),
                "host_memory_gb": max((e.host_gb for e in ests), default=None),
                "mem_gb": next((e.mem_gb for e in ests), None),
                "gpu_hours": gpu_hours(runs),
                "storage_gb": sum(e.storage_gb for e in ests),
                **_time_row(ests),
            }
        )
    on_gpu = [(rid, e) for rid, e in estimates.items() if e.gpus]
    largest = max(on_gpu, key=lambda kv: kv[1].peak_gb / (kv[1].gpu_memory_gb or 1), default=None)
    return {
        "sweep_dir": str(plan.sweep_dir),
        "axes": plan.axes,
        "total": len(plan.runs),
        "excluded": plan.excluded,
        "merged": plan.merged,
        "done": sum(s in store.TRAINED_STATES for s in states.values()),
        "failed": sum(s in store.STOPPED_STATES for s in states.values()),
        "to_submit": len(todo),
        "gpu_hours_upper_bound": round(gpu_hours(todo), 1),
        **_time_totals([estimates[r.id] for r in todo if r.id in estimates]),
        # a sweep of the tiny model on this machine's CPU: its wall time, scaled from a measured study
        "wall_time": None if (wall := walltime.estimate(plan, todo)) is None else wall.as_dict(),
        "storage_gb": round(sum(e.storage_gb for e in estimates.values()), 1),
        "largest_gpu_memory": None
        if largest is None
        else {
            "run": largest[0],
            "model": run_label(plan, largest[0]),
            "gpu_memory_gb": round(largest[1].peak_gb, 1),
            "of_gb": largest[1].gpu_memory_gb,
        },
        "resources": resources,
        "warnings": warnings(plan, estimates),
        # a user's config file in place of a shipped one; why runs generate without klsweep.fastgen
        "notes": [
            *plan.shadowed,
            *(
                f"{row['model']}: {counted(row['runs'], 'run')} generate{'s' if row['runs'] == 1 else ''} with {row['generation']}: {row['generation_why']}"
                for row in resources
                if row["generation"] == "hf" and row["gpu_memory_gb"] is None  # CPU runs without fastgen
            ),
            *(  # runs that asked for klsweep.fastpass and compute TRL's way
                f"{row['model']}: {counted(row['runs'], 'run')} compute{'s' if row['runs'] == 1 else ''} "
                f"exactly: {row['numerics_why']}"
                for row in resources
                if row["numerics"] == "exact" and row["numerics_why"].startswith("fast asked")
            ),
        ],
        "estimates": estimates,
        "seeds": seed_budget(plan),
    }


def seed_budget(plan: Plan) -> dict[str, Any] | None:
    """The study's pilot and budget under the grid's seed rule (``seeds:``): the pilot's runs (each
    configuration's first seeds), the budget's (the grid's, which ``--max-runs`` counts), the target, and the
    line ``klsweep plan`` prints; None without a rule."""
    from klsweep.grid.seeds import pilot_ids

    rule = plan.seed_rule
    if rule is None:
        return None
    pilot = len(pilot_ids(plan.runs, rule))
    line = (
        f"seeds: klsweep study trains a pilot of {counted(pilot, 'run')} (the first {rule.pilot} seeds of each "
        f"configuration), then adds seeds where each claim needs them for power {rule.target:g} at its effect, "
        f"up to a budget of {counted(len(plan.runs), 'run')} (the grid's seeds; klsweep run trains them all)"
    )
    return {
        "pilot": rule.pilot,
        "target": rule.target,
        "pilot_runs": pilot,
        "budget_runs": len(plan.runs),
        "line": line,
    }


def generation_paths(plan: Plan) -> dict[str, tuple[str, str]]:
    """Each run's generation path and why (``fastgen.generation_path``: fast, hf or vllm), from its config and
    its model's ``config.json`` (read once per model section); no torch or transformers."""
    return _paths(plan, fastgen.generation_path)


def numerics_paths(plan: Plan) -> dict[str, tuple[str, str]]:
    """Each run's numerics and why (``fastgen.numerics_path``: exact or fast), as ``generation_paths``."""
    return _paths(plan, fastgen.numerics_path)


def _paths(plan: Plan, decide: Any) -> dict[str, tuple[str, str]]:
    types: dict[str, str | None] = {}
    out = {}
    for run in plan.runs:
        model = run.config["model"]
        where = f"{model.get('path')}|{(model.get('arch') or {}).get('model_type')}"
        if where not in types:
            types[where] = model_type(model)
        out[run.id] = decide(run.config, types[where])
    return out


def _time_row(ests: list[Estimate]) -> dict[str, Any]:
    """A resources row's time: the GPU, the longest step and training (the band's low and high ends), the
    limit, the jobs (high end), the estimated GPU-hours (both ends), the longest signal delay."""
    timed = [e for e in ests if e.cost and e.cost_high]
    if not timed:
        return {"gpu": None, "step_seconds_low": None, "step_seconds_high": None, "train_hours_high": None,
                "limit_hours": None, "jobs": None, "gpu_hours_estimate_low": None,
                "gpu_hours_estimate_high": None, "signal_delay_s": max((e.signal_delay_s for e in ests),
                                                                       default=None)}  # fmt: skip
    slowest = max(timed, key=lambda e: e.cost_high.step.total)  # type: ignore[union-attr]
    lo, hi = slowest.cost, slowest.cost_high
    assert lo is not None and hi is not None
    return {
        "gpu": lo.gpu,
        "step_seconds_low": round(lo.step.total, 1),
        "step_seconds_high": round(hi.step.total, 1),
        "generation_seconds": round(lo.step.generation, 1),
        "train_hours_high": round(max(e.cost_high.train_hours for e in timed), 2),  # type: ignore[union-attr]
        "limit_hours": lo.limit_hours,
        "jobs": max(e.cost_high.jobs for e in timed),  # type: ignore[union-attr]
        "gpu_hours_estimate_low": round(sum(e.gpu_hours for e in ests), 1),
        "gpu_hours_estimate_high": round(sum(e.gpu_hours_high for e in ests), 1),
        "signal_delay_s": max(e.signal_delay_s for e in ests),
    }


def _time_totals(todo: list[Estimate]) -> dict[str, Any]:
    """The estimated GPU-hours of the runs to submit (training and eval; the band's low and high ends) and the
    eval jobs' at their limits."""
    costs = [e.cost for e in todo if e.cost]
    return {
        "gpu_hours_estimate_low": round(sum(e.gpu_hours for e in todo), 1),
        "gpu_hours_estimate_high": round(sum(e.gpu_hours_high for e in todo), 1),
        "eval_gpu_hours_estimate": round(sum(c.eval_gpu_hours for c in costs), 1),
        "eval_gpu_hours_limit": round(sum(e.eval_limit_gpu_hours for e in todo), 1),
        "eval_estimated": all(
            e.cost.eval_seconds is not None for e in todo if e.cost and e.eval_limit_gpu_hours
        ),
    }


def warnings(plan: Plan, estimates: Mapping[str, Estimate]) -> list[str]:
    """What the plan should say before anything is submitted, runs of one model together: a
    ``gpu_memory_gb`` larger than the GPU of ``model.resources.gpu`` has, training longer than its time limit
    (requeues needed; more than ``cluster.max_requeues`` allow), memory within ``AT_RISK`` of the GPU,
    checkpoints past ``STORAGE_WARN_GB``, an engine the jobs cannot import (``engines.missing``), and first each
    axis that changes nothing (``inert_axes``)."""
    slow: dict[str, list[Estimate]] = {}
    tight: dict[str, list[Estimate]] = {}
    short: dict[str, list[Estimate]] = {}  # a cluster.signal_delay_s shorter than the derived delay
    oversold: set[str] = set()  # models whose gpu_memory_gb is more than their GPU has
    out: list[str] = inert_axes(plan)
    for run in plan.runs:
        e = estimates.get(run.id)
        if e is None:
            continue
        model = str(run.config["model"].get("name"))
        if e.cost_high and e.cost_high.exceeds_limit:
            slow.setdefault(model, []).append(e)
        if e.delay_set and e.signal_delay_s < e.derived_delay_s:
            short.setdefault(model, []).append(e)
        if e.at_risk:
            tight.setdefault(model, []).append(e)
        gpu = cost.GPUS[e.cost.gpu] if e.cost else None
        if gpu and (e.gpu_memory_gb or 0) > gpu.memory_gb and model not in oversold:
            oversold.add(model)
            out.append(
                f"runs ({model}): model.resources.gpu_memory_gb {e.gpu_memory_gb:g} is more than an "
                f"{e.cost.gpu} has ({gpu.memory_gb:g} GB); the memory check trusts gpu_memory_gb"
            )
    for model, ests in slow.items():
        worst = max((e.cost_high for e in ests if e.cost_high), key=lambda c: c.jobs)
        out.append(
            f"{counted(len(ests), 'run')} ({model}) may need ~{worst.train_hours:.1f} h of training against a "
            f"{worst.limit_hours:g} h time limit: {counted(worst.jobs, 'job')} each ({worst.jobs - 1} requeue{'s' if worst.jobs > 2 else ''})"
            + (
                f", more than cluster.max_requeues {worst.tries - 1} allows: raise it or "
                "model.resources.timeout_min"
                if worst.jobs > worst.tries
                else f", within cluster.max_requeues {worst.tries - 1}"
            )
        )
    for model, ests in short.items():
        worst = max(ests, key=lambda e: e.derived_delay_s - e.signal_delay_s)
        c = worst.cost_high
        step = f"a step (up to ~{c.step.total - c.step.checkpoint:.0f} s), " if c else ""
        save = f"a save (~{c.save_seconds:.0f} s at cluster.checkpoint_write_gbps), " if c else ""
        out.append(
            f"{counted(len(ests), 'run')} ({model}): cluster.signal_delay_s {worst.signal_delay_s} is shorter than the "
            f"{worst.derived_delay_s} s that {step}{save}and a {SIGNAL_MARGIN_S} s margin need: a preempted "
            "job may be killed before its checkpoint is written, losing up to train.save_steps steps "
            "(null derives it)"
        )
    for model, ests in tight.items():
        worst = max(ests, key=lambda e: e.peak_gb)
        out.append(
            f"{counted(len(ests), 'run')} ({model}) need{'s' if len(ests) == 1 else ''} ~{worst.peak_gb:.1f} of {worst.gpu_memory_gb:g} GiB per GPU: "
            f"within {AT_RISK:.0%} of the GPU, at risk (klsweep docs slurm); a smaller train.micro_batch_size "
            "leaves room"
        )
    storage = sum(e.storage_gb for e in estimates.values())
    if storage > STORAGE_WARN_GB:
        out.append(
            f"checkpoints kept: {storage / 1024:.1f} TiB, past {STORAGE_WARN_GB / 1024:g} TiB: check the "
            "results folder's quota (train.keep_checkpoints: how many each run keeps)"
        )
    # an engine the jobs' environment cannot import: klsweep run and klsweep eval refuse it (klsweep.engines)
    out += [f"{p.where}: {p.what} ({p.allowed})" for p in engines.missing(r.config for r in plan.runs)]
    return out


def inert_axes(plan: Plan) -> list[str]:
    """A warning for each axis the grid sweeps (several values written) that changes nothing in any run: a
    setting of every run makes it inert (``config.inert``: "kl.estimator, kl.placement vary but kl.beta is 0 in
    every run: they change nothing; set kl.beta"), or the run id leaves it out (``config.ID_HASHED_AT``,
    ``config.COSMETIC_KEYS``), so that its values are one run. Said by ``klsweep plan`` and ``klsweep run``."""
    found: dict[tuple[str, ...], list[str]] = {}  # (why, ..., what to set) -> the axes
    unseen: list[str] = []
    for key in plan.swept:
        reasons: list[tuple[str, str]] = []
        for run in plan.runs:
            reason = config_mod.inert(run.config, key)
            if reason is None:
                break
            if reason not in reasons:
                reasons.append(reason)
        else:
            whys = list(dict.fromkeys(w for w, _ in reasons))
            fixes = list(dict.fromkeys(f for _, f in reasons))
            found.setdefault((*whys, "; ".join(fixes)), []).append(key)
            continue
        if key not in plan.axes and (key in config_mod.ID_HASHED_AT or config_mod.is_cosmetic(key)):
            unseen.append(key)
    out = []
    for (*whys, fix), keys in found.items():
        they = "it changes" if len(keys) == 1 else "they change"
        vary = "varies" if len(keys) == 1 else "vary"
        if len(whys) == 1:
            out.append(f"{', '.join(keys)} {vary} but {whys[0]} in every run: {they} nothing; {fix}")
        else:
            out.append(f"{', '.join(keys)} {vary} but change nothing in any run ({'; '.join(whys)}): {fix}")
    for key in unseen:
        out.append(
            f"{key} varies but the run id leaves it out (how or where a run is computed, not what it trains): "
            "its values make one run of each configuration, with the first value; one grid (with its own name) per value"
        )
    return out
