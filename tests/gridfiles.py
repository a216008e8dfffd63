"""Grid files for the tests of ``klsweep.grid`` and the CLI's overrides (tests/unit, tests/integration)."""

from __future__ import annotations

from pathlib import Path

TINY = """\
name: tiny
base:
  model: tiny
  train.steps: 50
grid:
  kl.estimator: k1,k3
  kl.placement: reward,loss,both
  kl.beta: 0.05,0.1
  offpolicy.lag: 0,10
  seed: range(3)
exclude:
  - {kl.estimator: k1, kl.placement: both}
"""


def write(tmp_path: Path, text: str, name: str = "g.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def nothing_under(path: Path) -> bool:
    return not path.exists() or not any(path.rglob("*"))
