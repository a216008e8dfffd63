"""``build_report``: the report of a sweep end to end: read the store (``data.py``), attach the stability columns
(``stability.py``), build the tables (``tables.py``, ``audit_table.py``, ``reference.py``, the tests and claims of
``claims.py``), draw the figures
(``figures.py``), write each format asked for (``render.py``) and log it to W&B (``publish.py``)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from klsweep import store
from klsweep.errors import Problem, UserError
from klsweep.grid.claims import Claim, grid_claims, read_claims_file
from klsweep.grid.labels import LabelRule, grid_labels, read_labels_file
from klsweep.printable import counted
from klsweep.report.audit_table import audit_table
from klsweep.report.claims import claims_table, comparisons_table
from klsweep.report.data import (
    ID_AVG,
    OOD_AVG,
    attach_deltas,
    attach_evals,
    load_baseline,
    load_runs,
    not_there_yet,
)
from klsweep.report.engine import attach_engine_agreement
from klsweep.report.figures import draw_figures
from klsweep.report.problems import OUTCOME_CACHE, load_outcomes
from klsweep.report.publish import log_report
from klsweep.report.reference import REFERENCE_CSV, reference_table
from klsweep.report.render import DEFAULT_FORMATS, FORMATS, VECTOR_FORMATS, WRITERS
from klsweep.report.stability import COLLAPSE_CACHE, WINDOW, attach_stability, rule_text, run_rule
from klsweep.report.tables import Report, environment_table, label_configs, main_table, stability_table

if TYPE_CHECKING:
    import pandas as pd


def build_report(
    sweep_dir: str | Path,
    out_dir: str | Path | None = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
    *,
    eval_hash: str | None = None,
    window: int = WINDOW,
    reference_csv: str | Path | None = REFERENCE_CSV,
    wandb: bool | None = None,
    claims: str | Path | None = None,
    labels: str | Path | None = None,
    on_tables: Callable[[Report], None] | None = None,
    rehearsal: bool = False,
    on_progress: Callable[[str], None] | None = None,
) -> Report:
    """Read every run of the sweep, build the tables and plots, write them in ``formats`` to ``out_dir``
    (default ``<sweep>/report/``) and log it to W&B (``publish.py``; never a failure: ``Report.warnings``):
    ``wandb`` None when the runs mirrored online, True also offline beside runs that mirrored offline, False never. ``window``: the smoothing of the curves and of the
    stability table (the collapse rule is each run's own). ``claims``: a YAML file whose ``claims:`` the report
    tests (default: the sweep's grid file's, as sweep.yaml keeps it; none: no claims table). ``labels``: a YAML
    file whose ``labels:`` name the configurations (default: the sweep's grid file's; ``names.py``). ``on_tables``:
    called with the report once its tables are built, while its figures are still being drawn (the CLI prints
    them then, seconds before a large sweep's figures are done). ``rehearsal``: the folder is a rehearsal's
    (``klsweep rehearse`` reports it; any other caller is refused one). ``on_progress``: a line at each stage
    (``report: reading 88 runs; about 12 s left``: the time left as the folder's last report took, ``Took``).
    UserError when the sweep does not
    exist or has no readable run, a format or the eval hash is unknown, or the report cannot be written there.
    A run whose files cannot be read is left out and named in ``Report.set_aside``."""
    sweep = store.resolve_sweep(sweep_dir, rehearsal=rehearsal)
    formats = _check_formats(formats)
    if window < 1:
        raise UserError(Problem("window", f"{window}", "an integer >= 1"))
    # what is wrong with the claims, raised with the checks that need the runs (metrics, keys): all at once
    claim_problems: list[Problem] = []
    tested = (
        read_claims_file(claims, claim_problems)
        if claims is not None
        else _sweep_claims(sweep, claim_problems)
    )
    label_problems: list[Problem] = []
    label_rules = (
        read_labels_file(labels, label_problems)
        if labels is not None
        else _sweep_labels(sweep, label_problems)
    )
    if label_problems:  # checked without the runs: refused before anything is read or written
        raise UserError([*claim_problems, *label_problems], title="invalid labels")
    dirs = store.sweep_runs(sweep)
    out = Path(out_dir) if out_dir is not None else sweep / store.REPORT_DIR
    # report/ (or what is in it) linked out of the sweep: refused as run and eval refuse one; an --out given
    # is where the user asked for the report, what is in it stays inside it
    store.refuse_links_out(out if out_dir is not None else sweep, [out])
    store.check_writable(
        out, "--out" if out_dir is not None else str(sweep), "a folder you can write to: --out DIR"
    )

    took = Took(out, len(dirs), on_progress)
    took.stage(f"reading {counted(len(dirs), 'run')}")
    set_aside: list[str] = []
    # bad claims: nothing written (not even the caches of what was read) before they are reported with the runs'
    # checks
    caches = None if claim_problems else out
    runs, configs, axes, metrics = load_runs(dirs, set_aside, cache=caches)
    if not len(runs):
        raise UserError(
            [Problem(str(sweep), "no run can be read"), *(Problem("set aside", s) for s in set_aside)],
            title="nothing to report",
        )
    missing: list[str] = []
    choice, in_domain, ood = attach_evals(sweep, runs, eval_hash, set_aside, missing, configs)
    chosen = choice.hash
    missing[:0] = not_there_yet(runs, metrics, sweep)
    baseline = load_baseline(sweep, chosen, in_domain, ood, set_aside)
    outcomes = load_outcomes(
        sweep,
        runs,
        chosen,
        {ID_AVG: in_domain, OOD_AVG: ood},
        missing,
        cache=caches and caches / OUTCOME_CACHE,
        baselines=list(baseline["folder"]),
    )
    # each run's own collapse rule (klsweep.collapse), as the trainer applied it
    rules = {run: run_rule(c) for run, c in zip(runs["run"], configs, strict=True)}
    run_configs = dict(zip(runs["run"], configs, strict=True))
    folders = {d.name: d for d in dirs}
    attach_stability(runs, metrics, window, rules, folders, caches and caches / COLLAPSE_CACHE)
    engine_flags = attach_engine_agreement(runs, metrics)
    attach_deltas(runs, baseline)
    runs, names = label_configs(runs, axes, label_rules, run_configs)
    audit, cache_warnings = _audit_table(runs)
    main = main_table(runs, axes, in_domain, ood, outcomes, baseline)
    report = Report(
        sweep_dir=sweep,
        out_dir=out,
        eval_hash=chosen,
        eval_label=choice.label,
        eval_note=choice.note,
        names=names,
        axes=axes,
        in_domain=in_domain,
        ood=ood,
        runs=runs,
        main=main,
        baseline=baseline,
        stability=stability_table(runs, axes),
        audit=audit,
        reference=reference_table(runs, axes, in_domain + ood, reference_csv, main),
        comparisons=comparisons_table(runs, axes, [ID_AVG, OOD_AVG], outcomes),
        claims=claims_table(runs, audit, tested, run_configs, claim_problems, outcomes=outcomes),
        environment=environment_table(runs),
        window=window,
        collapse_rule=rule_text(configs),
        set_aside=set_aside,
        missing=missing,
        engine_flags=engine_flags,
        warnings=cache_warnings,
        formats=formats,
    )
    figures = None
    try:
        out.mkdir(parents=True, exist_ok=True)
        report.paths += _seed_decision(report, sweep, "csv" in formats)  # before report.md states it
        took.stage("figures, and the tables meanwhile")
        figures = draw_figures(report, metrics, out, vector=any(f in VECTOR_FORMATS for f in formats))
        if on_tables is not None:
            on_tables(report)
        written = {
            fmt: WRITERS[fmt](report) for fmt in formats if fmt != "html"
        }  # while the figures are drawn
        report.paths += figures()
        if "html" in formats:  # embeds the figures
            took.stage("the web page")
            written["html"] = WRITERS["html"](report)
    except OSError as e:  # a full disk, a quota, a folder gone: each file is its old or its new self (atomic)
        _let_figures_end(figures)
        where = f" ({e.filename})" if e.filename else ""
        raise UserError(
            Problem(
                str(out),
                f"cannot write the report: {e.strerror or e}{where}",
                "free space there, or --out DIR",
            ),
            title="report not written",
        ) from e
    report.paths += [p for fmt in formats for p in written[fmt]]
    took.done()
    if wandb is not False:
        reported = set(runs["run"])
        readable = [d for d in dirs if d.name in reported]
        report.wandb_run = log_report(report, readable, offline=bool(wandb))
    return report


def _seed_decision(report: Report, sweep: Path, csv: bool) -> list[Path]:
    """The seed rule's decision (``seedrule.DECISION_FILE``, written by the study) in the report: its lines
    (report.md, report.html) and, with ``csv``, ``seeds.csv``; a decision that cannot be read is a warning."""
    from klsweep.report import seedrule

    try:
        decision = seedrule.read_decision(sweep)
    except ValueError as e:
        report.warnings.append(str(e))
        decision = None
    if decision is None:
        return seedrule.write_table(report.out_dir, None) if csv else []
    report.seeds = decision[0]
    return seedrule.write_table(report.out_dir, decision[1]) if csv else []


TOOK_FILE = ".took.json"  # in the report folder: the seconds its last build took and for how many runs
TOOK_BYTES = 1024  # a longer one is not read


class Took:
    """The report's progress lines: each stage with the time left as the folder's last report took (scaled
    by the runs when there are more now; its file never trusted beyond a number); none the first time. ``done``
    records this build's time for the next."""

    def __init__(self, out: Path, runs: int, on_progress: Callable[[str], None] | None):
        import time

        self.out, self.runs, self.on_progress, self.start = out, runs, on_progress, time.time()
        self.expected: float | None = None
        if on_progress is None:
            return
        with contextlib.suppress(
            OSError, ValueError, TypeError, KeyError, RecursionError, UnicodeDecodeError, store.UnreadableFile
        ):  # never trusted: a regular file of at most TOOK_BYTES holding two numbers, or no estimate
            last = json.loads(store.read_bytes(out / TOOK_FILE, limit=TOOK_BYTES))
            seconds, then = float(last["seconds"]), int(last["runs"])
            if 0 < seconds < 86400 and then > 0:
                self.expected = seconds * max(1.0, runs / then) if runs >= then else seconds

    def stage(self, what: str) -> None:
        import time

        if self.on_progress is None:
            return
        line = f"report: {what}"
        if self.expected is not None:
            left = max(1, round(self.expected - (time.time() - self.start)))
            line += f"; about {left} s left (the last report here took {self.expected:.0f} s)"
        self.on_progress(line)

    def done(self) -> None:
        import time

        with contextlib.suppress(OSError):
            store.write_json(
                self.out / TOOK_FILE, {"seconds": round(time.time() - self.start, 1), "runs": self.runs}
            )


def _let_figures_end(figures: Callable[[], list[Path]] | None) -> None:
    """Wait for the figures' children after a table could not be written: killed, a child would leave its
    half-written temporary file behind; left to end, it removes it (its own error is the same disk's)."""
    if figures is None:
        return
    with contextlib.suppress(OSError):
        figures()


def _audit_table(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``audit_table``, and what its cache could not keep (``CacheWarning``s: a read-only or full cache folder),
    as the report's warnings; other warnings go on as they were."""
    import warnings

    from klsweep.audit.cache import CacheWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CacheWarning)
        table = audit_table(runs)
    for w in caught:
        if not issubclass(w.category, CacheWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return table, list(dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, CacheWarning)))


def _sweep_claims(sweep: Path, problems: list[Problem]) -> list[Claim]:
    """The claims of the grid file the sweep was planned from (sweep.yaml's ``grid`` text); none without it."""
    text = store.read_sweep_file(sweep).get("grid")
    return grid_claims(text, f"{sweep / store.SWEEP_FILE}: grid", problems) if isinstance(text, str) else []


def _sweep_labels(sweep: Path, problems: list[Problem]) -> list[LabelRule]:
    """The label rules of the grid file the sweep was planned from (sweep.yaml's ``grid`` text)."""
    text = store.read_sweep_file(sweep).get("grid")
    return grid_labels(text, f"{sweep / store.SWEEP_FILE}: grid", problems) if isinstance(text, str) else []


def _check_formats(formats: Sequence[str]) -> list[str]:
    wanted = [
        f.strip().lower()
        for item in ([formats] if isinstance(formats, str) else formats)
        for f in item.split(",")
    ]
    wanted = [f for f in wanted if f]
    bad = [f for f in wanted if f not in FORMATS]
    if bad or not wanted:
        raise UserError(
            [Problem("--format", f"unknown format {f!r}", ", ".join(FORMATS)) for f in bad]
            or [Problem("--format", "no format given", ", ".join(FORMATS))]
        )
    return list(dict.fromkeys(wanted))
