"""What a wheel install shows names what a wheel has: the pages `klsweep docs` ships, the CLI's help texts and
the audit's footer name no file that only a clone of the repository holds (./dev.sh, sweeps/*.yaml, tests/peer,
requirements-gpu.lock, the committed results/tiny/report/claims.csv) without saying so."""

from __future__ import annotations

import re
from pathlib import Path

import click
import typer

from klsweep import presets
from klsweep.cli import app  # every command registered (klsweep.cli imports each module)
from klsweep.console.audit import checked_lines

DOCS = Path(__file__).resolve().parents[2] / "klsweep" / "docs"
REPO_ONLY = ("dev.sh", "sweeps/", "requirements-gpu.lock", "tests/peer", "results/tiny/report/claims.csv")
SAID = "clone"  # "in a clone of the repository", "from a clone", ...


def _unsaid(paragraphs: list[str]) -> list[str]:
    """The paragraphs naming a repository-only path with neither them nor the one before saying "clone"."""
    return [
        p
        for i, p in enumerate(paragraphs)
        if any(t in p for t in REPO_ONLY) and SAID not in p and (i == 0 or SAID not in paragraphs[i - 1])
    ]


def test_the_shipped_pages_say_where_a_clone_only_file_lives():
    pages = sorted(DOCS.glob("*.md"))
    assert len(pages) >= 12
    bad = {}
    for page in pages:
        paragraphs = re.split(r"\n\s*\n", page.read_text(encoding="utf-8"))
        if any("are in a clone of the repository" in p for p in paragraphs[:3]):
            continue  # the page says so at its top, for every path it names
        if found := _unsaid(paragraphs):
            bad[page.name] = [p[:120] for p in found]
    assert bad == {}


def test_the_help_texts_and_the_audit_footer_say_where_a_clone_only_file_lives():
    root = typer.main.get_command(app)
    texts = {}

    def walk(cmd: click.Command, path: list[str]) -> None:
        with click.Context(cmd, info_name=" ".join(path)) as ctx:
            texts[" ".join(path)] = " ".join(cmd.get_help(ctx).split())
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(root, ["klsweep"])
    assert len(texts) >= 15 and "klsweep study" in texts and "klsweep grids cp" in texts
    bad = {where: t for where, t in texts.items() if any(p in t for p in REPO_ONLY) and SAID not in t}
    assert bad == {}
    footer = " ".join(checked_lines(list(presets.SOURCES)).split())
    assert all(p not in footer for p in REPO_ONLY) or SAID in footer
    assert "docs/KL.md" not in footer  # a wheel's page is `klsweep docs KL`
