"""One connection to ``ddptop agent``, read to its end: its hello checked, its
lines decoded into events (committed a batch at a time, by the agent's cursor
lines), the node's clock skew measured and a failure before the hello said in
words.  A mixin of ``ssh.RemoteSession``, which owns the link and the state
the lines update (the pinned run, the cursor, the final state).
"""

from __future__ import annotations

import shlex
import subprocess
import time
from dataclasses import replace
from typing import Any

from ddptop.core.model.events import (
    FINAL_STATES,
    BadEvent,
    Event,
    LaunchEvent,
    LogBatch,
    LogEvent,
    NoteEvent,
    StateEvent,
    UnknownKind,
    from_dict,
)
from ddptop.core.model.run_meta import Meta
from ddptop.core.model.session_protocol import (
    ExitStatus,
)
from ddptop.core.sessions import link_reader, wire
from ddptop.core.sessions.ssh_state import RemoteState
from ddptop.core.sessions.transports import NOT_FOUND

HELLO_TIMEOUT = 60.0
MAX_LINE = 16 * 1024 * 1024
SKEW_MIN = 1.0  # seconds: a node clock further than this from ours has its event times moved onto ours
CONTROL = wire.CONTROL
_STR, _INT = {str}, {int}  # (a batch's texts' and offsets' types, checked in C: map(type, ...))


def event_off_the_wire(d: dict, node: str, skew: float = 0.0) -> Event:
    """One event off the wire, its fields checked (``BadEvent`` when not an
    event; ``UnknownKind`` for a kind a newer agent sends).  ``skew``: our clock
    minus the node's, added to the node's times (0 when the clocks agree)."""
    if d.get("kind") == "logs":
        ev = _logs_off_the_wire(d, node, skew)
        if ev is not None:
            return ev
    d["node"] = node  # the name the person attached to (the agent knows only its hostname)
    if skew and isinstance(d.get("t"), (int, float)) and not isinstance(d["t"], bool):
        d["t"] += skew
    return from_dict(d)


def _logs_off_the_wire(d: dict, node: str, skew: float) -> LogBatch | None:
    """A well-formed ``logs`` object as ``from_dict`` makes it, without its
    per-field checkers: most of what a busy job's agents send is these (at
    1,024 ranks, thousands a second, read by one process); None when a field
    is missing or of another type (``from_dict`` then says what is wrong)."""
    t: Any = d.get("t")
    rank, texts, offsets = d.get("rank"), d.get("texts", ()), d.get("offsets", ())
    stream, attempt, path = d.get("stream", "stdout"), d.get("attempt", 0), d.get("path", "")
    partial, transient = d.get("partial", ()), d.get("transient", False)
    n = len(texts) if type(texts) is list else -1
    if (type(t) not in (int, float) or (rank is not None and type(rank) is not int) or type(stream) is not str
            or type(attempt) is not int or type(path) is not str or n < 0 or type(offsets) is not list
            or len(offsets) != n or type(partial) is not list or type(transient) is not bool
            or (transient and not n) or (n and (set(map(type, texts)) != _STR or set(map(type, offsets)) != _INT))
            or not all(type(i) is int and 0 <= i < n for i in partial)):
        return None
    return LogBatch.fast(t + skew if skew else t, rank, stream, attempt, path, tuple(offsets), tuple(texts),
                         tuple(partial), transient, node)


class _Reading:
    """One connection's reading: the partial line, the events not yet committed by a cursor, the hello."""
    __slots__ = ("buf", "pending", "got_hello", "before_hello", "n", "last")

    def __init__(self) -> None:
        self.buf = b""
        self.pending: list[Event] = []
        self.got_hello = False
        self.before_hello: list[str] = []
        self.n = 0  # lines read
        self.last = time.monotonic()  # when the last data came


class AgentStream(RemoteState):
    """One connection's lines in, events out (mixed into ``RemoteSession``)."""

    def _pump(self, proc: subprocess.Popen) -> tuple[str, str]:
        """Read one connection to its end: ('bye'|'fatal'|'hello'|'lost'|'closed', message).  The
        process's one link reader reads the pipe (``link_reader``); this thread waits."""
        assert proc.stdout is not None  # (started with stdout=PIPE)
        st = _Reading()
        outcome = link_reader.reader().follow(proc.stdout.fileno(), lambda chunk: self._feed(st, chunk),
                                              lambda now: self._quiet(st, now), self._closed)
        if outcome is not None:
            return outcome
        # the connection ended without a bye; a trailing partial line and an
        # uncommitted batch are dropped: the next connection resumes before them
        rc = proc.wait()
        err = proc.stderr.read().decode("utf-8", "replace").strip() if proc.stderr else ""
        if st.got_hello:
            return "hello", _last_line(err) or f"link lost ({self.transport.kind} exit {rc})"
        return self._classify_failure(rc, err, st.before_hello)

    def _quiet(self, st: _Reading, now: float) -> tuple[str, str] | None:
        """The link has been silent too long (the agent sends a line every 2 s): its outcome."""
        limit = self.silence if st.got_hello else HELLO_TIMEOUT
        if now - st.last > limit:
            return ("hello" if st.got_hello else "lost"), f"no data from {self.host} for {limit:.0f} s"
        return None

    def _feed(self, st: _Reading, chunk: bytes) -> tuple[str, str] | None:
        """What arrived on the link: its whole lines decoded; the connection's outcome when it ends here."""
        st.last = time.monotonic()
        buf = st.buf + chunk
        if b"\n" not in chunk:
            st.buf = buf
            if len(buf) > MAX_LINE:
                return "fatal", f"{self.host}: agent line {st.n + 1} is over {MAX_LINE} bytes: not the ddptop agent protocol"
            return None
        *lines, st.buf = buf.split(b"\n")
        for raw in lines:
            st.n += 1
            out = self._line(st, raw) if st.got_hello else self._before_hello(st, raw)
            if out is not None:
                return out
        return None

    def _before_hello(self, st: _Reading, raw: bytes) -> tuple[str, str] | None:
        kind, d = self._parse(raw)
        if kind != "hello":
            st.before_hello.append(raw[:200].decode("utf-8", "replace"))
            return None
        problem = self._check_hello(d)
        if problem:
            return "fatal", problem
        st.got_hello = True
        self.connects += 1
        if d.get("run"):  # (a hello without a run comes before an error: the last run's meta stays)
            self.meta = _meta(d.get("meta"))
        if isinstance(d.get("versions"), dict):
            self.versions = {str(k): str(v) for k, v in d["versions"].items()}
        self._measure_skew(d.get("t"))
        if isinstance(d.get("run"), str) and d["run"]:
            self.run = d["run"]  # pin the run: a reconnect must not jump to a newer one
            self._remote_dir = str(d.get("run_dir") or d["run"])
            self._lagging = 0
            if self._after is not None:
                self._next_attempt(d)
            elif not self._pinned and self.transport.follows_restarts:
                self._node_before = self.transport.listed_node()
            self._pinned = True
        if d.get("run"):  # (else an error follows)
            self._set_link("up", f"{d.get('host', self.host)}, ddptop {d.get('ddptop')}, run {d['run']}")
        minor = d.get("minor")
        if isinstance(minor, int) and minor >= wire.BATCHES_SINCE and d.get("run"):
            self._send({"cmd": "accept", "kinds": ["logs"]})
        return None

    def _line(self, st: _Reading, raw: bytes) -> tuple[str, str] | None:
        """One line after the hello: events kept until their batch's cursor commits them."""
        pending = st.pending
        kind, d = wire.parse_line(raw)
        if kind is None:
            pending.append(NoteEvent(self.clock(), "warning", f"{self.host}: agent line {st.n} unreadable, "
                                     f"skipped: {raw[:120].decode('utf-8', 'replace')!r}", node=self.node))
            return None
        if kind == "cursor":
            files = d.get("files")
            if isinstance(files, dict) and all(isinstance(v, int) for v in files.values()):
                self._cursor = {str(k): v for k, v in files.items()}
            if pending:
                self._emit(pending)
                st.pending = []
            # the node's stream is read up to here (after what was queued: poll takes it with that)
            t = d.get("t")
            self._heard = t + self.skew if isinstance(t, (int, float)) and not isinstance(t, bool) else self.clock()
        elif kind == "bye":
            self._exit = ExitStatus.from_dict(d.get("exit"))
            if self._exit is None and isinstance(d.get("attach_exit_code"), int) and not self.launched:
                self._exit = ExitStatus.unknown("ddptop did not start this job: its exit code cannot be "
                                                "known", crash_seen=d["attach_exit_code"] == 1)
            self._set_link("closed", "the job has ended")  # before the batch: its final state comes last
            if pending:
                self._emit(pending)
                st.pending = []
            return "bye", ""
        elif kind == "error":
            why = str(d.get("message", "the agent reported an error"))
            if d.get("code") == "not-yet":
                return "not-yet", why
            return ("gone" if d.get("code") == "no-run" and self._pinned else "fatal"), why
        elif kind == "reply" and d.get("cmd") == "accept":
            return None  # (logs batches from now on: nothing to tell the person)
        elif kind == "reply":
            level = "info" if d.get("ok") else "warning"
            what = "refused: " if d.get("refused") else ""
            self._emit([NoteEvent(self.clock(), level, f"{self.host}: {d.get('cmd')}: {what}{d.get('message')}",
                                  node=self.node)])
        elif kind in CONTROL:
            return None
        else:
            try:
                ev = event_off_the_wire(d, self.node, self.skew)
                if isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
                    self._run_final = ev
                elif isinstance(ev, LaunchEvent) and self._gen_base:
                    ev = replace(ev, generation=ev.generation + self._gen_base)
                if isinstance(ev, LaunchEvent):
                    self._gen_top = max(self._gen_top, ev.generation)
                pending.append(LogBatch.of_line(ev) if isinstance(ev, LogEvent) else ev)
            except UnknownKind:
                return None  # a newer agent's kind: ignored
            except BadEvent as e:
                pending.append(NoteEvent(self.clock(), "warning", f"{self.host}: agent line {st.n}: bad {kind!r} event ({e})",
                                         node=self.node))
        return None

    def _measure_skew(self, t) -> None:
        """The node's clock against ours, from its hello's time ``t``.  The hello
        was sent after we started the connection and before we read it, so the
        skew lies between those two bounds (a slow link or a loaded machine
        widens them, it never makes a clock look wrong): a skew is said only
        when both bounds are past ``SKEW_MIN`` on the same side."""
        if not isinstance(t, (int, float)) or isinstance(t, bool):
            return  # an older agent: times are taken as they are
        now = self.clock()
        lo, hi = min(self._spawned if self._spawned is not None else now, now) - float(t), now - float(t)
        was = self.skew
        if was and lo - SKEW_MIN <= was <= hi + SKEW_MIN:
            return  # still what was measured before, within this measurement's bounds
        skew = (lo + hi) / 2 if lo > SKEW_MIN or hi < -SKEW_MIN else 0.0
        self.skew = skew
        if skew and (not was or abs(skew - was) > SKEW_MIN):
            self._emit([NoteEvent(now, "warning",
                                  f"{self.host}'s clock is {abs(skew):.1f} s {'behind' if skew > 0 else 'ahead of'} "
                                  f"this machine's: its times are shown on this machine's clock (is NTP running "
                                  f"there?)", node=self.node)])
        elif was and not skew:
            self._emit([NoteEvent(now, "info", f"{self.host}'s clock now agrees with this machine's",
                                  node=self.node)])

    def _parse(self, raw: bytes) -> tuple[str | None, dict]:
        return wire.parse_line(raw)

    def _check_hello(self, d: dict) -> str | None:
        return wire.check_hello(d, self.host, wire.install_hint())

    def _classify_failure(self, rc: int, err: str, before_hello: list[str]) -> tuple[str, str]:
        what = _last_line(err) or (before_hello[-1] if before_hello else "")
        t = self.transport
        cmd0 = shlex.split(self.remote_cmd)[0]
        if rc == 127 or any(s in err for s in NOT_FOUND) and (cmd0 in err or "ddptop" in err):
            return "fatal", (f"ddptop is not installed {t.where()} (`{self.remote_cmd}` was not found: {what}). "
                             f"{t.install(wire.install_hint())} -- or name it with --remote-ddptop '/path/to/venv/bin/ddptop'")
        if "invalid choice" in err or "unknown command 'agent'" in err or "unrecognized arguments: --after" in err:
            return "fatal", (f"the ddptop {t.where()} is too old for `ddptop agent` ({what}). "
                             f"Install this version there: {wire.install_hint()}")
        fix = t.fatal(rc, err)
        if fix:
            return "fatal", f"{t.label()}: {what} ({fix})"
        return "lost", what or f"{t.kind} exited with {rc}"


def _last_line(s: str) -> str:
    lines = [l for l in s.splitlines() if l.strip()]
    return lines[-1].strip() if lines else ""


def _meta(d):
    if not isinstance(d, dict):
        return None
    try:
        return Meta.from_dict(d)
    except TypeError:  # a field missing (a newer or damaged agent's meta)
        return None
