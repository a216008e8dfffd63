"""klsweep's errors. Expected mistakes (bad input) raise a ``UserError``; the CLI prints it without a
traceback and exits with code 2."""

from __future__ import annotations

import errno
import re
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
    information visit ..."). When it, or an exception it was raised from or while handling, is a memory error
    (``memory_error``), the line begins with ``out of memory:`` and names that one first (a lazy import that
    ran out of memory raises "Failed to import trl..." from a MemoryError)."""
    text = _one_line(error, max_lines)
    memory = memory_error(error)
    if memory is not None:
        hedge = next((h for words, h in _MAYBE_MEMORY.items() if re.search(words, str(memory))), "")
        said = f"out of memory{hedge}: "
        text = said + (text if memory is error else f"{_one_line(memory, max_lines)} (raised as {text})")
    return text if len(text) <= max_chars else text[: max_chars - 3].rstrip() + "..."


# What a failed allocation says when it is not a MemoryError: torch's CPU allocator, CUDA, the dynamic loader
# under `ulimit -v` (a shared library that cannot be mapped), a C library's ENOMEM. And, said with a hedge
# (_MAYBE_MEMORY), what Python says when a thread's stack cannot be mapped (also at a limit on threads) and
# when a C function failed without raising (CPython out of memory mid-import; also a faulty extension).
_MAYBE_MEMORY = {
    r"can't start new thread": " (or of threads)",
    r"without (setting an )?exception set|returned NULL without setting an exception": " (likely)",
}
_MEMORY_TEXTS = re.compile(
    r"can't allocate memory|cannot allocate memory|out of memory|failed to map segment from shared object",
    re.IGNORECASE,
)


def memory_error(error: BaseException) -> BaseException | None:
    """The first memory error in ``error``'s chain (itself, then its ``__cause__`` / ``__context__``): a
    ``MemoryError``, an ``OSError`` with ENOMEM, or an error whose message says an allocation failed; else
    the first whose message says what a memory error may cause (``_MAYBE_MEMORY``); None."""
    chain: list[BaseException] = []
    todo: list[BaseException] = [error]
    while todo:
        e = todo.pop(0)
        if all(e is not c for c in chain):
            chain.append(e)
            todo += [c for c in (e.__cause__, e.__context__) if c is not None]
    sure = (
        e
        for e in chain
        if isinstance(e, MemoryError)
        or (isinstance(e, OSError) and e.errno == errno.ENOMEM)
        or _MEMORY_TEXTS.search(str(e))
    )
    maybe = (e for e in chain if any(re.search(words, str(e)) for words in _MAYBE_MEMORY))
    return next(sure, None) or next(maybe, None)


def _one_line(error: BaseException, max_lines: int) -> str:
    kind = type(error)
    public = [part for part in kind.__module__.split(".") if not part.startswith("_")]
    name = kind.__qualname__ if kind.__module__ == "builtins" else ".".join([*public, kind.__qualname__])
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    message = " / ".join(lines[:max_lines]) + (" ..." if len(lines) > max_lines else "")
    return f"{name}: {message}" if message else name


class NotLoaded(KLSweepError):
    """A model or dataset that a job could not load (not in the cache offline, gated, no network)."""


def not_loaded(what: str, error: BaseException) -> NotLoaded:
    """The error of a job that could not load ``what`` (e.g. "model Qwen/Qwen2.5-7B"): it names it, says why
    and what to do; raise it ``from error``."""
    return NotLoaded(
        f"{what} could not be loaded: run `klsweep fetch GRID` where the hub can be reached, into the jobs' "
        f"HF_HOME ({describe(error, max_lines=1, max_chars=120)})"
    )


def parameters_missing(missing: list[str]) -> str:
    """What a model's weights that lack the parameters ``missing`` (transformers' loading report, non-empty)
    would train from, in words: the fetch check and the training job say it alike."""
    shown = ", ".join(missing[:2]) + (", ..." if len(missing) > 2 else "")
    return (
        f"missing {len(missing)} of the model's parameters ({shown}): transformers would initialise them at "
        "random"
    )
