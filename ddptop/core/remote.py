"""Attach over ssh: a Session-like client of ``ddptop agent``.

``RemoteSession(host)`` runs ``ssh HOST ddptop agent ...`` with the person's
own ssh (config, keys, agent and ProxyJump all apply; nothing listens on a
port), reads the agent's JSON lines in a thread, and hands events to
``poll()`` a whole batch at a time, once the batch's cursor has arrived.  When
the link drops it reconnects with backoff and resumes from the last cursor, so
every line arrives exactly once.  ``MultiSession`` merges several nodes into
one stream and runs a stall detector across all of them.
"""

from __future__ import annotations

import json
import os
import queue
import re
import select
import shlex
import signal
import subprocess
import threading
import time

from ddptop import __version__
from ddptop.core import journal
from ddptop.core.agent import PROTO_NAME, PROTOCOL, encode_cursor
from ddptop.core.events import (FINAL_STATES, LOST, Event, LinkEvent, LogEvent, NoteEvent, StateEvent,
                                from_dict)

BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0)  # seconds before reconnect n (then the last, forever)
SILENCE = 15.0  # seconds without any line (the agent sends one every 2 s) = dead link
HELLO_TIMEOUT = 60.0
MAX_LINE = 16 * 1024 * 1024
SKEW_MIN = 1.0  # seconds: a node clock further than this from ours has its event times moved onto ours
CONTROL = frozenset({"hello", "cursor", "bye", "reply", "error"})
SSH_OPTIONS = ("-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")
# ssh's own failures that retrying cannot fix
_SSH_FATAL = ("Permission denied", "Host key verification failed", "Could not resolve hostname",
              "Bad configuration option", "no such identity", "REMOTE HOST IDENTIFICATION HAS CHANGED")


class ProtocolError(ValueError):
    pass


def install_hint() -> str:
    return f"pip install 'ddptop=={__version__}'"


def parse_target(target: str) -> tuple[str, str]:
    """``HOST`` or ``HOST:RUN`` (``user@host`` and ssh config aliases work)."""
    host, sep, run = target.partition(":")
    if not host:
        raise ValueError(f"no host in {target!r}")
    return host, (run if sep and run else "latest")


_NCCL_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+\S*)")
_NCCL_VIA = re.compile(r"\bvia (NET/[A-Za-z]+|P2P/[A-Za-z]+|SHM|direct pointer)")


def _event(d: dict, node: str, skew: float = 0.0) -> Event:
    """``skew``: our clock minus the node's, added to the node's times (0 when the clocks agree)."""
    if d.get("kind") == "log":
        return LogEvent.fast(d["t"] + skew, d["rank"], d["stream"], d["text"], d["attempt"], d["path"], d["offset"],
                             d.get("partial", False), d.get("transient", False), node)
    d["node"] = node  # the name the person attached to (the agent knows only its hostname)
    if skew:
        d["t"] += skew
    return from_dict(d)


class RemoteSession:
    """The same interface as ``Session`` (poll, stop, relaunch, finished...)."""

    def __init__(self, host: str, run: str = "latest", *, ssh: list[str] | None = None,
                 remote_cmd: str | None = None, node: str | None = None, clock=time.time,
                 backoff: tuple[float, ...] = BACKOFF, silence: float = SILENCE, gpu: str | None = None):
        self.host = host
        self.node = node or host
        self.run = run
        self.gpu = gpu
        # a job ddptop did not launch (watched by pid): never stopped or relaunched
        self.control_refused: str | None = (
            f"ddptop did not start this job ({run} on {self.node if node else host}) and will not stop or "
            f"relaunch it; to stop it, send SIGINT to its torchrun on the node yourself" if run.startswith("pid:") else None)
        self.versions: dict[str, str] = {}  # the node's python/torch/NCCL, from the agent's hello
        # our clock minus the node's (measured at each hello, the link's delay included), added to the
        # times of the node's events when over SKEW_MIN, so that ages and the cross-node stall
        # detector compare like with like
        self.skew = 0.0
        self.attach_exit_code: int | None = None  # from the agent, for a job ddptop did not launch
        self.ssh = list(ssh) if ssh else shlex.split(os.environ.get("DDPTOP_SSH", "ssh"))
        self.remote_cmd = remote_cmd or os.environ.get("DDPTOP_REMOTE", "ddptop")
        self.clock = clock
        self.backoff = backoff
        self.silence = silence
        self.meta = None
        self.run_dir = f"{host}:{run}"
        self.cursor: dict[str, int] = {}
        self.finished = False
        self.error: str | None = None  # why the attachment failed for good
        self.link = "connecting"
        self.connects = 0
        self.stop_requested = False
        self._final: StateEvent | None = None
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._pending_cmds: list[dict] = []
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"attach-{host}")
        self._thread.start()

    # -- Session interface ---------------------------------------------------

    @property
    def attach_hint(self) -> str:
        return f"ddptop attach {self.host}:{self.run}"

    @property
    def is_live(self) -> bool:
        return not self.finished and self.error is None

    @property
    def exit_code(self) -> int | None:
        return self._final.exit_code if self._final else None

    @property
    def final_state(self) -> StateEvent | None:
        return self._final

    def poll(self) -> list[Event]:
        out: list[Event] = []
        while True:
            try:
                batch = self._q.get_nowait()
            except queue.Empty:
                break
            if batch is None:
                self.finished = True
                if self._final is not None:
                    out.append(self._final)  # the job's final state is the stream's last event
                break
            for ev in batch:
                if isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
                    self._final = ev
                else:
                    out.append(ev)
        return out

    def stop(self) -> bool:
        if self.control_refused:
            return False
        self.stop_requested = True
        return self._command({"cmd": "stop"})

    def relaunch(self, profiles: list[str], reason: str = "asked for") -> bool:
        if self.control_refused:
            return False
        return self._command({"cmd": "relaunch", "profiles": list(profiles), "reason": reason})

    def dump_stacks(self) -> bool:
        return self._command({"cmd": "stacks"})

    def close(self) -> None:
        """Detach: end the link (the remote job is not touched)."""
        self._closed.set()
        self._kill()

    # -- the link --------------------------------------------------------------

    def _command(self, cmd: dict) -> bool:
        with self._lock:
            proc = self._proc
            if proc is None or self.link != "up":
                self._pending_cmds.append(cmd)  # sent as soon as the link is back
                return self.error is None and not self.finished
            try:
                proc.stdin.write((json.dumps(cmd) + "\n").encode())
                proc.stdin.flush()
                return True
            except OSError:
                self._pending_cmds.append(cmd)
                return True

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
        remote = [*shlex.split(self.remote_cmd), "agent", "--run", self.run]
        if self.run.startswith("pid:") and self.gpu:
            remote += ["--gpu", self.gpu]  # the agent samples a job ddptop did not launch itself
        if self.cursor:
            remote += ["--resume", encode_cursor(self.cursor)]
        return [*self.ssh, *SSH_OPTIONS, self.host, shlex.join(remote)]

    def _run(self) -> None:
        failures = 0
        self._set_link("connecting", f"ssh {self.host}")
        while not self._closed.is_set():
            try:
                proc = subprocess.Popen(self._argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True)
            except OSError as e:
                return self._fail(f"cannot run {self.ssh[0]!r}: {e}")
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
                self._q.put(None)
                return
            if outcome == "fatal":
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
            self._set_link("connecting", f"ssh {self.host} (try {failures + 1})")

    def _fail(self, message: str) -> None:
        self.error = message
        self._set_link("failed", message)
        now = self.clock()
        if self._final is None:
            self._emit([StateEvent(now, LOST, None, message, node=self.node)])
        self._q.put(None)

    def _pump(self, proc: subprocess.Popen) -> tuple[str, str]:
        """Read one connection to its end: ('bye'|'fatal'|'hello'|'lost', message)."""
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
                    self.meta = _meta(d.get("meta"))
                    if isinstance(d.get("versions"), dict):
                        self.versions = {str(k): str(v) for k, v in d["versions"].items()}
                    self._measure_skew(d.get("t"))
                    if d.get("run"):
                        self.run = d["run"]  # pin the run: a reconnect must not jump to a newer one
                        self.run_dir = f"{self.host}:{d.get('run_dir', d['run'])}"
                    self._set_link("up", f"{d.get('host', self.host)}, ddptop {d.get('ddptop')}, run {d.get('run')}")
                    self._flush_commands(proc)
                    continue
                try:
                    d = json.loads(raw)
                    kind = d["kind"]
                except (ValueError, KeyError, TypeError) as e:
                    pending.append(NoteEvent(self.clock(), "warning", f"{self.host}: agent line {n} unreadable "
                                             f"({type(e).__name__}: {e}): {raw[:120].decode('utf-8', 'replace')!r}",
                                             node=self.node))
                    continue
                if kind == "cursor":
                    files = d.get("files")
                    if isinstance(files, dict):
                        self.cursor = files
                    if pending:
                        self._emit(pending)
                        pending = []
                elif kind == "bye":
                    if isinstance(d.get("attach_exit_code"), int):
                        self.attach_exit_code = d["attach_exit_code"]  # a job ddptop did not launch
                    self._set_link("closed", "the job has ended")  # before the batch: its final state comes last
                    if pending:
                        self._emit(pending)
                    return "bye", ""
                elif kind == "error":
                    return "fatal", str(d.get("message", "the agent reported an error"))
                elif kind == "reply":
                    level = "info" if d.get("ok") else "warning"
                    self._emit([NoteEvent(self.clock(), level, f"{self.host}: {d.get('cmd')}: {d.get('message')}",
                                          node=self.node)])
                elif kind in CONTROL:
                    continue
                else:
                    try:
                        pending.append(_event(d, self.node, self.skew))
                    except (ValueError, TypeError, KeyError) as e:
                        pending.append(NoteEvent(self.clock(), "warning",
                                                 f"{self.host}: agent line {n}: bad {kind!r} event ({e})",
                                                 node=self.node))
        # the connection ended without a bye; a trailing partial line and an
        # uncommitted batch are dropped: the next connection resumes before them
        rc = proc.wait()
        err = proc.stderr.read().decode("utf-8", "replace").strip() if proc.stderr else ""
        if got_hello:
            return "hello", _last_line(err) or f"link lost (ssh exit {rc})"
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
        try:
            d = json.loads(raw)
            return (d.get("kind") if isinstance(d, dict) else None), d
        except ValueError:
            return None, {}

    def _check_hello(self, d: dict) -> str | None:
        if d.get("proto") != PROTO_NAME:
            return f"{self.host}: the remote command did not speak the ddptop agent protocol"
        if d.get("version") != PROTOCOL:
            return (f"{self.host} runs ddptop {d.get('ddptop')} (agent protocol {d.get('version')}), this is ddptop "
                    f"{__version__} (protocol {PROTOCOL}): install the same version there: {install_hint()}")
        return None

    def _classify_failure(self, rc: int, err: str, before_hello: list[str]) -> tuple[str, str]:
        what = _last_line(err) or (before_hello[-1] if before_hello else "")
        cmd0 = shlex.split(self.remote_cmd)[0]
        if rc == 127 or "command not found" in err or (f"{cmd0}: No such file" in err) or "No module named ddptop" in err:
            return "fatal", (f"ddptop is not installed on {self.host} (`{self.remote_cmd}` was not found by a "
                             f"non-interactive ssh shell: {what}). Install it there: {install_hint()} "
                             f"-- or name it with --remote-ddptop '/path/to/venv/bin/ddptop'")
        if "invalid choice" in err or "unknown command 'agent'" in err:
            return "fatal", (f"the ddptop on {self.host} is too old for `ddptop agent` ({what}). "
                             f"Install this version there: {install_hint()}")
        if rc == 255 and any(s in err for s in _SSH_FATAL):
            return "fatal", f"ssh {self.host}: {what} (check that `ssh {self.host} true` works without a prompt)"
        return "lost", what or f"ssh exited with {rc}"

    def _flush_commands(self, proc) -> None:
        with self._lock:
            cmds, self._pending_cmds = self._pending_cmds, []
        for c in cmds:
            try:
                proc.stdin.write((json.dumps(c) + "\n").encode())
                proc.stdin.flush()
            except OSError:
                with self._lock:
                    self._pending_cmds.append(c)


def _last_line(s: str) -> str:
    lines = [l for l in s.splitlines() if l.strip()]
    return lines[-1].strip() if lines else ""


def _meta(d):
    if not isinstance(d, dict):
        return None
    try:
        return journal.Meta.from_dict(d)
    except Exception:
        return None


class MultiSession:
    """Several nodes' sessions as one: merged events, a cross-node stall
    detector (the odd rank out may be on another machine), commands to all."""

    def __init__(self, sessions: list, clock=time.time, stall_after: float | None = None):
        self.sessions = sessions
        self.clock = clock
        self.stall_after = stall_after
        self._generation = 0
        self._last_check = 0.0
        self.analyzer = self._new_analyzer()
        self.stop_requested = False
        self._final: StateEvent | None = None
        self.finished = False
        self._seen: dict[str, dict[str, set]] = {}  # what -> node -> values (NCCL version, transports)
        self._said: set = set()
        self._rank_node: dict[tuple, str] = {}  # (launch, attempt, rank) -> the node that first reported it
        self._clashes: set[int] = set()

    def _new_analyzer(self):
        from ddptop.core.analyzer import Analyzer

        return Analyzer(self.clock, stall_after=self.stall_after, node="all nodes")

    @property
    def meta(self):
        return next((s.meta for s in self.sessions if s.meta is not None), None)

    @property
    def run_dir(self) -> str:
        return " ".join(str(s.run_dir) for s in self.sessions)

    @property
    def control_refused(self) -> str | None:
        """Set when no node's job was started by ddptop (nothing to stop or relaunch)."""
        why = [getattr(s, "control_refused", None) for s in self.sessions]
        return "; ".join(why) if why and all(why) else None

    @property
    def attach_hint(self) -> str:
        return "ddptop attach " + " ".join(f"{s.host}:{s.run}" for s in self.sessions)

    @property
    def error(self) -> str | None:
        errs = [s.error for s in self.sessions if getattr(s, "error", None)]
        return "; ".join(errs) if errs else None

    @property
    def is_live(self) -> bool:
        return any(s.is_live for s in self.sessions)

    def poll(self) -> list[Event]:
        out: list[Event] = []
        finals = []
        for s in self.sessions:
            batch = s.poll()
            for ev in batch:
                if isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
                    finals.append(ev)  # per node; the job's final state comes once all have ended
                    out.append(NoteEvent(ev.t, "info" if ev.exit_code == 0 else "warning",
                                         f"{ev.node}: job {ev.state}" + (f", exit code {ev.exit_code}"
                                                                         if ev.exit_code is not None else "")
                                         + (f" ({ev.message})" if ev.message else ""), node=ev.node))
                else:
                    out.append(ev)
        out += self._node_differences(out)
        for ev in list(out):
            if ev.kind == "rank" and ev.alive:
                # torchrun may give ranks to other nodes on a restart: compare within one attempt
                first = self._rank_node.setdefault((self._generation, ev.attempt, ev.rank), ev.node)
                if first != ev.node and ev.rank not in self._clashes:
                    self._clashes.add(ev.rank)
                    out.append(NoteEvent(ev.t, "warning", (
                        f"rank {ev.rank} is reported by both {first} and {ev.node}: these nodes run separate jobs "
                        "(or torchrun's --node-rank is the same on both); ranks are shown by number, so their "
                        "lines and the stall detector mix them. Attach to one node at a time.")))
            if ev.kind == "launch" and ev.generation > self._generation:
                self._generation = ev.generation  # a relaunch: judge the new attempt afresh
                self.analyzer = self._new_analyzer()
        alarms = [a for a in self.analyzer.feed(out) if a.type == "stall"]
        now = self.clock()
        if now - self._last_check >= 0.5:
            self._last_check = now
            alarms += self.analyzer.check(now)
        out.extend(alarms)
        if not self.finished and all(s.finished for s in self.sessions):
            finals = [s.final_state for s in self.sessions if s.final_state is not None]
            bad = [f for f in finals if f.exit_code != 0]
            f = bad[0] if bad else (finals[0] if finals else None)
            nodes = ", ".join(f"{s.node}: {s.final_state.state if s.final_state else 'unknown'}" for s in self.sessions)
            self._final = StateEvent(self.clock(), f.state if f else LOST, f.exit_code if f else None, nodes)
            out.append(self._final)
            self.finished = True
        return out

    @property
    def exit_code(self) -> int | None:
        return self._final.exit_code if self._final else None

    @property
    def final_state(self) -> StateEvent | None:
        return self._final

    def stop(self) -> bool:
        self.stop_requested = True
        return any([s.stop() for s in self.sessions])

    def relaunch(self, profiles: list[str], reason: str = "asked for") -> bool:
        return all([s.relaunch(profiles, reason) for s in self.sessions])

    def dump_stacks(self) -> bool:
        return any([s.dump_stacks() for s in self.sessions])

    def _node_differences(self, events: list[Event]) -> list[Event]:
        """Nodes of one job that run different software or NCCL transports: a
        finding (one note per difference), from the agents' hellos and from
        NCCL's INFO lines (the nccl-debug profile)."""
        seen = self._seen
        for s in self.sessions:
            for what, v in getattr(s, "versions", {}).items():
                if what in ("torch", "nccl"):
                    seen.setdefault(what, {}).setdefault(s.node, set()).add(v)
        for ev in events:
            if ev.kind != "log" or "NCCL" not in ev.text:
                continue
            m = _NCCL_VERSION.search(ev.text)
            if m:
                seen.setdefault("NCCL (from its log)", {}).setdefault(ev.node, set()).add(m.group(1))
            m = _NCCL_VIA.search(ev.text)
            if m:
                seen.setdefault("NCCL transport", {}).setdefault(ev.node, set()).add(m.group(1))
        out: list[Event] = []
        for what, per_node in seen.items():
            if len(per_node) < 2:
                continue
            if what == "NCCL transport":
                # between nodes: InfiniBand on one, sockets on another
                per_node = {n: {v for v in vs if v.startswith("NET/")} for n, vs in per_node.items()}
                per_node = {n: v for n, v in per_node.items() if v}
                if len(per_node) < 2:
                    continue
            if len({frozenset(v) for v in per_node.values()}) < 2:
                continue
            key = (what, tuple(sorted((n, tuple(sorted(v))) for n, v in per_node.items())))
            if key in self._said:
                continue
            self._said.add(key)
            desc = "; ".join(f"{n}: {', '.join(sorted(v))}" for n, v in sorted(per_node.items()))
            hint = (" (InfiniBand on some nodes, sockets on others: check NCCL_IB_* and the IB devices)"
                    if what == "NCCL transport" else " (one job should run the same versions on every node)")
            out.append(NoteEvent(self.clock(), "warning", f"nodes differ in {what}: {desc}{hint}"))
        return out

    def close(self) -> None:
        for s in self.sessions:
            s.close()
