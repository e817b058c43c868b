"""A simulated GPU per local rank, for machines without one (demo, tests).

Its "utilisation" is the rank process's CPU use, so a rank spinning in a
collective reads ~100% (as an NCCL kernel spinning on a GPU would) and a
sleeping rank reads ~0%.  Every sample says ``simulated=True`` and every
front end labels it SIMULATED.
"""

from __future__ import annotations

import time

from ddptop.core.events import GpuEvent

SIM_NAME = "SIMULATED GPU (util = rank CPU %)"
MEM_TOTAL = 16 * 1024**3


class SimBackend:
    simulated = True

    def __init__(self, node: str = ""):
        self.node = node
        self.error = None

    def status(self) -> tuple[str, str]:
        return "sim", "SIMULATED GPUs: one per local rank, utilisation = that rank's CPU use"

    def sample_from_ranks(self, rank_cpu: dict[int, tuple[int, float | None, int | None]], now: float | None = None) -> list[GpuEvent]:
        """rank_cpu: local_rank -> (global rank, cpu %, rss bytes)."""
        now = time.time() if now is None else now
        out = []
        for local_rank, (rank, cpu, rss) in sorted(rank_cpu.items()):
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

    def xid_errors(self):
        return []

    def shutdown(self) -> None:
        pass
