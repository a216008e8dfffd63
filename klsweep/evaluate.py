"""Evaluation of runs' checkpoints with lm-eval: an in-domain and an out-of-domain suite, pass@1.

A suite is an ``EvalSection`` (``klsweep/conf/eval/<suite>.yaml``): lm-eval task names (``in_domain``, ``ood``),
where custom task YAMLs live (``include_path``; ``builtin:<name>`` is ``klsweep/evaltasks/<name>/``, shipped
with the package), the metric, the generation settings and the backend.

- ``tiny``: the synthetic held-out problems of ``klsweep.tasks`` (addition in domain; subtraction and digit
  reversal out of domain), fully offline: lm-eval's json dataset builder, a regex filter and ``exact_match``.
- ``paper``: MATH-500 in domain (``klsweep_math500``: the training prompt, math-verify equivalence as the
  training reward), MMLU college physics/chemistry/biology out of domain (``klsweep_mmlu_college_*``:
  generative chain of thought, the letter in the last ``\\boxed{}``), greedy pass@1. Needs the hub.

Where results go (``docs/DESIGN.md``)::

    <run>/eval/<eval-hash>/<checkpoint-name>/results.json, samples_<task>.jsonl
                                                  results_<date>.json: lm-eval's own results file (its
                                                  EvaluationTracker, as `lm_eval --output_path` writes it), for
                                                  lm-eval's tooling (lm_eval.utils.make_table); one per sample
                                                  seed when eval.num_samples > 1
    <run>/eval/<eval-hash>/error.json             the run's last failure under these settings, if any
    <sweep>/baseline/<model-key>/eval/<eval-hash>/step-0/...   the initial model

When the run trained with W&B, each evaluated checkpoint's scores are logged to its W&B run too
(``klsweep.tracking.log_eval``).

``eval-hash`` covers every setting that changes a score (tasks, task files, generation, backend, lm-eval's
version), so a repeated evaluation is skipped and a changed one goes to a new folder beside the old.

Entry points: ``eval_run`` (what every eval job of a sweep calls), ``eval_many`` (many runs in one process:
lm-eval and the tasks are loaded once), ``eval_baseline`` (step 0), ``eval_request`` (what ``klsweep eval``
evaluates) and ``eval_batch`` (what each of its jobs runs). Submitting those jobs is ``klsweep.submit``'s.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import math
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from klsweep import store
from klsweep.config import EvalSection, ModelSection, read_run_file
from klsweep.errors import KLSweepError, Problem, UserError, describe, not_loaded

CONF_DIR = Path(__file__).parent / "conf" / "eval"
TASKS_DIR = Path(__file__).parent / "evaltasks"
RESULTS_FILE = "results.json"
ERROR_FILE = "error.json"
BASELINE_CHECKPOINT = "step-0"
EVALUATED_STATES = ("done", "diverged")
Around = Callable[[Path], contextlib.AbstractContextManager[Any]]  # eval_batch's context of each folder
BACKENDS = ("hf", "vllm")
CHECKPOINT_CHOICES = ("last", "all")
# EvalSection fields that do not change a score (left out of the eval hash).
_UNHASHED = ("batch_size", "tensor_parallel_size")


class EvalError(KLSweepError):
    """A run could not be evaluated (missing or broken checkpoint, lm-eval failure); recorded in the run."""


# ------------------------------------------------------------------------------------------------ suites


def load_suite(name: str) -> EvalSection:
    """The suite ``klsweep/conf/eval/<name>.yaml`` as an ``EvalSection``."""
    from omegaconf import OmegaConf

    path = CONF_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CONF_DIR.glob("*.yaml")))
        raise UserError(Problem("--suite", f"no eval suite {name!r}", known))
    merged = OmegaConf.merge(OmegaConf.structured(EvalSection), OmegaConf.load(path))
    return OmegaConf.to_object(merged)


def as_eval_section(eval_cfg: EvalSection | dict[str, Any]) -> EvalSection:
    """An ``EvalSection`` from itself or from a (possibly partial) dict, validated."""
    from omegaconf import OmegaConf

    if isinstance(eval_cfg, EvalSection):
        cfg = eval_cfg
    else:
        merged = OmegaConf.merge(OmegaConf.structured(EvalSection), OmegaConf.create(dict(eval_cfg)))
        cfg = OmegaConf.to_object(merged)
    problems = []
    if cfg.suite == "none" or not (cfg.in_domain or cfg.ood):
        problems.append(
            Problem("eval", f"suite {cfg.suite!r} names no tasks", "a suite such as tiny or paper")
        )
    if cfg.backend not in BACKENDS:
        problems.append(Problem("eval.backend", f"unknown backend {cfg.backend!r}", ", ".join(BACKENDS)))
    if cfg.num_samples < 1:
        problems.append(Problem("eval.num_samples", f"{cfg.num_samples}", "an integer >= 1"))
    if cfg.num_samples > 1 and cfg.temperature <= 0:
        problems.append(
            Problem("eval.num_samples", "several samples of greedy decoding are identical", "temperature > 0")
        )
    overlap = sorted(set(cfg.in_domain) & set(cfg.ood))
    if overlap:
        problems.append(
            Problem("eval.ood", f"task(s) {overlap} are also in eval.in_domain", "disjoint lists")
        )
    if problems:
        raise UserError(problems, title="invalid eval settings")
    return cfg


def include_dir(include_path: str | None) -> Path | None:
    """The folder of custom task YAMLs named by ``include_path`` (``builtin:<name>``: shipped with klsweep)."""
    if not include_path:
        return None
    if include_path.startswith("builtin:"):
        folder = TASKS_DIR / include_path.removeprefix("builtin:")
        if not folder.is_dir():
            known = ", ".join(f"builtin:{p.name}" for p in sorted(TASKS_DIR.iterdir()) if p.is_dir())
            raise UserError(Problem("eval.include_path", f"no shipped task folder {include_path!r}", known))
        return folder
    folder = Path(include_path).expanduser()
    if not folder.is_dir():
        raise UserError(
            Problem("eval.include_path", f"no such folder: {folder}", "builtin:<name> or a folder")
        )
    return folder


def _task_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _digest(folder: Path | None) -> str | None:
    if folder is None:
        return None
    h = hashlib.sha256()
    for p in _task_files(folder):
        h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _absolutise(data_files: Any, base: Path) -> Any:
    if isinstance(data_files, str):
        p = Path(data_files).expanduser()
        return data_files if p.is_absolute() or "://" in data_files else str(base / p)
    if isinstance(data_files, list):
        return [_absolutise(x, base) for x in data_files]
    if isinstance(data_files, dict):
        return {k: _absolutise(v, base) for k, v in data_files.items()}
    return data_files


def materialise_tasks(folder: Path) -> Path:
    """A copy of the task folder where each ``dataset_kwargs.data_files`` is absolute (datasets resolves
    relative data files against the working directory, not the YAML). Cached in the temp folder by content and
    by the folder's path (a copy made from another checkout points into that checkout)."""
    import yaml

    # keyed by content and by the folder's own path, which the copy's absolute data files point into
    where = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:8]
    target = Path(tempfile.gettempdir()) / f"klsweep-evaltasks-{folder.name}-{_digest(folder)}-{where}"
    if target.is_dir():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for src in _task_files(folder):
            dst = tmp / src.relative_to(folder)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            if not (src.name.endswith(".yaml") or src.name.endswith("_yaml")):
                continue
            try:
                cfg = yaml.safe_load(src.read_text())
            except yaml.YAMLError:  # lm-eval tags (!function): no data files to fix here
                continue
            files = cfg.get("dataset_kwargs", {}).get("data_files") if isinstance(cfg, dict) else None
            if files is not None:
                cfg["dataset_kwargs"]["data_files"] = _absolutise(files, src.parent)
                dst.write_text(yaml.safe_dump(cfg, sort_keys=False))
        with contextlib.suppress(OSError):  # another process made it first
            tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _task_manager(eval_cfg: EvalSection) -> Any:
    """A TaskManager that knows every task of the suite; lm-eval's built-in tasks are indexed (~6 s) only when
    the suite names one that the include folder lacks."""
    from lm_eval.tasks import TaskManager

    folder = include_dir(eval_cfg.include_path)
    include = str(materialise_tasks(folder)) if folder is not None else None
    names = [*eval_cfg.in_domain, *eval_cfg.ood]
    if include is not None:
        tm = TaskManager(include_path=include, include_defaults=False)
        if all(n in tm.all_tasks for n in names):
            return tm
    tm = TaskManager(include_path=include, include_defaults=True)
    missing = [n for n in names if n not in tm.all_tasks]
    if missing:
        raise UserError(
            [
                Problem("eval", f"no lm-eval task {n!r} (include_path={eval_cfg.include_path!r})")
                for n in missing
            ],
            title=f"unknown tasks in suite {eval_cfg.suite!r}",
        )
    return tm


def resolve_tasks(eval_cfg: EvalSection | dict[str, Any]) -> dict[str, str]:
    """``{task name: its YAML}`` for every task of the suite, from lm-eval's task index alone (no download);
    a ``UserError`` names each task that does not exist."""
    cfg = as_eval_section(eval_cfg)
    tm = _task_manager(cfg)
    return {n: str(tm.task_index[n].yaml_path) for n in [*cfg.in_domain, *cfg.ood]}


# ------------------------------------------------------------------------------------------------ settings


def lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def eval_settings(eval_cfg: EvalSection) -> dict[str, Any]:
    """The settings that decide a score (what the eval hash covers): the suite's fields but the batch size and
    the parallelism, and a digest of the custom task files. The same for every model of a sweep, so a sweep
    has one hash per suite (``apply_chat_template``: null follows each model's ``model.chat_template``, the
    decision its training used; results.json records what was done as ``chat_template_applied``)."""
    settings = {k: v for k, v in asdict(eval_cfg).items() if k not in _UNHASHED}
    settings["tasks_digest"] = _digest(include_dir(eval_cfg.include_path))
    return settings


def eval_hash(settings: dict[str, Any]) -> str:
    """Short hash of the settings and lm-eval's version: the name of the ``eval/<eval-hash>/`` folder."""
    blob = json.dumps({"settings": settings, "lm_eval": lm_eval_version()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def model_key(model: ModelSection) -> str:
    """The baseline folder's name for a model: its config-group name (``model.name``)."""
    return model.name.replace("/", "--")


def _model_section(config: dict[str, Any]) -> ModelSection:
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.structured(ModelSection), OmegaConf.create(config.get("model", {})))
    return OmegaConf.to_object(merged)


def run_config(run_dir: Path) -> dict[str, Any]:
    """The run's ``config.yaml`` as a dict (``EvalError`` when the folder is not a run,
    ``store.UnreadableFile`` when the file cannot be read)."""
    path = run_dir / store.CONFIG_FILE
    if not path.is_file():
        raise EvalError(f"{run_dir}: no {store.CONFIG_FILE}: not a run folder")
    return read_run_file(run_dir)


# ------------------------------------------------------------------------------------------------ lm-eval


@dataclass
class _Item:
    """One model to evaluate and where its results go."""

    model_path: str
    model: ModelSection
    out_dir: Path  # .../eval/<hash>/<checkpoint-name>
    checkpoint: str
    step: int
    settings: dict[str, Any]


@dataclass
class _Suite:
    """The suite's lm-eval tasks, loaded once (data included) and reused for every model."""

    cfg: EvalSection
    manager: Any = None  # lm-eval's TaskManager (simple_evaluate builds a full one, ~6 s, when given none)
    tasks: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def settings(self) -> dict[str, Any]:
        """``eval_settings`` of the suite (digests the task files), once per suite rather than per run."""
        return eval_settings(self.cfg)

    @functools.cached_property
    def hash(self) -> str:
        return eval_hash(self.settings)

    def load(self) -> None:
        if not self.tasks:
            self.manager = _task_manager(self.cfg)
            names = [*self.cfg.in_domain, *self.cfg.ood]
            try:
                self.tasks = self.manager.load(names)["tasks"]
            except (OSError, ConnectionError, ValueError) as e:  # a dataset not cached offline, gated, ...
                raise not_loaded(f"the data of eval task(s) {', '.join(names)}", e) from e


def _make_lm(item: _Item, cfg: EvalSection) -> Any:
    from lm_eval.api.registry import get_model

    dtype = item.model.dtype
    # a hub model's baseline at the commit its runs trained from (a checkpoint is a local folder)
    pin = {"revision": item.model.revision} if item.model.revision and item.step == 0 else {}
    if cfg.backend == "vllm":
        gpus = max(1, item.model.resources.gpus_per_node)
        tp = cfg.tensor_parallel_size
        args = {
            "pretrained": item.model_path,
            "dtype": dtype,
            "tensor_parallel_size": tp,
            "data_parallel_size": max(1, gpus // tp),
            "max_gen_toks": cfg.max_gen_toks,
            **pin,
        }
        return get_model("vllm").create_from_arg_obj(args, {"batch_size": "auto"})
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    args = {"pretrained": item.model_path, "dtype": dtype, **pin}
    return get_model("hf").create_from_arg_obj(args, {"batch_size": cfg.batch_size, "device": device})


def _primary_key(result: dict[str, Any], task_config: dict[str, Any], metric: str) -> str:
    """``"<metric>,<filter>"``: the task's first filter (lm-eval names an unfiltered result ``none``)."""
    filters = [f["name"] for f in task_config.get("filter_list") or []] or ["none"]
    for name in filters:
        if f"{metric},{name}" in result:
            return f"{metric},{name}"
    raise EvalError(f"the task's results have no {metric!r}: {sorted(k for k in result if ',' in k)}")


def _json_line(row: dict[str, Any]) -> str:
    return json.dumps(row, default=lambda o: o.item() if hasattr(o, "item") else str(o))


def _evaluate_item(item: _Item, suite: _Suite) -> Path:
    """Run lm-eval on one model, write results.json and samples_<task>.jsonl; returns results.json."""
    import lm_eval

    cfg = suite.cfg
    suite.load()
    started = time.time()
    lm = _make_lm(item, cfg)
    per_sample: dict[str, list[float]] = {}
    stderr_one: dict[str, float | None] = {}
    keys: dict[str, str] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    chat = item.model.chat_template if cfg.apply_chat_template is None else cfg.apply_chat_template
    gen = {"max_gen_toks": cfg.max_gen_toks, "temperature": cfg.temperature, "do_sample": cfg.temperature > 0}
    lm_eval_files: list[str] = []
    try:
        for seed in range(cfg.num_samples):
            tracker = _lm_eval_tracker(item)
            res = lm_eval.simple_evaluate(
                model=lm,
                model_args=f"pretrained={item.model_path}",  # what lm-eval's results file names the model by
                tasks=list(suite.tasks.values()),
                num_fewshot=cfg.num_fewshot,
                limit=cfg.limit,
                log_samples=True,
                apply_chat_template=chat,
                gen_kwargs=gen,
                random_seed=seed,
                numpy_random_seed=seed,
                torch_random_seed=seed,
                fewshot_random_seed=seed,
                task_manager=suite.manager,
                evaluation_tracker=tracker,
            )
            lm_eval_files.append(_save_lm_eval_results(tracker, res, cfg.backend))
            for task in suite.tasks:
                result = res["results"][task]
                keys[task] = key = _primary_key(result, res["configs"][task], cfg.metric)
                per_sample.setdefault(task, []).append(float(result[key]))
                err = result.get(key.replace(",", "_stderr,", 1))
                stderr_one[task] = float(err) if isinstance(err, int | float) else None  # lm-eval: "N/A"
                for row in res["samples"][task]:
                    samples.setdefault(task, []).append(
                        {"sample_index": seed, **row} if cfg.num_samples > 1 else row
                    )
    finally:
        del lm
        gc.collect()
    values = {task: sum(v) / len(v) for task, v in per_sample.items()}
    stderr = stderr_one if cfg.num_samples == 1 else _pass1_stderr(samples, keys, cfg.metric)
    for task, rows in samples.items():
        store.atomic_write_text(
            item.out_dir / f"samples_{task}.jsonl", "".join(_json_line(r) + "\n" for r in rows)
        )
    results = {
        "suite": cfg.suite,
        "eval_hash": item.out_dir.parent.name,
        "checkpoint": item.checkpoint,
        "step": item.step,
        "backend": cfg.backend,
        "metric": cfg.metric,
        "metrics": {
            "in_domain": {t: values[t] for t in cfg.in_domain},
            "ood": {t: values[t] for t in cfg.ood},
        },
        "stderr": stderr,
        "settings": item.settings,
        "lm_eval_version": lm_eval_version(),
        "created_at": time.time(),
        # Beyond the DESIGN.md contract: what each number is and what was evaluated.
        "final_state": _final_state(Path(item.model_path)),
        "metric_keys": keys,
        "chat_template_applied": chat,
        "num_problems": {
            t: len([r for r in samples[t] if _is_primary(r, keys[t])]) // cfg.num_samples for t in samples
        },
        "model_path": item.model_path,
        "elapsed_s": round(time.time() - started, 3),
        "lm_eval_results": lm_eval_files,
    }
    path = item.out_dir / RESULTS_FILE
    store.write_json(path, results)
    return path


def _final_state(checkpoint: Path) -> str | None:
    """``done`` or ``diverged`` when ``checkpoint`` is where its run ended (``store.FINAL_MARKER``), else None
    (an earlier checkpoint, or a model that is not a run's checkpoint)."""
    marker = checkpoint / store.FINAL_MARKER
    return store.read_json(marker).get("state") if marker.is_file() else None


def _lm_eval_tracker(item: _Item) -> Any:
    """lm-eval's own ``EvaluationTracker``, writing to ``<out_dir>/results_<date>.json`` (as ``lm_eval
    --output_path <out_dir>/results.json`` does)."""
    from lm_eval.loggers import EvaluationTracker

    return EvaluationTracker(output_path=str(item.out_dir / RESULTS_FILE))


def _save_lm_eval_results(tracker: Any, res: dict[str, Any], backend: str) -> str:
    """lm-eval's results file of one ``simple_evaluate`` (its schema: ``results``, ``configs``, ``versions``,
    ``n-shot``, ``config``, ..., as lm-eval's CLI writes it; without the samples, which are klsweep's
    ``samples_<task>.jsonl``), so that lm-eval's tooling (``lm_eval.utils.make_table``, its result loaders)
    reads it. Returns the file's name."""
    tracker.general_config_tracker.model_source = backend  # lm-eval records "CUSTOM" for a model object
    tracker.save_results_aggregated(
        results={k: v for k, v in res.items() if k != "samples"}, samples=res.get("samples")
    )
    name = f"results_{tracker.date_id}.json"
    if not (Path(tracker.output_path).parent / name).is_file():  # lm-eval logs a failure and goes on
        raise EvalError(
            f"lm-eval did not write its results file {name} in {Path(tracker.output_path).parent}"
        )
    return name


def _is_primary(row: dict[str, Any], key: str) -> bool:
    return row.get("filter", "none") == key.split(",", 1)[1]


def _pass1_stderr(
    samples: dict[str, list[dict[str, Any]]], keys: dict[str, str], metric: str
) -> dict[str, float | None]:
    """Standard error over problems of the per-problem mean score across samples (pass@1 with n samples)."""
    out = {}
    for task, rows in samples.items():
        by_doc: dict[Any, list[float]] = {}
        for r in rows:
            if _is_primary(r, keys[task]):
                by_doc.setdefault(r["doc_id"], []).append(float(r[metric]))
        means = [sum(v) / len(v) for v in by_doc.values()]
        n = len(means)
        mu = sum(means) / max(n, 1)
        out[task] = math.sqrt(sum((m - mu) ** 2 for m in means) / (n - 1) / n) if n > 1 else None
    return out


# ------------------------------------------------------------------------------------------------ runs


def _checkpoint_items(run_dir: Path, suite: _Suite, checkpoints: str) -> list[_Item]:
    if checkpoints not in CHECKPOINT_CHOICES:
        raise UserError(Problem("--checkpoints", f"{checkpoints!r}", ", ".join(CHECKPOINT_CHOICES)))
    model = _model_section(run_config(run_dir))
    found = store.checkpoints(run_dir)
    if not found:
        raise EvalError(f"{run_dir.name}: no complete checkpoint under {run_dir / store.CHECKPOINTS_DIR}")
    chosen = found if checkpoints == "all" else found[-1:]
    hash_dir = run_dir / store.EVAL_DIR / suite.hash
    return [
        _Item(
            model_path=str(ckpt),
            model=model,
            out_dir=hash_dir / ckpt.name,
            checkpoint=ckpt.name,
            step=store.checkpoint_step(ckpt),
            settings=suite.settings,
        )
        for ckpt in chosen
    ]


def _log_to_wandb(run_dir: Path, results_path: Path) -> None:
    """The checkpoint's scores to the run's W&B run (``klsweep.tracking.log_eval``); why not, in results.json."""
    from klsweep import tracking

    results = store.read_json(results_path)
    error = tracking.log_eval(run_dir, run_config(run_dir), results)
    if error is not None:
        store.write_json(results_path, {**results, "wandb_error": error})


def _record_error(run_dir: Path, hash_dir: Path | None, message: str, tb: str) -> None:
    if hash_dir is not None:
        store.write_json(
            hash_dir / ERROR_FILE, {"error": message, "traceback": tb, "created_at": time.time()}
        )
    if (run_dir / store.STATUS_FILE).exists():
        store.write_status(run_dir, store.read_status(run_dir)["state"], eval_error=message)


def _clear_error(run_dir: Path, hash_dir: Path) -> None:
    (hash_dir / ERROR_FILE).unlink(missing_ok=True)
    status = store.read_status(run_dir)
    if status.get("eval_error"):
        store.write_status(run_dir, status["state"], eval_error=None)


def _eval_one_run(run_dir: Path, suite: _Suite, checkpoints: str) -> list[Path]:
    """Evaluate one run; raises EvalError (after recording it in the run) when it cannot be evaluated."""
    hash_dir = None
    current = "-"
    try:
        items = _checkpoint_items(run_dir, suite, checkpoints)
        hash_dir = items[0].out_dir.parent
        paths = []
        for item in items:
            current = item.checkpoint
            done = item.out_dir / RESULTS_FILE
            if not done.is_file():
                _log_to_wandb(run_dir, _evaluate_item(item, suite))
            paths.append(done)
        _clear_error(run_dir, hash_dir)
        return paths
    except UserError:
        raise
    except Exception as e:
        if hash_dir is None:  # no checkpoint to evaluate: still file the error under the settings' hash
            hash_dir = run_dir / store.EVAL_DIR / suite.hash
        message = f"{run_dir.name} {current}: {describe(e)}"
        text = traceback.format_exc()
        print(f"{message}\n{text}", file=sys.stderr, flush=True)  # the whole traceback in the job's log
        _record_error(run_dir, hash_dir, message, "".join(text.splitlines(True)[-30:]))
        raise EvalError(message) from e


def _eval_runs(
    run_dirs: list[Path], suite: _Suite, checkpoints: str, around: Around = contextlib.nullcontext
) -> tuple[list[Path], dict[str, str]]:
    paths: list[Path] = []
    errors: dict[str, str] = {}
    for run_dir in run_dirs:
        try:
            with around(Path(run_dir)):
                paths += _eval_one_run(Path(run_dir), suite, checkpoints)
        except EvalError as e:
            errors[str(run_dir)] = str(e)
    return paths, errors


def eval_many(
    run_dirs: list[Path], eval_cfg: EvalSection | dict[str, Any], checkpoints: str = "last"
) -> list[Path]:
    """Evaluate many runs in this process (lm-eval's tasks are loaded once). A run that cannot be evaluated
    gets its error recorded (``eval/<hash>/error.json``, ``status.json: eval_error``) and the others go on.
    Returns the results.json of every evaluated checkpoint (already present ones included)."""
    return _eval_runs(run_dirs, _Suite(as_eval_section(eval_cfg)), checkpoints)[0]


def eval_run(run_dir: Path, eval_cfg: EvalSection | dict[str, Any], checkpoints: str = "last") -> list[Path]:
    """The eval job: evaluate the run's last (or all) checkpoints; returns their results.json paths. Skips
    checkpoints already evaluated under the same settings; raises ``EvalError`` (recorded in the run) when the
    run cannot be evaluated."""
    return _eval_one_run(Path(run_dir), _Suite(as_eval_section(eval_cfg)), checkpoints)


def eval_baseline(
    sweep_dir: Path,
    config: dict[str, Any],
    eval_cfg: EvalSection | dict[str, Any],
    *,
    suite: _Suite | None = None,
) -> Path:
    """Evaluate the initial model of ``config`` (a RunConfig dict) once per sweep, as step 0:
    ``<sweep>/baseline/<model-key>/eval/<hash>/step-0/results.json`` (returned; skipped when present)."""
    from omegaconf import OmegaConf

    from klsweep.tinymodel import resolve_model_path

    cfg = as_eval_section(eval_cfg)
    model = _model_section(config)
    base = Path(sweep_dir) / store.BASELINE_DIR / model_key(model)
    if not (base / store.CONFIG_FILE).is_file():
        store.atomic_write_text(
            base / store.CONFIG_FILE, OmegaConf.to_yaml(OmegaConf.create({"model": asdict(model)}))
        )
    suite = suite or _Suite(cfg)
    out_dir = base / store.EVAL_DIR / suite.hash / BASELINE_CHECKPOINT
    if (out_dir / RESULTS_FILE).is_file():
        return out_dir / RESULTS_FILE
    item = _Item(resolve_model_path(model), model, out_dir, BASELINE_CHECKPOINT, 0, suite.settings)
    return _evaluate_item(item, suite)


# ------------------------------------------------------------------------------------------------ klsweep eval


@dataclass
class EvalOutcome:
    """What an evaluation did: results written, failures, runs left out."""

    results: list[Path] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # run (or baseline) folder -> message
    skipped: dict[str, str] = field(default_factory=dict)  # run folder -> why (its state)


@dataclass
class EvalRequest:
    """What ``klsweep eval`` evaluates, checked and resolved (``eval_request``)."""

    runs: list[Path]  # a sweep's finished runs, or the one run folder
    skipped: dict[str, str]  # run folder -> why it is left out (its state)
    baselines: list[tuple[str, dict[str, Any]]]  # (sweep folder, a RunConfig dict) per model of a sweep
    eval_cfg: dict[str, Any]  # the EvalSection as a dict
    checkpoints: str  # last | all


def eval_batch(
    run_dirs: list[str],
    eval_cfg: dict[str, Any],
    checkpoints: str,
    baselines: list[tuple[str, dict[str, Any]]],
    around: Around = contextlib.nullcontext,
) -> EvalOutcome:
    """The baselines, then the runs, in one process (lm-eval and the tasks loaded once): the body of every
    ``klsweep eval`` job. A run or baseline that fails is recorded in ``errors`` and the others go on.
    ``around(folder)``: the context each run (or baseline) folder is evaluated in (the submission layer keeps
    the job's log of each run there)."""
    suite = _Suite(as_eval_section(eval_cfg))
    out = EvalOutcome()
    for sweep_dir, config in baselines:
        try:
            with around(Path(sweep_dir) / store.BASELINE_DIR / model_key(_model_section(config))):
                out.results.append(eval_baseline(Path(sweep_dir), config, suite.cfg, suite=suite))
        except Exception as e:  # the runs are still worth evaluating
            out.errors[f"{sweep_dir}/{store.BASELINE_DIR}"] = describe(e)
    paths, errors = _eval_runs([Path(r) for r in run_dirs], suite, checkpoints, around)
    out.results += paths
    out.errors.update(errors)
    return out


def _targets(target: Path) -> tuple[list[Path], dict[str, str], Path | None]:
    """(runs to evaluate, runs left out -> why, the sweep folder or None for a single run). A run whose
    status.json or config.yaml cannot be read is left out, named with what to do; a single run raises."""
    if (target / store.CONFIG_FILE).is_file():
        run_config(target)  # UnreadableFile
        return [target], {}, None
    runs = store.run_dirs(target)
    if not runs:
        raise UserError(
            Problem(
                "TARGET",
                f"{target} is neither a run folder nor a sweep with runs",
                "results/<sweep>[/<run-id>]",
            )
        )
    chosen, skipped = [], {}
    for run in runs:
        try:
            state = store.read_status(run).get("state", "pending")
            run_config(run)
        except store.UnreadableFile as e:
            skipped[str(run)] = f"unreadable: {e.message}"
            continue
        if state in EVALUATED_STATES:
            chosen.append(run)
        else:
            skipped[str(run)] = state
    return chosen, skipped, target


def _suite_of_runs(runs: list[Path]) -> EvalSection:
    if not runs:
        raise UserError(
            Problem("TARGET", "no readable run to take the eval settings from", "pass --suite NAME")
        )
    found = {json.dumps(run_config(r).get("eval", {}), sort_keys=True) for r in runs}
    if len(found) != 1:
        raise UserError(Problem("--suite", "the runs have different eval settings", "pass --suite NAME"))
    return as_eval_section(json.loads(found.pop()))


def eval_request(
    target: Path,
    suite: str | None = None,
    backend: str | None = None,
    checkpoints: str = "last",
    *,
    problems: Sequence[Problem] = (),
) -> EvalRequest:
    """``klsweep eval``'s request: a run folder, or a sweep's finished runs (done or diverged) and its step-0
    baselines (one per model). ``suite`` names ``conf/eval/<suite>.yaml`` (default: the runs' own eval
    settings); ``backend`` overrides the suite's. Unknown task names fail here, before anything is submitted.
    ``problems``: the caller's own findings about the request (the submission layer's ``--cluster``),
    reported with these in one ``UserError``."""
    target = Path(target)
    problems = list(problems)
    if checkpoints not in CHECKPOINT_CHOICES:
        problems.append(Problem("--checkpoints", f"{checkpoints!r}", ", ".join(CHECKPOINT_CHOICES)))
    if backend is not None and backend not in BACKENDS:
        problems.append(Problem("--backend", f"unknown backend {backend!r}", ", ".join(BACKENDS)))
    if not target.is_dir():
        problems.append(Problem("TARGET", f"no such folder: {target}", "results/<sweep>[/<run-id>]"))
    if problems:
        raise UserError(problems, title="invalid eval request")
    runs, skipped, sweep_dir = _targets(target)
    readable = [r for r in store.run_dirs(target) if not skipped.get(str(r), "").startswith("unreadable")]
    cfg = load_suite(suite) if suite else _suite_of_runs(runs or readable)
    if backend is not None:
        cfg.backend = backend
    cfg = as_eval_section(cfg)
    resolve_tasks(cfg)
    configs = {}
    for run in runs:
        config = run_config(run)
        configs.setdefault(model_key(_model_section(config)), config)
    baselines = [(str(sweep_dir), c) for c in configs.values()] if sweep_dir is not None else []
    return EvalRequest(runs, skipped, baselines, asdict(cfg), checkpoints)
