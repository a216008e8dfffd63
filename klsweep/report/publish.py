"""The report logged to W&B, beside the runs it reports (``log_report``).

When the sweep's runs mirrored their training to W&B (each run's ``<run>/wandb/``: ``klsweep.tracking``), the
report goes there too: a W&B run of ``job_type="report"``, named ``report``, in the runs' project and entity,
grouped with them (group = the sweep's name), in the mode they used (online when any run was online; offline
otherwise, under ``<report folder>/wandb/offline-run-*``, uploaded later with ``wandb sync``). It holds

- the main table, the stability table and the claims as ``wandb.Table`` (``main``, ``stability``, ``claims``):
  the report's numbers, one row per configuration (per claim);
- each figure as a ``wandb.Image`` (``curves``, ``eval_bars``);
- every file the report wrote (report.md, report.html, the CSV and LaTeX tables, the figures) as the artifact
  ``<sweep>-report`` of type ``report``; report.md and report.html also among the run's files.

W&B never fails the report: online W&B that cannot start within the runs' ``wandb.init_timeout_s`` falls back
to offline, and when W&B cannot log at all the report is written anyway; either way with a warning
(``Report.warnings``). ``klsweep report --no-wandb`` logs nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import tracking
from klsweep.errors import describe

if TYPE_CHECKING:
    import pandas as pd

    from klsweep.report.tables import Report

TABLES = ("main", "stability", "claims")
FIGURES = ("curves", "eval_bars")


def log_report(report: Report, run_dirs: Sequence[Path], configs: Sequence[dict[str, Any]]) -> Path | None:
    """Log ``report`` to W&B when the sweep's runs did (see the module docstring); ``configs``: the runs' flat
    configs (dotted keys). Returns the W&B run's folder, None when nothing was logged (a warning in
    ``report.warnings`` says why, unless the runs never used W&B)."""
    modes = {tracking.training_mode(d) for d in run_dirs} - {None}
    if not modes:
        return None
    config = next(
        (c for d, c in zip(run_dirs, configs, strict=True) if tracking.training_mode(d)), configs[0]
    )
    kwargs: dict[str, Any] = dict(
        project=config.get("wandb.project") or "klsweep",
        entity=config.get("wandb.entity"),
        group=config.get("name") or report.sweep_dir.name,
        job_type="report",
        name="report",
        dir=str(report.out_dir),  # W&B writes <out>/wandb/offline-run-* (or run-*)
    )
    try:
        import wandb
    except ImportError as e:
        report.warnings.append(f"W&B: not logged ({describe(e)}); the report's files are complete")
        return None
    run = None
    if "online" in modes:
        try:
            settings = wandb.Settings(init_timeout=float(config.get("wandb.init_timeout_s") or 30))
            run = wandb.init(**kwargs, mode="online", settings=settings)
        except Exception as e:
            report.warnings.append(f"W&B online failed ({describe(e)}): logging the report offline instead")
            with contextlib.suppress(Exception):
                wandb.teardown()
    try:
        if run is None:
            run = wandb.init(**kwargs, mode="offline")
        _log(run, report)
    except Exception as e:
        report.warnings.append(f"W&B: the report was not logged ({describe(e)}); its files are complete")
        if run is not None:
            with contextlib.suppress(Exception):
                run.finish(exit_code=1)
        return None
    run.finish()
    return Path(run.dir).parent  # run.dir is the run's files/ folder


def _log(run: Any, report: Report) -> None:
    import wandb

    row: dict[str, Any] = {name: wandb.Table(dataframe=_plain(getattr(report, name))) for name in TABLES}
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
