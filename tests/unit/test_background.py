"""``report.background.in_background``: work in a forked child, its result sent back; redone in this process
(and its error raised here) when the child fails; done at once on one core, for small work, or in a daemonic
process."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from klsweep.report import background


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(background, "usable_cores", lambda: 2)


def _pid() -> int:
    return os.getpid()


def _twice_but_not_in_a_child(parent: int, x: int) -> int:
    if os.getpid() != parent:
        raise RuntimeError("in the child")
    return 2 * x


def _dies_in_a_child(parent: int) -> str:
    if os.getpid() != parent:
        os._exit(3)
    return "here"


def _unpicklable_in_a_child(parent: int):
    return (lambda: 0) if os.getpid() != parent else "here"


def _bad_input() -> None:
    raise ValueError("bad input: beta must be >= 0")


def test_the_work_runs_in_a_child_and_its_result_comes_back(two_cores):
    wait = background.in_background(_pid)
    assert wait() != os.getpid()


def test_a_child_that_fails_is_redone_here(two_cores):
    parent = os.getpid()
    assert background.in_background(_twice_but_not_in_a_child, parent, 21)() == 42
    assert background.in_background(_dies_in_a_child, parent)() == "here"
    assert background.in_background(_unpicklable_in_a_child, parent)() == "here"


def test_the_error_of_the_work_is_raised_here(two_cores):
    wait = background.in_background(_bad_input)
    with pytest.raises(ValueError, match="beta must be >= 0"):
        wait()


def test_one_core_or_small_work_runs_at_once_here(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(background, "usable_cores", lambda: 1)
    wait = background.in_background(calls.append, 1)
    assert calls == [1]  # done before the wait, in this process
    wait()
    monkeypatch.setattr(background, "usable_cores", lambda: 2)
    assert background.in_background(_pid, fork=False)() == os.getpid()


def _large() -> bytes:
    return b"x" * 10_000_000  # more than a pipe holds: the child blocks sending it until it is read


def test_a_child_never_waited_for_is_stopped_when_its_call_is_dropped(two_cores):
    import gc
    import time

    before = set(multiprocessing.active_children())
    wait = background.in_background(_large)
    (child,) = set(multiprocessing.active_children()) - before
    time.sleep(0.2)
    assert child.is_alive()  # blocked sending
    del wait  # the caller raised before waiting
    gc.collect()
    child.join(timeout=10)
    assert not child.is_alive()


def _in_a_daemon(queue) -> None:
    background.usable_cores = lambda: 2
    queue.put((os.getpid(), background.in_background(_pid)()))


def test_a_daemonic_process_does_the_work_itself():
    """A daemonic process may not have children (multiprocessing's assertion): the work is done at once."""
    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()
    daemon = fork.Process(target=_in_a_daemon, args=(queue,), daemon=True)
    daemon.start()
    pid, worker = queue.get(timeout=60)
    daemon.join(timeout=60)
    assert worker == pid == daemon.pid
