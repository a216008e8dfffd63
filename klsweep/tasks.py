"""Training tasks and their rewards: the synthetic tiny tasks (offline) and MATH (math-verify).

Tiny tasks. The warm-started tiny model (``klsweep.tinymodel``) is taught a mix of three skills by a short
SFT, stopped part of the way:

- ``add``: two-digit addition without carries, ``"12+34="`` -> ``"46"`` (1,980 problems). RL trains on it: the
  in-domain task.
- ``sub``: two-digit subtraction without borrows and with a two-digit result, ``"56-23="`` -> ``"33"`` (1,980
  problems). Out of domain.
- ``rev``: reverse a string of 3 digits, ``"rev 120="`` -> ``"021"``. Out of domain.

Why this mix: without carries and borrows every answer digit depends on two aligned operand digits only, which a
~100k-parameter model learns in a few hundred SFT steps (with carries it plateaus for thousands), so the warm
start can be stopped part of the way (see ``klsweep.tinymodel``) and RL has signal. ``add`` and ``sub`` share
their format and differ only by the operator, and ``rev`` shares the digit-copying attention: RL on ``add`` alone
may drift from the warm-started reference and forget ``sub`` and ``rev`` (e.g. start adding on ``sub``
prompts); a KL penalty to the reference should limit that, which is what the out-of-domain suite measures. Each skill's problems are
split once, by a fixed permutation that no run seed changes, into a ``train`` pool (SFT and RL) and a disjoint
``eval`` pool (lm-eval data written by ``write_eval_data``).

Prompts are conversational (a list of ``{"role", "content"}`` messages) for a model trained with its chat
template (``model.chat_template``): TRL's GRPOTrainer applies the template, as lm-eval's ``apply_chat_template``
does with ``question``. Without it (a base model) a prompt is the plain text the eval task shows the model
(the system prompt, a blank line, the user's text). The answer is what the model writes before an end token.
Training prompts longer than ``train.max_prompt_length`` tokens (as the model sees them) are dropped
(``drop_long_prompts``).

MATH. ``load_train_dataset`` reads the MATH training set from the hub (``DigitalLearningGmbH/MATH-lighteval``
by default, or ``EleutherAI/hendrycks_math``, whose seven subject configs are concatenated) or from a local
``.jsonl``/``.json``/``.parquet`` file with the columns ``problem`` and ``solution`` (``level`` and ``type``
are kept when present). The reward is ``math_correct``, the one check the MATH-500 eval task calls too.

The final answer (the one rule of training and eval): the completion is cut at the first stop sequence
(``MATH_STOP_SEQUENCES``: the end of the answer for a base model, which goes on with an invented next problem;
the eval task's ``until`` holds them, and the reward cuts TRL's completions the same way), and its last
``\\boxed{}`` is the answer. No box, no credit: "so far 2+2=4 and then" scores 0 against 4. A percent sign is
dropped from both answers before math-verify compares them (math-verify matches ``10\\%`` only to itself): gold
``10\\%`` accepts 10 and ``10\\%``, not 0.1 (MATH writes percentages as percent numbers).
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.errors import Problem, UserError, not_loaded

if TYPE_CHECKING:
    import datasets

    from klsweep.config import TaskSection

SKILLS: tuple[str, ...] = ("add", "sub", "rev")
IN_DOMAIN_SKILL = "add"
EVAL_SIZE = 150  # problems per skill in each lm-eval jsonl file
# Fraction of each skill's problems reserved for evaluation (never used for SFT or RL).
_EVAL_FRACTION = 0.2
_SPLIT_SEED = 20251226  # fixes the train/eval partition for good; not a run seed
_STOP_STRINGS = ("<|im_end|>", "<|endoftext|>", "<|im_start|>", "\n")

MATH_DEFAULT_DATASET = "DigitalLearningGmbH/MATH-lighteval"
_HENDRYCKS = "EleutherAI/hendrycks_math"
_HENDRYCKS_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# Where a MATH answer ends for a base model (plain-text prompts), as in lm-eval's minerva_math500: the model goes
# on with a problem of its own. The MATH-500 task's ``until`` holds these (tests/integration/test_scores.py checks it).
MATH_STOP_SEQUENCES: tuple[str, ...] = ("Problem:",)
# Where a tiny answer ends for a plain-text prompt: the tiny eval tasks' ``until`` besides the end tokens.
TINY_STOP_SEQUENCES: tuple[str, ...] = ("\n",)
# The end tokens of the paper's and the tiny model's tokenizers as text, first in every eval task's ``until``:
# a base model may write another model family's end token (Qwen2.5's <|im_end|>) where its own would end it.
END_TOKENS: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")


# ---------------------------------------------------------------------------------------------- tiny tasks


def _skill_problems(skill: str) -> list[tuple[str, str]]:
    """Every (question, answer) of a skill, in a fixed order."""
    two_digit = range(10, 100)
    if skill == "add":  # no carry: the sum's digits are the digit-wise sums (always two digits)
        return [
            (f"{a}+{b}=", str(a + b))
            for a in two_digit
            for b in two_digit
            if a // 10 + b // 10 <= 9 and a % 10 + b % 10 <= 9
        ]
    if skill == "sub":  # no borrow, two-digit result: the digit-wise differences
        return [
            (f"{a}-{b}=", str(a - b))
            for a in two_digit
            for b in two_digit
            if a // 10 > b // 10 and a % 10 >= b % 10
        ]
    if skill == "rev":
        digits = [f"{i:03d}" for i in range(1000)]
        return [(f"rev {d}=", d[::-1]) for d in digits]
    raise UserError(Problem("skill", f"unknown tiny skill {skill!r}", ", ".join(SKILLS)))


def _split_pool(skill: str, split: str) -> list[tuple[str, str]]:
    if split not in ("train", "eval"):
        raise UserError(Problem("split", f"unknown split {split!r}", "train, eval"))
    problems = _skill_problems(skill)
    order = list(range(len(problems)))
    random.Random(f"{_SPLIT_SEED}-{skill}").shuffle(order)
    n_eval = int(len(problems) * _EVAL_FRACTION)
    chosen = order[:n_eval] if split == "eval" else order[n_eval:]
    return [problems[i] for i in sorted(chosen)]


def chat_prompt_text(question: str, system_prompt: str | None = None) -> str:
    """The exact text the tiny model sees for ``question`` under its ChatML template, ready for generation."""
    system = f"<|im_start|>system\n{system_prompt}<|im_end|>\n" if system_prompt else ""
    return f"{system}<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def tiny_problems(skill: str, split: str, n: int | None, seed: int) -> list[dict[str, str]]:
    """``n`` distinct problems of ``skill`` from ``split`` ("train" or "eval"), drawn with ``seed``
    (``n=None``: the whole pool, shuffled). Rows: ``{"skill", "question", "answer", "prompt"}``."""
    pool = _split_pool(skill, split)
    if n is not None and not 0 <= n <= len(pool):
        raise UserError(Problem("n", f"{n} problems asked of {skill}/{split}", f"0..{len(pool)}"))
    rows = random.Random(seed).sample(pool, len(pool) if n is None else n)
    return [{"skill": skill, "question": q, "answer": a, "prompt": chat_prompt_text(q)} for q, a in rows]


def write_eval_data(folder: Path) -> dict[str, Path]:
    """Write one lm-eval jsonl file per skill, ``folder/tiny_<skill>.jsonl`` (``EVAL_SIZE`` held-out problems,
    deterministic), and return ``{"tiny_<skill>": path}``. ``tiny_add`` is in domain, the others out of domain.
    Each line: ``{"question", "answer", "prompt"}``, where ``prompt`` is the chat-templated text."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for skill in SKILLS:
        path = folder / f"tiny_{skill}.jsonl"
        rows = tiny_problems(skill, "eval", EVAL_SIZE, seed=0)
        lines = [json.dumps({k: r[k] for k in ("question", "answer", "prompt")}) for r in rows]
        path.write_text("\n".join(lines) + "\n")
        out[f"tiny_{skill}"] = path
    return out


def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string (standard format) or a list of messages (conversational)."""
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] for m in completion if m.get("role", "assistant") == "assistant")


def extract_tiny_answer(text: str) -> str:
    """The tiny model's answer: the text before the first end token or newline, stripped."""
    for stop in _STOP_STRINGS:
        text = text.split(stop, 1)[0]
    return text.strip()


def tiny_reward(prompts: list, completions: list, answer: list[str], **kwargs: Any) -> list[float]:
    """TRL reward: 1.0 when the completion's answer equals ``answer`` exactly, else 0.0."""
    return [
        float(extract_tiny_answer(completion_text(c)) == a) for c, a in zip(completions, answer, strict=True)
    ]


# ---------------------------------------------------------------------------------------------- MATH


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces matched; None if absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    rest = text[i:]
    if rest.startswith(" ") and not rest.lstrip().startswith("{"):  # "\boxed 5"
        token = rest.lstrip().split("$", 1)[0].split()
        return token[0] if token else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for j, ch in enumerate(rest):
        depth += (ch == "{") - (ch == "}")
        if depth == 0:
            return rest[1:j]
    return None


def _math_verify_kwargs() -> dict[str, Any]:
    # math-verify's timeouts use signal.alarm, which only works in the main thread.
    main = threading.current_thread() is threading.main_thread()
    return {
        "parse": {"parsing_timeout": 5 if main else None},
        "verify": {"timeout_seconds": 5 if main else None},
    }


def final_answer(completion: str, stops: tuple[str, ...] = MATH_STOP_SEQUENCES) -> str | None:
    """The completion's final answer: the content of its last ``\\boxed{}`` once cut at the first of ``stops``;
    None when it has none (the rule in this module's docstring)."""
    for stop in stops:
        completion = completion.split(stop, 1)[0]
    return last_boxed(completion)


def _without_percent(answer: str) -> str:
    text = answer.strip()
    for sign in ("\\%", "%"):
        if text.endswith(sign):
            return text[: -len(sign)].strip()
    return text


def math_correct(completion: str, answer: str) -> bool:
    """Whether the completion's final answer (``final_answer``) is equivalent to the gold ``answer`` (the content
    of the solution's last box, e.g. ``\\frac{1}{2}``) by math-verify: the MATH reward and the MATH-500 score."""
    from math_verify import parse, verify

    boxed = final_answer(completion)
    if boxed is None:
        return False
    kw = _math_verify_kwargs()
    gold = parse(f"\\boxed{{{_without_percent(answer)}}}", **kw["parse"])
    pred = parse(f"\\boxed{{{_without_percent(boxed)}}}", **kw["parse"])
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, **kw["verify"]))


def math_reward(prompts: list, completions: list, answer: list[str], **kwargs: Any) -> list[float]:
    """TRL reward: 1.0 when math-verify finds the completion's answer equivalent to ``answer``, else 0.0."""
    return [float(math_correct(completion_text(c), a)) for c, a in zip(completions, answer, strict=True)]


def _load_math_raw(dataset: str, split: str) -> datasets.Dataset:
    import datasets

    path = Path(dataset).expanduser()
    suffix = "".join(path.suffixes[-1:]).lower()
    if path.exists() or suffix in (".jsonl", ".json", ".parquet"):
        if not path.is_file():
            raise UserError(
                Problem("task.dataset", f"no such file: {path}", "a hub id or a .jsonl/.json/.parquet file")
            )
        builders = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
        if suffix not in builders:
            raise UserError(
                Problem("task.dataset", f"unsupported file type {suffix!r}", ".jsonl, .json, .parquet")
            )
        return datasets.load_dataset(builders[suffix], data_files=str(path), split="train")
    try:
        parts = [datasets.load_dataset(dataset, sub, split=split) for sub in math_configs(dataset)]
    except Exception as e:  # not cached offline, no network, gated: name the dataset in the run's reason
        raise not_loaded(f"training set {dataset} (split {split})", e) from e
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def math_configs(dataset: str) -> list[str | None]:
    """The hub configs of a MATH training set that are read (concatenated): Hendrycks' seven subjects, or the
    default one."""
    return list(_HENDRYCKS_SUBJECTS) if dataset == _HENDRYCKS else [None]


def _math_dataset(task: TaskSection, chat_template: bool) -> datasets.Dataset:
    raw = _load_math_raw(task.dataset or MATH_DEFAULT_DATASET, task.split)
    missing = [c for c in ("problem", "solution") if c not in raw.column_names]
    if missing:
        raise UserError(
            Problem(
                "task.dataset",
                f"{task.dataset or MATH_DEFAULT_DATASET} lacks column(s) {missing}",
                "MATH schema: problem, solution, level, type",
            )
        )
    raw = raw.map(lambda row: {"answer": last_boxed(row["solution"])})
    raw = raw.filter(lambda row: row["answer"] is not None)

    return raw.map(
        lambda row: {"prompt": _prompt(f"{row['problem']}\n\n{MATH_INSTRUCTION}", task, chat_template)}
    )


def _prompt(text: str, task: TaskSection, chat_template: bool) -> list[dict[str, str]] | str:
    """A training prompt: chat messages (the trainer applies the template) or the plain text."""
    if not chat_template:
        return f"{task.system_prompt}\n\n{text}" if task.system_prompt else text
    messages = [{"role": "user", "content": text}]
    if task.system_prompt:
        messages.insert(0, {"role": "system", "content": task.system_prompt})
    return messages


def _tiny_dataset(task: TaskSection, chat_template: bool) -> datasets.Dataset:
    import datasets

    rows = tiny_problems(IN_DOMAIN_SKILL, "train", None, seed=0)
    return datasets.Dataset.from_dict(
        {
            "prompt": [_prompt(r["question"], task, chat_template) for r in rows],
            "answer": [r["answer"] for r in rows],
            "question": [r["question"] for r in rows],
            "skill": [r["skill"] for r in rows],
        }
    )


def load_train_dataset(task: TaskSection, seed: int, chat_template: bool = True) -> datasets.Dataset:
    """The RL training prompts of ``task``, shuffled with ``seed`` and capped at ``task.num_train``.
    Columns: ``prompt`` (conversational messages, or plain text without ``chat_template``), ``answer`` (the
    reference final answer), and per task ``question``/``skill`` (tiny) or ``problem``/``solution``/``level``/
    ``type`` (MATH)."""
    if task.name == "tiny":
        ds = _tiny_dataset(task, chat_template)
    elif task.name == "math":
        ds = _math_dataset(task, chat_template)
    else:
        raise UserError(Problem("task.name", f"unknown task {task.name!r}", "tiny, math"))
    ds = ds.shuffle(seed=seed)
    if task.num_train is not None:
        ds = ds.select(range(min(task.num_train, len(ds))))
    return ds


def drop_long_prompts(ds: datasets.Dataset, tokenizer: Any, max_length: int) -> tuple[datasets.Dataset, int]:
    """``ds`` without the prompts longer than ``max_length`` tokens as the model sees them (chat messages with
    the template and the generation prompt applied, as TRL does), and how many were dropped. ``UserError`` when
    none is left."""

    def lengths(batch: dict[str, list]) -> dict[str, list[int]]:
        prompts = batch["prompt"]  # tokenized as TRL's GRPOTrainer._tokenize_prompts does
        if prompts and not isinstance(prompts[0], str):
            ids = tokenizer.apply_chat_template(
                conversation=prompts, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        else:
            ids = tokenizer(text=prompts)["input_ids"]
        return {"_length": [len(x) for x in ids]}

    measured = ds.map(lengths, batched=True, batch_size=256)
    kept = measured.filter(lambda n: n <= max_length, input_columns="_length", batched=False)
    if len(kept) == 0:
        raise UserError(
            Problem(
                "train.max_prompt_length",
                f"every one of the {len(ds)} training prompts is longer than {max_length} tokens",
                f"at least {min(measured['_length'])}",
            )
        )
    return kept.remove_columns("_length"), len(ds) - len(kept)


def stop_sequences(task: TaskSection) -> tuple[str, ...]:
    """Where an answer to a plain-text prompt (a base model's) ends besides the tokenizer's end token id: the
    eval task's ``until`` (its end tokens as text and the task's own), which training generation stops at too
    (``KLGRPOTrainer``'s ``stop_sequences``)."""
    if task.name == "tiny":
        return END_TOKENS + TINY_STOP_SEQUENCES
    if task.name == "math":
        return END_TOKENS + MATH_STOP_SEQUENCES
    raise UserError(Problem("task.name", f"unknown task {task.name!r}", "tiny, math"))


def reward_function(task: TaskSection) -> Callable[..., list[float]]:
    """The TRL reward function of ``task``: ``f(prompts, completions, answer, **kwargs) -> list[float]``."""
    if task.name == "tiny":
        return tiny_reward
    if task.name == "math":
        return math_reward
    raise UserError(Problem("task.name", f"unknown task {task.name!r}", "tiny, math"))
