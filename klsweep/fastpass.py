"""klsweep's lean log-prob pass (``train.numerics: fast``): the per-token log-probs (and entropies) of a GRPO
batch's completions under a Qwen2 causal LM, by fewer and smaller operations than TRL's forward with its fused
LM head, the same quantities within float rounding (not bit for bit: a different stream of numbers).

TRL's pass runs the whole batch, ``B`` rows of prompt and completion, through the model and, on a CPU, its
chunked LM head over every position. Here:

- the prompt is computed once per distinct prompt row (a GRPO group's completions share theirs): its keys and
  values in every layer, and its last position's hidden state, from ``U`` rows instead of ``B``;
- the completions' tokens (all but the last: its successor is not scored) attend to their group's prompt keys
  and values, by the same masks (``sdpa_mask``: the prompt's left padding, the completion's right padding, causal)
  and the same attention function, rotary embedding and positions (``arange``, as TRL's forward gives them);
- the LM head projects only the completion positions, and the log-probs are a plain ``log_softmax`` and
  ``gather`` (the entropy from the same log-softmax, without gradient when none is asked).

Gradients flow into the weights as through TRL's forward (the prompt rows' keys and values gather their
completions' gradients). ``tests/unit/test_fastpass.py`` checks the values and gradients against TRL's pass
within float32 rounding. Where it does not apply (``unsupported``) the trainer runs TRL's.
"""

from __future__ import annotations

from typing import Any

from klsweep import fastgen


def unsupported(model: Any) -> str | None:
    """Why the lean pass does not apply to ``model``, or None: the lean forward's conditions
    (``fastgen.lean_unsupported``), an LM head of no scaling or softcap."""
    if (why := fastgen.lean_unsupported(model)) is not None:
        return why
    config = model.config.get_text_config()
    for key in ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier"):
        if getattr(config, key, None) not in (None, 1.0):
            return f"{key} {getattr(config, key)}"
    if getattr(config, "logits_scaling", None) not in (None, 1.0):
        return f"logits_scaling {config.logits_scaling}"
    return None


def logps(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    logits_to_keep: int,
    temperature: float = 1.0,
    entropy: bool = False,
) -> tuple[Any, Any]:
    """Per-token log-probs of the last ``logits_to_keep`` tokens of each row of ``input_ids`` (prompt left-padded,
    completion right-padded, ``attention_mask`` 0 on padding), and their entropies (None unless ``entropy``):
    TRL's ``_get_per_token_logps_and_entropies`` of a causal LM (0 where the mask is 0), by the lean pass."""
    import torch

    body = model.model
    rows, length = input_ids.shape
    keep = logits_to_keep
    width = length - keep  # the prompt's width (left-padded to the batch's longest)
    firsts, inverse = fastgen.distinct_rows(input_ids[:, :width], attention_mask[:, :width])
    prompt_ids = input_ids[:, :width].index_select(0, firsts)
    prompt_mask = attention_mask[:, :width].index_select(0, firsts)
    layers = body.layers[: body.config.num_hidden_layers]

    # the prompts, once each
    hidden = body.embed_tokens(prompt_ids)
    positions = torch.arange(width, device=input_ids.device).unsqueeze(0)
    cos, sin = body.rotary_emb(hidden, positions)
    attend = fastgen.causal_mask(len(firsts), width, 0, prompt_mask, input_ids.device)
    past = []
    for layer in layers:
        hidden, own = fastgen.lean_layer(layer, hidden, cos, sin, attend, None)
        past.append((own[0].index_select(0, inverse), own[1].index_select(0, inverse)))
    last = hidden[:, -1:].index_select(0, inverse)  # the prompt's last position: scores the first token

    # the completions' tokens but the last, attending to their prompt's keys and values
    if keep > 1:
        tokens = input_ids[:, width : length - 1]
        hidden = body.embed_tokens(tokens)
        positions = torch.arange(width, length - 1, device=input_ids.device).unsqueeze(0)
        cos, sin = body.rotary_emb(hidden, positions)
        attend = fastgen.causal_mask(rows, keep - 1, width, attention_mask[:, : length - 1], input_ids.device)
        for layer, before in zip(layers, past, strict=True):
            hidden, _ = fastgen.lean_layer(layer, hidden, cos, sin, attend, before)
        hidden = torch.cat([last, hidden], dim=1)
    else:
        hidden = last
    hidden = body.norm(hidden)
    head = model.get_output_embeddings()
    logits = torch.nn.functional.linear(hidden, head.weight, head.bias)
    if temperature != 1.0:
        logits = logits / temperature
    log_softmax = logits.float().log_softmax(-1)
    targets = input_ids[:, width:]
    scored = attention_mask[:, width:] == 1
    out = log_softmax.gather(-1, targets.unsqueeze(-1)).squeeze(-1).masked_fill(~scored, 0)
    entropies = None
    if entropy:
        entropies = (-(log_softmax.exp() * log_softmax).sum(-1)).masked_fill(~scored, 0)
    return out, entropies
