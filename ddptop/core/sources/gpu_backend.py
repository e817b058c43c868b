"""The GPU backend protocol: what telemetry and the doctor ask of a GPU backend.

Two backends implement it: :class:`~ddptop.core.sources.gpu_nvml.NvmlBackend` (real
GPUs, through NVML) and :class:`~ddptop.core.sources.gpu_sim.SimBackend` (a simulated
GPU per local rank, for machines without one).  A capability a backend lacks
is a method that answers None or empty (the simulator has no topology, no
Xid errors, no lost GPU), never a missing attribute.  mypy holds both to it:
:func:`ddptop.core.sources.telemetry.make_backend` returns either as a ``GpuBackend``.

Only :mod:`ddptop.core.sources.gpu_nvml` imports pynvml; the value types the backends
return (``Topology``, ``GpuHealth``, ``LinkFacts``, ``XidError``, ``RankLoad``) are
plain values in :mod:`ddptop.core.model.gpu_facts`, which imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from ddptop.core.model.events import GpuEvent
from ddptop.core.model.gpu_facts import (
    GpuHealth,
    LinkFacts,
    RankLoad,
    Topology,
    XidError,
)

__all__ = ["GpuBackend", "RankLoad"]



class GpuBackend(Protocol):
    """A node's GPUs, as telemetry samples them and the doctor checks them."""

    @property
    def simulated(self) -> bool:
        """The samples are made up (every front end labels them SIMULATED), and a
        rank's GPU is the one of its local rank."""

    @property
    def error(self) -> str | None:
        """Why there are no GPUs to read (no driver, sampling turned off); None when there are."""

    @property
    def fault(self) -> str | None:
        """A driver that is there but failed to start: what to do.  None otherwise."""

    @property
    def driver(self) -> str | None:
        """The driver's version, None when unknown."""

    def status(self) -> tuple[str, str]:
        """(backend: ``nvml`` | ``sim`` | ``none``, a one-line message) for the front ends."""

    def gpu_count(self) -> int:
        """How many GPUs were found (0 before the first ``status()`` or ``sample()``)."""

    def sample(self, now: float | None = None, ranks: Mapping[int, RankLoad] | None = None) -> list[GpuEvent]:
        """One ``GpuEvent`` per GPU, now.  ``ranks``: local rank -> :data:`RankLoad`
        of the ranks on this node, what a simulated GPU is made of (NVML reads
        the GPUs themselves and leaves it)."""

    def processes(self) -> dict[int, int]:
        """pid -> GPU index of the processes the driver sees on a GPU; {} when it cannot say.
        The pids are the driver's, the host's: inside a container they name no
        process of its own (see :func:`ddptop.core.sources.gpu_visible.rank_device`)."""

    def device_index(self, ident: str) -> int | None:
        """The index of the GPU a CUDA device id names: its UUID as NVML reports
        it (``GPU-8f3c...``, the ``uuid`` of its ``GpuEvent``), a leading part of
        one that names one GPU, or a MIG device's id (``MIG-...``: the GPU it is
        on).  None when it names no GPU here."""

    def lost_gpus(self) -> Sequence[int]:
        """The GPUs that fell off the bus since the start, in the order they did."""

    def xid_errors(self) -> list[XidError]:
        """Xid critical errors since the last call (never blocks)."""

    def topology(self) -> Topology | None:
        """Driver, GPUs and GPU pairs for ``ddptop doctor``; None when there is none to read."""

    def health(self) -> dict[int, GpuHealth]:
        """GPU index -> ECC, retired or remapped memory, throttling; {} when none can be read."""

    def links(self) -> dict[int, LinkFacts]:
        """GPU index -> PCIe, NVLink and fabric facts; {} when none can be read."""

    def shutdown(self) -> None:
        """Let go of the driver (the backend may not be used after)."""
