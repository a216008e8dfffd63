"""Fast generation for small causal LMs on a CPU: the sampling loop of Hugging Face ``generate`` without its
per-call and per-step overhead, sampling exactly what ``generate`` samples.

On the project's tiny model a GRPO step generates 3-6 tokens for a few dozen prompts, and HF ``generate`` spends
most of that time in Python: preparing its config, kwargs and cache, creating masks, and running the model's
forward through its wrappers. ``Generator`` keeps what ``generate`` builds once per trainer (its resolved
``GenerationConfig``, logits processors and stopping criteria, made by ``generate``'s own helpers, so every setting
the trainer passes means what it means there: temperature, top-k/p, min-p, repetition penalty, ``max_new_tokens``,
the eos ids, ``stop_strings``, the pad id) and runs the KV-cached loop itself:

- the forward is the model's own (``forward="model"``: any causal LM, opt-in), or for ``SUPPORTED_TYPES``
  (``forward="lean"``) the same modules' weights through the same torch operations, in the same order and on
  tensors of the same shapes as transformers' forward of that model (the same mask, ``sdpa_mask``; the same
  attention function, ``sdpa_attention_forward``; the same rotary embedding): the same logits, bit for bit;
- each step applies the same processors to the float32 logits of the last position, takes the softmax and
  draws with ``torch.multinomial`` (``argmax`` when greedy) from the same generator in the same order, pads a
  finished row with the pad id and stops when every row has finished or ``max_new_tokens`` are drawn: what
  ``GenerationMixin._sample`` does.

So for a seed it returns the very tokens ``generate`` returns (``tests/unit/test_fastgen.py`` checks it against
``generate`` itself, sampled and greedy, with padding, every warper and stop strings): a run trains the same
whichever path generated, on any CPU. Where a setting or model is outside what it reproduces (``unsupported``:
beam search, a processor or stopping criterion it does not know, another attention implementation, hooks on the
model) it says why, and the trainer generates with HF ``generate``. Which path a run takes: ``generation_path``,
decided from the run's config and the model's ``config.json`` alone (no torch), for ``klsweep plan``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# model_type values (config.json) whose forward ``Generator`` runs itself ("lean")
SUPPORTED_TYPES = ("qwen2",)
GENERATION_CHOICES = ("auto", "fast", "hf")
NUMERICS_CHOICES = ("exact", "fast")  # train.numerics: TRL's operations, or klsweep.fastpass's (bits differ)

# The logits processors and stopping criteria of HF generate that the loop applies as generate does (by class
# name: transformers' own objects, built by generate's helpers). Any other one: HF generate.
_PROCESSORS = (
    "RepetitionPenaltyLogitsProcessor",
    "TemperatureLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
    "MinPLogitsWarper",
    "SuppressTokensLogitsProcessor",
)
_CRITERIA = ("MaxLengthCriteria", "EosTokenCriteria", "StopStringCriteria")


def generation_path(config: Mapping[str, Any], model_type: str | None) -> tuple[str, str]:
    """Which engine generates a run's completions, and why: ``("fast", why)``, ``("hf", why)`` or
    ``("vllm", why)``, from a resolved RunConfig (nested plain data) and its model's ``config.json``
    ``model_type`` (None: unknown). ``train.generation``: ``auto`` takes the fast path for ``SUPPORTED_TYPES`` on
    CPUs, HF generate elsewhere; ``fast`` takes it for any causal LM (the model's own forward where the type is
    not supported); ``hf`` never. vLLM (``train.use_vllm``) and FSDP (``train.sharding``) always fall back."""
    train = config.get("train") or {}
    model = config.get("model") or {}
    asked = train.get("generation", "auto")
    if train.get("use_vllm"):
        return "vllm", "train.use_vllm: vLLM generates"
    if asked == "hf":
        return "hf", "train.generation is hf"
    if train.get("sharding", "none") != "none":
        return "hf", f"train.sharding is {train.get('sharding')}: HF generate gathers the shards"
    if asked == "fast":
        lean = model_type in SUPPORTED_TYPES
        return "fast", "train.generation is fast" + ("" if lean else " (the model's own forward)")
    gpus = ((model.get("resources") or {}).get("gpus_per_node")) or 0
    if gpus:
        return (
            "hf",
            "auto: GPUs (the fast path is for small models on CPUs; train.generation: fast forces it)",
        )
    if model_type not in SUPPORTED_TYPES:
        kind = "unknown" if model_type is None else model_type
        return (
            "hf",
            f"auto: model type {kind} (fast: {', '.join(SUPPORTED_TYPES)}; train.generation: fast forces it)",
        )
    return "fast", f"auto: {model_type} on CPUs"


def numerics_path(config: Mapping[str, Any], model_type: str | None) -> tuple[str, str]:
    """How a run computes, and why: ``("fast", why)`` (klsweep.fastpass's log-prob pass and each distinct
    prompt prefilled once in generation) or ``("exact", why)`` (TRL's operations), from a resolved RunConfig
    (nested plain data) and its model's ``config.json`` ``model_type``. ``train.numerics: fast`` takes it for
    ``SUPPORTED_TYPES`` trained on CPUs in one process without vLLM; elsewhere the run computes TRL's way. The
    trainer may still fall back at its start (dropout, activation checkpointing: it warns)."""
    train = config.get("train") or {}
    if train.get("numerics", "exact") != "fast":
        return "exact", "train.numerics is exact"
    resources = (config.get("model") or {}).get("resources") or {}
    if train.get("use_vllm"):
        return "exact", "fast asked: vLLM generates (its importance ratio is taken against TRL's pass)"
    if train.get("sharding", "none") != "none":
        return "exact", f"fast asked: train.sharding is {train.get('sharding')}"
    if resources.get("gpus_per_node") or (resources.get("nodes") or 1) > 1:
        return "exact", "fast asked: GPUs or several nodes (klsweep.fastpass: one process on CPUs)"
    if (resources.get("tasks_per_node") or 1) > 1:
        return "exact", "fast asked: several processes (klsweep.fastpass: one)"
    if model_type not in SUPPORTED_TYPES:
        kind = "unknown" if model_type is None else model_type
        return "exact", f"fast asked: model type {kind} (klsweep.fastpass: {', '.join(SUPPORTED_TYPES)})"
    return "fast", f"train.numerics is fast: {model_type} on CPUs"


def unsupported(model: Any, generation_config: Any = None) -> str | None:
    """Why ``Generator`` cannot reproduce HF ``generate`` for ``model`` (and ``generation_config``), or None."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return "not a decoder-only causal LM"
    if not hasattr(model, "generate"):
        return "not a generative model"
    if generation_config is not None:
        g = generation_config
        if (g.num_beams or 1) != 1 or (g.num_return_sequences or 1) != 1:
            return "beam search or several sequences per prompt"
        if g.assistant_model if hasattr(g, "assistant_model") else False:
            return "assisted generation"
        if getattr(g, "prompt_lookup_num_tokens", None) or getattr(g, "prefill_chunk_size", None):
            return "prompt lookup or chunked prefill"
        if g.cache_implementation not in (None, "dynamic"):
            return f"cache_implementation {g.cache_implementation}"
        if g.min_new_tokens or g.min_length:
            return "min_new_tokens or min_length"
    return None


def lean_unsupported(model: Any) -> str | None:
    """Why the lean forward does not apply to ``model`` (its own forward is used then), or None."""
    config = model.config
    if config.model_type not in SUPPORTED_TYPES:
        return f"model type {config.model_type}"
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return f"attention {getattr(config, '_attn_implementation', None)}"
    if config.hidden_act != "silu":
        return f"activation {config.hidden_act}"
    if getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in config.layer_types):
        return "sliding-window layers"
    if (config.rope_parameters or {}).get("rope_type", "default") != "default":
        return "a rope scaling"
    for module in model.modules():
        hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
        if any(getattr(h, "__qualname__", "") != _INPUT_GRADS for h in hooks):
            return "forward hooks on the model"
    return None


# transformers' hook on the input embeddings under activation checkpointing (``enable_input_require_grads``): it
# marks the embeddings' output as requiring grad, which changes no value (generation runs without grad)
_INPUT_GRADS = "PreTrainedModel.enable_input_require_grads.<locals>.make_inputs_require_grads"


class Generator:
    """``generate(input_ids, attention_mask)`` of one model with one ``GenerationConfig``: what HF ``generate``
    returns (prompt and completion ids, finished rows padded), by the loop of the module docstring. Built once
    (a trainer's settings do not change); reads the model's weights at every call. ``forward``: ``"lean"`` (the
    model's type must be supported), ``"model"`` (the model's own forward) or ``"auto"`` (lean where it
    applies)."""

    def __init__(
        self,
        model: Any,
        generation_config: Any,
        tokenizer: Any = None,
        forward: str = "auto",
        share_prompts: bool = False,
    ) -> None:
        from transformers.generation.stopping_criteria import StoppingCriteriaList

        if forward not in ("auto", "lean", "model"):
            raise ValueError(f"forward={forward!r}: auto, lean or model")
        self.model = model
        self.tokenizer = tokenizer
        self.asked = generation_config
        why_not = lean_unsupported(model)
        if forward == "lean" and why_not:
            raise ValueError(f"the lean forward does not apply: {why_not}")
        self.lean = forward != "model" and why_not is None
        self.why_not_lean = why_not
        # the prompt's prefill once per distinct prompt row, its keys and values and first logits copied to the
        # rows that share it (train.numerics: fast): the same tokens but where a float rounding flips a draw
        self.share_prompts = share_prompts and self.lean
        # what generate resolves once per call: the model's generation config under the one given, the special
        # tokens as tensors, the processors and criteria (generate's own helpers)
        config, model_kwargs = model._prepare_generation_config(generation_config)
        if why := unsupported(model, config):
            raise ValueError(f"fast generation does not reproduce HF generate here: {why}")
        if model_kwargs:
            raise ValueError(f"fast generation: unexpected model arguments {sorted(model_kwargs)}")
        model._prepare_special_tokens(config, True, device=model.device, batch_size=1)
        self.config = config
        self.processors = self._processors(None)  # checks them; rebuilt per call where they read the mask
        self.per_call = config.repetition_penalty not in (None, 1.0)  # it skips each row's left padding
        config_max_length = config.max_length
        config.max_length = (
            None  # the loop counts new tokens itself (MaxLengthCriteria would count the prompt)
        )
        try:
            criteria = model._get_stopping_criteria(
                generation_config=config, stopping_criteria=StoppingCriteriaList(), tokenizer=tokenizer
            )
        finally:
            config.max_length = config_max_length
        others = [type(c).__name__ for c in criteria if type(c).__name__ not in _CRITERIA]
        if others:
            raise ValueError(f"fast generation does not apply the stopping criteria {others}")
        self.criteria = criteria
        self.max_new_tokens = config.max_new_tokens
        if self.max_new_tokens is None:
            raise ValueError("fast generation needs max_new_tokens")
        self.do_sample = bool(config.do_sample)
        self.pad = config._pad_token_tensor
        self.pads_finished = any(hasattr(c, "eos_token_id") for c in criteria)

    def _processors(self, mask: Any) -> Any:
        """generate's logits processors for a batch with the 2D ``mask`` (None: no padding), checked."""
        from transformers.generation.logits_process import LogitsProcessorList

        processors = self.model._get_logits_processor(
            generation_config=self.config,
            input_ids_seq_length=1 if mask is None else mask.shape[1],
            encoder_input_ids=None,
            prefix_allowed_tokens_fn=None,
            logits_processor=LogitsProcessorList(),
            device=self.model.device,
            model_kwargs={"attention_mask": mask},
        )
        others = [type(p).__name__ for p in processors if type(p).__name__ not in _PROCESSORS]
        if others:
            raise ValueError(f"fast generation does not apply the logits processors {others}")
        return processors

    def __call__(self, input_ids: Any, attention_mask: Any = None, **kwargs: Any) -> Any:
        """Prompt ids (left-padded, ``attention_mask`` 0 on padding, required) -> prompt and completion ids, as ``generate``
        returns them. Other keyword arguments (``generation_config``, ``tokenizer``: the ones it was built with)
        are accepted and ignored, so that it stands in for ``model.generate``."""
        import torch

        extra = set(kwargs) - {"generation_config", "tokenizer"}
        if extra:
            raise TypeError(f"fast generation: unexpected arguments {sorted(extra)}")
        with torch.no_grad():
            return self._sample(input_ids, attention_mask)

    def _sample(self, input_ids: Any, attention_mask: Any) -> Any:
        import torch
        import torch.nn.functional as F

        batch = input_ids.shape[0]
        if attention_mask is None:  # generate infers one from the pad id: not reproduced
            raise ValueError("fast generation needs the attention mask")
        # generate: positions from the mask (padding at 0); a mask of all ones is dropped
        positions = attention_mask.long().cumsum(-1) - 1
        positions = positions.masked_fill(attention_mask == 0, 0)
        mask = None if bool((attention_mask == 1).all()) else attention_mask
        processors = self._processors(mask) if self.per_call else self.processors
        unfinished = torch.ones(batch, dtype=torch.long, device=input_ids.device)
        step = self._lean_step if self.lean else self._model_step
        cache: Any = None
        ids = input_ids
        new = input_ids
        for drawn in range(self.max_new_tokens):
            if drawn == 0 and self.share_prompts:
                logits, cache = self._shared_prefill(input_ids, attention_mask, positions)
            else:
                logits, cache = step(new, positions, mask, cache)
            scores = processors(ids, logits[:, -1].to(copy=True, dtype=torch.float32))
            if self.do_sample:
                tokens = torch.multinomial(F.softmax(scores, dim=-1), num_samples=1).squeeze(1)
            else:
                tokens = torch.argmax(scores, dim=-1)
            if self.pads_finished:
                tokens = tokens * unfinished + self.pad * (1 - unfinished)
            ids = torch.cat([ids, tokens[:, None]], dim=-1)
            unfinished = unfinished & ~self.criteria(ids, None)
            if unfinished.max() == 0 or drawn + 1 == self.max_new_tokens:
                break
            new = tokens[:, None]
            positions = positions[:, -1:] + 1
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=-1)
        return ids

    def _shared_prefill(self, input_ids: Any, attention_mask: Any, positions: Any) -> tuple[Any, Any]:
        """The lean prefill of each distinct prompt row once, its last logits and its cache given to every row
        that holds it (a GRPO group's completions share one prompt)."""

        firsts, inverse = distinct_rows(input_ids, attention_mask)
        mask = attention_mask.index_select(0, firsts)
        logits, cache = self._lean_step(
            input_ids.index_select(0, firsts),
            positions.index_select(0, firsts),
            None if bool((mask == 1).all()) else mask,
            None,
        )
        cache = [(k.index_select(0, inverse), v.index_select(0, inverse)) for k, v in cache]
        return logits.index_select(0, inverse), cache

    def _model_step(self, new: Any, positions: Any, mask: Any, cache: Any) -> tuple[Any, Any]:
        """One forward of the model's own, with the arguments generate gives it."""
        from transformers import DynamicCache

        if cache is None:
            cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=new,
            attention_mask=mask,
            position_ids=positions[:, -new.shape[1] :],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            return_dict=True,
        )
        return out.logits, out.cache

    def _lean_step(self, new: Any, positions: Any, mask: Any, cache: Any) -> tuple[Any, Any]:
        """One forward of a Qwen2 causal LM by the operations of transformers' ``Qwen2ForCausalLM.forward`` (sdpa
        attention, full-attention layers, default rope), with a KV cache of per-layer (keys, values)."""
        import torch
        import torch.nn.functional as F

        body = self.model.model
        past = 0 if cache is None else cache[0][0].shape[-2]
        q_length = new.shape[1]
        hidden = F.embedding(new, body.embed_tokens.weight, body.embed_tokens.padding_idx)
        if q_length == 1 and past > 0:
            # a decoding step: every cached position is causally visible, so the mask is the padding's (a row of
            # ones: none, as sdpa_mask decides for a batch without padding), the values sdpa_mask builds, without
            # its Python
            attend = None if mask is None else mask.to(dtype=torch.bool)[:, None, None, :]
        else:
            attend = causal_mask(new.shape[0], q_length, past, mask, hidden.device)
        cos, sin = body.rotary_emb(hidden, positions[:, -q_length:])
        layers = body.layers[: body.config.num_hidden_layers]
        cache = [None] * len(layers) if cache is None else cache
        for i, layer in enumerate(layers):
            hidden, cache[i] = lean_layer(layer, hidden, cos, sin, attend, cache[i])
        hidden = body.norm.forward(hidden)
        head = self.model.lm_head
        return F.linear(hidden[:, -1:, :], head.weight, head.bias), cache


def distinct_rows(*tensors: Any) -> tuple[Any, Any]:
    """The distinct rows of ``tensors`` side by side (2D, as many rows each): the index of each one's first row,
    in order of first appearance, and each row's distinct row (``torch.unique(dim=0)`` without its sort, which
    costs a tiny model's step more than a pass over the ids in Python)."""
    import torch

    seen: dict[tuple[int, ...], int] = {}
    firsts: list[int] = []
    inverse = []
    for row, key in enumerate(map(tuple, torch.cat(tensors, dim=1).tolist())):
        index = seen.setdefault(key, len(seen))
        if index == len(firsts):
            firsts.append(row)
        inverse.append(index)
    device = tensors[0].device
    return torch.tensor(firsts, device=device), torch.tensor(inverse, device=device)


def causal_mask(rows: int, q_length: int, past: int, mask: Any, device: Any) -> Any:
    """transformers' causal and padding mask for sdpa (``sdpa_mask``; None where ``is_causal`` does) of
    ``q_length`` queries after ``past`` positions, ``mask`` the 2D padding mask of all of them (None: none)."""
    import torch
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    return sdpa_mask(
        batch_size=rows,
        q_length=q_length,
        kv_length=past + q_length,
        q_offset=past,
        kv_offset=0,
        mask_function=causal_mask_function,
        attention_mask=None if mask is None else mask.to(dtype=torch.bool),
        allow_is_causal_skip=True,
        device=device,
    )


def lean_layer(layer: Any, hidden: Any, cos: Any, sin: Any, attend: Any, past: Any) -> tuple[Any, Any]:
    """One Qwen2 decoder layer by the operations of transformers' (sdpa attention, the mask ``attend``, rotary
    ``cos``/``sin``), attending to the keys and values ``past`` (per layer, before this block's; None: none):
    the hidden state out, and the keys and values of ``past`` and this block together (what ``DynamicCache``
    keeps). Differentiable: ``klsweep.fastpass`` trains through it."""
    import torch
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    attn = layer.self_attn
    residual = hidden
    x = layer.input_layernorm.forward(hidden)
    shape = (*x.shape[:-1], -1, attn.head_dim)
    q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(shape).transpose(1, 2)
    k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(shape).transpose(1, 2)
    v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if past is not None:  # DynamicCache.update
        k = torch.cat([past[0], k], dim=-2)
        v = torch.cat([past[1], v], dim=-2)
    out, _ = sdpa_attention_forward(
        attn, q, k, v, attend, dropout=0.0, scaling=attn.scaling, sliding_window=attn.sliding_window
    )
    out = out.reshape(*x.shape[:-1], -1).contiguous()
    hidden = residual + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
    residual = hidden
    x = layer.post_attention_layernorm.forward(hidden)
    mlp = layer.mlp
    x = F.linear(
        F.silu(F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias))
        * F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias),
        mlp.down_proj.weight,
        mlp.down_proj.bias,
    )
    return residual + x, (k, v)
