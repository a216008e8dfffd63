"""A YAML file's node graph measured before it is built: how many values it holds with every alias expanded (an
alias bomb: millions from a kilobyte; a recursive alias ``a: &a {b: *a}``: without end) and how deep it nests
(5,000 levels overflow the recursion of whatever walks the data). Used by every reader of a YAML file that is
not klsweep's own: grid files (``grid.parse``) and the frameworks' configs (``audit.frameworks.files``)."""

from __future__ import annotations

import math
from typing import Any


def measure(root: Any) -> tuple[float, float]:
    """(values, depth) of a composed YAML node graph with every alias expanded; both ``math.inf`` for a
    recursive alias. An alias is the very node it names, so each node is measured once: time linear in the
    file, however large the expansion; no recursion, so a deeply nested file cannot overflow the stack."""
    sizes: dict[int, tuple[float, float]] = {}
    entered: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        children = _children(node)
        if children_done:
            if any(id(c) not in sizes for c in children):  # entered, not finished: an ancestor
                return math.inf, math.inf
            sizes[id(node)] = (
                1 + sum(sizes[id(c)][0] for c in children),
                1 + max((sizes[id(c)][1] for c in children), default=0),
            )
            continue
        if id(node) in entered:
            continue
        entered.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children)
    return sizes[id(root)]


def _children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []
