"""OpenRLHF's loader, executed: the argparse parser of ``openrlhf.cli.train_ppo_ray`` (built inline under its
``if __name__ == "__main__":``, from ``parser = argparse.ArgumentParser()`` to the line before
``args = parser.parse_args()``), cut out of the pinned wheel's file by those two lines and executed alone:
importing the module would import Ray, vLLM and DeepSpeed. The launch script is run by bash
(tests/peer/loaders/launch.py) and the arguments after ``openrlhf.cli.train_ppo_ray`` are parsed as
``parse_args`` parses them (an unknown flag: argparse's exit 2, its message). 0.11.2 by default; a file whose
PROVENANCE entry names another version (openrlhf 0.9.10) by that version's wheel."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import textwrap
from pathlib import Path
from typing import Any

from loaders import launch

LOADER = (
    "openrlhf wheel: openrlhf/cli/train_ppo_ray.py's argparse parser (its lines, executed) + bash for scripts"
)
ENTRY = ("openrlhf.cli.train_ppo_ray",)
MODULE = "openrlhf/cli/train_ppo_ray.py"
# the keys klsweep's openrlhf reader reads, per version (klsweep/audit/frameworks/openrlhf.py)
KEYS = {
    "0.11.2": (
        "algo.kl.estimator",
        "algo.kl.init_coef",
        "algo.kl.use_loss",
        "algo.kl.unbiased_gradient",
        "algo.kl.target",
        "algo.kl.horizon",
        "algo.advantage.estimator",
        "algo.advantage.no_std_norm",
        "algo.advantage.gamma",
    ),
    "0.9.10": ("kl_estimator", "init_kl_coef", "use_kl_loss", "advantage_estimator"),
}


def _wheels() -> dict[str, Any]:
    from peers import Wheel
    from test_executed import WHEELS

    old = Wheel(
        "openrlhf", "0.9.10", "73bcf728975c5dc87bd1fabefd8da1128bf612c3c05f407de984f3f2f7ac67d9",
        "openrlhf-0.9.10-cp311-cp311-manylinux1_x86_64.whl", WHEELS["openrlhf"].pip_options,
    )  # fmt: skip
    return {"0.11.2": WHEELS["openrlhf"], "0.9.10": old}


def available() -> bool:
    from peers import cache_dir

    return all((cache_dir() / w.filename).is_file() for w in _wheels().values())


def parser(version: str) -> argparse.ArgumentParser:
    """The version's parser, its own lines executed."""
    from peers import wheel_source

    lines = wheel_source(_wheels()[version], MODULE).splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip() == "parser = argparse.ArgumentParser()")
    last = next(i for i in range(first, len(lines)) if lines[i].strip() == "args = parser.parse_args()")
    scope: dict[str, Any] = {"argparse": argparse, "os": os, "datetime": datetime.datetime}
    exec(compile(textwrap.dedent("\n".join(lines[first:last])), MODULE, "exec"), scope)  # noqa: S102
    made = scope["parser"]
    made.prog = "train_ppo_ray.py"  # argparse's messages name sys.argv[0] otherwise
    return made


def version_of(file: Path, files: Path) -> str:
    entry = json.loads((files.parent / "PROVENANCE.json").read_text())["files"][str(file.relative_to(files))]
    return entry.get("version", "openrlhf 0.11.2").split()[-1]


def expected(file: Path, files: Path) -> dict[str, Any]:
    version = version_of(file, files)
    parsed, refused = launch.parsed_by(file, files, ENTRY, parser(version).parse_args)
    if refused is not None:
        return refused
    return {"values": {k: vars(parsed)[k] for k in KEYS[version]}}


def flags(version: str = "0.11.2") -> list[str]:
    """Every flag the version's parser accepts, without its dashes."""
    return sorted(s[2:] for a in parser(version)._actions for s in a.option_strings if s.startswith("--"))


def flags_module() -> str:
    """The text of klsweep/audit/frameworks/openrlhf_flags.py, from 0.11.2's parser."""
    body = "\n".join(f'        "{n}",' for n in flags())
    return (
        '"""The flags openrlhf 0.11.2\'s ``train_ppo_ray`` parser accepts (its argparse lines, executed from the wheel:\n'
        "``tests/peer/loaders/openrlhf.py`` ``flags()``, which tests/peer/test_advantages.py compares with this list).\n"
        'Generated, never edited by hand: ``python -c "from loaders import openrlhf; print(openrlhf.flags_module())"``\n'
        'in tests/peer."""\n\nFLAGS = frozenset(\n    (\n' + body + "\n    )\n)\n"
    )
