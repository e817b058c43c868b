"""A run's own story, from its journal: what ddptop saw and did, replayed.

``story(run_dir)`` replays the run's events through the same live analysis
(``pipeline.Pipeline``, the analyzer and its stall detector) on the run's own
clock, as the supervisor fed them: the steps and batches, the telemetry, the
stack samples and NCCL RAS answers at the times they came.  What it raises is
the post-mortem's hang (never the recorded alarm's text copied); the alarms the
run recorded are kept beside it, and where the two differ both are said.  It
also reads who ended the run (``EndedBy``: ddptop's ``--on-stall kill``, a stop
asked of ddptop, a signal from outside, the job itself) and the stack
samples' latest verdict.

Only reads; the journal is the source of truth.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

from ddptop.core.model.events import (
    FINAL_STATES,
    AlarmEvent,
    Event,
    LogBatch,
    LogMarks,
    StacksEvent,
    StateEvent,
)
from ddptop.core.model.run_meta import Thresholds
from ddptop.core.run import journal
from ddptop.core.run.launcher import launch_options
from ddptop.core.run.pipeline import Pipeline
from ddptop.core.run.profiles import ProfileError, in_effect, load_all
from ddptop.core.run.run_session import Session

__all__ = ["EndedBy", "RunStory", "story", "timed_events"]

TICK = 0.5  # seconds of the run's clock between two stall checks of the replay, where no event came
MAX_GAP_TICKS = 2400  # a longer silence is crossed in this many ticks (20 minutes of checks), then jumped

# who ended a run, in words
ENDED_WORDS = {
    "ddptop-on-stall": "ddptop stopped it: the job stalled (--on-stall kill)",
    "ddptop-relaunch": "ddptop relaunched it",
    "ddptop-stop": "a stop asked of ddptop (its view, an attachment, or a signal to its supervisor)",
    "outside": "a signal from outside (a person, a script, the OOM killer?)",
    "scheduler": "the scheduler (SLURM: its time limit, a cancel, an OOM kill of the step)",
    "job": "the job itself (torchrun exited)",
    "running": "nobody yet: the run was still going when it was read",
    "lost": "unknown: ddptop's supervisor went away before the run's end was recorded",
    "": "unknown",
}


@dataclass(frozen=True)
class EndedBy:
    by: str  # a key of ENDED_WORDS
    state: str = ""  # the final state (SUCCEEDED, FAILED, STOPPED), "" when none was recorded
    exit_code: int | None = None
    t: float | None = None
    message: str = ""  # the supervisor's own words

    @property
    def words(self) -> str:
        return ENDED_WORDS.get(self.by, self.by)

    def to_dict(self) -> dict:
        return {"by": self.by, "words": self.words, "state": self.state, "exit_code": self.exit_code,
                "t": self.t, "message": self.message}


@dataclass(frozen=True)
class RunStory:
    stalls: tuple[AlarmEvent, ...] = ()  # the replay's stall alarms
    recorded: tuple[AlarmEvent, ...] = ()  # the stall alarms the run recorded live
    alarms: tuple[AlarmEvent, ...] = ()  # the other alarms it recorded (GPU lost, Xid, crashes, signatures)
    stacks: tuple[StacksEvent, ...] = ()  # every stack sampling, in order
    ended_by: EndedBy = field(default_factory=lambda: EndedBy(""))
    differences: tuple[str, ...] = ()  # where the replay and the recorded alarms differ
    applied: frozenset[str] = frozenset()  # profiles that would change nothing in it (``_applied``): never suggested

    @property
    def hang(self) -> AlarmEvent | None:
        """The run's hang: the replay's first stall alarm, else the recorded one."""
        return self.stalls[0] if self.stalls else (self.recorded[0] if self.recorded else None)


UNTIMED = ("its journal does not say when the log lines were read (an earlier ddptop wrote it), so the "
           "replay cannot place steps known only from the logs")


def _compare(replayed: list[AlarmEvent], recorded: list[AlarmEvent], untimed: bool = False) -> list[str]:
    """Where the replay and the recorded stall alarms differ (``untimed``: the journal has no ``LogMarks``,
    and that is said as the likely reason)."""
    out = []
    if recorded and not replayed:
        a = recorded[0]
        out.append(f"the run raised [{a.id}] culprits {list(a.culprits)} live, the replay raised no stall")
    elif replayed and not recorded:
        a = replayed[0]
        out.append(f"the replay raised [{a.id}] culprits {list(a.culprits)}, the run raised no stall live")
    elif replayed and recorded:
        a, b = replayed[0], recorded[0]
        if set(a.culprits) != set(b.culprits) or a.id != b.id:
            out.append(f"the replay raised [{a.id}] culprits {list(a.culprits)}; the run raised [{b.id}] culprits "
                       f"{list(b.culprits)} live")
    return [f"{d} ({UNTIMED})" for d in out] if untimed else out


_OLD_ENDS = (  # the supervisor's words before StateEvent.ended_by, for journals of earlier releases
    (re.compile(r"--on-stall kill"), "ddptop-on-stall"),
    (re.compile(r"^stopped on request"), "ddptop-stop"),
    (re.compile(r"^torchrun exited with"), "job"),
)


def _ended(final: StateEvent | None, lost: bool) -> EndedBy:
    if final is None:
        return EndedBy("lost" if lost else "running")
    by = final.ended_by
    if not by:
        by = next((k for rx, k in _OLD_ENDS if rx.search(final.message)), "")
    return EndedBy(by, final.state, final.exit_code, final.t, final.message)


def _arrived(ev: Event) -> float:
    """When the live analysis had the event: a stack sampling's is stamped at
    its start and arrives when its last sample is read (``span`` later)."""
    return ev.t + ev.span if isinstance(ev, StacksEvent) else ev.t


def _read_all(run_dir: Path) -> list[Event]:
    """Everything the run wrote: its journal's events (with its ``LogMarks``) and its logs."""
    out: list[Event] = []
    s = Session(run_dir, marks=True)
    try:
        while True:
            batch = s.poll()
            if not batch:
                if s.backlog:
                    continue  # (a poll's share of bytes used up: more to read now)
                break  # read to the end (of a live run: to what it has written so far)
            out.extend(batch)
    finally:
        s.close()
    return out


def _timed(events: list[Event]) -> tuple[list[Event], bool]:
    """The run's events in the order the live analysis had them.  A finished run's logs are read all at
    once: each line is given the time the supervisor read it live, from the journal's ``LogMarks`` (a line
    past the last mark: when the run ended, else when it was read now); a journal without marks (an
    earlier release) keeps the time of this read.  Also: whether the journal had marks."""
    marks: dict[str, list[tuple[int, float]]] = {}
    end: float | None = None
    for ev in events:
        if isinstance(ev, LogMarks):
            for path, reads in ev.upto.items():
                if isinstance(path, str) and isinstance(reads, list):
                    marks.setdefault(path, []).extend((r[0], float(r[1])) for r in reads if _read_pair(r))
        elif isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
            end = ev.t
    by_path = {path: _offsets_and_times(m) for path, m in marks.items()}
    out: list[Event] = []
    for ev in events:
        if isinstance(ev, LogMarks):
            continue
        m = by_path.get(ev.path) if isinstance(ev, LogBatch) else None
        if m is None or not isinstance(ev, LogBatch):
            out.append(ev)
            continue
        out.extend(_split(ev, *m, end if end is not None else ev.t))
    return sorted(out, key=_arrived), bool(marks)


def _read_pair(r) -> bool:
    """A mark's ``[offset, t]`` (anything else, in a damaged or foreign journal, is passed over)."""
    return (isinstance(r, list) and len(r) == 2 and type(r[0]) is int and isinstance(r[1], (int, float))
            and not isinstance(r[1], bool))


def _offsets_and_times(marks: list[tuple[int, float]]) -> tuple[list[int], list[float]]:
    """A file's marks as offsets, sorted, and for each the earliest time a line up to it had been read."""
    marks = sorted(marks)
    times = [t for _u, t in marks]
    for i in range(len(times) - 2, -1, -1):
        times[i] = min(times[i], times[i + 1])
    return [u for u, _t in marks], times


def _split(b: LogBatch, uptos: list[int], times: list[float], after: float) -> list[LogBatch]:
    """A batch cut where its lines' read times change (``uptos[i]``: a line at or before this offset had
    been read by ``times[i]``; a line past the last: ``after``)."""
    at = [times[i] if (i := bisect_left(uptos, off)) < len(times) else after for off in b.offsets]
    cut = set(b.partial)
    out, start = [], 0
    for i in range(1, len(at) + 1):
        if i == len(at) or at[i] != at[start]:
            last = i == len(at)
            out.append(LogBatch.fast(at[start], b.rank, b.stream, b.attempt, b.path, b.offsets[start:i],
                                     b.texts[start:i], tuple(j - start for j in range(start, i) if j in cut),
                                     b.transient and last, b.node))
            start = i
    return out


def _applied(run_dir: Path, meta) -> set[str]:
    """The profiles the run was launched with, named or in effect by what ddptop set, and those its shape
    leaves nothing to change (``in_effect``): not suggested again."""
    try:
        return set(meta.profiles or ()) | in_effect(load_all(), meta.env_set, run_dir,
                                                    launch_options(meta.command, meta.launch_env()))
    except (ProfileError, OSError):  # (a profile file broken since: the named ones)
        return set(meta.profiles or ())


def timed_events(run_dir: Path | str) -> tuple[list[Event], bool]:
    """Everything a run wrote, its log lines at the times its live analysis read them (see ``_timed``), in
    that order; and whether its journal said those times (``LogMarks``: False for an earlier release's)."""
    return _timed(_read_all(Path(run_dir)))


def story(run_dir: Path | str, timed: tuple[list[Event], bool] | None = None) -> RunStory:
    """Replay a run's journal (see the module); ``timed``: the run as ``timed_events`` read it, if it was."""

    run_dir = Path(run_dir)
    meta = journal.load_meta(run_dir)
    now = [0.0]
    applied = frozenset(_applied(run_dir, meta))  # (read once: the profile files as they are now)
    pipe = Pipeline(node=meta.host, stall_after=meta.stall_after, clock=lambda: now[0],
                    thresholds=Thresholds.from_dict(meta.thresholds),
                    sampler=lambda _utils: True,  # (the samples the run took arrive from its journal, in time)
                    in_effect=lambda: applied)
    replayed: list[AlarmEvent] = []
    recorded: list[AlarmEvent] = []
    others: list[AlarmEvent] = []
    stacks: list[StacksEvent] = []
    final: StateEvent | None = None
    started = False

    def advance(to: float) -> None:
        """Stall checks every TICK of the run's clock up to ``to`` (a long silence: its first MAX_GAP_TICKS)."""
        if not started:
            now[0] = to
            return
        n = 0
        while now[0] + TICK < to and n < MAX_GAP_TICKS:
            now[0] += TICK
            n += 1
            replayed.extend(a for a in pipe.process([], now[0], check=True) if isinstance(a, AlarmEvent))
        now[0] = max(now[0], to)

    events, marked = timed if timed is not None else timed_events(run_dir)
    logs = any(isinstance(ev, LogBatch) and ev.rank is not None for ev in events)
    for ev in events:
        at = _arrived(ev)
        advance(at)
        started = True
        if isinstance(ev, AlarmEvent):
            (recorded if ev.type == "stall" else others).append(ev)
            continue
        if isinstance(ev, StacksEvent):
            stacks.append(ev)
        if isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
            final = ev
        replayed.extend(a for a in pipe.process([ev], at, check=True) if isinstance(a, AlarmEvent)
                        and a.type == "stall")
    lost = final is None and journal.run_state(run_dir).state == "lost"
    replayed = [a for a in replayed if a.type == "stall"]
    return RunStory(tuple(replayed), tuple(recorded), tuple(others), tuple(stacks), _ended(final, lost),
                    tuple(_compare(replayed, recorded, untimed=logs and not marked)), applied)
