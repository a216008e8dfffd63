"""The public Python API: every name ``klsweep`` exports resolves to the object of the module that owns it,
and ``import klsweep`` alone loads none of the heavy libraries."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest

import klsweep


@pytest.mark.parametrize("name", sorted(klsweep._EXPORTS))
def test_exported_name_is_the_owning_modules_object(name: str) -> None:
    owner = importlib.import_module(klsweep._EXPORTS[name])
    assert getattr(klsweep, name) is getattr(owner, name)
    assert name in dir(klsweep)


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = klsweep.nope


def test_import_is_light() -> None:
    code = (
        "import sys, klsweep; "
        "print(sorted(m for m in ('torch', 'trl', 'lm_eval', 'pandas', 'matplotlib', 'submitit') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_bad_kl_config_is_a_value_error_listing_every_field() -> None:
    with pytest.raises(ValueError) as info:
        klsweep.KLConfig(estimator="k9", placement="nowhere")
    assert isinstance(info.value, klsweep.UserError)
    assert "estimator" in str(info.value) and "placement" in str(info.value)


def test_the_readmes_own_trl_script_runs_as_written(tmp_path, monkeypatch) -> None:
    """docs/USAGE.md's "From your own TRL script" block, extracted and run as written (on the project's tiny
    model, as it says): KLGRPOTrainer trains with the KLConfig given and logs the KL."""
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "docs" / "USAGE.md").read_text()
    section = readme.split("### From your own TRL script", 1)[1].split("\n### ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    monkeypatch.chdir(tmp_path)  # output_dir="out"
    namespace: dict = {"__name__": "__readme__"}
    exec(compile(code, "docs/USAGE.md", "exec"), namespace)

    trainer = namespace["trainer"]
    assert isinstance(trainer, klsweep.KLGRPOTrainer) and trainer.state.global_step == 2
    assert trainer.kl == klsweep.KLConfig(
        estimator="k1", placement="reward", level="token", beta=0.05, reward_mode="separate"
    )
    logged = {key for row in trainer.state.log_history for key in row}
    assert {"kl/k1", "kl/k3", "kl/forward", "kl/penalty", "task_reward/mean"} <= logged
    assert (tmp_path / "out" / "checkpoint-2").is_dir()
