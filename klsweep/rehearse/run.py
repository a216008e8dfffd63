"""``rehearse``: the covering runs of a grid through every stage in this process, then the report and what the
real run would refuse here; ``rehearse_on_slurm``: the same as one short Slurm job."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klsweep.errors import Problem, UserError, describe
from klsweep.rehearse import stages
from klsweep.rehearse.covering import covered_values, covering_runs
from klsweep.rehearse.findings import real_run_findings
from klsweep.rehearse.folder import DEFAULT_OUT, MARKER, MARKER_TEXT, only_rehearsal
from klsweep.rehearse.memory import check_memory
from klsweep.rehearse.runconfig import rehearsal_config
from klsweep.rehearse.stages import RunRehearsal, run_stage
from klsweep.rehearse.standins import check_chat, rewire_tasks, tiny_model


@dataclass
class Rehearsal:
    name: str
    folder: Path
    runs: list[RunRehearsal]
    elapsed_s: float = 0.0
    # what `klsweep run` of the grid would refuse here, or its jobs lack here (``real_run_findings``)
    findings: list[str] = field(default_factory=list)
    cautions: list[str] = field(
        default_factory=list
    )  # what the jobs would fetch or do differently, not a refusal

    @property
    def passed(self) -> bool:
        """Every stage of every rehearsed run passed (the rehearsal itself; ``ready`` adds the findings)."""
        return bool(self.runs) and all(r.passed for r in self.runs)

    @property
    def ready(self) -> bool:
        """Passed, and nothing the real run needs is missing here: ``klsweep rehearse`` exits 0 only then."""
        return self.passed and not self.findings


def rehearse(
    grid_path: str | Path,
    overrides: list[str] | None = None,
    out: str | Path | None = None,
    on_run: Callable[[RunRehearsal], None] | None = None,
    config_dirs: list[str] | None = None,
) -> Rehearsal:
    """Rehearse the covering runs of a grid in this process (see the module docstring), then say what the real
    run needs that is missing here (``Rehearsal.findings``, ``real_run_findings``). ``UserError`` when
    another rehearsal writes the same folder, or the folder holds anything but a rehearsal
    (``folder.only_rehearsal``), or vLLM's engines would not find the memory they take free here
    (``memory.check_memory``)."""
    from klsweep import grid, planner

    start = time.time()
    plan = grid.load_plan(grid_path, overrides, out=Path(out or DEFAULT_OUT), config_dirs=config_dirs)
    planner.check(plan)
    import torch

    check_memory(covering_runs(plan.runs), torch.cuda.device_count())  # before anything is written
    folder = Path(plan.sweep_dir)
    lock = only_rehearsal(folder)
    try:
        done = _rehearse(plan, folder, on_run, start)
    finally:
        os.close(lock)  # releases it; the file stays (removing it would let a third one lock another file)
    from klsweep.fetch import fetch_command

    real = grid.load_plan(grid_path, overrides)  # the real run's plan (its results folder, its commits)
    done.findings, done.cautions = real_run_findings(
        real, fetch_command(grid_path, overrides), torch.cuda.device_count()
    )
    return done


def _rehearse(
    plan: Any, folder: Path, on_run: Callable[[RunRehearsal], None] | None, start: float
) -> Rehearsal:
    import torch

    from klsweep.evaluate import include_dir
    from klsweep.report import build_report
    from klsweep.submit.sweep import write_sweep_file

    gpus = torch.cuda.device_count()
    chosen = covering_runs(plan.runs)
    models: dict[str, tuple[Path, list[str]]] = {}
    tasks_dirs: dict[str, Path | None] = {}
    rehearsed = []
    for run in chosen:
        values = covered_values(run.config)
        label = " ".join(str(v) for v in values.values())
        rr = RunRehearsal(run.id, label, folder / run.id)
        rehearsed.append(rr)
        ev = run.config.get("eval", {})
        names = [*ev.get("in_domain", []), *ev.get("ood", [])]

        def prepare(run: Any = run, rr: RunRehearsal = rr, ev: dict = ev, names: list = names) -> None:
            key = json.dumps(run.config["model"], sort_keys=True)
            if key not in models:
                models[key] = tiny_model(run.config["model"], folder / ".models" / f"m{len(models)}")
            model_dir, notes = models[key]
            rr.notes += notes
            tasks_dir = None
            if names:
                tk = json.dumps(ev.get("include_path"))
                if tk not in tasks_dirs:
                    target = folder / ".evaltasks" / f"t{len(tasks_dirs)}"
                    tasks_dirs[tk] = rewire_tasks(include_dir(ev.get("include_path")), names, target)
                tasks_dir = tasks_dirs[tk]
                check_chat(model_dir, run.config, tasks_dir, names)
            config, notes, rr.ran_with = rehearsal_config(run.config, model_dir, tasks_dir, gpus)
            rr.notes += notes
            rr.run_dir.mkdir(parents=True, exist_ok=True)
            (rr.run_dir / MARKER).write_text(MARKER_TEXT)
            from klsweep.config import write_run

            write_run(rr.run_dir, config)
            rr.config = config

        if run_stage(rr, "train", lambda prepare=prepare, rr=rr: (prepare(), stages.train(rr.run_dir))):
            steps = rr.config["train"]["steps"]
            run_stage(rr, "resume", lambda rr=rr, steps=steps: stages.resume(rr.run_dir, steps))
        else:
            rr.stages["resume"] = "skipped"
        if names:
            run_stage(rr, "eval", lambda rr=rr: stages.evaluate(rr.run_dir, rr.config["eval"]))
        else:
            rr.stages["eval"] = "passed"
            rr.notes.append("no eval suite")
    sweep_plan = type(plan)(plan.name, folder, [r for r in chosen], plan.axes, 0, plan.grid_text)
    write_sweep_file(sweep_plan, "local")
    report = RunRehearsal("", "", folder)
    run_stage(report, "report", lambda: build_report(folder, formats=["md"], wandb=False, rehearsal=True))
    for rr in rehearsed:
        if any(v == "failed" for v in rr.stages.values()):
            rr.stages["report"] = "skipped"
        else:
            rr.stages["report"] = report.stages["report"]
            rr.reasons.update(report.reasons)
            rr.logs.update(report.logs)
        if on_run is not None:
            on_run(rr)
    return Rehearsal(plan.name, folder, rehearsed, time.time() - start)


def rehearse_on_slurm(
    grid_path: str | Path,
    overrides: list[str] | None = None,
    out: str | Path | None = None,
    config_dirs: list[str] | None = None,
) -> tuple[Rehearsal, str]:
    """``rehearse`` as one short Slurm job on the grid's partition (its cluster settings: partition, account,
    qos, setup), with one GPU when the grid's models ask for GPUs; waits for it. Returns the rehearsal and the
    job's log."""
    import submitit

    from klsweep import grid, planner
    from klsweep.submit.slurm import slurm_parameters

    out = Path(out or DEFAULT_OUT).absolute()
    plan = grid.load_plan(grid_path, overrides, out=out, config_dirs=config_dirs)
    planner.check(plan)  # what the job's rehearse would refuse, refused before a job is submitted
    first = plan.runs[0].config
    gpus = max(int(r.config["model"]["resources"].get("gpus_per_node", 0)) for r in plan.runs)
    res = {**first["model"]["resources"], "nodes": 1, "tasks_per_node": 1, "gpus_per_node": min(gpus, 1),
           "timeout_min": 30, "mem_gb": min(int(first["model"]["resources"].get("mem_gb", 16)), 64)}  # fmt: skip
    params = slurm_parameters(res, first.get("cluster", {}), f"{plan.name}-rehearsal", eval_job=False)
    params.pop("array_parallelism", None)
    ex = submitit.SlurmExecutor(folder=out / f".submitit-{plan.name}", max_num_timeout=0)
    ex.update_parameters(**params)
    try:
        dirs = [str(Path(d).absolute()) for d in config_dirs or []]
        job = ex.submit(rehearse, grid.grid_file(grid_path).absolute(), overrides, out, None, dirs)
    except submitit.core.utils.FailedJobError as e:
        where = ", ".join(f"{k}={v}" for k, v in params.items() if k in ("partition", "gpus_per_node", "mem"))
        raise UserError(
            Problem(f"--cluster slurm ({where})", f"sbatch refused the rehearsal job: {describe(e)}",
                    "cluster.partition/account/qos of a partition with what the grid's models ask for"),
        ) from e  # fmt: skip
    return job.result(), str(job.paths.stdout)
