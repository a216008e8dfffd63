"""The wheel alone, as a newcomer without a clone gets it (issue 51's "done when"): klsweep's wheel built as
INSTALL.md says, installed into a fresh virtual environment, then, from an empty folder, `klsweep plan tiny`
and a 1-run study, each command read from the page the wheel itself shows (`klsweep docs INSTALL`).

Offline and fast: the wheel is built without build isolation (where setuptools is in the project's environment)
from a copy of the repository's files, and the new environment takes klsweep's dependencies from the project's
environment (a path file naming a view of its site-packages without klsweep), so `pip install WHEEL -r
requirements.lock --no-index` finds every locked version installed; klsweep itself is the wheel's, nowhere else.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _sh(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 600) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, (
        f"{shlex.join(map(str, args))}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


def _clone_files(dest: Path) -> Path:
    """The repository's files as a clone has them (tracked and not ignored), links kept as links."""
    listed = _sh(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], REPO).split("\0")
    for name in filter(None, listed):
        src, out = REPO / name, dest / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            out.symlink_to(os.readlink(src))
        elif src.is_file():
            shutil.copy2(src, out)
    return dest


def _dependencies_view(dest: Path) -> Path:
    """The project environment's site-packages without klsweep (its editable install's files), as links."""
    site = Path(sysconfig.get_paths()["purelib"])
    dest.mkdir(parents=True)
    for entry in site.iterdir():
        if "klsweep" in entry.name.lower() or entry.suffix == ".pth":
            continue
        (dest / entry.name).symlink_to(entry)
    return dest


def _commands(page: str, *starts: str) -> list[list[str]]:
    """The page's command lines that start with each of ``starts`` (the first of each), comments left off."""
    lines = [line.split("  #")[0].strip() for line in page.splitlines()]
    found = []
    for start in starts:
        line = next((x for x in lines if x.startswith(start)), None)
        assert line is not None, f"`klsweep docs INSTALL` shows no `{start} ...`"
        found.append(shlex.split(line))
    return found


@pytest.mark.slow
def test_the_wheel_alone_plans_tiny_and_runs_a_1_run_study_from_its_own_docs(tmp_path: Path) -> None:
    took = {}
    t0 = time.time()
    clone = _clone_files(tmp_path / "clone")
    # INSTALL.md's `pip wheel --no-deps -w dist .` in the clone's folder: offline (no build isolation) where
    # setuptools is here (Python 3.11's venv has it), else setuptools from the package index as the docs' does
    offline = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    _sh([sys.executable, "-m", "pip", "wheel", "--no-deps", *offline, "-q", "-w", "dist", "."], clone)
    wheels = list((clone / "dist").glob("klsweep-*.whl"))
    assert len(wheels) == 1, wheels
    took["wheel"] = time.time() - t0

    t0 = time.time()
    venv = tmp_path / "env"
    _sh([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    site = Path(
        _sh(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path
        ).strip()
    )
    # named site-packages: dill (datasets' fingerprints) pickles the classes of modules elsewhere by value
    deps = _dependencies_view(tmp_path / "deps" / "site-packages")
    (site / "project-dependencies.pth").write_text(f"{deps}\n")
    # INSTALL.md's `pip install dist/klsweep-0.1.0-py3-none-any.whl -r requirements.lock`, from the index's
    # packages already here
    wheel = wheels[0].relative_to(clone)
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index"]
    _sh([*pip, str(wheel), "-r", "requirements.lock"], clone)
    took["install"] = time.time() - t0

    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    empty = tmp_path / "empty"
    empty.mkdir()
    where = _sh(["python", "-c", "import klsweep; print(klsweep.__file__)"], empty, env)
    assert where.startswith(str(site)), where  # the wheel's klsweep, not the clone's
    page = _sh(["klsweep", "docs", "INSTALL"], empty, env)
    plan, copy, study = _commands(page, "klsweep plan tiny", "klsweep grids cp", "klsweep study first.yaml")

    t0 = time.time()
    out = _sh(plan, empty, env)
    assert "128 runs" in out and "about 11 min here" in " ".join(out.split()), out
    assert list(empty.iterdir()) == []  # plan writes nothing
    _sh(copy, empty, env)
    took["plan"] = time.time() - t0
    t0 = time.time()
    out = _sh(study, empty, env, timeout=900)
    took["study"] = time.time() - t0
    assert "study done" in out and "1 of 1 run done" in out, out
    report = empty / "results" / "first" / "report"
    assert (report / "report.html").is_file() and (report / "main.csv").is_file()
    print("wheel-only path, seconds:", {k: round(v) for k, v in took.items()})
