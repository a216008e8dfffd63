"""The framework presets (``klsweep/conf/preset/NAME.yaml``): each one a framework's KL configuration as it is
(its version and file are cited in the YAML), usable as a grid's ``preset`` axis and by ``klsweep audit
--preset``. docs/KL.md, "What each framework's KL does", has their audits.

``names()`` lists them, ``kl_config(name)`` is one as a ``klsweep.kl.KLConfig`` (the preset's ``kl.*`` over
``RunConfig``'s defaults), ``resolve`` checks names (``all``: every one) and ``name_of`` finds the preset a
run's KL settings are (the report labels its audit rows with it)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.errors import Problem, UserError

if TYPE_CHECKING:
    from klsweep.kl import KLConfig

PRESET_DIR = Path(__file__).parent / "conf" / "preset"


def names() -> tuple[str, ...]:
    """Every preset's name, sorted."""
    return tuple(sorted(p.stem for p in PRESET_DIR.glob("*.yaml")))


def kl_settings(name: str) -> dict[str, Any]:
    """The ``kl.*`` keys a preset sets (``kl.`` left off), as its YAML has them."""
    return dict(_settings(name))


@functools.cache
def _settings(name: str) -> tuple[tuple[str, Any], ...]:
    """``kl_settings``, read once per process (the report labels every configuration with ``name_of``, which
    compares it with every preset: reading the YAMLs each time was most of a warm report's time)."""
    import yaml

    text = (PRESET_DIR / f"{name}.yaml").read_text()
    if "${" in text:  # an interpolation: Hydra's reading of the group file (OmegaConf, some 50 ms to import)
        from omegaconf import OmegaConf

        data = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    else:  # plain YAML: the same values (tests/unit/test_preset_math.py), without OmegaConf
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return tuple(((data or {}).get("kl") or {}).items())


@functools.cache
def kl_config(name: str) -> KLConfig:
    """The preset's KL configuration: its ``kl.*`` over the defaults of ``RunConfig``'s ``kl`` section (a
    frozen dataclass, read once per process)."""
    return config_of(kl_settings(name))


def config_of(settings: Mapping[str, Any]) -> KLConfig:
    """``kl.*`` settings (``kl.`` left off) over the defaults of ``RunConfig``'s ``kl`` section, as a
    ``klsweep.kl.KLConfig``; ``UserError`` or ``TypeError`` when they are not a valid one."""
    import dataclasses

    from klsweep.config import KLSection
    from klsweep.kl import KLConfig

    return KLConfig(**{**dataclasses.asdict(KLSection()), **dict(settings)})


def resolve(requested: Iterable[str]) -> tuple[str, ...]:
    """The presets named (``all``: every one, in order), each once; ``UserError`` listing every unknown one."""
    known = names()
    out: list[str] = []
    problems = []
    for name in requested:
        if name == "all":
            out.extend(known)
        elif name in known:
            out.append(name)
        else:
            problems.append(Problem("preset", f"{name!r} is not a preset", ", ".join((*known, "all"))))
    if problems:
        raise UserError(problems)
    return tuple(dict.fromkeys(out))


def name_of(kl: Mapping[str, Any]) -> str | None:
    """The preset whose KL configuration a run's ``kl`` section (plain data, every key) is, or None; where several
    frameworks train the same (SkyRL's and verl's k3), their names in ``names()`` order joined by "/" (skyrl/verl)."""
    try:
        config = config_of(kl)
    except (UserError, TypeError):
        return None
    return name_of_config(config)


def name_of_config(config: KLConfig) -> str | None:
    """``name_of`` for a ``KLConfig`` already built."""
    return "/".join(name for name in names() if kl_config(name) == config) or None
