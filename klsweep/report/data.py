"""What the report reads: every file it touches, and the per-run frame built from them.

Only the results store's files (docs/DESIGN.md): each run's config, status, metrics and eval results, and the
sweep's step-0 baseline. ``load_runs`` (the configuration axes, the runs and metrics frames), ``attach_evals``
(one eval hash per report, each run scored at its final checkpoint only), ``load_baseline`` and
``attach_deltas`` (Δ from step 0; ``baseline_folders``: each run's). A file that cannot be read is set aside and named (``set_aside``), the rest
is reported; what is not there yet (runs unfinished or not scored, no metrics) is named too (``missing``).
Details: docs/REPORT.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import store
from klsweep.config import KL_ONLY_KEYS, is_cosmetic, load_run, without_kl_when_off
from klsweep.errors import Problem, UserError
from klsweep.report.engine import COLUMNS as ENGINE_COLUMNS
from klsweep.report.evalchoice import EvalChoice, Present, choose_eval, grid_evals
from klsweep.report.filecache import FileCache, Value, stat_key
from klsweep.report.stability import SMOOTHED

if TYPE_CHECKING:
    import pandas as pd

# Configuration axes: this order first, then any other varying key alphabetically.
AXIS_ORDER = (
    "model.name",
    "model.path",
    "task.name",
    "kl.estimator",
    "kl.placement",
    "kl.level",
    "kl.beta",
    "kl.importance",
    "kl.reward_mode",
    "offpolicy.lag",
    "offpolicy.num_iterations",
)
# Settings the KL audit of a run depends on (klsweep.audit.grpo_audit): a column of every run, varying or not.
AUDIT_KEYS = (
    "train.group_size",
    "train.scale_rewards",
    "train.loss_type",
    "kl.reward_logp",
    "kl.importance_cap",
)
ID_AVG, OOD_AVG, D_ID, D_OOD = "in-domain avg", "OOD avg", "Δ in-domain", "Δ OOD"
SE = "eval se"  # suffix of a run's lm-eval stderr column: "<task> eval se"


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.load(store.read_text(path), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = _hashable(v)
    return out


def _is_cosmetic(key: str) -> bool:
    return key != "model.name" and is_cosmetic(key)


def _varying_axes(configs: list[dict[str, Any]]) -> list[str]:
    """Dotted keys whose values differ between runs (not seed, not cosmetic except model.name; a KL-only field
    between the runs with KL), in AXIS_ORDER;
    model.path is left out when it is one-to-one with model.name (the name says it)."""
    keys = {k for c in configs for k in c}
    with_kl = [c for c in configs if c.get("kl.beta") != 0]
    axes = [
        k
        for k in keys
        if k != "seed"
        and not _is_cosmetic(k)
        # a KL-only field is an axis when it varies between runs with KL (not merely "no KL" against a value)
        and len({_hashable(c.get(k)) for c in (with_kl if k in KL_ONLY_KEYS else configs)}) > 1
    ]
    axes.sort(key=lambda k: (AXIS_ORDER.index(k) if k in AXIS_ORDER else len(AXIS_ORDER), k))
    if "model.name" in axes and "model.path" in axes and _one_to_one(configs, "model.name", "model.path"):
        axes.remove("model.path")
    return axes


def _hashable(v: Any) -> Any:
    return json.dumps(v, sort_keys=True) if isinstance(v, list | dict) else v


def _one_to_one(configs: list[dict[str, Any]], a: str, b: str) -> bool:
    pairs = {(_hashable(c.get(a)), _hashable(c.get(b))) for c in configs}
    return len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs})


def load_runs(
    dirs: list[Path], set_aside: list[str], cache: Path | None = None
) -> tuple[pd.DataFrame, list[dict[str, Any]], list[str], pd.DataFrame]:
    """One row per readable run (config, status) and its metrics rows (``METRICS``, with a ``run`` column); the
    runs left out, and the metrics lines skipped, are added to ``set_aside``. ``cache``: the report's folder,
    where the runs' read configs and metrics are kept (``CONFIG_CACHE``, ``METRICS_CACHE``: ``FileCache``); the
    configs they do not hold are read mostly in a forked child while this process reads the runs' other
    files."""
    import numpy as np
    import pandas as pd

    rows, configs, values, names = [], [], [], []
    code = _code_hash()
    with (
        FileCache(cache and cache / CONFIG_CACHE, code) as config_cache,
        FileCache(cache and cache / METRICS_CACHE, code) as metrics_cache,
    ):
        pending = config_cache.read(
            dirs,
            [stat_key(d / store.CONFIG_FILE) for d in dirs],
            _config_value,
            valid=_is_config,
            child_share=CONFIG_SHARE,
        )
        statuses = [_read_status(d) for d in dirs]
        metrics_of = metrics_cache.read(
            dirs,
            [stat_key(d / store.METRICS_FILE) for d in dirs],
            _metrics_value,
            valid=_is_metrics,
            child_share=0,
        )()
        loaded = pending()
        if all(value[0][1] is not None for value in loaded):  # no run can be read: nothing to keep
            config_cache.discard()
            metrics_cache.discard()
    for d, ((config, unreadable), _), (status, env), ((notes, aside, unfinished), arrays) in zip(
        dirs, loaded, statuses, metrics_of, strict=True
    ):
        if unreadable is not None:
            set_aside.append(f"run {d.name} left out: {unreadable}")
            continue
        if isinstance(status, str):
            set_aside.append(f"run {d.name} left out: {status}")
            continue
        kept, notes = _in_order(d, config, notes, aside, arrays)
        set_aside += notes
        if unfinished is not None:
            set_aside.append(_unfinished_note(d / store.METRICS_FILE, unfinished, status.get("state")))
        config = without_kl_when_off(config)
        configs.append(config)
        rows.append(
            {
                "run": d.name,
                "seed": config.get("seed"),
                "state": status.get("state", "pending"),
                "step": status.get("step"),
                "total_steps": status.get("total_steps"),
                "diverged_step": status.get("diverged_step"),
                "reason": status.get("reason") or _last_line(status.get("error")),
                "env": env,
            }
        )
        values.append(kept)
        names.append(d.name)
    axes = _varying_axes(configs)
    runs = pd.DataFrame(
        rows, columns=["run", "seed", "state", "step", "total_steps", "diverged_step", "reason", "env"]
    )
    for k in axes:
        runs[k] = pd.Series([c.get(k) for c in configs], dtype=object)
    for k in (*AXIS_ORDER, *AUDIT_KEYS):
        if k not in runs:
            runs[k] = pd.Series([c.get(k) for c in configs], dtype=object)
    metrics = pd.DataFrame(np.concatenate(values) if values else np.zeros((0, len(METRICS))), columns=METRICS)
    metrics.insert(0, "run", np.repeat(np.array(names, dtype=object), [len(v) for v in values]))
    if np.isfinite(metrics["step"]).all():
        metrics["step"] = metrics["step"].astype(np.int64)
    return runs, configs, axes, metrics


def _read_status(run_dir: Path) -> tuple[dict[str, Any] | str, str | None]:
    """A run's status (or why it cannot be read) and its environment."""
    try:
        status: dict[str, Any] | str = store.read_status(run_dir)
    except store.UnreadableFile as e:
        return e.message, None
    return status, _read_env(run_dir)


def _load_config(run_dir: Path) -> tuple[dict[str, Any], str | None]:
    """A run's config (``config.load_run``), flattened; or {} and why it cannot be read."""
    try:
        return _flatten(dataclasses.asdict(load_run(run_dir))), None
    except store.UnreadableFile as e:
        return {}, e.message


CONFIG_CACHE = ".configs.npz"  # in the report's folder: each run's flattened config (``_load_config``)
METRICS_CACHE = ".metrics.npz"  # in the report's folder: each run's ``METRICS`` (``_metrics_value``)
CONFIG_SHARE = 0.75  # of the configs not cached, read in a forked child (one costs twice a run's other files)
# What the report reads of metrics.jsonl (the rest of its keys are for W&B and the user): the step, the curves,
# the collapse rule's reward spread and the engine's agreement with the trainer.
METRICS = ("step", *SMOOTHED, "reward_std", *ENGINE_COLUMNS.values())


def _config_value(run_dir: Path) -> Value:
    return list(_load_config(run_dir)), {}


def _is_config(value: Value) -> bool:
    """Whether a cached config is one: [flattened config, why it cannot be read] (a mapping, None or a str)."""
    meta = value[0]
    return (
        isinstance(meta, list)
        and len(meta) == 2
        and isinstance(meta[0], dict)
        and isinstance(meta[1], str | None)
    )


def _metrics_value(run_dir: Path) -> Value:
    """A run's metrics as the cache keeps them (``store.metrics.scan``: the rules of a line alone): [notes on the
    file, what was set aside (``Aside`` fields), the number of an unfinished last line or None] and the rows'
    ``METRICS`` (steps x keys) and line numbers. The rules of the run's steps (``in_order``: its
    ``train.steps``, the order) are applied by ``load_runs``, as is whether the unfinished line is damage (the
    run's state)."""
    import numpy as np

    from klsweep.store import metrics as metrics_file

    notes: list[str] = []
    try:
        found = metrics_file.scan(run_dir / store.METRICS_FILE)
    except store.UnreadableFile as e:
        notes.append(f"{e.path}: {e.what}; the run's metrics are left out ({e.todo})")
        found = metrics_file.Metrics(run_dir / store.METRICS_FILE)
    aside = [[a.line, a.kind, a.detail, a.step] for a in found.aside]
    lines = np.array(found.lines, dtype=np.int64)
    return [notes, aside, found.unfinished], {"values": _numbers(found.rows), "lines": lines}


def _is_metrics(value: Value) -> bool:
    """Whether cached metrics are: [notes (strs), set aside ([line, kind, detail, step]), a line number or None]
    and a steps x ``METRICS`` array with a line number per step."""
    from klsweep.store.metrics import KINDS

    meta, arrays = value
    values, lines = arrays.get("values"), arrays.get("lines")
    return (
        isinstance(meta, list)
        and len(meta) == 3
        and isinstance(meta[0], list)
        and all(isinstance(n, str) for n in meta[0])
        and isinstance(meta[1], list)
        and all(
            isinstance(a, list)
            and len(a) == 4
            and _whole(a[0])
            and a[1] in KINDS
            and isinstance(a[2], str)
            and (a[3] is None or _whole(a[3]))
            for a in meta[1]
        )
        and (meta[2] is None or _whole(meta[2]))
        and getattr(values, "ndim", 0) == 2
        and values.shape[1] == len(METRICS)
        and getattr(lines, "shape", None) == (len(values),)
        and lines.dtype.kind == "i"
    )


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _in_order(
    run_dir: Path, config: dict[str, Any], notes: list[str], aside: list[list[Any]], arrays: dict[str, Any]
) -> tuple[Any, list[str]]:
    """A run's cached metrics (``_metrics_value``) with the rules of its steps applied (``store.metrics.in_order``:
    up to its ``train.steps``, going forward): the rows kept, and every note on what was set aside."""
    from klsweep.store import metrics as metrics_file

    values, lines = arrays["values"], arrays["lines"]
    steps = config.get("train.steps")
    max_step = steps if _whole(steps) else None
    keep, order = metrics_file.in_order(values[:, 0].astype("int64").tolist(), lines.tolist(), max_step)
    found = metrics_file.settled([metrics_file.Aside(*a) for a in aside], lines.tolist(), keep, order)
    return values[keep], [*notes, *metrics_file.notes(run_dir / store.METRICS_FILE, found, max_step)]


def _unfinished_note(path: Path, line: int, state: Any) -> str:
    """What the report says of a metrics.jsonl whose last line is unfinished (no newline, not JSON): a line
    being written while the run runs, or, once it does not, a file cut short (its row lost)."""
    if state == "running":
        return (
            f"{path}: its last line (line {line}) is still being written (the run is running): not damage; "
            "left out of this report, the rows before it are reported"
        )
    return (
        f"{path}: its last line (line {line}) is cut short (no newline, not JSON; the run is {state or 'pending'}, "
        "so nothing is writing it): damage, that row is lost; the rows before it are reported"
    )


def _code_hash() -> str:
    """The code a cached config or metrics file was read with: the config package (schema, defaults, legacy
    values, the run file's reader), this module and metrics.jsonl's validator (``store.metrics``)."""
    import hashlib

    from klsweep import config

    h = hashlib.sha256()
    from klsweep.store import metrics as metrics_file

    for module in (
        *sorted(Path(config.__file__).parent.glob("*.py")),
        Path(__file__),
        Path(metrics_file.__file__),
    ):
        h.update(module.read_bytes())
    return h.hexdigest()[:16]


def _numbers(rows: list[dict[str, Any]]) -> Any:
    """``METRICS`` of metrics rows kept (``store.metrics``: every value a number or None) as a float array (steps
    x keys), NaN where a row has no such number."""
    import numpy as np

    out = np.full((len(rows), len(METRICS)), np.nan)
    for j, key in enumerate(METRICS):
        out[:, j] = np.array([r.get(key) for r in rows], dtype=float)
    return out


def parse_jsonl(data: bytes) -> list[Any]:
    """A JSON-lines file's content parsed as one JSON array (several times faster than line by line);
    ValueError or UnicodeDecodeError when a line is not JSON."""
    data = data.strip()
    return json.loads(b"[" + b",".join(data.splitlines()) + b"]") if data else []


def _read_env(run_dir: Path) -> str | None:
    """The run's recorded environment (``env.json``, written at training start) as canonical JSON, or None."""
    p = run_dir / store.ENV_FILE
    try:
        return json.dumps(store.read_json(p), sort_keys=True) if p.exists() else None
    except (OSError, ValueError, store.UnreadableFile):  # torn, not JSON, not a file: shown as not recorded
        return None


def _last_line(text: str | None) -> str | None:
    return text.strip().splitlines()[-1] if text and text.strip() else None


def _results_files(root: Path) -> list[Path]:
    return list((root / store.EVAL_DIR).glob("*/*/results.json"))


def attach_evals(
    sweep: Path,
    runs: pd.DataFrame,
    eval_hash: str | None,
    set_aside: list[str],
    missing: list[str],
    configs: list[dict[str, Any]],
) -> tuple[EvalChoice, list[str], list[str]]:
    """Pick the eval (``evalchoice.choose_eval``: the one asked for, else the grid's, never merely the newest),
    and per run the results of its final checkpoint (``store.final_checkpoint``): adds ``eval_checkpoint``,
    ``eval_step`` and one column per eval task. A run with results of other checkpoints only (an eval
    cancelled part-way, a run not finished) is not scored: named in ``missing``. Returns (the eval chosen,
    in-domain tasks, OOD tasks)."""
    found: dict[str, list[tuple[str, dict[str, Any]]]] = {}  # hash -> [(run, results)]
    present: dict[str, Present] = {}
    for run in runs["run"]:
        for p in _results_files(sweep / run):
            res = _read_results(p, set_aside)
            if res is None:
                continue
            h = p.parent.parent.name
            found.setdefault(h, []).append((run, res))
            present.setdefault(h, Present(res.get("settings") or {})).runs.add(run)
    baseline_hashes = {
        p.parent.parent.name for p in (sweep / store.BASELINE_DIR).glob("*/eval/*/step-0/results.json")
    }
    if eval_hash is not None and eval_hash not in found and eval_hash not in baseline_hashes:
        raise UserError(
            Problem(
                "--eval-hash", f"{eval_hash!r} is not in this sweep", ", ".join(sorted(found)) or "none yet"
            ),
            title="unknown eval hash",
        )
    choice = choose_eval(present, eval_hash, grid_evals(configs), str(sweep))
    chosen = choice.hash
    # each run scored at its final checkpoint only: never one run's checkpoint-24 beside another's -40
    finals = {run: _final_checkpoint(sweep / run) for run in runs["run"]}
    last: dict[str, dict[str, Any]] = {}
    other: dict[str, list[str]] = {}  # run -> the checkpoints scored that are not its final one
    for run, res in found.get(chosen, []):
        if finals[run] is not None and (res.get("checkpoint") == finals[run] or res.get("final_state")):
            last[run] = res
        else:
            other.setdefault(run, []).append(str(res.get("checkpoint")))
    for run, names in sorted(other.items()):
        if run not in last:
            final = (
                f"its final {finals[run]} is not" if finals[run] else "it has not finished, so none is final"
            )
            missing.append(
                f"run {run}: not scored: {', '.join(sorted(names, key=store.checkpoint_order))} scored under {chosen}, {final} "
                f"(`klsweep eval {sweep}` scores it)"
            )
    in_domain: dict[str, None] = {}
    ood: dict[str, None] = {}
    for res in last.values():
        in_domain.update(dict.fromkeys(res.get("metrics", {}).get("in_domain", {})))
        ood.update(dict.fromkeys(res.get("metrics", {}).get("ood", {})))
    runs["eval_checkpoint"] = [last.get(r, {}).get("checkpoint") for r in runs["run"]]
    # "diverged" when the checkpoint scored is the one the run diverged at (its final state), else done or None
    runs["eval_final_state"] = [last.get(r, {}).get("final_state") for r in runs["run"]]
    runs["eval_step"] = [last.get(r, {}).get("step") for r in runs["run"]]
    for kind, tasks in (("in_domain", in_domain), ("ood", ood)):
        for t in tasks:
            runs[t] = [_float(last.get(r, {}).get("metrics", {}).get(kind, {}).get(t)) for r in runs["run"]]
    runs[ID_AVG] = runs[list(in_domain)].mean(axis=1) if in_domain else math.nan
    runs[OOD_AVG] = runs[list(ood)].mean(axis=1) if ood else math.nan
    # each run's lm-eval stderr per task (its binomial eval noise), and that of each average (independent tasks)
    for avg, tasks in ((ID_AVG, list(in_domain)), (OOD_AVG, list(ood))):
        for t in tasks:
            runs[f"{t} {SE}"] = [_float(last.get(r, {}).get("stderr", {}).get(t)) for r in runs["run"]]
        se = runs[[f"{t} {SE}" for t in tasks]] if tasks else None
        runs[f"{avg} {SE}"] = (se**2).mean(axis=1) ** 0.5 / len(tasks) ** 0.5 if tasks else math.nan
    return choice, list(in_domain), list(ood)


def _final_checkpoint(run_dir: Path) -> str | None:
    try:
        return store.final_checkpoint(run_dir)
    except store.UnreadableFile:
        return None


def not_there_yet(runs: pd.DataFrame, metrics: pd.DataFrame, sweep: Path) -> list[str]:
    """What the report lacks so far: runs not finished, no metrics, no eval (before the runs' own lines)."""
    lines = []
    unfinished = runs[~runs["state"].isin(["done", "diverged"])]
    if len(unfinished):
        states = unfinished["state"].value_counts()
        lines.append(
            f"{len(unfinished)} of {len(runs)} run(s) not finished ("
            + ", ".join(f"{n} {s}" for s, n in states.items())
            + "): only finished runs (done, diverged) are scored and count in the claims"
        )
    if not len(metrics):
        lines.append("no metrics yet (no training step written): no curves, no stability figures")
    if runs["eval_checkpoint"].isna().all():
        lines.append(
            f"no run scored yet: evals follow training (`klsweep eval {sweep}` scores the finished runs)"
        )
    return lines


def _read_results(path: Path, set_aside: list[str]) -> dict[str, Any] | None:
    """An eval's results.json, or None (noted in ``set_aside``) when it cannot be read."""
    try:
        res = store.read_json(path)
    except (ValueError, UnicodeDecodeError) as e:
        set_aside.append(f"{path} skipped: not valid JSON (cut short?): {e}; rerun `klsweep eval` to redo it")
        return None
    except store.UnreadableFile as e:
        set_aside.append(f"{path} skipped: {e.what}; {e.todo}")
        return None
    damage = _damage(res) or _elsewhere(res, path)
    if damage is not None:
        set_aside.append(f"{path} skipped: {damage}; rerun `klsweep eval` to redo it")
        return None
    return res


def _damage(res: Any) -> str | None:
    """What makes a parsed results.json unusable, or None: not an object, ``metrics`` not tasks by kind, an
    accuracy that is not a number in [0, 1] (Infinity, NaN, 1.7, "high") or a stderr that is infinite, negative
    or not a number (lm-eval writes none of these: the file was damaged or hand-edited)."""
    if not isinstance(res, dict):
        return "not a JSON object"
    metrics, stderr = res.get("metrics", {}), res.get("stderr", {})
    if not isinstance(metrics, dict) or not all(
        isinstance(metrics.get(k, {}), dict) for k in ("in_domain", "ood")
    ):
        return "`metrics` is not {in_domain: {task: accuracy}, ood: {...}}"
    if not isinstance(stderr, dict):
        return "`stderr` is not {task: stderr}"
    for kind in ("in_domain", "ood"):
        for task, v in metrics.get(kind, {}).items():
            if v is not None and not (_number(v) and 0 <= v <= 1):
                return f"accuracy {v!r} of {kind} task {task!r} is not a number in [0, 1]"
    for task, v in stderr.items():
        if v is not None and not (_number(v) and (math.isnan(v) or 0 <= v < math.inf)):  # NaN: not known
            return f"stderr {v!r} of task {task!r} is not a finite number >= 0"
    return None


def _elsewhere(res: dict[str, Any], path: Path) -> str | None:
    """Why results do not name the checkpoint they lie beside, or None: ``checkpoint`` is the name of its own
    folder (``eval/<hash>/<checkpoint>/results.json``, as the eval writes it; the report reads that folder's
    samples, so a path there would make it read any file) and ``step`` a whole number."""
    checkpoint, step = res.get("checkpoint"), res.get("step")
    if checkpoint != path.parent.name:
        return (
            f"`checkpoint` {checkpoint!r} is not the folder it lies in ({path.parent.name!r}): "
            "results name a checkpoint of their own run folder"
        )
    if step is not None and not (isinstance(step, int) and not isinstance(step, bool) and step >= 0):
        return f"`step` {step!r} is not a whole number of steps"
    return None


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _float(v: Any) -> float:
    return math.nan if v is None else float(v)


def load_baseline(
    sweep: Path, eval_hash: str | None, in_domain: list[str], ood: list[str], set_aside: list[str]
) -> pd.DataFrame:
    """One row per baseline model folder: model name and path (from its config.yaml, else the folder name),
    and the step-0 metrics under the chosen hash (NaN if that hash has no step-0 result)."""
    import pandas as pd
    import yaml

    rows = []
    for d in sorted((sweep / store.BASELINE_DIR).glob("*/")):
        try:
            config = _flatten(_read_yaml(d / store.CONFIG_FILE)) if (d / store.CONFIG_FILE).exists() else {}
        except (yaml.YAMLError, UnicodeDecodeError, AttributeError):
            set_aside.append(f"{d / store.CONFIG_FILE}: not valid YAML; the folder name stands for the model")
            config = {}
        except store.UnreadableFile as e:
            set_aside.append(f"{e.path}: {e.what}; the folder name stands for the model ({e.todo})")
            config = {}
        p = d / store.EVAL_DIR / str(eval_hash) / "step-0" / "results.json"
        res = (_read_results(p, set_aside) if p.exists() else None) or {}
        m = res.get("metrics", {})
        row = {
            "folder": d.name,
            "model.name": config.get("model.name", d.name),
            "model.path": config.get("model.path"),
        }
        row |= {t: _float(m.get("in_domain", {}).get(t)) for t in in_domain}
        row |= {t: _float(m.get("ood", {}).get(t)) for t in ood}
        rows.append(row)
    df = pd.DataFrame(rows, columns=["folder", "model.name", "model.path", *in_domain, *ood])
    df[ID_AVG] = df[in_domain].mean(axis=1) if in_domain else math.nan
    df[OOD_AVG] = df[ood].mean(axis=1) if ood else math.nan
    return df


def attach_deltas(runs: pd.DataFrame, baseline: pd.DataFrame) -> None:
    """Δ columns: each run's averages minus those of the baseline of its model (``baseline_folders``)."""
    found = baseline_folders(runs, baseline)
    at = dict(zip(baseline["folder"], range(len(baseline)), strict=True))
    for col, avg in ((D_ID, ID_AVG), (D_OOD, OOD_AVG)):
        runs[col] = runs[avg] - [math.nan if f is None else baseline[avg].iloc[at[f]] for f in found]


def baseline_folders(runs: pd.DataFrame, baseline: pd.DataFrame) -> list[str | None]:
    """Each run's step-0 baseline: the folder (``sweep/baseline/<folder>/``) of its model, matched by model.path,
    then by model.name or the folder's name; None where none matches."""
    by_key: dict[tuple[str, Any], str] = {}
    for folder, name, path in zip(
        baseline["folder"], baseline["model.name"], baseline["model.path"], strict=True
    ):
        for key in (("path", path), ("name", folder), ("name", name)):
            if nan_to_none(key[1]) is not None:
                by_key.setdefault(key, str(folder))
    return [
        by_key.get(("path", path)) or by_key.get(("name", name))
        for path, name in zip(runs["model.path"], runs["model.name"], strict=True)
    ]


def nan_to_none(v: Any) -> Any:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v
