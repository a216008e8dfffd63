"""The corpus loaders' own pieces (tests/peer/loaders/): bash decides a launch script's command (its default
idioms, a missing sourced file skipped), and the flag list klsweep's OpenRLHF reader refuses against is the one
0.11.2's parser has."""

from __future__ import annotations

import pytest
from loaders import launch

from klsweep.audit.frameworks.openrlhf_flags import FLAGS

pytestmark = pytest.mark.peer


def test_bash_decides_the_command(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(
        "set -eu\n"
        ': "${USE_KL:=true}"\n'
        'COEF="${COEF:-0.001}"\n'
        'source "/nowhere/model.sh"\n'
        'ARGS=(--a "$USE_KL")\n'
        'python3 -m pkg.train "${ARGS[@]}" --coef "$COEF" "$@"\n'
    )
    assert launch.arguments_after(script, ("pkg.train",)) == ["--a", "true", "--coef", "0.001"]
    assert launch.arguments_after(script, ("pkg.train",), {"COEF": "0.5"})[-1] == "0.5"
    with pytest.raises(launch.Refused, match="no command runs other"):
        launch.arguments_after(script, ("other",))


def test_openrlhf_flags_are_its_parsers():
    from loaders import openrlhf

    assert set(openrlhf.flags()) == FLAGS
