"""The paper suite's scoring, one rule with the training reward (``klsweep.tasks``' docstring): the completion
as cut by the task's stop sequences, its last ``\\boxed{}`` the final answer.

- MATH-500 (``process_math500``): ``klsweep.tasks.math_correct``, the MATH reward itself (no box, no credit).
- MMLU (``choice_letters``, the tasks' one filter): the letter A-D in the last ``\\boxed{}`` (``\\text{}``,
  ``\\textbf{}`` and parentheses around it allowed: ``\\boxed{\\textbf{(D)}}``), else the last statement of the
  answer ("the answer is (X)", "Answer: X", "**Answer: X**", "Final answer: X"; any case, bold, ``$``, parentheses
  allowed), else the last ``\\textbf{X}``; nothing (a score of 0) when none is there.
"""

from __future__ import annotations

import re
from typing import Any

_WRAPPED = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}")
_LETTER = re.compile(r"^\(?([A-D])\)?(?=$|[\s.,:;)])")
# "answer is", "Answer:", "**Answer: C**", "Final answer: (B)", "The answer is: $A$": the word answer (any case)
# followed by "is" or a colon (not "answer choices B and C"), then the letter, maybe bold, in $ or parentheses.
_ANSWER_IS = re.compile(
    r"(?i:answer)(?:\s+is\s*:?|\s*:)\s*(?:\*\*)?\s*(?:\\textbf\{|\$)?\s*\(?([A-D])(?![A-Za-z])"
)
_BOLD = re.compile(r"\\textbf\{\s*\(?([A-D])\)?\s*\}")


def process_math500(doc: dict[str, Any], results: list[str]) -> dict[str, int]:
    from klsweep.tasks import math_correct

    return {"exact_match": int(math_correct(results[0], doc["answer"]))}


def choice_letter(completion: str) -> str:
    """The MMLU answer letter of ``completion`` by the rule above, or "" when it gives none."""
    from klsweep.tasks import last_boxed

    boxed = last_boxed(completion)
    if boxed is not None:
        inner = boxed.strip().strip("$")
        while (unwrapped := _WRAPPED.sub(r"\1", inner)) != inner:
            inner = unwrapped
        found = _LETTER.match(inner.strip())
        if found:
            return found[1]
    for pattern in (_ANSWER_IS, _BOLD):
        letters = pattern.findall(completion)
        if letters:
            return letters[-1]
    return ""


def choice_letters(resps: list[list[str]], docs: list[dict[str, Any]]) -> list[list[str]]:
    """lm-eval ``custom`` filter: each response's ``choice_letter``."""
    return [[choice_letter(r) for r in rs] for rs in resps]
