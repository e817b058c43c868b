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
``SSH_OPTIONS``, ``check_host``, ``remote_command``, ``install_hint``).

One module, though over 500 lines: it is one session implementation, the
client end of the agent protocol; its parts (the reader thread, reconnect and
resume, the follow of a node the cluster restarts) all feed the one stream
that ``poll()`` hands out, and share its state (the pinned run, the cursor,
the held final state).  How a node is reached lives in ``transports``, what
a cluster says of its pods in ``k8s_pods``.
"""

from __future__ import annotations

import json
import os
import queue
import select
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import replace

from ddptop import __version__
from ddptop.core.model.events import (
    FAILED,
    FINAL_STATES,
    LOST,
    STARTING,
    SUCCEEDED,
    BadEvent,
    Event,
    LaunchEvent,
    LinkEvent,
    LogBatch,
    LogEvent,
    NoteEvent,
    StateEvent,
    UnknownKind,
    from_dict,
)
from ddptop.core.model.session_protocol import (
    CommandResult,
    Control,
    ExitStatus,
    RemoteRun,
)
from ddptop.core.model.settings import settings
from ddptop.core.run import journal
from ddptop.core.sessions import wire
from ddptop.core.sessions.transports import NOT_FOUND, Ssh, Transport, check_host
from ddptop.core.sessions.wire import encode_cursor

BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0)  # seconds before reconnect n (then the last, forever)
SILENCE = 15.0  # seconds without any line (the agent sends one every 2 s) = dead link
HELLO_TIMEOUT = 60.0
MAX_LINE = 16 * 1024 * 1024
SKEW_MIN = 1.0  # seconds: a node clock further than this from ours has its event times moved onto ours
CONTROL = wire.CONTROL
FIX_ELSEWHERE = "ddptop fix runs the job again on this machine: run it on the node where the job runs"
RESTART_WAIT = 120.0  # seconds a node whose run failed is waited for, when its cluster does not say it restarts it
_OVER = object()  # on the queue, with the attempt's number: the node's attempt has ended, its next one is waited for
LAG_TRIES = 5  # connections refused for a container the cluster still calls running, before that is an error
# what kubectl says when the container (or pod) it was to exec into is not running
_NOT_RUNNING = ("container not found", "cannot exec into a container in a completed pod", "NotFound",
                "is not created or running", "container is not running")


def install_hint() -> str:
    return f"pip install 'ddptop=={__version__}'"


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


def _event(d: dict, node: str, skew: float = 0.0) -> Event:
    """One event off the wire, its fields checked (``BadEvent`` when not an
    event; ``UnknownKind`` for a kind a newer agent sends).  ``skew``: our clock
    minus the node's, added to the node's times (0 when the clocks agree)."""
    d["node"] = node  # the name the person attached to (the agent knows only its hostname)
    if skew and isinstance(d.get("t"), (int, float)) and not isinstance(d["t"], bool):
        d["t"] += skew
    return from_dict(d)


class RemoteSession:
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
        # our clock minus the node's (measured at each hello, the link's delay included), added to the
        # times of the node's events when over SKEW_MIN, so that ages and the cross-node stall
        # detector compare like with like
        self.skew = 0.0
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
        self.meta: journal.Meta | None = None
        self._remote_dir = ""  # the run's directory on the node, once the agent has said
        self._cursor: dict[str, int] = {}
        self.finished = False
        self.error: str | None = None  # why the attachment failed for good
        self.link = "connecting"
        self.connects = 0
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
    def launched(self) -> bool:
        """The job on the node was launched by ddptop (not watched there by pid)."""
        return not self.run.startswith("pid:")

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
            if isinstance(batch, tuple):  # (_OVER, N): attempt N of the node ended; the next is waited for
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
                              connects=self.connects)])

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
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True)
            except OSError as e:
                return self._fail(f"cannot run {argv[0]!r}: {e}")
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
            failures += 1
            self._set_link("down", message, retry_in=delay)
            if self._closed.wait(delay):
                return
            self._set_link("connecting", f"{self.transport.label()} (try {failures + 1})")

    # -- a node whose cluster restarts it: its attempts, one after another ---------

    def _follows(self) -> bool:
        """Whether this node's attempts are followed: a cluster that says when it
        restarts the node, and a run ddptop launched (whose start time the next
        attempt's run is found after)."""
        return (self.transport.follows_restarts and self._pinned and self.meta is not None
                and isinstance(self.meta.started, (int, float)))

    def _starting(self, outcome: str, message: str) -> tuple[str, str]:
        """The first connection to a node whose cluster says how its pod is
        failed: while the pod is starting (pending, its image pulled, its
        container not yet running) or its ddptop has not begun its run yet,
        that is waited for (``restart_wait`` unless the cluster says it is on
        its way); else the outcome as it is."""
        not_running = outcome == "not-yet" or any(s in message for s in _NOT_RUNNING)
        if outcome not in ("fatal", "not-yet") or not not_running:
            return outcome, message
        look = self.transport.outlook(None)
        if look is None or look.kind not in ("restarting", "same"):
            return ("fatal" if outcome == "not-yet" else outcome), message
        if not self._waiting_since or look.coming:
            self._waiting_since = time.monotonic()
        waited = time.monotonic() - self._waiting_since
        if waited >= self.restart_wait:
            return "fatal", f"{message} (waited {self.restart_wait:.0f} s for the pod's run to begin)"
        what = look.message if look.kind != "same" else "its ddptop has not begun a run yet"
        return "lost", f"waiting for the pod to start: {what}"

    def _attempt_over(self, final: StateEvent | None) -> bool:
        """The current attempt's run ended (``final``: how): True when its next
        attempt is to be waited for (not after a success, nor for a cluster
        that says nothing of restarts)."""
        if not self._follows() or final is None or final.state == SUCCEEDED:
            return False
        assert self.meta is not None
        self._after = float(self.meta.started)
        self._waiting_since = time.monotonic()
        self._timed_for = ()
        self._q.put((_OVER, self.attempt))
        return True

    def _follow(self, outcome: str, message: str) -> tuple[str, str]:
        """A connection of a followed node failed (``outcome``, ``message``):
        ``next`` (look for the next attempt at once), ``end`` (none will come:
        ``message`` says why), or the outcome to go on with (``lost``: retry
        after the backoff; ``fatal``)."""
        if outcome in ("lost", "hello") and self._after is None:
            return outcome, message  # (the link dropped: the run is read on from where it was)
        not_running = outcome in ("gone", "not-yet") or any(s in message for s in _NOT_RUNNING)
        if outcome == "fatal" and not not_running:
            return outcome, message  # (ddptop missing or too old there, refused by the cluster: said as it is)
        look = self.transport.outlook(self._node_before)
        if look is not None and look.kind != "same" and look.message != self._look_said:
            self._look_said = look.message  # (what the cluster says, once, in the log)
            self._emit([NoteEvent(self.clock(), "info", f"{self.node}: {look.message}", node=self.node)])
        if self._after is None:
            # the run being read could not be reached, or is not there any more (gone)
            if look is not None and outcome != "gone" and look.kind in ("same", "restarting"):
                if look.kind == "same":  # (kubectl says the container is not running; the API does not, yet)
                    self._lagging += 1
                    if self._lagging > LAG_TRIES:
                        return outcome, message
                return "lost", f"{message} ({look.message}: its run is read on once it is back)"
            if look is None and outcome != "gone":
                return ("lost" if outcome == "not-yet" else outcome), message
            # the attempt ended, and its run cannot be read: its end as the cluster says
            final = self._run_final = self._final_from(look) if look is not None else StateEvent(
                self.clock(), LOST, None, f"{message} (and the cluster could not be asked)", node=self.node)
            self._emit([final])
            if look is not None and look.kind == "ended" or not self._attempt_over(final):
                return "end", look.message if look is not None else message
            return "next", ""
        # waiting for the next attempt
        if look is not None and look.kind == "ended":
            return "end", f"no next attempt: {look.message}"
        if look is not None and (look.coming or look.kind == "restarting" and look.incarnation != self._timed_for):
            # the cluster says one is on its way, or a new container (or pod) runs: its run is waited for anew
            self._timed_for = look.incarnation
            self._waiting_since = time.monotonic()
        waited = time.monotonic() - self._waiting_since
        said = look.message if look is not None else "the cluster could not be asked"
        if waited >= self.restart_wait:
            return "end", f"no next attempt came within {self.restart_wait:.0f} s ({said})"
        return "lost", f"waiting up to {self.restart_wait - waited:.0f} s more for the next attempt ({said})"

    def _final_from(self, look) -> StateEvent:
        """An attempt's end as its cluster tells it (its run's record could not be read)."""
        code = look.exit_code
        state = SUCCEEDED if code == 0 else FAILED if code is not None else LOST
        detail = look.reason or look.message
        if look.reason == "OOMKilled":
            detail += (": the container reached its memory limit (fewer data-loader workers, or a larger "
                       "resources.limits.memory)")
        return StateEvent(self.clock(), state, code, f"as the cluster tells it: {detail}; the run's own record "
                          "could not be read", node=self.node)

    def _next_attempt(self, d: dict) -> None:
        """The hello of the node's next attempt: its run is followed from its start."""
        self.attempt += 1
        self._gen_base = self._gen_top + 1
        self._gen_top = self._gen_base
        self._cursor = {}
        self._after = None
        self._run_final = None
        self._exit = None
        self._node_before = self.transport.listed_node()
        meta = self.meta
        self._emit([LaunchEvent(self.clock(), generation=self._gen_base, node_restart=self.attempt, node=self.node,
                                profiles=tuple(meta.profiles or ()) if meta is not None else (),
                                command=tuple(meta.command) if meta is not None else (),
                                reason=f"run {d.get('run')} {self.transport.where()}")])

    def _fail(self, message: str) -> None:
        self.error = message
        self._set_link("failed", message)
        now = self.clock()
        if self._final is None:
            self._emit([StateEvent(now, LOST, None, message, node=self.node)])
        self._q.put(None)

    def _pump(self, proc: subprocess.Popen) -> tuple[str, str]:
        """Read one connection to its end: ('bye'|'fatal'|'hello'|'lost', message)."""
        assert proc.stdout is not None  # (started with stdout=PIPE)
        fd = proc.stdout.fileno()
        buf = b""
        pending: list[Event] = []
        got_hello = False
        before_hello: list[str] = []
        n = 0
        last = time.monotonic()
        while True:
            if self._closed.is_set():
                return "closed", "detached"
            r, _, _ = select.select([fd], [], [], 0.5)
            if not r:
                limit = self.silence if got_hello else HELLO_TIMEOUT
                if time.monotonic() - last > limit:
                    return ("hello" if got_hello else "lost"), f"no data from {self.host} for {limit:.0f} s"
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            last = time.monotonic()
            buf += chunk
            if b"\n" not in buf:
                if len(buf) > MAX_LINE:
                    return "fatal", f"{self.host}: agent line {n + 1} is over {MAX_LINE} bytes: not the ddptop agent protocol"
                continue
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                n += 1
                if not got_hello:
                    kind, d = self._parse(raw)
                    if kind != "hello":
                        before_hello.append(raw[:200].decode("utf-8", "replace"))
                        continue
                    problem = self._check_hello(d)
                    if problem:
                        return "fatal", problem
                    got_hello = True
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
                    continue
                kind, d = wire.parse_line(raw)
                if kind is None:
                    pending.append(NoteEvent(self.clock(), "warning", f"{self.host}: agent line {n} unreadable, "
                                             f"skipped: {raw[:120].decode('utf-8', 'replace')!r}", node=self.node))
                    continue
                if kind == "cursor":
                    files = d.get("files")
                    if isinstance(files, dict) and all(isinstance(v, int) for v in files.values()):
                        self._cursor = {str(k): v for k, v in files.items()}
                    if pending:
                        self._emit(pending)
                        pending = []
                elif kind == "bye":
                    self._exit = ExitStatus.from_dict(d.get("exit"))
                    if self._exit is None and isinstance(d.get("attach_exit_code"), int) and not self.launched:
                        self._exit = ExitStatus.unknown("ddptop did not start this job: its exit code cannot be "
                                                        "known", crash_seen=d["attach_exit_code"] == 1)
                    self._set_link("closed", "the job has ended")  # before the batch: its final state comes last
                    if pending:
                        self._emit(pending)
                    return "bye", ""
                elif kind == "error":
                    why = str(d.get("message", "the agent reported an error"))
                    if d.get("code") == "not-yet":
                        return "not-yet", why
                    return ("gone" if d.get("code") == "no-run" and self._pinned else "fatal"), why
                elif kind == "reply" and d.get("cmd") == "accept":
                    continue  # (logs batches from now on: nothing to tell the person)
                elif kind == "reply":
                    level = "info" if d.get("ok") else "warning"
                    what = "refused: " if d.get("refused") else ""
                    self._emit([NoteEvent(self.clock(), level, f"{self.host}: {d.get('cmd')}: {what}{d.get('message')}",
                                          node=self.node)])
                elif kind in CONTROL:
                    continue
                else:
                    try:
                        ev = _event(d, self.node, self.skew)
                        if isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
                            self._run_final = ev
                        elif isinstance(ev, LaunchEvent) and self._gen_base:
                            ev = replace(ev, generation=ev.generation + self._gen_base)
                        if isinstance(ev, LaunchEvent):
                            self._gen_top = max(self._gen_top, ev.generation)
                        pending.append(LogBatch.of_line(ev) if isinstance(ev, LogEvent) else ev)
                    except UnknownKind:
                        continue  # a newer agent's kind: ignored
                    except BadEvent as e:
                        pending.append(NoteEvent(self.clock(), "warning",
                                                 f"{self.host}: agent line {n}: bad {kind!r} event ({e})",
                                                 node=self.node))
        # the connection ended without a bye; a trailing partial line and an
        # uncommitted batch are dropped: the next connection resumes before them
        rc = proc.wait()
        err = proc.stderr.read().decode("utf-8", "replace").strip() if proc.stderr else ""
        if got_hello:
            return "hello", _last_line(err) or f"link lost ({self.transport.kind} exit {rc})"
        return self._classify_failure(rc, err, before_hello)

    def _measure_skew(self, t) -> None:
        if not isinstance(t, (int, float)) or isinstance(t, bool):
            return  # an older agent: times are taken as they are
        skew = self.clock() - float(t)
        was = self.skew
        self.skew = skew if abs(skew) > SKEW_MIN else 0.0
        if self.skew and (not was or abs(self.skew - was) > SKEW_MIN):
            self._emit([NoteEvent(self.clock(), "warning",
                                  f"{self.host}'s clock is {abs(skew):.1f} s {'behind' if skew > 0 else 'ahead of'} "
                                  f"this machine's: its times are shown on this machine's clock (is NTP running "
                                  f"there?)", node=self.node)])
        elif was and not self.skew:
            self._emit([NoteEvent(self.clock(), "info", f"{self.host}'s clock now agrees with this machine's",
                                  node=self.node)])

    def _parse(self, raw: bytes) -> tuple[str | None, dict]:
        return wire.parse_line(raw)

    def _check_hello(self, d: dict) -> str | None:
        return wire.check_hello(d, self.host, install_hint())

    def _classify_failure(self, rc: int, err: str, before_hello: list[str]) -> tuple[str, str]:
        what = _last_line(err) or (before_hello[-1] if before_hello else "")
        t = self.transport
        cmd0 = shlex.split(self.remote_cmd)[0]
        if rc == 127 or any(s in err for s in NOT_FOUND) and (cmd0 in err or "ddptop" in err):
            return "fatal", (f"ddptop is not installed {t.where()} (`{self.remote_cmd}` was not found: {what}). "
                             f"{t.install(install_hint())} -- or name it with --remote-ddptop '/path/to/venv/bin/ddptop'")
        if "invalid choice" in err or "unknown command 'agent'" in err or "unrecognized arguments: --after" in err:
            return "fatal", (f"the ddptop {t.where()} is too old for `ddptop agent` ({what}). "
                             f"Install this version there: {install_hint()}")
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
        return journal.Meta.from_dict(d)
    except TypeError:  # a field missing (a newer or damaged agent's meta)
        return None
