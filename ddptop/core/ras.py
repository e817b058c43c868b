"""NCCL RAS: NCCL's own view of a job, asked over its local TCP port.

Since NCCL 2.24 every NCCL process runs a RAS thread listening on
``NCCL_RAS_ADDR`` (default ``localhost:28028``; off with
``NCCL_RAS_ENABLE=0``).  Any one process answers for the whole job: per
communicator, each rank's host, pid and GPU, how many collectives of each
kind it has launched, and which ranks are missing, unresponsive or dead.
The protocol is text lines:

* ``CLIENT PROTOCOL 2`` -> ``SERVER PROTOCOL 2`` (optional handshake);
* ``TIMEOUT <s>`` -> ``OK`` (whole seconds only up to 2.29.2, so ddptop
  sends an integer);
* ``SET FORMAT json`` -> ``OK`` (2.28.7+; older servers answer ``ERROR``
  and ddptop reads the text report instead);
* ``VERBOSE STATUS``: the report, then the server closes the connection
  (there is no end marker: read to EOF);
* ``MONITOR lifecycle`` -> ``OK``, then pushed events such as ``PEER_DEAD``
  (2.29+).

This module asks (``query``), reads both formats (``parse_json``,
``parse_text``; NCCL 2.28.9's JSON lacks a comma in ``missing_ranks``,
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
from typing import Callable, Iterable

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


@dataclass
class RasComm:
    hash: str  # normalised: lower-case hex without 0x or leading zeros
    size: int = 0
    ranks: list[RasRank] = field(default_factory=list)  # those that answered (JSON: every one; text: the outliers)
    missing: list[RasRank] = field(default_factory=list)
    # text reports give large groups as counts only: kind -> [(ranks in the group, operations launched)]
    groups: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    status: str = ""  # text: RUNNING, INIT, ... (JSON leaves it to the reader)


@dataclass
class RasStatus:
    format: str  # "json" or "text"
    version: str = ""  # the NCCL version, when the answer says it
    comms: list[RasComm] = field(default_factory=list)
    dead_processes: list[tuple[str, int]] = field(default_factory=list)  # (host, pid)
    timeouts: int = 0  # RAS's own timeouts while it gathered the data
    raw: str = ""
    took: float = 0.0  # seconds the query took


@dataclass
class RasVerdict:
    culprits: list[int]  # global ranks (or communicator ranks where the mapping is unknown)
    text: str  # one sentence for the alarm, "" when RAS sees nothing wrong
    behind: dict[int, str] = field(default_factory=dict)  # global rank -> what RAS says of it (rank table)


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

    def rest(self) -> str:
        """Everything until the server closes the connection."""
        chunks = [self.buf]
        size = len(self.buf)
        self.buf = b""
        while True:
            try:
                self.sock.settimeout(self._left())
                chunk = self.sock.recv(1 << 16)
            except RasError:
                raise RasError("the report did not end in time") from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ANSWER:
                break
        return b"".join(chunks).decode("utf-8", "replace")


def query(addr: str, *, timeout: float = 5.0, json_format: bool = True, verbose: bool = True) -> RasStatus:
    """Ask the RAS server at ``addr`` for the job's status (``RasError`` when
    it cannot be had).  ``timeout`` bounds the whole query; RAS's own
    gathering timeout is set a little below it, in whole seconds."""
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
        c.send(f"TIMEOUT {max(1, int(timeout) - 1)}")  # integers only up to NCCL 2.29.2
        c.line()
        fmt = "text"
        if json_format:
            c.send("SET FORMAT json")
            if c.line().strip().upper() == "OK":
                fmt = "json"
        c.send("VERBOSE STATUS" if verbose else "STATUS")
        raw = c.rest()
    except OSError as e:
        raise RasError(f"{addr}: {e}") from None
    finally:
        sock.close()
    st = parse(raw, fmt)
    st.took = time.monotonic() - t0
    return st


def parse(raw: str, fmt: str) -> RasStatus:
    if fmt == "json":
        try:
            return parse_json(raw)
        except ValueError:
            pass  # a server that said OK to the format but wrote text after all
    return parse_text(raw)


# -- JSON (2.28.7+) ---------------------------------------------------------------

# NCCL 2.28.9 leaves out the comma after "nvml_dev": N in missing_ranks entries:
# a value at the end of a line followed by a line that starts a new key
_MISSING_COMMA = re.compile(r'([\d"el}\]])(\s*\n\s*)("[^"\n]*"\s*:)')


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
            if _int(status.get("init_state"), 0) not in (0, 7):
                err = f"initialisation error {status.get('init_state')}"
            elif _int(status.get("async_error"), 0) not in (0, 7):
                err = f"asynchronous error {status.get('async_error')}"
            comm.ranks.append(RasRank(_int(r.get("rank")), str(r.get("host") or ""), _int(r.get("pid")),
                                      str(r.get("cuda_dev", "")),
                                      {str(k): _int(v, 0) for k, v in counts.items()}, error=err))
        for r in c.get("missing_ranks") or []:
            if not isinstance(r, dict):
                continue
            status = r.get("status") if isinstance(r.get("status"), dict) else {}
            comm.missing.append(RasRank(_int(r.get("rank")), str(r.get("host") or ""), _int(r.get("pid")),
                                        str(r.get("cuda_dev", "")), missing=True,
                                        unresponsive=bool(status.get("unresponsive")),
                                        dead=bool(status.get("considered_dead"))))
        st.comms.append(comm)
    return st


# -- text (2.24+) -----------------------------------------------------------------

_VERSION = re.compile(r"^[NR]CCL version (\S+)", re.M)
_COMM_HEAD = re.compile(r"^#\d+-\d+ \(([0-9a-fA-F]+)\) (INCOMPLETE|ERROR|MISMATCH)\s*$")
_WHO = r"GPU (?P<gpu>[^\n]*?) managed by process (?P<pid>\d+) on node (?P<host>\S+)"
_RANK_MISSING = re.compile(r"^\s+Rank (?P<rank>\d+) -- (?:" + _WHO + r"|\[process information not found\])\s*$")
_OLD_MISSING = re.compile(r"^\s+The missing ranks?: (?P<ranks>[\d, ]+)\s*$")
_KIND_DIFF = re.compile(r"^\s+Communicator ranks have different (?P<kind>\w+) operation counts\s*$")
_MANY_UP_TO = re.compile(r"^\s+(?P<n>\d+) ranks have launched up to operation (?P<op>\d+)\s*$")
_MANY_NONE = re.compile(r"^\s+(?P<n>\d+) ranks have not launched any operations\s*$")
_ONE_UP_TO = re.compile(r"^\s+Rank (?P<rank>\d+) has launched up to operation (?P<op>\d+) -- " + _WHO + r"\s*$")
_ONE_NONE = re.compile(r"^\s+Rank (?P<rank>\d+) has not launched any operations -- " + _WHO + r"\s*$")
_ONE_ERROR = re.compile(r"^\s+Rank (?P<rank>\d+) reported (?P<err>.+?) -- " + _WHO + r"\s*$")
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
    kind = ""
    section = ""  # INCOMPLETE, ERROR, MISMATCH, DEAD (the process lists)
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
            section, kind = h.group(2), ""
            continue
        if line.strip() in ("INCOMPLETE", "DEAD", "TIMEOUT") and not line.startswith(" "):
            comm, section, kind = None, line.strip(), ""
            continue
        if comm is None:
            p = _PROCESS.match(line)
            if p and section == "DEAD":
                st.dead_processes.append((p.group("host"), int(p.group("pid"))))
            continue
        if section == "INCOMPLETE":
            r = _RANK_MISSING.match(line)
            if r:
                comm.missing.append(_rank_of(r, missing=True))
                continue
            o = _OLD_MISSING.match(line)
            if o:
                comm.missing += [RasRank(int(x), missing=True) for x in re.findall(r"\d+", o.group("ranks"))]
            continue
        if section == "ERROR":
            r = _ONE_ERROR.match(line)
            if r:
                rr = _rank_of(r)
                rr.error = r.group("err")
                comm.ranks.append(rr)
            continue
        k = _KIND_DIFF.match(line)
        if k:
            kind = k.group("kind")
            continue
        if not kind:
            continue
        many = _MANY_UP_TO.match(line)
        if many:
            comm.groups.setdefault(kind, []).append((int(many.group("n")), int(many.group("op"))))
            continue
        none = _MANY_NONE.match(line)
        if none:
            comm.groups.setdefault(kind, []).append((int(none.group("n")), 0))
            continue
        one = _ONE_UP_TO.match(line) or _ONE_NONE.match(line)
        if one:
            rr = _find(comm, int(one.group("rank"))) or _add(comm, _rank_of(one))
            rr.counts[kind] = int(one.group("op")) if "op" in one.groupdict() and one.group("op") else 0
    st.comms = list(comms.values())
    return st


def _rank_of(m: re.Match, missing: bool = False) -> RasRank:
    g = m.groupdict()
    return RasRank(int(g["rank"]), g.get("host") or "", int(g["pid"]) if g.get("pid") else -1,
                   (g.get("gpu") or "").strip(), missing=missing)


def _find(comm: RasComm, rank: int) -> RasRank | None:
    return next((r for r in comm.ranks if r.rank == rank), None)


def _add(comm: RasComm, r: RasRank) -> RasRank:
    comm.ranks.append(r)
    return r


# -- who is behind ---------------------------------------------------------------


def _names(ranks: Iterable[int]) -> str:
    rs = sorted(set(ranks))
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def verdict(st: RasStatus, rank_of: Callable[[str, int], int | None] | None = None) -> RasVerdict:
    """Who RAS says is behind, in global ranks where ``rank_of(host, pid)``
    knows them.  Per communicator and collective kind, the ranks that launched
    fewer operations than the most any rank launched are behind (the ranks
    ahead wait in the collective they launched); missing, unresponsive and
    dead ranks, and ranks that reported an error, are named too."""
    def glob(r: RasRank) -> int:
        g = rank_of(r.host, r.pid) if rank_of is not None and r.pid >= 0 else None
        return g if g is not None else r.rank

    culprits: list[int] = []
    behind: dict[int, str] = {}
    says: list[str] = []
    seen: set[str] = set()
    for comm in st.comms:
        kinds = set(comm.groups) | {k for r in comm.ranks for k in r.counts}
        for kind in sorted(kinds, key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS)):
            counts = {glob(r): r.counts[kind] for r in comm.ranks if kind in r.counts}
            # the rest: the count most ranks are at (a tie goes to the higher count: those ranks
            # wait in a collective the others never launched)
            sizes: dict[int, int] = {}
            for n in counts.values():
                sizes[n] = sizes.get(n, 0) + 1
            for n_ranks, op in comm.groups.get(kind, []):
                sizes[op] = sizes.get(op, 0) + n_ranks
            if len(sizes) < 2:
                continue
            rest = max(sizes, key=lambda op: (sizes[op], op))
            odd = {g: n for g, n in counts.items() if n != rest}
            if not odd:  # text: only the groups differ, no rank is named
                others = sorted(op for op in sizes if op != rest)
                says_ = f"{sizes[rest]} ranks launched {kind} #{rest}; " + "; ".join(
                    f"{sizes[op]} ranks are at #{op}" for op in others)
                if says_ not in seen:
                    seen.add(says_)
                    says.append(says_)
                continue
            at_rest = sorted(g for g, n in counts.items() if n == rest)
            who = _names(at_rest) if at_rest and len(at_rest) == sizes[rest] else f"{sizes[rest]} ranks"
            parts = []
            for n in sorted(set(odd.values())):
                rs = [g for g, v in odd.items() if v == n]
                if n > rest:
                    parts.append(f"{_names(rs)} went on to #{n}")
                else:
                    parts.append(f"{_names(rs)} stopped at #{n}" if n else f"{_names(rs)} launched none")
                for g in rs:
                    behind[g] = f"{kind} #{n} (others #{rest})"
            sentence = f"{who} launched {kind} #{rest}; " + "; ".join(parts)
            if sentence not in seen:
                seen.add(sentence)
                says.append(sentence)
            culprits += [g for g in odd if g not in culprits]
        for r in comm.missing:
            g = glob(r)
            what = "dead" if r.dead else "unresponsive" if r.unresponsive else "missing (no data)"
            where = f" (pid {r.pid} on {r.host})" if r.pid >= 0 and r.host else ""
            sentence = f"rank {g}{where} is {what}"
            behind.setdefault(g, what)
            if sentence not in seen:
                seen.add(sentence)
                says.append(sentence)
            if g not in culprits:
                culprits.append(g)
        for r in comm.ranks:
            if r.error:
                g = glob(r)
                sentence = f"rank {g} reported {r.error}"
                behind.setdefault(g, r.error)
                if sentence not in seen:
                    seen.add(sentence)
                    says.append(sentence)
                if g not in culprits:
                    culprits.append(g)
    for host, pid in st.dead_processes:
        g = rank_of(host, pid) if rank_of is not None else None
        sentence = f"process {pid} on {host}" + (f" (rank {g})" if g is not None else "") + " is dead"
        if sentence not in seen:
            seen.add(sentence)
            says.append(sentence)
        if g is not None and g not in culprits:
            culprits.append(g)
            behind.setdefault(g, "dead")
    text = "; ".join(says) + " (NCCL RAS)" if says else ""
    return RasVerdict(culprits, text, behind)


# -- pushed events (MONITOR, 2.29+) ------------------------------------------------

_MONITOR_LINE = re.compile(r"^\[(?P<time>[^\]]*)\] (?P<event>[A-Z_]+): (?P<rest>.*?)\s*$")
_PEER = re.compile(r"Process (?P<pid>\d+) on node (?P<host>\S+) managing GPUs? (?P<gpu>\S+(?: \(NVML \d+\))?)")


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
    return pids | {pid for _h, pid in st.dead_processes}
