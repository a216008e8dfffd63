"""The study's reported numbers beside ours: each figure of ``paper_reference.csv`` (package data, beside this
module, so every install has it; its columns: ``paper_reference.md``) with the mean over seeds (± std, and the half-width of its 95% CI) of every
configuration of the sweep that matches its model, training task and configuration."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from klsweep.errors import Problem, UserError
from klsweep.report.statistics import t_interval

if TYPE_CHECKING:
    import pandas as pd

REFERENCE_CSV = Path(__file__).resolve().parent / "paper_reference.csv"
# A figure is shown only with the table or figure of the paper it was read from: a number quoted second-hand
# cannot be checked, and one read off a plot is not a reported figure.
_TRACED = re.compile(r"\b(?:Table|Figure|Fig\.)\s*[A-Z]?\d+", re.IGNORECASE)
TRACED = 'a source naming the paper\'s table or figure, e.g. "arXiv 2512.21852, Table 2"'


def reference_table(
    runs: pd.DataFrame,
    axes: list[str],
    tasks: list[str],
    reference_csv: str | Path | None,
    main: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The study's figures (one row per figure and matching configuration): model (a case-insensitive
    substring of model.path or model.name), training task, estimator, placement, lag, and beta and level where
    the figure gives them, all equal; the figure's eval key a substring of one of our eval tasks. Ours: the
    configuration's mean, and its interval as the main table gives it (``main``, one row per configuration in
    order: the same interval for the same quantity; without it the t-interval over seeds)."""
    import pandas as pd

    cols = [
        "model",
        "estimator",
        "placement",
        "beta",
        "lag",
        "eval",
        "paper",
        "source",
        "configuration",
        "task",
        "ours",
        "ours std",
        "ours ci",
        "ours n",
        "ours ci method",
    ]
    if reference_csv is None:
        return pd.DataFrame(columns=cols)
    if not Path(reference_csv).is_file():
        raise UserError(
            Problem(
                "reference_csv",
                f"no such file: {reference_csv}",
                "a CSV with the columns of paper_reference.md",
            )
        )
    ref = pd.read_csv(reference_csv)
    untraced = [
        Problem(f"{reference_csv}: row {i + 2}", f"source {source!r} names no table or figure", TRACED)
        for i, source in enumerate(ref["source"])
        if not _TRACED.search(str(source))
    ]
    if untraced:
        raise UserError(untraced, title="reference figures without their place in the paper")
    rows = []
    for _, f in ref.iterrows():
        model = str(f["model"]).lower()
        match = runs[
            (
                runs["model.path"].astype(str).str.lower().str.contains(model, regex=False)
                | runs["model.name"].astype(str).str.lower().str.contains(model, regex=False)
            )
            & (runs["task.name"] == f["task"])
            & (runs["kl.estimator"] == f["estimator"])
            & (runs["kl.placement"] == f["placement"])
            & (runs["offpolicy.lag"].astype(float) == float(f["lag"]))
        ]
        if pd.notna(f.get("beta")):
            match = match[match["kl.beta"].astype(float) == float(f["beta"])]
        if pd.notna(f.get("level")):
            match = match[match["kl.level"] == f["level"]]
        for task in (t for t in tasks if str(f["eval"]) in t):
            for config, g in match.groupby("config", sort=True):
                at = main.iloc[int(config)] if main is not None and f"{task} ci" in main else None
                rows.append(
                    {
                        "model": f["model"],
                        "estimator": f["estimator"],
                        "placement": f["placement"],
                        "beta": f.get("beta"),
                        "lag": f["lag"],
                        "eval": f["metric_label"],
                        "paper": f["value"],
                        "source": f["source"],
                        "configuration": g["label"].iloc[0],
                        "task": task,
                        "ours": g[task].mean(),
                        "ours std": g[task].std(),
                        "ours ci": t_interval(list(g[task]))[1] if at is None else at[f"{task} ci"],
                        "ours n": int(g[task].count()),
                        "ours ci method": "seeds" if at is None else at.get(f"{task} ci method", "seeds"),
                    }
                )
    return pd.DataFrame(rows, columns=cols)
