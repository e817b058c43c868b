"""NCCL RAS: NCCL's own view of a job, asked over its local TCP port.

Since NCCL 2.24 every NCCL process runs a RAS thread listening on
``NCCL_RAS_ADDR`` (default ``localhost:28028``; off with
``NCCL_RAS_ENABLE=0``).  Any one process answers for the whole job: per
communicator, each rank's host, pid and GPU, how many collectives of each
kind it has launched, and which ranks are missing, unresponsive or dead.
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

This module asks (``query``), reads both formats (``parse_json``,
``parse_text``; NCCL 2.28.x's JSON lacks a comma in ``missing_ranks``,
which is repaired), and says who is behind (``verdict``): the ranks that
launched fewer operations of a kind than the rest, or that are missing or
dead, mapped to global ranks by host and pid.  No torch, no NCCL: plain
sockets, and pure parsing that the tests drive with answers laid out as NCCL
lays them out.
"""

from __future__ import annotations

import json
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

from ddptop.core.versions import version_tuple

DEFAULT_ADDR = "localhost:28028"
PROTOCOL = 2
KINDS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
MAX_ANSWER = 16 * 1024 * 1024  # a report larger than this is cut (thousands of ranks fit well under it)


class RasError(Exception):
    """No answer from NCCL RAS: refused, timed out, or not a RAS server."""


@dataclass
class RasRank:
    rank: int  # the rank in its communicator
    host: str = ""  # an IP address (RAS does no DNS)
    pid: int = -1
    gpu: str = ""
    counts: dict[str, int] = field(default_factory=dict)  # collective kind -> operations launched
    missing: bool = False  # no data from it
    unresponsive: bool = False
    dead: bool = False
    error: str = ""  # an initialisation or asynchronous error it reported
    status: str = ""  # RUNNING, INIT, FINALIZE, ABORT; NOCOMM (answered, without the communicator)
    grouped: set[str] = field(default_factory=set)  # text: kinds whose count came from a group's line


@dataclass
class RasComm:
    hash: str  # normalised: lower-case hex without 0x or leading zeros
    size: int = 0
    ranks: list[RasRank] = field(default_factory=list)  # those that answered (JSON: every one; text: the outliers)
    missing: list[RasRank] = field(default_factory=list)
    # text reports give large groups as counts only: kind -> [(ranks in the group, operations launched)]
    groups: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    status_groups: dict[str, int] = field(default_factory=dict)  # text: status -> ranks a group line counts


@dataclass
class RasStatus:
    format: str  # "json" or "text"
    version: str = ""  # the NCCL version, when the answer says it
    comms: list[RasComm] = field(default_factory=list)
    dead_processes: list[tuple[str, int]] = field(default_factory=list)  # (host, pid)
    # (host, pid) of the job's processes that did not answer this query (text: "INCOMPLETE")
    silent_processes: list[tuple[str, int]] = field(default_factory=list)
    partial: bool = False  # the report did not end in time: what came is read
    unreliable: str = ""  # why this answer may be wrong (a known bug of this NCCL version)
    timeouts: int = 0  # RAS's own timeouts while it gathered the data
    raw: str = ""
    took: float = 0.0  # seconds the query took


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


def parse(raw: str, fmt: str) -> RasStatus:
    st: RasStatus | None = None
    if fmt == "json":
        try:
            st = parse_json(raw)
        except ValueError:
            pass  # a server that said OK to the format but wrote text after all
    if st is None:
        st = parse_text(raw)
    v = version_tuple(st.version)
    if (st.format == "text" and (2, 26) <= v < (2, 29, 2) and len(st.comms) > 1
            and any(c.missing for c in st.comms)):
        # rasClientRunComms stepped over missing ranks wrongly when it walked the communicators
        # (fixed in 2.29.2, NVIDIA/nccl#1762): the communicators after one with missing ranks may be garbage
        st.unreliable = f"NCCL {st.version} may garble this report when ranks are missing (fixed in 2.29.2)"
    return st




# -- JSON (2.28.7+) ---------------------------------------------------------------

# NCCL 2.28.x (2.28.9 at least) leaves out the comma after "nvml_dev": N in missing_ranks entries:
# a value at the end of a line followed by a line that starts a new key
_MISSING_COMMA = re.compile(r'([\d"el}\]])(\s*\n\s*)("[^"\n]*"\s*:)')


# ncclResult_t, as NCCL's ncclErrorToString words them
_RESULTS = {1: "Unhandled CUDA error", 2: "System error", 3: "Internal error", 4: "Invalid argument",
            5: "Invalid usage", 6: "Remote process error", 8: "Timeout"}


def _hash(h: object) -> str:
    s = str(h or "").strip().lower()
    s = s.split(":")[0].removeprefix("0x").lstrip("0")
    return s or "0"


def _int(v: object, default: int = -1) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def parse_json(raw: str) -> RasStatus:
    try:
        d = json.loads(raw)
    except ValueError:
        d = json.loads(_MISSING_COMMA.sub(r"\1,\2\3", raw))  # ValueError again: not JSON at all
    if not isinstance(d, dict):
        raise ValueError("RAS JSON is not an object")
    st = RasStatus("json", version=str(d.get("nccl_version") or ""), raw=raw)
    ras = d.get("ras")
    if isinstance(ras, dict):
        st.timeouts = _int(ras.get("timeouts_count"), 0)
    for c in d.get("communicators") or []:
        if not isinstance(c, dict):
            continue
        comm = RasComm(_hash(c.get("hash")), size=_int(c.get("size"), 0))
        for r in c.get("ranks") or []:
            if not isinstance(r, dict):
                continue
            counts = r.get("collective_counts") if isinstance(r.get("collective_counts"), dict) else {}
            status = r.get("status") if isinstance(r.get("status"), dict) else {}
            err = ""
            for key, what in (("init_state", "initialisation"), ("async_error", "asynchronous")):
                code = _int(status.get(key), 0)
                if code not in (0, 7) and not err:  # (7: in progress)
                    err = f"{_RESULTS.get(code, 'Unexpected error')} ({what} error)"
            # (as NCCL's own report derives a rank's status from the flags)
            state = ("ABORT" if status.get("abort_flag") is True else
                     "FINALIZE" if status.get("finalize_called") is True or status.get("destroy_flag") is True else
                     "RUNNING" if _int(status.get("init_state"), 0) == 0 else "INIT")
            comm.ranks.append(RasRank(_int(r.get("rank")), str(r.get("host") or ""), _int(r.get("pid")),
                                      str(r.get("cuda_dev", "")),
                                      {str(k): _int(v, 0) for k, v in counts.items()}, error=err, status=state))
        for r in c.get("missing_ranks") or []:
            if not isinstance(r, dict):
                continue
            status = r.get("status") if isinstance(r.get("status"), dict) else {}
            # unresponsive false: its process answered, without this communicator (NOCOMM)
            unresponsive = status.get("unresponsive") is not False
            comm.missing.append(RasRank(_int(r.get("rank")), str(r.get("host") or ""), _int(r.get("pid")),
                                        str(r.get("cuda_dev", "")), missing=True, unresponsive=unresponsive,
                                        dead=bool(status.get("considered_dead")),
                                        status="" if unresponsive else "NOCOMM"))
        st.comms.append(comm)
    return st


# -- text (2.24+) -----------------------------------------------------------------
#
# The layout of NCCL's src/ras/client_support.cc (rasClientRunComms,
# rasClientBreakDownErrors).  Within a communicator's MISMATCH or ERROR
# section, ranks that share a value come as a group line ("6 ranks have
# launched up to operation 4412", "2 ranks have status ABORT", "2 ranks
# reported Remote process error"), followed, when the group is an outlier, by
# one "Rank N -- GPU ... managed by process P on node H" line per member; a
# group of one is a single line that says both ("Rank N has launched up to
# operation X -- ..."). A rank whose process RAS cannot name says
# "[process information not found]" instead of its GPU, process and node.

_VERSION = re.compile(r"^[NR]CCL version (\S+)", re.M)
_COMM_HEAD = re.compile(r"^#\d+-\d+ \(([0-9a-fA-F]+)\) (INCOMPLETE|ERROR|MISMATCH)\s*$")
_WHO = (r"(?:GPU (?P<gpu>[^\n]*?) managed by process (?P<pid>\d+) on node (?P<host>\S+)"
        r"|\[process information not found\])")
_MEMBER = re.compile(r"^\s+Rank (?P<rank>\d+) -- " + _WHO + r"\s*$")
_OLD_MISSING = re.compile(r"^\s+The missing ranks?: (?P<ranks>[\d, ]+)\s*$")
_KIND_DIFF = re.compile(r"^\s+Communicator ranks have different (?P<kind>\w+) operation counts\s*$")
_STATUS_DIFF = re.compile(r"^\s+Communicator ranks have different status\s*$")
_MANY_UP_TO = re.compile(r"^\s+(?P<n>\d+) ranks have launched up to operation (?P<op>\d+)\s*$")
_MANY_NONE = re.compile(r"^\s+(?P<n>\d+) ranks have not launched any operations\s*$")
_MANY_STATUS = re.compile(r"^\s+(?P<n>\d+) ranks have status (?P<status>[A-Z]+)\s*$")
_MANY_ERROR = re.compile(r"^\s+(?P<n>\d+) ranks reported (?P<err>.+?)\s*$")
_ONE_UP_TO = re.compile(r"^\s+Rank (?P<rank>\d+) has launched up to operation (?P<op>\d+) -- " + _WHO + r"\s*$")
_ONE_NONE = re.compile(r"^\s+Rank (?P<rank>\d+) has not launched any operations -- " + _WHO + r"\s*$")
_ONE_STATUS = re.compile(r"^\s+Rank (?P<rank>\d+) has status (?P<status>[A-Z]+) -- " + _WHO + r"\s*$")
_ONE_ERROR = re.compile(r"^\s+Rank (?P<rank>\d+) reported (?P<err>.+?) -- " + _WHO + r"\s*$")
_ERRORS_OF = re.compile(r"^\s+(?P<what>Initialization|Asynchronous) errors? on \d+ ranks?\s*$")
_PROCESS = re.compile(r"^\s+Process (?P<pid>\d+) on node (?P<host>\S+) managing GPUs? (?P<gpu>.*?)\s*$")
_TABLE_ROW = re.compile(r"^\s*\d+\s+\d+\s+\d+\s+[\d-]+\s+(?P<size>\d+)\s+\d+\s+(?P<status>[A-Z]+)\s+(?P<err>[A-Z,]+)\s*$")
_TIMEOUTS = re.compile(r"Encountered (\d+) communication timeouts?")


def parse_text(raw: str) -> RasStatus:
    st = RasStatus("text", raw=raw)
    m = _VERSION.search(raw)
    if m:
        st.version = m.group(1)
    m = _TIMEOUTS.search(raw)
    if m:
        st.timeouts = int(m.group(1))
    comms: dict[str, RasComm] = {}
    comm: RasComm | None = None
    section = ""  # INCOMPLETE, ERROR, MISMATCH; DEAD, INCOMPLETE (the job's processes) with no comm
    kind = ""  # the collective kind whose counts differ ("status": the ranks' status differs)
    group: tuple[str, object] | None = None  # what the "N ranks ..." line before says of its members
    errors_of = ""  # "initialisation" or "asynchronous" (the ERROR section's part)
    for line in raw.splitlines():
        if not line.strip():
            continue
        t = _TABLE_ROW.match(line)
        if t and comm is None:
            continue
        h = _COMM_HEAD.match(line)
        if h:
            key = _hash(h.group(1))
            comm = comms.setdefault(key, RasComm(key))
            section, kind, group, errors_of = h.group(2), "", None, ""
            continue
        if line.strip() in ("INCOMPLETE", "DEAD", "TIMEOUT", "Errors", "Warnings") and not line.startswith(" "):
            comm, section, kind, group = None, line.strip(), "", None
            continue
        if comm is None:
            p = _PROCESS.match(line)
            if p and section == "DEAD":
                st.dead_processes.append((p.group("host"), int(p.group("pid"))))
            elif p and section == "INCOMPLETE":
                st.silent_processes.append((p.group("host"), int(p.group("pid"))))
            continue
        if section == "INCOMPLETE":
            r = _MEMBER.match(line)
            if r:
                rr = _rank_of(r, missing=True)
                rr.unresponsive = True  # (listed here: its process did not answer)
                comm.missing.append(rr)
                continue
            o = _OLD_MISSING.match(line)
            if o:
                comm.missing += [RasRank(int(x), missing=True, unresponsive=True)
                                 for x in re.findall(r"\d+", o.group("ranks"))]
            continue
        if section == "ERROR":
            e = _ERRORS_OF.match(line)
            if e:
                errors_of, group = ("initialisation" if e.group("what") == "Initialization" else "asynchronous"), None
                continue
            one = _ONE_ERROR.match(line)
            if one:
                _merge(comm, one).error = f"{one.group('err')} ({errors_of or 'an'} error)"
                group = None
                continue
            many = _MANY_ERROR.match(line)
            if many:
                group = ("error", many.group("err"))
                continue
            r = _MEMBER.match(line)
            if r and group is not None and group[0] == "error":
                _merge(comm, r).error = f"{group[1]} ({errors_of or 'an'} error)"
            continue
        # MISMATCH: the status, then the operation counts of each kind that differ
        if _STATUS_DIFF.match(line):
            kind, group = "status", None
            continue
        k = _KIND_DIFF.match(line)
        if k:
            kind, group = k.group("kind"), None
            continue
        if kind == "status":
            one = _ONE_STATUS.match(line)
            if one:
                _set_status(comm, one, one.group("status"))
                group = None
                continue
            many = _MANY_STATUS.match(line)
            if many:
                group = ("status", many.group("status"))
                comm.status_groups[many.group("status")] = int(many.group("n"))
                continue
            r = _MEMBER.match(line)
            if r and group is not None:
                _set_status(comm, r, str(group[1]), grouped=True)
            continue
        if not kind:
            continue
        many = _MANY_UP_TO.match(line) or _MANY_NONE.match(line)
        if many:
            op = int(many.group("op")) if "op" in many.groupdict() else 0
            comm.groups.setdefault(kind, []).append((int(many.group("n")), op))
            group = ("count", op)
            continue
        one = _ONE_UP_TO.match(line) or _ONE_NONE.match(line)
        if one:
            _merge(comm, one).counts[kind] = int(one.group("op")) if "op" in one.groupdict() else 0
            group = None
            continue
        r = _MEMBER.match(line)
        if r and group is not None and group[0] == "count":
            rr = _merge(comm, r)
            rr.counts[kind] = int(group[1])  # type: ignore[call-overload]
            rr.grouped.add(kind)  # (already counted in its group's line)
    st.comms = list(comms.values())
    return st


def _rank_of(m: re.Match, missing: bool = False) -> RasRank:
    g = m.groupdict()
    return RasRank(int(g["rank"]), g.get("host") or "", int(g["pid"]) if g.get("pid") else -1,
                   (g.get("gpu") or "").strip(), missing=missing)


def _merge(comm: RasComm, m: re.Match) -> RasRank:
    """The rank a line names, the one already seen in this communicator if any."""
    new = _rank_of(m)
    old = next((r for r in comm.ranks if r.rank == new.rank), None)
    if old is None:
        comm.ranks.append(new)
        return new
    if old.pid < 0 and new.pid >= 0:
        old.host, old.pid, old.gpu = new.host, new.pid, new.gpu
    return old


def _set_status(comm: RasComm, m: re.Match, status: str, grouped: bool = False) -> None:
    if status == "UNKNOWN":  # (2.24/2.25: the missing ranks, said in INCOMPLETE)
        return
    if status == "NOCOMM":  # its process answered, without this communicator: NCCL lists it as missing
        r = _rank_of(m, missing=True)
        r.status = status
        if not any(x.rank == r.rank for x in comm.missing):
            comm.missing.append(r)
        return
    r = _merge(comm, m)
    r.status = status
    if grouped:
        r.grouped.add("status")


# -- pushed events (MONITOR, 2.29+) ------------------------------------------------

_MONITOR_LINE = re.compile(r"^\[(?P<time>[^\]]*)\] (?P<event>[A-Z_]+): (?P<rest>.*?)\s*$")
_PEER = re.compile(r"Process (?P<pid>\d+) on node (?P<host>\S+) managing GPUs? (?P<gpu>\S+(?: \(NVML [\d,]+\))?)")


@dataclass
class PeerEvent:
    """One event NCCL's RAS pushes to a ``MONITOR`` client: ``PEER_DEAD``,
    ``PEER_NEW`` (lifecycle), ``PEER_UNRESPONSIVE`` and others (trace)."""

    event: str
    host: str = ""
    pid: int = -1
    details: str = ""
    line: str = ""


def parse_monitor_line(line: str) -> PeerEvent | None:
    """``[2025-12-19 13:07:07] PEER_DEAD: Process 1524345 on node 10.0.0.2 managing GPU 1``
    (NCCL's text format; a peer it cannot name is its bare address)."""
    m = _MONITOR_LINE.match(line.strip("\r\n"))
    if not m:
        return None
    rest = m.group("rest")
    p = _PEER.search(rest)
    if p:
        return PeerEvent(m.group("event"), p.group("host"), int(p.group("pid")), rest[p.end():].strip(), line)
    return PeerEvent(m.group("event"), details=rest, line=line)


class MonitorUnsupported(RasError):
    """The server has no MONITOR (NCCL before 2.29)."""


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


def job_pids(st: RasStatus) -> set[int]:
    """Every pid the answer names (to check that an answer on a shared,
    default port is about this job)."""
    pids = {r.pid for c in st.comms for r in [*c.ranks, *c.missing] if r.pid >= 0}
    return pids | {pid for _h, pid in st.dead_processes} | {pid for _h, pid in st.silent_processes}
