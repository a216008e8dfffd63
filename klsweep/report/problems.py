"""Per-problem outcomes: what each run's eval scored on each problem, from its ``samples_<task>.jsonl``.

``load_outcomes`` reads them from the folder of the eval the report uses (each run's final checkpoint under the
chosen hash, as ``data.attach_evals`` picked it) into one ``ProblemMatrix`` per average (in-domain, OOD): runs x
problems, shared by every run (each answers the same items), what the problem-level statistics read
(``statistics.problem_bootstrap``, ``statistics.paired_problems``), with the step-0 model's outcomes on the same
problems (``ProblemMatrix.step0``: the Δ from step 0 is paired on them). A run without them (evaluated before the
samples were written, a file missing or damaged, other problems than the others') has a NaN row: its
configuration falls back to the per-run statistics, and the report says so. Kept in a cache beside the report
(``OUTCOME_CACHE``: ``filecache.FileCache``). Details: docs/REPORT.md, "Problem-level statistics".
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import store
from klsweep.report.data import parse_jsonl
from klsweep.report.filecache import FileCache, Value, stat_key

if TYPE_CHECKING:
    import pandas as pd

OUTCOME_CACHE = ".outcomes.npz"  # in the report's folder
SAMPLES = "samples_{task}.jsonl"
RESULTS = "results.json"
VERSION = "outcomes 2"  # of what a cached entry means (change it when ``_read_run`` changes)


@dataclass
class ProblemMatrix:
    """One average's outcomes: ``values[i]`` the problems of run ``runs[i]`` (NaN: none), each column a
    problem of task ``tasks[task[j]]``, its score weighted by 1 / (tasks x that task's problems): a row sums to
    the run's average accuracy."""

    runs: list[str]
    tasks: list[str]
    task: Any  # numpy int array: per column, its task's index
    values: Any  # numpy float array: runs x problems
    # per baseline folder (sweep/baseline/<folder>/), the step-0 model's row on the same problems, weighted alike
    step0: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def _position(self) -> dict[str, int]:
        return {r: i for i, r in enumerate(self.runs)}

    def positions(self, runs: Any) -> list[int]:
        """The row of each of these runs (names)."""
        return [self._position[r] for r in runs]

    def rows(self, runs: Any) -> Any:
        """The rows of these runs (names), in order."""
        return self.values[self.positions(runs)]

    def complete(self, runs: Any) -> bool:
        """Whether every one of these runs has its outcomes."""
        import numpy as np

        return bool(len(runs)) and bool(np.isfinite(self.rows(runs)).all())


Outcomes = dict[str, ProblemMatrix]  # per average column (data.ID_AVG, data.OOD_AVG)


def load_outcomes(
    sweep: Path,
    runs: pd.DataFrame,
    eval_hash: str | None,
    averages: dict[str, list[str]],
    notes: list[str],
    cache: Path | None = None,
    baselines: Sequence[str] = (),
) -> Outcomes:
    """Per average (its column name -> its tasks), the ``ProblemMatrix`` of the runs scored (``eval_checkpoint``
    set by ``data.attach_evals``); averages without a task are left out. Runs whose outcomes cannot be used are
    named in ``notes`` (one line per reason). ``cache``: the file that keeps them (``OUTCOME_CACHE``), or None.
    ``baselines``: the step-0 folders (``sweep/baseline/<folder>/``) whose outcomes under the same eval go into
    ``ProblemMatrix.step0`` (one that has none, or other problems, is left out and named in ``notes``)."""
    import numpy as np

    tasks = list(dict.fromkeys(t for ts in averages.values() for t in ts))
    scored = [
        (run, sweep / run / store.EVAL_DIR / str(eval_hash) / str(ckpt))
        for run, ckpt in zip(runs["run"], runs["eval_checkpoint"], strict=True)
        if isinstance(ckpt, str)
    ]
    folders = [f for _, f in scored]
    keys = [
        [stat_key(f / RESULTS), *(stat_key(f / SAMPLES.format(task=t)) for t in tasks), tasks]
        for f in folders
    ]
    with FileCache(cache, VERSION) as cached:  # a results.json that cannot be stat'ed: not kept
        reader = functools.partial(_read_value, tasks)
        values = cached.read(
            folders, [k if k[0] is not None else None for k in keys], reader, valid=_is_outcome
        )()
    read = {run: _outcome(value) for (run, _), value in zip(scored, values, strict=True)}
    why: dict[str, list[str]] = {}
    for run, got in read.items():
        if isinstance(got, str):
            why.setdefault(got, []).append(run)
    step0_read = _step0(sweep, baselines, eval_hash, tasks)
    out = {}
    for avg, group in averages.items():
        if not group:
            continue
        docs: dict[str, Any] = {}
        for t in group:  # the problems most runs answered: a run with others is not paired with them
            sets = Counter(got[t][0].tobytes() for got in read.values() if isinstance(got, dict))
            docs[t] = np.frombuffer(sets.most_common(1)[0][0] if sets else b"", dtype=np.int64)
        if not all(len(d) for d in docs.values()):  # a task no run has outcomes of: none for this average
            continue
        width = sum(len(d) for d in docs.values())
        values = np.full((len(runs), width), np.nan)
        position = {r: i for i, r in enumerate(runs["run"])}
        accuracy = {t: runs[t].to_numpy(float) for t in group}
        for run, got in read.items():
            if not isinstance(got, dict):
                continue
            if any(not np.array_equal(got[t][0], docs[t]) for t in group):
                why.setdefault("other problems than the other runs' (eval.limit changed?)", []).append(run)
                continue
            mismatch = [t for t in group if not _agrees(got[t][1], accuracy[t][position[run]])]
            if mismatch:
                reason = f"samples that do not give results.json's accuracy ({', '.join(mismatch)})"
                why.setdefault(reason, []).append(run)
                continue
            values[position[run]] = np.concatenate([got[t][1] / (len(group) * len(got[t][1])) for t in group])
        task = np.repeat(np.arange(len(group)), [len(docs[t]) for t in group])
        step0 = {}
        for folder, got in step0_read.items():
            if isinstance(got, str):
                why.setdefault(f"step-0 {got}", []).append(folder)
            elif any(not np.array_equal(got[t][0], docs[t]) for t in group):
                why.setdefault("step-0 on other problems than the runs' (eval.limit changed?)", []).append(
                    folder
                )
            else:
                step0[folder] = np.concatenate([got[t][1] / (len(group) * len(got[t][1])) for t in group])
        out[avg] = ProblemMatrix(list(runs["run"]), list(group), task, values, step0)
    for reason, names in why.items():
        names = sorted(set(names))
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        if reason.startswith("step-0 "):
            notes.append(
                f"{len(names)} step-0 model(s) without per-problem outcomes ({reason[7:]}): {shown} (under "
                f"{store.BASELINE_DIR}/); the Δ intervals of their runs are over seeds only"
            )
            continue
        notes.append(
            f"{len(names)} run(s) without per-problem outcomes ({reason}): {shown}; their configurations' "
            "accuracy intervals and tests are over seeds only"
        )
    return out


def _step0(
    sweep: Path, baselines: Sequence[str], eval_hash: str | None, tasks: list[str]
) -> dict[str, dict[str, tuple[Any, Any]] | str]:
    """Each baseline folder's step-0 outcomes under ``eval_hash`` (``_read_run``; a few files: not cached), or
    why not; a folder without a step-0 result under that hash is left out (it has no Δ to pair)."""
    folders = {
        f: sweep / store.BASELINE_DIR / f / store.EVAL_DIR / str(eval_hash) / "step-0" for f in baselines
    }
    return {f: _read_run(d, tasks) for f, d in folders.items() if (d / RESULTS).is_file()}


def _agrees(scores: Any, accuracy: float) -> bool:
    """Whether a task's per-problem scores average to the accuracy results.json gives it (NaN: not given)."""
    return len(scores) > 0 and (math.isnan(accuracy) or abs(float(scores.mean()) - accuracy) <= 1e-6)


def _read_run(folder: Path, tasks: list[str]) -> dict[str, tuple[Any, Any]] | str:
    """A run's per-problem outcomes in an eval folder: per task, (doc ids sorted, each one's score: the mean
    of its samples' under the eval's metric and first filter, as results.json's accuracy is); or why not."""
    import numpy as np

    try:
        res = store.read_json(folder / RESULTS)
    except (ValueError, UnicodeDecodeError, store.UnreadableFile):
        return "results.json unreadable"
    if not isinstance(res, dict):
        return "results.json unreadable"
    keys = res.get("metric_keys")
    out = {}
    for t in tasks:
        path = folder / SAMPLES.format(task=t)
        if not path.is_file():
            return "no samples_<task>.jsonl"
        key = keys.get(t) if isinstance(keys, dict) else None
        metric, _, name = (key or f"{res.get('metric')},none").partition(",")
        try:
            rows = parse_jsonl(store.read_bytes(path))
            scores: dict[int, list[float]] = {}
            for row in rows:
                if row.get("filter", "none") == name:
                    scores.setdefault(int(row["doc_id"]), []).append(float(row[metric]))
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError, store.UnreadableFile):
            return "a samples_<task>.jsonl unreadable"
        if not scores:
            return f"no {metric!r} under filter {name!r} in samples_<task>.jsonl"
        docs = sorted(scores)
        out[t] = (np.array(docs, dtype=np.int64), np.array([sum(scores[d]) / len(scores[d]) for d in docs]))
    return out


def _read_value(tasks: list[str], folder: Path) -> Value:
    """``_read_run`` as the cache keeps it: (why not, or None; per task its docs and scores)."""
    got = _read_run(folder, tasks)
    if isinstance(got, str):
        return got, {}
    docs = {f"{t}/docs": d for t, (d, _) in got.items()}
    return None, docs | {f"{t}/scores": s for t, (_, s) in got.items()}


def _is_outcome(value: Value) -> bool:
    """Whether a cached value is one of ``_read_value``: a reason, or each task's docs and scores alike long."""
    why, arrays = value
    if isinstance(why, str):
        return not arrays
    tasks = {name.rpartition("/")[0] for name in arrays}
    return why is None and all(
        getattr(arrays.get(f"{t}/docs"), "shape", None) == getattr(arrays.get(f"{t}/scores"), "shape", ())
        and arrays[f"{t}/docs"].ndim == 1
        for t in tasks
    )


def _outcome(value: Value) -> dict[str, tuple[Any, Any]] | str:
    why, arrays = value
    if isinstance(why, str):
        return why
    tasks = dict.fromkeys(name.rpartition("/")[0] for name in arrays)
    return {t: (arrays[f"{t}/docs"], arrays[f"{t}/scores"]) for t in tasks}
