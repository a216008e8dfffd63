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


def describe(error: BaseException, max_lines: int = 3, max_chars: int = 300) -> str:
    """An exception in one line, as a run's failure ``reason``: its type, qualified by its public module
    (``huggingface_hub.errors.StrictDataclassFieldValidationError``; a builtin bare: ``ValueError``), and the
    first ``max_lines`` lines of its message (``str(error)``) joined by " / ", at most ``max_chars`` characters: what
    went wrong, where the last traceback line may be only a message's tail (pydantic's "For further
    information visit ...")."""
    kind = type(error)
    public = [part for part in kind.__module__.split(".") if not part.startswith("_")]
    name = kind.__qualname__ if kind.__module__ == "builtins" else ".".join([*public, kind.__qualname__])
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    message = " / ".join(lines[:max_lines]) + (" ..." if len(lines) > max_lines else "")
    text = f"{name}: {message}" if message else name
    return text if len(text) <= max_chars else text[: max_chars - 3].rstrip() + "..."


class NotLoaded(KLSweepError):
    """A model or dataset that a job could not load (not in the cache offline, gated, no network)."""


def not_loaded(what: str, error: BaseException) -> NotLoaded:
    """The error of a job that could not load ``what`` (e.g. "model Qwen/Qwen2.5-7B"): it names it, says why
    and what to do; raise it ``from error``."""
    return NotLoaded(
        f"{what} could not be loaded: run `klsweep fetch GRID` where the hub can be reached, into the jobs' "
        f"HF_HOME ({describe(error, max_lines=1, max_chars=120)})"
    )
