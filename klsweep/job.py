"""One training run end to end in its run folder: ``config.yaml`` -> train -> metrics, checkpoints, status.

``train_run(run_dir)`` is what every training job calls (``klsweep train``, the submitit jobs of ``klsweep.submit``):

- reads ``run_dir/config.yaml`` (a complete RunConfig), seeds everything from ``config.seed``;
- records the environment it trains in (``env.json``, ``environment.record``) at every start;
- writes ``status.json``: ``running`` (with ``step`` after every step), then ``done``, ``failed`` (the
  exception's type and message in ``reason``, ``errors.describe``; the last lines of the traceback in
  ``error``; the whole traceback on stderr) or ``diverged`` (``diverged_step`` and ``reason``);
- appends one row per optimiser step to ``metrics.jsonl`` (keys: ``ROW_KEYS`` plus every other float TRL
  logs; a non-finite value is written as null);
- saves Hugging Face checkpoints (model, tokenizer, trainer state, optimizer, RNG, the trainer's lag buffer)
  under ``run_dir/checkpoints/checkpoint-<step>`` every ``train.save_steps`` and at the end, keeping the newest
  ``train.keep_checkpoints``; the last one, where the run ended (done or diverged), is marked
  (``store.FINAL_MARKER`` in it, ``final_checkpoint`` in the status), so eval scores what the run ended as;
- drops the training prompts longer than ``train.max_prompt_length`` tokens (``prompts_too_long`` in every
  metrics row says how many);
- mirrors the metrics to W&B (``config.wandb``; the metrics file stays the source of truth). W&B never fails
  a run: when it cannot start online (no network, a bad key: ``wandb.init_timeout_s``) the run mirrors
  offline instead, and when it breaks during training (its service process killed by a preemption's SIGTERM)
  the mirroring stops; either way with a line in ``status.json``'s ``warnings`` and on stderr.

A preemption (submitit's checkpoint-and-requeue) is not a failure: the run keeps its ``running`` status, and an
error raised while the job exits (W&B's teardown) does not change that. Re-running it on a folder resumes from
the last complete checkpoint: metrics.jsonl is cut just before its first
row past that checkpoint's step (``store.cut_metrics``), so no step is written twice and no row before it is
lost (an unreadable line is skipped and counted in ``warnings``). A folder already ``done`` or ``diverged`` is
left as it is (its status is returned).

Divergence is a result, not a crash (``train_run`` returns normally), at the first step where either

- the loss or the gradient norm is not finite (a model whose weights became non-finite, which makes
  sampling fail, counts too), or
- the task reward collapses: ``klsweep.collapse`` (the rule the report applies too), with the run's
  ``train.collapse_window`` and ``train.collapse_fraction``.

A diverged run saves its state at the step it stopped (``checkpoint-<step>``, marked ``diverged``).

Distributed: with ``WORLD_SIZE > 1`` in the environment (``klsweep.submit`` sets RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR/PORT from Slurm) transformers/accelerate train data-parallel (DDP, or FSDP on GPUs; ``gloo`` on
CPU); the prompts of a
step are split over the ranks; only rank 0 writes the status, the metrics and W&B; every rank writes its own
lag buffers into each checkpoint.

Preemption: a job's preemption signal is deferred to the end of the step in progress (``defer_to_step_end``,
called by the submission layer's signal handler in every task); there every rank saves the checkpoint together (so a
resume finds every rank's buffers, and FSDP's collective save can run), then the handler requeues the job.

Precision and sharding (``model.dtype``, ``train.sharding``): see ``klsweep.layout`` (float32 master weights of
the policy, compute under autocast in ``model.dtype``, the reference in the compute dtype; DDP or FSDP). GPU:
vLLM generation (TRL's colocate mode) when ``train.use_vllm``; without a GPU or without vllm the run fails with
why (never HF generate in its place: ``klsweep.engines``). With it false, vllm is never imported.
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import engines, environment, store, tracking
from klsweep.collapse import find_collapse
from klsweep.config import load_run
from klsweep.errors import Problem, UserError, describe

if TYPE_CHECKING:
    from klsweep.config import RunConfig
    from klsweep.trainer import KLGRPOTrainer

ERROR_LINES = 30  # traceback lines kept in status.json
MAX_WARNINGS = 20  # warnings of earlier attempts kept in status.json

# metrics.jsonl key <- TRL/Trainer log key
ROW_KEYS: dict[str, str] = {
    "reward_mean": "task_reward/mean",
    "reward_std": "task_reward/std",
    "kl_k1": "kl/k1",
    "kl_k3": "kl/k3",
    "kl_forward": "kl/forward",
    "entropy": "entropy",
    "completion_length": "completion_length",
    "clip_ratio": "clip_ratio/region_mean",
    "grad_norm": "grad_norm",
    "learning_rate": "learning_rate",
    "step_time": "step_time",
    "loss": "loss",
    "kl_penalty": "kl/penalty",
}

_ROW_SOURCES = frozenset(ROW_KEYS.values())  # log keys already mapped to a row key

_live_trainer: KLGRPOTrainer | None = None  # the trainer training in this process, for save_on_preemption
_deferred_signal: Callable[[], Any] | None = None  # a preemption handler waiting for the end of the step
_live_monitor: _RunMonitor | None = None  # its monitor: the last step whose metrics row was written


def train_run(run_dir: str | Path) -> dict[str, Any]:
    """Train the run in ``run_dir`` (resuming from its last checkpoint) and return its final status."""
    global _live_trainer, _live_monitor, _deferred_signal
    run_dir = Path(run_dir)
    is_main = int(os.environ.get("RANK", "0")) == 0
    status = store.read_status(run_dir)
    if status["state"] in ("done", "diverged"):
        return status
    config = load_run(run_dir)

    # Resume from the newest checkpoint whose trainer state was written (the last file a save writes).
    found = [c for c in store.checkpoints(run_dir) if (c / TRAINER_STATE).exists()]
    resume = found[-1] if found else None
    resume_step = store.checkpoint_step(resume) if resume else 0
    warnings: list[str] = list(status.get("warnings") or [])[-MAX_WARNINGS:]  # earlier attempts' too
    if is_main:
        kept, bad = store.cut_metrics(run_dir, resume_step)
        if bad:
            _warn(
                warnings,
                f"{run_dir / store.METRICS_FILE}: {len(bad)} unreadable line(s) skipped "
                f"(line {', '.join(map(str, bad[:5]))}{', ...' if len(bad) > 5 else ''})",
            )
    else:
        kept = [row for row in store.read_metrics(run_dir) if row.get("step", 0) <= resume_step]
    base_elapsed = kept[-1].get("elapsed_s", 0.0) if kept else 0.0
    started = time.time()
    fields: dict[str, Any] = {
        "step": resume_step,
        "total_steps": config.train.steps,
        "reason": None,
        "error": None,
        "diverged_step": None,
        "started_at": status.get("started_at") or started,
        "finished_at": None,
        "elapsed_s": base_elapsed,
        "warnings": warnings,
    }
    if is_main:
        status = store.write_status(run_dir, "running", **fields)

    _use_allocated_cpus(config)
    if is_main:
        environment.record(run_dir)  # after the thread count is set: what this start trains with
    monitor = _RunMonitor(run_dir, config, kept, base_elapsed, started, is_main, warnings)
    wandb_run = None
    try:
        if is_main:
            wandb_run = tracking.open_training_run(config, run_dir, monitor.warn)
        # W&B through a guarded callback only: with report_to=["wandb"], TRL also calls wandb.log directly
        # (its profiling timings), unguarded
        trainer = build_trainer(config, run_dir)
        monitor.constants["prompts_too_long"] = float(trainer.prompts_too_long)
        trainer.add_callback(monitor.callback())
        trainer.add_callback(_preemption_callback(trainer))
        if wandb_run is not None:
            trainer.add_callback(tracking.guarded_callback(monitor.warn))
        _live_trainer, _live_monitor = trainer, monitor
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
    except Exception as e:
        exiting = _exit_in_flight(e)
        if exiting is not None:  # a preemption's exit, which a failing cleanup (W&B's) turned into an error
            raise exiting from None
        state = "failed"
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)  # the whole traceback in the job's log (and the run's logs/)
        lines = text.rstrip().splitlines()
        fields.update(error="\n".join(lines[-ERROR_LINES:]), reason=describe(e))
    finally:
        # a signal after the last step: the run is final anyway
        _live_trainer = _live_monitor = _deferred_signal = None
        fields.update(step=monitor.last_step, elapsed_s=monitor.elapsed())
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
    """On CPU, use as many threads as the job was given (``model.resources.cpus_per_task``): torch's default
    (every core) oversubscribes the machine when several jobs share it, and is many times slower."""
    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, config.model.resources.cpus_per_task))


TRAINER_STATE = "trainer_state.json"  # transformers writes it last when it saves a checkpoint


def defer_to_step_end(handler: Callable[[], Any]) -> bool:
    """Defer a preemption signal's ``handler`` (submitit's: checkpoint, requeue, exit) to the end of the training
    step in progress in this process, where every rank saves a checkpoint, its own lag buffers included, before
    ``handler`` runs. False when no trainer is training here (run ``handler`` now)."""
    global _deferred_signal
    if _live_trainer is None:
        return False
    _deferred_signal = handler
    return True


def save_on_preemption() -> None:
    """Save a checkpoint of the trainer training in this process, if any (before a requeue). A no-op after the
    step-end save of ``defer_to_step_end``. Without it, only a one-process run is saved here: one rank alone
    cannot save a checkpoint of many (the others' lag buffers; FSDP's collective save would hang). Not when
    its last step's metrics row is not written yet (the signal came between an optimiser step and its log):
    resuming from such a checkpoint would lose that row, so the resume redoes the step from the checkpoint
    before."""
    trainer = _live_trainer
    if trainer is None or trainer.state.global_step == 0 or trainer.accelerator.num_processes > 1:
        return
    if _live_monitor is not None and _live_monitor.last_step < trainer.state.global_step:
        return  # this step's metrics row is not written yet: the resume redoes it from the last checkpoint
    folder = Path(trainer.args.output_dir) / f"checkpoint-{trainer.state.global_step}"
    if (folder / TRAINER_STATE).exists():
        return  # this step is saved already
    trainer._save_checkpoint(trainer.model, trial=None)


def _save_final(trainer: KLGRPOTrainer, state: str, reason: str | None, is_main: bool) -> str | None:
    """Save the trainer's state where the run ended (unless that step is saved already) and mark it as the
    run's final checkpoint; its name, None when no step was trained. Every rank calls it (a save is collective
    under FSDP)."""
    step = trainer.state.global_step
    if step == 0:
        return None
    folder = Path(trainer.args.output_dir) / f"checkpoint-{step}"
    if not (folder / TRAINER_STATE).exists():
        trainer._save_checkpoint(trainer.model, trial=None)
    if is_main:
        store.write_json(folder / store.FINAL_MARKER, {"state": state, "step": step, "reason": reason})
    return folder.name


def build_trainer(config: RunConfig, run_dir: str | Path, report_to_wandb: bool = False) -> KLGRPOTrainer:
    """The KLGRPOTrainer of ``config``, writing checkpoints under ``run_dir/checkpoints``."""
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
    from trl import GRPOConfig

    from klsweep import layout, tasks, tinymodel, trlargs
    from klsweep.kl import KLConfig
    from klsweep.planner import batch_shape
    from klsweep.trainer import KLGRPOTrainer

    train = config.train
    shape = batch_shape(vars(train), int(os.environ.get("WORLD_SIZE", "1")))
    world = shape.processes
    kl = KLConfig(**vars(config.kl))
    gpu = torch.cuda.is_available()
    lay = layout.layout(config.model.dtype, train.sharding, gpu)
    vllm_ready = gpu and importlib.util.find_spec("vllm") is not None
    if train.use_vllm and not vllm_ready:  # never HF generate in its place
        why = f"vllm cannot be imported in {sys.executable}" if gpu else "no GPU is visible to this process"
        raise UserError(
            Problem("train.use_vllm", f"true, but {why}", f"{engines.INSTALL} on a GPU machine, or false")
        )

    set_seed(config.seed)
    path = tinymodel.resolve_model_path(config.model)
    # Loaded in the compute dtype: the reference is this copy; KLGRPOTrainer upcasts the policy to float32.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=layout.torch_dtype(lay.compute))
    tokenizer = AutoTokenizer.from_pretrained(path)
    own = dict(  # every name is in trlargs.KLSWEEP_SETS (refused in train.trl)
        output_dir=str(Path(run_dir) / store.CHECKPOINTS_DIR),
        max_steps=train.steps,
        learning_rate=train.learning_rate,
        lr_scheduler_type=train.lr_scheduler_type,
        warmup_steps=train.warmup_ratio or train.warmup_steps,  # transformers: a float < 1 is a ratio
        max_grad_norm=train.max_grad_norm,
        per_device_train_batch_size=shape.per_device,  # completions per forward/backward (micro-batch)
        gradient_accumulation_steps=shape.accumulation,
        num_generations=train.group_size,
        max_completion_length=train.max_completion_length,
        temperature=train.temperature,
        loss_type=train.loss_type,
        epsilon=train.epsilon,
        scale_rewards=train.scale_rewards,
        beta=0.0,
        num_iterations=config.offpolicy.num_iterations,
        logging_steps=1,
        save_strategy="steps",
        save_steps=train.save_steps,
        save_total_limit=train.keep_checkpoints,
        seed=config.seed,
        data_seed=config.seed,
        **layout.training_arguments(lay, gpu, world),  # precision, sharding, devices
        ddp_find_unused_parameters=False,
        use_vllm=train.use_vllm,
        vllm_mode="colocate",
        vllm_max_model_length=train.max_prompt_length + train.max_completion_length,
        report_to=["wandb"] if report_to_wandb else [],
        run_name=Path(run_dir).name,
        disable_tqdm=True,
        log_completions=False,
    )
    args = GRPOConfig(**trlargs.merged(own, train.trl))  # train.trl last
    dataset = tasks.load_train_dataset(config.task, config.seed, chat_template=config.model.chat_template)
    dataset, too_long = tasks.drop_long_prompts(dataset, tokenizer, train.max_prompt_length)
    trainer = KLGRPOTrainer(
        model,
        reward_funcs=tasks.reward_function(config.task),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        kl=kl,
        lag=config.offpolicy.lag,
    )
    trainer.prompts_too_long = too_long  # read by train_run: a column of the metrics rows
    return trainer


# ---------------------------------------------------------------------------------------------------- internals


class _RunMonitor:
    """Writes one metrics row per step, keeps the status current, stops the run when it diverges (driven by
    the trainer's logs through ``callback()``)."""

    def __init__(
        self,
        run_dir: Path,
        config: RunConfig,
        kept: list[dict[str, Any]],
        base_elapsed: float,
        started: float,
        is_main: bool,
        warnings: list[str] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.config = config
        self.steps = [row.get("step", 0) for row in kept]
        self.rewards = [row.get("reward_mean") for row in kept]
        self.last_step = kept[-1]["step"] if kept else 0
        self.base_elapsed = base_elapsed
        self.started = started
        self.is_main = is_main
        self.diverged: tuple[int, str] | None = None
        self.constants: dict[str, float] = {}  # facts of the run repeated in every row
        self.warnings = warnings if warnings is not None else []

    def warn(self, text: str) -> None:
        """Record a warning: stderr (the job's log) and, on rank 0, status.json's ``warnings``."""
        _warn(self.warnings, text)
        if self.is_main and (self.run_dir / store.STATUS_FILE).exists():
            store.write_status(self.run_dir, store.read_status(self.run_dir)["state"], warnings=self.warnings)

    def elapsed(self) -> float:
        return self.base_elapsed + time.time() - self.started

    def callback(self):
        """A transformers TrainerCallback that feeds this monitor."""
        from transformers import TrainerCallback

        monitor = self

        class _Callback(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                return monitor.on_log(state, control, logs)

        return _Callback()

    def on_log(self, state, control, logs):
        if not logs or "loss" not in logs or "train_runtime" in logs or state.global_step <= self.last_step:
            return
        step = state.global_step
        row: dict[str, Any] = {"step": step, "time": time.time(), "elapsed_s": self.elapsed()}
        for key, source in ROW_KEYS.items():
            row[key] = _number(logs.get(source))
        row.update(self.constants)
        for key, value in logs.items():
            if (
                key not in _ROW_SOURCES
                and key not in row
                and isinstance(value, int | float)
                and not isinstance(value, bool)
            ):
                row[key] = _number(value)
        self.steps.append(step)
        self.rewards.append(row["reward_mean"])

        reason = None
        for key in ("loss", "grad_norm"):
            value = logs.get(key)
            if isinstance(value, int | float) and not math.isfinite(value):
                reason = f"non-finite {key} ({value})"
                break
        if reason is None:
            train = self.config.train
            collapse = find_collapse(self.steps, self.rewards, train.collapse_window, train.collapse_fraction)
            reason = collapse.reason if collapse is not None else None
        if reason is not None:
            self.diverged = (step, reason)
            control.should_training_stop = True
            control.should_save = True  # the state it diverged at: eval scores what the run ended as
        if self.is_main:
            store.append_jsonl(self.run_dir / store.METRICS_FILE, row)
        self.last_step = (
            step  # only now: a preemption save needs this step's row written (save_on_preemption)
        )
        if self.is_main:
            store.write_status(self.run_dir, "running", step=step, elapsed_s=row["elapsed_s"])
        return control


def _preemption_callback(trainer: KLGRPOTrainer):
    """A TrainerCallback that saves a checkpoint on every rank at the end of a step where any rank holds a
    deferred preemption signal (``defer_to_step_end``), then runs the signal's handler: on rank 0 submitit's
    checkpoint-and-requeue, which exits; on the other ranks submitit does nothing, and they train on until the
    requeue stops the job, as submitit has them do."""
    from transformers import TrainerCallback

    class _Callback(TrainerCallback):
        saving = False

        def on_step_end(self, args, state, control, **kwargs):
            if _any_rank(_deferred_signal is not None, trainer):  # one collective a step: all ranks agree
                control.should_save = self.saving = True
            return control

        def on_save(self, args, state, control, **kwargs):
            global _deferred_signal
            if not self.saving:
                return
            self.saving = False
            trainer.accelerator.wait_for_everyone()  # every rank's checkpoint files are written
            handler, _deferred_signal = _deferred_signal, None
            if handler is not None:
                handler()

    return _Callback()


def _any_rank(flag: bool, trainer: KLGRPOTrainer) -> bool:
    """Whether ``flag`` holds on any process of the run."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    value = torch.tensor([int(flag)], device=trainer.accelerator.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _warn(warnings: list[str], text: str) -> None:
    warnings.append(text)
    print(f"klsweep warning: {text}", file=sys.stderr, flush=True)


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
