"""A whole study in one call: train every run of a grid, evaluate them all, write the report.

``klsweep study sweeps/tiny.yaml`` is the README's main job: on the local machine (the default) it trains
the tiny study's runs through ``klsweep.submit`` (submitit, at most one job per core), then evaluates every
finished run and the step-0 baseline in one lm-eval job per core (each loads lm-eval once), then builds the report under
``results/<name>/report/``. On Slurm (``--cluster slurm``) the same three stages run as job arrays.
Rerunning is cheap: done runs are skipped, evaluated checkpoints are not evaluated again.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klsweep.errors import Problem, UserError


@dataclass
class StudyResult:
    sweep_dir: Path
    runs: list[Any]  # submit.RunStatus, final
    eval: Any  # submit.EvalSubmission; None when no run trained to its end (nothing to evaluate)
    report: Any  # report.Report; None likewise
    command: str = ""  # how to run this study again (summary's --retry-failed hint)
    # with expect_claims: (claim, expected verdict, this study's) for each robust verdict not reproduced (a
    # failure); else None
    claim_changes: list[tuple[str, str, str]] | None = None
    # with expect_claims: likewise for the verdicts the expected table marks fragile (replication under
    # statistics.FRAGILE): expected to change on other seeds or CPUs, not a failure
    fragile_changes: list[tuple[str, str, str]] | None = None
    # with expect_claims, when the expected runs trained on other CPUs than these: why verdicts may differ
    cpu_note: str | None = None
    # with a seed rule (the grid's seeds:): each claim's decision (report.seedrule.Decision); else None
    seeds: list[Any] | None = None

    def summary(self) -> tuple[str, int]:
        """The line the study ends with and its exit code (``summary``)."""
        return summary(self.runs, self.command)


def study_command(grid_path: str | Path, overrides: list[str] | None, out: str | Path) -> str:
    """The command that runs this study again, as the user would type it."""
    words = ["klsweep", "study", str(grid_path), *(overrides or [])]
    if Path(out) != Path("results"):
        words += ["--out", str(out)]
    return shlex.join(words)


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def summary(runs: list[Any], command: str) -> tuple[str, int]:
    """``2 of 2 runs done`` (exit 0), or what is not: ``0 of 2 runs done: 2 cancelled (klsweep study g.yaml
    --retry-failed)`` (exit 1: a run failed, was cancelled or never started). A diverged run is a result of
    the study (exit 0), as ``klsweep run --wait`` treats it."""
    from klsweep import store

    trained = [r for r in runs if r.state in store.TRAINED_STATES]
    line = f"{len(trained)} of {_runs(len(runs))} done"
    diverged = sum(r.state == "diverged" for r in runs)
    if diverged:
        line += f" ({diverged} diverged: a result of the study)"
    counts: dict[str, int] = {}
    for r in runs:
        if r.state not in store.TRAINED_STATES:
            word = "not started" if r.state == "pending" else r.state
            counts[word] = counts.get(word, 0) + 1
    if not counts:
        return line, 0
    rest = ", ".join(f"{n} {word}" for word, n in counts.items())
    return f"{line}: {rest} ({command} --retry-failed)", 1


def _not_trained_again(sub: Any, sweep_dir: Path, command: str) -> list[str]:
    """What the submission leaves as it is, said before the study waits: the runs failed or cancelled before
    (not trained again without --retry-failed), and any run set aside."""
    from klsweep import store

    counts: dict[str, int] = {}
    for rid, action in sub.actions.items():
        if action == "skip-failed":
            try:
                state = store.read_status(sweep_dir / rid).get("state", "failed")
            except store.UnreadableFile:
                state = "failed"
            counts[state] = counts.get(state, 0) + 1
    lines = []
    if counts:
        what = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        lines.append(
            f"{what} before: not trained again, the study goes on without "
            f"{'it' if sum(counts.values()) == 1 else 'them'} ({command} --retry-failed trains them)"
        )
    lines += sub.hints(failed_runs=False)
    return lines


def _cpus(environment: Any) -> set[str]:
    """The CPU models of a report's environment table (``environment.csv``, or the DataFrame), the runs that
    recorded none left out."""
    cpus = environment.get("cpu") if environment is not None and len(environment) else None
    return set() if cpus is None else {c for c in cpus if isinstance(c, str) and c}


def _expected_cpus(claims_csv: str | Path) -> set[str]:
    """The CPU models the runs behind a committed ``claims.csv`` trained on: its report's ``environment.csv``;
    none when that is missing or unreadable (the comparison of verdicts does not need it)."""
    import pandas as pd

    try:
        return _cpus(
            pd.read_csv(Path(claims_csv).parent / "environment.csv", dtype=str, keep_default_na=False)
        )
    except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError):
        return set()


def cpu_note(expected: set[str], ours: set[str]) -> str | None:
    """Why verdicts may differ when the runs behind the expected ones trained on other CPUs, or None."""
    if not expected or not ours or expected == ours:
        return None
    return (
        f"the expected verdicts' runs trained on {', '.join(sorted(expected))}, these on "
        f"{', '.join(sorted(ours))}. With the same AVX2 kernels a CPU of another vendor still rounds "
        "differently (MKL, for one, picks its code paths by vendor): then every run trains another "
        "trajectory, and this study replicates the expected one, as a new seed set would, rather than "
        "reproducing it"
    )


def run_study(
    grid_path: str | Path,
    overrides: list[str] | None = None,
    *,
    cluster: str | None = None,
    out: str | Path = "results",
    formats: Sequence[str] | None = None,
    retry_failed: bool = False,
    on_stage: Callable[[str], None] = lambda stage: None,
    on_progress: Callable[[list[Any]], None] | None = None,
    on_eval_progress: Callable[[Any], None] | None = None,
    expect_claims: str | Path | None = None,
    config_dirs: list[str] | None = None,
    add_to_folder: bool = False,
) -> StudyResult:
    """Plan, train (wait), evaluate (wait), report. ``cluster`` defaults to the grid's ``cluster.kind``; Ctrl-C
    while it waits raises ``submit.Interrupted`` (the sweep's jobs go on).
    ``expect_claims``: a ``claims.csv`` (e.g. the committed one) whose verdicts this study's are compared with;
    it is read before anything runs (the report may overwrite it). A change of a verdict it marks fragile (its
    ``replication`` column) is set apart (``fragile_changes``); one of a robust verdict is a failure
    (``claim_changes``). A sweep folder holding runs this grid does not have is refused unless
    ``add_to_folder`` (``submit.sweep.check_folder``). ``on_progress``: the runs while they train;
    ``on_eval_progress``: the evaluation's ``submit.EvalProgress`` while it runs."""
    from klsweep import grid, planner, report, submit
    from klsweep.grid import seeds
    from klsweep.submit.sweep import check_folder

    expected = report.read_expected(expect_claims) if expect_claims is not None else None
    expected_cpus = _expected_cpus(expect_claims) if expect_claims is not None else set()
    plan = grid.load_plan(grid_path, overrides, out=out, config_dirs=config_dirs)
    planner.check(plan)  # refuses runs that cannot start or fit
    check_folder(plan, add_to_folder)  # before anything is built or written
    kind = cluster or submit.default_cluster(plan)
    sections = {json.dumps(r.config.get("eval", {}), sort_keys=True) for r in plan.runs}
    suites = {json.loads(s).get("suite", "none") for s in sections}
    if suites == {"none"}:
        raise UserError(
            Problem(
                str(grid_path),
                "no eval suite: a study evaluates its runs",
                "set eval: tiny (or paper) in base",
            ),
            title="not a study",
        )
    if len(sections) > 1:
        what = (
            f"several eval suites {sorted(suites)}"
            if len(suites) > 1
            else "runs with different eval settings"
        )
        raise UserError(
            Problem(str(grid_path), what, "one eval suite and its settings (eval.*) per study"),
            title="not a study",
        )
    command = study_command(grid_path, overrides, out)
    rule = plan.seed_rule
    first = plan if rule is None else _subset(plan, seeds.pilot_ids(plan.runs, rule))
    if rule is not None:
        on_stage(
            f"pilot: {_runs(len(first.runs))}, the first {rule.pilot} seeds of each configuration (the seed rule "
            f"sizes the rest, up to the grid's {_runs(len(plan.runs))})"
        )
    what = "" if rule is None else " (the pilot)"
    runs, outcome = _train_and_eval(
        first, what, kind, retry_failed, add_to_folder, command, on_stage, on_progress, on_eval_progress
    )
    if outcome is None:  # nothing trained to its end: nothing to evaluate or report
        return StudyResult(sweep_dir=plan.sweep_dir, runs=runs, eval=None, report=None, command=command)
    decisions = None
    if rule is not None:
        on_stage("seeds: the pilot's report, then the rule")
        decisions, grown = _seed_rule(plan, rule, first, on_stage)
        if len(grown.runs) > len(first.runs):
            what = f" (the pilot and the {_runs(len(grown.runs) - len(first.runs))} the rule adds: the same grid)"
            _, more = _train_and_eval(
                grown, what, kind, retry_failed, True, command, on_stage, on_progress, on_eval_progress
            )
            outcome = more if more is not None else outcome
    runs = submit.status(plan.sweep_dir)  # the eval column: the runs as they stand after their eval
    on_stage("report")  # said before the report's imports (pandas, matplotlib: seconds), its stages after
    rep = report.build_report(plan.sweep_dir, formats=formats or report.DEFAULT_FORMATS, on_progress=on_stage)
    changes = fragile = None
    if expected is not None:
        verdicts = {c: v for c, (v, *_) in expected.items()}
        changes, fragile = report.split_changes(report.verdict_changes(verdicts, rep.claims), expected)
    return StudyResult(
        sweep_dir=plan.sweep_dir, runs=runs, eval=outcome, report=rep, command=command, claim_changes=changes,
        fragile_changes=fragile,
        cpu_note=cpu_note(expected_cpus, _cpus(rep.environment)) if expected is not None else None,
        seeds=decisions,
    )  # fmt: skip


def _subset(plan: Any, ids: set[str]) -> Any:
    """The plan with only the runs ``ids`` names (the same grid: its name, folder, grid text and run ids)."""
    import dataclasses

    return dataclasses.replace(plan, runs=[r for r in plan.runs if r.id in ids])


def _train_and_eval(
    plan: Any,
    what: str,
    kind: str,
    retry_failed: bool,
    add_to_folder: bool,
    command: str,
    on_stage: Callable[[str], None],
    on_progress: Callable[[list[Any]], None] | None,
    on_eval_progress: Callable[[Any], None] | None,
) -> tuple[list[Any], Any]:
    """Train the plan's runs (wait), then evaluate every finished run of the sweep and the step-0 baseline
    (wait): (the sweep's runs after training, the eval's outcome: None when no run trained to its end).
    ``what``: which runs they are, said after their number."""
    from klsweep import store, submit

    on_stage(f"train: {_runs(len(plan.runs))}{what} on {kind}")
    sub = submit.submit(
        plan, kind, retry_failed=retry_failed, chain_eval=False, add_to_folder=add_to_folder,
        on_build=lambda p: on_stage(f"building the tiny model (once, cached in {p})"),
    )  # fmt: skip
    for line in _not_trained_again(sub, plan.sweep_dir, command):
        on_stage(line)
    try:  # Ctrl-C from here on: the sweep's jobs go on, say so
        runs = submit.wait_until_final(plan.sweep_dir, on_update=on_progress)
        if not any(r.state in store.TRAINED_STATES for r in runs):  # nothing to evaluate or report
            return runs, None
        on_stage("eval: every finished run and the step-0 baseline")
        # the runs' own eval settings (the grid's eval.* overrides included), not the suite file's defaults
        return runs, submit.submit_eval(plan.sweep_dir, cluster=kind, wait=True, on_progress=on_eval_progress)
    except KeyboardInterrupt:
        raise submit.Interrupted(plan.sweep_dir) from None


def _seed_rule(plan: Any, rule: Any, pilot: Any, on_stage: Callable[[str], None]) -> tuple[list[Any], Any]:
    """The seed rule on the pilot's runs (``report.seedrule``; its decision written beside the sweep, said line
    by line): (each claim's decision, the plan of the pilot and the seeds the rule adds)."""
    import tempfile

    from klsweep import report
    from klsweep.grid import claims as claims_mod
    from klsweep.grid import seeds
    from klsweep.report import seedrule

    with tempfile.TemporaryDirectory(prefix="klsweep-pilot-") as scratch:  # the runs' metrics, evals, audit
        rep = report.build_report(plan.sweep_dir, out_dir=scratch, formats=("csv",), wandb=False)
    lists = seeds.seed_lists(plan.runs)
    configuration = {r.id: c for c, rs in lists.items() for r in rs}
    budgets = {c: len(rs) for c, rs in lists.items()}
    ids = {r.id for r in pilot.runs}
    tested = claims_mod.grid_claims(plan.grid_text, str(plan.sweep_dir))
    flat = {r.id: _flat(r.config) for r in plan.runs}
    decisions = seedrule.decide(rep.runs, rep.audit, tested, rule, configuration, budgets, flat, pilot=ids)
    chosen = seedrule.seeds_by_configuration(decisions, budgets, rule.pilot)
    seedrule.write_decision(plan.sweep_dir, rule, decisions, chosen, name=seeds.shown)
    for d in decisions:
        on_stage(f"seeds: {d.line()}")
    return decisions, _subset(plan, {r.id for c, rs in lists.items() for r in rs[: chosen[c]]})


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys (the claims' filters on keys runs.csv lacks read them)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
