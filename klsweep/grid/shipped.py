"""The grids that ship with klsweep (``sweeps/*.yaml``, inside the installed package as ``klsweep/sweeps/``):
list them, copy one to edit, and resolve a bare name that is no file to one (``klsweep plan tiny`` anywhere).

In a source checkout ``klsweep/sweeps`` is a link to the top-level ``sweeps/``; a wheel carries the files."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from klsweep import store
from klsweep.errors import Problem, UserError

SHIPPED_DIR = Path(__file__).parents[1] / "sweeps"


@dataclass(frozen=True)
class ShippedGrid:
    name: str  # the file's stem: `klsweep plan NAME`
    path: Path
    summary: str  # the first line of its description (the comment after the how-to-run lines)


def shipped() -> list[ShippedGrid]:
    """Every shipped grid, by name."""
    return [ShippedGrid(p.stem, p, _summary(p)) for p in sorted(SHIPPED_DIR.glob("*.yaml"))]


def _summary(path: Path) -> str:
    """The first sentence (to ". " or ": ") of the opening comment's description, after its command lines (how
    to run, preview, override, copy, and any other ``label: klsweep ...``)."""
    words: list[str] = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        label, _, rest = text.partition(":")
        if label in ("how to run", "preview", "override", "copy") or rest.strip().startswith("klsweep "):
            continue  # a command line (how to run, preview, audit: klsweep audit ...)
        if not text:
            if words:
                break
            continue
        words.append(text)
    para = " ".join(words)
    cut = min((i for i in (para.find(". "), para.find(": ")) if i >= 0), default=len(para))
    return para[:cut].rstrip(".")


def _names() -> str:
    return ", ".join(g.name for g in shipped())


def grid_file(grid: str | Path) -> Path:
    """The grid file ``grid`` names: the file itself when it exists, else the shipped grid of that bare name
    (``tiny`` or ``tiny.yaml``, no folder in it). Anything else is returned as written (the reader says what is
    wrong with it)."""
    path = Path(grid)
    if path.exists() or len(path.parts) != 1:
        return path
    stem = path.name.removesuffix(".yaml")
    found = SHIPPED_DIR / f"{stem}.yaml"
    return found if found.is_file() else path


def missing_hint(grid: str | Path) -> str | None:
    """For a grid that is neither a file nor a shipped name: the shipped names, to say beside the error."""
    path = Path(grid)
    if path.exists() or len(path.parts) != 1:
        return None
    return f"a grid file, or a shipped grid's name ({_names()}; klsweep grids)"


def resembled(grid: str | Path) -> str | None:
    """For a path with a folder that names no file (``sweeps/tiny.yaml`` outside a clone, where a wheel install
    has no ``sweeps/``): the shipped grid of the same name, or None. A bare name is ``grid_file``'s."""
    path = Path(grid)
    if path.exists() or len(path.parts) < 2 or path.suffix not in (".yaml", ".yml"):
        return None
    stem = path.stem
    return stem if (SHIPPED_DIR / f"{stem}.yaml").is_file() else None


def copy(name: str, dest: str | Path, force: bool = False) -> Path:
    """Copy the shipped grid ``name`` (a name ``klsweep grids`` lists, ``.yaml`` or not; never a path) to
    ``dest`` (a file, or a folder to hold NAME.yaml); refuse to overwrite a file unless ``force``. The copy is
    named after ``dest`` (``renamed``: its ``name:`` and its header's commands), so that its runs go to a folder
    of their own, not the shipped grid's. Written
    through an unpredictable temporary file beside it (``store.atomic_write_text``: created anew, never
    through a link planted there). Returns the file written."""
    grids = {g.name: g.path for g in shipped()}
    source = grids.get(name.removesuffix(".yaml"))
    problems = []
    if source is None:
        problems.append(Problem(f"grid {name!r}", "is no shipped grid", f"one of {_names()} (klsweep grids)"))
    target = Path(dest)
    if target.is_dir():
        target = target / (source.name if source is not None else f"{Path(name).stem}.yaml")
    if target.exists() and not force:
        problems.append(Problem(str(target), "exists already", "another path, or --force to overwrite it"))
    elif not target.parent.is_dir():
        problems.append(
            Problem(str(target), f"its folder {target.parent} does not exist", "an existing folder")
        )
    if problems or source is None:
        raise UserError(problems, title="not copied")
    store.atomic_write_text(target, renamed(source.read_text(), source.stem, target, str(dest)))
    return target


_NAME_LINE = re.compile(r"^name:(\s*)(\S+)(.*)$", re.M)
_COMMAND = re.compile(r"(klsweep (?:study|run|plan|rehearse) +)(\S+)")


def renamed(text: str, old: str, target: Path, written: str) -> str:
    """A shipped grid's text named after the file it is copied to: its top-level ``name:`` the file's stem
    (when that is a valid sweep name; else kept, and ``klsweep plan`` says what to change) and its opening
    comment's ``klsweep study|run|plan|rehearse GRID`` commands naming that file (``written``, as the user
    gave it, or the file when a folder was given)."""
    import yaml

    from klsweep.grid.validate import name_problem

    new = target.stem
    if new != old and name_problem(new) is None:
        shown = new if yaml.safe_load(new) == new else f'"{new}"'  # 2024, on, null: quoted
        text = _NAME_LINE.sub(
            lambda m: f"name:{m[1]}{shown}{m[3].replace(f'results/{old}/', f'results/{new}/')}", text, count=1
        )
    path = written if Path(written).suffix == ".yaml" and Path(written).name == target.name else str(target)
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if not line.startswith("#"):
            break
        lines[i] = _COMMAND.sub(
            lambda m: m[1] + (path if Path(m[2]).name.removesuffix(".yaml") == old else m[2]), line
        )
    return "".join(lines)
