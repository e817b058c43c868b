"""GPU and process samples (``core.sources.telemetry``) once per interval, off the
caller's thread."""

from __future__ import annotations

import time
from typing import Callable

from ddptop.core.model.events import Event, NoteEvent
from ddptop.core.sources.probe_base import Emit, Loop
from ddptop.core.sources.telemetry import Telemetry, make_backend


class TelemetryLoop(Loop):
    """GPU and process samples once per interval, off the caller's thread.

    Poll, then reschedule: a slow tick (a hung NVML call) delays the next one
    and never overlaps it.  ``ranks()`` says which processes to sample."""

    thread_name = "ddptop-sampler"

    def __init__(self, mode: str, node: str, interval: float, ranks: Callable[[], list], emit: Emit):
        super().__init__(emit)
        self.mode, self.node, self.interval = mode, node, interval
        self.ranks = ranks
        self._tel: Telemetry | None = None

    def _failed(self, error: Exception) -> list[Event]:
        # (the backend could not be opened: no GPU library, no device)
        what = "telemetry disabled" if self._tel is None else "telemetry failed"
        return [NoteEvent(time.time(), "warning", f"{what}: {error!r}")]

    def _loop(self) -> None:

        tel = self._tel = Telemetry(make_backend(self.mode, self.node), self.node)
        try:
            while not self._stopped.is_set():
                t0 = time.monotonic()
                try:
                    self.emit(tel.tick(self.ranks()))
                except Exception as e:  # noqa: BLE001 - one tick of the thread's loop: a failed tick is said, and the next one comes
                    self.emit([NoteEvent(time.time(), "warning", f"telemetry tick failed: {e!r}")])
                self._stopped.wait(max(0.05, self.interval - (time.monotonic() - t0)))
        finally:
            try:
                tel.backend.shutdown()
            except Exception as e:  # noqa: BLE001 - the thread's end: said (the samples are already out)
                self.emit([NoteEvent(time.time(), "warning", f"telemetry shutdown failed: {e!r}")])
