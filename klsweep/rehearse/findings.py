"""What the real run of a rehearsed grid needs that this machine lacks (``real_run_findings``)."""

from __future__ import annotations

from typing import Any

from klsweep.errors import UserError


def real_run_findings(plan: Any, fetch_command: str, gpus: int) -> tuple[list[str], list[str]]:
    """What the real run of ``plan`` needs that this machine lacks, as (findings, cautions). Findings:
    what ``klsweep run`` refuses here (an engine that does not import, ``engines.missing``; offline, a model or
    dataset the caches lack, ``fetch.require_cached``) and what its local jobs would lack (the GPUs the runs
    ask for). Cautions: models and datasets not cached here while online (each job downloads them)."""
    from klsweep import engines, fetch
    from klsweep.submit import default_cluster

    configs = [r.config for r in plan.runs]
    refuse = "the real run would refuse:"
    findings = [f"{refuse} {p.where} {p.what} ({p.allowed})" for p in engines.missing(configs)]
    cautions = []
    if fetch.offline(configs):
        try:
            fetch.require_cached(configs, fetch_command)
        except UserError as e:
            findings += [f"{refuse} offline, {p.where}: {p.what}" for p in e.problems[:-1]]
    else:
        absent = [f for f in fetch.check(n for n in fetch.needs(configs) if not n.local) if not f.cached]
        cautions += [
            f"{f.need.kind} {f.need.label} not cached here: each job downloads it ({fetch_command} first)"
            for f in absent
        ]
    cluster = default_cluster(plan)
    asked = max((int(c["model"]["resources"].get("gpus_per_node", 0)) for c in configs), default=0)
    if cluster in ("local", "debug") and asked > gpus:
        findings.append(
            f"the real run would lack: the runs ask for {asked} GPU(s) per node and this machine has {gpus} "
            f"(cluster {cluster}: they would train here without)"
        )
    return findings, cautions
