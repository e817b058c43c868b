"""Logs only: a training job's pods followed through ``kubectl logs``, for
images without ddptop (a ``JobSession``).

Each pod's training container is followed by a ``kubectl logs -f POD -c
CONTAINER`` of its own, read in a thread; the pod is its node (its role and
index, as ``ddptop attach --k8s`` names it), and torch's own ``[rankN]:``
prefix says a line's rank, when there is one (the one prefix parser,
``core/analysis/prefixes.py``).  The live analysis runs here, on the client: failure
signatures, progress, the job's findings.  There is no GPU pane, no stack
sample and no stall alarm from silence (the ranks of lines without a rank
prefix are not known), and a dropped stream is followed again from the pod's
recent lines.  Stop, relaunch and stacks are refused: the job belongs to the
cluster.

A pod's stream ends when its container does.  Then the cluster is asked
(``pods``: the job's pods now; ``outlook``: ``k8s.outlook``): a container the
cluster restarts, or a pod recreated under a new name, is the next attempt of
its node (a ``LaunchEvent`` with ``node_restart``), followed from its start
while the other pods' streams go on.  When every node has ended, the job's
end is the pods' own: their containers' exit codes.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import subprocess
import threading
import time
from typing import Any, Callable

from ddptop.core.analysis.prefixes import PrefixReader
from ddptop.core.model.events import (
    ENDED,
    FAILED,
    FINAL_STATES,
    LOST,
    SUCCEEDED,
    Event,
    LaunchEvent,
    LinkEvent,
    LogBatch,
    NoteEvent,
    StateEvent,
)
from ddptop.core.model.session_protocol import (
    CommandResult,
    Control,
    ExitStatus,
    PodLogs,
)
from ddptop.core.run.pipeline import Pipeline

REFUSED = "logs only: the job belongs to the cluster, and its image has no ddptop to ask"
BACKOFF = (1.0, 2.0, 4.0, 8.0)
RESTART_WAIT = 120.0  # seconds an ended pod is waited for, when the cluster does not say it restarts it
SETTLE_TRIES = 3  # times a stream that ended as a container's does is checked against the cluster's word
# kubectl's answers that following again cannot fix
_FATAL = ("unknown flag", "Forbidden", "Unauthorized", "no context exists", "invalid configuration",
          "You must be logged in")


class PodLogsSession:
    def __init__(self, kubectl: list[str], location: PodLogs, pods: list[Any], *, clock=time.time,
                 since: str = "10m", watch: Callable[[], list[Any] | None] | None = None, outlook=None,
                 restart_wait: float = RESTART_WAIT, backoff: tuple[float, ...] = BACKOFF):
        """``kubectl``: kubectl with the person's context and namespace;
        ``pods``: the job's pods (``k8s.Pod``: name, node, container), one
        node each; ``watch``: the job's pods as the cluster lists them now
        (``k8s.JobWatch.now``, None when it cannot say) and ``outlook``
        (``k8s.outlook``), to follow restarts."""
        self._kubectl = list(kubectl)
        self._location = location
        self._pods: dict[str, Any] = {p.node: p for p in pods}  # node -> its pod, as last listed
        self.nodes = {p.name: p.node for p in pods}
        self.clock = clock
        self.since = since
        self._watch = watch
        self._outlook = outlook
        self.restart_wait = restart_wait
        self.backoff = backoff
        self.finished = False
        self.error: str | None = None
        self.link = "connecting"
        self._final: StateEvent | None = None
        self._exit: ExitStatus | None = None

        self.pipeline = Pipeline(node="", clock=clock)
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = threading.Event()
        self._woken = threading.Event()
        self._procs: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._generation = 0
        self._attempts: dict[str, int] = {}
        self._ends: dict[str, Any] = {}  # node -> how its last attempt ended, as the cluster said (an Outlook)
        self._left = len(self._pods)
        self._threads = [threading.Thread(target=self._follow, args=(n,), daemon=True, name=f"pod-logs-{n}")
                         for n in self._pods]
        for t in self._threads:
            t.start()

    # -- the JobSession protocol -----------------------------------------------

    @property
    def location(self) -> PodLogs:
        return self._location

    @property
    def meta(self):
        return None

    @property
    def final_state(self) -> StateEvent | None:
        return self._final

    @property
    def is_live(self) -> bool:
        return not self.finished

    def exit_status(self) -> ExitStatus:
        if self._exit is not None:
            return self._exit
        return ExitStatus.unknown("logs only: the pods' exit codes are the cluster's (kubectl get pods)",
                                  crash_seen=self.pipeline.crash_seen)

    def control(self) -> Control:
        return Control(stop=False, relaunch=False, stacks=False, refused=REFUSED, fix_refused=REFUSED)

    def cursor(self) -> dict[str, int]:
        return {}

    def wake(self) -> None:
        self._woken.set()

    def wait(self, timeout: float) -> None:
        if self._q.empty():
            self._woken.wait(timeout)
        self._woken.clear()

    def poll(self) -> list[Event]:
        events: list[Event] = []
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self.finished = True
                break
            events += item
        for ev in events:
            if isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
                self._final = ev
        alarms = self.pipeline.process(events, check=True)
        self.pipeline.react(alarms)
        return events + list(alarms)

    def stop(self) -> CommandResult:
        return CommandResult(False, REFUSED, refused=True)

    def relaunch(self, profiles: list[str], reason: str = "asked for") -> CommandResult:
        return CommandResult(False, REFUSED, refused=True)

    def dump_stacks(self) -> CommandResult:
        return CommandResult(False, REFUSED, refused=True)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            _kill(proc)

    # -- one pod's stream ----------------------------------------------------------

    def _put(self, events: list[Event]) -> None:
        self._q.put(events)
        self._woken.set()

    def _link(self, node: str, state: str, message: str, retry_in: float | None = None) -> None:
        self.link = state
        self._put([LinkEvent(self.clock(), node=node, state=state, message=message, retry_in=retry_in)])

    def _follow(self, node: str) -> None:
        """Follow one node's pod: its container's log, then its next attempts'."""
        before = self._pods[node]
        failures = 0
        since = ""
        reader = PrefixReader()
        while not self._closed.is_set():
            pod = self._pods[node]
            argv = [*self._kubectl, "logs", "-f", pod.name, *(["-c", pod.container] if pod.container else []),
                    *([f"--since={since}"] if since else [])]
            self._link(node, "connecting", f"kubectl logs -f {pod.name}")
            try:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            except OSError as e:
                return self._fail(f"cannot run {argv[0]!r}: {e}")
            with self._lock:
                self._procs[node] = proc
            if self._closed.is_set():  # (closed while it started: close() did not see it)
                _kill(proc)
                proc.wait()
                return
            self._link(node, "up", f"following pod {pod.name}'s log (logs only: no GPU pane, no stacks)")
            got = self._pump(proc, node, pod.name, reader)
            rc = proc.wait()
            err = proc.stderr.read().decode("utf-8", "replace").strip() if proc.stderr else ""
            with self._lock:
                self._procs.pop(node, None)
            if self._closed.is_set():
                return
            last = err.splitlines()[-1] if err else f"kubectl exited with {rc}"
            if rc != 0 and any(s in err for s in _FATAL):
                return self._fail(f"{node}: {last}")
            # any end of the stream (the container ended, is not running, the link dropped): the cluster says
            # whether a next attempt comes; the same container still running is followed on
            outcome, now = self._next_attempt(node, before, settle=rc == 0)
            if outcome == "end":
                return self._node_done(node)
            if outcome == "next":
                before, since, failures, reader = now, "", 0, PrefixReader()
                continue
            if got:
                since = self.since  # (followed again: the recent lines, once more)
            delay = self.backoff[min(failures, len(self.backoff) - 1)]
            failures += 1
            self._link(node, "down", last, retry_in=delay)
            if self._closed.wait(delay):
                return

    def _pump(self, proc: subprocess.Popen, node: str, pod: str, reader: PrefixReader) -> bool:
        """Read one stream to its end; whether it gave a line."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        buf = b""
        got = False
        while not self._closed.is_set():
            r, _, _ = select.select([fd], [], [], 0.5)
            if not r:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return got
            buf += chunk
            *lines, buf = buf.split(b"\n")
            batches: dict[int | None, list[str]] = {}
            for raw in lines:
                p = reader.split(raw.decode("utf-8", "replace"))
                batches.setdefault(p.rank, []).append(p.text)
            now = self.clock()
            out: list[Event] = [LogBatch(now, rank=rank, stream="stdout", attempt=0, path=f"pod/{pod}", node=node,
                                         offsets=tuple(0 for _ in texts), texts=tuple(texts))
                                for rank, texts in batches.items()]
            if out:
                got = True
                self._put(out)
        return got

    # -- restarts ------------------------------------------------------------------

    def _next_attempt(self, node: str, before: Any, settle: bool = False) -> tuple[str, Any]:
        """The node's stream ended: ("next", pod) once the cluster has its next
        attempt (announced), ("again", pod) when its container still runs (a
        dropped stream), ("end", None) when none will come.  ``settle``: the
        stream ended as a container's does; the cluster's word may lag behind
        it, so "still runs" is asked again a few times before it is believed."""
        if self._watch is None or self._outlook is None:
            return "end", None
        waiting_since = time.monotonic()
        tries = 0
        said = False
        settling = SETTLE_TRIES if settle else 0
        while not self._closed.is_set():
            pods = self._watch()
            if pods is not None:
                now = next((p for p in pods if p.node == node), None)
                if now is not None:
                    self._pods[node] = now
                    self.nodes[now.name] = node  # (a recreated pod has a new name: the same node)
                look = self._outlook(now, before)
                if now is not None and (now.uid != before.uid or now.restarts > before.restarts) and \
                        now.state != "waiting" and now.phase != "Pending":
                    # (running, or already ended again: its log is there to read either way)
                    self._announce(node, now, look)
                    return "next", now
                if look.kind == "same" and settling > 0:
                    settling -= 1  # (the cluster's word may lag behind the stream's end: asked again)
                    message = f"{look.message}: asked again"
                elif look.kind == "same":
                    return "again", now
                else:
                    self._ends[node] = look
                    if look.kind == "ended":
                        return "end", None
                    if look.coming:
                        waiting_since = time.monotonic()
                    elif time.monotonic() - waiting_since >= self.restart_wait:
                        self._put([NoteEvent(self.clock(), "warning", f"{node}: no next attempt came within "
                                             f"{self.restart_wait:.0f} s ({look.message})", node=node)])
                        return "end", None
                    first = (before.phase == "Pending" or before.state == "waiting") and not before.restarts \
                        and node not in self._attempts  # (it has not run yet: attached while the job starts)
                    if not said:
                        said = True
                        self._put([NoteEvent(self.clock(), "info", f"{node}: waiting for its pod to start "
                                             f"({look.message})", node=node) if first else
                                   NoteEvent(self.clock(), "info" if look.exit_code == 0 else "warning",
                                             f"{node}: attempt {self._attempts.get(node, 0)} ended ({look.message});"
                                             " waiting for its next attempt", node=node)])
                    message = (f"waiting for its pod to start: {look.message}" if first
                               else f"waiting for its next attempt: {look.message}")
            elif time.monotonic() - waiting_since >= self.restart_wait:
                self._put([NoteEvent(self.clock(), "warning", f"{node}: no next attempt came within "
                                     f"{self.restart_wait:.0f} s (the cluster could not be asked)", node=node)])
                return "end", None
            else:
                message = "waiting for its next attempt (the cluster could not be asked)"
            delay = self.backoff[min(tries, len(self.backoff) - 1)]
            tries += 1
            self._link(node, "down", message, retry_in=delay)
            if self._closed.wait(delay):
                break
        return "end", None

    def _announce(self, node: str, pod: Any, look: Any) -> None:
        with self._lock:
            self._generation += 1
            self._attempts[node] = n = self._attempts.get(node, 0) + 1
            gen = self._generation
        self._ends.pop(node, None)
        self._put([LaunchEvent(self.clock(), generation=gen, node_restart=n, node=node,
                               reason=f"{look.message}; following pod {pod.name}")])

    def _node_done(self, node: str) -> None:
        self._link(node, "closed", "its container ended")
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._put([self._the_end()])
            self._q.put(None)
            self._woken.set()

    def _the_end(self) -> StateEvent:
        """The job's end as its pods tell it (their containers' exit codes), else as the logs do."""
        codes: dict[str, int] = {}
        for n in self._pods:
            c = getattr(self._ends.get(n), "exit_code", None)
            if isinstance(c, int):
                codes[n] = c
        if codes and len(codes) == len(self._pods):
            bad = [(n, c) for n, c in codes.items() if c != 0]
            if bad:
                n, c = bad[0]
                self._exit = ExitStatus.known(c)
                return StateEvent(self.clock(), FAILED, c, f"{n}: {self._ends[n].message}")
            self._exit = ExitStatus.known(0)
            return StateEvent(self.clock(), SUCCEEDED, 0, "every pod completed")
        return StateEvent(self.clock(), ENDED, None, "the pods' logs ended (their containers exited)")

    def _fail(self, message: str) -> None:
        if self.error is not None:
            return
        self.error = message
        self._link("kubectl", "failed", message)
        self._put([StateEvent(self.clock(), LOST, None, message)])
        self._q.put(None)
        self._woken.set()
        self.close()


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # our own kubectl, in its own process group
        except ProcessLookupError:
            pass
