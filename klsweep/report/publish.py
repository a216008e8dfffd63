"""The report logged to W&B, beside the runs it reports (``log_report``): a run of ``job_type="report"``.

When: the sweep's runs mirrored to W&B online (the report goes online, in their project and group); runs that
mirrored offline only get an offline report (``<report folder>/wandb/``) when asked (``klsweep report --wandb``),
so a plain report writes no W&B files. Opened with ``tracking.open_run`` (its one fallback rule). It holds the
main, stability and claims tables, the figures, and every file written as the artifact ``<sweep>-report``.
W&B never fails the report (``Report.warnings``). More: docs/DESIGN.md (W&B).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import tracking
from klsweep.config import load_run
from klsweep.errors import describe

if TYPE_CHECKING:
    import pandas as pd

    from klsweep.report.tables import Report

TABLES = ("main", "stability", "claims")
FIGURES = ("curves", "eval_bars")


def log_report(report: Report, run_dirs: Sequence[Path], offline: bool = False) -> Path | None:
    """Log ``report`` to W&B when the runs in ``run_dirs`` mirrored online (or, with ``offline``, offline: see
    the module docstring). Returns the W&B run's folder, None when nothing was logged (a warning in
    ``report.warnings`` says why, unless there was nothing to log)."""
    modes = {d: tracking.training_mode(d) for d in run_dirs}
    mode = (
        "online"
        if "online" in modes.values()
        else "offline"
        if offline and "offline" in modes.values()
        else None
    )
    if mode is None:
        return None
    config = load_run(next(d for d, m in modes.items() if m == mode))

    def warn(text: str) -> None:
        report.warnings.append(f"{text}; the report's files are complete")

    run = tracking.open_run(config, report.out_dir, mode, warn, job_type="report", name="report")
    if run is None:
        return None
    try:
        _log(run, report)
    except Exception as e:
        warn(f"W&B: the report was not logged ({describe(e)})")
        with contextlib.suppress(Exception):
            run.finish(exit_code=1)
        return None
    run.finish()
    return Path(run.dir).parent  # run.dir is the run's files/ folder


def _log(run: Any, report: Report) -> None:
    import wandb

    row: dict[str, Any] = {
        name: wandb.Table(dataframe=_plain(getattr(report, name)))
        for name in TABLES
        if name != "claims" or len(report.claims)  # no claims, no claims table
    }
    for name in FIGURES:
        png = report.out_dir / f"{name}.png"
        if png in report.paths:
            row[name] = wandb.Image(str(png))
    run.log(row)
    artifact = wandb.Artifact(f"{run.group or 'klsweep'}-report", type="report")
    for path in dict.fromkeys(report.paths):
        if path.is_file():
            artifact.add_file(str(path), name=path.relative_to(report.out_dir).as_posix())
    run.log_artifact(artifact)
    for name in ("report.md", "report.html"):
        if (report.out_dir / name).is_file():
            run.save(str(report.out_dir / name), base_path=str(report.out_dir), policy="now")


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """A table W&B takes: string column names, numbers as floats, anything else as text (missing: empty)."""
    import pandas as pd

    out = pd.DataFrame(index=range(len(frame)))
    for column in frame.columns:
        values = frame[column].reset_index(drop=True)
        if pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values):
            values = values.map(lambda v: "" if v is None or (isinstance(v, float) and v != v) else str(v))
        else:
            values = values.astype(float)
        out[str(column)] = values
    return out
