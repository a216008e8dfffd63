"""A file for another version of a framework, read as that version's own parser reads it: an OpenRLHF 0.9.x
launch command (``--init_kl_coef 1e-5 --use_kl_loss --kl_estimator k2``, #50) is named as such and read as
openrlhf 0.9.10's train_ppo_ray.py parses it (its ``add_argument`` calls executed from the wheel, the package
never imported), never as 0.11.2's defaults."""

from __future__ import annotations

import argparse
import ast
import os
from datetime import datetime
from pathlib import Path

from peers import Wheel, wheel_source  # tests/peer is on sys.path under pytest

from klsweep.audit import frameworks
from klsweep.audit.frameworks import shell

OPENRLHF_0_9 = Wheel(
    "openrlhf", "0.9.10", "73bcf728975c5dc87bd1fabefd8da1128bf612c3c05f407de984f3f2f7ac67d9",
    "openrlhf-0.9.10-cp311-cp311-manylinux1_x86_64.whl",
    ("--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--platform", "manylinux1_x86_64"),
)  # fmt: skip

SCRIPT = """\
set -x
ray job submit --address="http://127.0.0.1:8265" -- python3 -m openrlhf.cli.train_ppo_ray \\
   --pretrain ${MODEL:-Qwen/Qwen2.5-7B} \\
   --advantage_estimator group_norm \\
   --init_kl_coef 1e-5 \\
   --use_kl_loss \\
   --kl_estimator k2 \\
   --n_samples_per_prompt 8
"""


def parser_0_9() -> argparse.ArgumentParser:
    """openrlhf 0.9.10's own argument parser: every ``parser.add_argument(...)`` of its train_ppo_ray.py,
    executed on a fresh parser."""
    tree = ast.parse(wheel_source(OPENRLHF_0_9, "openrlhf/cli/train_ppo_ray.py"))
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "parser"
    ]
    parser = argparse.ArgumentParser()
    for call in calls:
        code = compile(ast.Expression(call), "openrlhf/cli/train_ppo_ray.py", "eval")
        scope = {"parser": parser, "datetime": datetime, "os": os}  # its module imports them
        eval(code, scope)  # noqa: S307 (its own add_argument calls, nothing else)
    return parser


def test_an_openrlhf_0_9_command_is_named_and_read_as_0_9_10_parses_it(tmp_path: Path):
    script = tmp_path / "train_grpo_ray.sh"
    script.write_text(SCRIPT)
    words = shell.words(SCRIPT)
    args, _ = parser_0_9().parse_known_args(words[words.index("openrlhf.cli.train_ppo_ray") + 1 :])
    reading, _ = frameworks.read_terms("openrlhf", script)
    for key in (
        "init_kl_coef",
        "use_kl_loss",
        "kl_estimator",
        "advantage_estimator",
        "kl_target",
        "kl_horizon",
    ):
        assert reading.values[key] == getattr(args, key), key
    found = frameworks.read("openrlhf", script)
    ((place, config),) = found.terms
    assert place == "openrlhf loss" and (config.estimator, config.beta) == ("k2", 1e-5) and found.grpo
    assert found.warnings[0].startswith(
        "flags of openrlhf 0.9.x (--init_kl_coef, --use_kl_loss, --kl_estimator"
    )
    assert (
        "openrlhf 0.11.2 refuses them" in found.warnings[0] and "k2 in the loss at 1e-05" in found.warnings[0]
    )
