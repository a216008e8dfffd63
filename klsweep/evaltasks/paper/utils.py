"""Scoring for the paper suite's MATH-500 task: math-verify equivalence of the completion's final answer with
the reference answer, the same check as the MATH training reward (``klsweep.tasks.math_correct``)."""

from __future__ import annotations

from typing import Any


def process_math500(doc: dict[str, Any], results: list[str]) -> dict[str, int]:
    from klsweep.tasks import math_correct

    return {"exact_match": int(math_correct(results[0], doc["answer"]))}
