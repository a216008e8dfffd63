"""One training run's monitor: a metrics row per optimiser step, the status kept current, divergence found.

``RunMonitor.callback()`` feeds it from the trainer's logs: each log of a step becomes a ``metrics.jsonl`` row
(``ROW_KEYS`` plus every other number TRL logs; non-finite as null), ``status.json`` gets the step, and a
non-finite loss or gradient norm, or a collapse of the task reward (``klsweep.collapse``), stops the run as
diverged. The file contracts: docs/DESIGN.md (Results store).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import store
from klsweep.collapse import Collapse, CollapseScan, Rule
from klsweep.printable import visible_lines

if TYPE_CHECKING:
    from klsweep.config import RunConfig

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


def record_warning(warnings: list[str], text: str) -> None:
    """A run's warning: in ``warnings`` (status.json's) and on stderr (the job's log)."""
    warnings.append(text)
    print(visible_lines(f"klsweep warning: {text}"), file=sys.stderr, flush=True)


class RunMonitor:
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
        on_row: Callable[[dict[str, Any]], None] | None = None,
        startup_s: float = 0.0,
    ) -> None:
        self.run_dir = run_dir
        self.on_row = on_row  # each step's metrics row, once written (``klsweep train`` prints it)
        self.config = config
        # the rule over the rows so far, one step at a time
        self.collapse = CollapseScan(Rule.of(config.train))
        self.collapsed: Collapse | None = None  # the first collapse among them
        for row in kept:
            found = self.collapse.add(row.get("step", 0), row.get("reward_mean"), row.get("reward_std"))
            self.collapsed = self.collapsed or found
        self.last_step = kept[-1]["step"] if kept else 0
        self.base_elapsed = base_elapsed  # the earlier attempts' training time
        self.started = started  # this attempt's start
        self.trained_from: float | None = None  # when its training loop began (``begin``)
        self.startup_s = startup_s  # the earlier attempts' start-up
        self.is_main = is_main
        self.diverged: tuple[int, str] | None = None
        self.constants: dict[str, float] = {}  # facts of the run repeated in every row
        self.warnings = warnings if warnings is not None else []

    def warn(self, text: str) -> None:
        """Record a warning: stderr (the job's log) and, on rank 0, status.json's ``warnings``."""
        record_warning(self.warnings, text)
        if self.is_main and (self.run_dir / store.STATUS_FILE).exists():
            store.write_status(self.run_dir, store.read_status(self.run_dir)["state"], warnings=self.warnings)

    def elapsed(self) -> float:
        """The run's own time: the seconds its training loop has run, in this attempt and the ones before it;
        the job's start-up (imports, the model and trainer built, W&B opened) is ``startup_s`` apart."""
        return self.base_elapsed + (time.time() - self.trained_from if self.trained_from is not None else 0.0)

    def begin(self) -> None:
        """The training loop starts (the trainer's ``on_train_begin``): the run's elapsed time counts from here;
        the time since the attempt started is its start-up, added to the earlier attempts' in status.json."""
        now = time.time()
        self.trained_from = now
        self.startup_s += now - self.started
        if self.is_main:
            store.write_status(
                self.run_dir, "running", startup_s=self.startup_s, trained_from=now - self.base_elapsed
            )

    def callback(self):
        """A transformers TrainerCallback that feeds this monitor."""
        from transformers import TrainerCallback

        monitor = self

        class _Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                monitor.begin()

            def on_log(self, args, state, control, logs=None, **kwargs):
                return monitor.on_log(state, control, logs)

        return _Callback()

    def on_log(self, state, control, logs):
        if not logs or "loss" not in logs or "train_runtime" in logs or state.global_step <= self.last_step:
            return
        if self.is_main:  # another trainer took the run (store.check_training): stop before writing this step
            store.check_training(self.run_dir)
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
        found = self.collapse.add(step, row["reward_mean"], row["reward_std"])
        self.collapsed = self.collapsed or found

        reason = None
        for key in ("loss", "grad_norm"):
            value = logs.get(key)
            if isinstance(value, int | float) and not math.isfinite(value):
                reason = f"non-finite {key} ({value})"
                break
        if reason is None and self.collapsed is not None:
            reason = self.collapsed.reason
        if reason is not None:
            self.diverged = (step, reason)
            control.should_training_stop = True
            control.should_save = True  # the state it diverged at: eval scores what the run ended as
        if self.is_main:
            store.append_jsonl(self.run_dir / store.METRICS_FILE, row)
            if self.on_row is not None:
                self.on_row(row)
        self.last_step = step  # only now: a preemption save needs this step's row written (preemption.py)
        if self.is_main:
            store.write_status(self.run_dir, "running", step=step, elapsed_s=row["elapsed_s"])
        return control


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
