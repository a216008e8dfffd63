"""The paper suite's scores by the one rule of the final answer (klsweep.tasks' docstring), through lm-eval's own
task machinery: the shipped task YAMLs on local files of MATH-500's and MMLU's schemas, evaluated by
``klsweep.evaluate`` (an eval job's path) with a model that returns canned completions (the boundary fake: an
lm-eval LM that, as a real backend does, cuts its text at the request's ``until``). One score per task, the
same in lm-eval's own results file as in klsweep's results.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from safetensors.torch import save_file

from klsweep import evaluate as ev
from klsweep import store, tasks
from klsweep.config import EvalSection, TaskSection

PAPER = ev.TASKS_DIR / "paper"
MMLU = ("physics", "chemistry", "biology")

# (problem, reference answer, canned completion, score by the rule)
MATH500 = [
    ("What is 2+2?", "4", "2+2 = 4, so $\\boxed{4}$.\n\nProblem: What is 3+5?\nSolution: $\\boxed{8}$", 1),
    ("What is 2+2, again?", "4", "so far 2+2=4 and then", 0),
    ("A 10 percent rate, as a percent?", "10\\%", "The rate is \\boxed{10}.", 1),
    ("The same rate, written with its sign?", "10\\%", "The rate is \\boxed{10\\%}.", 1),
    ("Half of one?", "\\frac{1}{2}", "It is \\boxed{\\frac12}.", 1),
    ("Three plus one?", "4", "First \\boxed{4}, no wait: \\boxed{3}", 0),
]
# subject -> [(question, answer index, canned completion, score by the rule)]
MMLU_DOCS = {
    "physics": [
        ("Which is a vector?", 1, "Speed has no direction. The answer is (B).", 1),
        ("Which is a scalar?", 3, "Energy has no direction: $\\boxed{\\textbf{D}}$", 1),
        ("Unit of force?", 2, "I first thought \\boxed{C} but on reflection \\boxed{A}", 0),
        ("Unit of energy?", 2, "Joules, so \\textbf{C} is right.", 1),
        ("Unit of power?", 2, "Watts: \\boxed{C}\n\nQuestion: Unit of charge?\nA. Coulomb\n\\boxed{A}", 1),
    ],
    "chemistry": [
        ("Lightest element?", 0, "The answer is a bit unclear to me.", 0),
        ("Noble gas?", 1, "Helium \\boxed{\\text{(B)}}", 1),
    ],
    "biology": [
        ("Powerhouse of the cell?", 2, "The mitochondrion: \\boxed{C. mitochondrion}", 1),
        ("Carrier of heredity?", 0, "DNA \\boxed{Adenine}", 0),  # a word, not a letter
        ("Site of photosynthesis?", 1, "Chloroplasts.\n\n**Answer: B**", 1),
        ("Site of protein synthesis?", 3, "Ribosomes, so\n\nAnswer: (D)", 1),
        ("Unit of life?", 1, "The cell. Final answer: B", 1),
        ("Basic unit of heredity?", 0, "Genes; answer choices B and C are wrong. Answer: A is it", 1),
    ],
}
CANNED = {q: c for q, _, c, _ in MATH500} | {q: c for docs in MMLU_DOCS.values() for q, _, c, _ in docs}


def canned_lm_class() -> type:
    """An lm-eval LM whose completion of a prompt is the canned one of the question it holds, cut at the
    request's ``until`` (as the hf and vllm backends cut theirs)."""
    from lm_eval.api.model import LM

    class CannedLM(LM):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__()

        def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
            out = []
            for request in requests:
                context, gen_kwargs = request.args
                (text,) = [c for q, c in CANNED.items() if q in context]
                for stop in gen_kwargs.get("until", []):
                    text = text.split(stop, 1)[0]
                out.append(text)
            return out

        def loglikelihood(self, requests: list, disable_tqdm: bool = False) -> list:
            raise NotImplementedError

        def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list:
            raise NotImplementedError

    return CannedLM


@pytest.fixture
def local_paper_tasks(tmp_path: Path) -> Path:
    """A task folder whose tasks are the shipped ones (``include``) on local data files of the real schemas,
    named relative to the folder as a user's own task folder does (klsweep.evaluate makes them absolute)."""
    import datasets

    folder = tmp_path / "tasks"
    folder.mkdir()
    rows = [
        {
            "problem": p,
            "solution": f"... so the answer is $\\boxed{{{a}}}$.",
            "answer": a,
            "subject": "Prealgebra",
            "level": 1,
            "unique_id": f"test/prealgebra/{i}.json",
        }
        for i, (p, a, _, _) in enumerate(MATH500)
    ]
    (folder / "math500.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = {
        "include": str(PAPER / "klsweep_math500.yaml"),
        "task": "klsweep_math500",
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"test": "math500.jsonl"}},
    }
    (folder / "klsweep_math500.yaml").write_text(json.dumps(task))
    for subject, docs in MMLU_DOCS.items():
        rows = [
            {"question": q, "subject": f"college_{subject}", "choices": ["w", "x", "y", "z"], "answer": a}
            for q, a, _, _ in docs
        ]
        datasets.Dataset.from_list(rows).to_parquet(str(folder / f"mmlu_{subject}.parquet"))
        task = {
            "include": str(PAPER / f"klsweep_mmlu_college_{subject}.yaml"),
            "task": f"klsweep_mmlu_college_{subject}",
            "dataset_path": "parquet",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {"test": f"mmlu_{subject}.parquet"}},
        }
        (folder / f"klsweep_mmlu_college_{subject}.yaml").write_text(json.dumps(task))
    return folder


def _run_folder(root: Path) -> Path:
    """A done run of a base model (plain-text prompts) with one checkpoint."""
    run = root / "sweep" / "run0"
    (run / store.CHECKPOINTS_DIR / "checkpoint-10").mkdir(parents=True)
    (run / store.CHECKPOINTS_DIR / "checkpoint-10" / "config.json").write_text("{}")
    # weights eval would load (store.has_weights); the canned completions never read them
    save_file({}, run / store.CHECKPOINTS_DIR / "checkpoint-10" / "model.safetensors")
    config = {"name": "sweep", "model": {"name": "base", "path": "base-model", "chat_template": False}}
    store.atomic_write_text(run / store.CONFIG_FILE, OmegaConf.to_yaml(OmegaConf.create(config)))
    store.write_status(run, "done", step=10)
    return run


def test_canned_completions_score_by_the_rule_through_lm_eval(
    tmp_path: Path, local_paper_tasks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lm_eval.api.registry as registry
    from lm_eval.utils import make_table

    canned = canned_lm_class()
    real = registry.get_model
    monkeypatch.setattr(registry, "get_model", lambda name: canned if name == "hf" else real(name))
    paper = ev.load_suite("paper")
    cfg = EvalSection(
        suite="paper-local",
        in_domain=paper.in_domain,
        ood=paper.ood,
        include_path=str(local_paper_tasks),
        max_gen_toks=64,
        backend="hf",
    )
    run = _run_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    (path,) = ev.eval_run(run, cfg)
    ours = json.loads(path.read_text())

    expected = {"klsweep_math500": sum(s for *_, s in MATH500) / len(MATH500)}
    for subject, docs in MMLU_DOCS.items():
        expected[f"klsweep_mmlu_college_{subject}"] = sum(s for *_, s in docs) / len(docs)
    assert ours["metrics"] == {
        "in_domain": {"klsweep_math500": pytest.approx(4 / 6)},
        "ood": {t: pytest.approx(v) for t, v in expected.items() if t != "klsweep_math500"},
    }
    assert ours["num_problems"] == {
        "klsweep_math500": len(MATH500),
        **{f"klsweep_mmlu_college_{s}": len(d) for s, d in MMLU_DOCS.items()},
    }

    # lm-eval's own results file: one score per task, the one klsweep reports
    (lm_file,) = ours["lm_eval_results"]
    theirs = json.loads((path.parent / lm_file).read_text())["results"]
    for task, value in expected.items():
        scores = {k: v for k, v in theirs[task].items() if k.startswith("exact_match,")}
        assert len(scores) == 1, scores
        assert list(scores.values()) == [pytest.approx(value)], task
    table = make_table({"results": theirs, "versions": {}, "n-shot": {}, "higher_is_better": {}})
    rows = [line for line in table.splitlines() if "exact_match" in line]
    assert len(rows) == len(expected)

    # each problem's score by the rule, and the completion scored is the model's as cut by `until`
    by_question = {q: score for q, _, _, score in MATH500}
    by_question |= {q: score for docs in MMLU_DOCS.values() for q, _, _, score in docs}
    for task in expected:
        for row in map(json.loads, (path.parent / f"samples_{task}.jsonl").open()):
            question = row["doc"].get("problem") or row["doc"]["question"]
            assert row["exact_match"] == by_question[question], (task, question, row["filtered_resps"])
            assert "Problem:" not in row["resps"][0][0] and "Question:" not in row["resps"][0][0]


def test_shipped_stop_sequences_and_one_filter_per_task() -> None:
    """The MATH-500 task stops where the reward cuts (tasks.MATH_STOP_SEQUENCES) and where a base model's
    training generation stops (tasks.stop_sequences); every task of the suite has one filter chain at most, so
    that lm-eval's table has one score per task."""
    from lm_eval.tasks._yaml_loader import load_yaml

    found = ev.resolve_tasks(ev.load_suite("paper"))
    for name, yaml_path in found.items():
        task = load_yaml(yaml_path, resolve_func=False)
        assert len(task.get("filter_list") or []) <= 1, name
        until = task["generation_kwargs"]["until"]
        assert set(tasks.END_TOKENS) <= set(until), name
        if name == "klsweep_math500":
            assert set(tasks.MATH_STOP_SEQUENCES) <= set(until)
            assert set(until) == set(tasks.stop_sequences(TaskSection(name="math")))
        else:
            assert "Question:" in until


@pytest.mark.parametrize(
    ("completion", "letter"),
    [
        ("The answer is (B).", "B"),
        ("\\boxed{\\textbf{D}}", "D"),
        ("\\boxed{\\text{(C)}}", "C"),
        ("the answer is: \\textbf{A}", "A"),
        ("\\boxed{B} then the answer is (C)", "B"),  # the box comes first
        ("The answer is a bit unclear", ""),
        ("**Answer: C**", "C"),
        ("**Answer:** C", "C"),
        ("Answer: (D)", "D"),
        ("Final answer: B", "B"),
        ("ANSWER: A.", "A"),
        ("Answer: (B)\n\nthen Final Answer: $C$", "C"),  # the last statement counts
        ("the answer choices are long", ""),
        ("Answer: Because", ""),
        ("\\boxed{42}", ""),
        ("no answer at all", ""),
    ],
)
def test_mmlu_letter(completion: str, letter: str) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("paper_utils", PAPER / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    assert utils.choice_letter(completion) == letter
