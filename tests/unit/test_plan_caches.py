"""The plan's caches (``KLSWEEP_CACHE/compose/``: composed configs and Hydra's readings of override texts) are
never trusted (issue 47 items 2, 3, 9): what is read back is checked against what it is kept for (the key, a
digest of the content; a regular file of this user's), anything else is ignored and kept anew, never a
traceback, a hang or a different plan; the composed configs' key covers what Hydra reads through a linked
config-group folder, and reads only regular files of bounded size below the config folders. Hostile files
(FIFOs, /dev/zero) are met in a child process under a timeout and an address-space limit."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from gridfiles import write

from klsweep import grid, store
from klsweep.errors import UserError
from klsweep.grid import compose, overrides

GRID = "name: c\nbase:\n  model: tiny\n  kl.beta: 0.1\ngrid:\n  kl.estimator: k1,k3\n  seed: range(50)\n"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KLSWEEP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "compose"


def _edit(folder: Path, old: bytes | re.Pattern[bytes], new: bytes) -> Path:
    """Edit the one kept file of ``folder`` holding ``old`` (a byte string or a pattern): the edited file."""
    found = [p for p in sorted(folder.iterdir()) if re.search(old, p.read_bytes())]
    assert len(found) == 1, (old, found)
    found[0].write_bytes(re.sub(old, new.replace(b"\\", b"\\\\"), found[0].read_bytes(), count=1))
    return found[0]


def _plan(g: Path, tmp_path: Path, **kw) -> list[tuple[str, dict]]:
    return [(r.id, r.config) for r in grid.load_plan(g, out=tmp_path / "out", **kw).runs]


def _hydra_calls(monkeypatch) -> tuple[list, list]:
    """The composes and override parses Hydra does from now on."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    composed, parsed = [], []
    original_compose, original_parse = compose.Composer._hydra_compose, OverridesParser.parse_override
    monkeypatch.setattr(
        compose.Composer, "_hydra_compose", lambda s, o: composed.append(o) or original_compose(s, o)
    )
    monkeypatch.setattr(
        OverridesParser, "parse_override", lambda s, t: parsed.append(t) or original_parse(s, t)
    )
    return composed, parsed


def test_an_edited_override_parse_is_not_trusted(cache, tmp_path, monkeypatch):
    """A kept parse edited to hold a value the grid lacks (k2 from `k1,k3`) or a smaller count (range(50)
    counted 1: --max-runs bypassed) is ignored: the text is read again, the same plan or the same refusal."""
    g = write(tmp_path, GRID)
    first = _plan(g, tmp_path)
    assert len(first) == 100
    _edit(cache, rb'\["k1", "k3"\]', b'["k1", "k2", "k3"]')
    _edit(cache, rb'\["seed", 50, true\]', b'["seed", 1, true]')
    composed, parsed = _hydra_calls(monkeypatch)
    assert _plan(g, tmp_path) == first
    assert sorted(parsed) == ["kl.estimator=k1,k3", "seed=range(50)"] and composed == []
    with pytest.raises(UserError, match="max-runs"):
        grid.load_plan(g, out=tmp_path / "out", max_runs=60)
    parsed.clear()
    assert _plan(g, tmp_path) == first and parsed == []  # kept anew, whole


def test_the_override_cache_is_keyed_by_klsweeps_version(cache, tmp_path, monkeypatch):
    """Another klsweep reads its texts with Hydra again (the key held Hydra's version and the text only)."""
    g = write(tmp_path, GRID)
    first = _plan(g, tmp_path)
    caches = [f for f in (getattr(overrides, n, None) for n in ("_code", "_hydra_version")) if f is not None]
    monkeypatch.setattr(overrides, "__version__", "9.9.9", raising=False)
    for f in caches:
        f.cache_clear()
    try:
        _, parsed = _hydra_calls(monkeypatch)
        assert _plan(g, tmp_path) == first and set(parsed) == {"kl.estimator=k1,k3", "seed=range(50)"}
    finally:
        monkeypatch.undo()
        for f in caches:
            f.cache_clear()


@pytest.mark.parametrize(
    "old,new",
    [
        (rb'\\"kl\\": \{', b'\\"kl\\": ['),  # one bit flipped in the composed config's text: not JSON
        (rb'"choices": \{[^}]*\}', b'"choices": 5'),
        (rb'"choices": \{[^}]*\}', b'"choices": {"model": "tiny"}'),
        (rb'"config": "(?:[^"\\]|\\.)*"', b'"config": "null"'),
        (rb'\\"learning_rate\\": [0-9.e-]+', b'\\"learning_rate\\": 0.5'),  # new run ids, no notice
    ],
    ids=["flipped-byte", "choices-int", "choices-partial", "config-null", "learning-rate"],
)
def test_a_damaged_or_edited_composed_config_is_composed_again(cache, tmp_path, monkeypatch, old, new):
    g = write(tmp_path, GRID)
    first = _plan(g, tmp_path)
    kept = [p for p in cache.iterdir() if not p.name.startswith("override-")]
    assert len(kept) == 1
    _edit(cache, re.compile(old), new)
    composed, _ = _hydra_calls(monkeypatch)
    assert _plan(g, tmp_path) == first and len(composed) == 1
    assert _plan(g, tmp_path) == first and len(composed) == 1  # kept anew, whole


def _klsweep(
    args: list, env: dict[str, str], cwd: Path, memory: int | None = None
) -> subprocess.CompletedProcess:
    """`klsweep ARGS` in a child process, under a timeout (a hang fails the test instead of hanging it) and,
    with ``memory``, an address-space limit (bytes)."""

    def limit() -> None:
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run(
        [sys.executable, "-m", "klsweep", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=cwd,
        env={**os.environ, **env},
        preexec_fn=limit,
    )


def test_a_fifo_in_place_of_a_kept_file_is_ignored(tmp_path):
    """A FIFO where a composed config or an override parse is kept: plan neither waits on it nor fails."""
    env = {"KLSWEEP_CACHE": str(tmp_path / "cache")}
    g = write(tmp_path, GRID)
    args = ["plan", g, "--out", tmp_path / "out", "--runs"]
    first = _klsweep(args, env, tmp_path)
    assert first.returncode == 0, first.stderr
    for kept in sorted((tmp_path / "cache" / "compose").iterdir()):
        kept.unlink()
        os.mkfifo(kept)
    again = _klsweep(args, env, tmp_path)
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr[-2000:]


@pytest.mark.parametrize("hostile", ["fifo", "dev-zero", "large"])
def test_fifos_devices_and_large_files_below_the_config_folder_are_never_read(tmp_path, hostile):
    """Files below --config-dir that Hydra never reads: a FIFO (plan waited on it for ever) and a link to
    /dev/zero (read until memory ran out) are keyed by their names, not opened; a file over the size bound
    leaves the config composed every time. The plan is the same as without them, and kept."""
    env = {"KLSWEEP_CACHE": str(tmp_path / "cache")}
    conf = tmp_path / "conf"
    (conf / "notes").mkdir(parents=True)
    g = write(tmp_path, GRID)
    args = ["plan", g, "--out", tmp_path / "out", "--runs", "--config-dir", conf]
    clean = _klsweep(args, env, tmp_path, memory=4 << 30)
    assert clean.returncode == 0, clean.stderr[-2000:]
    if hostile == "fifo":
        os.mkfifo(conf / "notes" / "pipe.yaml")
    elif hostile == "dev-zero":
        (conf / "zero.yaml").symlink_to("/dev/zero")
    else:
        with open(conf / "notes" / "big.yaml", "wb") as f:
            f.truncate((64 << 20) + 1)  # sparse: no disk used
        assert compose.CONFIG_BYTES < 64 << 20
    for _ in range(2):  # composed, then read back (or, with the large file, composed again)
        again = _klsweep(args, env, tmp_path, memory=4 << 30)
        assert again.returncode == 0 and again.stdout == clean.stdout, again.stderr[-2000:]


def test_a_linked_config_group_folder_edited_behind_the_link_is_composed_again(cache, tmp_path, monkeypatch):
    """Hydra reads a config group through a symbolic link: an edit of a preset behind it is a new plan (the
    cache's key walked past the link and kept the old values and run ids)."""
    real = tmp_path / "elsewhere" / "preset"
    real.mkdir(parents=True)
    text = (compose.CONF_DIR / "preset" / "trl.yaml").read_text()
    (real / "mine.yaml").write_text(text)
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "preset").symlink_to(real, target_is_directory=True)
    g = write(tmp_path, "name: s\nbase:\n  model: tiny\n  preset: mine\ngrid:\n  seed: 0,1\n")
    before = grid.load_plan(g, out=tmp_path / "out", config_dirs=[str(conf)])
    assert before.runs[0].config["kl"]["beta"] == 0.04
    (real / "mine.yaml").write_text(text.replace("beta: 0.04", "beta: 0.77"))
    after = grid.load_plan(g, out=tmp_path / "out", config_dirs=[str(conf)])
    assert {r.config["kl"]["beta"] for r in after.runs} == {0.77}
    assert not {r.id for r in after.runs} & {r.id for r in before.runs}


def test_an_override_that_is_not_utf8_is_bad_grammar(tmp_path):
    """A byte of argv that is not UTF-8 (a surrogate escape in Python) is refused as Hydra refuses it: exit 2,
    located, no traceback, nothing kept for it."""
    env = {"KLSWEEP_CACHE": str(tmp_path / "cache")}
    for _ in range(2):
        done = _klsweep(["plan", "tiny", "--out", tmp_path, os.fsdecode(b"kl.beta=\xff")], env, tmp_path)
        flat = " ".join(done.stderr.split())
        assert done.returncode == 2 and "bad override grammar in 'kl.beta=\\udcff'" in flat, done.stderr[
            -2000:
        ]
        assert "Traceback" not in done.stderr


def test_store_kept_reads_back_only_what_was_kept_for_the_key(tmp_path):
    path = tmp_path / "k" / "x.json"
    key = store.kept.key_of("a", b"b")
    assert store.kept.key_of("a", b"b") == key != store.kept.key_of("ab", b"")
    assert store.kept.keep(path, key, {"v": [1, "\udcff"]}) and store.kept.read(path, key) == {
        "v": [1, "\udcff"]
    }
    assert path.stat().st_mode & 0o777 == 0o644 & ~store.umask()
    assert store.kept.read(path, store.kept.key_of("other")) is None  # kept for another key
    assert store.kept.read(tmp_path / "absent.json", key) is None
    data = path.read_bytes()
    path.write_bytes(data.replace(b"1", b"2"))  # the digest no longer holds
    assert store.kept.read(path, key) is None
    path.write_bytes(data)
    os.chmod(path, 0o666)  # others could have written it
    assert store.kept.read(path, key) is None
    os.chmod(path, 0o644)
    if os.getuid() == 0:  # CI runs as root: a file another user planted, whole and well-formed
        os.chown(path, 65534, 65534)
        assert store.kept.read(path, key) is None
        os.chown(path, 0, 0)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    assert store.kept.read(path, key) is not None and store.kept.read(link, key) is None
    assert not store.kept.keep(path, key, {"v": object()})  # not JSON: nothing kept
    assert store.kept.read(path, key) == {"v": [1, "\udcff"]}
    json.loads(path.read_bytes().partition(b"\n")[0])  # one header line
