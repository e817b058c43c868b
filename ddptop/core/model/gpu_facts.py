"""What NVML says of the GPUs, as plain values (no pynvml here): the types the
GPU backends return (``sources.gpu_backend``) and the doctor and ``bench p2p`` read.

They live apart from ``sources.gpu_nvml`` (the one module that imports pynvml) so that
the backend protocol, the simulated backend and their readers use them without
importing NVML's module, and so without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# a rank on this node, as the simulator makes a GPU of it: (global rank, busy %, RSS bytes); busy: the share of
# the last interval the rank was runnable (on a CPU or waiting for one), else its CPU use
RankLoad = tuple[int, Optional[float], Optional[int]]


@dataclass(frozen=True)
class XidError:
    index: int
    xid: int
    t: float


FABRIC_STATES = {1: "not started", 2: "in progress", 3: "completed"}

# nvmlDeviceGetP2PStatus answers (nvmlGpuP2PStatus_t)
P2P_STATUS = {
    0: "ok",
    1: "chipset not supported",
    2: "GPU not supported",
    3: "IOH topology not supported",
    4: "disabled by regkey",
    5: "not supported",
    6: "unknown",
}

# nvmlDeviceGetTopologyCommonAncestor answers: (words, nvidia-smi topo -m abbreviation)
TOPOLOGY_LEVELS = {
    0: ("same board", "internal"),
    10: ("single PCIe switch", "PIX"),
    20: ("multiple PCIe switches", "PXB"),
    30: ("host bridge", "PHB"),
    40: ("same CPU socket", "NODE"),
    50: ("other CPU socket", "SYS"),
}


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    cc: str | None  # compute capability "8.0"; None when NVML could not say
    pci_bus_id: str | None = None
    lost: bool = False


@dataclass(frozen=True)
class GpuPair:
    a: int
    b: int
    read: str  # P2P_STATUS words
    write: str
    nvlink: str
    ancestor: str  # TOPOLOGY_LEVELS words
    level: int | None = None


@dataclass(frozen=True)
class GpuHealth:
    index: int
    name: str
    ecc_uncorrected: int | None = None  # volatile: since the last driver load or reset
    retired_pages: int | None = None  # double-bit ECC page retirements
    retired_pending: bool | None = None  # a retirement waiting for a reset
    remapped_uncorrectable: int | None = None  # rows remapped after uncorrectable errors (A100 and later)
    remap_pending: bool | None = None  # a remap waiting for a reset
    remap_failure: bool | None = None  # a remap that failed: the GPU needs service
    throttle: tuple[str, ...] = ()
    lost: bool = False


@dataclass(frozen=True)
class LinkFacts:
    index: int
    bus: str  # normalised PCI bus id, "0000:18:00.0"
    cc: str | None
    pcie_gen: int | None  # the link's maximum, not its current (power-saving) state
    pcie_width: int | None
    nvlink_remotes: tuple[str, ...] = ()  # per active NVLink: the bus id at its far end
    nvlink_inactive: int = 0  # links the GPU has that are not up
    name: str = ""
    mem_bus_bits: int | None = None
    mem_clock_mhz: int | None = None  # maximum memory clock
    # registration with the NVSwitch fabric manager (Hopper and newer): None
    # where there is no fabric or NVML cannot say
    fabric: str | None = None  # FABRIC_STATES words
    fabric_error: str | None = None  # a registration that completed with an error
    fabric_degraded: bool | None = None  # NVLink bandwidth degraded (fabric health)


def switch_links(facts: dict) -> dict[int, int]:
    """Per GPU index, its active NVLinks that end at no local GPU: at an
    NVSwitch (or where NVML could not say).  ``facts``: ``links()``."""
    local = {f.bus for f in facts.values()}
    return {i: sum(1 for b in f.nvlink_remotes if b not in local) for i, f in facts.items()}


def bus_id(v) -> str:
    """A PCI bus id as "dddd:bb:dd.f" (NVML writes the domain with 8 digits in
    one place and 4 in another)."""
    s = (v.decode() if isinstance(v, bytes) else str(v)).strip().lower()
    try:
        dom, bus, rest = s.split(":")
        return f"{int(dom, 16):04x}:{bus}:{rest}"
    except ValueError:
        return s


@dataclass(frozen=True)
class Topology:
    driver: str | None  # "550.54.15"
    cuda_driver: str | None  # the newest CUDA the driver supports, "12.4"
    gpus: tuple[GpuInfo, ...]
    pairs: tuple[GpuPair, ...]


