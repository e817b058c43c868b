"""NCCL's own view of the job, from its RAS port (``core.sources.ras_client``): asked at a
stall (``RasProbe``), and its pushed events followed (``RasMonitor``)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Callable

from ddptop.core.analysis.ras_verdict import verdict as ras_verdict
from ddptop.core.model.events import Event, NoteEvent, RasEvent
from ddptop.core.model.ras_types import (
    MonitorUnsupported,
    PeerEvent,
    RasError,
    job_pids,
)
from ddptop.core.model.run_dirs import JournalError, make_private_dir
from ddptop.core.sources import ras_client as ras
from ddptop.core.sources.probe_base import Emit, Job, Loop


class RasProbe(Job):
    """Asks NCCL's RAS port what NCCL sees (``ras_client``), off the caller's
    thread, one query at a time, and emits a ``RasEvent``: who launched which
    collective, who is missing or dead, as global ranks.  The raw answer is
    kept beside the stall's stack samples (``dest/stacks/<time>-ras.json``).

    ``addr()`` gives the address of the current attempt (None: RAS is off);
    ``rank_pids()`` the job's ranks on this node, to map RAS's (host, pid) to
    global ranks.  A query is asked for at a suspected stall, during a stall
    and with a stack capture; the caller decides whether NCCL is in use."""

    thread_name = "ddptop-ras"

    def __init__(self, addr: Callable[[], str | None], dest: Path, rank_pids: Callable[[], dict[int, int]],
                 emit: Emit, *, node: str = "", timeout: float = 9.0, clock: Callable[[], float] = time.time,
                 job_pids: bool = False):
        """``job_pids``: use an answer only if it names this job's pids (a
        default port another job may share)."""
        super().__init__(emit)
        self.addr, self.dest, self.rank_pids = addr, Path(dest), rank_pids
        self.node, self.timeout, self.clock, self.job_pids = node, timeout, clock, job_pids
        self.asked = 0
        self.last_asked = float("-inf")  # time.monotonic() of the last query
        self._t0 = 0.0  # when the query under way began (its events' time)
        self._monitor = RasMonitor(addr, self._local_ranks, emit, node=node, clock=clock)

    def request(self) -> bool:
        addr = self.addr()
        if not addr or not self._claim():
            return False
        self.asked += 1
        self.last_asked = time.monotonic()
        self._launch(addr)
        return True

    @property
    def monitoring(self) -> bool:
        """``start_monitor`` has been called."""
        return self._monitor.started

    def start_monitor(self) -> None:
        """Follow NCCL's pushed events (MONITOR, 2.29+) in a thread until
        ``stop`` (``RasMonitor``)."""
        self._monitor.start()

    def stop(self) -> None:
        self._monitor.stop()

    def _local_ranks(self) -> dict[int, int]:
        return {pid: rank for rank, pid in self.rank_pids().items()}

    def _failed(self, error: Exception, *args: object) -> list[Event]:
        addr = str(args[0]) if args else ""
        return [RasEvent(self._t0, addr=addr, error=f"RAS query failed: {error!r}", node=self.node)]

    def _run(self, addr: str) -> None:

        t0 = self._t0 = self.clock()
        try:
            st = ras.query(addr, timeout=self.timeout)
        except (RasError, ValueError) as e:
            why = str(e)
            if "refused" in why.lower():
                why += (" (no RAS port there: NCCL older than 2.24, RAS turned off with NCCL_RAS_ENABLE=0, "
                        "NCCL not started yet, or another user's job holds the port)")
            self.emit([RasEvent(t0, addr=addr, error=why, node=self.node)])
            return
        by_pid = self._local_ranks()
        if self.job_pids and not (job_pids(st) & set(by_pid)):
            self.emit([RasEvent(t0, addr=addr, error="the answer is about another job's processes "
                                "(a shared default port): ignored", node=self.node)])
            return
        local = _local_addresses()

        def rank_of(host: str, pid: int) -> int | None:
            return by_pid.get(pid) if (not host or host in local or len(local) == 0) else None

        v = ras_verdict(st, rank_of)
        file = ""
        try:

            d = make_private_dir(self.dest / "stacks")
            ext = "json" if st.format == "json" else "txt"
            stamp, n = time.strftime("%Y%m%d-%H%M%S"), 1
            f = d / f"{stamp}-ras.{ext}"
            while f.exists():  # (two answers in one second: both kept, the later sorting last, as diagnose reads)
                n += 1
                f = d / f"{stamp}.{n:02d}-ras.{ext}"
            f.write_text(st.raw)
            file = str(f)
        except (OSError, JournalError):
            pass  # (the answer is still said; only its raw copy is missing)
        self.emit([RasEvent(t0, addr=addr, ok=True, version=st.version, format=st.format,
                            culprits=tuple(v.culprits), text=v.text, behind=dict(v.behind),
                            took=st.took, file=file, node=self.node)])


class RasMonitor(Loop):
    """Follows NCCL's pushed events (MONITOR, 2.29+) until ``stop``: a dead
    peer becomes a ``RasEvent`` with ``event`` PEER_DEAD at once.  Reconnects
    while the port is not up yet (NCCL starts it at its first communicator)
    and after a relaunch; a server without MONITOR is said once, and not
    asked again.  ``local_ranks()``: pid -> global rank of this node's ranks."""

    thread_name = "ddptop-ras-monitor"

    def __init__(self, addr: Callable[[], str | None], local_ranks: Callable[[], dict[int, int]], emit: Emit, *,
                 node: str = "", clock: Callable[[], float] = time.time):
        super().__init__(emit)
        self.addr, self.local_ranks, self.node, self.clock = addr, local_ranks, node, clock

    def _failed(self, error: Exception) -> list[Event]:
        return [NoteEvent(self.clock(), "warning", f"NCCL RAS monitor failed: {error!r}", node=self.node)]

    def _loop(self) -> None:

        def on_event(pe: PeerEvent) -> None:
            if pe.event != "PEER_DEAD":
                return
            rank = self.local_ranks().get(pe.pid) if pe.pid >= 0 else None
            who = (f"process {pe.pid} on {pe.host}" if pe.pid >= 0 else f"peer {pe.details or pe.line.strip()}")
            who += f" (rank {rank})" if rank is not None else ""
            self.emit([RasEvent(self.clock(), addr=addr or "", ok=True, event="PEER_DEAD",
                                culprits=(rank,) if rank is not None else (), text=f"{who} is dead (PEER_DEAD)",
                                node=self.node)])

        while not self._stopped.is_set():
            addr = self.addr()
            if not addr:
                self._stopped.wait(5)
                continue
            try:
                ras.monitor(addr, on_event, self._stopped.is_set)
                self._stopped.wait(1)  # the connection closed: the job ended, or is relaunched
            except MonitorUnsupported as e:
                self.emit([NoteEvent(self.clock(), "info", f"NCCL RAS: {e}; dead peers are seen at the next "
                                     "stall instead", node=self.node)])
                return
            except (RasError, ValueError):
                self._stopped.wait(5)  # no port yet (NCCL not started), or refused: ask again later


def _local_addresses() -> set[str]:
    """This machine's addresses (RAS names hosts by IP); empty when unknown."""
    import psutil

    try:
        return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
                if a.family in (socket.AF_INET, socket.AF_INET6)}
    except (OSError, psutil.Error):
        return set()
