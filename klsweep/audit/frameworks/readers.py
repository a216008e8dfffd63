"""The frameworks klsweep reads, one reader module each (``reading.py`` says what a reader module holds), in
the order they are listed to users."""

from __future__ import annotations

from collections.abc import Callable

from klsweep.audit.frameworks import areal, nemo_rl, openrlhf, pipelinerl, skyrl, slime, trl, verl
from klsweep.audit.frameworks.reading import Reading, Terms

MODULES = {m.NAME: m for m in (verl, trl, openrlhf, slime, nemo_rl, skyrl, areal, pipelinerl)}
VERSIONS = {m.NAME: m.VERSION for m in MODULES.values()}
FRAMEWORKS = tuple(VERSIONS)
READERS: dict[str, tuple[Callable[[Reading], Terms], str]] = {
    m.NAME: (m.read, m.KIND) for m in MODULES.values()
}
