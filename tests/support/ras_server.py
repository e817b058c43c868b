"""A stand-in for NCCL's RAS port, for machines without NCCL (this one).

It speaks the protocol as NCCL's ``src/ras/client_support.cc`` does (the
``CLIENT PROTOCOL``/``SERVER PROTOCOL 2`` handshake, ``TIMEOUT`` in whole
seconds up to 2.29.2, ``SET FORMAT json`` from 2.28.7, ``STATUS`` /
``VERBOSE STATUS`` answered and then the connection closed, no end marker)
and lays its answers out as NCCL does, text and JSON, including the quirks
of released versions (2.28.9's missing comma in ``missing_ranks``; before
2.26, one "collective" operation count and "The missing ranks:" lines).

Its answers are built at each query from ``job()``: the test's view of the
real job (its ranks' hosts, pids and how many collectives each launched), so
nothing is canned: which rank is held back is the test's choice.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

KINDS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")


@dataclass
class Rank:
    rank: int  # its rank in this communicator
    pid: int
    host: str = "127.0.0.1"
    gpu: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # kind -> operations launched
    missing: bool = False  # its process does not answer (stopped, hung in the kernel, node unreachable)
    dead: bool = False  # RAS considers its process dead (no answer either)
    status: str = "RUNNING"  # RUNNING, INIT, FINALIZE, ABORT (how NCCL derives it from the rank's flags)
    nocomm: bool = False  # its process answers, but no longer (or not yet) has this communicator
    init_error: int = 0  # ncclResult_t of its initialisation (0 success, 7 in progress)
    async_error: int = 0  # ncclResult_t of an asynchronous error
    known: bool = True  # False: RAS has no record of its process ("[process information not found]")


@dataclass
class Job:
    ranks: list[Rank]
    comm_hash: int = 0x7A3F00C2D9E1B845
    others: list["Job"] = field(default_factory=list)  # more communicators (sub-groups) of the same processes

    def comms(self) -> list["Job"]:
        return [self, *self.others]


# src/ras/client_support.cc
DETAIL_THRESHOLD = 10  # RAS_CLIENT_DETAIL_THRESHOLD
OUTLIER_FRACTION = 0.25  # RAS_CLIENT_OUTLIER_FRACTION
VERBOSE_OUTLIER_FRACTION = 0.5  # RAS_CLIENT_VERBOSE_OUTLIER_FRACTION
ERRORS = {1: "Unhandled CUDA error", 2: "System error", 3: "Internal error", 4: "Invalid argument",
          5: "Invalid usage", 6: "Remote process error", 7: "NCCL operation in progress"}


def is_outlier(count: int, verbose: bool, total: int = -1) -> bool:
    """rasCountIsOutlier: whether a group's members are listed one by one."""
    if count == 1:
        return True
    if verbose:
        return count < total * VERBOSE_OUTLIER_FRACTION if total != -1 else True
    return count <= DETAIL_THRESHOLD and (total == -1 or count <= total * OUTLIER_FRACTION)


def _who(r: Rank) -> str:
    return f"GPU {r.gpu} managed by process {r.pid} on node {r.host}" if r.known else "[process information not found]"


def _vt(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:3])


class RasServer:
    def __init__(self, job: Callable[[], Job], version: str = "2.29.2", host: str = "127.0.0.1", *,
                 gather: float = 0.0, stall_at: int | None = None) -> None:
        """``gather``: seconds the report takes (NCCL waits for peers that do not
        answer up to the client's TIMEOUT plus 5 s); ``stall_at``: send only
        that many bytes of the report, then nothing more (a wedged server)."""
        self.job = job
        self.version = version
        self.gather = gather
        self.stall_at = stall_at
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.addr = f"{host}:{self.sock.getsockname()[1]}"
        self.queries: list[str] = []  # the commands each connection sent, joined with |
        self.monitors: list[socket.socket] = []  # MONITOR clients, for push()
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop = True
        try:
            self.sock.close()
        except OSError:
            pass

    # -- the protocol --------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        fmt = "text"
        said: list[str] = []
        buf = b""
        with conn:
            conn.settimeout(10)
            while True:
                while b"\n" not in buf:
                    try:
                        chunk = conn.recv(1024)
                    except OSError:
                        return
                    if not chunk:
                        self.queries.append("|".join(said))
                        return
                    buf += chunk
                    if len(buf) > 1024:
                        return  # "RAS excessively long input line"
                raw, _, buf = buf.partition(b"\n")
                line = raw.decode().rstrip("\r")
                said.append(line)
                cmd = line.strip().upper()
                if cmd.startswith("CLIENT PROTOCOL"):
                    conn.sendall(b"SERVER PROTOCOL 2\n")
                elif cmd.startswith("TIMEOUT"):
                    arg = line.split(None, 1)[1] if " " in line.strip() else ""
                    ok = arg.isdigit() if _vt(self.version) < (2, 31, 0) else _is_number(arg)
                    conn.sendall(b"OK\n" if ok else f"ERROR: Invalid timeout value {arg}\n".encode())
                elif cmd.startswith("SET FORMAT"):
                    want = line.split()[-1].lower()
                    if _vt(self.version) < (2, 28, 7):
                        conn.sendall(f"ERROR: Unknown command {line}\n".encode())
                    elif want in ("text", "json"):
                        fmt = want
                        conn.sendall(b"OK\n")
                    else:
                        conn.sendall(f"ERROR: Invalid format {want}\n".encode())
                elif cmd.startswith("MONITOR"):
                    if _vt(self.version) < (2, 29, 0):
                        conn.sendall(f"ERROR: Unknown command {line}\n".encode())
                        continue
                    conn.sendall(b"OK\n")
                    self.queries.append("|".join(said))
                    self.monitors.append(conn)
                    conn.settimeout(None)  # NCCL keeps a monitor connection for as long as the job runs
                    try:
                        while conn.recv(1024):  # held open until the client goes
                            pass
                    except OSError:
                        pass
                    return
                elif cmd in ("STATUS", "VERBOSE STATUS"):
                    job = self.job()
                    body = self.json_report(job) if fmt == "json" else self.text_report(job, cmd == "VERBOSE STATUS")
                    if self.gather:
                        time.sleep(self.gather)  # (a stand-in for NCCL's own wait on silent peers)
                    if self.stall_at is not None:
                        conn.sendall(body.encode()[:self.stall_at])
                        self.queries.append("|".join(said))
                        while not self._stop:
                            time.sleep(0.1)  # never the rest, never closed: the client's deadline ends it
                        return
                    conn.sendall(body.encode())
                    self.queries.append("|".join(said))
                    return  # the server closes the connection: that is the end of the report
                else:
                    conn.sendall(f"ERROR: Unknown command {line}\n".encode())

    def push_peer(self, event: str, r: Rank, details: str = "") -> int:
        """Send ``event`` about ``r`` to every MONITOR client, in NCCL's text
        layout (``[time] EVENT: peer details``; a space before empty details);
        returns how many clients got it."""
        line = f"[2026-11-25 12:00:00] {event}: Process {r.pid} on node {r.host} managing GPU {r.gpu} {details}\n"
        sent = 0
        for c in list(self.monitors):
            try:
                c.sendall(line.encode())
                sent += 1
            except OSError:
                self.monitors.remove(c)
        return sent

    # -- the answers -----------------------------------------------------------------

    def json_report(self, job: Job) -> str:
        """As ``rasDumpCommsToJSON`` writes it (pretty-printed, 2-space indent)."""
        broken_comma = self.version == "2.28.9"

        def rank_obj(r: Rank) -> str:
            counts = ",\n".join(f'            "{k}": {r.counts.get(k, 0)}' for k in KINDS)
            init = r.init_error or (7 if r.status == "INIT" else 0)
            return (f'        {{\n          "rank": {r.rank},\n          "host": "{r.host}",\n          "pid": {r.pid},\n'
                    f'          "cuda_dev": {r.gpu},\n          "nvml_dev": {r.gpu},\n'
                    f'          "status": {{\n            "init_state": {init},\n            "async_error": {r.async_error},\n'
                    f'            "finalize_called": {_b(r.status == "FINALIZE")},\n'
                    f'            "destroy_flag": {_b(r.status in ("FINALIZE", "ABORT"))},\n'
                    f'            "abort_flag": {_b(r.status == "ABORT")}\n          }},\n'
                    f'          "collective_counts": {{\n{counts}\n          }}\n        }}')

        def missing_obj(r: Rank) -> str:
            comma = "" if broken_comma else ","
            return (f'        {{\n          "rank": {r.rank},\n          "host": "{r.host}",\n          "pid": {r.pid},\n'
                    f'          "cuda_dev": {r.gpu},\n          "nvml_dev": {r.gpu}{comma}\n'
                    f'          "status": {{\n            "unresponsive": {_b(r.missing or r.dead)},\n'
                    f'            "considered_dead": {_b(r.dead)}\n          }}\n        }}')

        comms = []
        for c in job.comms():
            present = [r for r in c.ranks if not (r.missing or r.dead or r.nocomm)]
            missing = [r for r in c.ranks if r.missing or r.dead or r.nocomm]
            ranks = ",\n".join(rank_obj(r) for r in present)
            miss = ",\n".join(missing_obj(r) for r in missing)
            comms.append('    {\n'
                         f'      "hash": "0x{c.comm_hash:x}",\n      "secondary_hash": "0x1:0x2",\n'
                         f'      "size": {len(c.ranks)},\n      "ranks_count": {len(present)},\n'
                         f'      "missing_ranks_count": {len(missing)},\n'
                         f'      "ranks": [\n{ranks}\n      ],\n      "missing_ranks": [\n{miss}\n      ]\n    }}')
        timeouts = len({(r.host, r.pid) for c in job.comms() for r in c.ranks if r.missing and not r.dead})
        return ('{\n'
                f'  "nccl_version": "{self.version}",\n  "cuda_runtime_version": 12080,\n'
                '  "cuda_driver_version": 12080,\n  "timestamp": "2026-11-25 12:00:00",\n'
                f'  "communicators_count": {len(comms)},\n  "communicators": [\n' + ",\n".join(comms) + '\n  ],\n'
                f'  "ras": {{\n    "collection_time_sec": 0.012,\n    "timeouts_count": {timeouts}\n  }}\n}}\n')

    def text_report(self, job: Job, verbose: bool = True) -> str:
        """As ``rasClientRunInit`` and ``rasClientRunComms`` write it: the
        header, the job summary, the communicators table, then Errors
        (the job's silent and dead processes; per communicator INCOMPLETE and
        ERROR) and Warnings (TIMEOUT; per communicator MISMATCH: the status,
        then each collective kind whose counts differ, as groups of ranks that
        share a value, the outlier groups' members listed)."""
        new = _vt(self.version) >= (2, 26, 0)
        comms = job.comms()
        procs: dict[tuple[str, int], Rank] = {}
        for c in comms:
            for r in c.ranks:
                procs.setdefault((r.host, r.pid), r)
        silent = [r for r in procs.values() if r.missing and not r.dead]
        dead = [r for r in procs.values() if r.dead]
        n = len(procs)
        out = [f"NCCL version {self.version}+cuda12.8 compiled with CUDA 12.8\n",
               "CUDA runtime version 12080, driver version 12080\n\n",
               "Job summary\n===========\n\n",
               "  Nodes  Processes         GPUs  Processes     GPUs\n",
               "(total)   per node  per process    (total)  (total)\n",
               f"{1:7d}  {n:9d}  {1:11d}  {n:9d}  {n:7d}\n",
               "\nCommunicators...", " (0.012s)\n=============\n\n",
               "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n",
               "    #  in group  per comm  per node  per comm  in group\n"]
        kinds = KINDS if new else ("collective",)
        info = []
        for c in comms:
            present = [r for r in c.ranks if not (r.missing or r.dead or r.nocomm)]
            incomplete = [r for r in c.ranks if r.missing or r.dead]
            nocomm = [r for r in c.ranks if r.nocomm and not (r.missing or r.dead)]
            counts = {r.rank: {k: (r.counts.get(k, 0) if new else sum(r.counts.values())) for k in kinds}
                      for r in present}
            mismatch = [k for k in kinds if len({counts[r.rank][k] for r in present}) > 1]
            states = {r.status for r in present} | ({"NOCOMM"} if nocomm else set())
            errored = [r for r in present if r.init_error not in (0, 7) or r.async_error not in (0, 7)]
            errs = [x for x, on in (("INCOMPLETE", incomplete), ("ERROR", errored),
                                    ("MISMATCH", mismatch or len(states) > 1)) if on]
            top = next(s for s in ("ABORT", "FINALIZE", "RUNNING", "INIT", "NOCOMM") if s in states | {"NOCOMM"})
            info.append((c, present, incomplete, nocomm, counts, mismatch, states, errored))
            out.append("%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s\n" % (len(info) - 1, 1, 1, str(len(c.ranks)),
                                                                     len(c.ranks), len(present), top,
                                                                     ",".join(errs) or "OK"))
        out.append("\nErrors\n======\n\n")
        for title, group, tail in (("INCOMPLETE", silent, None), ("DEAD", dead, None)):
            if not group:
                continue
            k = len(group)
            if title == "INCOMPLETE":
                out.append(f"INCOMPLETE\n  Missing communicator data from {k} job process{'es' if k > 1 else ''}\n")
            else:
                out.append(f"DEAD\n  {k} job process{'es are' if k > 1 else ' is'} considered dead "
                           "(unreachable via the RAS network)\n")
            if is_outlier(k, verbose):
                for r in sorted(group, key=lambda r: (r.host, r.pid)):
                    out.append(f"  Process {r.pid} on node {r.host} managing GPU {r.gpu}\n")
            out.append("\n")
        for i, (c, present, incomplete, nocomm, counts, mismatch, states, errored) in enumerate(info):
            h = f"{c.comm_hash:016x}"
            if incomplete:
                k = len(incomplete)
                out.append(f"#{i}-0 ({h}) INCOMPLETE\n  Missing communicator data from {k} rank{'s' if k > 1 else ''}\n")
                if is_outlier(k, verbose):
                    if new:
                        for r in incomplete:
                            out.append(f"  Rank {r.rank} -- {_who(r)}\n")
                    else:
                        out.append(f"  The missing rank{'s' if k > 1 else ''}: "
                                   + ",".join(str(r.rank) for r in incomplete) + "\n")
                out.append("\n")
            if errored:
                out.append(f"#{i}-0 ({h}) ERROR\n")
                for what, attr in (("Initialization", "init_error"), ("Asynchronous", "async_error")):
                    bad = [r for r in present if getattr(r, attr) not in (0, 7)]
                    if not bad:
                        continue
                    k = len(bad)
                    out.append(f"  {what} error{'s' if k > 1 else ''} on {k} rank{'s' if k > 1 else ''}\n")
                    by: dict[int, list[Rank]] = {}
                    for r in bad:
                        by.setdefault(getattr(r, attr), []).append(r)
                    for code, rs in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0])):
                        word = ERRORS.get(code, "Unexpected error")
                        if len(rs) > 1:
                            out.append(f"  {len(rs)} ranks reported {word}\n")
                        if is_outlier(len(rs), verbose):
                            for r in rs:
                                out.append(f"  Rank {r.rank} -- {_who(r)}\n" if len(rs) > 1
                                           else f"  Rank {r.rank} reported {word} -- {_who(r)}\n")
                out.append("\n")
        out.append("Warnings\n========\n\n")
        if silent:
            out.append(f"TIMEOUT\n  Encountered {len(silent)} communication timeout{'s' if len(silent) > 1 else ''} "
                       "while gathering communicator data\n\n")
        for i, (c, present, incomplete, nocomm, counts, mismatch, states, errored) in enumerate(info):
            if not mismatch and len(states) < 2:
                continue
            out.append(f"#{i}-0 ({c.comm_hash:016x}) MISMATCH\n")
            size = len(c.ranks)
            if len(states) > 1:
                out.append("  Communicator ranks have different status\n")
                by_state: dict[str, list[Rank]] = {}
                for r in present:
                    by_state.setdefault(r.status, []).append(r)
                if nocomm:
                    by_state["NOCOMM" if new else "UNKNOWN"] = nocomm
                order = ("NOCOMM", "INIT", "RUNNING", "FINALIZE", "ABORT")
                for state, rs in sorted(by_state.items(), key=lambda kv: (-len(kv[1]), -order.index(kv[0])
                                                                        if kv[0] in order else 0)):
                    if len(rs) > 1:
                        out.append(f"  {len(rs)} ranks have status {state}\n")
                    if is_outlier(len(rs), verbose, size):
                        for r in sorted(rs, key=lambda r: r.rank):
                            out.append(f"  Rank {r.rank} -- {_who(r)}\n" if len(rs) > 1
                                       else f"  Rank {r.rank} has status {state} -- {_who(r)}\n")
            for k in mismatch:
                out.append(f"  Communicator ranks have different {k} operation counts\n")
                by_op: dict[int, list[Rank]] = {}
                for r in present:
                    by_op.setdefault(counts[r.rank][k], []).append(r)
                for op, rs in sorted(by_op.items(), key=lambda kv: (-len(kv[1]), -kv[0])):
                    if len(rs) > 1:
                        out.append(f"  {len(rs)} ranks have launched up to operation {op}\n" if op or not new
                                   else f"  {len(rs)} ranks have not launched any operations\n")
                    if is_outlier(len(rs), verbose, size):
                        for r in sorted(rs, key=lambda r: r.rank):
                            if len(rs) > 1:
                                out.append(f"  Rank {r.rank} -- {_who(r)}\n")
                            elif op or not new:
                                out.append(f"  Rank {r.rank} has launched up to operation {op} -- {_who(r)}\n")
                            else:
                                out.append(f"  Rank {r.rank} has not launched any operations -- {_who(r)}\n")
                if new:
                    out.append("\n")
            if not new:
                out.append("\n")
        return "".join(out)


def _b(x: bool) -> str:
    return "true" if x else "false"


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False
