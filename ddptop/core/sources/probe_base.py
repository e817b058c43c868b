"""The one base of the background probes.

A probe looks at the job off the caller's thread, so that the watching
never waits on py-spy, NCCL's RAS port or NVML, and says what it found
through ``emit`` (the owner's event stream).  Two shapes:

* ``Job``: one run at a time, asked for (a stack capture, a stack sampling,
  a RAS query).  ``_start`` refuses while one is under way; ``wait`` waits
  for it to end.
* ``Loop``: runs from ``start`` until ``stop`` (the stack watch, telemetry,
  RAS's pushed events).

Both catch broadly in one place only, the thread's boundary: an error there
is said through ``emit`` in the probe's own words (``_failed``), instead of a
thread that dies with a traceback on a terminal nobody reads.  Inside, a
probe catches only the errors it means.

``unique_path``: a file or directory name under a probe's output folder
that no earlier output has (two captures in one second).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from ddptop.core.model.events import Event

Emit = Callable[[list[Event]], None]


class Job:
    """One run at a time in a daemon thread of its own (``thread_name``).

    A subclass's ``request`` claims the one slot (``_claim``: False while a
    run is under way), does what must come before the run, then
    ``_launch(*args)``, which runs ``_run(*args)`` in the thread; or both at
    once with ``_start(*args)``.  ``_failed(error, *args)`` gives the events
    that say an unexpected error ended the run."""

    thread_name = "ddptop-probe"

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self._cond = threading.Condition()
        self._running = False

    @property
    def busy(self) -> bool:
        """A run is under way."""
        return self._running

    def wait(self, timeout: float | None = None) -> bool:
        """Until the run under way, if any, has ended (its events emitted);
        False: it still runs after ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._running, timeout)

    def _claim(self) -> bool:
        with self._cond:
            if self._running:
                return False
            self._running = True
            return True

    def _launch(self, *args: Any) -> None:
        try:
            threading.Thread(target=self._guarded, args=args, name=self.thread_name, daemon=True).start()
        except BaseException:
            self._release()
            raise

    def _start(self, *args: Any) -> bool:
        if not self._claim():
            return False
        self._launch(*args)
        return True

    def _release(self) -> None:
        with self._cond:
            self._running = False
            self._cond.notify_all()

    def _guarded(self, *args: Any) -> None:
        try:
            self._run(*args)
        except Exception as e:  # noqa: BLE001 - the thread's boundary: said, never lost, and the watching goes on
            self.emit(self._failed(e, *args))
        finally:
            self._release()

    def _run(self, *args: Any) -> None:
        raise NotImplementedError

    def _failed(self, error: Exception, *args: Any) -> list[Event]:
        raise NotImplementedError


class Loop:
    """``_loop`` in a daemon thread of its own (``thread_name``) from
    ``start`` (once; later calls do nothing) until ``stop``: the loop ends
    when ``_stopped`` is set.  ``_failed(error)`` gives the events that say an
    unexpected error ended it."""

    thread_name = "ddptop-loop"

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._guarded, name=self.thread_name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Until the loop has ended (after ``stop``, or on its own); False:
        it still runs after ``timeout`` seconds.  True if never started."""
        t = self._thread
        if t is not None:
            t.join(timeout)
            return not t.is_alive()
        return True

    def _guarded(self) -> None:
        try:
            self._loop()
        except Exception as e:  # noqa: BLE001 - the thread's boundary: said, never lost, and the watching goes on
            self.emit(self._failed(e))

    def _loop(self) -> None:
        raise NotImplementedError

    def _failed(self, error: Exception) -> list[Event]:
        raise NotImplementedError


def unique_path(parent: Path, stem: str, suffix: str = "") -> Path:
    """``parent/<stem><suffix>``, or, where that exists already (two outputs
    in one second), the first free ``parent/<stem>.<n><suffix>`` from 2."""
    p = parent / f"{stem}{suffix}"
    n = 1
    while p.exists():
        n += 1
        p = parent / f"{stem}.{n}{suffix}"
    return p
