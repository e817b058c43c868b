"""Sleep until a watched file changes (watchfiles), or a deadline.

Readers of a run (the viewer, headless mode, the agent, the supervisor's
analysis) wait here between polls instead of polling every 0.1 s: a line a
rank writes wakes them within a few milliseconds, and an idle reader of a
quiet job wakes only for its own deadlines.

The watcher looks for events often right after a change and less often the
longer the files stay quiet (``STEPS``): every 2 ms for the first 0.1 s (a
stream of lines arrives within milliseconds; watchfiles hands a change over
after one to two such steps, so a line waits 3-4 ms, not the 8 ms of 5 ms
steps, for a few more wake-ups of a sleeping thread), every 25 ms up to a second, then
every 100 ms (the first line after a quiet spell waits up to that long; an
idle reader, or one of a job that writes once a second, costs almost nothing).
A reader that paces itself (the agent) looks less often (``look_every``): at
2 ms its watcher woke 500 times a second for reads it paced anyway.

Where file events are unavailable (watchfiles cannot start: no inotify,
the watch limit reached) or silently missing (a network filesystem, some
containers: the files grow but no event comes), the reader polls instead,
every ``POLL_EVERY`` seconds, and says so once (``take_note``).  Missing
events are noticed by the reader's own deadline polls: new data that no
event announced, twice, means events are not coming.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Sequence

from ddptop.core.model.settings import settings

POLL_EVERY = 0.1  # seconds between polls when file events are not available
# (seconds since the last change, ms between looks for file events until then)
STEPS = ((0.1, 2), (1.0, 25), (float("inf"), 100))
MISSES = 2  # polls in a row that found data no event announced, before falling back to polling
ADDED = 1  # watchfiles' Change.added


class FileWaker:
    def __init__(self, paths: Sequence[str | os.PathLike], *, clock: Callable[[], float] = time.monotonic,
                 force_polling: bool | None = None, min_gap: float = 0.0, look_every: float = 0.0):
        """``min_gap``: seconds between the ends of two waits, at least (a
        reader of a chatty job then polls at most 1/min_gap times a second,
        taking more lines each time, instead of once per write).  ``look_every``:
        seconds between the watcher's looks for events, at least (``STEPS``
        otherwise: a reader that paces itself gains nothing from looks every 2 ms)."""
        self.paths = [os.fspath(p) for p in paths]
        self.min_gap = min_gap
        self.look_every_ms = int(look_every * 1000)
        self._woke = 0.0
        self._interrupt = threading.Event()  # wake(): end the current (or next) wait now
        self._added = False  # a file was created (take_added)
        # the paths the file events named since take_changed (None: not known, read everything: a wake, polling)
        self._changed: set[str] | None = None
        self.clock = clock
        self.polling = False
        self._notify = None
        self._note: str | None = None
        self._last_change = clock()
        self._timed_out = False  # the last wait ended without a file event
        self._misses = 0
        if force_polling is None:
            force_polling = not settings().file_events
        if force_polling:
            self.polling = True
            return
        try:
            from watchfiles._rust_notify import RustNotify

            watched = [p for p in self.paths if os.path.exists(p)]
            if not watched:
                raise FileNotFoundError(f"none of {', '.join(self.paths)} exists")
            self._notify = RustNotify(watched, False, False, 50, True, True)
        except (ImportError, OSError, RuntimeError) as e:  # no watchfiles; no inotify (limits: RuntimeError)
            self._fall_back(f"file events are not available here ({type(e).__name__}: {e})")

    @property
    def quiet(self) -> bool:
        """The last wait ended without a file event (events are on: nothing changed)."""
        return self._timed_out and not self.polling

    @property
    def mode(self) -> str:
        return "polling" if self.polling else "file events"

    def wait(self, timeout: float) -> bool:
        """Until a watched file changes or ``timeout`` seconds pass (less when
        polling); True when a file event ended the wait.  A signal whose
        handler raised during the wait raises KeyboardInterrupt here."""
        if self._interrupt.is_set():
            self._interrupt.clear()
            self._timed_out = False  # (the poll after a wake reads everything)
            self._changed = None
            return False
        if timeout <= 0:
            return False
        gap = self._woke + self.min_gap - self.clock()
        if gap > 0:
            time.sleep(min(gap, timeout))
            timeout -= gap
            if timeout <= 0:
                self._woke = self.clock()
                return False
        try:
            return self._wait(timeout)
        finally:
            self._woke = self.clock()

    def _wait(self, timeout: float) -> bool:
        notify = self._notify
        if notify is None:
            self._interrupt.wait(min(timeout, POLL_EVERY))
            self._interrupt.clear()
            self._timed_out = True
            return False
        deadline = self.clock() + timeout
        r: str | set[tuple[int, str]]
        while True:
            quiet = self.clock() - self._last_change
            until, step = next((u, st) for u, st in STEPS if quiet < u)
            step = max(step, self.look_every_ms)
            left = deadline - self.clock()
            if left <= 0:
                r = "timeout"
                break
            span = min(left, until - quiet)  # this step until the next tier (or the deadline)
            try:
                r = notify.watch(1, step, max(1, int(span * 1000)), self._interrupt)
            except RuntimeError as e:  # the watching thread failed
                self._fall_back(f"file events stopped ({e})")
                return False
            if r != "timeout":
                break
        if r == "signal":
            raise KeyboardInterrupt
        if r == "stop":  # wake(): watchfiles drops the changes it had gathered, so the next poll reads all
            self._interrupt.clear()
            self._timed_out = False
            self._changed = None
            return False
        if isinstance(r, str):  # "timeout"
            self._timed_out = True
            return False
        self._timed_out = False
        self._last_change = self.clock()
        self._took(r)
        return True

    def _took(self, r: set[tuple[int, str]]) -> None:
        if any(change == ADDED for change, _path in r):
            self._added = True
        if self._changed is not None:
            self._changed.update(path for _change, path in r)

    def take_changed(self) -> set[str] | None:
        """The paths file events named since the last call, or None when that
        is not known (polling; a wake dropped them; the first call): read
        everything then."""
        changed, self._changed = self._changed, (None if self.polling else set())
        return changed

    def take_added(self) -> bool:
        """A file or directory was created since the last call (new rank logs to look for)."""
        added, self._added = self._added, False
        return added

    def wake(self) -> None:
        """End the current wait now (from another thread: a command came)."""
        self._interrupt.set()

    def saw(self, new_data: bool) -> None:
        """Tell it whether the poll after a wait found something new (data
        written since the poll before: not what that poll left to read).  New
        data after a wait that ended without a file event is a miss (unless its
        event is on the way: a write just after the wait gave up); after
        MISSES misses in a row, polling instead of waiting for events."""
        if not new_data:
            return
        if not self._timed_out or self._notify is None:
            self._last_change = self.clock()
            self._misses = 0  # an event announced it: events work
            return
        self._timed_out = False
        try:
            r = self._notify.watch(1, 1, 50, None)
        except RuntimeError:
            r = "timeout"
        if r == "signal":
            raise KeyboardInterrupt
        if not isinstance(r, str):
            self._last_change = self.clock()
            self._misses = 0
            self._took(r)
            return  # its event came: events work
        self._misses += 1
        if self._misses >= MISSES:
            self._fall_back("files changed without a file event (a network filesystem?)")

    def _fall_back(self, why: str) -> None:
        self.close()
        self.polling = True
        self._changed = None
        self._note = f"{why}: polling every {POLL_EVERY:g} s instead"

    def take_note(self) -> str | None:
        """What to tell the person about falling back to polling, once."""
        note, self._note = self._note, None
        return note

    def close(self) -> None:
        if self._notify is not None:
            try:
                self._notify.close()
            except (OSError, RuntimeError):  # already closed by watchfiles
                pass
            self._notify = None
