"""Evaluating runs: which checkpoints, where their results go, and a run's eval error recorded in the run.

``eval_run`` (each eval job of a sweep), ``eval_many`` (many runs in one process), ``eval_baseline`` (a
sweep's step 0) and ``eval_batch`` (the body of each ``klsweep eval`` job). Layout: docs/DESIGN.md.
"""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from klsweep import environment, store
from klsweep.config import EvalSection, ModelSection, RunConfig, load_run
from klsweep.errors import Problem, UserError, describe
from klsweep.evaluate import running
from klsweep.evaluate.running import RESULTS_FILE, Item
from klsweep.evaluate.suites import EvalError, Suite, as_eval_section
from klsweep.printable import visible_lines

ERROR_FILE = "error.json"
BASELINE_CHECKPOINT = "step-0"
CHECKPOINT_CHOICES = ("last", "all")
Around = Callable[[Path], contextlib.AbstractContextManager[Any]]  # eval_batch's context of each folder


def model_key(model: ModelSection) -> str:
    """The baseline folder's name for a model: its config-group name (``model.name``)."""
    return model.name.replace("/", "--")


def run_config(run_dir: Path) -> RunConfig:
    """The run's ``RunConfig`` (``config.load_run``); ``EvalError`` when the folder is not a run (recorded like
    any failure to evaluate it), ``store.UnreadableFile`` when its config cannot be read."""
    if not (Path(run_dir) / store.CONFIG_FILE).is_file():
        raise EvalError(f"{run_dir}: no {store.CONFIG_FILE}: not a run folder")
    return load_run(run_dir)


def _chosen(run_dir: Path, checkpoints: str) -> list[Path]:
    """The checkpoints an eval of the run scores: its last complete one with Hugging Face weights (not an FSDP
    shard's only), or every one (``checkpoints``: last | all); none when it has none."""
    if checkpoints not in CHECKPOINT_CHOICES:
        raise UserError(Problem("checkpoints", f"{checkpoints!r}", ", ".join(CHECKPOINT_CHOICES)))
    found = [c for c in store.checkpoints(run_dir) if store.has_weights(c)]
    return found if checkpoints == "all" else found[-1:]


def scored(run_dir: Path, suite: Suite, checkpoints: str) -> list[Path] | None:
    """The results.json of every checkpoint an eval of the run would score under ``suite``'s settings, when
    each is there already (nothing left to evaluate); None when one is missing, or when the run has no
    checkpoint to score (its eval says why)."""
    paths = results_paths(run_dir, suite, checkpoints)
    return paths if paths and all(p.is_file() for p in paths) else None


def results_paths(run_dir: Path, suite: Suite, checkpoints: str) -> list[Path]:
    """Where an eval of the run under ``suite``'s settings writes the results.json of each checkpoint it
    scores (there or not yet)."""
    chosen = _chosen(Path(run_dir), checkpoints)
    return [Path(run_dir) / store.EVAL_DIR / suite.hash / c.name / RESULTS_FILE for c in chosen]


def baseline_results(sweep_dir: Path, model: ModelSection, suite: Suite) -> Path:
    """Where the step-0 baseline of ``model`` has its results.json under ``suite``'s settings."""
    base = Path(sweep_dir) / store.BASELINE_DIR / model_key(model)
    return base / store.EVAL_DIR / suite.hash / BASELINE_CHECKPOINT / RESULTS_FILE


def _checkpoint_items(run_dir: Path, suite: Suite, checkpoints: str) -> list[Item]:
    model = run_config(run_dir).model
    chosen = _chosen(run_dir, checkpoints)
    if not chosen:
        raise EvalError(
            f"{run_dir.name}: no complete checkpoint with Hugging Face weights under "
            f"{run_dir / store.CHECKPOINTS_DIR} (sharded FSDP checkpoints have them only where the run ended)"
        )
    for ckpt in chosen:
        unreadable = store.unreadable_weights(ckpt)
        if unreadable is not None:
            raise EvalError(unreadable)
    hash_dir = run_dir / store.EVAL_DIR / suite.hash
    return [
        Item(
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


def _eval_one_run(run_dir: Path, suite: Suite, checkpoints: str) -> list[Path]:
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
                _log_to_wandb(run_dir, running.evaluate_item(item, suite))
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
        print(
            visible_lines(f"{message}\n{text}"), file=sys.stderr, flush=True
        )  # the whole traceback: the job's log
        _record_error(run_dir, hash_dir, message, "".join(text.splitlines(True)[-30:]))
        raise EvalError(message) from e


def _eval_runs(
    run_dirs: list[Path], suite: Suite, checkpoints: str, around: Around = contextlib.nullcontext
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
    return _eval_runs(run_dirs, Suite(as_eval_section(eval_cfg)), checkpoints)[0]


def eval_run(run_dir: Path, eval_cfg: EvalSection | dict[str, Any], checkpoints: str = "last") -> list[Path]:
    """The eval job: evaluate the run's last (or all) checkpoints; returns their results.json paths. Skips
    checkpoints already evaluated under the same settings; raises ``EvalError`` (recorded in the run) when the
    run cannot be evaluated."""
    return _eval_one_run(Path(run_dir), Suite(as_eval_section(eval_cfg)), checkpoints)


def eval_baseline(
    sweep_dir: Path,
    model: ModelSection,
    eval_cfg: EvalSection | dict[str, Any],
    *,
    suite: Suite | None = None,
) -> Path:
    """Evaluate the initial ``model`` (a run's ``model`` section) once per sweep, as step 0:
    ``<sweep>/baseline/<model-key>/eval/<hash>/step-0/results.json`` (returned; skipped when present)."""
    from omegaconf import OmegaConf

    from klsweep.tinymodel import resolve_model_path

    cfg = as_eval_section(eval_cfg)
    base = Path(sweep_dir) / store.BASELINE_DIR / model_key(model)
    if not (base / store.CONFIG_FILE).is_file():
        store.atomic_write_text(
            base / store.CONFIG_FILE, OmegaConf.to_yaml(OmegaConf.create({"model": asdict(model)}))
        )
    suite = suite or Suite(cfg)
    out_dir = baseline_results(sweep_dir, model, suite).parent
    if (out_dir / RESULTS_FILE).is_file():
        return out_dir / RESULTS_FILE
    item = Item(resolve_model_path(model), model, out_dir, BASELINE_CHECKPOINT, 0, suite.settings)
    return running.evaluate_item(item, suite)


@dataclass
class EvalOutcome:
    """What an evaluation did: results written, failures, runs left out."""

    results: list[Path] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # run (or baseline) folder -> message
    skipped: dict[str, str] = field(default_factory=dict)  # run folder -> why (its state)


def eval_batch(
    run_dirs: list[str],
    eval_cfg: dict[str, Any],
    checkpoints: str,
    baselines: list[tuple[str, ModelSection]],
    around: Around = contextlib.nullcontext,
    threads: int | None = None,
) -> EvalOutcome:
    """The baselines, then the runs, in one process (lm-eval and the tasks loaded once): the body of every
    ``klsweep eval`` job. A run or baseline that fails is recorded in ``errors`` and the others go on.
    ``around(folder)``: the context each run (or baseline) folder is evaluated in (the submission layer keeps
    the job's log of each run there); ``threads``: torch's CPU threads for the hf backend (the job's share of
    the cores, when several jobs share a machine; ``environment.use_cpu_threads``), None to leave them."""
    suite = Suite(as_eval_section(eval_cfg))
    if threads is not None and suite.cfg.backend == "hf":
        environment.use_cpu_threads(threads)
    out = EvalOutcome()
    for sweep_dir, model in baselines:
        try:
            with around(Path(sweep_dir) / store.BASELINE_DIR / model_key(model)):
                out.results.append(eval_baseline(Path(sweep_dir), model, suite.cfg, suite=suite))
        except Exception as e:  # the runs are still worth evaluating
            out.errors[f"{sweep_dir}/{store.BASELINE_DIR}"] = describe(e)
    paths, errors = _eval_runs([Path(r) for r in run_dirs], suite, checkpoints, around)
    out.results += paths
    out.errors.update(errors)
    return out
