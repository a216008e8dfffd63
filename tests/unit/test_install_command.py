"""The vLLM extra's install command names where klsweep was installed from (PEP 610's direct_url.json): a
checkout (editable or not), a wheel file, or an index, so that it works as written."""

from __future__ import annotations

import json
from importlib import metadata

import pytest

from klsweep import engines


class _Dist:
    def __init__(self, direct_url: dict | None):
        self.text = None if direct_url is None else json.dumps(direct_url)

    def read_text(self, name: str) -> str | None:
        return self.text if name == "direct_url.json" else None


@pytest.mark.parametrize(
    ("direct_url", "want"),
    [
        (
            {"url": "file:///src/klsweep", "dir_info": {"editable": True}},
            "pip install -e '/src/klsweep[vllm]'",
        ),
        ({"url": "file:///src/my%20klsweep", "dir_info": {}}, "pip install '/src/my klsweep[vllm]'"),
        (
            {"url": "file:///tmp/w/klsweep-0.1.0-py3-none-any.whl", "archive_info": {}},
            "pip install '/tmp/w/klsweep-0.1.0-py3-none-any.whl[vllm]'",
        ),
        (None, "pip install 'klsweep[vllm]'"),  # from an index: no direct_url.json
    ],
)
def test_install_command_names_where_klsweep_came_from(monkeypatch, direct_url, want):
    monkeypatch.setattr(metadata, "distribution", lambda name: _Dist(direct_url))
    assert engines.install_command() == want


def test_a_checkout_never_installed_is_installed_editable(monkeypatch):
    def absent(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", absent)
    checkout = engines.Path(engines.__file__).parents[1]
    assert engines.install_command() == f"pip install -e '{checkout}[vllm]'"
