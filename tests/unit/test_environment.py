"""``environment.usable_cores``: the cores a process may use, at most its cgroup's CPU quota (cgroup v2 or v1)."""

from __future__ import annotations

from pathlib import Path

from klsweep import environment


def _cgroup(tmp_path: Path, limits: dict[str, str]) -> tuple[Path, Path]:
    """A cgroup v2 tree under tmp_path/sys with ``cpu.max`` per folder, and /proc/self/cgroup naming a.slice/b."""
    root = tmp_path / "sys"
    for folder, text in limits.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "cpu.max").write_text(text + "\n")
    (root / "a.slice" / "b").mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text("0::/a.slice/b\n")
    return proc, root


def test_cpu_quota_is_the_tightest_limit_rounded_up(tmp_path):
    proc, root = _cgroup(tmp_path, {"a.slice": "150000 100000", "a.slice/b": "max 100000"})
    assert environment.cpu_quota(proc, root) == 2  # 1.5 CPUs (docker --cpus 1.5): 2 workers, not 1
    proc, root = _cgroup(tmp_path / "2", {"a.slice": "400000 100000", "a.slice/b": "100000 100000"})
    assert environment.cpu_quota(proc, root) == 1
    proc, root = _cgroup(tmp_path / "3", {"a.slice/b": "max 100000"})
    assert environment.cpu_quota(proc, root) is None  # no limit
    assert environment.cpu_quota(tmp_path / "absent", root) is None


def test_cpu_quota_of_cgroup_v1(tmp_path):
    """cgroup v1 (older Docker and Slurm hosts): cpu.cfs_quota_us over cpu.cfs_period_us of the cpu
    controller's tree, -1 for no limit; the other controllers' lines are not read."""
    root = tmp_path / "sys"
    mine = root / "cpu,cpuacct" / "docker" / "abc"
    mine.mkdir(parents=True)
    for folder, quota in ((mine, "250000"), (mine.parent, "-1")):
        (folder / "cpu.cfs_quota_us").write_text(quota + "\n")
        (folder / "cpu.cfs_period_us").write_text("100000\n")
    (root / "memory" / "docker" / "abc").mkdir(parents=True)
    proc = tmp_path / "cgroup"
    proc.write_text("5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    assert environment.cpu_quota(proc, root) == 3  # 2.5 CPUs (docker --cpus 2.5 on a v1 host)
    (mine / "cpu.cfs_quota_us").write_text("-1\n")
    assert environment.cpu_quota(proc, root) is None
    (mine.parent / "cpu.cfs_quota_us").write_text("50000\n")  # the parent's limit holds its children
    assert environment.cpu_quota(proc, root) == 1
    proc.write_text("4:cpu:/docker/abc\n")  # mounted as cpu only
    (root / "cpu,cpuacct").rename(root / "cpu")
    assert environment.cpu_quota(proc, root) == 1


def test_usable_cores_is_at_most_the_quota(monkeypatch):
    monkeypatch.setattr(environment, "cpu_quota", lambda: None)
    cores = environment.usable_cores()
    assert cores >= 1
    monkeypatch.setattr(environment, "cpu_quota", lambda: 1)
    assert environment.usable_cores() == 1
    monkeypatch.setattr(environment, "cpu_quota", lambda: cores + 8)  # a quota above the cores: the cores
    assert environment.usable_cores() == cores


def test_frozen_heap_leaves_what_was_alive_out_and_collects_what_the_block_made():
    import gc
    import weakref

    class Node:
        pass

    assert gc.get_freeze_count() == 0
    before = Node()
    before.me = before  # a cycle alive on entry
    with environment.frozen_heap():
        assert gc.get_freeze_count() > 0  # the heap on entry is out of the collections
        made = Node()
        made.me = made  # a cycle made in the block, then garbage
        gone = weakref.ref(made)
        del made
        gc.collect()
        assert gone() is None  # the block's own garbage is still collected
    assert gc.get_freeze_count() == 0  # back in the collector's care
    gc.freeze()  # a caller that froze the heap itself keeps it frozen
    try:
        with environment.frozen_heap():
            pass
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    engine = Node()
    engine.me = engine
    alive = weakref.ref(engine)
    try:
        with environment.frozen_heap():  # a library freezes in the block (vLLM's engine as it starts) ...
            engine = Node()  # (something made in the block, for the freeze to hold more than on entry)
            gc.freeze()
        assert gc.get_freeze_count() > 0  # ... and its freeze holds past the block: theirs to unfreeze
        engine = None
        gc.collect()
        assert alive() is not None  # not collected while theirs to release
    finally:
        gc.unfreeze()
    with environment.frozen_heap():  # unfrozen inside (vLLM's shutdown): nothing more to undo
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
