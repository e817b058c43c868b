"""A fake at the NVML boundary: the real pynvml module's constants and error
classes, with the functions that would call libnvidia-ml replaced."""

import shutil
import subprocess
import types
from dataclasses import dataclass, field
from pathlib import Path

import pynvml

# four GPUs' UUIDs, as NVML reports them (tests/*/test_telemetry*.py)
UUIDS = ["GPU-8f3c2a10-1111-2222-3333-444444444444", "GPU-8f3c9b77-5555-6666-7777-888888888888",
         "GPU-1d0e4c55-9999-aaaa-bbbb-cccccccccccc", "GPU-a7e2f0c1-dddd-eeee-ffff-000000000000"]


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    util: int = 50
    mem_util: int = 20
    used: int = 10 * 1024**3
    total: int = 80 * 1024**3
    power_mw: int = 300_000
    limit_mw: int = 700_000
    temp: int = 55
    sm: int = 1980
    gen: int = 5
    width: int = 16
    procs: list = field(default_factory=list)  # pids
    unsupported: set = field(default_factory=set)  # NVML function names raising NotSupported
    lost: bool = False
    throttle: int = 0
    cc: tuple = (9, 0)  # compute capability
    bus_id: str = ""
    max_gen: int | None = None  # the link's maximum PCIe generation (default: gen)
    max_width: int | None = None
    nvlinks: list = field(default_factory=list)  # per active NVLink, the PCI bus id at its far end
    nvlinks_down: int = 0  # links after the active ones that are not up
    ecc: int = 0  # uncorrected volatile ECC errors
    retired: int = 0  # retired pages (double-bit)
    retired_pending: int = 0
    remap: tuple = (0, 0, 0, 0)  # remapped rows: correctable, uncorrectable, pending, failure
    mem_bus: int = 5120  # memory bus width, bits
    mem_clock: int = 2619  # max memory clock, MHz
    uuid: str = ""  # as NVML reports it (default: "GPU-" and a number of this object's)
    mig: list = field(default_factory=list)  # the UUIDs ("MIG-...") of the MIG devices on this GPU


@dataclass
class FakeMig:
    """A MIG device's handle: what nvmlDeviceGetHandleByUUID answers for a MIG UUID."""
    uuid: str
    parent: FakeGpu


def make(gpus, init_error=None, calls=None, *, driver="550.54.15", cuda=12040, p2p=None,
         p2p_default=(0, 0, 5), levels=None, level_default=10):
    """p2p: {(i, j): (read, write, nvlink)} NVML P2P status codes for a GPU pair (either order),
    else p2p_default (P2P over PCIe, no NVLink); levels: {(i, j): NVML topology level}, else
    level_default (one PCIe switch)."""
    nv = types.SimpleNamespace(**{k: getattr(pynvml, k) for k in dir(pynvml) if not k.startswith("nvml")
                                  or k.startswith(("nvmlClocks", "nvmlEventType"))})
    calls = calls if calls is not None else []

    def fn(name, impl):
        def wrapper(*a):
            calls.append(name)
            if init_error is not None and name != "nvmlInit":
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
            if a and isinstance(a[0], FakeGpu):
                g = a[0]
                if g.lost:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
                if name in g.unsupported:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return impl(*a)
        setattr(nv, name, wrapper)

    def init():
        if init_error is not None:
            raise pynvml.NVMLError(init_error)

    proc = lambda pid: types.SimpleNamespace(pid=pid, usedGpuMemory=1)
    fn("nvmlInit", init)
    fn("nvmlShutdown", lambda: None)
    fn("nvmlSystemGetDriverVersion", lambda: driver)
    fn("nvmlSystemGetCudaDriverVersion", lambda: cuda)
    fn("nvmlSystemGetCudaDriverVersion_v2", lambda: cuda)

    def index(g):  # by identity: equal-looking FakeGpus are still different GPUs
        return next(i for i, x in enumerate(gpus) if x is g)

    def pair(table, g1, g2, default):
        i, j = index(g1), index(g2)
        table = table or {}
        return table.get((i, j), table.get((j, i), default))

    fn("nvmlDeviceGetCudaComputeCapability", lambda g: g.cc)
    fn("nvmlDeviceGetPciInfo", lambda g: types.SimpleNamespace(busId=g.bus_id or f"00000000:{0x10 + index(g):02X}:00.0"))
    fn("nvmlDeviceGetP2PStatus", lambda g1, g2, k: pair(p2p, g1, g2, p2p_default)[k])
    fn("nvmlDeviceGetTopologyCommonAncestor", lambda g1, g2: pair(levels, g1, g2, level_default))
    fn("nvmlDeviceGetCount", lambda: len(gpus))
    fn("nvmlDeviceGetHandleByIndex", lambda i: gpus[i])
    fn("nvmlDeviceGetName", lambda g: g.name)
    uuid_of = lambda g: g.uuid if isinstance(g, FakeMig) else g.uuid or f"GPU-{id(g)}"

    def by_uuid(u):  # NVML takes the whole UUID only (CUDA takes a leading part)
        for g in gpus:
            if uuid_of(g) == u:
                return g
            for m in g.mig:
                if m == u:
                    return FakeMig(m, g)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def mig_parent(m):
        if not isinstance(m, FakeMig):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return m.parent

    fn("nvmlDeviceGetUUID", uuid_of)
    fn("nvmlDeviceGetHandleByUUID", by_uuid)
    fn("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig_parent)
    fn("nvmlDeviceGetMemoryInfo", lambda g: types.SimpleNamespace(used=g.used, total=g.total, free=g.total - g.used))
    fn("nvmlDeviceGetEnforcedPowerLimit", lambda g: g.limit_mw)
    fn("nvmlDeviceGetUtilizationRates", lambda g: types.SimpleNamespace(gpu=g.util, memory=g.mem_util))
    fn("nvmlDeviceGetPowerUsage", lambda g: g.power_mw)
    fn("nvmlDeviceGetTemperature", lambda g, s: g.temp)
    fn("nvmlDeviceGetClockInfo", lambda g, c: g.sm)
    fn("nvmlDeviceGetCurrPcieLinkGeneration", lambda g: g.gen)
    fn("nvmlDeviceGetCurrPcieLinkWidth", lambda g: g.width)
    fn("nvmlDeviceGetPcieThroughput", lambda g, c: 1000)
    fn("nvmlDeviceGetTotalEccErrors", lambda g, a, b: g.ecc)
    fn("nvmlDeviceGetRetiredPages", lambda g, c: [0x1000 * (k + 1) for k in range(g.retired)])
    fn("nvmlDeviceGetRetiredPagesPendingStatus", lambda g: g.retired_pending)
    fn("nvmlDeviceGetRemappedRows", lambda g: g.remap)
    fn("nvmlDeviceGetCurrentClocksEventReasons", lambda g: g.throttle)
    fn("nvmlDeviceGetCurrentClocksThrottleReasons", lambda g: g.throttle)
    fn("nvmlDeviceGetComputeRunningProcesses", lambda g: [proc(p) for p in g.procs])
    fn("nvmlDeviceGetGraphicsRunningProcesses", lambda g: [])
    fn("nvmlDeviceGetMaxPcieLinkGeneration", lambda g: g.max_gen or g.gen)
    fn("nvmlDeviceGetMaxPcieLinkWidth", lambda g: g.max_width or g.width)
    fn("nvmlDeviceGetMemoryBusWidth", lambda g: g.mem_bus)
    fn("nvmlDeviceGetMaxClockInfo", lambda g, t: g.mem_clock if t == pynvml.NVML_CLOCK_MEM else g.sm)

    def nvlink_state(g, link):
        if not g.nvlinks and not g.nvlinks_down:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(g.nvlinks) + g.nvlinks_down:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link < len(g.nvlinks) else 0

    fn("nvmlDeviceGetNvLinkState", nvlink_state)
    fn("nvmlDeviceGetNvLinkRemotePciInfo", lambda g, link: types.SimpleNamespace(busId=g.nvlinks[link]))
    fn("nvmlEventSetCreate", lambda: object())
    fn("nvmlDeviceRegisterEvents", lambda g, t, s: (_ for _ in ()).throw(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)))
    fn("nvmlEventSetWait", lambda s, t: (_ for _ in ()).throw(pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)))
    return nv


STUB = Path(__file__).resolve().parent / "nvml_stub" / "nvml_stub.c"


def build_stub(out_dir, old_driver: bool = False, cc: str | None = None) -> Path:
    """The C stand-in for libnvidia-ml.so.1 (tests/support/nvml_stub), built into
    ``out_dir``; put that directory on LD_LIBRARY_PATH and the real pynvml loads
    it.  ``old_driver``: without the entry points newer than driver ~510."""
    cc = cc or shutil.which("gcc") or shutil.which("cc") or "gcc"
    lib = Path(out_dir) / "libnvidia-ml.so.1"
    subprocess.run([cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-fvisibility=hidden",
                    *(["-DOLD_DRIVER"] if old_driver else []), "-o", str(lib), str(STUB)], check=True, timeout=120)
    return lib
