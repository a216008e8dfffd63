"""The test tree itself: pytest imports test modules by their basename (tests/ has no packages), so two
modules with one name in two tiers stop collection of the whole run ("import file mismatch"), as CI did
when tests/unit and tests/integration both had test_first_minutes.py."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_basename() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        where[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not shared, f"test modules sharing a basename (rename one): {shared}"
