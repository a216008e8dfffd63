"""Per-problem outcomes: what each run's eval scored on each problem, from its ``samples_<task>.jsonl``.

``load_outcomes`` reads them from the folder of the eval the report uses (each run's final checkpoint under the
chosen hash, as ``data.attach_evals`` picked it) into one ``ProblemMatrix`` per average (in-domain, OOD): runs x
problems, shared by every run (each answers the same items), what the problem-level statistics read
(``statistics.problem_bootstrap``, ``statistics.paired_problems``). A run without them (evaluated before the
samples were written, a file missing or damaged, other problems than the others') has a NaN row: its
configuration falls back to the per-run statistics, and the report says so. Kept in a cache beside the report
(``OutcomeCache``). Details: docs/REPORT.md, "Problem-level statistics".
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import store
from klsweep.report.data import BACKGROUND_AT, parse_jsonl, stat_key

if TYPE_CHECKING:
    import pandas as pd

OUTCOME_CACHE = ".outcomes.npz"  # in the report's folder
SAMPLES = "samples_{task}.jsonl"
RESULTS = "results.json"
VERSION = 1  # of the cache's layout and of what an entry means (bump when ``_read_run`` changes)


@dataclass
class ProblemMatrix:
    """One average's outcomes: ``values[i]`` the problems of run ``runs[i]`` (NaN: none), each column a
    problem of task ``tasks[task[j]]``, its score weighted by 1 / (tasks x that task's problems): a row sums to
    the run's average accuracy."""

    runs: list[str]
    tasks: list[str]
    task: Any  # numpy int array: per column, its task's index
    values: Any  # numpy float array: runs x problems

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
) -> Outcomes:
    """Per average (its column name -> its tasks), the ``ProblemMatrix`` of the runs scored (``eval_checkpoint``
    set by ``data.attach_evals``); averages without a task are left out. Runs whose outcomes cannot be used are
    named in ``notes`` (one line per reason). ``cache``: ``OutcomeCache``'s file."""
    import numpy as np

    tasks = list(dict.fromkeys(t for ts in averages.values() for t in ts))
    scored = [
        (run, sweep / run / store.EVAL_DIR / str(eval_hash) / str(ckpt))
        for run, ckpt in zip(runs["run"], runs["eval_checkpoint"], strict=True)
        if isinstance(ckpt, str)
    ]
    with OutcomeCache(cache) as cached:
        read = dict(zip([run for run, _ in scored], cached.read([f for _, f in scored], tasks), strict=True))
    why: dict[str, list[str]] = {}
    for run, got in read.items():
        if isinstance(got, str):
            why.setdefault(got, []).append(run)
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
        out[avg] = ProblemMatrix(list(runs["run"]), list(group), task, values)
    for reason, names in why.items():
        names = sorted(set(names))
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        notes.append(
            f"{len(names)} run(s) without per-problem outcomes ({reason}): {shown}; their configurations' "
            "accuracy intervals and tests are over seeds only"
        )
    return out


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


def _read_runs(folders: list[Path], tasks: list[str]) -> list[dict[str, tuple[Any, Any]] | str]:
    return [_read_run(folder, tasks) for folder in folders]


class OutcomeCache:
    """The runs' per-problem outcomes (``_read_run``; ``read``), kept in one ``.npz`` beside the report: an index (JSON:
    per eval folder, the stat keys of its results.json and samples files, and where its tasks' arrays lie)
    and two flat arrays (doc ids, scores). Reading a run's samples (each line lm-eval's whole record: the
    problem, the prompt, the answer) costs far more than its scores; a file that changed, or a cache that is
    missing, damaged or of another layout, is read afresh; the cache is rewritten (atomically) when anything
    was read; a results folder one cannot write to goes without."""

    def __init__(self, path: Path | None) -> None:
        import numpy as np

        self.path = path
        self.index: dict[str, Any] = {}
        self.docs, self.scores = np.zeros(0, dtype=np.int64), np.zeros(0)
        self.seen: dict[str, tuple[Any, list[str], dict[str, tuple[Any, Any]] | str]] = {}
        self.fresh = False

    def __enter__(self) -> OutcomeCache:
        import numpy as np

        if self.path is not None and self.path.is_file():
            try:
                with np.load(self.path, allow_pickle=False) as z:
                    index = json.loads(bytes(z["index"]).decode())
                    if index.get("version") == VERSION and isinstance(index.get("runs"), dict):
                        self.index, self.docs, self.scores = index["runs"], z["docs"], z["scores"]
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                pass
        return self

    def read(self, folders: list[Path], tasks: list[str]) -> list[dict[str, tuple[Any, Any]] | str]:
        """``_read_run(folder, tasks)`` of each folder, from the cache when its files are as they were; of the
        others, when there are ``BACKGROUND_AT`` or more, half are read in a forked child meanwhile
        (``background.in_background``)."""
        from klsweep.report.background import in_background

        out: list[Any] = []  # None: not in the cache, read below
        keys, names = [], []
        for folder in folders:
            key = [stat_key(folder / RESULTS), *(stat_key(folder / SAMPLES.format(task=t)) for t in tasks)]
            name = str(folder.absolute())
            entry = self.index.get(name)
            got = None
            if isinstance(entry, dict) and entry.get("key") == key and entry.get("tasks") == tasks:
                got = entry["why"] if isinstance(entry.get("why"), str) else self._arrays(entry.get("at"))
            out.append(got)
            keys.append(key)
            names.append(name)
        afresh = [i for i, got in enumerate(out) if got is None]
        split = len(afresh) // 2 if len(afresh) >= BACKGROUND_AT else 0
        child = in_background(_read_runs, [folders[i] for i in afresh[:split]], tasks, fork=split > 0)
        mine = _read_runs([folders[i] for i in afresh[split:]], tasks)
        for i, got in zip(afresh, [*child(), *mine], strict=True):
            out[i], self.fresh = got, True
        for name, key, got in zip(names, keys, out, strict=True):
            if key[0] is not None:  # a results.json that cannot be stat'ed is not kept
                self.seen[name] = (key, tasks, got)
        return out

    def _arrays(self, at: Any) -> dict[str, tuple[Any, Any]] | None:
        try:
            return {t: (self.docs[s : s + n], self.scores[s : s + n]) for t, (s, n) in at.items()}
        except (AttributeError, TypeError, ValueError):
            return None

    def __exit__(self, *exc: object) -> None:
        import numpy as np

        if self.path is None or exc[0] is not None or not (self.fresh or len(self.seen) != len(self.index)):
            return
        runs, docs, scores, start = {}, [], [], 0
        for name, (key, tasks, got) in self.seen.items():
            entry: dict[str, Any] = {"key": key, "tasks": tasks}
            if isinstance(got, str):
                entry["why"] = got
            else:
                entry["at"] = {}
                for t, (d, s) in got.items():
                    entry["at"][t] = [start, len(d)]
                    docs.append(d)
                    scores.append(s)
                    start += len(d)
            runs[name] = entry
        buf = io.BytesIO()
        index = np.frombuffer(json.dumps({"version": VERSION, "runs": runs}).encode(), dtype=np.uint8)
        cat = np.concatenate
        np.savez(
            buf, index=index, docs=cat(docs) if docs else np.zeros(0, np.int64), scores=cat(scores or [[]])
        )
        with contextlib.suppress(OSError):  # a results folder one cannot write to: read afresh next time
            store.atomic_write_text(self.path, buf.getvalue())
