"""Work the report does in a forked child while it goes on with the rest (``in_background``): the figures, and
the configs of runs its cache does not hold, so that a report uses two cores where it has them; on one core,
without the ``fork`` start method or inside a daemonic process, the work is done at once."""

from __future__ import annotations

import multiprocessing
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from klsweep.environment import usable_cores

T = TypeVar("T")


def in_background(fn: Callable[..., T], *args: Any, fork: bool = True) -> Callable[[], T]:
    """Start ``fn(*args)`` in a forked child and return the call that waits for it and gives its result (sent
    back pickled). A child that fails (``fn`` raised, the child died, its result could not be sent) is done
    again in that call, in this process, where its error is raised as it would be without a child. ``fn`` runs
    now, in this process, with one usable core, without the ``fork`` start method, in a daemonic process
    (which may not have children), or when ``fork`` is False (work too small to pay for a process)."""
    if not fork or usable_cores() < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return _done(fn(*args))
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, fn, args), daemon=True)
    try:
        child.start()
    except AssertionError:  # "daemonic processes are not allowed to have children"
        receive.close()
        send.close()
        return _done(fn(*args))
    send.close()

    def wait() -> T:
        try:
            ok, result = receive.recv()
        except (EOFError, OSError):  # the child died before sending
            ok, result = False, None
        finally:
            receive.close()
        child.join()
        return result if ok and child.exitcode == 0 else fn(*args)

    # never waited for (the caller raised first): the child, which may be blocked sending a large result to a
    # process that will not read it, is stopped when the call is dropped, not left until this process exits
    weakref.finalize(wait, _stop, child)
    return wait


def _stop(child: Any) -> None:
    if child.is_alive():
        child.kill()
        child.join()


def _done(result: T) -> Callable[[], T]:
    return lambda: result


def _child(send: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Run in the child: send (True, result), or (False, None) when ``fn`` raised or its result cannot be
    pickled; the parent then does the work itself and raises the error there (none is printed here)."""
    try:
        send.send((True, fn(*args)))
    except BaseException:  # noqa: BLE001 - the parent redoes the work and raises it
        send.send((False, None))
    finally:
        send.close()
