"""Attach over ssh: a Session-like client of ``ddptop agent``.

``RemoteSession(host)`` runs ``ssh HOST ddptop agent ...`` with the person's
own ssh (config, keys, agent and ProxyJump all apply; nothing listens on a
port), reads the agent's JSON lines in a thread, and hands events to
``poll()`` a whole batch at a time, once the batch's cursor has arrived.  When
the link drops it reconnects with backoff and resumes from the last cursor, so
every line arrives exactly once.  Several nodes as one: ``cross_node``.

A node whose cluster restarts it (``transport.follows_restarts``: a pod's
container restarted, or the pod recreated) is followed: when its run ends
without success, or cannot be read any more, the session asks the cluster
(``transport.outlook``) and the agent (``--after``: the first run begun
since) for the node's next attempt, shows it as one (a ``LaunchEvent`` with
``node_restart``, the run's generations counted on) and follows it; it ends
when the cluster says no attempt will come, or none has come within
``restart_wait`` seconds while the cluster does not say one is on its way.

``ddptop doctor --host HOST`` goes over the same ssh (``doctor.hosts``:
``SSH_OPTIONS``, ``check_host``, ``remote_command``; ``wire.install_hint``).

Its parts: ``ssh_stream`` reads one connection (the hello, the lines, the
cursor, the node's clock), ``ssh_restarts`` follows a node from one attempt
to the next, ``ssh_state`` declares the state the three share; this module
is the session and the link (connect, reconnect with backoff, resume, the
commands).  How a node is reached lives in ``transports``, what a cluster
says of its pods in ``k8s_pods``.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import shlex
import signal
import subprocess
import threading
import time

from ddptop.core.model.events import (
    FINAL_STATES,
    LOST,
    STARTING,
    SUCCEEDED,
    Event,
    LaunchEvent,
    LinkEvent,
    NoteEvent,
    StateEvent,
)
from ddptop.core.model.session_protocol import (
    CommandResult,
    Control,
    ExitStatus,
    RemoteRun,
)
from ddptop.core.model.settings import settings
from ddptop.core.sessions.ssh_restarts import RESTART_WAIT, NodeAttempts
from ddptop.core.sessions.ssh_stream import AgentStream
from ddptop.core.sessions.transports import Ssh, Transport, check_host
from ddptop.core.sessions.wire import encode_cursor

BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0)  # seconds before reconnect n (then the last, forever)
SILENCE = 15.0  # seconds without any line (the agent sends one every 2 s) = dead link
# what Popen fails with when this process (or the machine) is short of file descriptors or processes for now
_SHORT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})
FIX_ELSEWHERE = "ddptop fix runs the job again on this machine: run it on the node where the job runs"


def parse_target(target: str) -> tuple[str, str]:
    """``HOST`` or ``HOST:RUN`` (``user@host``, ssh config aliases and ``[IPv6]:RUN`` work)."""
    if target.startswith("[") and "]" in target:
        host, _, rest = target[1:].partition("]")
        sep, run = (":", rest[1:]) if rest.startswith(":") else ("", "")
    else:
        host, sep, run = target.partition(":")
    if not host:
        raise ValueError(f"no host in {target!r}")
    return host, (run if sep and run else "latest")


class RemoteSession(AgentStream, NodeAttempts):
    """A run on another node, through ``ddptop agent`` over ssh (a ``JobSession``)."""

    def __init__(self, host: str, run: str = "latest", *, ssh: list[str] | None = None,
                 remote_cmd: str | None = None, node: str | None = None, clock=time.time,
                 backoff: tuple[float, ...] = BACKOFF, silence: float = SILENCE, gpu: str | None = None,
                 transport: Transport | None = None, restart_wait: float = RESTART_WAIT):
        self.host = check_host(host)
        self.node = node or host
        self.run = run
        self.gpu = gpu
        self.versions: dict[str, str] = {}  # the node's python/torch/NCCL, from the agent's hello
        # our clock minus the node's (measured at each hello, within the bounds of when it was sent), added to the
        # times of the node's events when over SKEW_MIN, so that ages and the cross-node stall
        # detector compare like with like
        self.skew = 0.0
        self._spawned: float | None = None  # when the current connection was started (our clock)
        self.ssh = list(ssh) if ssh else list(settings().ssh)
        # how the node is reached (ssh, srun, kubectl): everything else is the same for all
        self.transport: Transport = transport if transport is not None else Ssh(self.host, tuple(self.ssh))
        self.remote_cmd = remote_cmd or settings().remote
        self.clock = clock
        self.backoff = backoff
        self.silence = silence
        self.restart_wait = restart_wait
        # following a node's attempts (a cluster that restarts it): the node's restarts followed so far; the pod
        # as the current attempt began; the next attempt's run must have begun after _after (None: not waiting)
        self.attempt = 0
        self._pinned = False
        self._node_before: object = None
        self._after: float | None = None
        self._waiting_since = 0.0
        self._look_said = ""  # what the cluster said of the node, last written as a note
        self._timed_for: tuple = ()  # the pod incarnation the wait's time was last started for
        self._lagging = 0  # connections refused while the cluster still calls the container running
        self._run_final: StateEvent | None = None  # (the reader's: the final state the current run's stream gave)
        self._gen_base = 0  # added to the current run's launch generations (its node's earlier attempts' come first)
        self._gen_top = 0
        self.meta = None
        self._remote_dir = ""  # the run's directory on the node, once the agent has said
        self._cursor: dict[str, int] = {}
        # the time (our clock) up to which the node's stream has been read (_heard, by the link's thread) and
        # taken by poll (heard_until): from the agent's cursors, else when each cursor was read
        self._heard: float | None = None
        self.heard_until: float | None = None
        self.finished = False
        self.error: str | None = None  # why the attachment failed for good
        self.link = "connecting"
        self.connects = 0
        self._tries = 0  # tries that failed since the link was last up (LinkEvent.tries)
        self._final: StateEvent | None = None
        self._exit: ExitStatus | None = None  # from the agent's bye
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._early: list = []  # what wait() took off the queue, for the next poll
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"attach-{host}")
        self._thread.start()

    # -- the JobSession protocol -----------------------------------------------

    @property
    def location(self) -> RemoteRun:
        return RemoteRun(self.host, self.run, self._remote_dir, self.node)

    @property
    def is_live(self) -> bool:
        return not self.finished and self.error is None

    @property
    def final_state(self) -> StateEvent | None:
        return self._final

    def exit_status(self) -> ExitStatus:
        if self._exit is not None:
            return self._exit
        if self.error is not None:
            return ExitStatus.unknown(self.error)
        return ExitStatus.of_final(self._final)

    def refused_here(self) -> str:
        return (f"ddptop did not start this job ({self.run} on {self.node}) and will not stop or relaunch it; "
                f"to stop it, send SIGINT to its torchrun on the node yourself") if not self.launched else ""

    def control(self) -> Control:
        on = not self.finished and self.error is None
        return Control(stop=on and self.launched, relaunch=on and self.launched, stacks=on,
                       refused=self.refused_here(), fix_refused=FIX_ELSEWHERE)

    def cursor(self) -> dict[str, int]:
        return dict(self._cursor)

    def wake(self) -> None:
        """End a ``wait`` under way (an empty batch on the queue)."""
        self._q.put([])

    @property
    def has_news(self) -> bool:
        """Something has come over the link that ``poll`` has not returned."""
        return bool(self._early) or not self._q.empty()

    def wait(self, timeout: float) -> None:
        """Until the link delivers something (or ``timeout``)."""
        if self.finished or self._early:
            return
        try:
            self._early.append(self._q.get(timeout=max(0.0, timeout)))
        except queue.Empty:
            pass

    def poll(self) -> list[Event]:
        out: list[Event] = []
        heard = self._heard  # (read before the queue: every batch it covers was queued before it was set)
        while True:
            if self._early:
                batch = self._early.pop(0)
            else:
                try:
                    batch = self._q.get_nowait()
                except queue.Empty:
                    break
            if batch is None:
                self.finished = True
                if self._final is not None:
                    out.append(self._final)  # the job's final state is the stream's last event
                break
            if isinstance(batch, tuple):  # (OVER, N): attempt N of the node ended; the next is waited for
                f = self._final
                if f is not None:
                    out.append(NoteEvent(f.t, "info" if f.state == SUCCEEDED else "warning",
                                         f"{self.node}: attempt {batch[1]} {f.state}"
                                         + (f", exit code {f.exit_code}" if f.exit_code is not None else "")
                                         + (f" ({f.message})" if f.message else ""), node=self.node))
                out.append(StateEvent(self.clock(), STARTING, None, f"{self.node}: waiting for its next attempt",
                                      node=self.node))
                continue
            for ev in batch:
                if isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
                    self._final = ev
                else:
                    if isinstance(ev, LaunchEvent) and ev.node_restart:
                        self._final = None  # a new attempt: the last one's end is history
                    out.append(ev)
        if heard is not None:
            self.heard_until = heard
        return out

    def stop(self) -> CommandResult:
        if not self.launched:
            return CommandResult(False, self.refused_here(), refused=True)
        return self._command({"cmd": "stop"}, "stop the job")

    def relaunch(self, profiles: list[str], reason: str = "asked for") -> CommandResult:
        if not self.launched:
            return CommandResult(False, self.refused_here(), refused=True)
        return self._command({"cmd": "relaunch", "profiles": list(profiles), "reason": reason},
                             f"relaunch with {', '.join(profiles) or 'no profile'}")

    def dump_stacks(self) -> CommandResult:
        return self._command({"cmd": "stacks"}, "capture every rank's stack")

    def close(self) -> None:
        """Detach: end the link (the remote job is not touched)."""
        self._closed.set()
        self._kill()

    # -- the link --------------------------------------------------------------

    def _command(self, cmd: dict, what: str) -> CommandResult:
        """Send a command now, or refuse it: never queued to fire minutes later on a reconnect."""
        if self.finished or self._final is not None:
            return CommandResult(False, f"{self.node}: the job has ended")
        if self.error is not None:
            return CommandResult(False, f"{self.node}: not attached ({self.error})")
        if self.link != "up":
            return CommandResult(False, f"{self.node}: the link is {self.link}: not sent (try again once it is up)")
        err = self._send(cmd)
        if err is not None:
            return CommandResult(False, f"{self.node}: {err}: not sent")
        return CommandResult(True, f"{self.node}: asked to {what}")

    def _send(self, cmd: dict) -> str | None:
        """Write a command to the agent now; why not, or None."""
        with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None:
                return "the link is down"
            try:
                proc.stdin.write((json.dumps(cmd) + "\n").encode())
                proc.stdin.flush()
            except OSError as e:
                return f"the link broke ({e})"
        return None

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # our own ssh, in its own process group
            except (ProcessLookupError, PermissionError):
                pass

    def _emit(self, events: list[Event]) -> None:
        self._q.put(events)

    def _set_link(self, state: str, message: str = "", retry_in: float | None = None) -> None:
        self.link = state
        self._emit([LinkEvent(self.clock(), node=self.node, state=state, message=message, retry_in=retry_in,
                              connects=self.connects, tries=self._tries)])

    def _argv(self) -> list[str]:
        if self._after is not None:  # the node's next attempt: the first run begun after the last one
            return self.transport.argv([*shlex.split(self.remote_cmd), "agent", "--after", repr(self._after)])
        remote = [*shlex.split(self.remote_cmd), "agent", "--run", self.run]
        if self.run.startswith("pid:") and self.gpu:
            remote += ["--gpu", self.gpu]  # the agent samples a job ddptop did not launch itself
        if self._cursor:
            remote += ["--resume", encode_cursor(self._cursor)]
        return self.transport.argv(remote)

    def _run(self) -> None:
        failures = 0
        self._set_link("connecting", self.transport.label())
        while not self._closed.is_set():
            try:
                argv = self._argv()
            except ValueError as e:  # (a name the cluster gave that could be read as an option)
                return self._fail(str(e))
            self._spawned = self.clock()  # (the agent's hello is sent after this: what its clock is judged by)
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True)
            except OSError as e:
                if e.errno not in _SHORT_OF:
                    return self._fail(f"cannot run {argv[0]!r}: {e}")
                # (out of file descriptors or processes for now, with a hundred nodes' links open: not this node's
                # fault, and not for good: tried again with the backoff, like a link that dropped)
                proc, outcome, message = None, "lost", f"cannot run {argv[0]!r} now: {e.strerror}"
            if proc is not None:
                with self._lock:
                    self._proc = proc
                try:
                    outcome, message = self._pump(proc)
                finally:
                    self._kill()
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                    with self._lock:
                        self._proc = None
                        self.link = "down"
            if outcome == "bye":
                if self._attempt_over(self._run_final):
                    failures = 0
                    continue  # (at once: the next attempt may be there already)
                self._q.put(None)
                return
            if not self._pinned and self.transport.follows_restarts:
                outcome, message = self._starting(outcome, message)
            elif self._follows():
                outcome, message = self._follow(outcome, message)
                if outcome == "next":
                    failures = 0
                    continue
                if outcome == "end":
                    ok = self._run_final is not None and self._run_final.state == SUCCEEDED
                    self._emit([NoteEvent(self.clock(), "info" if ok else "warning", f"{self.node}: {message}",
                                          node=self.node)])
                    self._q.put(None)
                    return
            if outcome in ("fatal", "gone", "not-yet"):
                return self._fail(message)
            if self._closed.is_set():
                return
            if outcome == "hello":
                failures = 0  # it was connected: start the backoff over
            delay = self.backoff[min(failures, len(self.backoff) - 1)]
            self._tries = failures  # (0: the first drop; more: still down, retried in silence)
            failures += 1
            self._set_link("down", message, retry_in=delay)
            if self._closed.wait(delay):
                return
            self._tries = failures
            self._set_link("connecting", f"{self.transport.label()} (try {failures + 1})")

    def _fail(self, message: str) -> None:
        self.error = message
        self._set_link("failed", message)
        now = self.clock()
        if self._final is None:
            self._emit([StateEvent(now, LOST, None, message, node=self.node)])
        self._q.put(None)
