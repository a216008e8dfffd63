"""The CLI's console (``cli_console``): its width on a terminal and on a pipe, sentences wrapped at it
(``print_warning``), and the column headers and cells the tables share."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.segment import Segment
    from rich.text import Text


PIPE_WIDTH = 100_000  # a pipe or a file: lines as long as they are (rich's default there would be 80)


def cli_console(stderr: bool = False) -> Console:
    """The terminal's console; when the output is not a terminal, one of the width ``COLUMNS`` asks for, or
    else one no line of which is wrapped. Whatever it prints is text as written: never rich markup (a name's
    ``[bold]`` or ``[link=...]`` prints as typed: styles are given as rich ``Text`` styles, ``styled``), and
    every character it sends but its own styles and cursor moves goes through ``printable.visible`` (an escape
    in a folder's name reads ``\x1b``): one escaping for every line of every command."""
    console_class = _visible_console()
    console = console_class(stderr=stderr, markup=False)
    if console.is_terminal:
        return console
    return console_class(file=_Unpadded(stderr), width=columns() or PIPE_WIDTH, markup=False)  # type: ignore[arg-type]


@functools.cache
def _visible_console() -> type[Console]:
    """rich's Console, each segment it renders (a line's text, a table's cell, a live display's) shown with
    its control characters visible (``printable.visible_lines``; the line breaks are the layout's), rich's own
    control codes (colours, cursor moves) sent as they are. A text given to it as a string is made visible
    before rich reads it, as ``styled`` makes its parts: rich's ``Text`` drops a carriage return, BEL,
    backspace, VT and FF, which would never reach the segments."""
    from rich.console import Console

    from klsweep.printable import visible_lines

    class VisibleConsole(Console):
        def render_str(self, text: str, **kwargs: Any) -> Text:
            # before rich's Text drops \r, BEL, backspace, VT and FF (and measures the line without them)
            return super().render_str(visible_lines(text), **kwargs)

        def render(self, renderable: Any, options: Any = None) -> Iterator[Segment]:
            for segment in super().render(renderable, options):
                yield segment if segment.control else segment._replace(text=visible_lines(segment.text))

    return VisibleConsole


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line of text as written, some parts in a style: ``styled(("error", "bold red"), ": ", message)``
    (the console reads no markup); each part's control characters visible (``printable.visible_lines``: rich's
    ``Text`` would drop some)."""
    from rich.text import Text

    from klsweep.printable import visible_lines

    return Text.assemble(
        *(visible_lines(p) if isinstance(p, str) else (visible_lines(p[0]), p[1]) for p in parts)
    )


ERROR_PREFIX = "Error"  # click's own, on a mistyped option or command: every refusal reads the same


def error_line(message: object) -> Text:
    """A refusal as the CLI prints it on stderr: ``Error: <message>``, the prefix click gives a mistyped
    option or command, so that every refusal starts alike (a bad grid, a bad option, ``audit --json``)."""
    return styled((ERROR_PREFIX, "bold red"), f": {message}")


class _Unpadded:
    """stdout or stderr (looked up at each write) for a pipe or a file: lines without the spaces rich pads a
    table's rows with to its width (``klsweep keys | grep``); a pipe its reader closed is not an error."""

    def __init__(self, stderr: bool):
        self.stderr = stderr

    @property
    def stream(self) -> Any:
        import sys

        return sys.stderr if self.stderr else sys.stdout

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        import re

        try:
            return self.stream.write(re.sub(r" +(?=\n)", "", text))
        except BrokenPipeError:
            self._closed()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._closed()

    def _closed(self) -> None:
        """The reader went away (``klsweep report ... | head``): what is left to print goes nowhere, and the
        command goes on (the report's files are written) and exits as it would have."""
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.stream.fileno())
        os.close(devnull)

    def isatty(self) -> bool:
        return False


def table_width(console: Console) -> int | None:
    """The width tables are fitted to: the terminal's, or on a pipe ``COLUMNS`` when it is set; else none
    (full width)."""
    return console.width if console.is_terminal else columns()


def columns() -> int | None:
    """``COLUMNS`` from the environment when it is a width (e.g. ``COLUMNS=80 klsweep report ... | less``)."""
    import os

    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) >= 20 else None


COMPACT = {"kl.estimator": "est."}  # headers narrower than the report's where a column's values are short


# headers taken when a table is still too wide without its optional columns (spelled out in its caption)
NARROW = {"placement": "place", "importance": "IS", "iterations": "iters", "reward mode": "mode"}


def axis_label(axis: str, compact: bool = True) -> str:
    """A column header for a dotted axis key: compact (a column of short values), else the report's short
    name, else its last part."""
    from klsweep.report.tables import SHORT

    return (compact and COMPACT.get(axis)) or SHORT.get(axis, axis.split(".")[-1])


def shown_params(params: dict[str, Any]) -> dict[str, Any]:
    from klsweep.config import without_kl_when_off

    return without_kl_when_off(params)


def cell(v: Any) -> str:
    return "—" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def pack_items(items: list[str], room: int | None) -> Text:
    """``items`` joined by ", ", on lines of at most ``room`` characters, never breaking an item: a cell whose
    line breaks are the layout's (each item as written, its control characters visible: ``visible``)."""
    from rich.text import Text

    from klsweep.printable import visible

    lines = [""]
    for item in map(visible, items):
        line = f"{lines[-1]}, {item}" if lines[-1] else item
        if room is not None and lines[-1] and len(line) + 1 > room:
            lines[-1] += ","
            lines.append(item)
        else:
            lines[-1] = line
    return Text("\n".join(lines))


def axis_labels(axes: list[str], compact: bool = True) -> list[str]:
    labels = [axis_label(a, compact) for a in axes]
    # two axes with the same last part (a.x, b.x) keep their full keys
    return [a if labels.count(lab) > 1 else lab for a, lab in zip(axes, labels, strict=True)]


def prose_width(console: Console) -> int:
    """The width sentences wrap at: the console's (the terminal's, or ``COLUMNS``), but 80 on a pipe without
    ``COLUMNS``, whose console is as wide as the lines (for the tables)."""
    return console.width if console.is_terminal or columns() else 80


def print_warning(console: Console, line: str, label: str = "warning") -> None:
    """``LABEL: LINE`` (label in yellow), wrapped at ``prose_width`` between words (continued two spaces in; a
    word longer than a line, such as a path, is kept whole)."""
    import textwrap

    from klsweep.printable import visible

    first, *rest = textwrap.wrap(
        f"{label}: {visible(line)}",  # a folder's or a claim's name as written, its control characters visible
        prose_width(console),
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    console.print(styled((label, "yellow"), first.removeprefix(label)), highlight=False, soft_wrap=True)
    for part in rest:
        console.print(part, highlight=False, soft_wrap=True)
