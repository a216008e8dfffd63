"""A rehearsed run and its stages: ``RunRehearsal`` (each stage's outcome, reason, log, notes), ``run_stage``
(one stage, its output in the run's ``logs/rehearse-<stage>.log``, skipped after a failure), and the stages
``train`` (a few steps, a checkpoint half-way), ``resume`` (the last checkpoint removed, the run resumed from the
one before) and ``evaluate`` (lm-eval with the grid's suite, its tasks pointed at the samples)."""

from __future__ import annotations

import contextlib
import shutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klsweep import store
from klsweep.errors import UserError, describe
from klsweep.rehearse.standins import check_prompt_fields

STAGES = ("train", "resume", "eval", "report")


@dataclass
class RunRehearsal:
    """One rehearsed run: what it stands for, its stages' outcomes and notes."""

    run_id: str
    label: str  # the covered values
    run_dir: Path
    stages: dict[str, str] = field(default_factory=dict)  # stage -> "passed" | "failed" | "skipped"
    reasons: dict[str, str] = field(default_factory=dict)  # failed stage -> reason
    logs: dict[str, str] = field(default_factory=dict)  # failed stage -> its log file
    notes: list[str] = field(default_factory=list)  # what was swapped or not exercised
    # stage -> (engine, sharding, what it replaced or ""): what the stage ran with
    ran_with: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # the rehearsal's config of the run

    @property
    def passed(self) -> bool:
        return all(self.stages.get(s) == "passed" for s in STAGES)


def run_stage(run: RunRehearsal, stage: str, fn: Callable[[], None]) -> bool:
    if any(v == "failed" for v in run.stages.values()):
        run.stages[stage] = "skipped"
        return False
    log = run.run_dir / "logs" / f"rehearse-{stage}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        try:
            fn()
        except Exception as e:
            traceback.print_exc(file=f)
            run.stages[stage] = "failed"
            run.reasons[stage] = " / ".join(map(str, e.problems)) if isinstance(e, UserError) else describe(e)
            run.logs[stage] = str(log)
            return False
    run.stages[stage] = "passed"
    return True


def train(run_dir: Path) -> None:
    from klsweep.job import train_run

    status = train_run(run_dir)
    if status["state"] != "done":
        raise RuntimeError(status.get("reason") or status["state"])


def resume(run_dir: Path, steps: int) -> None:
    """Remove the last checkpoint (as a job killed before it was saved), resume from the one before."""
    from klsweep.job import train_run

    found = store.checkpoints(run_dir)
    if len(found) < 2:
        raise RuntimeError(f"{len(found)} checkpoint(s) after training: nothing to resume from")
    shutil.rmtree(found[-1])
    store.write_status(run_dir, "running", finished_at=None, final_checkpoint=None)
    status = train_run(run_dir)
    if status["state"] != "done":
        raise RuntimeError(status.get("reason") or status["state"])
    found = store.metrics.read(run_dir / store.METRICS_FILE, steps)
    rows = [r["step"] for r in found.rows]
    if rows != list(range(1, steps + 1)) or found.aside:  # every step once: nothing set aside either
        said = "; ".join(found.notes())
        raise RuntimeError(
            f"metrics steps after the resume: {rows}, expected 1..{steps}{f'; {said}' if said else ''}"
        )


def evaluate(run_dir: Path, eval_cfg: dict[str, Any]) -> None:
    from klsweep.evaluate import eval_run, include_dir

    check_prompt_fields(include_dir(eval_cfg["include_path"]), [*eval_cfg["in_domain"], *eval_cfg["ood"]])
    eval_run(run_dir, eval_cfg)
