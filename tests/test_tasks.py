"""Tiny tasks (splits, eval data, reward) and the MATH loader and math-verify reward, on local fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klsweep import tasks
from klsweep.config import TaskSection
from klsweep.errors import UserError

FIXTURE = Path(__file__).parent / "fixtures" / "math_train.jsonl"


@pytest.mark.parametrize("skill", tasks.SKILLS)
def test_train_and_eval_pools_are_disjoint_and_answers_right(skill: str) -> None:
    train = tasks.tiny_problems(skill, "train", None, seed=0)
    held_out = tasks.tiny_problems(skill, "eval", None, seed=0)
    assert len(held_out) >= tasks.EVAL_SIZE
    assert not {r["question"] for r in train} & {r["question"] for r in held_out}
    for row in train[:50] + held_out[:50]:
        q = row["question"].removesuffix("=")
        expected = q[4:][::-1] if skill == "rev" else str(eval(q))
        assert row["answer"] == expected


def test_add_and_sub_have_no_carries_or_borrows() -> None:
    for skill, op in (("add", "+"), ("sub", "-")):
        rows = tasks.tiny_problems(skill, "train", None, seed=0) + tasks.tiny_problems(skill, "eval", None, 0)
        assert len(rows) == 1980
        for row in rows:
            a, b = row["question"].removesuffix("=").split(op)
            assert len(a) == len(b) == len(row["answer"]) == 2
            digitwise = [int(x) + int(y) if op == "+" else int(x) - int(y) for x, y in zip(a, b, strict=True)]
            assert "".join(map(str, digitwise)) == row["answer"]


def test_tiny_problems_depend_on_seed_not_on_the_split() -> None:
    a = tasks.tiny_problems("add", "eval", 20, seed=1)
    assert a == tasks.tiny_problems("add", "eval", 20, seed=1)
    assert a != tasks.tiny_problems("add", "eval", 20, seed=2)
    assert {r["question"] for r in tasks.tiny_problems("add", "eval", None, seed=2)} == {
        r["question"] for r in tasks.tiny_problems("add", "eval", None, seed=1)
    }
    with pytest.raises(UserError, match="problems asked"):
        tasks.tiny_problems("add", "eval", 10**6, seed=0)
    with pytest.raises(UserError, match="unknown tiny skill"):
        tasks.tiny_problems("mul", "eval", 1, seed=0)


def test_write_eval_data_is_deterministic_and_held_out(tmp_path: Path) -> None:
    first = tasks.write_eval_data(tmp_path / "a")
    second = tasks.write_eval_data(tmp_path / "b")
    assert sorted(first) == ["tiny_add", "tiny_rev", "tiny_sub"]
    for name, path in first.items():
        assert path.name == f"{name}.jsonl"
        assert path.read_bytes() == second[name].read_bytes()
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(rows) == tasks.EVAL_SIZE
        assert set(rows[0]) == {"question", "answer", "prompt"}
        assert (
            rows[0]["prompt"] == f"<|im_start|>user\n{rows[0]['question']}<|im_end|>\n<|im_start|>assistant\n"
        )
    train = {r["question"] for r in tasks.load_train_dataset(TaskSection(name="tiny"), seed=0)}
    held_out = {json.loads(line)["question"] for line in first["tiny_add"].read_text().splitlines()}
    assert not train & held_out


def test_tiny_train_dataset() -> None:
    ds = tasks.load_train_dataset(TaskSection(name="tiny"), seed=3)
    assert {"prompt", "answer"} <= set(ds.column_names)
    assert set(ds["skill"]) == {"add"}
    assert ds[0]["prompt"] == [{"role": "user", "content": ds[0]["question"]}]
    assert ds["question"] != tasks.load_train_dataset(TaskSection(name="tiny"), seed=4)["question"]
    capped = tasks.load_train_dataset(TaskSection(name="tiny", num_train=10, system_prompt="Add."), seed=3)
    assert len(capped) == 10
    assert capped[0]["prompt"][0] == {"role": "system", "content": "Add."}
    with pytest.raises(UserError, match="unknown task"):
        tasks.load_train_dataset(TaskSection(name="gsm8k"), seed=0)


def test_plain_text_prompts_without_a_chat_template() -> None:
    """A base model (model.chat_template false) trains on the text the eval task shows it."""
    ds = tasks.load_train_dataset(TaskSection(name="tiny"), seed=3, chat_template=False)
    assert ds[0]["prompt"] == ds[0]["question"]
    ds = tasks.load_train_dataset(TaskSection(name="math", dataset=str(FIXTURE)), seed=0, chat_template=False)
    assert ds[0]["prompt"] == f"{ds[0]['problem']}\n\n{tasks.MATH_INSTRUCTION}"
    task = TaskSection(name="tiny", system_prompt="Add.")
    assert tasks.load_train_dataset(task, seed=3, chat_template=False)[0]["prompt"].startswith("Add.\n\n")


@pytest.mark.parametrize("chat_template", [True, False])
def test_drop_long_prompts_counts_tokens_as_the_trainer_does(tmp_path: Path, chat_template: bool) -> None:
    from transformers import AutoTokenizer

    from klsweep.tinymodel import random_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(random_tiny_model(tmp_path / "m"))
    ds = tasks.load_train_dataset(TaskSection(name="math", dataset=str(FIXTURE)), 0, chat_template)

    def length(prompt) -> int:  # one prompt at a time, as TRL's GRPOTrainer._tokenize_prompts renders it
        if isinstance(prompt, str):
            return len(tokenizer(text=prompt)["input_ids"])
        return len(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])  # fmt: skip

    lengths = sorted(length(p) for p in ds["prompt"])
    assert lengths[0] < lengths[-1]
    limit = lengths[len(lengths) // 2]
    kept, dropped = tasks.drop_long_prompts(ds, tokenizer, limit)
    assert dropped == sum(n > limit for n in lengths) > 0
    assert len(kept) == len(ds) - dropped and kept.column_names == ds.column_names
    assert all(length(p) <= limit for p in kept["prompt"])
    with pytest.raises(UserError, match=f"train.max_prompt_length.*at least {lengths[0]}"):
        tasks.drop_long_prompts(ds, tokenizer, lengths[0] - 1)


def test_tiny_reward_exact_match_on_both_completion_formats() -> None:
    reward = tasks.reward_function(TaskSection(name="tiny"))
    assert reward.__name__ == "tiny_reward"
    completions = ["46", "46<|im_end|>", " 46\n12", "4", "460", "", "x46"]
    assert reward(prompts=[""] * 7, completions=completions, answer=["46"] * 7) == [1, 1, 1, 0, 0, 0, 0]
    chat = [[{"role": "assistant", "content": "46"}], [{"role": "assistant", "content": "47"}]]
    assert reward(prompts=[[], []], completions=chat, answer=["46", "46"]) == [1.0, 0.0]


def test_last_boxed() -> None:
    assert tasks.last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert tasks.last_boxed("$\\boxed 5$") == "5"
    assert tasks.last_boxed("\\fbox{x^{2}}") == "x^{2}"
    assert tasks.last_boxed("no box") is None
    assert tasks.last_boxed("\\boxed{unclosed") is None


def test_math_loader_on_a_local_file() -> None:
    ds = tasks.load_train_dataset(TaskSection(name="math", dataset=str(FIXTURE)), seed=0)
    assert len(ds) == 6  # the row without a boxed answer is dropped
    assert {"prompt", "answer", "problem", "solution", "level", "type"} <= set(ds.column_names)
    row = next(r for r in ds if r["problem"].startswith("What is $\\frac{2}{4}$"))
    assert row["answer"] == "\\frac{1}{2}"
    (message,) = row["prompt"]
    assert message["role"] == "user" and message["content"].startswith(row["problem"])
    assert "\\boxed{}" in message["content"]


def test_math_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        tasks.load_train_dataset(TaskSection(name="math", dataset=str(tmp_path / "missing.jsonl")), seed=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "1+1", "answer": "2"}) + "\n")
    with pytest.raises(UserError, match="lacks column"):
        tasks.load_train_dataset(TaskSection(name="math", dataset=str(bad)), seed=0)


@pytest.mark.parametrize(
    ("completion", "gold", "correct"),
    [
        ("So the answer is $\\boxed{0.5}$.", "\\frac{1}{2}", True),
        ("\\boxed{\\frac12}", "\\frac{1}{2}", True),
        ("\\boxed{1/2}", "\\frac{1}{2}", True),
        ("\\boxed{\\sqrt{18}}", "3\\sqrt{2}", True),
        ("\\boxed{[2,\\infty)}", "[2, \\infty)", True),
        ("\\boxed{6.0}", "6", True),
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", False),
        ("\\boxed{(2,\\infty)}", "[2, \\infty)", False),
        ("First \\boxed{4}, no wait: \\boxed{5}", "4", False),
        ("I do not know.", "4", False),
        ("so far 2+2=4 and then", "4", False),  # no final answer, no credit
        ("The answer is 4.", "4", False),
        ("$\\boxed{4}$.\n\nProblem: What is 3+5?\nSolution: $\\boxed{8}$", "4", True),  # cut at the stop
        ("\\boxed{10}", "10\\%", True),  # a percent sign is dropped from both answers
        ("\\boxed{10\\%}", "10\\%", True),
        ("\\boxed{10\\%}", "10", True),
        ("\\boxed{0.1}", "10\\%", False),
    ],
)
def test_math_reward(completion: str, gold: str, correct: bool) -> None:
    reward = tasks.reward_function(TaskSection(name="math"))
    assert reward.__name__ == "math_reward"
    chat = [[{"role": "assistant", "content": completion}]]
    assert reward(prompts=[[]], completions=chat, answer=[gold]) == [float(correct)]
