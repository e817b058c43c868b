"""A simulated GPU per local rank, for machines without one (demo, tests).

Its "utilisation" is how busy the rank process wants to be: the share of the
last interval it was runnable (on a CPU or waiting for one; its CPU use where
the kernel does not say), so a rank spinning in a collective reads ~100% (as an
NCCL kernel spinning on its own GPU would), even where other processes share
its cores, and a sleeping rank reads ~0%.  Every sample says ``simulated=True`` and every
front end labels it SIMULATED.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from ddptop.core.model.events import GpuEvent
from ddptop.core.model.gpu_facts import (
    GpuHealth,
    LinkFacts,
    RankLoad,
    Topology,
    XidError,
)

SIM_NAME = "SIMULATED GPU (util = rank CPU %)"
MEM_TOTAL = 16 * 1024**3


class SimBackend:
    """A :class:`~ddptop.core.sources.gpu_backend.GpuBackend` without a GPU: no driver,
    no topology, no Xid error, no lost GPU."""

    simulated = True

    def __init__(self, node: str = ""):
        self.node = node
        self.error: str | None = None
        self.fault: str | None = None
        self.driver: str | None = None

    def status(self) -> tuple[str, str]:
        return "sim", "SIMULATED GPUs: one per local rank, utilisation = that rank's CPU demand"

    def gpu_count(self) -> int:
        """0: a simulated GPU is made per rank as it is sampled, none is found up front."""
        return 0

    def sample(self, now: float | None = None, ranks: Mapping[int, RankLoad] | None = None) -> list[GpuEvent]:
        """A GPU per local rank in ``ranks`` (local rank -> (global rank, busy %, rss bytes))."""
        now = time.time() if now is None else now
        out = []
        for local_rank, (rank, cpu, rss) in sorted((ranks or {}).items()):
            util = None if cpu is None else max(0.0, min(100.0, cpu))
            out.append(GpuEvent(
                now,
                index=local_rank,
                name=SIM_NAME,
                uuid=f"SIM-{local_rank}",
                util=util,
                mem_util=None if util is None else round(util * 0.05, 1),
                mem_used=rss,
                mem_total=MEM_TOTAL,
                power_w=None if util is None else round(60 + 3.4 * util, 1),
                power_limit_w=400.0,
                temp_c=None if util is None else round(35 + 0.4 * util, 1),
                ranks=(rank,),
                mapping="sim",
                simulated=True,
                node=self.node,
            ))
        return out

    def processes(self) -> dict[int, int]:
        return {}

    def device_index(self, ident: str) -> int | None:
        """A simulated GPU's UUID (``SIM-<local rank>``) names it; nothing else does."""
        s = ident.strip().upper()
        return int(s[4:]) if s.startswith("SIM-") and s[4:].isdigit() else None

    def lost_gpus(self) -> list[int]:
        return []

    def xid_errors(self) -> list[XidError]:
        return []

    def topology(self) -> Topology | None:
        return None

    def health(self) -> dict[int, GpuHealth]:
        return {}

    def links(self) -> dict[int, LinkFacts]:
        return {}

    def shutdown(self) -> None:
        pass
