"""One thread reads every agent link of this process.

``ddptop attach`` to 128 nodes holds 128 links (``ssh``, ``srun`` or
``kubectl exec`` processes, each writing the agent's JSON lines to a pipe).
Each link's thread owns its connection's life (start it, wait out the
backoff, follow the node's attempts: blocking work, a cluster's command among
it), but none of them reads: while a connection is up its thread sleeps, and
this one thread, with one selector over every link's pipe, reads whatever
arrived and hands it to that link's decoder.  128 threads each waking for each
line fought over the GIL with the poll thread and the view; one reader wakes
once for all that arrived together.

``follow(fd, feed, idle, closed)``: read ``fd`` until ``feed(chunk)`` returns
an outcome, the pipe ends (None), ``idle(now)`` returns one (a link silent for
too long), or ``closed`` is set (``CLOSED``).  ``feed`` and ``idle`` run on the
reader thread: they decode and queue, never block.
"""

from __future__ import annotations

import collections
import os
import selectors
import threading
import time
from typing import Callable

Outcome = tuple[str, str]
CLOSED: Outcome = ("closed", "detached")
IDLE_EVERY = 0.5  # seconds between the checks of every link's silence
READ_SIZE = 1 << 20


class _Follow:
    __slots__ = ("fd", "feed", "idle", "done", "outcome")

    def __init__(self, fd: int, feed: Callable[[bytes], Outcome | None], idle: Callable[[float], Outcome | None]):
        self.fd = fd
        self.feed = feed
        self.idle = idle
        self.done = threading.Event()
        self.outcome: Outcome | None = None


class LinkReader:
    """The selector and its thread (started at the first ``follow``)."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._changes: collections.deque[tuple[bool, _Follow]] = collections.deque()  # (add?, follow)
        self._follows: dict[int, _Follow] = {}  # (the reader thread's own)
        self._start = threading.Lock()
        self._thread: threading.Thread | None = None

    def follow(self, fd: int, feed: Callable[[bytes], Outcome | None], idle: Callable[[float], Outcome | None],
               closed: threading.Event) -> Outcome | None:
        f = _Follow(fd, feed, idle)
        self._change(True, f)
        while not f.done.wait(IDLE_EVERY):
            if closed.is_set():
                break
        if closed.is_set():
            self._change(False, f)
            f.done.wait(10)  # (the reader has let go of the fd: it may be closed and its number reused)
            return CLOSED
        return f.outcome

    @property
    def links(self) -> int:
        """The links being read now."""
        return len(self._follows)

    def _change(self, add: bool, f: _Follow) -> None:
        self._changes.append((add, f))
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="link-reader")
                self._thread.start()
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # (already full of wakes: the reader will look)

    def _apply_changes(self) -> None:
        while self._changes:
            add, f = self._changes.popleft()
            if add:
                try:
                    self._sel.register(f.fd, selectors.EVENT_READ, f)
                except (ValueError, KeyError, OSError) as e:  # (a closed pipe; a number still registered)
                    f.outcome = ("lost", f"the link's pipe cannot be read ({e})")
                    f.done.set()
                    continue
                self._follows[f.fd] = f
            elif self._follows.get(f.fd) is f:
                self._finish(f, CLOSED)
            else:
                f.done.set()  # (finished already)

    def _finish(self, f: _Follow, outcome: Outcome | None) -> None:
        if self._follows.get(f.fd) is f:
            del self._follows[f.fd]
            self._sel.unregister(f.fd)
        f.outcome = outcome
        f.done.set()

    def _loop(self) -> None:
        next_idle = time.monotonic() + IDLE_EVERY
        while True:
            for key, _ in self._sel.select(max(0.0, next_idle - time.monotonic())):
                f: _Follow | None = key.data
                if f is None:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                    continue
                if self._follows.get(f.fd) is not f:
                    continue  # (finished earlier in this round)
                try:
                    chunk = os.read(f.fd, READ_SIZE)
                except OSError:
                    chunk = b""
                if chunk:
                    self._call(f, f.feed, chunk)
                else:
                    self._finish(f, None)
            self._apply_changes()
            now = time.monotonic()
            if now >= next_idle:
                for f in list(self._follows.values()):
                    self._call(f, f.idle, now)
                next_idle = now + IDLE_EVERY

    def _call(self, f: _Follow, fn: Callable, arg) -> None:
        try:
            out = fn(arg)
        except Exception as e:  # noqa: BLE001 - the reader thread's boundary: one link's failure ends that link, said
            out = ("lost", f"reading the link failed: {type(e).__name__}: {e}")
        if out is not None:
            self._finish(f, out)


_reader: LinkReader | None = None
_made = threading.Lock()


def reader() -> LinkReader:
    """This process's link reader."""
    global _reader
    with _made:
        if _reader is None:
            _reader = LinkReader()
        return _reader
