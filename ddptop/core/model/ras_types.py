"""What NCCL's RAS says, as ddptop holds it: a status report
(``RasStatus``: its communicators, their ranks and the job's processes), a
pushed event (``PeerEvent``), and the errors of asking."""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")


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


class MonitorUnsupported(RasError):
    """The server has no MONITOR (NCCL before 2.29)."""


@dataclass
class PeerEvent:
    """One event NCCL's RAS pushes to a ``MONITOR`` client: ``PEER_DEAD``,
    ``PEER_NEW`` (lifecycle), ``PEER_UNRESPONSIVE`` and others (trace)."""

    event: str
    host: str = ""
    pid: int = -1
    details: str = ""
    line: str = ""


def job_pids(st: RasStatus) -> set[int]:
    """Every pid the answer names (to check that an answer on a shared,
    default port is about this job)."""
    pids = {r.pid for c in st.comms for r in [*c.ranks, *c.missing] if r.pid >= 0}
    return pids | {pid for _h, pid in st.dead_processes} | {pid for _h, pid in st.silent_processes}
