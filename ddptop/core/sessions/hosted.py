"""A session read in a process of its own, for the TUI.

The TUI shares one GIL between its event loop and whatever reads the job.  At
a few ranks that is nothing; at 1,024 ranks on 128 nodes the reading (128
links, their decoding, the cross-node analysis) needs most of a core, and the
event loop ran seconds late (docs/performance.md, issue 35).  A
``HostedSession`` opens the session in a child process (``python -m
ddptop.core.sessions.hosted``) and is a ``JobSession`` here: the child polls
its session and sends what is new; this side hands it to ``poll()``.  Commands
(stop, relaunch, a stack dump, the cursor) go to the child and their answers
come back; how the job is seen (``location``, ``meta``, ``finished`` ...)
comes with the events it belongs to.

The stream is private to the two processes of one ddptop: length-prefixed
pickles over the child's stdin and stdout (``pickle`` of ddptop's own frozen
events, never of anything read from the job: lines are strings in them).  The
child's stderr goes to a file, read back when it fails (a child writing to the
terminal would draw over the UI).  It ends when told to, or when this side's
end of its stdin closes (this process ended, however).

    opened = HostedSession.start(functools.partial(open_target, request))
    session = opened.session  # or OpenError, raised here as the child raised it
"""

from __future__ import annotations

import collections
import itertools
import os
import pickle
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any, Callable

from ddptop.core.model.command_result import CommandResult
from ddptop.core.model.events import Event, LogBatch, StateEvent
from ddptop.core.model.run_meta import Meta
from ddptop.core.model.session_protocol import Control, ExitStatus, JobSession, Location
from ddptop.core.sessions.factory import OpenError, Opened

_LEN = struct.Struct(">Q")
SEND_EVERY = 0.02  # seconds: the child gathers what its polls return for this long, then sends it as one message
WAIT = 1.0  # seconds the child waits for its session when a poll found nothing (its wait ends sooner on news)
BACKLOG_LINES = 200_000  # this side stops reading the child while this many lines wait for poll() (backpressure)
CLOSE_WAIT = 15.0  # seconds the child has to close its session (its links) before it is killed


class HostedError(RuntimeError):
    """The reading process failed or ended before its session did; the message says how, with its last words."""


def _write(out: IO[bytes], lock: threading.Lock, msg: object) -> None:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    with lock:
        out.write(_LEN.pack(len(data)))
        out.write(data)
        out.flush()


def _read(inp: IO[bytes]) -> Any:
    """The next message, or None at the end of the stream."""
    head = inp.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    n = _LEN.unpack(head)[0]
    data = inp.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)


def _lines(events: list[Event]) -> int:
    return sum(len(ev) if isinstance(ev, LogBatch) else 1 for ev in events)


# -- this side ------------------------------------------------------------------


class HostedSession:
    """A ``JobSession`` whose session runs in a child process (see the module's doc)."""

    def __init__(self, proc: subprocess.Popen, err: IO[bytes], first: dict[str, Any]):
        self._proc = proc
        self._err = err
        self._view = first  # the child's session as of the last events handed out by poll()
        self._pending: collections.deque[tuple[list[Event], dict[str, Any]]] = collections.deque()
        self._pending_lines = 0
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._replies: dict[int, list] = {}
        self._failed: str | None = None
        self._closed = False
        assert proc.stdout is not None
        self._reader = threading.Thread(target=self._read_loop, args=(proc.stdout,), name="hosted-session",
                                        daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, opener: Callable[[], Opened], *, meanwhile: Callable[[], object] | None = None) -> Opened:
        """Open ``opener()`` (a picklable callable returning the factory's ``Opened``) in a child process;
        answer an ``Opened`` whose session is the hosted one, or raise what the child's opener raised
        (an ``OpenError`` with its message and code), or ``HostedError``.  ``meanwhile`` runs here while the
        child starts and opens (the UI's imports: the two take about as long)."""
        err = tempfile.TemporaryFile()
        proc = subprocess.Popen([sys.executable, "-m", "ddptop.core.sessions.hosted"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, close_fds=True)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            _write(proc.stdin, threading.Lock(), opener)
            if meanwhile is not None:
                meanwhile()
            answer = _read(proc.stdout)
        except (OSError, pickle.PickleError, EOFError) as e:
            answer = ("failed", f"{type(e).__name__}: {e}")
        except BaseException:  # (meanwhile failed, or an interrupt): the child goes with it
            proc.kill()
            proc.wait()
            err.close()
            raise
        if answer is None or answer[0] != "opened":
            try:
                proc.stdin.close()
                proc.wait(timeout=CLOSE_WAIT)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            if answer is not None and answer[0] == "open-error":
                raise OpenError(answer[1], answer[2])
            said = answer[1] if answer is not None else "it ended"
            raise HostedError(f"the reading process could not open the job: {said}{_tail(err)}")
        _, notes, first = answer
        return Opened(cls(proc, err, first), tuple(notes))

    # -- the stream from the child (a thread) --

    def _read_loop(self, inp: IO[bytes]) -> None:
        try:
            while True:
                with self._cond:
                    while self._pending_lines > BACKLOG_LINES and not self._closed:
                        self._cond.wait(0.5)  # the view is behind: the child waits on its full pipe
                msg = _read(inp)
                if msg is None:
                    break
                if msg[0] == "events":
                    with self._cond:
                        self._pending.append((msg[1], msg[2]))
                        self._pending_lines += _lines(msg[1])
                        self._cond.notify_all()
                elif msg[0] == "reply":
                    with self._cond:
                        self._replies[msg[1]] = [msg[2], msg[3]]
                        self._cond.notify_all()
        except (OSError, ValueError, pickle.PickleError, EOFError, AttributeError) as e:
            with self._cond:
                self._failed = f"its stream could not be read ({type(e).__name__}: {e})"
        code = self._proc.wait()
        with self._cond:
            if self._failed is None and not self._closed:
                self._failed = f"it ended (exit code {code})"
            self._cond.notify_all()

    def _problem(self) -> str | None:
        """Why the child can answer no more (None while it can), once its stream has ended."""
        if self._failed is None or self._closed:
            return None
        return f"ddptop's reading process failed: {self._failed}{_tail(self._err)}"

    # -- JobSession --

    def poll(self) -> list[Event]:
        with self._cond:
            batches = list(self._pending)
            self._pending.clear()
            self._pending_lines = 0
            self._cond.notify_all()
            problem = self._problem() if not batches and not self._view["finished"] else None
        if problem is not None:
            raise HostedError(problem)
        events: list[Event] = []
        for evs, changed in batches:
            events.extend(evs)
            self._view.update(changed)
        return events

    def wait(self, timeout: float) -> None:
        with self._cond:
            if not self._pending and self._failed is None:
                self._cond.wait(timeout)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    @property
    def location(self) -> Location:
        return self._view["location"]

    @property
    def meta(self) -> Meta | None:
        return self._view["meta"]

    @property
    def finished(self) -> bool:
        return bool(self._view["finished"])

    @property
    def final_state(self) -> StateEvent | None:
        return self._view["final_state"]

    @property
    def error(self) -> str | None:
        return self._view["error"] or (self._problem() if not self._view["finished"] else None)

    @property
    def is_live(self) -> bool:
        return bool(self._view["is_live"]) and self._problem() is None

    def control(self) -> Control:
        return self._view["control"]

    def exit_status(self) -> ExitStatus:
        return self._view["exit_status"]

    def cursor(self) -> dict[str, int]:
        return self._call("cursor")

    def stop(self) -> CommandResult:
        return self._call("stop")

    def relaunch(self, profiles: list[str], reason: str = "asked for") -> CommandResult:
        return self._call("relaunch", list(profiles), reason)

    def dump_stacks(self) -> CommandResult:
        return self._call("dump_stacks")

    def _call(self, name: str, *args: object) -> Any:
        """Ask the child's session and wait for its answer (a command may take as long as it takes there:
        a relaunch stops every old rank first); raises when the child cannot answer."""
        n = next(self._ids)
        stdin = self._proc.stdin
        try:
            assert stdin is not None
            _write(stdin, self._send_lock, ("call", n, name, args))
        except (OSError, ValueError) as e:
            raise HostedError(self._problem() or f"ddptop's reading process cannot be asked: {e}") from None
        with self._cond:
            while n not in self._replies:
                if self._failed is not None:
                    raise HostedError(self._problem() or "ddptop's reading process has been closed")
                self._cond.wait(1.0)
            ok, value = self._replies.pop(n)
        if not ok:
            raise HostedError(f"{name} failed in ddptop's reading process: {value}")
        return value

    def close(self) -> None:
        """Close the child's session (its links; the job itself is never touched) and let the child end."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        try:
            if self._proc.stdin is not None:
                _write(self._proc.stdin, self._send_lock, ("close",))
                self._proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self._proc.wait(timeout=CLOSE_WAIT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=CLOSE_WAIT)
        self._err.close()

    @property
    def pid(self) -> int:
        """The reading process's pid (for a benchmark measuring the viewer as a whole)."""
        return self._proc.pid


def _tail(err: IO[bytes], n: int = 1500) -> str:
    try:
        err.seek(0, os.SEEK_END)
        size = err.tell()
        err.seek(max(0, size - n))
        text = err.read().decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return ""
    return f"; it said: {text}" if text else ""


# -- the child ------------------------------------------------------------------


def _snapshot(session: JobSession) -> dict[str, Any]:
    return {"location": session.location, "meta": session.meta, "finished": session.finished,
            "final_state": session.final_state, "error": session.error, "is_live": session.is_live,
            "control": session.control(), "exit_status": session.exit_status()}


def serve(inp: IO[bytes], out: IO[bytes]) -> int:
    """The child: open the session the first message says, then poll it and answer calls until told to close
    (or the stream in ends)."""
    lock = threading.Lock()
    try:
        opener = _read(inp)
    except (pickle.PickleError, EOFError, AttributeError, ImportError) as e:
        _write(out, lock, ("failed", f"{type(e).__name__}: {e}"))
        return 2
    if opener is None:
        return 0
    try:
        opened = opener()
    except OpenError as e:
        _write(out, lock, ("open-error", str(e), e.code))
        return 0
    session: JobSession = opened.session
    sent = _snapshot(session)
    _write(out, lock, ("opened", list(opened.notes), sent))
    done = threading.Event()

    def answer(n: int, name: str, args: tuple) -> None:
        try:
            value = getattr(session, name)(*args)
            reply = ("reply", n, True, value)
        except Exception as e:  # noqa: BLE001 - a call's own thread: its failure is the answer, said on this side
            reply = ("reply", n, False, f"{type(e).__name__}: {e}")
        try:
            _write(out, lock, reply)
        except OSError:
            done.set()

    def calls() -> None:
        try:
            while True:
                msg = _read(inp)
                if msg is None or msg[0] == "close":
                    break
                if msg[0] == "call" and msg[2] in ("cursor", "stop", "relaunch", "dump_stacks"):
                    threading.Thread(target=answer, args=msg[1:], name=f"call-{msg[2]}", daemon=True).start()
        except (OSError, pickle.PickleError, EOFError, ValueError):
            pass
        done.set()
        session.wake()

    threading.Thread(target=calls, name="calls", daemon=True).start()

    def send(events: list[Event]) -> None:
        """The events, with what changed of how the session is seen (nothing at all when neither did)."""
        changed = {k: v for k, v in _snapshot(session).items() if sent.get(k) != v}
        if events or changed:
            _write(out, lock, ("events", events, changed))
            sent.update(changed)

    pending: list[Event] = []
    last_send = 0.0
    try:
        while not done.is_set():
            finished = session.finished
            events = [] if finished else session.poll()
            pending.extend(events)
            now = time.monotonic()
            if pending and (now - last_send >= SEND_EVERY or session.finished):
                send(pending)
                pending, last_send = [], now
            elif not events:
                if finished:
                    send([])  # (a call may have changed how it is seen: said even without events)
                    done.wait(WAIT)
                else:
                    session.wait(SEND_EVERY - (now - last_send) if pending else WAIT)
    except OSError:  # this side is gone: nothing to send to
        pass
    finally:
        session.close()
    return 0


def main() -> int:
    # the stream keeps this process's own stdin and stdout; whatever else writes to them (a print, a
    # process the session starts: ssh, kubectl) gets /dev/null and stderr instead
    inp = os.fdopen(os.dup(0), "rb")
    out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the TUI decides when this ends (it closes the stream)
    return serve(inp, out)


if __name__ == "__main__":
    sys.exit(main())
