"""Logs only: a training job's pods followed through ``kubectl logs``, for
images without ddptop (a ``JobSession``).

``kubectl logs -f --prefix -l SELECTOR`` is read in a thread; each line's
``[pod/NAME/CONTAINER]`` prefix says its node (the pod's role and index, as
``ddptop attach --k8s`` names it) and torch's own ``[rankN]:`` its rank, when
there is one (the one prefix parser, ``core/prefixes.py``).  The live
analysis runs here, on the client: failure signatures, progress, the job's
findings.  There is no GPU pane, no stack sample and no stall alarm from
silence (the ranks of lines without a rank prefix are not known), and a
dropped stream is followed again from the pods' recent lines.  Stop, relaunch
and stacks are refused: the job belongs to the cluster.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import subprocess
import threading
import time

from ddptop.core.events import ENDED, FINAL_STATES, LOST, Event, LinkEvent, LogBatch, StateEvent
from ddptop.core.prefixes import PrefixReader
from ddptop.core.sessions.protocol import CommandResult, Control, ExitStatus, PodLogs

REFUSED = "logs only: the job belongs to the cluster, and its image has no ddptop to ask"
BACKOFF = (1.0, 2.0, 4.0, 8.0)


class PodLogsSession:
    def __init__(self, argv: list[str], location: PodLogs, nodes: dict[str, str], *, clock=time.time,
                 since: str = "10m"):
        """``argv``: kubectl with the person's context and namespace; ``nodes``:
        pod name -> its node's name in the view."""
        self._argv = argv
        self._location = location
        self.nodes = dict(nodes)
        self.clock = clock
        self.since = since
        self.finished = False
        self.error: str | None = None
        self.link = "connecting"
        self._final: StateEvent | None = None
        from ddptop.core.pipeline import Pipeline

        self.pipeline = Pipeline(node="", clock=clock)
        self._readers: dict[str, PrefixReader] = {}
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = threading.Event()
        self._woken = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pod-logs")
        self._thread.start()

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
        self._kill()

    # -- the reader ------------------------------------------------------------------

    def _kill(self) -> None:
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # our own kubectl, in its own process group
            except ProcessLookupError:
                pass

    def _link(self, state: str, message: str, retry_in: float | None = None) -> None:
        self.link = state
        self._q.put([LinkEvent(self.clock(), node="kubectl", state=state, message=message, retry_in=retry_in)])
        self._woken.set()

    def _run(self) -> None:
        failures = 0
        first = True
        while not self._closed.is_set():
            argv = list(self._argv)
            if not first:
                argv += [f"--since={self.since}"]  # (followed again: the recent lines, once more)
            self._link("connecting", "kubectl logs -f --prefix")
            try:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            except OSError as e:
                self._fail(f"cannot run {argv[0]!r}: {e}")
                return
            with self._lock:
                self._proc = proc
            self._link("up", f"following {len(self.nodes)} pods' logs (logs only: no GPU pane, no stacks)")
            self._pump(proc)
            rc = proc.wait()
            err = proc.stderr.read().decode("utf-8", "replace").strip() if proc.stderr else ""
            if self._closed.is_set():
                return
            if rc == 0:
                # every stream ended: the pods' containers exited
                self._q.put([StateEvent(self.clock(), ENDED, None, "the pods' logs ended (their containers exited)")])
                self._q.put(None)
                self._woken.set()
                return
            if "error:" in err and ("maximum allowed concurrency" in err or "unknown flag" in err
                                    or "NotFound" in err or "Forbidden" in err):
                self._fail(err.splitlines()[-1])
                return
            first = False
            delay = BACKOFF[min(failures, len(BACKOFF) - 1)]
            failures += 1
            self._link("down", err.splitlines()[-1] if err else f"kubectl exited with {rc}", retry_in=delay)
            if self._closed.wait(delay):
                return

    def _fail(self, message: str) -> None:
        self.error = message
        self._link("failed", message)
        self._q.put([StateEvent(self.clock(), LOST, None, message)])
        self._q.put(None)
        self._woken.set()

    def _pump(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        buf = b""
        while not self._closed.is_set():
            r, _, _ = select.select([fd], [], [], 0.5)
            if not r:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\n")
            batches: dict[tuple, list[str]] = {}
            for raw in lines:
                text = raw.decode("utf-8", "replace")
                pod = text[5:text.find("/", 5)] if text.startswith("[pod/") else ""
                reader = self._readers.setdefault(pod, PrefixReader())
                p = reader.split(text)
                node = self.nodes.get(p.host, p.host) if p.host else "kubectl"
                batches.setdefault((node, p.rank, p.host), []).append(p.text)
            now = self.clock()
            out: list[Event] = []
            for (node, rank, pod), texts in batches.items():
                out.append(LogBatch(now, rank=rank, stream="stdout", attempt=0, path=f"pod/{pod}", node=node,
                                    offsets=tuple(0 for _ in texts), texts=tuple(texts)))
            if out:
                self._q.put(out)
                self._woken.set()
