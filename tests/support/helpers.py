"""Waiting for a condition, for every test: never a fixed sleep before an assertion.

A fixed ``pause(0.4)`` or ``time.sleep(1.5)`` followed by an assertion fails on
a loaded machine, where the thing takes longer; waiting for the asserted
condition itself is both faster and sure.  ``wait_until`` is for Pilot tests
of the UI (it lets the app run while it waits), ``wait_for`` for everything
else.  Both return the predicate's (true) value, and both take:

* ``fail_if``: a condition under which waiting on is pointless (the job ended
  first): it fails at once, with what ``fail_if`` returned;
* ``retry_on``: the exceptions from the predicate that mean "not yet".  For
  ``wait_until`` any ``Exception`` (a widget not mounted yet, a table row not
  added yet); for ``wait_for`` none: an exception fails at once.
* ``what``: what is waited for, for the failure message (a string, or a
  function that returns one when the wait fails).

(``tests/support`` is on ``sys.path`` for every test, put there by ``tests/conftest.py``:
``from helpers import wait_for, wait_until``.)
"""

from __future__ import annotations

import time
from typing import Any, Callable

UI_TIMEOUT = 15.0  # seconds, for something in the UI to show up

def _describe(what) -> str:
    return what() if callable(what) else what


def _check(pred: Callable[[], Any], fail_if, what, retry_on) -> tuple[Any, BaseException | None]:
    """(pred's value; the exception it raised, if one of ``retry_on``)."""
    if fail_if is not None:
        why = fail_if()
        if why:
            raise AssertionError(f"gave up waiting for {_describe(what)}: {why}")
    try:
        return pred(), None
    except retry_on as e:
        return None, e


def _timed_out(timeout: float, what, err: BaseException | None) -> AssertionError:
    last = f" (the last check raised {type(err).__name__}: {err})" if err is not None else ""
    return AssertionError(f"timed out after {timeout:g}s waiting for {_describe(what)}{last}")


async def wait_until(pilot, pred: Callable[[], Any], timeout: float = UI_TIMEOUT,
                     what: str | Callable[[], str] = "condition", step: float = 0.05,
                     fail_if: Callable[[], Any] | None = None,
                     retry_on: tuple[type[BaseException], ...] = (Exception,)) -> Any:
    """Let the app run (``pilot.pause(step)``) until ``pred()`` is true; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        v, err = _check(pred, fail_if, what, retry_on)
        if v:
            return v
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what, err)
        await pilot.pause(step)


def wait_for(pred: Callable[[], Any], timeout: float = 60, interval: float = 0.1,
             what: str | Callable[[], str] = "condition", fail_if: Callable[[], Any] | None = None,
             retry_on: tuple[type[BaseException], ...] = ()) -> Any:
    """Call ``pred()`` every ``interval`` seconds until it is true; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        v, err = _check(pred, fail_if, what, retry_on)
        if v:
            return v
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what, err)
        time.sleep(interval)


def per_line(events) -> list:
    """The events with every ``logs`` batch spread into one ``log`` event per
    line (what ``--json`` prints): for tests that look at lines one by one."""
    from ddptop.core.model.events import LogBatch

    out: list = []
    for e in events:
        if isinstance(e, LogBatch):
            out += e.lines()
        else:
            out.append(e)
    return out


def logs(t: float, rank, *texts: str, stream: str = "stdout", path: str = "", transient: bool = False,
         partial: tuple = ()):
    """A ``logs`` batch of these lines (offsets as if they were the file's first lines)."""
    from itertools import accumulate

    from ddptop.core.model.events import LogBatch

    offsets = tuple(accumulate((len(x.encode("utf-8", "surrogatepass")) + 1 for x in texts[:-1]), initial=0))
    return LogBatch(t, rank, stream, 0, path, "", offsets, tuple(texts), tuple(partial), transient)


def log_line(t: float, rank=None, stream: str = "stdout", text: str = "", path: str = "", transient: bool = False):
    """A ``logs`` batch of one line."""
    return logs(t, rank, text, stream=stream, path=path, transient=transient)


def matcher_fails_on(monkeypatch, marker: str = "BAD") -> None:
    """Make the signature matcher raise (a bug) on lines holding ``marker``, as if it had one."""
    from ddptop.core.analysis.signatures import SignatureMatcher

    inner = SignatureMatcher._feed

    def feed(self, text, rank, line, source, node=""):
        if marker in text:
            raise KeyError("boom")
        return inner(self, text, rank, line, source, node)

    monkeypatch.setattr(SignatureMatcher, "_feed", feed)


def favour(pid: int) -> None:
    """Give a process that a test measures the CPU use of a larger share of the cores than
    other work on the machine (nice -10; where allowed: root), so that a busy loop reads busy
    on a machine shared with other test runs."""
    import psutil

    try:
        psutil.Process(pid).nice(-10)
    except psutil.Error:  # not allowed (not root), or gone
        pass


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a launch's own rendezvous port, so tests can run side by side)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
