"""One training run end to end in its run folder: ``config.yaml`` -> train -> metrics, checkpoints, status.

``train_run(run_dir)`` is what every training job calls (``klsweep train``, the launcher's submitit jobs):

- reads ``run_dir/config.yaml`` (a complete RunConfig), seeds everything from ``config.seed``;
- writes ``status.json``: ``running`` (with ``step`` after every step), then ``done``, ``failed`` (the last
  lines of the traceback in ``error``) or ``diverged`` (``diverged_step`` and ``reason``);
- appends one row per optimiser step to ``metrics.jsonl`` (keys: ``ROW_KEYS`` plus every other float TRL
  logs; a non-finite value is written as null);
- saves Hugging Face checkpoints (model, tokenizer, trainer state, optimizer, RNG, the trainer's lag buffer)
  under ``run_dir/checkpoints/checkpoint-<step>`` every ``train.save_steps`` and at the end;
- mirrors the metrics to W&B (``config.wandb``; the metrics file stays the source of truth).

Re-running it on a folder resumes from the last complete checkpoint: metrics rows past that checkpoint's step
are dropped first, so no step is written twice. A folder already ``done`` or ``diverged`` is left as it is
(its status is returned).

Divergence is a result, not a crash (``train_run`` returns normally), at the first step where either

- the loss or the gradient norm is not finite (a model whose weights became non-finite, which makes
  sampling fail, counts too), or
- the task reward collapses: with ``m_t`` the mean task reward of the last ``train.collapse_window`` steps
  (defined once that many steps exist), and ``peak`` the largest ``m_t`` so far, the run collapses when
  ``peak >= COLLAPSE_MIN_PEAK`` and ``m_t < train.collapse_fraction * peak``.

Distributed: with ``WORLD_SIZE > 1`` in the environment (the launcher sets RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR/PORT from Slurm) transformers/accelerate train data-parallel (``gloo`` on CPU); the prompts of a
step are split over the ranks; only rank 0 writes the status, the metrics and W&B.

GPU: the model in bf16 (``model.dtype: auto``) with bf16 autocast; vLLM generation (TRL's colocate mode) when
``train.use_vllm`` and vllm is installed. On a CPU vllm is never imported.
"""

from __future__ import annotations

import math
import os
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import store
from klsweep.errors import Problem, UserError

if TYPE_CHECKING:
    from klsweep.config import RunConfig
    from klsweep.trainer import KLGRPOTrainer

COLLAPSE_MIN_PEAK = 0.1  # a collapse needs a windowed task reward at least this high to fall from
ERROR_LINES = 30  # traceback lines kept in status.json

# metrics.jsonl key <- TRL/Trainer log key
ROW_KEYS: dict[str, str] = {
    "reward_mean": "task_reward/mean",
    "reward_std": "task_reward/std",
    "kl_k1": "kl/k1",
    "kl_k3": "kl/k3",
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


def load_run_config(run_dir: str | Path) -> RunConfig:
    """The RunConfig of a run folder (``config.yaml`` over the schema's defaults)."""
    from omegaconf import OmegaConf

    from klsweep.config import RunConfig

    path = Path(run_dir) / store.CONFIG_FILE
    if not path.is_file():
        raise UserError(Problem(str(path), "no run config", "write it with `klsweep train` or `klsweep run`"))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.load(path))
    except Exception as e:  # omegaconf's validation errors
        raise UserError(Problem(str(path), str(e).splitlines()[0])) from e
    return OmegaConf.to_object(merged)


def write_run_config(run_dir: str | Path, config: dict[str, Any]) -> Path:
    """Write a resolved RunConfig (as a dict) to ``run_dir/config.yaml``. A folder that already holds a different
    config is an error (its checkpoints belong to that one)."""
    from omegaconf import OmegaConf

    path = Path(run_dir) / store.CONFIG_FILE
    if path.is_file():
        existing = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        if existing != config:
            raise UserError(
                Problem(
                    str(path),
                    "the run folder holds a different config",
                    "another --run-dir, or the same config",
                )
            )
        return path
    store.atomic_write_text(path, OmegaConf.to_yaml(OmegaConf.create(config)))
    return path


def train_run(run_dir: str | Path) -> dict[str, Any]:
    """Train the run in ``run_dir`` (resuming from its last checkpoint) and return its final status."""
    global _live_trainer
    run_dir = Path(run_dir)
    is_main = int(os.environ.get("RANK", "0")) == 0
    status = store.read_status(run_dir)
    if status["state"] in ("done", "diverged"):
        return status
    config = load_run_config(run_dir)

    # Resume from the newest checkpoint whose trainer state was written (the last file a save writes).
    found = [c for c in store.checkpoints(run_dir) if (c / TRAINER_STATE).exists()]
    resume = found[-1] if found else None
    resume_step = store.checkpoint_step(resume) if resume else 0
    kept = [row for row in store.read_metrics(run_dir) if row.get("step", 0) <= resume_step]
    base_elapsed = kept[-1]["elapsed_s"] if kept else 0.0
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
    }
    if is_main:
        store.atomic_write_text(run_dir / store.METRICS_FILE, "".join(_json_line(row) for row in kept))
        status = store.write_status(run_dir, "running", **fields)

    _use_allocated_cpus(config)
    monitor = _RunMonitor(run_dir, config, kept, base_elapsed, started, is_main)
    wandb_run = None
    try:
        if is_main:
            wandb_run = _init_wandb(config, run_dir)
        trainer = build_trainer(config, run_dir, report_to_wandb=wandb_run is not None)
        trainer.add_callback(monitor.callback())
        _live_trainer = trainer
        try:
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        except RuntimeError as e:
            if not _is_non_finite_sampling(e):
                raise
            monitor.diverged = (trainer.state.global_step + 1, f"non-finite model outputs in sampling: {e}")
        state = "diverged" if monitor.diverged else "done"
        if monitor.diverged:
            fields.update(diverged_step=monitor.diverged[0], reason=monitor.diverged[1])
    except Exception:
        state = "failed"
        lines = traceback.format_exc().rstrip().splitlines()
        fields.update(error="\n".join(lines[-ERROR_LINES:]), reason=lines[-1] if lines else "failed")
    finally:
        _live_trainer = None
        fields.update(step=monitor.last_step, elapsed_s=monitor.elapsed())
        if wandb_run is not None:
            wandb_run.finish()
    fields["finished_at"] = time.time()
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


def save_on_preemption() -> None:
    """Save a checkpoint of the trainer training in this process, if any (before a requeue)."""
    trainer = _live_trainer
    if trainer is None or trainer.state.global_step == 0:
        return
    folder = Path(trainer.args.output_dir) / f"checkpoint-{trainer.state.global_step}"
    if (folder / TRAINER_STATE).exists():
        return  # this step is saved already
    trainer._save_checkpoint(trainer.model, trial=None)


def build_trainer(config: RunConfig, run_dir: str | Path, report_to_wandb: bool = False) -> KLGRPOTrainer:
    """The KLGRPOTrainer of ``config``, writing checkpoints under ``run_dir/checkpoints``."""
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
    from trl import GRPOConfig

    from klsweep import tasks, tinymodel
    from klsweep.kl import KLConfig
    from klsweep.trainer import KLGRPOTrainer

    train = config.train
    world = int(os.environ.get("WORLD_SIZE", "1"))
    completions = train.prompts_per_step * train.group_size
    if completions % world:
        raise UserError(
            Problem(
                "train.prompts_per_step",
                f"{completions} completions a step do not split over {world} processes",
                "prompts_per_step x group_size divisible by the number of processes",
            )
        )
    kl = KLConfig(**vars(config.kl))
    gpu = torch.cuda.is_available()
    dtypes = {
        "auto": torch.bfloat16 if gpu else torch.float32,
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
    }
    if config.model.dtype not in dtypes:
        raise UserError(Problem("model.dtype", f"{config.model.dtype!r} is not valid", ", ".join(dtypes)))
    use_vllm = train.use_vllm and gpu and importlib.util.find_spec("vllm") is not None

    set_seed(config.seed)
    path = tinymodel.resolve_model_path(config.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtypes[config.model.dtype])
    tokenizer = AutoTokenizer.from_pretrained(path)
    args = GRPOConfig(
        output_dir=str(Path(run_dir) / store.CHECKPOINTS_DIR),
        max_steps=train.steps,
        learning_rate=train.learning_rate,
        warmup_steps=train.warmup_steps,
        max_grad_norm=train.max_grad_norm,
        per_device_train_batch_size=completions // world,
        gradient_accumulation_steps=1,
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
        bf16=gpu,
        use_cpu=not gpu,
        activation_checkpointing=gpu,  # memory for large models on GPU; off on CPU
        ddp_backend="gloo" if world > 1 and not gpu else None,
        ddp_find_unused_parameters=False,
        use_vllm=use_vllm,
        vllm_mode="colocate",
        report_to=["wandb"] if report_to_wandb else [],
        run_name=Path(run_dir).name,
        disable_tqdm=True,
        log_completions=False,
    )
    return KLGRPOTrainer(
        model,
        reward_funcs=tasks.reward_function(config.task),
        args=args,
        train_dataset=tasks.load_train_dataset(config.task, config.seed),
        processing_class=tokenizer,
        kl=kl,
        lag=config.offpolicy.lag,
    )


def reward_collapse(
    rewards: list[float | None], window: int, fraction: float, min_peak: float = COLLAPSE_MIN_PEAK
) -> str | None:
    """Why the task reward has collapsed at the last step of ``rewards`` (one per step), or None. See the module
    docstring; steps with no reward (None or nan) are skipped."""
    values = [r for r in rewards if r is not None and math.isfinite(r)]
    if window < 1 or len(values) < window:
        return None
    means = [sum(values[i - window + 1 : i + 1]) / window for i in range(window - 1, len(values))]
    peak, now = max(means), means[-1]
    if peak >= min_peak and now < fraction * peak:
        return f"reward collapse: mean task reward over the last {window} steps {now:.4g} < {fraction} x peak {peak:.4g}"
    return None


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
    ) -> None:
        self.run_dir = run_dir
        self.config = config
        self.rewards = [row.get("reward_mean") for row in kept]
        self.last_step = kept[-1]["step"] if kept else 0
        self.base_elapsed = base_elapsed
        self.started = started
        self.is_main = is_main
        self.diverged: tuple[int, str] | None = None

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
        for key, value in logs.items():
            if (
                key not in _ROW_SOURCES
                and key not in row
                and isinstance(value, int | float)
                and not isinstance(value, bool)
            ):
                row[key] = _number(value)
        self.last_step = step
        self.rewards.append(row["reward_mean"])

        reason = None
        for key in ("loss", "grad_norm"):
            value = logs.get(key)
            if isinstance(value, int | float) and not math.isfinite(value):
                reason = f"non-finite {key} ({value})"
                break
        if reason is None:
            reason = reward_collapse(
                self.rewards, self.config.train.collapse_window, self.config.train.collapse_fraction
            )
        if reason is not None:
            self.diverged = (step, reason)
            control.should_training_stop = True
            control.should_save = False
        if self.is_main:
            store.append_jsonl(self.run_dir / store.METRICS_FILE, row)
            store.write_status(self.run_dir, "running", step=step, elapsed_s=row["elapsed_s"])
        return control


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _json_line(row: dict[str, Any]) -> str:
    import json

    return json.dumps(row) + "\n"


def _is_non_finite_sampling(error: RuntimeError) -> bool:
    """torch.multinomial's complaint when the policy's probabilities are nan/inf (non-finite weights)."""
    return "probability tensor contains" in str(error)


def _wandb_mode(mode: str) -> str:
    """``auto``: online when W&B is configured on this machine (WANDB_API_KEY, or a netrc entry), else offline."""
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    import netrc

    try:
        return "online" if netrc.netrc().authenticators("api.wandb.ai") else "offline"
    except (OSError, netrc.NetrcParseError):
        return "offline"


def wandb_tags(config: RunConfig) -> list[str]:
    """The configuration axes of a run, as W&B tags."""
    return [
        f"estimator={config.kl.estimator}",
        f"placement={config.kl.placement}",
        f"level={config.kl.level}",
        f"beta={config.kl.beta:g}",
        f"lag={config.offpolicy.lag}",
        f"seed={config.seed}",
        f"model={config.model.name}",
    ]


def _init_wandb(config: RunConfig, run_dir: Path):
    """A W&B run for this run folder (group = sweep name, tags = axes, name and id from ``klsweep.tracking``,
    files under ``run_dir/wandb/``), or None."""
    mode = _wandb_mode(config.wandb.mode)
    if mode == "disabled":
        return None
    import dataclasses

    import wandb

    from klsweep import tracking

    resolved = dataclasses.asdict(config)
    return wandb.init(
        project=config.wandb.project,
        entity=config.wandb.entity,
        group=config.name,
        name=tracking.wandb_name(resolved, run_dir),
        id=tracking.wandb_id(config.name, run_dir),
        resume="allow",
        tags=wandb_tags(config),
        config=resolved,
        dir=str(run_dir),  # W&B writes <run_dir>/wandb/offline-run-* (or run-*)
        mode=mode,
    )
