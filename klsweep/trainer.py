"""``KLGRPOTrainer``: TRL's GRPOTrainer with any KL configuration of ``klsweep.kl`` and a policy lag.

Construct it like ``trl.GRPOTrainer`` plus ``kl=KLConfig(...)`` and ``lag=k`` (``trainer_factory`` does, from a
RunConfig). TRL's own KL term stays off (``args.beta`` must be 0; the coefficient is ``kl.beta``). All KL values
and surrogates come from ``klsweep.kl``, the advantages and aggregations from ``klsweep.grpo`` (the functions the
GRPO audit enumerates): this module only decides where they go. The reference model, precision, each
``kl.placement``, what is exact, the lag's FIFO and its checkpoints, the metrics and the limits:
docs/DESIGN.md (The trainer); the estimators: docs/KL.md.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import glob
import itertools
import json
import os
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from klsweep import grpo, store
from klsweep import kl as klmath
from klsweep.kl import KLConfig

BUFFERS_FILE = "klsweep_buffers_rank{rank}.pt"
PROMPT_MEMO = 1 << 16  # distinct prompts whose token ids a trainer keeps


def _loss_mask(batch: dict[str, Any]) -> torch.Tensor:
    """The tokens the loss counts: completion tokens, less tool-result tokens (as TRL masks its loss)."""
    mask = batch["completion_mask"]
    return mask if "tool_mask" not in batch else mask * batch["tool_mask"]


def _has_dropout(model: Any) -> bool:
    """Whether a training-mode forward can drop anything: a dropout module or a configured rate above 0."""
    from torch.nn.modules.dropout import _DropoutNd

    if any(isinstance(m, _DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    settings = getattr(model, "config", None)
    settings = settings.to_dict() if hasattr(settings, "to_dict") else {}
    return any(
        "dropout" in k and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        for k, v in settings.items()
    )


class KLGRPOTrainer(GRPOTrainer):
    """GRPO with the KL estimator, placement, level and importance weighting of ``kl``, and a policy lag."""

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: GRPOConfig | None = None,
        *,
        kl: KLConfig,
        lag: int = 0,
        stop_sequences: tuple[str, ...] = (),
        ref_model: Any = None,
        generation: str = "hf",
        numerics: str = "exact",
        **kwargs: Any,
    ) -> None:
        from transformers import PreTrainedModel

        if args is not None and args.beta != 0.0:
            raise ValueError(
                f"KLGRPOTrainer: args.beta={args.beta}; TRL's own KL must stay off (beta=0). "
                "Put the coefficient in kl=KLConfig(beta=...)."
            )
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
            raise ValueError(f"KLGRPOTrainer: lag={lag!r} must be an integer >= 0")
        if (
            kl.placement != "loss"
            and args is not None
            and args.multi_objective_aggregation != "sum_then_normalize"
        ):
            raise ValueError(
                "KLGRPOTrainer: the KL in the reward needs multi_objective_aggregation='sum_then_normalize'"
            )
        if kwargs.get("peft_config") is not None:
            raise ValueError(
                "KLGRPOTrainer does not support PEFT (its reference model is a copy of the policy)"
            )
        if generation not in ("hf", "fast"):
            raise ValueError(f"KLGRPOTrainer: generation={generation!r} must be hf or fast")
        if numerics not in ("exact", "fast"):
            raise ValueError(f"KLGRPOTrainer: numerics={numerics!r} must be exact or fast")
        self.generation = generation  # fast: klsweep.fastgen in place of HF generate (the same tokens)
        # fast: klsweep.fastpass's log-prob pass and fastgen's prompt shared by its rows, where they apply
        # (_lean_why_not); exact: TRL's operations
        self.numerics = numerics
        self._fast_generators: dict[int, Any] = {}
        # id of a model -> (it, accelerator.unwrap_model(it))
        self._unwrap_memo: dict[int, tuple[Any, Any]] = {}
        self._prompt_ids: dict[
            str, tuple[int, ...]
        ] = {}  # a prompt's JSON -> its token ids (_tokenize_prompts)  # id of the GenerationConfig -> its fastgen.Generator
        self.kl = kl
        self._kl_on = kl.beta > 0 or bool(kl.beta_final)  # a KL term at some step
        self.lag = lag
        self.stop_sequences = tuple(stop_sequences)
        if self.stop_sequences and args is not None:
            # TRL hands generation_kwargs to vLLM's SamplingParams (``stop``) or to HF's GenerationConfig
            # (``stop_strings``, which needs the tokenizer: _generate_single_turn passes it)
            key = "stop" if args.use_vllm else "stop_strings"
            given = dict(args.generation_kwargs or {})
            given[key] = list(dict.fromkeys([*(given.get(key) or []), *self.stop_sequences]))
            if args.use_vllm:
                # vLLM matches ``stop`` in its decoded text, which by default leaves special tokens out: an end
                # token of another family (Qwen2.5 base's <|im_end|>) never matched and the engine decoded to
                # max_completion_length. TRL reads vLLM's token ids, not its text, so keeping them is safe.
                given["skip_special_tokens"] = False
            args.generation_kwargs = given
        # ``ref_model``: the reference as loaded by the caller (trainer_factory: in the compute dtype, on the GPU,
        # no host copy); else a copy of the policy before TRL patches its forward (fused LM head), or a model id
        # loaded again below.
        if ref_model is None and isinstance(model, PreTrainedModel):
            ref_model = copy.deepcopy(model)

        super().__init__(model, reward_funcs, args, **kwargs)
        self.model.to(torch.float32)  # master weights: an update of lr 1e-6 is not rounded away

        if ref_model is None:
            from trl.trainer.utils import create_model_from_path, get_config_model_id

            init_kwargs = dict(self.args.model_init_kwargs or {})
            init_kwargs.setdefault("dtype", self.model.dtype)
            init_kwargs.setdefault("trust_remote_code", self.args.trust_remote_code)
            ref_model = create_model_from_path(get_config_model_id(self.model.config), **init_kwargs)
        self.ref_model = self._prepare_reference(ref_model)

        self._lag_queue: deque[dict[str, Any]] = deque()
        self._prompts: Iterator[Any] | None = None  # at lag k: the generation batches, read k ahead
        self._prompt_batches_read = 0  # generation batches taken from self._prompts (saved with the buffers)
        self._rewards_per_func: torch.Tensor | None = None  # stash of the last _calculate_rewards
        self._train_logps: torch.Tensor | None = None  # differentiable log-probs of the last training forward
        self._deterministic_forward = not _has_dropout(self.model)
        self._one_process = self.accelerator.num_processes == 1
        self.lean_why_not = self._lean_why_not() if numerics == "fast" else "train.numerics is exact"
        if numerics == "fast" and self.lean_why_not:
            import warnings

            warnings.warn(
                f"TRL's log-prob pass in place of klsweep.fastpass: {self.lean_why_not}", stacklevel=2
            )

    def _lean_why_not(self) -> str | None:
        """Why klsweep.fastpass does not compute this trainer's log-probs (numerics fast), or None."""
        from klsweep import fastpass

        if self.accelerator.num_processes != 1 or self.is_deepspeed_enabled or self.is_fsdp_enabled:
            return "more than one process (the pass bypasses the DDP or FSDP wrapper)"
        if self._is_vlm:
            return "a vision-language model"
        if getattr(self.args, "activation_checkpointing", False) or self.args.gradient_checkpointing:
            return "activation checkpointing"
        if not self._deterministic_forward:
            return "dropout in the model"
        if self.use_vllm:
            return "vLLM generation (its importance ratio is taken against TRL's pass)"
        for name, model in (("policy", self.model), ("reference", self.ref_model)):
            if why := fastpass.unsupported(self.accelerator.unwrap_model(model)):
                return f"{name}: {why}"
        return None

    def _prepare_reference(self, ref_model: Any) -> Any:
        from trl.models import prepare_deepspeed, prepare_fsdp
        from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

        ref_model.eval()
        ref_model.requires_grad_(False)
        if self.args.bf16 or self.args.fp16:  # frozen: held in the compute dtype, no master copy needed
            ref_model.to(torch.bfloat16 if self.args.bf16 else torch.float16)
        if self.args.disable_dropout:
            disable_dropout_in_model(ref_model)
        add_fused_lm_head(
            ref_model, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32
        )
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(ref_model, self.accelerator)
        if self.is_fsdp_enabled:
            return prepare_fsdp(ref_model, self.accelerator)
        return self.accelerator.prepare_model(ref_model, evaluation_mode=True)

    # ------------------------------------------------------------------------------------------ generation

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards_per_func  # gathered over processes: (N_global, n_funcs)
        return rewards_per_func

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **kwargs: Any,
    ):
        if self.lean_why_not is None and not compute_aux_loss and all(v is None for v in kwargs.values()):
            out = self._lean_logps(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy
            )
        else:
            out = super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                **kwargs,
            )
        if torch.is_grad_enabled():
            self._train_logps = out[0]
        return out

    def _lean_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy):
        """TRL's (log-probs, entropies, None) by klsweep.fastpass, in chunks of ``batch_size`` rows as TRL's."""
        from klsweep import fastpass

        model = self._unwrapped(model)
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            with self.accelerator.autocast():
                lp, ent = fastpass.logps(
                    model,
                    input_ids[rows],
                    attention_mask[rows],
                    logits_to_keep,
                    temperature=self.temperature,
                    entropy=compute_entropy,
                )
            logps.append(lp)
            entropies.append(ent)
        return (
            torch.cat(logps, dim=0),
            torch.cat(entropies, dim=0) if compute_entropy else None,
            None,
        )

    def _tokenize_prompts(self, prompts: list):
        """TRL's tokenization of the prompts (the chat template applied), kept per prompt: a GRPO batch repeats
        each prompt for its group and a run returns to the same prompts, and the template's rendering is a good
        share of a tiny model's step; in training, the whole training set's at the first call
        (``_tokenize_training_prompts``). The same ids (each prompt is tokenized alone in TRL's batch call too);
        prompts with images, tools or environments, and plain-text prompts, go to TRL every time."""
        from trl.data_utils import is_conversational

        if (
            self._is_vlm
            or self.tools
            or self.environment_factories is not None
            or not prompts
            or not is_conversational({"prompt": prompts[0]})
        ):
            return super()._tokenize_prompts(prompts)
        keys = [json.dumps(p, sort_keys=True, default=repr) for p in prompts]
        if not self._prompt_ids and self.model.training:
            self._tokenize_training_prompts()
        missing = list(dict.fromkeys(k for k in keys if k not in self._prompt_ids))
        if missing:
            firsts = {k: p for k, p in zip(keys, prompts, strict=True) if k in missing}
            ids, images, fields = super()._tokenize_prompts([firsts[k] for k in missing])
            if images is not None or fields:
                return super()._tokenize_prompts(prompts)
            if len(self._prompt_ids) < PROMPT_MEMO:
                self._prompt_ids.update(zip(missing, map(tuple, ids), strict=True))
            else:
                return super()._tokenize_prompts(prompts)
        return [list(self._prompt_ids[k]) for k in keys], None, {}

    def _tokenize_training_prompts(self) -> None:
        """Every distinct prompt of the training set tokenized in one call of TRL's (the same ids: each prompt is
        tokenized alone there), kept: a run of the tiny task meets a new prompt at almost every step, and one
        call for all of them costs a fraction of a call per step. Only a conversational training set of at most
        ``PROMPT_MEMO`` distinct prompts; else the prompts are tokenized as they come."""
        dataset = self.train_dataset
        if dataset is None or not hasattr(dataset, "column_names") or "prompt" not in dataset.column_names:
            return
        if len(dataset) > PROMPT_MEMO:
            return
        from trl.data_utils import is_conversational

        distinct = {json.dumps(p, sort_keys=True, default=repr): p for p in dataset["prompt"]}
        prompts = list(distinct.values())
        if not prompts or not all(is_conversational({"prompt": p}) for p in prompts):
            return
        ids, images, fields = super()._tokenize_prompts(prompts)
        if images is None and not fields:
            self._prompt_ids.update(zip(distinct, map(tuple, ids), strict=True))

    def _generate_single_turn(self, prompt_ids, *args: Any, **kwargs: Any):
        """TRL's generation (HF generate, or ``klsweep.fastgen`` in its place with ``generation="fast"``), each
        completion cut after the token that completes its first stop sequence: the text after the end of the
        answer is neither scored nor trained, whichever engine generated it."""
        with self._generate_with_tokenizer():
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        if not self.stop_sequences:
            return completion_ids, logprobs
        ends = [self._stop_end(ids) for ids in completion_ids]
        completion_ids = [ids[:end] for ids, end in zip(completion_ids, ends, strict=True)]
        if logprobs is not None:
            logprobs = [lp[:end] for lp, end in zip(logprobs, ends, strict=True)]
        return completion_ids, logprobs

    def _gather(self, tensors: Any) -> Any:
        """``accelerator.gather``: the tensors themselves in a run of one process (what it returns there, without
        its dispatch, a step's metrics call it a dozen times)."""
        return tensors if self._one_process else self.accelerator.gather(tensors)

    def _unwrapped(self, model: Any) -> Any:
        """``accelerator.unwrap_model(model)``, kept per wrapper: accelerate looks for DeepSpeed's package at
        every call, a good share of a tiny model's step."""
        kept = self._unwrap_memo.get(id(model))
        if kept is None or kept[0] is not model:
            kept = self._unwrap_memo[id(model)] = (model, self.accelerator.unwrap_model(model))
        return kept[1]

    @contextlib.contextmanager
    def _generate_with_tokenizer(self) -> Iterator[None]:
        """The generate TRL calls on the model it generates with (``unwrap_model_for_generation``: the unwrapped
        model), for the call: ``klsweep.fastgen``'s with ``generation="fast"``; else, with stop sequences, HF
        generate given the tokenizer, which ``stop_strings`` needs and TRL does not pass."""
        model = self._unwrapped(self.model_wrapped)
        fast = self.generation == "fast" and not self.use_vllm
        if self.use_vllm or "generate" in vars(model) or not (fast or self.stop_sequences):
            yield
            return
        hf = functools.partial(type(model).generate, model, tokenizer=self._tokenizer)
        model.generate = self._fast_generate(model, hf) if fast else hf
        try:
            yield
        finally:
            del model.generate

    def _fast_generate(self, model: Any, hf: Any) -> Any:
        """``model.generate`` by ``klsweep.fastgen.Generator``, built at the first call (inside TRL's generation
        context, whose generation config it resolves as generate does) and kept; HF generate (``hf``) for a call
        it does not reproduce (multimodal inputs), and for good where its settings are outside what it does
        (said once)."""
        from klsweep import fastgen

        def generate(input_ids=None, attention_mask=None, generation_config=None, **kwargs):
            if kwargs or attention_mask is None:  # pixel values, token types; a mask generate would infer
                return hf(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    generation_config=generation_config,
                    **kwargs,
                )
            key = id(generation_config)
            if key not in self._fast_generators:
                try:
                    self._fast_generators[key] = fastgen.Generator(
                        model,
                        generation_config,
                        self._tokenizer,
                        share_prompts=self.numerics == "fast" and self.lean_why_not is None,
                    )
                except ValueError as e:
                    import warnings

                    warnings.warn(f"HF generate in place of klsweep.fastgen: {e}", stacklevel=2)
                    self._fast_generators[key] = None
            generator = self._fast_generators[key]
            if generator is None:
                return hf(
                    input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config
                )
            return generator(input_ids, attention_mask)

        return generate

    def _stop_end(self, ids: list[int]) -> int:
        """The length of the shortest prefix of ``ids`` whose text holds a stop sequence (all of it if none)."""

        def stops(n: int) -> bool:  # special tokens kept: an end token of another family is a stop too
            text = self._tokenizer.decode(ids[:n], skip_special_tokens=False)
            return any(s in text for s in self.stop_sequences)

        if not stops(len(ids)):
            return len(ids)
        low, high = 0, len(ids)  # stops(high) holds; a longer prefix holds what a shorter one does
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (low, mid) if stops(mid) else (mid, high)
        return high

    def _generate_and_score_completions(self, inputs):
        if self.lag == 0 or not self.model.training:
            return self._rollout(inputs)
        # At lag k the batch trained at round t holds round t's prompts, generated at round t-k: the prompts
        # are read k rounds ahead of the training loop, from the same data order (_next_prompts). The loop's
        # own ``inputs`` are the batch generated k rounds ago.
        if not self._lag_queue:  # pipeline fill: rounds 0..k-1, generated by the initial policy
            for _ in range(self.lag):
                self._lag_queue.append(self._rollout(self._next_prompts()))
        self._lag_queue.append(self._rollout(self._next_prompts()))
        return self._lag_queue.popleft()

    def _next_prompts(self) -> Any:
        """The next generation batch of the training data, in the order TRL's training loop reads them (its
        dataloader: the same sampler and seed, this process's share), epoch after epoch; after a resume, from
        where the checkpoint's reader was."""
        if self._prompts is None:
            self._prompts = self._generation_batches(skip=self._prompt_batches_read)
        self._prompt_batches_read += 1
        return next(self._prompts)

    def _generation_batches(self, skip: int) -> Iterator[Any]:
        loader = self.get_train_dataloader()
        # TRL's sampler repeats each generation batch for every micro-step that trains on it; TRL generates on
        # the first of them
        repeats = self.args.steps_per_generation * self.num_iterations
        seen = 0
        for epoch in itertools.count():
            if hasattr(loader, "set_epoch"):  # as the training loop does at each epoch
                loader.set_epoch(epoch)
            for i, batch in enumerate(loader):
                if i % repeats == 0:
                    if seen >= skip:
                        yield batch
                    seen += 1

    def _rollout(self, inputs):
        """Generate and score one batch (TRL), then add what the KL needs: reference log-probs, behaviour
        log-probs (when off-policy, or the KL is in the reward and the batch is not trained in one on-policy
        pass), the task reward, and the KL-penalised advantages or baselines for the reward placement."""
        from trl.models.utils import disable_gradient_checkpointing

        out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        mask = _loss_mask(out)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            self._log_engine_agreement(out, mask, mode)
        input_ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attention_mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        logits_to_keep = out["completion_ids"].size(1)
        batch_size = (
            self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        )
        in_reward = self._kl_on and self.kl.placement in ("reward", "both")
        behavior = out.get("old_per_token_logps")
        # On-policy, with the whole batch in one training forward, the behaviour log-probs of the reward half's
        # baseline are that forward's (same weights, same tokens): it is computed there, one forward fewer.
        deferred = (
            in_reward
            and self.kl.reward_term
            and behavior is None
            and mode == "train"
            and self.lag == 0
            and self.args.steps_per_generation == 1
            and self._deterministic_forward
        )

        with torch.no_grad():
            out["ref_per_token_logps"] = self._get_per_token_logps_and_entropies(
                self.ref_model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size
            )[0]
            if behavior is None and not deferred and (in_reward or (self.lag > 0 and mode == "train")):
                with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                    behavior = self._get_per_token_logps_and_entropies(
                        self.model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size
                    )[0]
                if self.lag > 0 and mode == "train":  # the ratio must be taken against the generating policy
                    out["old_per_token_logps"] = behavior

        rewards_per_func = self._rewards_per_func
        task_reward = (
            rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        ).nansum(dim=1)
        task_reward[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # unscorable, as TRL does
        n_local = out["completion_ids"].size(0)
        local = slice(
            self.accelerator.process_index * n_local, (self.accelerator.process_index + 1) * n_local
        )
        if deferred:  # each completion's place in the generated batch, for _deferred_baseline
            out["kl_index"] = torch.arange(local.start, local.stop, device=mask.device)
        elif in_reward:
            penalty = klmath.penalty(behavior, out["ref_per_token_logps"], mask, self.kl)
            penalty = self._gather(penalty.float())
            g = self.num_generations if mode == "train" else self.num_generations_eval
            if self.kl.reward_term:  # its own term at training time (_compute_loss): the baseline goes along
                out["kl_baseline"] = grpo.leave_one_out_baseline(penalty, g)[local]
                penalty = None
            advantages = grpo.advantages(
                task_reward, penalty, self._beta(), g, self.scale_rewards, self.kl.reward_mode
            )
            out["advantages"] = advantages[local]
        out["task_reward"] = task_reward[local]
        out["policy_version"] = torch.full((n_local,), self.state.global_step, device=mask.device)
        return out

    def _log_engine_agreement(self, out: dict[str, Any], mask: torch.Tensor, mode: str) -> None:
        """vLLM against the trainer at the weights vLLM generated with (TRL syncs them before generating): the
        fraction of units TRL's importance-sampling correction keeps, their mean ratio pi_trainer/pi_vllm, and
        the mean absolute per-token log-prob difference (``grpo.engine_agreement``; docs/DESIGN.md)."""
        kept, units, ratios, gaps, tokens = (
            self.accelerator.gather(
                grpo.engine_agreement(
                    out["old_per_token_logps"],
                    out["sampling_per_token_logps"],
                    mask,
                    self.vllm_importance_sampling_mode,
                    self.vllm_importance_sampling_clip_min,
                    self.vllm_importance_sampling_clip_max,
                ).unsqueeze(0)
            )
            .sum(0)
            .tolist()
        )
        metrics = self._metrics[mode]
        metrics["vllm/kept_fraction"].append(kept / units if units else float("nan"))
        metrics["vllm/ratio_mean"].append(ratios / units if units else float("nan"))
        metrics["vllm/logp_mismatch"].append(gaps / tokens if tokens else float("nan"))

    # ------------------------------------------------------------------------------------------ loss

    def _beta(self) -> float:
        """The KL coefficient of this optimiser step (``kl.beta_at``: ``kl.beta`` unless ``kl.beta_final``)."""
        return klmath.beta_at(self.kl, self.state.global_step, self.state.max_steps)

    def _aggregation(self, inputs: dict[str, Any]) -> grpo.Aggregation:
        """How TRL aggregates the policy loss of ``loss_type`` in this step (``klsweep.grpo.Aggregation``)."""
        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        tokens = None
        if self.loss_type in ("cispo", "dapo", "vespo"):
            tokens = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                tokens = tokens * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return grpo.Aggregation(self.loss_type, accumulation, tokens, self.max_completion_length)

    def _compute_loss(self, model, inputs):
        from trl.trainer.utils import nanstd

        self._train_logps = None
        loss = super()._compute_loss(model, inputs)  # TRL's policy loss (its own KL is off)
        logps = self._train_logps
        mask = _loss_mask(inputs)
        ref = inputs["ref_per_token_logps"]
        behavior = inputs.get("old_per_token_logps")
        sampled = logps.detach() if behavior is None else behavior  # log-probs of the policy that sampled
        mode = "train" if self.model.training else "eval"
        # generated by vLLM: TRL weighs its policy loss by the ratio of the training engine's probabilities to
        # vLLM's (truncated or masked); every KL term gets the same weight (docs/KL.md, "Generated by vLLM")
        engine = (
            inputs["importance_sampling_ratio"]
            if self.use_vllm and self.vllm_importance_sampling_correction
            else None
        )

        if self._kl_on and self.kl.placement in ("loss", "both"):
            weights_from = sampled if self.kl.importance != "none" else None
            kl_loss = grpo.kl_loss(logps, ref, mask, self.kl, self._aggregation(inputs), weights_from, engine)
            loss = loss + self._beta() * kl_loss
        if self._kl_on and self.kl.reward_term:
            baseline = inputs.get("kl_baseline")
            if baseline is None:
                baseline = self._deferred_baseline(logps.detach(), ref, mask, inputs["kl_index"])
            reward_loss = grpo.kl_reward_loss(
                logps, ref, mask, self.kl, self._aggregation(inputs), baseline, sampled, engine
            )
            loss = loss + self._beta() * reward_loss

        with torch.no_grad():
            values = {
                "kl/k1": klmath.estimate(sampled, ref, mask, "k1", "token"),
                "kl/k3": klmath.estimate(sampled, ref, mask, "k3", "token"),
                "kl/forward": klmath.forward_estimate(sampled, ref, mask),
                "kl/penalty": klmath.penalty(sampled, ref, mask, self.kl),
                "completion_length": mask.sum(-1).float(),
                "policy_lag": (self.state.global_step - inputs["policy_version"]).float(),
            }
            if self._kl_on and self.kl.placement in ("reward", "both"):
                used = logps.detach() if self.kl.reward_term else sampled  # the reward half's log-probs
                penalty = klmath.penalty(used, ref, mask, self.kl)
                values["kl/reward_penalty"] = penalty
            if self.kl.log_ratio_clamp > 0 or self.kl.value_clamp > 0:  # the share of units clamped
                values["kl/clamped"] = klmath.clamped_share(sampled, ref, mask, self.kl)
            if self.kl.beta_final is not None:
                values["kl/beta"] = torch.full_like(values["completion_length"], self._beta())
            for name, value in values.items():
                self._metrics[mode][name].append(self._gather(value.float()).mean().item())
            task_reward = self._gather(inputs["task_reward"])
            self._metrics[mode]["task_reward/mean"].append(torch.nanmean(task_reward).item())
            self._metrics[mode]["task_reward/std"].append(nanstd(task_reward).item())
        return loss

    def _deferred_baseline(
        self, logps: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, index: torch.Tensor
    ) -> torch.Tensor:
        """The leave-one-out baseline ``_rollout`` would have computed, from the training forward's detached
        log-probs of the whole generated batch (shuffled by TRL; ``index``: each completion's place in it)."""
        penalty = klmath.penalty(logps, ref, mask, self.kl)
        penalties, order = self._gather((penalty.float(), index))
        if not torch.equal(order.sort().values, torch.arange(order.numel(), device=order.device)):
            raise RuntimeError("the deferred KL baseline needs the whole generated batch in one micro-batch")
        in_order = torch.empty_like(penalties).index_copy_(0, order, penalties)
        return grpo.leave_one_out_baseline(in_order, self.num_generations)[index]

    # ------------------------------------------------------------------------------------------ checkpoints

    def _buffers_path(self, checkpoint_dir: str) -> str:
        return os.path.join(checkpoint_dir, BUFFERS_FILE.format(rank=self.accelerator.process_index))

    def _save_checkpoint(self, model, trial):
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        # The buffers go first: TRL/transformers write trainer_state.json last, and a resume only trusts a
        # checkpoint that has it (klsweep.job), so no checkpoint is ever resumed without its lag queue.
        folder = os.path.join(
            self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        )
        os.makedirs(folder, exist_ok=True)
        buffers = {
            "lag_queue": list(self._lag_queue),
            "buffered_inputs": self._buffered_inputs,
            "step": self._step,
            "prompt_batches_read": self._prompt_batches_read,
        }
        torch.save(buffers, self._buffers_path(folder))
        if self.sharded_checkpoints and self.args.should_save:
            # transformers writes no Hugging Face files beside the shards: the config makes the folder a
            # checkpoint (klsweep.store.checkpoints), the tokenizer goes with it as in a full save
            self.accelerator.unwrap_model(self.model).config.save_pretrained(folder)
            self.processing_class.save_pretrained(folder)
        self.accelerator.wait_for_everyone()  # every rank's buffers are complete before trainer_state.json
        super()._save_checkpoint(model, trial)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        # transformers saves the weights with safetensors, which writes them 0600: every file of the folder
        # gets the mode the umask gives the rest of the results folder (a colleague's eval reads them)
        super()._save(output_dir, state_dict=state_dict)
        if self.args.should_save:
            store.follow_umask(output_dir if output_dir is not None else self.args.output_dir)

    @property
    def sharded_checkpoints(self) -> bool:
        """Whether checkpoints hold each rank's shard of the policy and optimizer (FSDP's SHARDED_STATE_DICT,
        torch.distributed.checkpoint) rather than Hugging Face weights."""
        return self.is_fsdp_enabled and "SHARDED" in str(self.accelerator.state.fsdp_plugin.state_dict_type)

    def save_consolidated(self, folder: str | os.PathLike) -> None:
        """Write the policy's whole weights into the checkpoint ``folder`` in Hugging Face format
        (``model.safetensors``, float32: what eval reads), gathered from the ranks' shards; a no-op unless
        checkpoints are sharded. Collective: every rank calls it."""
        if not self.sharded_checkpoints:
            return
        self._save(os.fspath(folder), state_dict=self.accelerator.get_state_dict(self.model))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        saved = len(glob.glob(os.path.join(glob.escape(checkpoint), BUFFERS_FILE.format(rank="*"))))
        if saved == 0:
            return  # not written by this trainer: TRL's behaviour (the queue refills)
        if saved != self.accelerator.num_processes or not os.path.exists(self._buffers_path(checkpoint)):
            # A rank with an empty queue would generate k+1 batches while the others generate one: their
            # collectives would no longer match and the run would hang.
            raise RuntimeError(
                f"{checkpoint} holds the lag buffers of {saved} processes, not of this process "
                f"(rank {self.accelerator.process_index} of {self.accelerator.num_processes}): "
                "resume it with the processes that saved it"
            )
        device = self.accelerator.device  # "cpu:<rank>" in a multi-process CPU run: torch.load wants "cpu"
        buffers = torch.load(
            self._buffers_path(checkpoint),
            map_location="cpu" if device.type == "cpu" else device,
            weights_only=True,
        )
        self._lag_queue = deque(buffers["lag_queue"])
        self._buffered_inputs, self._step = self._relaid(buffers["buffered_inputs"], buffers["step"])
        # A checkpoint saved before the prompts were read ahead: its generations read the loop's batches, one
        # a round (the fill repeated the first); go on from the loop's place.
        rounds = -(-self._step // (self.args.steps_per_generation * self.num_iterations))
        self._prompt_batches_read = buffers.get("prompt_batches_read", rounds)
        self._prompts = None

    def _relaid(
        self, buffered: list[dict[str, Any]] | None, step: int
    ) -> tuple[list[dict[str, Any]] | None, int]:
        """TRL's generation buffer and micro-step counter laid out in this run's micro-batches: a resume may
        change ``train.micro_batch_size`` (not part of the run id), which splits the same generation batch into
        another number of micro-batches. A checkpoint is saved at an optimiser step's end."""
        from trl.trainer.utils import split_tensor_dict

        parts = self.args.steps_per_generation
        if buffered is None or len(buffered) == parts:
            return buffered, step
        whole: dict[str, Any] = {}
        for key, first in buffered[0].items():
            if first is None or (isinstance(first, torch.Tensor) and first.ndim == 0):
                whole[key] = first  # the same in every micro-batch (TRL's split keeps it whole)
            elif isinstance(first, list):
                whole[key] = [x for b in buffered for x in b[key]]
            else:
                whole[key] = torch.cat([b[key] for b in buffered])
        return split_tensor_dict(whole, parts), self.state.global_step * self.args.gradient_accumulation_steps
