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
from dataclasses import dataclass, field
from typing import Callable

KINDS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")


@dataclass
class Rank:
    rank: int
    pid: int
    host: str = "127.0.0.1"
    gpu: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # kind -> operations launched
    missing: bool = False  # no data from it (its process does not answer)
    dead: bool = False


@dataclass
class Job:
    ranks: list[Rank]
    comm_hash: int = 0x7A3F00C2D9E1B845


def _vt(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:3])


class RasServer:
    def __init__(self, job: Callable[[], Job], version: str = "2.29.2", host: str = "127.0.0.1") -> None:
        self.job = job
        self.version = version
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
                    ok = arg.isdigit() if _vt(self.version) <= (2, 29, 2) else _is_number(arg)
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
                    body = self.json_report(job) if fmt == "json" else self.text_report(job)
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
        """As ``rasClientRunJson`` writes it (pretty-printed, 2-space indent)."""
        present = [r for r in job.ranks if not r.missing]
        missing = [r for r in job.ranks if r.missing]
        broken_comma = self.version == "2.28.9"

        def rank_obj(r: Rank) -> str:
            counts = ",\n".join(f'            "{k}": {r.counts.get(k, 0)}' for k in KINDS)
            return (f'        {{\n          "rank": {r.rank},\n          "host": "{r.host}",\n          "pid": {r.pid},\n'
                    f'          "cuda_dev": {r.gpu},\n          "nvml_dev": {r.gpu},\n'
                    f'          "status": {{\n            "init_state": 0,\n            "async_error": 0,\n'
                    f'            "finalize_called": false,\n            "destroy_flag": false,\n'
                    f'            "abort_flag": false\n          }},\n'
                    f'          "collective_counts": {{\n{counts}\n          }}\n        }}')

        def missing_obj(r: Rank) -> str:
            comma = "" if broken_comma else ","
            return (f'        {{\n          "rank": {r.rank},\n          "host": "{r.host}",\n          "pid": {r.pid},\n'
                    f'          "cuda_dev": {r.gpu},\n          "nvml_dev": {r.gpu}{comma}\n'
                    f'          "status": {{\n            "unresponsive": {str(r.dead).lower()},\n'
                    f'            "considered_dead": {str(r.dead).lower()}\n          }}\n        }}')

        ranks = ",\n".join(rank_obj(r) for r in present)
        miss = ",\n".join(missing_obj(r) for r in missing)
        return ('{\n'
                f'  "nccl_version": "{self.version}",\n  "cuda_runtime_version": 12080,\n'
                '  "cuda_driver_version": 12080,\n  "timestamp": "2026-11-25 12:00:00",\n'
                '  "communicators_count": 1,\n  "communicators": [\n    {\n'
                f'      "hash": "0x{job.comm_hash:x}",\n      "secondary_hash": "0x1:0x2",\n'
                f'      "size": {len(job.ranks)},\n      "ranks_count": {len(present)},\n'
                f'      "missing_ranks_count": {len(missing)},\n'
                f'      "ranks": [\n{ranks}\n      ],\n      "missing_ranks": [\n{miss}\n      ]\n    }}\n  ],\n'
                '  "ras": {\n    "collection_time_sec": 0.012,\n    "timeouts_count": 0\n  }\n}\n')

    def text_report(self, job: Job) -> str:
        """As ``rasClientRunText`` writes it: header, job summary, the
        communicators table, then Errors and Warnings."""
        new = _vt(self.version) >= (2, 26, 0)
        n = len(job.ranks)
        present = [r for r in job.ranks if not r.missing]
        missing = [r for r in job.ranks if r.missing]
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
        totals = {r.rank: {k: (r.counts.get(k, 0) if new else sum(r.counts.values())) for k in kinds} for r in present}
        mismatch = [k for k in kinds if len({totals[r.rank][k] for r in present}) > 1]
        errors = ",".join(x for x, on in (("INCOMPLETE", bool(missing)), ("MISMATCH", bool(mismatch))) if on) or "OK"
        out.append("%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s\n" % (0, 1, 1, str(n), n, n, "RUNNING", errors))
        h = f"{job.comm_hash:016x}"
        if missing:
            out.append("\nErrors\n======\n\n")
            out.append(f"#0-0 ({h}) INCOMPLETE\n  Missing communicator data from {len(missing)} "
                       f"rank{'s' if len(missing) != 1 else ''}\n")
            if new:
                for r in missing:
                    out.append(f"  Rank {r.rank} -- GPU {r.gpu} managed by process {r.pid} on node {r.host}\n")
            else:
                out.append(f"  The missing rank{'s' if len(missing) != 1 else ''}: "
                           + ", ".join(str(r.rank) for r in missing) + "\n")
            out.append("\n")
        if mismatch:
            out.append("\nWarnings\n========\n\n" + f"#0-0 ({h}) MISMATCH\n")
            for k in mismatch:
                out.append(f"  Communicator ranks have different {k} operation counts\n")
                by: dict[int, list[Rank]] = {}
                for r in present:
                    by.setdefault(totals[r.rank][k], []).append(r)
                for op, rs in sorted(by.items(), key=lambda kv: -len(kv[1])):
                    if len(rs) > 1 and len(rs) > len(present) // 4:  # a large group: counted, not listed
                        out.append(f"  {len(rs)} ranks have launched up to operation {op}\n" if op
                                   else f"  {len(rs)} ranks have not launched any operations\n")
                        continue
                    for r in rs:
                        who = f"GPU {r.gpu} managed by process {r.pid} on node {r.host}"
                        out.append(f"  Rank {r.rank} has launched up to operation {op} -- {who}\n" if op
                                   else f"  Rank {r.rank} has not launched any operations -- {who}\n")
            out.append("\n")
        return "".join(out)


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False
