"""A launch script's training command, as bash runs it: the script executed by bash in an empty folder (HOME there
too, a clean environment, a timeout), with the commands that would start work replaced by stubs that record
their arguments (python, torchrun, ray, deepspeed, ...; the network and package tools too). What the stub of the
training entry point received is the command's arguments: the shell's own defaults (``${VAR:-x}``,
``: "${VAR:=x}"``), loops, ``$@`` and quoting all decided by bash itself. A file the script ``source``s that is
not here is skipped (``PRELUDE``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# commands a stub replaces: the ones that start training or touch the network, GPUs or packages
STUBBED = (
    "python", "python3", "torchrun", "ray", "deepspeed", "accelerate", "nvidia-smi", "pip", "pip3", "uv",
    "huggingface-cli", "hf", "wget", "curl", "git", "sleep", "srun", "sbatch", "docker", "wandb", "nohup",
    "pkill", "kill", "killall", "hostname", "ibstat", "rocm-smi", "ssh", "conda", "source_env", "mpirun",
)  # fmt: skip

STUB = """#!/bin/sh
exec {python} -c 'import json, os, sys; open(os.environ["LAUNCH_LOG"], "a").write(json.dumps(sys.argv[1:]) + "\\n")' \
  "$(basename "$0")" "$@"
"""


# read by bash before the script (BASH_ENV): a file the script sources that is not here (a model's architecture
# flags under /root/slime/scripts/models/, a cluster's environment) is skipped, said on stderr, not fatal
PRELUDE = """source() {
  if [ -f "$1" ]; then builtin source "$@"; else echo "launch: $1 is not here: skipped" >&2; fi
}
"""


class Refused(Exception):
    """The script does not run the training command (bash stops first, or never reaches it)."""


def commands(
    script: Path, timeout: float = 30.0, environment: dict[str, str] | None = None
) -> list[list[str]]:
    """Every stubbed command the script ran, in order: [command name, its arguments ...]; ``environment``: the
    variables its user must set (a PROVENANCE entry's ``environment``)."""
    with tempfile.TemporaryDirectory(prefix="launch-") as work:
        root = Path(work)
        stubs = root / "stubs"
        stubs.mkdir()
        for name in STUBBED:
            path = stubs / name
            path.write_text(STUB.format(python=sys.executable))
            path.chmod(0o755)
        log = root / "log.jsonl"
        log.touch()
        prelude = root / "prelude.sh"
        prelude.write_text(PRELUDE)
        env = {
            "PATH": f"{stubs}:/usr/bin:/bin",
            "HOME": str(root),
            "LAUNCH_LOG": str(log),
            "BASH_ENV": str(prelude),
            "LANG": "C.UTF-8",
            "USER": "user",  # what a login sets (scripts under set -u read them)
            "LOGNAME": "user",
            "SHELL": "/bin/bash",
            **(environment or {}),
        }
        (root / "cwd").mkdir()
        text = script.read_text()
        copy = root / "cwd" / script.name
        copy.write_text(text)
        done = subprocess.run(
            ["/bin/bash", "--noprofile", "--norc", str(copy)],
            cwd=root / "cwd",
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        ran = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        if not ran and done.returncode != 0:
            said = done.stderr.replace(str(copy), script.name).strip()[-300:]  # no temporary path in it
            raise Refused(f"bash exits {done.returncode} before any command: {said}")
        return ran


def arguments_after(
    script: Path, entry: tuple[str, ...], environment: dict[str, str] | None = None
) -> list[str]:
    """The arguments the first command that runs one of ``entry`` (a module after ``-m``, or a script path
    ending so) received after it; ``Refused`` where none does."""
    for command in commands(script, environment=environment):
        for i, word in enumerate(command):
            if any(word == e or word.endswith("/" + (e if e.endswith(".py") else e.replace(".", "/") + ".py"))
                   for e in entry):  # fmt: skip
                return command[i + 1 :]
    raise Refused(f"no command runs {' or '.join(entry)} (bash, in a clean environment)")


def environment_is_clean() -> bool:
    """bash is here (the loader's only requirement beyond Python)."""
    return os.path.exists("/bin/bash")


def environment_of(file: Path, files: Path) -> dict[str, str]:
    """The variables a corpus file's PROVENANCE entry says its user sets (``environment``), else none."""
    entry = json.loads((files.parent / "PROVENANCE.json").read_text())["files"][str(file.relative_to(files))]
    return dict(entry.get("environment", {}))


def parsed_by(
    file: Path, files: Path, entry: tuple[str, ...], parse: Any
) -> tuple[Any, dict[str, str] | None]:
    """The arguments the script hands its training entry point (``arguments_after``), parsed by ``parse`` (an
    argparse parser's method), or the refusal as a corpus reading: bash's (``Refused``) or the parser's last
    line on stderr (argparse exits)."""
    import contextlib
    import io

    try:
        args = arguments_after(file, entry, environment_of(file, files))
    except Refused as e:
        return None, {"refused": str(e)}
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return parse(args), None
    except SystemExit:
        return None, {"refused": said.getvalue().strip().splitlines()[-1]}
