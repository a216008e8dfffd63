"""``build_report``: the report of a sweep end to end: read the store (``data.py``), attach the stability columns
(``stability.py``), build the tables (``tables.py``, ``audit_table.py``, ``reference.py``, the tests and claims of
``claims.py``), draw the figures
(``figures.py``) and write each format asked for (``render.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from klsweep import store
from klsweep.errors import Problem, UserError
from klsweep.report.audit_table import _audit_table
from klsweep.report.claims import _claims_table, _comparisons_table
from klsweep.report.data import ID_AVG, OOD_AVG, _attach_deltas, _attach_evals, _baseline, _load_runs
from klsweep.report.figures import _plot_curves, _plot_eval
from klsweep.report.reference import REFERENCE_CSV, _reference_table
from klsweep.report.render import _WRITERS, FORMATS
from klsweep.report.stability import COLLAPSE_FRACTION, WINDOW, _attach_stability
from klsweep.report.tables import Report, _environment_table, _label_configs, _main_table, _stability_table


def build_report(
    sweep_dir: str | Path,
    out_dir: str | Path | None = None,
    formats: Sequence[str] = ("md",),
    *,
    eval_hash: str | None = None,
    window: int = WINDOW,
    collapse_fraction: float = COLLAPSE_FRACTION,
    reference_csv: str | Path | None = REFERENCE_CSV,
) -> Report:
    """Read every run of the sweep, build the tables and plots, write them in ``formats`` to ``out_dir``
    (default ``<sweep>/report/``). UserError when the sweep does not exist or has no runs, a format or the
    eval hash is unknown."""
    sweep = store.resolve_sweep(sweep_dir)
    formats = _check_formats(formats)
    if window < 1 or not 0 < collapse_fraction < 1:
        raise UserError(
            [Problem("window", f"{window}", "an integer >= 1")] * (window < 1)
            + [Problem("collapse_fraction", f"{collapse_fraction}", "0 < x < 1")]
            * (not 0 < collapse_fraction < 1)
        )
    dirs = store.run_dirs(sweep)
    if not dirs:
        raise UserError(
            Problem(
                str(sweep),
                "has no runs (no sub-folder with a config.yaml)",
                "plan and launch it: `klsweep run`",
            ),
            title="nothing to report",
        )
    out = Path(out_dir) if out_dir is not None else sweep / store.REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)

    runs, configs, axes, metrics = _load_runs(dirs)
    chosen, in_domain, ood = _attach_evals(sweep, runs, configs, eval_hash)
    _attach_stability(runs, metrics, window, collapse_fraction)
    baseline = _baseline(sweep, chosen, in_domain, ood)
    _attach_deltas(runs, baseline)
    runs = _label_configs(runs, axes)
    audit = _audit_table(runs)
    report = Report(
        sweep_dir=sweep,
        out_dir=out,
        eval_hash=chosen,
        axes=axes,
        in_domain=in_domain,
        ood=ood,
        runs=runs,
        main=_main_table(runs, axes, in_domain, ood),
        baseline=baseline,
        stability=_stability_table(runs, axes),
        audit=audit,
        reference=_reference_table(runs, axes, in_domain + ood, reference_csv),
        comparisons=_comparisons_table(runs, axes, [ID_AVG, OOD_AVG]),
        claims=_claims_table(runs, audit),
        environment=_environment_table(runs),
        window=window,
        collapse_fraction=collapse_fraction,
    )
    report.paths += _plot_curves(report, metrics, out / "curves.png")
    report.paths += _plot_eval(report, out / "eval_bars.png")
    for fmt in formats:
        report.paths += _WRITERS[fmt](report)
    return report


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
