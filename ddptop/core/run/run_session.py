"""Session: a run ddptop launched, read from its journal (a ``JobSession``).

A session reads a run's journal (events.jsonl, torchrun.log and every rank's
log files) and turns what is new into events.  It works the same for a job
launched a second ago, a detached job still running, and a finished run.
Commands go to the run's supervisor, the one process that writes the
journal: a session only ever reads it.

Liveness is the supervisor's pid and start time: a run whose supervisor is
gone without a final state in its journal is ``lost``, decided here in
memory (every reader decides it the same way; none writes it down).  A
damaged journal line (not JSON, not an object, a field of the wrong type) is
skipped with one note naming the file and line; a last line still being
written waits for its end; kinds and fields this ddptop does not know are
ignored.

The launcher and the profiles are imported when a launch or a relaunch asks
for them: a person reading a run (a replay, the TUI's first frame) does not
wait for them to load.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable

from ddptop.core.model import run_dirs
from ddptop.core.model.events import (
    FINAL_STATES,
    LOST,
    BadEvent,
    Event,
    LogBatch,
    LogMarks,
    NoteEvent,
    ProgressEvent,
    RankEvent,
    StateEvent,
    UnknownKind,
    from_json,
)
from ddptop.core.model.run_meta import RankMap
from ddptop.core.model.session_protocol import (
    CommandResult,
    Control,
    ExitStatus,
    LocalRun,
)
from ddptop.core.run import journal
from ddptop.core.sources.log_tailer import EMPTY, Tailer, read_share
from ddptop.core.sources.log_wake import FileWaker

SCAN_EVERY = 0.5  # seconds between looks for new rank log files
LIVE_EVERY = 0.5  # seconds between looks at the supervisor process while polling
POLL_BYTES = 4 << 20  # log bytes one poll reads, at most about, from all files together
WAIT_AT_MOST = 1.0  # seconds a wait() lasts without a file event (the supervisor's liveness is looked at then)
SIZE_CHECK_EVERY = 5.0  # seconds between full reads while file events say nothing changed (they may be missing)
SCAN_AFTER_ADDED = 5.0  # seconds after a file was created in which new rank logs are looked for every SCAN_EVERY


def _due(path: str, tailer: Tailer, changed: set[str] | None) -> bool:
    """A file a poll reads: every file when what changed is not known, else one that file events named or
    that has bytes left from the last read."""
    return changed is None or path in changed or tailer.left()


class Session:
    def __init__(self, run_dir: Path, clock: Callable[[], float] = time.time,
                 resume: dict[str, int] | None = None, min_gap: float = 0.01, marks: bool = False):
        """``resume``: a ``cursor()`` from an earlier session on this run; reading
        starts exactly after what that session had returned.  ``min_gap``:
        seconds between two wakes of ``wait``, at least; ``look_every``: between
        two looks for file events, at least (see FileWaker; both set before the first ``wait``).  ``marks``:
        pass on the journal's ``LogMarks`` (a replay times the lines by them; a viewer has no use for them)."""
        self.min_gap = min_gap
        self.marks = marks
        self.look_every = 0.0
        self.run_dir = Path(run_dir)
        self.meta: journal.Meta = journal.load_meta(self.run_dir)
        self.location = LocalRun(self.run_dir)
        self.clock = clock
        self.error: str | None = None  # (a local journal cannot fail to open once opened)
        self._resume = {k: v for k, v in (resume or {}).items() if isinstance(k, str) and isinstance(v, int)}
        self._events = self._tailer(self.run_dir / run_dirs.EVENTS)
        self._events_line = self._lines_before(self._events)  # line number of the last line read
        self._torchrun = self._tailer(self.run_dir / run_dirs.TORCHRUN_LOG)
        self._final_offset: int | None = None
        self._logs: dict[str, tuple[Tailer, int, int, str, str]] = {}  # path -> (tailer, attempt, local rank, stream, its path in the run)
        self._ranks = RankMap(self.meta.node_rank, self.meta.nproc_per_node)
        self._last_scan = 0.0
        self._beats: dict[str, int] = {}  # beat file -> mtime_ns last read
        self._notes: dict[str, Tailer] = {}
        self._final: StateEvent | None = None
        self._live_checked: tuple[float, bool] | None = None  # (when, answer) of the last real look
        self.finished = False
        self.stop_requested = False
        self._waker: FileWaker | None = None
        self._woken = False
        self._full_read = 0.0  # (monotonic) when poll last read every file
        self._events_path = str(self._events.path)
        self._torchrun_path = str(self._torchrun.path)
        self._beats_dir = str(self.run_dir / run_dirs.BEATS)
        self._scan_until = 0.0  # (clock) look for new rank logs every SCAN_EVERY until then, even with file events
        self._backlog = False  # the last poll left bytes to read (its share of POLL_BYTES was used up)

    @classmethod
    def open(cls, run_dir: Path | str, resume: dict[str, int] | None = None) -> "Session":
        return cls(Path(run_dir), resume=resume)

    def _tailer(self, path: Path) -> Tailer:
        return Tailer(path, self._resume.get(os.path.relpath(path, self.run_dir), 0))

    @staticmethod
    def _lines_before(t: Tailer) -> int:
        """How many lines come before a resumed tailer's offset (for line numbers in notes)."""
        left, n = t.pos, 0
        if left <= 0:
            return 0
        try:
            with open(t.path, "rb") as f:
                while left > 0:
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    n += chunk.count(b"\n")
                    left -= len(chunk)
        except OSError:
            return 0
        return n

    def cursor(self) -> dict[str, int]:
        """Byte offsets (by path relative to the run directory) just after
        everything ``poll()`` has returned so far: ``Session.open(run,
        resume=cursor)`` continues with no line lost and none repeated."""
        out = {run_dirs.EVENTS: self._events.cursor, run_dirs.TORCHRUN_LOG: self._torchrun.cursor}
        if self._final_offset is not None and not self.finished:
            out[run_dirs.EVENTS] = self._final_offset  # the final state is read but not yet returned
        for tailer, _attempt, _local_rank, _stream, rel in self._logs.values():
            out[rel] = tailer.cursor
        for name, tailer in self._notes.items():
            out[f"{run_dirs.BEATS}/{name}"] = tailer.cursor
        return out

    @classmethod
    def launch(cls, user_command: list[str], run_dir: Path | None = None, **options) -> "Session":
        from ddptop.core.run.launcher import launch  # (a reader of a run never launches: see the module's doc)

        return cls(launch(user_command, run_dir, **options))

    # -- the job -------------------------------------------------------------

    @property
    def final_state(self) -> StateEvent | None:
        return self._final

    @property
    def is_live(self) -> bool:
        """True while the supervisor that owns the job is running."""
        if self._final is not None:
            return False
        return journal.supervisor_alive(self.run_dir, self.meta.started)

    def exit_status(self) -> ExitStatus:
        return ExitStatus.of_final(self._final)

    def control(self) -> Control:
        live = not self.finished and self._final is None
        return Control(stop=live, relaunch=live, stacks=live, fix=bool(self.meta.user_command))

    def _supervisor(self) -> dict | None:
        return journal.supervisor(self.run_dir)

    def _signal(self, sig: int) -> bool:
        """Signal the run's supervisor, if it is still that process."""
        sup = self._supervisor()
        if sup is None or not journal.pid_matches(sup["pid"], sup["create_time"]):
            return False
        try:
            os.kill(sup["pid"], sig)
        except ProcessLookupError:
            return False
        return True

    def _not_running(self) -> CommandResult:
        state = self._final.state if self._final is not None else journal.run_state(self.run_dir).state
        return CommandResult(False, f"the job is not running (it is {state})")

    def stop(self) -> CommandResult:
        """Ask the supervisor to stop the job."""
        if self._final is not None:
            return self._not_running()
        deadline = time.time() + 5
        while self._supervisor() is None and time.time() < deadline and self.is_live:
            time.sleep(0.05)  # launched a moment ago: its supervisor is about to say its pid
        if not self._signal(signal.SIGTERM):
            return self._not_running()
        self.stop_requested = True
        return CommandResult(True, "stopping the job")

    def dump_stacks(self) -> CommandResult:
        """Ask the supervisor for every rank's Python stack now (py-spy); the
        result arrives as a note."""
        if self._final is None and self._signal(signal.SIGUSR2):
            return CommandResult(True, "capturing every rank's Python stack")
        return self._not_running()

    def relaunch(self, profiles: list[str], reason: str = "asked for") -> CommandResult:
        """Stop the job completely and start it again with these profiles."""
        from ddptop.core.run.profiles import resolve

        resolve(profiles)  # unknown names fail here, with the list of known ones
        if self._final is not None or not self.is_live:
            return self._not_running()
        journal.write_json(self.run_dir / run_dirs.RELAUNCH, {"profiles": list(profiles), "reason": reason})
        if not self._signal(signal.SIGUSR1):
            return self._not_running()
        return CommandResult(True, f"relaunching with {', '.join(profiles) or 'no profile'}")

    def close(self) -> None:
        if self._waker is not None:
            self._waker.close()
        for t in [self._events, self._torchrun, *(x[0] for x in self._logs.values()), *self._notes.values()]:
            t.close()

    # -- reading -------------------------------------------------------------

    def _rank_for(self, attempt: int, local_rank: int) -> int:
        return self._ranks.rank(attempt, local_rank)

    def _scan_logs(self) -> None:
        for attempt, local_rank, stream, path in journal.rank_log_files(Path(self.meta.log_dir)):
            if str(path) not in self._logs:
                self._logs[str(path)] = (self._tailer(path), attempt, local_rank, stream,
                                         os.path.relpath(path, self.run_dir))

    def _valid_utf8(self, offset: int) -> bool:
        """The raw bytes of the journal line at ``offset`` decode as UTF-8 (the
        tailer has replaced what did not; this tells a U+FFFD written on
        purpose from a damaged byte)."""
        try:
            with open(self._events.path, "rb") as f:
                f.seek(offset)
                f.readline().decode("utf-8")
        except UnicodeDecodeError:
            return False
        except OSError:
            pass
        return True

    def _read_events(self, now: float, out: list[Event]) -> None:
        """New journal events; a damaged line is skipped with a note."""
        for line in self._events.read():
            self._events_line += 1
            try:
                if line.partial:
                    raise BadEvent(f"a line over {self._events.max_line} bytes")
                if "\ufffd" in line.text and not self._valid_utf8(line.offset):
                    raise BadEvent("invalid UTF-8")
                ev = from_json(line.text)
            except UnknownKind:
                continue  # written by a newer ddptop
            except BadEvent as e:
                out.append(NoteEvent(now, "warning", f"{self.run_dir / run_dirs.EVENTS} line {self._events_line}: "
                                                     f"damaged, skipped ({e})"))
                continue
            if isinstance(ev, LogMarks) and not self.marks:
                continue
            if isinstance(ev, RankEvent):
                self._ranks.record(ev.attempt, ev.local_rank, ev.rank)
            if isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
                if self._final is None:
                    self._final = ev
                    self._final_offset = line.offset
                continue
            out.append(ev)

    def wait(self, timeout: float) -> None:
        """Sleep until a file of the run changes (a line, an event, a step) or
        ``timeout`` seconds pass (at most WAIT_AT_MOST: the supervisor's
        liveness is looked at then)."""
        if self.finished:
            return
        if self._woken or self._backlog:  # (a wake before the first wait; bytes left to read)
            self._woken = False
            return
        if self._waker is None:
            paths = [self.run_dir]
            log_dir = Path(self.meta.log_dir)
            if self.run_dir not in log_dir.parents and log_dir != self.run_dir and log_dir.is_dir():
                paths.append(log_dir)
            self._waker = FileWaker(paths, min_gap=self.min_gap, look_every=self.look_every)
            if self._woken:  # woken while the watcher started
                self._woken = False
                return
        self._waker.wait(min(timeout, WAIT_AT_MOST))

    @property
    def backlog(self) -> bool:
        """The last poll left bytes to read: poll again before waiting."""
        return self._backlog

    def wake(self) -> None:
        """End a ``wait`` under way (from another thread)."""
        if self._waker is not None:
            self._waker.wake()
        else:
            self._woken = True  # (before the first wait: that one ends at once)

    def poll(self, max_bytes: int = POLL_BYTES) -> list[Event]:
        """Everything new since the last call, at most about ``max_bytes`` of log
        output in all (shared among the log files: memory stays bounded
        however many ranks; the rest comes with the next call).  Never blocks
        on the job."""
        if self.finished:
            return []
        now = self.clock()
        waker = self._waker
        if (waker is not None and waker.quiet and not self._backlog and self._final is None
                and time.monotonic() - self._full_read < SIZE_CHECK_EVERY and self._supervisor_alive(now)):
            return []  # no file event and the supervisor is there: nothing to read (a slow check reads anyway)
        had_backlog = self._backlog
        mono = time.monotonic()
        # what file events named since the last poll: only those files are read (and any with bytes left);
        # every file when that is not known, on a path this session does not read (a new file of the run),
        # and every SIZE_CHECK_EVERY seconds (a file event may be missing)
        changed = waker.take_changed() if waker is not None else None
        full = (changed is None or had_backlog or self._final is not None
                or mono - self._full_read >= SIZE_CHECK_EVERY or not self._known(changed))
        if full:
            self._full_read = mono
            changed = None
        out: list[Event] = []
        final_seen = self._final is not None
        if changed is None or self._events_path in changed:
            self._read_events(now, out)
        read_any = bool(out)
        if self._final is None and not self._supervisor_alive(now):
            # gone: whatever it wrote before it went is in the journal now
            self._read_events(now, out)
            if self._final is None:
                rec = journal.recorded_exit(self.run_dir)  # killed between exit.json and its event
                self._final = (StateEvent(now, rec.state, rec.exit_code, rec.message)
                               if rec is not None and rec.state in FINAL_STATES and rec.state != LOST
                               else StateEvent(now, LOST, None, journal.LOST_MESSAGE))
        if self._final is not None and not final_seen:
            self._last_scan = 0.0  # one more full scan before the end
        if waker is not None and waker.take_added():
            # a file was created: maybe a new rank's log (its directory first: the files in it may come
            # before their directory is watched, so look again for a while)
            self._scan_until = now + SCAN_AFTER_ADDED
            self._last_scan = 0.0
        if now - self._last_scan >= SCAN_EVERY and (changed is None or now < self._scan_until):
            self._last_scan = now
            self._scan_logs()
        beats = self._read_beats(now, changed)
        read_any = read_any or bool(beats)
        out.extend(beats)
        batch = LogBatch.of_chunk
        per_file = read_share(max_bytes, len(self._logs) + 1)
        c = self._torchrun.read_chunk(per_file) if _due(self._torchrun_path, self._torchrun, changed) else EMPTY
        if c:
            read_any = True
            out.append(batch(now, None, "torchrun", 0, run_dirs.TORCHRUN_LOG, c))
        # (left(): what the read's own look at the file's size said; a write since then brings a file event)
        drained = not self._torchrun.left()
        for path, (tailer, attempt, local_rank, stream, rel) in self._logs.items():
            if not _due(path, tailer, changed):
                continue
            c = tailer.read_chunk(per_file)
            if c:
                read_any = True
                out.append(batch(now, self._rank_for(attempt, local_rank), stream, attempt, rel, c))
            if tailer.left():
                drained = False
        self._backlog = not drained or self._events.left()
        if self._final is not None and drained:
            for tailer, attempt, local_rank, stream, rel in self._logs.values():
                c = tailer.flush_chunk()
                if c:
                    out.append(batch(now, self._rank_for(attempt, local_rank), stream, attempt, rel, c))
            out.append(self._final)
            self.finished = True
        if self._waker is not None:
            self._waker.saw(read_any and not had_backlog)  # (what the last poll left is no news)
            note = self._waker.take_note()
            if note:
                out.insert(0, NoteEvent(now, "info", f"watching {self.run_dir}: {note}"))
        return out

    def _supervisor_alive(self, now: float) -> bool:
        """``is_live`` of the supervisor, looked at no more often than LIVE_EVERY."""
        if self._live_checked is not None and 0 <= now - self._live_checked[0] < LIVE_EVERY:
            return self._live_checked[1]
        answer = journal.supervisor_alive(self.run_dir, self.meta.started)
        self._live_checked = (now, answer)
        return answer

    def _known(self, changed: set[str]) -> bool:
        """Every path of ``changed`` is one this session reads (its journal, torchrun's log, a rank's log it
        has found, a beat)."""
        for p in changed:
            if p != self._events_path and p != self._torchrun_path and os.path.dirname(p) != self._beats_dir:
                if p not in self._logs:
                    return False
        return True

    def _read_beats(self, now: float, changed: set[str] | None = None) -> list[Event]:
        """Step counts published by the in-rank hook or ddptop.beat() (those that file events named, when
        ``changed`` is given; else every beat)."""
        d = self._beats_dir
        if changed is not None:
            names = [os.path.basename(p) for p in changed if os.path.dirname(p) == d]
            if not names:
                return []
        else:
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
            if source not in ("hook", "beat", "batch"):
                continue
            try:
                st = os.stat(path)
                if self._beats.get(name) == st.st_mtime_ns:
                    continue
                self._beats[name] = st.st_mtime_ns
                with open(path, "rb") as f:
                    fields = f.read(96).split()
                phase = fields[2].decode("ascii", "replace") if source == "batch" and len(fields) > 2 else ""
                out.append(ProgressEvent(float(fields[1]), rank=int(rank), step=int(fields[0]), source=source,
                                         phase=phase))
            except (OSError, ValueError, IndexError):
                continue
        return out
