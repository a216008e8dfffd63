"""Whether a plan's runs can run: ``check`` refuses, with every problem located and its fix, the runs that
cannot start or cannot fit (``klsweep plan`` and ``klsweep run``)."""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

from klsweep import cost, trlargs
from klsweep.config import tasks_per_node
from klsweep.errors import Problem, UserError
from klsweep.planner.needs import Estimate, estimate
from klsweep.planner.shape import (
    ARCH_KEYS,
    Arch,
    BatchShape,
    architecture,
    batch_shape,
    context_length,
    processes,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from klsweep.grid import Plan


EXAMPLES = 3  # run ids named in a grouped problem


def run_problems(config: Mapping[str, Any]) -> tuple[Estimate | None, list[tuple[str, str, str]]]:
    """The estimate of one run's config and what keeps it from starting or fitting, as (key, what, allowed)."""
    model, train, res = config["model"], config["train"], config["model"]["resources"]
    found: list[tuple[str, str, str]] = []
    gpus = int(res.get("gpus_per_node", 0))
    tasks = tasks_per_node(res)
    if gpus and tasks != gpus:
        found.append(
            (
                "model.resources.tasks_per_node",
                f"{tasks} processes per node for {gpus} GPUs per node: "
                + ("GPUs left idle" if tasks < gpus else "processes sharing a GPU"),
                f"{gpus} (one process per GPU), or null",
            )
        )
    eval_chat = config.get("eval", {}).get("apply_chat_template")
    suite = config.get("eval", {}).get("suite", "none")
    if eval_chat is not None and suite != "none" and bool(eval_chat) != bool(model.get("chat_template")):
        trained = "with" if model.get("chat_template") else "without"
        found.append(
            (
                "eval.apply_chat_template",
                f"{eval_chat} for {model.get('name')}, trained {trained} a chat template (model.chat_template)",
                f"null (the model's decision) or {bool(model.get('chat_template'))}",
            )
        )
    if train.get("warmup_steps") and train.get("warmup_ratio"):
        found.append(
            ("train.warmup_ratio", "set together with train.warmup_steps", "one of them; the other 0")
        )
    found += trlargs.schedule_problems(train)  # a warm-up the schedule ignores, arguments it needs
    if train.get("sharding") == "fsdp" and not gpus:
        found.append(
            (
                "train.sharding",
                "fsdp without GPUs (accelerate applies its FSDP plugin to GPU processes only)",
                "none on CPUs, or model.resources.gpus_per_node > 0",
            )
        )
    found += _past_context(config)
    arch = architecture(model)
    if arch is None and gpus:  # without GPUs, nothing is checked against the estimate
        found.append(
            (
                "model.arch",
                f"no architecture numbers for {model.get('path')!r} (a hub id: nothing is downloaded)",
                f"model.arch.{{{','.join(ARCH_KEYS)}}} from its config.json, or a local path",
            )
        )
    try:
        shape = batch_shape(train, processes(config))
    except UserError as e:
        found += [(p.where, p.what, p.allowed) for p in e.problems]
        shape = None
    if arch is None or shape is None:
        return None, found
    est = estimate(config, arch, shape)
    if not est.fits:
        found.append(("model.resources.gpu_memory_gb", _too_big(est), _fix(config, arch, shape)))
    if not est.host_fits:
        found.append(("model.resources.mem_gb", _host_too_big(est), _host_fix(est)))
    if est.signal_delay_s >= int(res["timeout_min"]) * 60:
        found.append(
            (
                "cluster.signal_delay_s" if est.delay_set else "model.resources.timeout_min",
                f"the preemption signal {est.signal_delay_s} s before the time limit "
                f"({'cluster.signal_delay_s' if est.delay_set else 'derived: a step and a save'}) comes "
                f"before the job's {res['timeout_min']} min have begun: it would requeue at once",
                f"a timeout_min above {math.ceil(est.signal_delay_s / 60)}, or a shorter signal_delay_s",
            )
        )
    return est, found


def _past_context(config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """A vLLM context (TRL's colocate engine: prompt + completion; the eval's ``max_model_len``) longer than the
    model's (``shape.context_length``): vLLM refuses to start such an engine."""
    known = context_length(config["model"])
    if known is None:
        return []
    longest, how = known
    model, train, ev = config["model"], config["train"], config.get("eval", {})
    past = f"past the {longest} tokens of {model.get('path')!r} ({how}): vLLM refuses to start"
    found = []
    prompt, completion = int(train["max_prompt_length"]), int(train["max_completion_length"])
    if train.get("use_vllm") and prompt + completion > longest:
        found.append(
            (
                "train.max_prompt_length",
                f"vLLM's context {prompt + completion} (max_prompt_length {prompt} + max_completion_length "
                f"{completion}) is {past}",
                f"max_prompt_length + max_completion_length <= {longest}",
            )
        )
    asked = ev.get("max_model_len")
    if ev.get("suite", "none") != "none" and ev.get("backend") == "vllm" and asked and asked > longest:
        found.append(("eval.max_model_len", f"{asked} is {past}", f"<= {longest}, or null (the model's own)"))
    return found


def _host_too_big(est: Estimate) -> str:
    shown = ", ".join(f"{k} {v:.1f}" for k, v in est.host_parts.items() if v)
    return (
        f"needs ~{est.host_gb:.0f} GiB of host memory per node ({est.tasks_per_node} processes x "
        f"{sum(est.host_parts.values()):.1f} GiB: {shown}) but a node's job asks for {est.mem_gb:g}"
    )


def _host_fix(est: Estimate) -> str:
    return (
        f"mem_gb >= {math.ceil(est.host_gb)} where the nodes have it (klsweep docs slurm: host memory), or fewer "
        "processes per node"
    )


def _too_big(est: Estimate) -> str:
    big = sorted(est.parts.items(), key=lambda kv: -kv[1])[:4]
    shown = ", ".join(f"{k} {v:.1f}" for k, v in big)
    return f"needs ~{est.peak_gb:.1f} GiB per GPU ({shown}, ...) but a GPU has {est.gpu_memory_gb:g}"


def _fix(config: Mapping[str, Any], arch: Arch, shape: BatchShape) -> str:
    """The smallest change that makes the run fit, as overrides with the estimate it gives."""
    train, res = config["train"], config["model"]["resources"]
    micro = [
        {"train.micro_batch_size": d}
        for d in range(shape.per_device - 1, 0, -1)
        if shape.per_process % d == 0
    ]
    fsdp = {} if train.get("sharding", "none") == "fsdp" else {"train.sharding": "fsdp"}
    nodes = int(res.get("nodes", 1))
    candidates: list[dict[str, Any]] = [fsdp, *micro, *({**fsdp, **m} for m in micro)]
    for more in ({"model.resources.nodes": n} for n in (2 * nodes, 4 * nodes)):
        candidates += [{**more, **fsdp}, *({**more, **fsdp, **m} for m in micro)]
    for change in filter(None, candidates):
        changed = copy.deepcopy(dict(config))
        for key, value in change.items():
            *parents, leaf = key.split(".")
            node = changed
            for part in parents:
                node = node[part]
            node[leaf] = value
        try:
            new = estimate(changed, arch, batch_shape(changed["train"], processes(changed)))
        except UserError:
            continue
        if new.fits:
            sets = " ".join(f"{k}={v}" for k, v in change.items())
            return f"{sets} (~{new.peak_gb:.1f} GiB)"
    return "a GPU with more memory, or a shorter max_completion_length"


def check(plan: Plan) -> dict[str, Estimate]:
    """Every run's estimate; ``UserError`` naming each run (runs with the same problem together) that cannot
    start or cannot fit its GPUs."""
    estimates: dict[str, Estimate] = {}
    grouped: dict[tuple[str, str, str], list[str]] = {}
    seen: dict[str, tuple[Estimate | None, list[tuple[str, str, str]]]] = {}
    reprs: dict[tuple, str] = {}
    for run in plan.runs:
        c = run.config
        ev = c.get("eval", {})
        cl = c.get("cluster", {})
        timing = (
            ev,
            cl.get("max_requeues"),
            cl.get("signal_delay_s"),
            cl.get("checkpoint_write_gbps"),
            c.get("task", {}).get("name"),
            cost.uses_behaviour_forward(c),
        )
        # the sections are shared by the runs that do not change them (grid.compose): their repr once each
        same = (id(c["model"]), id(c["train"]), repr(c.get("offpolicy")), id(ev), *timing[1:])
        key = reprs.get(same)
        if key is None:
            key = reprs[same] = repr((c["model"], c["train"], c.get("offpolicy"), *timing))
        if key not in seen:  # runs differing only in KL settings or seed have the same needs
            seen[key] = run_problems(c)
        est, found = seen[key]
        if est is not None:
            estimates[run.id] = est
        for problem in found:
            grouped.setdefault(problem, []).append(run.id)
    if grouped:
        problems = [
            Problem(f"{runs_text(ids, run_label(plan, ids[0]))}: {key}", what, allowed)
            for (key, what, allowed), ids in grouped.items()
        ]
        raise UserError(problems, title="runs that cannot start or fit")
    _check_tiny_model(plan)
    return estimates


def _check_tiny_model(plan: Plan) -> None:
    """The shipped tiny model checked against its ``SHA256SUMS`` (``tinymodel.verified``) when a run uses it,
    before anything is written: a damaged one is found at plan time, not in the jobs."""
    if any(r.config["model"].get("path") == "tiny" for r in plan.runs):
        from klsweep import tinymodel

        try:
            tinymodel.shipped_model_path()
        except tinymodel.TinyModelError as e:
            raise UserError(Problem("model.path: tiny", str(e)), title="the tiny model is damaged") from e


def run_label(plan: Plan, run_id: str) -> str:
    run = next(r for r in plan.runs if r.id == run_id)
    return str(run.config["model"].get("name"))


def runs_text(ids: list[str], model: str) -> str:
    if len(ids) == 1:
        return f"run {ids[0]} ({model})"
    shown = ", ".join(ids[:EXAMPLES])
    more = f" and {len(ids) - EXAMPLES} more" if len(ids) > EXAMPLES else ""
    return f"runs {shown}{more} ({model})"
