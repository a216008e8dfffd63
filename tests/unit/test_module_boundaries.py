"""No module imports another module's private names (``from klsweep.x import _name``): what a module shares is
public, what it keeps to itself stays there."""

from __future__ import annotations

import ast
from pathlib import Path

import klsweep

PACKAGE = Path(klsweep.__file__).parent


def test_no_module_imports_a_private_name_of_another():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("klsweep"):
                private = [
                    a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")
                ]
                if private and node.module != module:
                    found.append(f"{module}: from {node.module} import {', '.join(private)}")
    assert found == []
