"""The trainer of one run: ``build_trainer(config, run_dir)`` -> a ``KLGRPOTrainer`` ready to train.

From a RunConfig: the model and tokenizer (``tinymodel.resolve_model_path``; loaded in the compute dtype,
``layout``), TRL's ``GRPOConfig`` (klsweep's own settings, then ``train.trl``: ``trlargs``), the batch shape
over the processes (``planner.batch_shape``), the training prompts (``tasks``; those longer than
``train.max_prompt_length`` dropped and counted). It sits between the job and the trainer so that the trainer
module stays TRL's class alone. Precision, sharding and vLLM: docs/DESIGN.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep import engines, fastgen
from klsweep.errors import NotLoaded, Problem, UserError, not_loaded, parameters_missing

if TYPE_CHECKING:
    from klsweep.config import RunConfig
    from klsweep.trainer import KLGRPOTrainer


def build_trainer(config: RunConfig, run_dir: str | Path) -> KLGRPOTrainer:
    """The KLGRPOTrainer of ``config``, writing checkpoints under ``run_dir/checkpoints``."""
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
    from trl import GRPOConfig

    from klsweep import layout, store, tasks, tinymodel, trlargs
    from klsweep.kl import KLConfig
    from klsweep.planner import batch_shape
    from klsweep.trainer import KLGRPOTrainer

    train = config.train
    ignored = trlargs.schedule_problems(
        vars(train)
    )  # as klsweep plan refuses it: a run folder trained directly
    if ignored:
        raise UserError([Problem(*p) for p in ignored])
    shape = batch_shape(vars(train), int(os.environ.get("WORLD_SIZE", "1")))
    world = shape.processes
    kl = KLConfig(**vars(config.kl))
    gpu = torch.cuda.is_available()
    lay = layout.layout(config.model.dtype, train.sharding, gpu)
    if lay.sharding == "fsdp" and not gpu:  # only where the tests allow it (layout.TEST_FSDP_ON_CPU)
        layout.shard_cpu_processes()
    if train.use_vllm:  # never HF generate in its place; without a GPU, vLLM's CPU build (engines.py)
        refused = [] if gpu else engines.cpu_refusals(train.trl)
        if importlib.util.find_spec("vllm") is None:
            where = (
                ""
                if gpu
                else " (without a GPU: vLLM's CPU build, ./dev.sh vllm-test in a clone of the repository)"
            )
            why = f"true, but vllm cannot be imported in {sys.executable}"
            refused.insert(0, Problem("train.use_vllm", why, f"{engines.install_command()}{where}, or false"))
        if refused:
            raise UserError(refused)
        if not gpu:
            engines.keep_cpu_weights_loadable()

    set_seed(config.seed)
    path = tinymodel.resolve_model_path(config.model)
    # Loaded in the compute dtype; KLGRPOTrainer upcasts the policy to float32. The reference is loaded again,
    # in the compute dtype, straight onto this process's GPU: no host copy of it (a deepcopy of the policy would
    # hold one per process: planner, host memory).
    pin = {"revision": config.model.revision} if config.model.revision else {}
    dtype = layout.torch_dtype(lay.compute)
    if gpu:  # the device accelerate gives this process (PartialState.set_device)
        onto = {"device_map": f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % torch.cuda.device_count()}"}
    else:
        onto = {}
    what = f"model {path}" + (f" at {config.model.revision}" if pin else "")
    try:
        model, loading = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, output_loading_info=True, **pin
        )
        if missing := sorted(loading.get("missing_keys") or []):  # never train from random initialisation
            raise NotLoaded(
                f"{what}: its weights are {parameters_missing(missing)}: an incomplete download? `klsweep "
                "fetch GRID` repairs a snapshot in the hub cache"
            )
        reference = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **onto, **pin)
        tokenizer = AutoTokenizer.from_pretrained(path, **pin)
    except OSError as e:  # not in the cache offline, gated, no network: name it in the run's reason
        raise not_loaded(what, e) from e
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
        **trlargs.vllm_importance_sampling(train.vllm_importance_sampling),
        vllm_max_model_length=train.max_prompt_length + train.max_completion_length,
        report_to=[],  # W&B through tracking.guarded_callback only (job.py)
        run_name=Path(run_dir).name,
        disable_tqdm=True,
        log_completions=False,
    )
    args = GRPOConfig(**trlargs.merged(own, train.trl))  # train.trl last
    dataset = tasks.load_train_dataset(config.task, config.seed, chat_template=config.model.chat_template)
    dataset, too_long = tasks.drop_long_prompts(dataset, tokenizer, train.max_prompt_length)
    # klsweep.fastgen in place of HF generate where klsweep plan said (the same tokens: the run id is the same)
    path_taken, _ = fastgen.generation_path(dataclasses.asdict(config), model.config.model_type)
    # klsweep.fastpass where the run asks for it and it applies (a different stream of numbers: in the run id)
    numerics, _ = fastgen.numerics_path(dataclasses.asdict(config), model.config.model_type)
    with vllm_engine_start(args, model.config, world, gpu):
        trainer = KLGRPOTrainer(
            model,
            reward_funcs=tasks.reward_function(config.task),
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            kl=kl,
            lag=config.offpolicy.lag,
            # a base model's answer ends where the eval's does (a chat model's at its end-of-turn token)
            stop_sequences=() if config.model.chat_template else tasks.stop_sequences(config.task),
            ref_model=reference,
            generation="fast" if path_taken == "fast" else "hf",
            numerics=numerics,
        )
    trainer.prompts_too_long = too_long  # read by train_run: a column of the metrics rows
    return trainer


@contextlib.contextmanager
def vllm_engine_start(args: Any, model_config: Any, world: int, gpu: bool) -> Iterator[None]:
    """Around the trainer's build, where TRL starts its colocate vLLM engine (``args.use_vllm``): in a run of one
    process, a rendezvous port of its own (``engines.own_rendezvous_port``); without a GPU, the KV cache of the
    engine's batch, ``max_num_seqs`` (TRL's: the micro-batch x tensor parallel x steps per generation)
    sequences of its context (``engines.cpu_kv_cache``)."""
    with contextlib.ExitStack() as stack:
        if args.use_vllm and world == 1:
            stack.enter_context(engines.own_rendezvous_port())
        if args.use_vllm and not gpu:
            seqs = (
                args.per_device_train_batch_size * args.vllm_tensor_parallel_size * args.steps_per_generation
            )
            need = engines.kv_cache_bytes(model_config, args.vllm_max_model_length, seqs)
            stack.enter_context(engines.cpu_kv_cache(need))
        yield
