"""A launch script read as bash would expand it, without running anything: the one shell reader of the audit.

Lines are read in order, ``\\``-continued lines joined. ``NAME=value`` (``export``/``local``/``readonly``
too) sets a variable; ``$NAME``, ``${NAME}``, ``${NAME:-default}`` / ``${NAME-default}`` expand to its value
or the default; ``${NAME:=default}`` / ``${NAME=default}`` also assign it (``: "${NAME:=default}"`` is the
idiom). A variable the script never sets (the caller's environment) is left as written, as is a command
substitution ``$(...)`` or `` `...` ``: never executed, its value cannot be read from the file (the readers say
so, as for ``${oc.env:...}``)."""

from __future__ import annotations

import re
import shlex

MAX_NESTING = 20  # ${A:-${B:-...}} nested deeper than this is left as written (unreadable), not recursed into
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGNMENT = re.compile(r"\s*(?:(?:export|local|readonly|declare)\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def unreadable(value: str) -> bool:
    """Whether a value still holds what only running something could give: a command substitution, or a
    variable the file does not set."""
    return "$(" in value or "`" in value or "${" in value


def _closing(text: str, i: int, open_: str, close: str) -> int:
    """The index of the bracket closing the one at ``i`` (nested ones counted), or len(text)."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j
    return len(text)


def expand(text: str, env: dict[str, str], depth: int = 0) -> str:
    """``text`` with the script's variables expanded (``env``, updated by ``${NAME:=default}``); command
    substitutions, unknown variables and defaults nested deeper than ``MAX_NESTING`` kept as written."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "'" and (j := text.find("'", i + 1)) >= 0:  # single quotes: nothing expands inside
            out.append(text[i : j + 1])
            i = j + 1
        elif c == "`":
            j = text.find("`", i + 1)
            j = len(text) - 1 if j < 0 else j
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("$(", i):
            j = _closing(text, i + 1, "(", ")")
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("${", i):
            j = _closing(text, i + 1, "{", "}")
            written = text[i : j + 1]
            out.append(written if depth >= MAX_NESTING else _parameter(text[i + 2 : j], written, env, depth))
            i = j + 1
        elif c == "$" and (m := NAME.match(text, i + 1)):
            out.append(env.get(m.group(), text[i : m.end()]))
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _parameter(inner: str, written: str, env: dict[str, str], depth: int) -> str:
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?)([-=+?])(.*))?", inner, re.S)
    if m is None:  # ${#NAME}, ${NAME/a/b}, ...: not read
        return written
    name, colon, op, word = m.groups()
    value = env.get(name)
    unset = value is None or (colon == ":" and value == "")
    if op is None:
        return written if value is None else value
    if op in "-=":
        if not unset:
            return value  # type: ignore[return-value]
        default = _unquoted(expand(word, env, depth + 1))
        if op == "=":
            env[name] = default
        return default
    if op == "+":
        return "" if unset else _unquoted(expand(word, env, depth + 1))
    return written if unset else value  # type: ignore[return-value]


def _unquoted(word: str) -> str:
    try:
        parts = shlex.split(word)
    except ValueError:
        return word
    return " ".join(parts) if parts else ""


def expanded(text: str) -> str:
    """The script with its own variables expanded, line by line in order (assignments take effect where they
    are); the assignment lines themselves kept."""
    env: dict[str, str] = {}
    lines = []
    for line in text.replace("\\\n", " ").splitlines():
        done = expand(line, env)
        m = ASSIGNMENT.match(line)
        if m and " -" not in line and "python" not in line:
            words = _words(expand(m.group(2), env))
            env[m.group(1)] = words[0] if words else ""
        lines.append(done)
    return "\n".join(lines)


def words(text: str) -> list[str]:
    """The script's words (shlex) after ``expanded``."""
    return _words(expanded(text))


def _words(text: str) -> list[str]:
    """Shell words (shlex); a text whose quotes shlex cannot pair (``"$(cd "$(dirname ..)")"``) line by line,
    a line that still fails at its blanks."""
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        out = []
        for line in text.splitlines():
            try:
                out += shlex.split(line, comments=True)
            except ValueError:
                out += line.split("#", 1)[0].split()
        return out
