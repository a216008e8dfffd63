"""A local sweep's wall time on CPU, scaled from the tiny study's measured one (``klsweep.cost`` is a GPU model).

A calibration, not a model: ``MEASURED`` is one whole study timed from a fresh clone (docs/STUDY.md, "Time and
reproduction"), and a sweep of the shipped tiny model on this machine's CPU is given that study's seconds per
step (per worker, side by side), per checkpoint scored and for the report, scaled by its steps, completions per
step (a step's cost goes as ``FIXED_COMPLETIONS`` + completions: v4's 4 x 4 step took 0.036 s and v5's 4 x 8
0.051 s on the same machine), its numerics (``STEP_COST``: the exact path's step against the fast one's, measured
back to back), eval problems per task and workers. Another model, a GPU or Slurm: no estimate.
A machine faster, slower or busier than the measured one takes another time: the figure says where it is from.

``MEASURED`` is the one place the tiny study's time comes from: ``klsweep plan`` prints it, the README quotes
``study_minutes()`` (a test holds them equal). A new study's measurement is one edit here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from klsweep.grid import Plan, PlannedRun


@dataclass(frozen=True)
class Measured:
    """One study's measured wall time on CPU and what it ran."""

    study: str  # which (docs/STUDY.md's name)
    machine: str  # where, in words
    numerics: str  # train.numerics of its runs (``STEP_COST``)
    runs: int
    steps: int  # each run's
    completions: int  # a step's: prompts_per_step x group_size
    workers: int  # local training jobs side by side (one per core)
    train_s: float  # from the first run's start to the last run's end
    checkpoints: int  # scored by the eval, the step-0 baseline included
    problems: int  # eval.limit: problems per task
    eval_s: float
    report_s: float
    worker_start_s: float  # a training worker's start (imports, the first model built): once per worker
    eval_start_s: float  # an eval job's start (lm-eval imported, its tasks loaded): once per job

    @property
    def worker_step_s(self) -> float:
        """A step's seconds on one worker while the others train too, each run's own start and saves spread
        over its steps."""
        return (self.train_s - self.worker_start_s) * self.workers / (self.runs * self.steps)

    @property
    def checkpoint_s(self) -> float:
        """A checkpoint's eval seconds on one job, past the job's start."""
        return (self.eval_s - self.eval_start_s) * self.workers / self.checkpoints

    @property
    def total_s(self) -> float:
        return self.train_s + self.eval_s + self.report_s


# study v6, `./dev.sh study` from a fresh clone (docs/STUDY.md, "Time and reproduction"): 128 runs on fast
# numerics, in two phases (the seed rule's pilot of 54 runs, then the 74 it added): training 248 + 340 s on two
# workers, eval 32 + 37 s (55 then 74 checkpoints) and the rule 8 s, the report 4 s (installs apart); measured
# again after issue 48's eval and heap cuts (the study before them: 341 + 490, 113 + 145, 8 and 6 s)
MEASURED = Measured(
    study="study v6",
    machine="an idle 2-core Intel Xeon VM",
    numerics="fast",
    runs=128,
    steps=300,
    completions=32,
    workers=2,
    train_s=248 + 340,
    checkpoints=129,
    problems=100,
    eval_s=32 + 37 + 8,
    report_s=4,
    # two phases, each with its workers' start and its eval jobs' start (lm-eval imported, its tasks loaded):
    # a worker's start about 10 s (measured apart), the eval jobs' first checkpoints scored 6-7 s into each
    # eval phase (the study's log)
    worker_start_s=2 * 10,
    eval_start_s=2 * 6,
)
# a step's cost by train.numerics, relative: the training of study v5's 88 runs back to back on one idle 2-core
# Intel VM, exact 809 s against fast 538 s (docs/DEVELOPMENT.md, issue 48)
STEP_COST = {"fast": 1.0, "exact": 809 / 538}
FIXED_COMPLETIONS = 22.4  # a step's cost goes as this + its completions (v4's and v5's steps, one machine)
MODEL = "tiny"  # the model the measurement trained: no other is estimated


@dataclass(frozen=True)
class WallTime:
    """A local sweep's estimated wall time (seconds), as ``estimate`` scales it from ``MEASURED``."""

    train_s: float
    eval_s: float
    report_s: float
    workers: int

    @property
    def total_s(self) -> float:
        return self.train_s + self.eval_s + self.report_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "train_s": round(self.train_s),
            "eval_s": round(self.eval_s),
            "report_s": round(self.report_s),
            "total_s": round(self.total_s),
            "workers": self.workers,
            "calibration": f"{MEASURED.study}'s time measured on {MEASURED.machine}",
        }


def _on_local_cpu(run: PlannedRun) -> bool:
    c = run.config
    return (
        c["model"].get("name") == MODEL
        and c["cluster"].get("kind") in ("local", "debug")
        and not int(c["model"]["resources"].get("gpus_per_node") or 0)
    )


def estimate(plan: Plan, runs: list[PlannedRun], workers: int | None = None) -> WallTime | None:
    """The wall time of training ``runs`` (a plan's runs to submit) on this machine, evaluating them with the
    step-0 baseline and reporting, as ``MEASURED`` took; None when a run of the plan is not the tiny model on
    the local CPU (``klsweep.cost`` estimates GPU runs). ``workers``: the jobs side by side (default: the
    grid's ``cluster.max_local_jobs``, else the cores klsweep may use; at most the runs)."""
    from klsweep.environment import usable_cores

    if not plan.runs or not all(_on_local_cpu(r) for r in plan.runs):
        return None
    if not runs:
        return WallTime(0.0, 0.0, 0.0, 0)
    first = runs[0].config
    if workers is None:
        workers = (
            1
            if first["cluster"].get("kind") == "debug"
            else int(first["cluster"].get("max_local_jobs") or usable_cores())
        )
    workers = max(1, min(workers, len(runs)))
    step_cost = 0.0  # worker-seconds
    for run in runs:
        t = run.config["train"]
        completions = int(t["prompts_per_step"]) * int(t["group_size"])
        scale = (FIXED_COMPLETIONS + completions) / (FIXED_COMPLETIONS + MEASURED.completions)
        scale *= STEP_COST.get(str(t.get("numerics") or "exact"), 1.0) / STEP_COST[MEASURED.numerics]
        step_cost += int(t["steps"]) * MEASURED.worker_step_s * scale
    evaluated = [r for r in runs if (r.config.get("eval") or {}).get("suite", "none") != "none"]
    eval_s = 0.0
    if evaluated:
        problems = (evaluated[0].config["eval"].get("limit") or MEASURED.problems) / MEASURED.problems
        checkpoints = len(evaluated) + 1  # the step-0 baseline
        eval_s = MEASURED.eval_start_s + checkpoints * MEASURED.checkpoint_s * problems / min(
            workers, len(evaluated)
        )
    train_s = MEASURED.worker_start_s + step_cost / workers
    return WallTime(train_s, eval_s, MEASURED.report_s if evaluated else 0.0, workers)


def minutes(seconds: float) -> str:
    """``about 19 min``, ``about 40 s``, ``about 2.5 h``."""
    if seconds < 90:
        return f"about {seconds:.0f} s"
    if seconds < 5400:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"


def study_minutes() -> str:
    """The tiny study's time on two cores as the README says it (``about 19 min``): ``estimate`` of the shipped
    tiny grid on ``MEASURED``'s two workers, the one number the docs quote."""
    from klsweep import grid

    plan = grid.load_plan("tiny")
    found = estimate(plan, plan.runs, workers=MEASURED.workers)
    assert found is not None
    return minutes(found.total_s)
