"""The documentation shipped in the package (``klsweep/docs/``: the repository's docs/*.md, slurm/README.md as
SLURM.md and README.md, linked in a checkout and copied into the wheel), so that a message's pointer ("klsweep
docs KL") is followed wherever klsweep is installed: ``pages`` lists them with their titles, ``find`` takes a
page by its name however a message writes it (``KL``, ``kl``, ``KL.md``, ``docs/KL.md``, ``slurm/README.md``)."""

from __future__ import annotations

from pathlib import Path

from klsweep.errors import Problem, UserError

DOCS_DIR = Path(__file__).parent / "docs"
# what the repository calls a page, where its name is not the file's
ALIASES = {"slurm/readme.md": "SLURM", "slurm": "SLURM", "readme": "README"}


def pages() -> dict[str, str]:
    """Every page's name (``KL``, ``SLURM``, ...) -> its title (its first heading), in name order."""
    out = {}
    for path in sorted(DOCS_DIR.glob("*.md")):
        lines = path.read_text(encoding="utf-8").splitlines()
        title = next((line.lstrip("#").strip() for line in lines if line.startswith("#")), "")
        out[path.stem] = title
    return out


def find(name: str) -> Path:
    """The page ``name`` names (any case, with or without ``.md`` or ``docs/``; ``slurm/README.md``: SLURM).
    ``UserError`` naming the pages when it names none."""
    key = name.strip().lower()
    key = ALIASES.get(key, key).lower().removeprefix("docs/").removesuffix(".md")
    for path in DOCS_DIR.glob("*.md"):
        if path.stem.lower() == key:
            return path
    known = ", ".join(pages()) or f"none: {DOCS_DIR} is missing"
    raise UserError(Problem(name, "no such page of klsweep's documentation", known), title="no such page")
