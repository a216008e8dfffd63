"""How a run is launched: its model's architecture (``Arch``, from the model's config or the tiny spec), its
processes, and its batch split onto TRL (``batch_shape``: also how ``klsweep.job`` maps a run's batch)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.config import tasks_per_node
from klsweep.errors import Problem, UserError

if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass(frozen=True)
class Arch:
    """The numbers of a dense decoder (Llama/Qwen family: GQA attention, SwiGLU MLP) the estimate needs. Its
    parameter count leaves out biases (Qwen2's q/k/v: 0.01% of a 7B model)."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h = self.hidden_size
        attention = 2 * h * self.q_dim + 2 * h * self.kv_dim  # q, o; k, v
        return attention + 3 * h * self.intermediate_size + 2 * h  # gate, up, down; two norms

    @property
    def embedding_params(self) -> int:
        """The input embedding, the LM head unless tied, the final norm: FSDP's root unit."""
        heads = 1 if self.tie_word_embeddings else 2
        return heads * self.vocab_size * self.hidden_size + self.hidden_size

    @property
    def params(self) -> int:
        return self.num_hidden_layers * self.layer_params + self.embedding_params


ARCH_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "vocab_size",
    "num_attention_heads",
    "num_key_value_heads",
)


def _numbers(model: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The numbers of a run's ``model`` section's architecture: the tiny model's spec, a local path's
    ``config.json`` (its ``text_config`` for a multimodal one), else the section's ``arch``; None when a
    ``config.json`` is there but is no JSON object (the model's own loading says what is wrong with it)."""
    if model.get("path") == "tiny":
        from dataclasses import asdict

        from klsweep.tinymodel import TinySpec

        return {**asdict(TinySpec()), "tie_word_embeddings": True}
    config_json = Path(str(model.get("path", ""))).expanduser() / "config.json"
    if not config_json.is_file():
        return model.get("arch") or {}
    try:
        data = json.loads(config_json.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return data.get("text_config", data) if "hidden_size" not in data else data


def architecture(model: Mapping[str, Any]) -> Arch | None:
    """The architecture of a run's ``model`` section: the tiny model's spec, a local path's ``config.json``, else
    the section's ``arch`` numbers; None when none of them gives every number (or a number is not one: the
    model's own loading says what is wrong with it). Nothing is downloaded."""
    numbers = _numbers(model)
    if numbers is None or any(numbers.get(k) is None for k in ARCH_KEYS):
        return None
    try:
        n = {k: int(numbers[k]) for k in ARCH_KEYS}
        head_dim = int(numbers.get("head_dim") or n["hidden_size"] // n["num_attention_heads"])
    except (TypeError, ValueError, ZeroDivisionError):  # not numbers: loading the model says what is wrong
        return None
    return Arch(**n, head_dim=head_dim, tie_word_embeddings=bool(numbers.get("tie_word_embeddings", False)))


def model_type(model: Mapping[str, Any]) -> str | None:
    """The ``model_type`` of a run's ``model`` section, read where ``architecture`` reads its numbers (the tiny
    model: qwen2; a local path: its ``config.json``; else ``model.arch.model_type``); None when unknown.
    Nothing is downloaded, nothing imported."""
    if model.get("path") == "tiny":
        return "qwen2"  # klsweep.tinymodel builds a Qwen2ForCausalLM
    config_json = Path(str(model.get("path", ""))).expanduser() / "config.json"
    if config_json.is_file():
        try:
            data = json.loads(config_json.read_text())
        except (OSError, ValueError):
            return None
        kind = data.get("model_type") if isinstance(data, dict) else None
        return kind if isinstance(kind, str) else None
    kind = (model.get("arch") or {}).get("model_type")
    return kind if isinstance(kind, str) else None


# RoPE scalings whose max_position_embeddings is the scaled context already: vLLM applies no factor to them
# (vllm/config/model.py, _get_and_verify_max_len)
_SCALED_ALREADY = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def context_length(model: Mapping[str, Any]) -> tuple[int, str] | None:
    """The longest context vLLM accepts for a run's model (read where ``architecture`` reads its numbers), as
    (tokens, how it follows from the config): ``max_position_embeddings``, times the RoPE scaling's ``factor``
    where vLLM applies it; None when the numbers do not say."""
    numbers = _numbers(model)
    if numbers is None:
        return None
    try:
        longest = int(numbers["max_position_embeddings"])
    except (KeyError, TypeError, ValueError):
        return None
    how = f"max_position_embeddings {longest}"
    rope = numbers.get("rope_scaling") or numbers.get("rope_parameters")
    if isinstance(rope, dict):
        kind = rope.get("rope_type", rope.get("type"))
        factor = rope.get("factor")
        if kind not in _SCALED_ALREADY and isinstance(factor, int | float) and factor > 0:
            how += f" x RoPE factor {factor:g}"
            longest = int(longest * factor)
    return longest, how


@dataclass(frozen=True)
class BatchShape:
    """How a step's completions map onto TRL's GRPOConfig (its batch sizes count completions)."""

    completions: int  # a step's completions, all processes together
    processes: int
    per_device: int  # per_device_train_batch_size: completions per forward/backward pass
    accumulation: int  # gradient_accumulation_steps (TRL's steps_per_generation follows it)

    @property
    def per_process(self) -> int:
        return self.per_device * self.accumulation


def batch_shape(train: Mapping[str, Any], processes: int) -> BatchShape:
    """The batch split of a run's ``train`` section over ``processes``; ``UserError`` when it does not split."""
    prompts, group = int(train["prompts_per_step"]), int(train["group_size"])
    completions = prompts * group
    if completions % processes:
        raise UserError(
            Problem(
                "train.prompts_per_step",
                f"{completions} completions a step ({prompts} prompts x group_size {group}) do not split evenly "
                f"over {processes} processes",
                f"prompts_per_step x group_size a multiple of {processes} (nodes x tasks_per_node)",
            )
        )
    per_process = completions // processes
    micro = train.get("micro_batch_size") or per_process
    if per_process % micro:
        divisors = [d for d in range(1, per_process + 1) if per_process % d == 0]
        raise UserError(
            Problem(
                "train.micro_batch_size",
                f"{micro} does not divide the {per_process} completions of each process",
                f"a divisor of {per_process}: {', '.join(map(str, divisors))}, or null",
            )
        )
    return BatchShape(completions, processes, micro, per_process // micro)


def processes(config: Mapping[str, Any]) -> int:
    """The training processes of a run: nodes x tasks per node."""
    res = config["model"]["resources"]
    return int(res.get("nodes", 1)) * tasks_per_node(res)
