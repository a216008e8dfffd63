"""Text klsweep did not make (a folder's name, an axis value, a claim's name, a model's, a log's line) shown as
the characters it holds: ``visible``, the one escaping every output goes through (the CLI's console applies it
to every line it prints: ``console.terminal.cli_console``; the report's Markdown, HTML, CSV and LaTeX to every
name). Needs nothing but ``re``: the CLI's console imports it before its first line."""

from __future__ import annotations

import re
from typing import Any

# C0 and C1 controls (DEL too), Unicode format characters (bidi overrides, zero-width) and line separators
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")


def visible(text: Any) -> str:
    """``text`` as written, its control characters made visible: a newline, a carriage return, an escape
    (ANSI colours, cursor moves), a bidirectional override or a zero-width character reads as its Python escape
    (``\\r``, ``\\x1b``, ``\\u202e``), so a name cannot rewrite a terminal, a line or a file around it."""
    return _CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), str(text))


def visible_lines(text: str) -> str:
    """``visible`` of each line of ``text``, its line breaks kept: what the CLI's console sends to the terminal
    (the line breaks are the layout's)."""
    return "\n".join(map(visible, text.split("\n"))) if _CONTROL.search(text) else text


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 run``, ``2 runs``, ``0 runs``: a count and its noun, plural but for one (``plural``: an irregular
    one, ``counted(1, "was", "were")``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
