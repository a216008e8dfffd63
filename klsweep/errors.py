"""klsweep's errors. Expected mistakes (bad input) raise a ``UserError``; the CLI prints it without a
traceback and exits with code 2."""

from __future__ import annotations

from dataclasses import dataclass


class KLSweepError(Exception):
    """Base class of klsweep's own errors."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: where it is, what is wrong, and what is allowed."""

    where: str
    what: str
    allowed: str = ""

    def __str__(self) -> str:
        s = f"{self.where}: {self.what}"
        return f"{s} (allowed: {self.allowed})" if self.allowed else s


class UserError(KLSweepError, ValueError):
    """Bad input. Carries every problem found, so the user can fix them all at once. A ``ValueError``, as a
    library's bad-argument error is (``KLConfig(estimator="k9")`` from one's own script raises it)."""

    def __init__(self, problems: list[Problem] | Problem | str, title: str = "invalid input"):
        if isinstance(problems, str):
            problems = [Problem("input", problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems = list(problems)
        self.title = title
        n = len(self.problems)
        head = f"{title}: {n} problem{'s' if n != 1 else ''}"
        super().__init__("\n".join([head, *(f"  - {p}" for p in self.problems)]))
