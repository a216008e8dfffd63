"""The corpus (tests/fixtures/frameworks/corpus/CORPUS.md): every author's file klsweep's reader reads as the
framework's own loader resolves it (the expected reading committed beside it), or both refuse it; and every
expected reading is what the loader gives today (re-executed where the loader can run here)."""

from __future__ import annotations

import json

import pytest
from corpus import (  # tests/peer is on sys.path under pytest
    CORPUS,
    cases,
    expected_of,
    file_of,
    frameworks,
    klsweep_reading,
    loader,
    mismatches,
    provenance,
)

PROVENANCE_KEYS = {"repository", "commit", "licence", "licence_file", "files"}


@pytest.mark.parametrize("framework", frameworks())
def test_every_corpus_file_has_provenance_a_licence_and_an_expected_reading(framework):
    given = provenance(framework)
    assert set(given) >= PROVENANCE_KEYS, framework
    assert (CORPUS / framework / given["licence_file"]).is_file()
    for _, path in cases(framework):
        assert file_of(framework, path).is_file(), path
        assert expected_of(framework, path).is_file(), f"{path}: run tests/peer/corpus.py {framework} {path}"
    listed = {p for _, p in cases(framework)}
    on_disk = {
        str(p.relative_to(CORPUS / framework / "files"))
        for p in (CORPUS / framework / "files").rglob("*")
        if p.is_file()
    }
    assert on_disk == listed, "files under files/ not in PROVENANCE.json, or listed and absent"


@pytest.mark.parametrize(("framework", "path"), cases())
def test_klsweep_reads_each_file_as_its_framework_does(framework, path):
    expected = json.loads(expected_of(framework, path).read_text())
    got = klsweep_reading(framework, file_of(framework, path))
    assert mismatches(expected, got) == [], f"{framework} {path}"


@pytest.mark.parametrize(("framework", "path"), cases())
def test_each_expected_reading_is_its_loaders(framework, path):
    load = loader(framework)
    if not getattr(load, "available", lambda: True)():
        pytest.skip(f"{framework}'s loader cannot run here ({load.LOADER})")
    expected = json.loads(expected_of(framework, path).read_text())
    fresh = {"loader": load.LOADER, **load.expected(file_of(framework, path), CORPUS / framework / "files")}
    assert json.loads(json.dumps(fresh, sort_keys=True)) == expected


def test_verls_key_set_is_its_wheels():
    """klsweep refuses a verl override of a key verl 0.9.1's config does not have (as Hydra refuses it) from the
    key set it ships: the one the wheel's config composes to."""
    load = loader("verl")
    if not load.available():
        pytest.skip(f"verl's loader cannot run here ({load.LOADER})")
    from klsweep.audit.frameworks import verl

    assert {k: frozenset(v) for k, v in load.config_keys().items()} == verl.config_keys()
