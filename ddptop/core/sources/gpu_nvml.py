"""The one module that imports pynvml (from the nvidia-ml-py distribution).

Every NVML call in ddptop goes through :class:`NvmlBackend`:

* lazy init; "no driver" is a normal state with a reason, never an exception;
* handles and static facts (name, uuid, memory total, power limit, max PCIe
  link) are read once and cached, never re-fetched per tick;
* one read per field per device per tick; a field the GPU does not support is
  None (shown as "n/a"), and stops being asked for after it said so;
* a GPU that falls off the bus ("GPU is lost") is reported once as lost and
  sampling goes on for the others;
* Xid critical errors are collected from NVML events where the driver
  supports them.

One module, though over 500 lines: the import-linter contract keeps pynvml to this one
file, so every NVML read lives here (the telemetry's per-tick sample, the doctor's
health and topology, the bench's link facts) with the records it returns.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddptop.core.model.events import GpuEvent
from ddptop.core.model.gpu_facts import (
    FABRIC_STATES,
    P2P_STATUS,
    TOPOLOGY_LEVELS,
    GpuHealth,
    GpuInfo,
    GpuPair,
    LinkFacts,
    RankLoad,
    Topology,
    XidError,
    bus_id,
)
from ddptop.core.sources.gpu_visible import match_uuid

# NVML return codes (stable across NVML versions)
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_INVALID_ARGUMENT = 2
_GPU_IS_LOST = 15

# nvmlInit failures on a machine whose driver is there but broken (anything
# but "no driver"): what to do.  CUDA fails the same way, so a job cannot start.
_INIT_FAULTS = {
    18: "the NVIDIA kernel module and the driver's libraries are different versions: the driver was upgraded "
        "without a reboot (or a container carries another driver's libraries); reboot, or unload and reload the "
        "nvidia kernel modules once nothing uses the GPUs",
    _NO_PERMISSION: "no permission to open the GPUs (/dev/nvidia*): check those files' permissions, or give the "
                    "container the GPUs (docker --gpus all)",
    _GPU_IS_LOST: "a GPU fell off the bus: `dmesg` shows the Xid; the GPU needs a reset or a reboot",
    16: "a GPU needs a reset (nvidia-smi -r) or a reboot",
    11: "the driver has an interrupt problem (IRQ): see `dmesg`",
}
_INIT_FAULT_OTHER = "the NVIDIA driver is installed but failed: see `nvidia-smi` and `dmesg`"

_THROTTLE_NAMES = {
    0x1: "idle",
    0x2: "app-clocks",
    0x4: "sw-power-cap",
    0x8: "hw-slowdown",
    0x10: "sync-boost",
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "hw-power-brake",
    0x100: "display-clocks",
}
# reasons that are not a problem worth showing
_BENIGN = {"idle", "app-clocks", "display-clocks"}


# Fields that newer nvidia-ml-py reads through entry points an older driver
# lacks: the alternatives, newest first.  An entry point the driver does not
# have (NVMLError_FunctionNotFound, or nvidia-ml-py's NVMLLibraryMismatchError
# for its unversioned wrappers) moves the whole backend on to the next one.
_ALTERNATIVES = {
    # nvidia-ml-py 12+ calls _v3, which drivers before ~510 do not have
    "procs": ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"),
    "gprocs": ("nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
    # renamed in driver 535; the old name still works on new drivers
    "throttle": ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
}


def _load():
    import pynvml  # the only import of pynvml in ddptop

    return pynvml


def _handle_key(h) -> int:
    """What identifies a device handle: its address for pynvml's ctypes
    pointers (two pointer objects to one device are not ``==``), else the
    object itself (a test's fake)."""
    try:
        return ctypes.cast(h, ctypes.c_void_p).value or id(h)
    except (TypeError, ctypes.ArgumentError):
        return id(h)


@dataclass
class _Device:
    index: int
    handle: Any
    name: str = ""
    uuid: str = ""
    mem_total: int | None = None
    power_limit_w: float | None = None
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    # read on first use by the reports (doctor, bench), then kept: they never change
    cc: str | None = None  # compute capability, "9.0"
    pci_bus: str | None = None  # as NVML writes it, "00000000:18:00.0"
    facts_read: bool = False


class NvmlBackend:
    """Real GPUs, through NVML: the :class:`~ddptop.core.sources.gpu_backend.GpuBackend` telemetry and the doctor use."""

    simulated = False

    def __init__(self, lib: Any = None, node: str = ""):
        self._lib = lib
        self.node = node
        self.error: str | None = None
        self.fault: str | None = None  # set when a driver is there but failed: what to do
        self.driver: str | None = None
        self.devices: list[_Device] = []
        self._ready = False
        self._event_set = None
        self._by_handle: dict[int, int] = {}  # _handle_key -> GPU index, for events
        self._alt: dict[str, int] = {}  # field -> which of its _ALTERNATIVES works here
        self._lost: list[int] = []  # GPUs that fell off the bus, in that order
        self._named: dict[str, int] = {}  # CUDA device id -> GPU index, as device_index found it

    # -- start-up -------------------------------------------------------------

    def init(self) -> bool:
        """Initialise NVML once.  False (with ``self.error``) when there is no GPU."""
        if self._ready:
            return True
        if self.error is not None:
            return False
        try:
            nv = self._lib or _load()
        except ImportError:
            self.error = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return False
        self._lib = nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            code = getattr(e, "value", None)
            if code == _LIBRARY_NOT_FOUND:
                self.error = "no NVIDIA driver (libnvidia-ml not found)"
            elif code == _DRIVER_NOT_LOADED:
                self.error = "no NVIDIA driver loaded"
            else:
                self.error = f"NVML failed to start: {str(e).rstrip('.')}"
                self.fault = _INIT_FAULTS.get(code, _INIT_FAULT_OTHER) if code is not None else _INIT_FAULT_OTHER
            return False
        except OSError as e:  # a broken library on the path
            self.error = f"NVML failed to start: {e}"
            self.fault = f"the NVIDIA driver library could not be loaded ({e}); reinstall the driver"
            return False
        try:
            self.driver = _str(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            self.driver = None
        try:
            n = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            self.error = f"NVML could not count GPUs: {e}"
            self.fault = _INIT_FAULT_OTHER
            return False
        for i in range(n):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except nv.NVMLError as e:
                d = _Device(i, None, name=f"GPU {i} ({e})", lost=True)
                self.devices.append(d)
                continue
            d = _Device(i, h)
            d.name = self._static(nv.nvmlDeviceGetName, h, "") or f"GPU {i}"
            d.name = _str(d.name)
            d.uuid = _str(self._static(nv.nvmlDeviceGetUUID, h, ""))
            mem = self._static(nv.nvmlDeviceGetMemoryInfo, h, None)
            d.mem_total = getattr(mem, "total", None)
            lim = self._static(nv.nvmlDeviceGetEnforcedPowerLimit, h, None)
            d.power_limit_w = lim / 1000.0 if lim is not None else None
            self.devices.append(d)
            self._by_handle[_handle_key(h)] = i
        self._register_xid()
        self._ready = True
        return True

    def _static(self, fn, h, default):
        try:
            return fn(h)
        except self._lib.NVMLError:
            return default

    def _register_xid(self) -> None:
        nv = self._lib
        try:
            es = nv.nvmlEventSetCreate()
        except (nv.NVMLError, AttributeError):
            return
        registered = False
        for d in self.devices:
            if d.handle is None:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(d.handle, nv.nvmlEventTypeXidCriticalError, es)
                registered = True
            except nv.NVMLError:
                pass
        self._event_set = es if registered else None

    # -- sampling -------------------------------------------------------------

    def _field(self, d: _Device, name: str, fn=None, *args):
        """One NVML read; None when unsupported (and never asked again).

        ``fn`` is the pynvml function, or None for a field of _ALTERNATIVES."""
        if name in d.unsupported or d.lost:
            return None
        nv = self._lib
        alts = _ALTERNATIVES.get(name) if fn is None else None
        while True:
            if alts is not None:
                k = self._alt.get(name, 0)
                if k >= len(alts):
                    d.unsupported.add(name)
                    return None
                fn = getattr(nv, alts[k], None)
            try:
                if fn is None:
                    raise AttributeError(name)
                return fn(d.handle, *args)
            except nv.NVMLError as e:
                code = getattr(e, "value", None)
                if code == _FUNCTION_NOT_FOUND and alts is not None:
                    self._alt[name] = self._alt.get(name, 0) + 1  # the driver is older: try the next
                    continue
                if code == _GPU_IS_LOST:
                    d.lost = True
                    self._lost.append(d.index)
                elif code in (_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND):
                    d.unsupported.add(name)
                return None
            except (AttributeError, getattr(nv, "NVMLLibraryMismatchError", AttributeError)):
                # an nvidia-ml-py without this function, or one whose wrapper
                # wants an entry point this driver does not have
                if alts is not None:
                    self._alt[name] = self._alt.get(name, 0) + 1
                    continue
                d.unsupported.add(name)
                return None

    def gpu_count(self) -> int:
        return len(self.devices)

    def lost_gpus(self) -> list[int]:
        return list(self._lost)

    def sample(self, now: float | None = None, ranks: Mapping[int, RankLoad] | None = None) -> list[GpuEvent]:
        """One read per supported field per GPU (``ranks`` is the simulator's: NVML reads the GPUs themselves)."""
        if not self.init():
            return []
        now = time.time() if now is None else now
        nv = self._lib
        out = []
        for d in self.devices:
            if d.lost:
                out.append(GpuEvent(now, index=d.index, name=d.name, uuid=d.uuid, mem_total=d.mem_total, lost=True, node=self.node))
                continue
            f = self._field
            util = f(d, "util", nv.nvmlDeviceGetUtilizationRates)
            mem = f(d, "mem", nv.nvmlDeviceGetMemoryInfo)
            power = f(d, "power", nv.nvmlDeviceGetPowerUsage)
            temp = f(d, "temp", nv.nvmlDeviceGetTemperature, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
            sm = f(d, "sm_clock", nv.nvmlDeviceGetClockInfo, getattr(nv, "NVML_CLOCK_SM", 1))
            gen = f(d, "pcie_gen", nv.nvmlDeviceGetCurrPcieLinkGeneration)
            width = f(d, "pcie_width", nv.nvmlDeviceGetCurrPcieLinkWidth)
            tx = f(d, "pcie_tx", nv.nvmlDeviceGetPcieThroughput, getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", 0))
            rx = f(d, "pcie_rx", nv.nvmlDeviceGetPcieThroughput, getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", 1))
            ecc = f(d, "ecc", nv.nvmlDeviceGetTotalEccErrors,
                    getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), getattr(nv, "NVML_VOLATILE_ECC", 0))
            retired = f(d, "retired", nv.nvmlDeviceGetRetiredPages, getattr(nv, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1))
            reasons = f(d, "throttle")
            if d.lost:
                out.append(GpuEvent(now, index=d.index, name=d.name, uuid=d.uuid, mem_total=d.mem_total, lost=True, node=self.node))
                continue
            out.append(GpuEvent(
                now,
                index=d.index,
                name=d.name,
                uuid=d.uuid,
                util=_num(getattr(util, "gpu", None)),
                mem_util=_num(getattr(util, "memory", None)),
                mem_used=getattr(mem, "used", None),
                mem_total=getattr(mem, "total", None) or d.mem_total,
                power_w=power / 1000.0 if power is not None else None,
                power_limit_w=d.power_limit_w,
                temp_c=_num(temp),
                sm_clock_mhz=sm,
                pcie_gen=gen,
                pcie_width=width,
                pcie_tx_kbs=tx,
                pcie_rx_kbs=rx,
                ecc_uncorrected=ecc,
                retired_pages=len(retired) if retired is not None else None,
                throttle=_throttle(reasons),
                node=self.node,
            ))
        return out

    def processes(self) -> dict[int, int]:
        """pid -> GPU index, from NVML's running-process lists."""
        if not self.init():
            return {}
        out: dict[int, int] = {}
        for d in self.devices:
            for name in ("procs", "gprocs"):
                for p in self._field(d, name) or ():
                    out.setdefault(p.pid, d.index)
        return out

    def device_index(self, ident: str) -> int | None:
        """The GPU a CUDA device id names (see the protocol): a GPU's UUID or a
        leading part of one, matched against the UUIDs read at start; a MIG
        device's ``MIG-<uuid>`` through NVML (its handle by UUID, then its
        parent GPU's); the ``MIG-GPU-<uuid>/<gi>/<ci>`` of drivers before R470
        by the GPU UUID inside it."""
        if not self.init():
            return None
        s = ident.strip()
        if s in self._named:
            return self._named[s]
        uuids = {d.uuid: d.index for d in self.devices if d.uuid}
        idx: int | None = None
        if s.upper().startswith("MIG-GPU-"):
            idx = match_uuid(s[4:].split("/")[0], uuids)
        elif s.upper().startswith("MIG-"):
            mig = self._call("nvmlDeviceGetHandleByUUID", s)
            parent = self._call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig) if mig is not None else None
            uuid = self._call("nvmlDeviceGetUUID", parent) if parent is not None else None
            idx = uuids.get(_str(uuid)) if uuid is not None else None
        else:
            idx = match_uuid(s, uuids)
        if idx is not None:  # (a MIG device made later may still be found)
            self._named[s] = idx
        return idx

    def xid_errors(self) -> list[XidError]:
        """Xid critical errors since the last call (non-blocking)."""
        if self._event_set is None:
            return []
        nv = self._lib
        out = []
        for _ in range(16):
            try:
                ev = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError:
                break
            idx = self._by_handle.get(_handle_key(getattr(ev, "device", None)), -1)
            out.append(XidError(idx, int(getattr(ev, "eventData", 0)), time.time()))
        return out

    def topology(self) -> "Topology | None":
        """What ``ddptop doctor`` needs, read once: driver and CUDA driver
        versions, per GPU its name, uuid and compute capability, and per pair
        the P2P read/write/NVLink status and the topology's common ancestor.
        None (with ``self.error``) when there is no driver."""
        if not self.init():
            return None
        nv = self._lib
        call = self._call
        cuda = call("nvmlSystemGetCudaDriverVersion_v2") or call("nvmlSystemGetCudaDriverVersion")
        gpus = [GpuInfo(d.index, d.name, d.uuid, d.cc, d.pci_bus, d.lost) for d in map(self._facts, self.devices)]
        idx = {name: _const(nv, f"NVML_P2P_CAPS_INDEX_{name.upper()}", i)
               for i, name in ((0, "read"), (1, "write"), (2, "nvlink"))}
        pairs = []
        live = [d for d in self.devices if d.handle is not None and not d.lost]
        for i, a in enumerate(live):
            for b in live[i + 1:]:
                st = {}
                for name, k in idx.items():
                    code = call("nvmlDeviceGetP2PStatus", a.handle, b.handle, k)
                    st[name] = P2P_STATUS.get(code, f"status {code}") if code is not None else "unknown"
                level = call("nvmlDeviceGetTopologyCommonAncestor", a.handle, b.handle)
                pairs.append(GpuPair(a.index, b.index, st["read"], st["write"], st["nvlink"],
                                     TOPOLOGY_LEVELS.get(level, (f"level {level}", "?"))[0] if level is not None else "unknown",
                                     level))
        return Topology(self.driver, _cuda_version(cuda), tuple(gpus), tuple(pairs))

    def _facts(self, d: _Device) -> _Device:
        """The device with its compute capability and PCI bus id read (once)."""
        if not d.facts_read and d.handle is not None and not d.lost:
            nv = self._lib
            cc = self._field(d, "cc", getattr(nv, "nvmlDeviceGetCudaComputeCapability", None))
            d.cc = f"{cc[0]}.{cc[1]}" if cc and len(cc) == 2 else None
            pci = self._call("nvmlDeviceGetPciInfo", d.handle) if not d.lost else None
            bus = getattr(pci, "busId", None)
            d.pci_bus = _str(bus) if bus is not None else None
            d.facts_read = True
        return d

    def _call(self, fn_name: str, *args):
        """One NVML call for a report (doctor, bench): None when this pynvml or
        this driver lacks it, or the GPU does not support it."""
        nv = self._lib
        fn = getattr(nv, fn_name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except (nv.NVMLError, getattr(nv, "NVMLLibraryMismatchError", nv.NVMLError)):
            return None

    def health(self) -> dict[int, "GpuHealth"]:
        """Memory errors and hardware throttling per GPU, read once (for
        ``ddptop doctor``).  A field the GPU does not have (no ECC on most
        consumer cards, no row remapping before A100) is None."""
        if not self.init():
            return {}
        call = self._call
        seen = {e.index: e for e in self.sample()}  # ECC, retired pages, throttle: as the telemetry reads them
        out = {}
        for d in self.devices:
            e = seen.get(d.index)
            if d.handle is None or d.lost or e is None or e.lost:
                out[d.index] = GpuHealth(d.index, d.name, lost=True)
                continue
            rows = call("nvmlDeviceGetRemappedRows", d.handle)
            pending = call("nvmlDeviceGetRetiredPagesPendingStatus", d.handle)
            out[d.index] = GpuHealth(
                d.index, d.name,
                ecc_uncorrected=e.ecc_uncorrected,
                retired_pages=e.retired_pages,
                retired_pending=bool(pending) if pending is not None else None,
                remapped_uncorrectable=rows[1] if rows else None,
                remap_pending=bool(rows[2]) if rows else None,
                remap_failure=bool(rows[3]) if rows else None,
                throttle=e.throttle,
            )
        return out

    def links(self) -> dict[int, "LinkFacts"]:
        """What each GPU's links can carry, read once (for ``ddptop bench p2p``):
        the PCIe link's maximum generation and width (not the current ones: an
        idle GPU drops its link to gen 1), the active NVLinks and the PCI bus
        id at the far end of each, and the memory bus width and maximum memory
        clock.  Empty without a driver."""
        if not self.init():
            return {}
        nv = self._lib
        call = self._call
        max_links = _const(nv, "NVML_NVLINK_MAX_LINKS", 18)
        mem_clock = _const(nv, "NVML_CLOCK_MEM", 2)
        out = {}
        for d in self.devices:
            if d.handle is None or d.lost:
                continue
            h = self._facts(d).handle
            remotes: list[str] = []
            inactive = 0
            for link in range(max_links):
                try:
                    active = nv.nvmlDeviceGetNvLinkState(h, link)
                except AttributeError:
                    break
                except nv.NVMLError as e:
                    if getattr(e, "value", None) in (_NOT_SUPPORTED, _INVALID_ARGUMENT, _FUNCTION_NOT_FOUND):
                        break  # no NVLink on this GPU, or past its last link
                    continue
                if active == 1:  # NVML_FEATURE_ENABLED
                    far = call("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
                    remotes.append(bus_id(getattr(far, "busId", "")) if far is not None else "")
                else:
                    inactive += 1
            out[d.index] = LinkFacts(
                index=d.index,
                name=d.name,
                bus=bus_id(d.pci_bus or ""),
                cc=d.cc,
                pcie_gen=call("nvmlDeviceGetMaxPcieLinkGeneration", h),
                pcie_width=call("nvmlDeviceGetMaxPcieLinkWidth", h),
                nvlink_remotes=tuple(remotes),
                nvlink_inactive=inactive,
                mem_bus_bits=call("nvmlDeviceGetMemoryBusWidth", h),
                mem_clock_mhz=call("nvmlDeviceGetMaxClockInfo", h, mem_clock),
                **self._fabric(h),
            )
        return out

    def _fabric(self, h) -> dict:
        """The GPU's registration with the NVSwitch fabric manager (until it
        completes, CUDA fails with error 802), from nvmlDeviceGetGpuFabricInfoV."""
        nv = self._lib
        cls = getattr(nv, "c_nvmlGpuFabricInfoV_t", None)
        if cls is None:
            return {}
        info = cls()
        if hasattr(info, "version") and not info.version:  # set by pynvml's constructor, but not by every release
            info.version = getattr(nv, "nvmlGpuFabricInfo_v2", 0x02000024)
        if self._call("nvmlDeviceGetGpuFabricInfoV", h, ctypes.byref(info)) is None:
            return {}
        state = FABRIC_STATES.get(info.state & 0xFF)  # one byte in nvml.h, four in pynvml: the rest is padding
        if state is None:
            return {}
        error = None
        if state == "completed" and info.status != 0:
            error = str(nv.NVMLError(info.status))
        return {"fabric": state, "fabric_error": error,
                "fabric_degraded": {1: True, 2: False}.get(getattr(info, "healthMask", 0) & 0x3)}

    def status(self) -> tuple[str, str]:
        """(backend, message) for the UI."""
        if self.init():
            names = sorted({d.name for d in self.devices})
            return "nvml", f"{len(self.devices)} GPU(s): {', '.join(names)}; driver {self.driver or '?'}"
        return "none", self.error or "no GPU"

    def shutdown(self) -> None:
        if self._ready:
            try:
                self._lib.nvmlShutdown()
            except self._lib.NVMLError:  # the driver went away: nothing left to release
                pass
            self._ready = False


# nvmlGpuFabricState_t (0: the GPU has no fabric)
def _const(nv, name: str, default: int) -> int:
    v = getattr(nv, name, default)
    return v[0] if isinstance(v, tuple) else v  # nvidia-ml-py spells NVML_P2P_CAPS_INDEX_READ as (0,)


def _cuda_version(v) -> str | None:
    """NVML's CUDA driver version (12040) as "12.4"."""
    if not isinstance(v, int) or v <= 0:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _num(v):
    return float(v) if v is not None else None


def _throttle(mask) -> tuple[str, ...]:
    if not mask:
        return ()
    return tuple(n for bit, n in _THROTTLE_NAMES.items() if mask & bit and n not in _BENIGN)
