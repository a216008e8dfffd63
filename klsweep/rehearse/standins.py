"""What a rehearsal swaps in, and the wires it checks on the way: a random-weight model of a run's architecture
class at a tiny size (``tiny_model``), the eval tasks pointed at the samples shipped in ``klsweep/rehearsal/``
(``rewire_tasks``), each task's prompt fields against its data (``check_prompt_fields``), the chat template and
the end token among the eval's stop sequences (``check_chat``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from klsweep.errors import Problem, UserError

SAMPLES = Path(__file__).parents[1] / "rehearsal"
TRAIN_SAMPLES = {
    "DigitalLearningGmbH/MATH-lighteval": "math_train.jsonl",
    "EleutherAI/hendrycks_math": "math_train.jsonl",
}
EVAL_SAMPLES = {  # (dataset_path, dataset_name) of an lm-eval task -> its shipped sample
    ("HuggingFaceH4/MATH-500", "default"): "math500.jsonl",
    ("HuggingFaceH4/MATH-500", None): "math500.jsonl",
    **{("cais/mmlu", f"college_{s}"): f"mmlu_college_{s}.jsonl" for s in ("physics", "chemistry", "biology")},
}
# head_dim 64: vLLM's CPU attention refuses 16 (and every paper model's is 128: any a GPU kernel takes)
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, max_position_embeddings=4096)  # fmt: skip


def tiny_model(model: dict[str, Any], folder: Path) -> tuple[Path, list[str]]:
    """A random-weight model of ``model``'s architecture class at a tiny size, saved in ``folder`` with its own
    tokenizer when the cache holds it, else the project's byte-level stand-in (ChatML template); notes saying
    which."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from klsweep import fetch, tinymodel

    if model.get("path") == "tiny":
        return tinymodel.tiny_model_path(), ["the project's tiny model"]
    need = fetch.Need("model", model["path"], model.get("revision"))
    cached = fetch.check_model(need) if not need.local else fetch.Found(need, True, model["path"])
    model_type = (model.get("arch") or {}).get("model_type")
    real_config = Path(cached.where) / "config.json" if cached.where else None
    if real_config is not None and real_config.is_file():
        model_type = json.loads(real_config.read_text()).get("model_type", model_type)
    if not model_type:
        raise UserError(
            Problem(
                "model.arch.model_type", f"unknown for {model['path']} (not cached)", "qwen2, llama, qwen3"
            )
        )
    tokenizer, notes = None, []
    if cached.where:
        try:
            tokenizer = AutoTokenizer.from_pretrained(cached.where)
            notes.append(f"{model_type}, its own tokenizer")
        except (OSError, ValueError):
            tokenizer = None
    if tokenizer is None:
        tokenizer = tinymodel.build_tokenizer()
        notes.append(f"{model_type}, byte-level stand-in tokenizer (ChatML): its own is not cached")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tie = bool((model.get("arch") or {}).get("tie_word_embeddings", True))
    config = AutoConfig.for_model(
        model_type, vocab_size=len(tokenizer), tie_word_embeddings=tie, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, **TINY,
    )  # fmt: skip
    net = AutoModelForCausalLM.from_config(config)
    net.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id
    )
    folder.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, notes


def rewire_tasks(include: Path | None, names: list[str], target: Path) -> Path:
    """A copy of the suite's task folder whose tasks read the shipped samples (``EVAL_SAMPLES``) instead of
    the hub; ``UserError`` for a task whose dataset has no sample."""
    from klsweep.fetch import task_yaml

    if include is None:
        raise UserError(
            Problem("eval.include_path", "lm-eval's own tasks have no shipped sample", "a task folder")
        )
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(include, target, ignore=shutil.ignore_patterns("__pycache__"))
    problems = []
    found = set()
    for path in sorted(target.rglob("*.yaml")):
        cfg = task_yaml(path)
        if cfg.get("task") not in names:
            continue
        found.add(cfg["task"])
        key = (cfg.get("dataset_path"), cfg.get("dataset_name"))
        if key[0] in ("json", "csv", "parquet"):
            continue
        sample = EVAL_SAMPLES.get(key)
        if sample is None:
            problems.append(
                Problem(f"eval task {cfg['task']}", f"no shipped sample of {key[0]} {key[1] or ''}")
            )
            continue
        split = cfg.get("test_split") or "test"
        lines = [
            ln
            for ln in path.read_text().splitlines()
            if not ln.startswith(("dataset_path:", "dataset_name:"))
        ]
        lines += ["dataset_path: json", "dataset_name: null",
                  f"dataset_kwargs: {{data_files: {{{split}: {json.dumps(str(SAMPLES / sample))}}}}}"]  # fmt: skip
        path.write_text("\n".join(lines) + "\n")
    if problems:
        raise UserError(problems, title="no rehearsal data")
    return target


def check_prompt_fields(folder: Path, names: list[str]) -> None:
    """Each task's ``doc_to_text`` renders on its first sample row (the fields it names are in the data)."""
    import jinja2

    from klsweep.fetch import task_yaml

    for path in sorted(folder.rglob("*.yaml")):
        cfg = task_yaml(path)
        if cfg.get("task") not in names or not isinstance(cfg.get("doc_to_text"), str):
            continue
        files = (cfg.get("dataset_kwargs") or {}).get("data_files") or {}
        data = next(iter(files.values()), None) if isinstance(files, dict) else None
        if not data or not Path(data).is_file():
            continue
        row = json.loads(Path(data).read_text().splitlines()[0])
        try:
            jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(cfg["doc_to_text"]).render(**row)
        except jinja2.TemplateError as e:
            raise UserError(
                Problem(
                    f"eval task {cfg['task']} ({path.name}): doc_to_text", str(e), f"fields {sorted(row)}"
                )
            ) from e


def check_chat(model_dir: Path, config: dict[str, Any], folder: Path, names: list[str]) -> None:
    """The tokenizer has the chat template ``model.chat_template`` asks for, and the eval tasks stop at its end
    token."""
    from transformers import AutoTokenizer

    from klsweep.fetch import task_yaml

    tok = AutoTokenizer.from_pretrained(model_dir)
    problems = []
    if config["model"].get("chat_template") and not tok.chat_template:
        problems.append(
            Problem(
                "model.chat_template",
                f"true, but the tokenizer of {config['model']['path']} has no chat template",
                "false for a base model",
            )
        )
    for path in sorted(folder.rglob("*.yaml")):
        cfg = task_yaml(path)
        if cfg.get("task") not in names:
            continue
        until = (cfg.get("generation_kwargs") or {}).get("until") or []
        if tok.eos_token and until and tok.eos_token not in until:
            problems.append(
                Problem(
                    f"eval task {cfg['task']}: generation_kwargs.until",
                    f"lacks the tokenizer's end token {tok.eos_token!r}: answers run on to max_gen_toks",
                    f"add {tok.eos_token!r}",
                )
            )
    if problems:
        raise UserError(problems, title="chat template mismatch")
