"""The public Python API: every name ``klsweep`` exports resolves to the object of the module that owns it,
and ``import klsweep`` alone loads none of the heavy libraries."""

from __future__ import annotations

import importlib
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
