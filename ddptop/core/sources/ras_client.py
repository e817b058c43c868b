"""The RAS client: NCCL's local TCP port asked for a status report
(``query``), or followed for its pushed events (``monitor``).  Plain
sockets; the answers are read by ``ddptop.core.sources.ras_parse``.

The protocol is text lines:

* ``CLIENT PROTOCOL 2`` -> ``SERVER PROTOCOL 2`` (optional handshake);
* ``TIMEOUT <s>`` -> ``OK`` (whole seconds only before 2.31, so ddptop
  sends an integer);
* ``SET FORMAT json`` -> ``OK`` (2.28.7+; older servers answer ``ERROR``
  and ddptop reads the text report instead);
* ``VERBOSE STATUS``: the report, then the server closes the connection
  (there is no end marker: read to EOF);
* ``MONITOR lifecycle`` -> ``OK``, then pushed events such as ``PEER_DEAD``
  (2.29+).
"""

from __future__ import annotations

import re
import socket
import time
from typing import Callable

from ddptop.core.model.ras_types import (
    MonitorUnsupported,
    PeerEvent,
    RasError,
    RasStatus,
)
from ddptop.core.sources.ras_parse import parse, parse_monitor_line

DEFAULT_ADDR = "localhost:28028"
PROTOCOL = 2
MAX_ANSWER = 16 * 1024 * 1024  # a report larger than this is cut (thousands of ranks fit well under it)


# -- the address ----------------------------------------------------------------


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` as NCCL reads NCCL_RAS_ADDR."""
    addr = addr.strip()
    m = re.fullmatch(r"\[([^\]]+)\]:(\d+)", addr) or re.fullmatch(r"([^:\s]+):(\d+)", addr)
    if not m:
        raise ValueError(f"NCCL_RAS_ADDR {addr!r} is not host:port")
    port = int(m.group(2))
    if not 0 < port < 65536:
        raise ValueError(f"NCCL_RAS_ADDR {addr!r}: port out of range")
    return m.group(1), port


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (for one launch's NCCL_RAS_ADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# -- asking ---------------------------------------------------------------------


class _Conn:
    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = b""

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RasError("no answer in time")
        return left

    def send(self, line: str) -> None:
        self.sock.settimeout(self._left())
        self.sock.sendall(line.encode() + b"\n")

    def line(self) -> str:
        while b"\n" not in self.buf:
            self.sock.settimeout(self._left())
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RasError("the connection closed before a reply")
            self.buf += chunk
            if len(self.buf) > 65536:
                raise RasError("not a RAS server (a reply line without an end)")
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode("utf-8", "replace").rstrip("\r")

    def rest(self) -> tuple[str, bool]:
        """Everything until the server closes the connection, and whether it
        did (False: the deadline came first, and this is what had come)."""
        chunks = [self.buf]
        size = len(self.buf)
        self.buf = b""
        done = True
        while True:
            try:
                self.sock.settimeout(self._left())
                chunk = self.sock.recv(1 << 16)
            except (RasError, socket.timeout):
                done = False
                break
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ANSWER:
                break
        return b"".join(chunks).decode("utf-8", "replace"), done


# seconds NCCL may wait beyond the TIMEOUT it was given, for peers that do not
# answer (RAS_COLLECTIVE_EXTRA_TIMEOUT at NCCL_RAS_TIMEOUT_FACTOR 1; ncclras
# itself waits 1 + TIMEOUT + this)
NCCL_EXTRA_WAIT = 5


def query(addr: str, *, timeout: float = 9.0, json_format: bool = True, verbose: bool = True) -> RasStatus:
    """Ask the RAS server at ``addr`` for the job's status (``RasError`` when
    it cannot be had).  ``timeout`` bounds the whole query.  RAS's own
    gathering timeout (whole seconds) is set so that NCCL's worst case, that
    plus ``NCCL_EXTRA_WAIT`` for peers that do not answer, ends within it; a
    report cut by the deadline is read as far as it came (``partial``)."""
    host, port = parse_addr(addr)
    t0 = time.monotonic()
    deadline = t0 + timeout
    try:
        sock = socket.create_connection((host, port), timeout=min(timeout, 2.0))
    except OSError as e:
        raise RasError(f"{addr}: {e.strerror or e}") from None
    try:
        c = _Conn(sock, deadline)
        c.send(f"CLIENT PROTOCOL {PROTOCOL}")
        hello = c.line()
        if not hello.upper().startswith("SERVER PROTOCOL"):
            raise RasError(f"{addr} is not NCCL RAS (it answered {hello[:80]!r})")
        c.send(f"TIMEOUT {max(1, int(timeout - NCCL_EXTRA_WAIT - 1))}")  # integers only up to NCCL 2.29.x
        c.line()
        fmt = "text"
        if json_format:
            c.send("SET FORMAT json")
            if c.line().strip().upper() == "OK":
                fmt = "json"
        c.send("VERBOSE STATUS" if verbose else "STATUS")
        raw, done = c.rest()
    except OSError as e:
        raise RasError(f"{addr}: {e}") from None
    finally:
        sock.close()
    if not done and not raw.strip():
        raise RasError("the report did not come in time")
    st = parse(raw, fmt)
    st.partial = not done
    st.took = time.monotonic() - t0
    return st


# -- pushed events (MONITOR, 2.29+) ------------------------------------------------


def monitor(addr: str, on_event: Callable[[PeerEvent], None], stop: Callable[[], bool], *,
            groups: str = "lifecycle", connect_timeout: float = 2.0) -> None:
    """Follow RAS's pushed events until ``stop()`` or the server closes the
    connection (the job ended); ``MonitorUnsupported`` for a server without
    MONITOR, ``RasError`` when there is no server."""
    host, port = parse_addr(addr)
    try:
        sock = socket.create_connection((host, port), timeout=connect_timeout)
    except OSError as e:
        raise RasError(f"{addr}: {e.strerror or e}") from None
    try:
        c = _Conn(sock, time.monotonic() + 10)
        c.send(f"CLIENT PROTOCOL {PROTOCOL}")
        if not c.line().upper().startswith("SERVER PROTOCOL"):
            raise RasError(f"{addr} is not NCCL RAS")
        c.send(f"MONITOR {groups}")
        reply = c.line().strip()
        if reply.upper() != "OK":
            raise MonitorUnsupported(f"{addr}: no MONITOR here ({reply[:80]}): NCCL before 2.29")
        buf = c.buf  # (the OK and the first events may come in one read)
        sock.settimeout(0.5)
        while not stop():
            while b"\n" in buf:
                raw, _, buf = buf.partition(b"\n")
                ev = parse_monitor_line(raw.decode("utf-8", "replace"))
                if ev is not None:
                    on_event(ev)
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            if len(buf) > 1 << 20:
                buf = b""  # a line without an end: not an event stream
    finally:
        sock.close()
