"""A preempted training job saves at the end of the step in progress, on every rank, then requeues.

``PREEMPTION`` (this process's ``Preemption``) knows the trainer training here; the submission layer's signal
handler hands it submitit's checkpoint-and-requeue (``defer_to_step_end``), the trainer's callback
(``Preemption.callback``) saves a checkpoint on every rank at the end of the step and runs it there.
``save_on_preemption``: submitit's own checkpoint hook, a save where no deferral happened. Under FSDP the
save is sharded (each rank writes its own shard, ``KLGRPOTrainer``), and the requeued job resumes from it.
Why and the whole path (signal, save, requeue, resume): docs/DESIGN.md (Preemption).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import store

if TYPE_CHECKING:
    from klsweep.monitor import RunMonitor
    from klsweep.trainer import KLGRPOTrainer


class Preemption:
    """The trainer training in this process, its monitor, and a preemption handler waiting for the step end."""

    def __init__(self) -> None:
        self.trainer: KLGRPOTrainer | None = None
        self.monitor: RunMonitor | None = None
        self.handler: Callable[[], Any] | None = None

    def attach(self, trainer: KLGRPOTrainer | None, monitor: RunMonitor | None = None) -> None:
        """The trainer (and its monitor) now training here; None when training ended (a pending handler is
        dropped: the run is final anyway)."""
        self.trainer, self.monitor = trainer, monitor
        if trainer is None:
            self.handler = None

    def defer(self, handler: Callable[[], Any]) -> bool:
        """Run ``handler`` at the end of the step in progress, after every rank saved; False when no trainer
        is training here (run it now)."""
        if self.trainer is None:
            return False
        self.handler = handler
        return True

    def save_now(self) -> None:
        """Save the trainer's checkpoint now, when that is safe: one process (one rank alone cannot save a
        checkpoint of many), a step trained and its metrics row written (else the resume redoes the step), not
        saved already."""
        trainer = self.trainer
        if trainer is None or trainer.state.global_step == 0 or trainer.accelerator.num_processes > 1:
            return
        if self.monitor is not None and self.monitor.last_step < trainer.state.global_step:
            return  # this step's metrics row is not written yet: the resume redoes it from the last checkpoint
        folder = Path(trainer.args.output_dir) / f"checkpoint-{trainer.state.global_step}"
        if (folder / store.TRAINER_STATE).exists():
            return  # this step is saved already
        trainer._save_checkpoint(trainer.model, trial=None)

    def callback(self, trainer: KLGRPOTrainer) -> Any:
        """A TrainerCallback: at the end of a step where any rank holds a deferred handler, every rank saves,
        then the handler runs (rank 0: submitit requeues and exits; the others train on until the requeue
        stops the job, as submitit has them do)."""
        from transformers import TrainerCallback

        preemption = self

        class _Callback(TrainerCallback):
            saving = False

            def on_step_end(self, args, state, control, **kwargs):
                if (
                    state.global_step >= state.max_steps
                ):  # the last step: the run ends and saves now, no requeue
                    return control
                if _any_rank(preemption.handler is not None, trainer):  # one collective a step: all agree
                    control.should_save = self.saving = True
                return control

            def on_save(self, args, state, control, **kwargs):
                if not self.saving:
                    return
                self.saving = False
                trainer.accelerator.wait_for_everyone()  # every rank's checkpoint files are written
                handler, preemption.handler = preemption.handler, None
                if handler is not None:
                    handler()

        return _Callback()


PREEMPTION = Preemption()  # this process's


def defer_to_step_end(handler: Callable[[], Any]) -> bool:
    """``PREEMPTION.defer``: the submission layer's signal handler calls it in every task."""
    return PREEMPTION.defer(handler)


def save_on_preemption() -> None:
    """``PREEMPTION.save_now``: submitit's checkpoint hook (a no-op after the step-end save)."""
    PREEMPTION.save_now()


def _any_rank(flag: bool, trainer: KLGRPOTrainer) -> bool:
    """Whether ``flag`` holds on any process of the run."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    value = torch.tensor([int(flag)], device=trainer.accelerator.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
