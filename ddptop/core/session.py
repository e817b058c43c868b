"""Session: the one object every front end consumes.

A session reads a run's journal (events.jsonl, torchrun.log and every rank's
log files) and turns what is new into events.  It works the same for a job
launched a second ago, a detached job still running, and a finished run.
Commands: ``stop()``.  Detaching is simply no longer reading.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Iterator

from ddptop.core import journal
from ddptop.core.events import (
    FINAL_STATES,
    LOST,
    Event,
    LogEvent,
    NoteEvent,
    ProgressEvent,
    RankEvent,
    StateEvent,
    from_dict,
)
from ddptop.core.tailer import Tailer

SCAN_EVERY = 0.5  # seconds between looks for new rank log files
LOST_AFTER = 3.0  # seconds without a supervisor before a run counts as lost
LIVE_EVERY = 0.5  # seconds between looks at the supervisor process while polling


def _pid_matches(pid: int, create_time: float | None) -> bool:
    try:
        import psutil

        p = psutil.Process(pid)
        if create_time is not None and abs(p.create_time() - create_time) > 0.01:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


class Session:
    def __init__(self, run_dir: Path, clock=time.time, resume: dict[str, int] | None = None):
        """``resume``: a ``cursor()`` from an earlier session on this run; reading
        starts exactly after what that session had returned."""
        self.run_dir = Path(run_dir)
        self.meta = journal.load_meta(self.run_dir)
        self.clock = clock
        self._resume = dict(resume or {})
        self._events = self._tailer(self.run_dir / journal.EVENTS)
        self._torchrun = self._tailer(self.run_dir / journal.TORCHRUN_LOG)
        self._final_offset: int | None = None
        self._logs: dict[Path, tuple[Tailer, int, int, str]] = {}
        self._rank_of: dict[tuple[int, int], int] = {}  # (attempt, local_rank) -> rank
        self._last_scan = 0.0
        self._beats: dict[str, int] = {}  # beat file -> mtime_ns last read
        self._notes: dict[str, Tailer] = {}
        self._final: StateEvent | None = None
        self._supervisor_gone_since: float | None = None
        self._live_checked: tuple[float, bool] | None = None  # (when, answer) of the last real look
        self.finished = False
        self.stop_requested = False

    @classmethod
    def open(cls, run_dir: Path | str, resume: dict[str, int] | None = None) -> "Session":
        return cls(Path(run_dir), resume=resume)

    def _tailer(self, path: Path) -> Tailer:
        return Tailer(path, self._resume.get(os.path.relpath(path, self.run_dir), 0))

    def cursor(self) -> dict[str, int]:
        """Byte offsets (by path relative to the run directory) just after
        everything ``poll()`` has returned so far: ``Session.open(run,
        resume=cursor)`` continues with no line lost and none repeated."""
        run_dir = self.run_dir
        out = {journal.EVENTS: self._events.cursor, journal.TORCHRUN_LOG: self._torchrun.cursor}
        if self._final_offset is not None and not self.finished:
            out[journal.EVENTS] = self._final_offset  # the final state is read but not yet returned
        for path, (tailer, *_rest) in self._logs.items():
            out[os.path.relpath(path, run_dir)] = tailer.cursor
        for name, tailer in self._notes.items():
            out[f"{journal.BEATS}/{name}"] = tailer.cursor
        return out

    @classmethod
    def launch(cls, user_command: list[str], run_dir: Path | None = None, **options) -> "Session":
        from ddptop.core.launcher import launch

        return cls(launch(user_command, run_dir, **options))

    # -- the job -------------------------------------------------------------

    def _supervisor(self) -> dict | None:
        return journal.read_json(self.run_dir / journal.SUPERVISOR)

    @property
    def is_live(self) -> bool:
        """True while the supervisor that owns the job is running."""
        if self._final is not None or (self.run_dir / journal.EXIT).exists():
            return False
        sup = self._supervisor()
        if sup is None:
            # launched a moment ago: the supervisor has not written its pid yet
            return time.time() - (self.meta.started or 0) < 30
        return _pid_matches(sup["pid"], sup.get("create_time"))

    @staticmethod
    def _signal(sup: dict | None, sig: int) -> bool:
        """Signal the supervisor ``sup`` names, if it is still that process."""
        if sup is None or not _pid_matches(sup["pid"], sup.get("create_time")):
            return False
        try:
            os.kill(sup["pid"], sig)
        except ProcessLookupError:
            return False
        return True

    def stop(self) -> bool:
        """Ask the supervisor to stop the job.  Returns False if nothing to stop."""
        self.stop_requested = True
        deadline = time.time() + 5
        sup = self._supervisor()
        while sup is None and time.time() < deadline and self.is_live:
            time.sleep(0.05)
            sup = self._supervisor()
        return self._signal(sup, signal.SIGTERM)

    def dump_stacks(self) -> bool:
        """Ask the supervisor for every rank's Python stack now (py-spy); the
        result arrives as a note.  False if the job is not running."""
        return self._signal(self._supervisor(), signal.SIGUSR2)

    def relaunch(self, profiles: list[str], reason: str = "asked for") -> bool:
        """Stop the job completely and start it again with these profiles."""
        from ddptop.core.profiles import resolve

        resolve(profiles)  # unknown names fail here, with the list of known ones
        sup = self._supervisor()
        if sup is None or not _pid_matches(sup["pid"], sup.get("create_time")):
            return False
        journal.write_json(self.run_dir / journal.RELAUNCH, {"profiles": list(profiles), "reason": reason})
        return self._signal(sup, signal.SIGUSR1)

    # -- reading -------------------------------------------------------------

    def _rank_for(self, attempt: int, local_rank: int) -> int:
        r = self._rank_of.get((attempt, local_rank))
        if r is not None:
            return r
        m = self.meta
        if m.node_rank is not None and m.nproc_per_node is not None:
            return m.node_rank * m.nproc_per_node + local_rank
        return local_rank

    def _scan_logs(self) -> None:
        for attempt, local_rank, stream, path in journal.rank_log_files(Path(self.meta.log_dir)):
            if path not in self._logs:
                self._logs[path] = (self._tailer(path), attempt, local_rank, stream)

    def poll(self, max_bytes: int = 4 * 1024 * 1024) -> list[Event]:
        """Everything new since the last call.  Never blocks on the job."""
        if self.finished:
            return []
        now = self.clock()
        out: list[Event] = []
        final_seen = self._final is not None
        for line in self._events.read():
            try:
                ev = from_dict(json.loads(line.text))
            except (ValueError, TypeError) as e:
                out.append(NoteEvent(now, "warning", f"events.jsonl offset {line.offset}: unreadable line ({e})"))
                continue
            if isinstance(ev, RankEvent):
                self._rank_of[(ev.attempt, ev.local_rank)] = ev.rank
            if isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
                self._final = ev
                self._final_offset = line.offset
                continue
            out.append(ev)
        if self._final is not None and not final_seen:
            self._last_scan = 0.0  # one more full scan before the end
        if now - self._last_scan >= SCAN_EVERY:
            self._last_scan = now
            self._scan_logs()
        run_dir = str(self.run_dir)
        out.extend(self._read_beats(now))
        for tl in self._torchrun.read(max_bytes):
            out.append(LogEvent(now, None, "torchrun", tl.text, 0, journal.TORCHRUN_LOG, tl.offset, tl.partial, tl.transient))
        drained = self._torchrun.at_eof()
        for path, (tailer, attempt, local_rank, stream) in self._logs.items():
            lines = tailer.read(max_bytes)
            if lines:
                rank = self._rank_for(attempt, local_rank)
                rel = os.path.relpath(path, run_dir)
                fast = LogEvent.fast
                out.extend([fast(now, rank, stream, text, attempt, rel, off, part, trans)
                            for off, text, part, trans in lines])
            if not tailer.at_eof():
                drained = False
        if self._final is None and not self.is_live_cached(now):
            self._final = StateEvent(now, LOST, None, "the supervisor ended without recording an exit status")
            journal.write_json(self.run_dir / journal.EXIT, {"state": LOST, "exit_code": None, "t": now, "message": self._final.message})
        if self._final is not None and drained:
            for tailer, attempt, local_rank, stream in self._logs.values():
                for tl in tailer.flush():
                    out.append(LogEvent(now, self._rank_for(attempt, local_rank), stream, tl.text, attempt, os.path.relpath(tailer.path, run_dir), tl.offset, tl.partial))
            out.append(self._final)
            self.finished = True
        return out

    def _read_beats(self, now: float) -> list[Event]:
        """Step counts published by the in-rank hook or ddptop.beat()."""
        d = self.run_dir / journal.BEATS
        try:
            names = os.listdir(d)
        except OSError:
            return []
        out: list[Event] = []
        for name in names:
            source, _, rank = name.partition(".")
            if not rank.isdigit():
                continue
            path = os.path.join(d, name)
            if source == "note":
                t = self._notes.get(name)
                if t is None:
                    t = self._notes[name] = self._tailer(Path(path))
                out += [NoteEvent(now, "info", f"rank {rank}: {l.text}") for l in t.read()]
                continue
            if source not in ("hook", "beat"):
                continue
            try:
                st = os.stat(path)
                if self._beats.get(name) == st.st_mtime_ns:
                    continue
                self._beats[name] = st.st_mtime_ns
                with open(path, "rb") as f:
                    step_s, t_s = f.read(64).split()[:2]
                out.append(ProgressEvent(float(t_s), rank=int(rank), step=int(step_s), source=source))
            except (OSError, ValueError):
                continue
        return out

    def is_live_cached(self, now: float) -> bool:
        """is_live, but tolerant of a moment's gap and cheap when polled often."""
        if self._live_checked is not None and 0 <= now - self._live_checked[0] < LIVE_EVERY:
            return self._live_checked[1]
        answer = self._is_live_now(now)
        self._live_checked = (now, answer)
        return answer

    def _is_live_now(self, now: float) -> bool:
        if (self.run_dir / journal.EXIT).exists():
            return True  # the final event is on its way in events.jsonl
        if self.is_live:
            self._supervisor_gone_since = None
            return True
        if self._supervisor_gone_since is None:
            self._supervisor_gone_since = now
        return now - self._supervisor_gone_since < LOST_AFTER

    @property
    def exit_code(self) -> int | None:
        return self._final.exit_code if self._final else None

    @property
    def final_state(self) -> StateEvent | None:
        return self._final

    def follow(self, interval: float = 0.1) -> Iterator[list[Event]]:
        """Yield batches until the run has finished."""
        while not self.finished:
            batch = self.poll()
            if batch:
                yield batch
            else:
                time.sleep(interval)
