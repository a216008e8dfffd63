"""The results store's own promises (klsweep/store/): files written whole with the modes a plain ``open``
gives, and one trainer per run even when its lock file is removed by hand (issue 32: D15, D4)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from runfiles import OTHER_NODE

from klsweep import store
from klsweep.errors import UserError


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_atomic_writes_honour_the_umask(tmp_path, mask):
    """Every file written through a temporary file has the mode ``open`` gives (0666 less the umask), not
    mkstemp's 0600: a colleague sharing the results folder reads status.json, config.yaml, the reports. Mode
    bits are checked (root reads a 0600 file anyway)."""
    with umask(mask):
        store.atomic_write_text(tmp_path / "report.md", "# report\n")
        store.write_json(tmp_path / "status.json", {"state": "done"})
        store.write_status(tmp_path / "run", "running", step=1)
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("as open() makes it\n")
    expected = 0o666 & ~mask
    assert mode(tmp_path / "plain.txt") == expected
    for name in ("report.md", "status.json", "run/status.json"):
        assert mode(tmp_path / name) == expected, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt", "report.md", "run", "status.json"]


def test_the_umask_is_read_without_a_change():
    with umask(0o027):
        assert store.umask() == 0o027 and store.umask() == 0o027


def test_the_copy_of_an_eval_task_folder_is_private_to_the_process(tmp_path):
    """``materialise_tasks`` copies a task folder (whose Python lm-eval imports) into a folder of its own that
    ``mkdtemp`` made: 0700 whatever the umask, this user's, under an unpredictable name; made once per process
    and content, and made anew when what it holds is no longer that folder (issue 47 item 1)."""
    from klsweep.evaluate.suites import materialise_tasks

    tasks = tmp_path / "tasks"
    shutil.copytree(Path(store.__file__).parent.parent / "evaltasks" / "tiny", tasks)
    with umask(0o022):
        copy = materialise_tasks(tasks)
    assert mode(copy) == 0o700 and copy.stat().st_uid == os.geteuid()
    assert materialise_tasks(tasks) == copy  # once per process
    copy.chmod(0o755)  # no longer shut to others: not used again
    fresh = materialise_tasks(tasks)
    assert fresh != copy and mode(fresh) == 0o700
    (tasks / "unique.txt").write_text("new content")
    assert materialise_tasks(tasks) not in (copy, fresh)


HOLD = """
import sys, time
from klsweep import store
from klsweep.errors import UserError
with store.training(sys.argv[1]):
    print("training", flush=True)
    time.sleep(600)
"""

SECOND = """
import sys
from klsweep import store
from klsweep.errors import UserError
try:
    with store.training(sys.argv[1], wait_s=1.0):
        print("second trainer trains")
except store.AlreadyTraining as e:
    print("refused:", e.problems[0].what)
"""


def test_one_trainer_per_run_even_when_its_lock_file_is_removed(tmp_path):
    """Issue 32 D4: ``rm <run>/.train.lock`` while a run trains, then a second trainer: both used to train
    (the lock was the file at the path; the newcomer locked a new file). Two real processes."""
    run_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "training"
        (run_dir / store.TRAIN_LOCK).unlink()  # by hand
        assert store.trainer_of(run_dir) is not None  # still seen training (status: running)
        second = subprocess.run(
            [sys.executable, "-c", SECOND, str(run_dir)], capture_output=True, text=True, timeout=60
        )
        assert second.stdout.startswith("refused: already being trained"), second.stdout + second.stderr
        with pytest.raises(store.AlreadyTraining), store.training(run_dir, wait_s=0.5):
            pytest.fail("trains beside the first trainer")
        # the lock file replaced by another one (a copy put back): still refused
        (run_dir / store.TRAIN_LOCK).write_text("{}\n")
        with pytest.raises(store.AlreadyTraining), store.training(run_dir, wait_s=0.5):
            pytest.fail("trains beside the first trainer")
    finally:
        first.kill()  # kill -9: the kernel releases every lock
        first.wait()
    assert store.trainer_of(run_dir) is None
    with store.training(run_dir, wait_s=0.5):
        assert store.trainer_of(run_dir)["pid"] == os.getpid()


def test_a_trainer_finds_its_lock_file_removed_or_taken(tmp_path):
    """``check_training``, a trainer's check at each step (#32 D4 across the nodes of NFS, where a folder's
    lock holds on its node only): its lock file removed by hand is locked again, its record back; a file
    another trainer locked in its place stops it (``LostTrainingLock``, naming that trainer)."""
    run_dir = tmp_path / "run"
    store.check_training(run_dir)  # no lock held here: nothing to check
    with store.training(run_dir, wait_s=0.5):
        store.check_training(run_dir)
        (run_dir / store.TRAIN_LOCK).unlink()  # by hand
        store.check_training(run_dir)
        assert json.loads((run_dir / store.TRAIN_LOCK).read_text())["pid"] == os.getpid()
        assert store.trainer_of(run_dir)["pid"] == os.getpid()
        other = subprocess.Popen(
            [sys.executable, "-c", OTHER_NODE, str(run_dir)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert other.stdout.readline().strip() == "locked"
            with pytest.raises(
                store.LostTrainingLock, match=f"already being trained by pid {other.pid} on node2"
            ):
                store.check_training(run_dir)
        finally:
            other.kill()
            other.wait()
    assert not store.lock._held


@pytest.mark.parametrize("command", ["status", "report"])
def test_status_and_report_agree_on_a_folder_without_runs(command, tmp_path, monkeypatch, capsys):
    """Issue 32 D27: `klsweep status /` exited 0 with an empty table where `report /` said "has no runs"."""
    from clitools import cli

    (tmp_path / "notes").mkdir()
    for folder in (tmp_path, Path("/")):
        code, out, err = cli([command, folder], monkeypatch, capsys)
        assert code == 2 and f"{folder}: has no runs" in " ".join(err.split()), out + err
        assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]


def test_a_rehearsals_run_folder_moved_into_a_sweep_is_refused(tmp_path):
    """A rehearsal's run folder copied into a sweep keeps its mark: the sweep is refused, naming it."""
    sweep = tmp_path / "sweep"
    for run in ("a1", "b2"):
        (sweep / run).mkdir(parents=True)
        (sweep / run / store.CONFIG_FILE).write_text("{}\n")
    store.refuse_rehearsal(sweep)  # a sweep's own runs
    (sweep / "b2" / store.REHEARSAL_MARKER).write_text("")
    with pytest.raises(UserError, match=r"holds \(b2\) a rehearsal.*rm -r .*b2"):
        store.refuse_rehearsal(sweep)
    with pytest.raises(UserError, match="is a rehearsal"):
        store.resolve_sweep(sweep / "b2")
    assert store.resolve_sweep(sweep / "b2", rehearsal=True) == sweep / "b2"
