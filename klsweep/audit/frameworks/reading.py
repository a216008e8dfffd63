"""What every framework's reader shares: a ``Reading`` of one file's settings (typed reads with defaults, the keys
read, the warnings, the values the framework would refuse), the KL term as klsweep's keys, and which keys touch
the KL. A framework is one reader module beside this one (verl.py, trl.py, ...): ``NAME``, ``VERSION`` (the
version its preset cites, the code tests/peer/ executes), ``KIND`` (how its users write the file) and
``read(reading) -> (terms, grpo_like)``."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from klsweep.errors import Problem
from klsweep.kl import KLConfig

# a reader's answer: its KL terms (place, klsweep configuration) and whether its algorithm is GRPO-like
Terms = tuple[list[tuple[str, KLConfig]], bool]


class Reading:
    """One framework's settings being mapped: typed reads with defaults, the keys read and the value each was read
    as (``values``: what tests/peer/ compares with the framework's own loader), the warnings."""

    def __init__(self, framework: str, version: str, settings: dict[str, Any]):
        # Hydra's +key / ++key (an addition to the config): read as key, remembered in ``added``
        self.added = {k.lstrip("+") for k in settings if k.startswith("+")}
        settings = {k.lstrip("+") if k.startswith("+") else k: v for k, v in settings.items()}
        self.framework, self.version, self.settings = framework, version, settings
        self.read: set[str] = set()
        self.values: dict[str, Any] = {}
        self.warnings: list[str] = []
        self.problems: list[Problem] = []
        # the advantage estimator the file selects, as the GRPO audit models it (klsweep.grpo.Advantage); None:
        # klsweep's own (TRL's GRPO, group std); a reader whose selection cannot be modelled says so in a
        # warning and gives grpo_like False (the plain estimator audit alone)
        self.advantage: Any = None
        # why the file trains no KL against a reference (no reference built, no policy loss), where it does not
        self.no_reference: str | None = None

    def get(self, key: str, default: Any, kind: type, optional: bool = False) -> Any:
        """The setting ``key`` (``default`` where the file does not set it) as ``kind``; a value of another type
        is a problem (the framework would refuse it), an interpolation that cannot be resolved here is read as
        the default, said. ``optional``: null is a value too (``Optional[kind]``)."""
        self.read.add(key)
        if optional and key in self.settings and self.settings[key] is None:
            self.values[key] = None
            return None
        self.values[key] = value = self._get(key, default, kind)
        return value

    def _get(self, key: str, default: Any, kind: type) -> Any:
        if key not in self.settings:
            return default
        name, value = key, self.settings[key]
        if isinstance(value, str) and ("${" in value or "$(" in value or "`" in value):
            self.warnings.append(f"{name}: {value} cannot be resolved from this file; read as {default!r}")
            return default
        if kind is float and isinstance(value, str):  # 1e-4: a float to argparse and OmegaConf, text to YAML
            with contextlib.suppress(ValueError):
                value = float(value)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if value is None and default is None:
            return None
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            self.problems.append(
                Problem(
                    name,
                    f"{value!r} is not valid",
                    f"a {kind.__name__}, as {self.version} reads it",
                )
            )
            return default
        return value

    def choice(self, key: str, default: str, allowed: Mapping[str, Any] | tuple[str, ...]) -> str:
        value = self.get(key, default, str)
        if value not in allowed:
            self.problems.append(Problem(key, f"{value!r} is not valid", ", ".join(allowed)))
            self.values[key] = default
            return default
        return value

    def unknown(self, touches_kl: Callable[[str], bool]) -> None:
        """Name every key that touches the KL and that this framework's version does not read."""
        for name in sorted(self.settings):
            if name not in self.read and touches_kl(name):
                self.warnings.append(
                    f"{name}: touches the KL but is not a key {self.version} reads; not read "
                    "(the audit may not be what this config trains)"
                )


# Keys with "kl" in their name that are not the reference KL (a policy loss's own divergence, a metric's check):
# known, so not named as unknown.
NOT_REFERENCE_KL = frozenset(
    (
        "kl_cov_ratio",
        "ppo_kl_coef",
        "kl_cov_frac",
        "opd-kl-coef",
        "ci-disable-kl-checker",
        "kl_cov",
        "binary_kl",
    )
)


def touches_kl(name: str) -> bool:
    """Whether a key names a KL (a component "kl" or "kl..." of its dotted, dashed or underscored name) other
    than ``NOT_REFERENCE_KL``."""
    parts = name.lower().split(".")
    if any(p in NOT_REFERENCE_KL for p in parts) or parts[-1].startswith("_"):  # Hydra's _target_ ...
        return False
    return any(w.startswith("kl") for p in parts for w in re.split(r"[_-]", p))


def term(place: str, estimator: str, beta: float, **forms: Any) -> KLConfig:
    """A framework's KL term as klsweep's keys: per token; a penalty in the reward normalised with the task
    reward and evaluated with the log-probs of the batch (shaped, behavior) unless ``forms`` say otherwise."""
    base: dict[str, Any] = {"reward_mode": "shaped"}
    if place == "reward":
        base["reward_logp"] = "behavior"
    return KLConfig(estimator, place, "token", beta, **(base | forms))
