"""The tables of a report, as numbers (``Report``) and as the formatted views every renderer prints.

``label_configs`` (configurations: runs grouped by the axes' values), ``main_table`` (scores with 95% CIs
over seeds, Δ from the step-0 baseline), ``stability_table``, ``environment_table``; ``VIEWS``/``view``: each
table as string cells and a bold mask (a best mean only when significantly better), with ``TITLES`` and
``captions``, which md, LaTeX, HTML and the terminal all print. Columns and rules: docs/REPORT.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import store
from klsweep.config import NO_KL
from klsweep.printable import visible
from klsweep.report.data import D_ID, D_OOD, ID_AVG, OOD_AVG, SE, baseline_folders, nan_to_none
from klsweep.report.names import DASH, SHORT, Names, fmt_value, sort_key
from klsweep.report.stability import DEFINITIONS, STABILITY_STATS, WINDOW, object_series
from klsweep.report.statistics import (
    ALPHA,
    LEVEL,
    RULE,
    fragile,
    problem_bootstrap,
    problem_counts,
    t_half_width,
    welch_summary,
)

if TYPE_CHECKING:
    import pandas as pd

    from klsweep.grid.labels import LabelRule
    from klsweep.report.problems import Outcomes


@dataclass
class Report:
    """What ``build_report`` computed and wrote. DataFrames are numeric (``<metric>``, ``<metric> std``,
    ``<metric> n`` columns); the files hold their formatted views."""

    sweep_dir: Path
    out_dir: Path
    eval_hash: str | None
    eval_label: str  # which eval the scores are, in words: suite, problems per task, hash (evalchoice.py)
    eval_note: str  # how that eval was chosen when not as the grid says, and the others present ("": none)
    names: Names  # each configuration's name (the ``label`` columns, the figures; names.py)
    axes: list[str]  # the dotted config keys that vary between runs (the configuration columns)
    in_domain: list[str]  # eval task names
    ood: list[str]
    runs: pd.DataFrame  # one row per run
    main: pd.DataFrame  # one row per configuration
    baseline: pd.DataFrame  # one row per model: the step-0 evaluation
    stability: pd.DataFrame  # one row per configuration
    audit: pd.DataFrame  # one row per KL configuration present
    reference: pd.DataFrame  # the study's figures beside ours
    comparisons: pd.DataFrame  # each configuration against its references (claims.py)
    claims: pd.DataFrame  # the study's claims, tested (claims.py)
    environment: pd.DataFrame  # one row per distinct recorded environment, with its run count
    window: int = WINDOW
    collapse_rule: str = ""  # the runs' collapse rules and their false-collapse rates (stability.rule_text)
    set_aside: list[str] = field(default_factory=list)  # unreadable files: each named, with what to do
    missing: list[str] = field(default_factory=list)  # what is not there yet (runs unfinished, not scored)
    engine_flags: list[str] = field(default_factory=list)  # vLLM runs whose kept fraction is low (engine.py)
    paths: list[Path] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)  # the formats written (render.FORMATS): what pages link
    warnings: list[str] = field(default_factory=list)  # what went wrong without failing it (W&B)
    wandb_run: Path | None = None  # the W&B run it was logged to (its folder), if any (``publish.py``)
    seeds: list[str] = field(
        default_factory=list
    )  # the seed rule and each claim's seeds (seedrule.py), if any


def label_configs(
    runs: pd.DataFrame,
    axes: list[str],
    rules: list[LabelRule] | None = None,
    configs: dict[str, dict[str, Any]] | None = None,
) -> tuple[pd.DataFrame, Names]:
    """Adds ``config`` (0.. in sorted axis order) and ``label``, each configuration's name ("k1 in reward, lag
    16": ``names.Names``, with the label ``rules`` of the grid; ``configs``: each run's flattened config, for
    rules on other keys); returns the runs and their ``Names``."""
    keys = (
        [tuple(nan_to_none(v) for v in row) for row in runs[axes].itertuples(index=False)]
        if axes
        else [()] * len(runs)
    )
    order = {k: i for i, k in enumerate(sorted(set(keys), key=sort_key))}
    runs["config"] = [order[k] for k in keys]
    runs = runs.sort_values(["config", "seed", "run"], kind="stable").reset_index(drop=True)
    names = Names(runs, axes, rules, configs)
    label = names.unique(list(order.values()))
    runs["label"] = runs["config"].map(label)
    return runs, names


def csv_cell(value: Any) -> Any:
    """A cell of a report's CSV: a float to ``CSV_DIGITS`` significant digits (a whole number whole: step
    12000 stays 12000; every digit: tables.json), any other number as it is; text as written (``visible``),
    and text that a spreadsheet would run as a formula (opening with ``= + - @``, a tab or a carriage return,
    and not a number) behind a ``'`` as OWASP recommends ("'=cmd|..." shows as typed in Excel, LibreOffice and
    Sheets)."""
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.{CSV_DIGITS}g}"
    if not isinstance(value, str):
        return value
    text = visible(value)
    if value[:1] in _FORMULA and not _is_number(value):
        text = "'" + text
    return text


_FORMULA = ("=", "+", "-", "@", "\t", "\r")
CSV_DIGITS = 4  # significant digits of a float in a report's CSV files: what the numbers carry


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def status_text(states: Sequence[str]) -> str:
    counts = {s: 0 for s in store.STATES}
    for s in states:
        counts[s] = counts.get(s, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in counts.items() if n)


def _config_frame(g: Any, axes: list[str]) -> pd.DataFrame:
    """The configuration columns (short names), run counts and status, one row per configuration (``g``: the
    runs grouped by ``config``)."""
    import pandas as pd

    first = g.first()
    df = pd.DataFrame(index=first.index)
    for a in axes:
        df[SHORT.get(a, a)] = first[a].astype(object)
    if not axes:
        df["configuration"] = "all runs"
    df["label"] = first["label"]
    df["runs"] = g.size()
    df["status"] = g["state"].agg(lambda s: status_text(list(s)))
    return df


def _add_stats(df: pd.DataFrame, g: Any, cols: list[str]) -> None:
    """``<c>``, ``<c> std``, ``<c> n`` and ``<c> ci``: the half-width of the t-based 95% CI of the mean over
    seeds (``statistics.t_half_width``; NaN with fewer than 2 seeds)."""
    for c in cols:
        agg = g[c].agg(["mean", "std", "count"])
        df[c] = agg["mean"]
        df[f"{c} std"] = agg["std"]
        df[f"{c} n"] = agg["count"]
        df[f"{c} ci"] = t_half_width(agg["std"], agg["count"])


def main_table(
    runs: pd.DataFrame,
    axes: list[str],
    in_domain: list[str],
    ood: list[str],
    outcomes: Outcomes | None = None,
    baseline: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per configuration: its scores over seeds (``_add_stats``), the eval's own noise, and the
    averages' intervals from per-problem outcomes (``_add_problem_intervals``) where every run has them, the
    Δ from step 0 paired on the problems with its step-0 model's (``baseline``: the step-0 rows)."""
    g = runs.groupby("config", sort=True)
    df = _config_frame(g, axes)
    df["evaluated"] = g["eval_step"].count()
    df["eval step"] = g["eval_step"].agg(_range_text)
    scores = [*in_domain, ID_AVG, *ood, OOD_AVG]
    _add_stats(df, g, [*scores, D_ID, D_OOD])
    for c in scores:  # the mean per-run lm-eval stderr: the eval's own noise
        df[f"{c} {SE}"] = g[f"{c} {SE}"].mean() if f"{c} {SE}" in runs else math.nan
    step0 = baseline_folders(runs, baseline) if baseline is not None and len(baseline) else [None] * len(runs)
    tasks = {ID_AVG: in_domain, OOD_AVG: ood}
    _add_problem_intervals(df, runs, outcomes or {}, step0, tasks)
    for c in [*scores, D_ID, D_OOD]:
        _drop_uninformative(df, c, SPANS[D_ID] if c in (D_ID, D_OOD) else SPANS[ID_AVG])
    return df.reset_index(drop=True)


CI_METHOD = "ci method"  # suffix of a score's column: how its interval was computed
BY_PROBLEMS, BY_SEEDS = "seeds x problems", "seeds"
DELTAS = {ID_AVG: D_ID, OOD_AVG: D_OOD}  # an average -> its change from step 0
SPANS = {ID_AVG: 1.0, D_ID: 2.0}  # the width of a score's range (0 to 1) and of its change's (-1 to 1)
NOT_INFORMATIVE = "not informative with {n} seeds"  # an interval wider than its metric's range: not given


def not_informative(n: Any) -> str:
    """The words that stand for an interval wider than its metric's range: "not informative with 2 seeds"."""
    return NOT_INFORMATIVE.format(n=int(n) if n == n else 0)


def _drop_uninformative(df: pd.DataFrame, c: str, span: float) -> None:
    """Where ``c``'s interval is wider than its metric's whole range (``span``: 1 for a score, 2 for its change
    from step 0): no interval (``<c> ci``, ``low``, ``high`` NaN) and ``<c> ci method`` says so
    (``not_informative``): "-0.11 ± 5.61" on an accuracy says nothing but that there were 2 seeds."""
    import numpy as np

    half = df[f"{c} ci"].to_numpy(float)
    low, high = (df.get(f"{c} {b}", _nans(len(df))) for b in ("low", "high"))
    width = np.where(
        np.isnan(np.asarray(low, float)), 2 * half, np.asarray(high, float) - np.asarray(low, float)
    )
    wide = width > span
    method = df.get(f"{c} {CI_METHOD}", [BY_SEEDS] * len(df))
    df[f"{c} {CI_METHOD}"] = [
        not_informative(n) if w else m for w, m, n in zip(wide, method, df[f"{c} n"], strict=True)
    ]
    df[f"{c} ci"] = np.where(wide, math.nan, half)
    if f"{c} low" in df:
        df[f"{c} low"] = np.where(wide, math.nan, df[f"{c} low"])
        df[f"{c} high"] = np.where(wide, math.nan, df[f"{c} high"])


def _nans(n: int) -> Any:
    """n NaNs (a column a frame lacks)."""
    import numpy as np

    return np.full(n, math.nan)


def is_uninformative(method: Any) -> bool:
    return isinstance(method, str) and method.startswith("not informative")


def _add_problem_intervals(
    df: pd.DataFrame,
    runs: pd.DataFrame,
    outcomes: Outcomes,
    step0: list[str | None],
    tasks: dict[str, list[str]] | None = None,
) -> None:
    """For each average, each of its tasks (``tasks``: an average's task names) and each average's Δ from step
    0, ``<c> low`` and ``<c> high``: the bounds of its hierarchical bootstrap interval over seeds and problems
    (``statistics.problem_bootstrap``; the problems' draws shared by every configuration and by a task and its
    average: a single task's score and its average are one quantity with one interval), joined with the
    t-interval over seeds (the union of the two: each misses one source of the noise), where all of a
    configuration's runs scored (2 or more) have per-problem outcomes (the Δ: and their
    step-0 model, ``step0`` each run's baseline folder, has them on the same problems: each run's outcomes less
    the step-0 model's, problem by problem, so the step-0 eval's own draw of problems is in the interval), and
    ``<c> ci`` then half its width; ``<c> ci method`` says which (``BY_PROBLEMS``, else ``BY_SEEDS``: the
    t-interval over seeds, the step-0 score taken as exact)."""
    import numpy as np

    runs = runs.assign(_step0=step0)
    tasks = tasks or {}
    per_task = {c: [t for t in tasks.get(c, []) if t in df] for c in DELTAS}
    bounds = {
        c: (np.full(len(df), math.nan), np.full(len(df), math.nan))
        for c in (*DELTAS, *DELTAS.values(), *(t for ts in per_task.values() for t in ts))
    }
    row = {config: i for i, config in enumerate(df.index)}
    for c, d in DELTAS.items():
        matrix = outcomes.get(c)
        if matrix is None:
            continue
        counts = problem_counts(matrix.task)
        projected = np.nan_to_num(matrix.values) @ counts.T  # each run's total on each resample's problems
        # a task's columns alone, scaled to its own score (a row's weights sum to 1 / tasks on each task)
        columns = {
            t: np.asarray(matrix.task) == matrix.tasks.index(t) for t in per_task[c] if t in matrix.tasks
        }
        by_task = {  # an average of one task is that task: its draws already projected
            t: projected
            if len(matrix.tasks) == 1
            else len(matrix.tasks) * (np.nan_to_num(matrix.values[:, cols]) @ counts[:, cols].T)
            for t, cols in columns.items()
        }
        for config, group in runs[runs[c].notna()].groupby("config", sort=True):
            names = group["run"]
            if len(names) < 2 or not matrix.complete(names):
                continue
            at, i = matrix.positions(names), row[config]
            _, bounds[c][0][i], bounds[c][1][i] = problem_bootstrap(
                matrix.values[at], matrix.task, projected=projected[at]
            )
            for t, cols in columns.items():
                values = len(matrix.tasks) * matrix.values[at][:, cols]
                _, bounds[t][0][i], bounds[t][1][i] = problem_bootstrap(
                    values, matrix.task[cols], projected=by_task[t][at]
                )
            folders = set(group["_step0"])
            base = matrix.step0.get(folders.pop()) if len(folders) == 1 else None
            if base is not None:  # paired on the problems: less the step-0 model's total on the same draws
                _, bounds[d][0][i], bounds[d][1][i] = problem_bootstrap(
                    matrix.values[at] - base, matrix.task, projected=projected[at] - base @ counts.T
                )
    for c, (low, high) in bounds.items():
        by_problems = ~np.isnan(low)
        # the union with the t-interval over seeds (``_add_stats``): the bootstrap of few seeds misses their
        # spread where it is large, the t-interval the problems' draw (docs/REPORT.md, "One interval per quantity")
        mean, half = df[c].to_numpy(float), df[f"{c} ci"].to_numpy(float)
        with_t = by_problems & ~np.isnan(half)
        low = np.where(with_t, np.fmin(low, mean - half), low)
        high = np.where(with_t, np.fmax(high, mean + half), high)
        df[f"{c} low"], df[f"{c} high"] = low, high
        df[f"{c} ci"] = np.where(by_problems, (high - low) / 2, df[f"{c} ci"])
        df[f"{c} {CI_METHOD}"] = np.where(by_problems, BY_PROBLEMS, BY_SEEDS)


def below_step0(df: pd.DataFrame, column: str) -> list[bool]:
    """Per configuration (row of ``main``): whether the 95% interval of its Δ ``column`` (``D_ID``, ``D_OOD``)
    lies wholly below 0: its upper bound (``<c> high``; over seeds: the mean plus the half-width) under 0."""
    import numpy as np

    high = df[f"{column} high"].to_numpy(float)
    over_seeds = (df[column] + df[f"{column} ci"]).to_numpy(float)
    upper = np.where(np.isnan(high), over_seeds, high)
    return [bool(u < 0) for u in upper]


STEP0_LEAD = {False: "Warning:", True: "WARNING:"}  # a step0_warnings line's lead-in (True: a no-KL one's)


def step0_warnings(report: Report) -> list[tuple[bool, str]]:
    """(loud, text) per configuration whose Δ in-domain interval lies wholly below 0 (``below_step0``): it ends
    worse on its own task than the model it started from. Loud for a no-KL configuration (``kl.beta`` 0 in
    every run): nothing held that one back, so the training itself hurts, and the sweep's learning rate or
    batch is suspect. Printed in report.md, report.html and the terminal."""
    df, runs = report.main, report.runs
    # main's rows are the configurations in order (main_table)
    no_kl = (
        [bool((beta == 0).all()) for _, beta in runs.groupby("config", sort=True)["kl.beta"]]
        if "kl.beta" in runs
        else [False] * len(df)
    )
    out = []
    for i, below in enumerate(below_step0(df, D_ID)):
        if not below:
            continue
        high = df[f"{D_ID} high"].iloc[i]
        if math.isnan(high):
            interval = f"{df[D_ID].iloc[i]:+.3f} ± {df[f'{D_ID} ci'].iloc[i]:.3f} over seeds"
        else:
            interval = f"{df[D_ID].iloc[i]:+.3f}, 95% CI {df[f'{D_ID} low'].iloc[i]:+.3f} to {high:+.3f}"
        label = df["label"].iloc[i]
        below_text = f"ends below its step-0 model in domain (Δ in-domain {interval})"
        if not no_kl[i]:
            out.append((False, f"{label} {below_text}"))
            continue
        who = "the no-KL baseline" + ("" if label == NO_KL else f" ({label})")
        out.append(
            (
                True,
                f"{who} {below_text}: training on the task's own reward made the model worse at that task, so "
                "this sweep's learning rate or batch is suspect (train.learning_rate; train.prompts_per_step x "
                "train.group_size: a step too large for the noise of its gradient), and its KL configurations "
                "are compared on training that degrades the model",
            )
        )
    return out


def _significant_best(report: Report, column: str) -> list[bool]:
    """Per configuration (row of ``main``): whether it has the best mean of ``column`` and that mean is
    significantly higher than every other configuration's with a value (one-sided Welch over seeds,
    p < ALPHA, from the table's own means, standard deviations and counts). A best that is not significantly
    better than the runner-up is not marked."""
    df = report.main
    marks = [False] * len(df)
    mean, var, n = df[column].to_numpy(), (df[f"{column} std"] ** 2).to_numpy(), df[f"{column} n"].to_numpy()
    present = [i for i in range(len(df)) if n[i] > 0]
    if len(present) < 2:
        return marks
    best = max(present, key=lambda i: mean[i])
    marks[best] = all(
        welch_summary(mean[best], mean[i], var[best], var[i], n[best], n[i], "greater").p < ALPHA
        for i in present
        if i != best
    )
    return marks


def _range_text(s: pd.Series) -> str:
    s = s.dropna()
    if s.empty:
        return DASH
    lo, hi = int(s.min()), int(s.max())
    return str(lo) if lo == hi else f"{lo}–{hi}"


def stability_table(runs: pd.DataFrame, axes: list[str]) -> pd.DataFrame:
    g = runs.groupby("config", sort=True)
    df = _config_frame(g, axes)
    df["with metrics"] = g["has_metrics"].sum()
    _add_stats(df, g, list(STABILITY_STATS))
    df["diverged"] = g["state"].agg(lambda s: int((s == "diverged").sum()))
    div = runs[runs["state"] == "diverged"]
    notes = [
        f"step {fmt_value(_int_or_none(step))}" + (f": {reason}" if nan_to_none(reason) else "")
        for step, reason in zip(div["diverged_step"], div["reason"], strict=True)
    ]
    df["diverged at"] = object_series(notes).groupby(div["config"].to_numpy()).agg("; ".join)
    df["diverged at"] = df["diverged at"].fillna("")
    df["collapsed"] = g["collapsed"].sum().astype(int)
    df["collapsed at"] = g["collapse_step"].agg(lambda s: ", ".join(str(int(x)) for x in s.dropna()))
    return df.reset_index(drop=True)


def environment_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct environment the runs recorded (``env.json``; ``klsweep/environment.py``): its
    fields and how many runs trained in it ("runs"); the runs with none recorded are one row of "—"."""
    import json

    import pandas as pd

    counts: dict[str, int] = {}
    for e in runs.get("env", []):
        key = e if isinstance(e, str) else ""
        counts[key] = counts.get(key, 0) + 1
    if not any(counts):  # none recorded (runs from before env.json, or not started): no table
        return pd.DataFrame()
    rows = [
        {**(json.loads(k) if k else {}), "runs": n}
        for k, n in sorted(counts.items(), key=lambda kv: (not kv[0], -kv[1], kv[0]))
    ]
    df = pd.DataFrame(rows)
    return df[[c for c in df.columns if c != "runs"] + ["runs"]] if len(df) else df


def _int_or_none(v: Any) -> int | None:
    v = nan_to_none(v)
    return None if v is None else int(v)


def _cell(
    mean: float,
    std: float = math.nan,
    n: int = 1,
    n_expected: int = 1,
    signed: bool = False,
    method: Any = None,
) -> str:
    """ "0.512 ± 0.034", with " (n=k)" when fewer seeds than the row's n have this value; "—" when none;
    "0.617 (not informative with 2 seeds)" where its interval is wider than the metric's range (``method``)."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return DASH
    s = f"{mean:+.3f}" if signed else f"{mean:.3f}"
    if is_uninformative(method):
        return f"{s} ({method})"
    if std is not None and not math.isnan(std):
        s += f" ± {std:.3f}"
    if n != n_expected:
        s += f" (n={n})"
    return s


def _config_columns(report: Report) -> list[str]:
    return [SHORT.get(a, a) for a in report.axes] or ["configuration"]


def _no_bold(out: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(False, index=out.index, columns=out.columns)


def _main_view(report: Report) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The main table: per configuration, each eval task's score, the averages with their CIs and the Δ from
    the step-0 baseline (whose rows come first); the significantly best values bold."""
    import pandas as pd

    cfg_cols = _config_columns(report)
    df = report.main
    metric_cols = [*report.in_domain, ID_AVG, *report.ood, OOD_AVG, D_ID, D_OOD]
    out = pd.DataFrame({c: df[c].map(fmt_value) for c in cfg_cols})
    out["status"] = df["status"]
    out["n"] = [f"{e}/{r}" for e, r in zip(df["evaluated"], df["runs"], strict=True)]
    out["step"] = df["eval step"]
    bold = _no_bold(out)
    for c in metric_cols:
        methods = df[f"{c} {CI_METHOD}"] if f"{c} {CI_METHOD}" in df else [BY_SEEDS] * len(df)
        out[c] = [
            _cell(m, s, n, e, signed=c in (D_ID, D_OOD), method=k)
            for m, s, n, e, k in zip(
                df[c], df[f"{c} ci"], df[f"{c} n"], df["evaluated"], methods, strict=True
            )
        ]
        bold[c] = _significant_best(report, c)
    for c in (ID_AVG, OOD_AVG):
        out[f"{c} {SE}"] = [_cell(v) for v in df[f"{c} {SE}"]]
        bold[f"{c} {SE}"] = False
    if len(report.baseline) and report.main[ID_AVG].notna().any() | report.main[OOD_AVG].notna().any():
        base = pd.DataFrame({c: [DASH] * len(report.baseline) for c in out.columns})
        if "model" in base:
            base["model"] = report.baseline["model.name"].map(fmt_value).to_numpy()
        base[cfg_cols[0] if cfg_cols[0] != "model" or len(cfg_cols) == 1 else cfg_cols[1]] = "step-0 baseline"
        base["status"] = "baseline"
        for c in metric_cols[:-2]:
            base[c] = [_cell(v) for v in report.baseline[c]]
        for c in (ID_AVG, OOD_AVG):
            base[f"{c} {SE}"] = DASH
        out = pd.concat([base, out], ignore_index=True)
        bold = pd.concat(
            [pd.DataFrame(False, index=base.index, columns=out.columns), bold], ignore_index=True
        )
    return out, bold


def _stability_view(report: Report) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The stability table: per configuration, each statistic with its CI, divergences and collapses."""
    import pandas as pd

    cfg_cols = _config_columns(report)
    df = report.stability
    out = pd.DataFrame({c: df[c].map(fmt_value) for c in cfg_cols})
    out["status"] = df["status"]
    for c in STABILITY_STATS:
        out[c] = [
            _cell(m, s, n, w)
            for m, s, n, w in zip(df[c], df[f"{c} ci"], df[f"{c} n"], df["with metrics"], strict=True)
        ]
    out["diverged"] = [
        f"{d}/{r}" + (f" ({a})" if a else "")
        for d, r, a in zip(df["diverged"], df["runs"], df["diverged at"], strict=True)
    ]
    out["collapsed"] = [
        f"{c}/{w}" + (f" (step {a})" if a else "") if w else DASH
        for c, w, a in zip(df["collapsed"], df["with metrics"], df["collapsed at"], strict=True)
    ]
    return out, _no_bold(out)


def _audit_view(report: Report) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The KL gradient audit: unbiased configurations bold."""
    df = report.audit
    out = df.astype(object)
    for c in ("effective scale", "cos reverse", "cos forward", "rel. err. reverse"):
        out[c] = [_cell(v) for v in df[c]]
    for c in ("beta", "G"):
        out[c] = df[c].map(fmt_value)
    bold = _no_bold(out)
    bold["unbiased"] = df["unbiased"] == "yes"
    return out.astype(str), bold


def _reference_view(report: Report) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The study's reported numbers beside ours."""
    import pandas as pd

    df = report.reference
    out = pd.DataFrame(
        {
            "model": df["model"],
            "estimator": df["estimator"],
            "placement": df["placement"],
            "eval": df["eval"],
            "paper": [f"{v:.3f}" for v in df["paper"]],
            "ours": [
                _cell(m, s, n, n, method=k) + ("" if is_uninformative(k) else f" (n={n})")
                for m, s, n, k in zip(
                    df["ours"],
                    df["ours ci"],
                    df["ours n"],
                    df.get("ours ci method", [None] * len(df)),
                    strict=True,
                )
            ],
            "our configuration": df["configuration"],
            "our eval task": df["task"],
        }
    )
    return out.astype(str), _no_bold(out)


def _comparisons_view(report: Report) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each configuration against its references: Welch's test or the paired one; a significant p bold."""
    import pandas as pd

    df = report.comparisons
    out = pd.DataFrame(
        {
            "configuration": df["configuration"],
            "reference": df["reference"],
            "metric": df["metric"],
            "difference": [
                _cell(d, h, signed=True, method=k)
                for d, h, k in zip(
                    df["difference"],
                    df["difference ci"],
                    df.get("difference ci method", [None] * len(df)),
                    strict=True,
                )
            ],
            "t": [_cell(v) if v == v else DASH for v in df["t"]],
            "df": [f"{v:.1f}" if v == v else DASH for v in df["df"]],
            "p": [fmt_p(v) for v in df["p"]],
            "n": [f"{a} vs {b}" for a, b in zip(df["n"], df["n reference"], strict=True)],
            "test": df["test"],
        }
    )
    bold = _no_bold(out)
    bold["p"] = df["p"] < ALPHA
    return out.astype(str), bold


def _claims_view(report: Report) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The study's claims with their verdicts (fragile ones marked: ``statistics.fragile``) and replication; a
    supported one bold."""
    import pandas as pd

    df = report.claims
    share, se = (pd.to_numeric(df[c], errors="coerce") for c in ("replication", "replication se"))
    out = pd.DataFrame(
        {
            "claim": df["claim"],
            "verdict": [
                verdict_text(v, r, e, d)
                for v, r, e, d in zip(df["verdict"], share, se, decide_column(df), strict=True)
            ],
            "replication": [
                replication_text(r, e, n) for r, e, n in zip(share, se, df["resamples"], strict=True)
            ],
            "test": df["test"],
            "statistic": [_cell(v) for v in df["statistic"]],
            "p": [fmt_p(v) for v in df["p_value"]],
            "p holm": [fmt_p(v) for v in df["p_holm"]],
            "n": df["n"].astype(str),
            "detail": df["detail"],
        }
    )
    bold = _no_bold(out)
    bold["verdict"] = df["verdict"] == "supported"
    return out.astype(str), bold


def decide_column(df: pd.DataFrame) -> list[str]:
    """A claims table's "to decide" cells ("" where absent: a claims.csv written before it)."""
    if "to decide" not in df.columns:
        return [""] * len(df)
    return ["" if v != v or v is None else str(v) for v in df["to decide"]]


def verdict_text(verdict: str, share: float, se: float, decide: str = "") -> str:
    """A claim's verdict as every table prints it: as is where it replicates; "(fragile)" beside it where its
    replication is fragile (``statistics.fragile``); and what would decide it, where the report says
    (``claims.to_decide``): "inconclusive at 10 seeds; 24 would decide it" (an inconclusive verdict, fragile or
    not), or "not supported (fragile): inconclusive at 10 seeds; ..." """
    shown = f"{verdict} (fragile)" if fragile(share, se) else verdict
    if not decide:
        return shown
    return decide if decide.startswith(f"{verdict} ") else f"{shown}: {decide}"


def replication_text(share: float, se: float, resamples: Any, digits: int = 3) -> str:
    """A verdict's replication as the tables print it: "0.795 ± 0.009 (2000)", the share ± its Monte Carlo
    standard error (the resamples drawn); "—" when not computed."""
    if share != share:
        return DASH
    drawn = f" ({int(resamples)})" if resamples == resamples and resamples else ""
    return f"{share:.{digits}f}" + (f" ± {se:.{digits}f}" if se == se else "") + drawn


def _environment_view(report: Report) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The Environment table: one column per distinct environment the runs trained in."""
    import pandas as pd

    df = report.environment.astype(object)
    out = pd.DataFrame({"field": [str(c) for c in df.columns]})
    for i in range(len(df)):
        out[f"environment {i + 1}"] = [fmt_value(v) for v in df.iloc[i]]
    return out, _no_bold(out)


# table name -> its view: (cells as strings, bold mask), what every renderer prints
VIEWS: dict[str, Callable[[Report], tuple[pd.DataFrame, pd.DataFrame]]] = {
    "main": _main_view,
    "stability": _stability_view,
    "audit": _audit_view,
    "reference": _reference_view,
    "comparisons": _comparisons_view,
    "claims": _claims_view,
    "environment": _environment_view,
}


def view(report: Report, table: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cells as strings, bold mask) of one table."""
    if table not in VIEWS:
        raise ValueError(table)
    return VIEWS[table](report)


def difference_words(half: float, n_a: Any, n_b: Any, span: float) -> str | None:
    """``not informative with 2 vs 3 seeds`` where a difference's interval (``half``: its half-width) is wider
    than the difference's whole range (``span``: 2 for two scores), else None."""
    if half == half and 2 * half > span:
        return NOT_INFORMATIVE.format(n=f"{int(n_a)} vs {int(n_b)}")
    return None


def interval_words(main: pd.DataFrame, columns: Sequence[str], short: bool = False) -> str:
    """Which interval ``columns`` of the main table show, in words, from their ``ci method``: "the 95%
    hierarchical bootstrap interval over seeds × problems", "the t-based 95% interval over seeds", both (where
    each applies), and where an interval is not given (wider than the metric's range, with that many seeds).
    The table's caption, the LaTeX caption, the terminal's and the figure's legend all say this; ``short``: in
    fewer words (a LaTeX caption, whose method note says the rest)."""
    methods: set[str] = set()
    seeds: set[str] = set()
    for c in columns:
        col = f"{c} {CI_METHOD}"
        if c not in main:
            continue
        for m, n in zip(main[col] if col in main else [BY_SEEDS] * len(main), main[f"{c} n"], strict=True):
            if is_uninformative(m):
                seeds.add(str(int(n)))
            elif n == n and n >= 2:
                methods.add(m)
    boot = f"the {LEVEL:.0%} interval over seeds × problems" + (
        "" if short else " (the union of the hierarchical bootstrap's and the t-interval over seeds)"
    )
    t = f"the t-based {LEVEL:.0%} interval over seeds"
    if methods == {BY_PROBLEMS}:
        words = boot
    elif BY_PROBLEMS in methods:
        words = f"{boot}{'' if short else ', where every run has per-problem outcomes'}; else {t}"
    elif methods:
        words = t
    else:
        words = ""
    if seeds:
        n = " or ".join(sorted(seeds, key=int))
        none = (
            f"none where not informative ({n} seeds)"
            if short
            else f"no interval where it would be wider than the score's whole range (not informative with {n} seeds)"
        )
        words = f"{words}; {none}" if words else none
    return words


def fmt_p(v: float) -> str:
    """A p-value: three significant digits, "<0.001" below that, "—" when undefined."""
    if v is None or v != v:
        return DASH
    return "<0.001" if v < 0.001 else f"{v:.3f}"


def runs_view(report: Report) -> pd.DataFrame:
    import pandas as pd

    r = report.runs
    out = pd.DataFrame(
        {"run": r["run"], "configuration": r["label"], "seed": r["seed"].map(fmt_value), "state": r["state"]}
    )
    out["step"] = [
        f"{fmt_value(_int_or_none(s))}/{fmt_value(_int_or_none(t))}"
        for s, t in zip(r["step"], r["total_steps"], strict=True)
    ]
    out["eval"] = [  # which checkpoint each run's numbers come from
        fmt_value(c) + (" (diverged)" if f == "diverged" else "")
        for c, f in zip(r["eval_checkpoint"], r["eval_final_state"], strict=True)
    ]
    out[ID_AVG] = [_cell(v) for v in r[ID_AVG]]
    out[OOD_AVG] = [_cell(v) for v in r[OOD_AVG]]
    out["final reward"] = [_cell(v) for v in r["final reward"]]
    out["collapsed at"] = r["collapse_step"].map(lambda v: fmt_value(_int_or_none(v)))
    out["note"] = [
        f"diverged at step {fmt_value(_int_or_none(d))}: {fmt_value(x)}"
        if s == "diverged"
        else (fmt_value(x) if s == "failed" else "")
        for s, d, x in zip(r["state"], r["diverged_step"], r["reason"], strict=True)
    ]
    if "vllm kept" in r and r["vllm kept"].notna().any():  # generated by vLLM (report/engine.py)
        out["vLLM kept"] = [_cell(v) for v in r["vllm kept"]]
        out["note"] = [
            "; ".join(filter(None, [n, "vLLM kept fraction under the floor" if f else ""]))
            for n, f in zip(out["note"], r["vllm flagged"], strict=True)
        ]
    return out


TITLES = {
    "main": "Results",
    "stability": "Training stability",
    "audit": "KL gradient audit",
    "reference": "Beside the study's reported numbers (arXiv 2512.21852)",
    "comparisons": "Each configuration against its references",
    "claims": "The study's claims on this sweep",
    "environment": "Environment",
}


def _main_interval(report: Report) -> str:
    """The main table's interval in words (``interval_words`` over its score columns)."""
    columns = [*report.in_domain, ID_AVG, *report.ood, OOD_AVG]
    return interval_words(report.main, columns) or f"its {LEVEL:.0%} interval"


def captions(report: Report) -> dict[str, str]:
    return {
        "main": (
            f"Scores of one eval: {report.eval_label}"
            + (f" ({report.eval_note})" if report.eval_note else "")
            + "; last evaluated checkpoint of each run (step; the runs table names each run's). "
            "A diverged run is scored on the checkpoint it diverged at. "
            f"Mean ± half the width of {_main_interval(report)} (no ± with one seed; one interval per "
            "quantity: a task's score and its average share it; main.csv: each column's bounds and ci method). "
            "n = seeds evaluated / seeds; — = no eval yet. eval se: the mean per-run "
            "lm-eval stderr of the average (the eval's own noise, part of the spread between seeds). "
            "Δ = change of the average from the step-0 baseline of the same model; its interval, where the runs "
            "and the step-0 model have per-problem outcomes: the same bootstrap of each run's outcomes less the "
            "step-0 model's on the same problems (paired: the step-0 score is one eval of those problems too); "
            "else over seeds, the step-0 score taken as exact; none where wider than its range, -1 to 1. Bold: "
            "the best mean of a "
            f"column when it is significantly higher than every other configuration's (one-sided Welch t-test "
            f"over seeds, p < {ALPHA:g}); no bold where the best is within noise."
        ),
        "stability": DEFINITIONS.format(window=report.window, rule=report.collapse_rule)
        + f" Values: mean ± half-width of the t-based {LEVEL:.0%} CI over the runs with metrics; "
        "diverged counts all runs, collapsed the runs with metrics.",
        "audit": (
            "What the trainer's KL update is with the runs' settings (klsweep audit --grpo: exact enumeration of "
            "every step of G completions of a tabular policy, vocabulary 3, length 2; the trainer's own "
            "advantages, reward mode and loss aggregation); each row with its runs' sampling: off-policy rows "
            "(lag > 0 or several iterations) are audited off-policy, samples from a behaviour policy shifted "
            "from pi (shift 0.5), with the runs' reward log-probs, importance weighting and cap, and TRL's "
            "clipped ratio. Effective scale: the effective KL "
            "gradient (E[grad L(beta)] - E[grad L(0)]) / beta projected on grad KL(pi||ref), in units of the "
            "loss type's aggregation; cos: its cosine with grad KL(pi||ref) (reverse) and grad KL(ref||pi) "
            "(forward). Unbiased = exact: the expected KL update is beta x grad KL(pi||ref) (scale 1, cosine 1). "
            "Off-policy rows add the bare estimator's audit with that behaviour policy and the runs' importance "
            "weighting. See docs/KL.md."
        ),
        "comparisons": (
            "In-domain and OOD averages of each configuration against the no-KL baseline (beta = 0) and k1 in "
            "the reward (same beta) that share all its other axes (model, task, lag, ...): difference of the "
            f"means ± half-width of its {LEVEL:.0%} CI, Welch's two-sided t-test over seeds, or where every run "
            "of both has per-problem outcomes a t-test paired on the problems (seeds x problems; test says which) "
            f"(t, df, p; p < {ALPHA:g} in bold); n = seeds of the configuration vs the reference. — = undefined (fewer than 2 "
            "seeds on a side, or no spread); not informative: a CI wider than the difference's range, -1 to 1."
        ),
        "claims": RULE,
        "environment": (
            "The environments the runs trained in (each run's env.json, recorded at its training start): one "
            "column per distinct environment, with how many runs used it. A sweep that mixes machines or "
            "package versions shows several."
        ),
        "reference": (
            "Figures reported by the study (arXiv 2512.21852, klsweep/report/paper_reference.csv) beside ours for "
            "the configurations whose model, training task, estimator, placement and lag match "
            "(and beta and level where the study gives them). Ours: mean ± half the width of its interval in the "
            "results table (n seeds; reference.csv: ours ci method)."
        ),
    }


# a number, count ("2/3"), range ("20–40") or mean ± CI half-width, maybe with a note in parentheses ("(n=2)")
_NUMERIC = re.compile(r"^[+\-−]?\d[\d.]*(e[+-]?\d+)?(/\d+|–\d+)?( ± [\d.]+)?( \(.*\))?$")


def numeric_columns(cells: pd.DataFrame) -> list[bool]:
    """Per column of a view: every cell a number (or "—"): the columns HTML and LaTeX right-align."""
    return [
        bool(len(cells))
        and bool(cells[c].map(lambda v: str(v) == DASH or bool(_NUMERIC.match(str(v)))).all())
        for c in cells.columns
    ]
