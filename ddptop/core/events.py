"""The one event stream.

Every fact ddptop knows is an event: a frozen, JSON-serialisable dataclass
with a unix time ``t`` and a ``kind``.  Front ends (TUI, headless printer,
journal) only consume events.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

# Job states, in the order a job normally passes through them.
STARTING = "starting"
RUNNING = "running"
STOPPING = "stopping"
SUCCEEDED = "succeeded"
FAILED = "failed"
STOPPED = "stopped"
LOST = "lost"  # the supervisor vanished without recording an exit
FINAL_STATES = frozenset({SUCCEEDED, FAILED, STOPPED, LOST})


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str] = "event"
    t: float

    def to_dict(self) -> dict[str, Any]:
        d = {"t": self.t, "kind": self.kind}
        for f in dataclasses.fields(self):
            if f.name != "t":
                d[f.name] = getattr(self, f.name)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class StateEvent(Event):
    """The job's state changed.  ``exit_code`` is set once the job has ended."""

    kind: ClassVar[str] = "state"
    state: str = STARTING
    exit_code: int | None = None
    message: str = ""


@dataclass(frozen=True)
class RankEvent(Event):
    """A rank process was seen (or seen to end)."""

    kind: ClassVar[str] = "rank"
    rank: int = 0
    local_rank: int = 0
    node: str = ""
    pid: int | None = None
    attempt: int = 0
    alive: bool = True
    exit_code: int | None = None


@dataclass(frozen=True)
class LogEvent(Event):
    """One line of output.  ``rank`` is None for torchrun's own output.

    ``offset`` is the byte offset of the line's start in ``path`` (relative to
    the run directory), so a reader can resume exactly after it.
    ``partial`` is True for a line that was cut because it grew too long.
    ``transient`` is True for an in-place update (a ``\r`` progress bar) of a
    line that has not ended yet: show it, then replace it with the next one.
    """

    kind: ClassVar[str] = "log"
    rank: int | None = None
    stream: str = "stdout"
    text: str = ""
    attempt: int = 0
    path: str = ""
    offset: int = 0
    partial: bool = False
    transient: bool = False


@dataclass(frozen=True)
class NoteEvent(Event):
    """Something ddptop itself wants to tell the person (not an alarm)."""

    kind: ClassVar[str] = "note"
    level: str = "info"
    message: str = ""


_KINDS: dict[str, type[Event]] = {
    cls.kind: cls for cls in (StateEvent, RankEvent, LogEvent, NoteEvent)
}


def from_dict(d: dict[str, Any]) -> Event:
    """Rebuild an event from its dict form; unknown keys are ignored."""
    cls = _KINDS.get(d.get("kind", ""))
    if cls is None:
        raise ValueError(f"unknown event kind {d.get('kind')!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


def from_json(line: str) -> Event:
    return from_dict(json.loads(line))
