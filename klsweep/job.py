"""One training run end to end in its run folder: ``config.yaml`` -> train -> ``status.json``.

``train_run(run_dir)`` is what every training job calls (``klsweep train``, ``klsweep.submit``'s jobs): it
reads the run's config (``config.load_run``), resumes from the last complete checkpoint, records the
environment, opens the W&B mirror (``tracking``), builds the trainer (``trainer_factory``), trains with
the metrics monitor (``monitor``) and the preemption save (``preemption``) attached, and writes the final
status: ``done``, ``diverged`` (a result, not a crash) or ``failed``; a preemption leaves it ``running``.
The file contracts (status.json, metrics.jsonl, checkpoints), resume, divergence and preemption:
docs/DESIGN.md; the faults a run survives: docs/FAULTS.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import engines, environment, store, tracking, trainer_factory
from klsweep.config import load_run
from klsweep.errors import describe
from klsweep.monitor import RunMonitor, record_warning
from klsweep.preemption import PREEMPTION

if TYPE_CHECKING:
    from klsweep.config import RunConfig
    from klsweep.trainer import KLGRPOTrainer

ERROR_LINES = 30  # traceback lines kept in status.json
MAX_WARNINGS = 20  # warnings of earlier attempts kept in status.json


def train_run(
    run_dir: str | Path, quiet: bool = False, on_row: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Train the run in ``run_dir`` (resuming from its last checkpoint) and return its final status. Rank 0
    holds the run's training lock throughout (``store.training``): ``store.AlreadyTraining`` when another
    process trains it. ``quiet`` (``klsweep train`` in a terminal): none of the libraries' own output (TRL's
    log dicts, progress bars, Python warnings, W&B's chatter; the run's warnings stay in its status);
    ``on_row``: each step's metrics row."""
    lock = store.training(run_dir) if int(os.environ.get("RANK", "0")) == 0 else contextlib.nullcontext()
    with lock, _quiet() if quiet else contextlib.nullcontext(), environment.frozen_heap():
        _import_engines(run_dir)
        return _train_run(run_dir, quiet, on_row)


def _import_engines(run_dir: str | Path) -> None:
    """vLLM imported here, before the run's trainer exists, where the run generates with it
    (``engines.import_vllm_engine``: what its first import keeps holds every frame then on the stack)."""
    try:
        use_vllm = load_run(run_dir).train.use_vllm
    except Exception:  # _train_run reads the config again and says what is wrong with it
        return
    if use_vllm and importlib.util.find_spec("vllm") is not None:
        engines.import_vllm_engine()


@contextlib.contextmanager
def _quiet():
    """The libraries' console output off: Python warnings, transformers' and datasets' progress bars and
    logging below errors, W&B's messages (``WANDB_SILENT``); restored afterwards."""
    import warnings

    import datasets
    from transformers.utils import logging as hf_logging

    silent = os.environ.get("WANDB_SILENT")
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    os.environ["WANDB_SILENT"] = "true"
    with contextlib.redirect_stdout(
        io.StringIO()
    ):  # it prints "[INFO] Running in WANDB offline mode" on import
        import transformers.integrations.integration_utils  # noqa: F401
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if silent is None:
            os.environ.pop("WANDB_SILENT", None)
        else:
            os.environ["WANDB_SILENT"] = silent
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        datasets.enable_progress_bars()
        datasets.logging.set_verbosity_warning()


def _train_run(
    run_dir: str | Path, quiet: bool = False, on_row: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    run_dir = Path(run_dir)
    is_main = int(os.environ.get("RANK", "0")) == 0
    status = store.read_status(run_dir)
    if status["state"] in ("done", "diverged"):
        return status
    config = load_run(run_dir)

    # Resume from the newest checkpoint whose trainer state was written (the last file a save writes) and whose
    # files are whole; a newer one that is not is set aside (store.newest_usable), with a warning.
    found = [c for c in store.checkpoints(run_dir) if (c / store.TRAINER_STATE).exists()]
    resume, unusable = store.newest_usable(found)
    resume_step = store.checkpoint_step(resume) if resume else 0
    warnings: list[str] = list(status.get("warnings") or [])[-MAX_WARNINGS:]  # earlier attempts' too
    for checkpoint, problem in unusable:
        instead = f"resuming from {resume.name} instead" if resume else "none usable: training from step 0"
        record_warning(
            warnings,
            f"cannot resume from {checkpoint} ({problem}): set aside as "
            f"{store.UNUSABLE_PREFIX}{checkpoint.name}; {instead}",
        )
        if is_main:
            with contextlib.suppress(OSError):  # another attempt set it aside already
                store.set_aside_checkpoint(checkpoint)
    # the rows before the checkpoint, as every reader keeps them (store.metrics): the resumed run's collapse
    # rule goes on from them
    if is_main:
        found = store.cut_metrics(run_dir, resume_step, config.train.steps)
        for note in found.notes():
            record_warning(warnings, note)
        kept = found.rows
    else:
        kept = [row for row in store.read_metrics(run_dir, config.train.steps) if row["step"] <= resume_step]
    base_elapsed = float(kept[-1].get("elapsed_s") or 0.0) if kept else 0.0
    started = time.time()
    fields: dict[str, Any] = {
        "step": resume_step,
        "total_steps": config.train.steps,
        "reason": None,
        "error": None,
        "diverged_step": None,
        "started_at": status.get("started_at") or started,
        "finished_at": None,
        "elapsed_s": base_elapsed,  # the training loop's time (RunMonitor.elapsed); the start-up apart:
        "startup_s": float(status.get("startup_s") or 0.0) if resume_step else 0.0,
        "attempt_started_at": started,
        "trained_from": None,  # when this attempt's training loop began, less the earlier attempts' time
        "warnings": warnings,
    }
    if resume is not None and resume_step >= config.train.steps and store.has_weights(resume):
        return _finish_saved_end(run_dir, resume, status, fields, is_main)
    if is_main:
        status = store.write_status(run_dir, "running", **fields)

    _use_allocated_cpus(config)
    if is_main:
        environment.record(run_dir)  # after the thread count is set: what this start trains with
    monitor = RunMonitor(
        run_dir, config, kept, base_elapsed, started, is_main, warnings, on_row, startup_s=fields["startup_s"]
    )
    wandb_run = None
    trainer = None
    try:
        if is_main:
            wandb_run = tracking.open_training_run(config, run_dir, monitor.warn)
        # W&B through a guarded callback only: with report_to=["wandb"], TRL also calls wandb.log directly
        # (its profiling timings), unguarded
        trainer = trainer_factory.build_trainer(config, run_dir)
        if quiet:  # transformers prints every log dict (disable_tqdm=True: its PrinterCallback)
            from transformers.trainer_callback import PrinterCallback

            trainer.remove_callback(PrinterCallback)
        monitor.constants["prompts_too_long"] = float(trainer.prompts_too_long)
        if trainer.numerics == "fast" and trainer.lean_why_not:  # asked, and the trainer computes TRL's way
            monitor.warn(
                f"train.numerics is fast, but TRL's numerics compute this run: {trainer.lean_why_not}"
            )
        trainer.add_callback(monitor.callback())
        trainer.add_callback(PREEMPTION.callback(trainer))
        if wandb_run is not None:
            trainer.add_callback(tracking.guarded_callback(monitor.warn))
        PREEMPTION.attach(trainer, monitor)
        try:
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        except RuntimeError as e:
            if not _is_non_finite_sampling(e):
                raise
            monitor.diverged = (trainer.state.global_step + 1, f"non-finite model outputs in sampling: {e}")
        state = "diverged" if monitor.diverged else "done"
        if monitor.diverged:
            fields.update(diverged_step=monitor.diverged[0], reason=monitor.diverged[1])
        fields["final_checkpoint"] = _save_final(trainer, state, fields["reason"], is_main)
    except store.LostTrainingLock:  # the run is another trainer's now: nothing more written here
        raise
    except Exception as e:
        exiting = _exit_in_flight(e)
        if exiting is not None:  # a preemption's exit, which a failing cleanup (W&B's) turned into an error
            raise exiting from None
        state = "failed"
        reason = describe(e)
        if store.disk_full(run_dir, e) and "No space left" not in reason:
            reason = f"OSError: No space left on device in {run_dir} ({reason})"
        if is_main:  # a save cut short (a full disk): its space, for the status and the log
            store.drop_incomplete_checkpoints(run_dir)
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)  # the whole traceback in the job's log (and the run's logs/)
        lines = text.rstrip().splitlines()
        fields.update(error="\n".join(lines[-ERROR_LINES:]), reason=reason)
    finally:
        # a signal after the last step: the run is final anyway
        PREEMPTION.attach(None)
        if trainer is not None and int(os.environ.get("WORLD_SIZE", "1")) == 1:
            try:
                engines.shut_down_vllm_engine(trainer)
            except Exception as e:
                monitor.warn(f"vLLM: shutting its engine down failed ({describe(e)})")
        fields.update(
            step=monitor.last_step,
            elapsed_s=monitor.elapsed(),
            # a failure before the loop began: its whole attempt was start-up
            startup_s=monitor.startup_s + (time.time() - started if monitor.trained_from is None else 0.0),
            trained_from=monitor.trained_from and monitor.trained_from - base_elapsed,
        )
        if wandb_run is not None:
            try:  # on a preemption wandb's service process is gone: its teardown raises
                wandb_run.finish()
            except Exception as e:
                monitor.warn(f"W&B: finishing the run failed ({describe(e)}); metrics.jsonl is complete")
    fields["finished_at"] = time.time()
    fields["warnings"] = monitor.warnings
    if is_main:
        return store.write_status(run_dir, state, **fields)
    return {**status, **fields, "state": state}


def _use_allocated_cpus(config: RunConfig) -> None:
    """On CPU, use as many threads as the job was given (``model.resources.cpus_per_task``)."""
    environment.use_cpu_threads(config.model.resources.cpus_per_task)


def _finish_saved_end(
    run_dir: Path, checkpoint: Path, status: dict[str, Any], fields: dict[str, Any], is_main: bool
) -> dict[str, Any]:
    """A run trained to its last step and saved there whose end was not recorded (its job stopped right after
    that save: a preemption, a kill): it is final, as that checkpoint's marker says (done when it has none).
    Resuming would train a step past ``train.steps`` (transformers' loop trains one before it checks)."""
    marker = checkpoint / store.FINAL_MARKER
    try:
        end = store.read_json(marker) if marker.exists() else {}
    except (ValueError, store.UnreadableFile):
        end = {}
    step = store.checkpoint_step(checkpoint)
    state = "diverged" if end.get("state") == "diverged" else "done"
    fields.update(final_checkpoint=checkpoint.name, finished_at=time.time(), reason=end.get("reason"))
    if state == "diverged":
        fields["diverged_step"] = step
    if not is_main:
        return {**status, **fields, "state": state}
    if not end:
        store.write_json(marker, {"state": state, "step": step, "reason": None})
    return store.write_status(run_dir, state, **fields)


def _save_final(trainer: KLGRPOTrainer, state: str, reason: str | None, is_main: bool) -> str | None:
    """Save the trainer's state where the run ended (unless that step is saved already) and mark it as the
    run's final checkpoint; its name, None when no step was trained. Every rank calls it (a save is collective
    under FSDP)."""
    step = trainer.state.global_step
    if step == 0:
        return None
    folder = Path(trainer.args.output_dir) / f"checkpoint-{step}"
    if not (folder / store.TRAINER_STATE).exists():
        trainer._save_checkpoint(trainer.model, trial=None)
    trainer.save_consolidated(folder)  # sharded (FSDP): the final weights also whole, for eval
    if is_main:
        store.write_json(folder / store.FINAL_MARKER, {"state": state, "step": step, "reason": reason})
    return folder.name


def _is_non_finite_sampling(error: RuntimeError) -> bool:
    """torch.multinomial's complaint when the policy's probabilities are nan/inf (non-finite weights)."""
    return "probability tensor contains" in str(error)


def _exit_in_flight(error: BaseException) -> SystemExit | None:
    """The SystemExit that ``error`` was raised while handling, if any (submitit exits after requeueing a
    preempted job; cleanup code that then fails must not make the preemption a failure)."""
    seen: set[int] = set()
    context = error.__context__
    while context is not None and id(context) not in seen:
        if isinstance(context, SystemExit):
            return context
        seen.add(id(context))
        context = context.__context__
    return None
