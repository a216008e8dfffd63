"""A framework's config file as settings: a YAML/JSON mapping's dotted keys (interpolations resolved where
OmegaConf can), a launch script's Hydra overrides ``key=value`` (Hydra's own override grammar) or its
``--flag value`` pairs; the script's own ``NAME=value`` assignments replace ``$NAME``."""

from __future__ import annotations

import contextlib
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from klsweep.errors import Problem, UserError

MAX_BYTES = 1_000_000


def text_of(path: Path) -> str:
    """The file's text; ``UserError`` for a missing, oversized or unreadable file."""
    if not path.is_file():
        raise UserError(Problem(str(path), "no such file", "a framework's config or launch-command file"))
    if path.stat().st_size > MAX_BYTES:
        raise UserError(Problem(str(path), "too large for a config", f"at most {MAX_BYTES} bytes"))
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(Problem(str(path), f"cannot be read ({e})", "a text file")) from e


def _yaml_mapping(text: str) -> dict[str, Any] | None:
    """The file as a YAML (or JSON) mapping, or None when it is not one (a launch command)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out |= _flatten(v, f"{name}.")
        else:
            out[name] = v
    return out


def _resolved(data: dict[str, Any], flat: dict[str, Any]) -> dict[str, Any]:
    """Interpolations (``${a.b}``, ``${..rl.kl_coef}``) resolved where OmegaConf can; the rest left as text."""
    if not any(isinstance(v, str) and "${" in v for v in flat.values()):
        return flat
    from omegaconf import OmegaConf

    config = OmegaConf.create(data)
    out = dict(flat)
    for key, value in flat.items():
        if isinstance(value, str) and "${" in value:
            # a missing target: left as written (read as the default, said)
            with contextlib.suppress(Exception):
                out[key] = OmegaConf.select(config, key, throw_on_resolution_failure=True)
    return out


def _shell_tokens(text: str) -> list[str]:
    """A launch script's words: ``\\``-continued lines joined, comments dropped, ``$NAME``/``${NAME}`` replaced
    by the script's own ``NAME=value`` assignments (others left as written)."""
    text = text.replace("\\\n", " ")
    assigned: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\S.*)?$", line)
        if m and " -" not in line and "python" not in line:
            words = _words(m.group(2) or "")
            assigned[m.group(1)] = words[0] if words else ""
    text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: assigned.get(m.group(1), m.group(0)), text)
    return _words(text)


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


def _overrides(text: str) -> dict[str, Any]:
    """Hydra overrides ``key=value`` (``+key``/``++key`` too) from a launch command, parsed by Hydra's own
    override grammar."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    out: dict[str, Any] = {}
    for word in _shell_tokens(text):
        if "=" not in word or word.startswith("-") or "." not in word.split("=", 1)[0]:
            continue
        try:
            (override,) = parser.parse_overrides([word])
        except Exception:  # noqa: BLE001 (not an override: a shell assignment, a path)
            continue
        if not override.is_delete():
            out[override.key_or_group] = override.value()
    return out


def flags(text: str) -> dict[str, Any]:
    """A launch command's ``--flag value`` / ``--flag=value`` / ``--flag`` (true) pairs, values parsed as YAML
    scalars."""
    import yaml

    words = _shell_tokens(text)
    out: dict[str, Any] = {}
    for i, word in enumerate(words):
        if not word.startswith("--"):
            continue
        name, eq, value = word[2:].partition("=")
        if not eq:
            nxt = words[i + 1] if i + 1 < len(words) else None
            value = nxt if nxt is not None and not nxt.startswith("--") else "true"
        try:
            out[name] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[name] = value
    return out


def settings(text: str) -> dict[str, Any]:
    """A YAML/JSON mapping's dotted keys, else a launch command's Hydra overrides."""
    data = _yaml_mapping(text)
    if data is not None:
        return _resolved(data, _flatten(data))
    return _overrides(text)
