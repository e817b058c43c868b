"""The GPU rows, from what NVML reports (through :mod:`ddptop.core.sources.gpu_nvml`):
the GPUs themselves (count, models, compute capabilities, a GPU that fell off
the bus), their health (uncorrected memory errors, pending row remaps and page
retirements, hardware throttling), peer-to-peer access between each pair, the
NVLinks of each GPU (one with fewer links up than its peers), and the NVSwitch
fabric registration that CUDA waits for on HGX/DGX systems.
"""

from __future__ import annotations

from dataclasses import asdict

from ddptop.core.model.gpu_facts import Topology, switch_links
from ddptop.core.tools.doctor.report import FAIL, OK, SKIPPED, WARN, Row


def check_gpus(topo: Topology | None, error: str | None, fault: str | None = None) -> Row:
    if topo is None:
        if fault:  # a driver that is there but broken: no job can use these GPUs
            return Row("GPUs", FAIL, error or "NVML failed", [], fault)
        return Row("GPUs", SKIPPED, error or "no NVIDIA driver")
    if not topo.gpus:
        return Row("GPUs", SKIPPED, "NVML found no GPU", [f"driver {topo.driver or '?'}"])
    ev = [f"GPU {g.index}: {g.name}, compute capability {g.cc or '?'}" + (" (LOST: fell off the bus)" if g.lost else "")
          for g in topo.gpus]
    names = sorted({g.name for g in topo.gpus if not g.lost})
    ccs = sorted({g.cc for g in topo.gpus if g.cc and not g.lost})
    data = {"count": len(topo.gpus), "gpus": [asdict(g) for g in topo.gpus]}
    summ = f"{len(topo.gpus)} GPU(s): " + ", ".join(f"{sum(g.name == n and not g.lost for g in topo.gpus)}x {n}"
                                                   for n in names)
    lost = [g.index for g in topo.gpus if g.lost]
    if lost:
        return Row("GPUs", FAIL, summ + f"; GPU {', '.join(map(str, lost))} lost", ev,
                   "a GPU that fell off the bus needs a reset or a reboot (see `dmesg` for the Xid)", data)
    if len(names) > 1 or len(ccs) > 1:
        first = {}
        for g in topo.gpus:
            first.setdefault(g.name, g.index)
        pin = ",".join(str(g.index) for g in topo.gpus if g.name == topo.gpus[0].name)
        return Row("GPUs", WARN, summ + f" (mixed: {len(names)} models, compute capabilities {', '.join(ccs)})", ev,
                   "mixed GPU models or compute capabilities in one job are a known cause of multi-GPU-only SIGSEGV; "
                   f"pin the job to one model, e.g. CUDA_VISIBLE_DEVICES={pin}", data)
    return Row("GPUs", OK, summ + (f", compute capability {ccs[0]}" if ccs else ""), ev, "", data)


def check_p2p(topo: Topology | None, error: str | None) -> Row:
    if topo is None:
        return Row("GPU P2P", SKIPPED, error or "no NVIDIA driver")
    if len(topo.gpus) < 2:
        return Row("GPU P2P", SKIPPED, f"needs 2 GPUs, found {len(topo.gpus)}")
    ev, bad = [], []
    for p in topo.pairs:
        ev.append(f"GPU {p.a} <-> GPU {p.b}: read {p.read}, write {p.write}, NVLink {p.nvlink}; via {p.ancestor}")
        if p.read != "ok" or p.write != "ok":
            bad.append(p)
    data = {"pairs": [asdict(p) for p in topo.pairs]}
    nvl = sum(p.nvlink == "ok" for p in topo.pairs)
    if bad:
        return Row("GPU P2P", WARN, f"P2P unavailable for {len(bad)} of {len(topo.pairs)} pair(s)", ev,
                   "NCCL falls back to shared memory / host copies for those pairs (slower); a pair reported as "
                   "`chipset`/`IOH topology not supported` often sits behind PCIe ACS or an IOMMU (see below). If a job "
                   "hangs in P2P instead, NCCL_P2P_DISABLE=1 (ddptop --profile p2p-off) confirms it", data)
    return Row("GPU P2P", OK, f"P2P read/write ok for all {len(topo.pairs)} pair(s)" + (f", {nvl} over NVLink" if nvl else ""),
               ev, "", data)


_HW_THROTTLE = {"hw-slowdown", "hw-thermal", "hw-power-brake", "sw-thermal"}


def check_gpu_health(health: dict | None, error: str | None) -> Row:
    """Memory errors that crash jobs on one GPU only (Xid 48, 63, 64, 94, 95 in
    the kernel log) and hardware throttling that makes one rank the straggler."""
    if health is None or (not health and error):
        return Row("GPU health", SKIPPED, error or "no NVIDIA driver")
    if not health:
        return Row("GPU health", SKIPPED, "no GPU")
    na = lambda v: "n/a" if v is None else v  # noqa: E731
    ev, fail, warn = [], [], []
    for i, h in sorted(health.items()):
        if h.lost:
            ev.append(f"GPU {i}: lost (fell off the bus)")
            fail.append(f"GPU {i} is lost")
            continue
        hw = [t for t in h.throttle if t in _HW_THROTTLE]
        ev.append(f"GPU {i} ({h.name}): uncorrected ECC errors {na(h.ecc_uncorrected)}, retired pages {na(h.retired_pages)}"
                  + (" (one pending)" if h.retired_pending else "")
                  + f", rows remapped after uncorrectable errors {na(h.remapped_uncorrectable)}"
                  + (" (one pending)" if h.remap_pending else "") + (" (a remap FAILED)" if h.remap_failure else "")
                  + (f", throttled by {', '.join(hw)}" if hw else ""))
        if h.remap_failure:
            fail.append(f"GPU {i}: a row remap failed")
        if h.remap_pending or h.retired_pending:
            warn.append(f"GPU {i}: a memory {'row remap' if h.remap_pending else 'page retirement'} waits for a reset")
        elif h.ecc_uncorrected:
            warn.append(f"GPU {i}: {h.ecc_uncorrected} uncorrected ECC error(s) since the driver loaded")
        if hw:
            warn.append(f"GPU {i}: throttled by {', '.join(hw)}")
    data = {"gpus": [{k: getattr(h, k) for k in ("index", "ecc_uncorrected", "retired_pages", "retired_pending",
                                                "remapped_uncorrectable", "remap_pending", "remap_failure", "throttle", "lost")}
                     for _, h in sorted(health.items())]}
    if fail:
        return Row("GPU health", FAIL, "; ".join(fail + warn), ev,
                   "take the GPU out of jobs (CUDA_VISIBLE_DEVICES without it) and have it serviced: a lost GPU or a failed "
                   "row remap is a hardware fault, and jobs on it crash (Xid 64/79 in `dmesg`)", data)
    if warn:
        return Row("GPU health", WARN, "; ".join(warn), ev,
                   "memory errors crash jobs on that GPU only (Xid 48/63/94/95 in `dmesg`): drain it and reset it "
                   "(`nvidia-smi -r -i N`) or reboot so the pending remap or retirement takes effect; a throttled GPU "
                   "makes its rank the straggler: check cooling and power (`nvidia-smi -q -d PERFORMANCE`)", data)
    return Row("GPU health", OK, f"{len(health)} GPU(s): no uncorrected memory errors, nothing pending, no hardware throttling",
               ev, "", data)


def check_nvlink(links: dict | None, error: str | None) -> Row:
    """NVLinks per GPU: a GPU with fewer links up than the others of its model
    has a link down (a failed link, a bad cable or bridge, a GPU that needs a
    reset): every collective through it slows down, or hangs."""
    if links is None or (not links and error):
        return Row("NVLink", SKIPPED, error or "no NVIDIA driver")
    if not links:
        return Row("NVLink", SKIPPED, "no GPU")
    with_nvl = {i: f for i, f in sorted(links.items()) if f.nvlink_remotes or f.nvlink_inactive}
    if not with_nvl:
        return Row("NVLink", OK, f"no NVLink on {'this GPU' if len(links) == 1 else f'these {len(links)} GPUs'}: "
                                 "peer traffic goes over PCIe")
    local = {f.bus for f in links.values()}
    to_switches = switch_links(links)
    ev, short = [], []
    by_model: dict[str, int] = {}
    for f in with_nvl.values():
        by_model[f.name] = max(by_model.get(f.name, 0), len(f.nvlink_remotes))
    for i, f in with_nvl.items():
        up = len(f.nvlink_remotes)
        peers = sorted({b for b in f.nvlink_remotes if b in local})
        switched = to_switches[i]
        ev.append(f"GPU {i} ({f.name}): {up} of {up + f.nvlink_inactive} NVLinks up"
                  + (f", {switched} to NVSwitches" if switched else "")
                  + (f", to {', '.join('GPU ' + str(j) for j, g in sorted(links.items()) if g.bus in peers)}" if peers else ""))
        if up < by_model[f.name]:
            short.append((i, f, by_model[f.name]))
    data = {"gpus": [{"index": i, "up": len(f.nvlink_remotes), "down": f.nvlink_inactive, "remotes": list(f.nvlink_remotes)}
                     for i, f in with_nvl.items()]}
    if short:
        return Row("NVLink", WARN, "; ".join(f"GPU {i} has {len(f.nvlink_remotes)} NVLinks up, "
                                             f"other {f.name} GPUs {best}" for i, f, best in short), ev,
                   "a link that is down slows every collective through that GPU and can hang NCCL: check "
                   "`nvidia-smi nvlink --status` and the error counters (`nvidia-smi nvlink -e`); a GPU reset "
                   "(`nvidia-smi -r`) or a reseated bridge/board often brings it back", data)
    total = sum(len(f.nvlink_remotes) for f in with_nvl.values())
    return Row("NVLink", OK, f"{total} NVLinks up on {len(with_nvl)} GPU(s), none down against the others of their model",
               ev, "", data)


def check_fabric(links: dict | None, error: str | None, driver: str | None = None) -> Row:
    """On NVSwitch systems (HGX/DGX) each GPU must be registered with the
    fabric by nvidia-fabricmanager before CUDA will start on it: until then
    every CUDA call fails with error 802, "system not yet initialized"."""
    name = "NVSwitch fabric"
    if links is None or (not links and error):
        return Row(name, SKIPPED, error or "no NVIDIA driver")
    switched = [i for i, n in sorted(switch_links(links).items()) if n]
    reg = {i: f for i, f in sorted(links.items()) if f.fabric}
    fm = ("`systemctl status nvidia-fabricmanager` and its log (/var/log/fabricmanager.log); it must run at the "
          f"driver's exact version{f' ({driver})' if driver else ''}")
    if not reg:
        if switched:
            return Row(name, SKIPPED, f"GPU {', '.join(map(str, switched))} on NVSwitches, but NVML reports no fabric "
                                      "state for them (before Hopper, or an older driver)", [],
                       f"if CUDA fails with error 802 ('system not yet initialized'): {fm}")
        return Row(name, SKIPPED, "no NVSwitch fabric on these GPUs" if links else "no GPU")
    ev = [f"GPU {i} ({f.name}): registration {f.fabric}" + (f", failed: {f.fabric_error}" if f.fabric_error else "")
          + (", NVLink bandwidth degraded" if f.fabric_degraded else "") for i, f in reg.items()]
    data = {"gpus": [{"index": i, "state": f.fabric, "error": f.fabric_error, "degraded": f.fabric_degraded}
                     for i, f in reg.items()]}
    bad = [i for i, f in reg.items() if f.fabric == "not started" or f.fabric_error]
    if bad:
        return Row(name, FAIL, f"GPU {', '.join(map(str, bad))} not registered with the NVSwitch fabric", ev,
                   "CUDA fails on these GPUs with error 802 ('system not yet initialized') until nvidia-fabricmanager "
                   f"registers them: {fm}", data)
    waiting = [i for i, f in reg.items() if f.fabric == "in progress"]
    if waiting:
        return Row(name, WARN, f"GPU {', '.join(map(str, waiting))}: fabric registration in progress", ev,
                   "usual for a minute after boot or a GPU reset, and CUDA fails with error 802 meanwhile; "
                   f"run doctor again, and if it stays: {fm}", data)
    slow = [i for i, f in reg.items() if f.fabric_degraded]
    if slow:
        return Row(name, WARN, f"GPU {', '.join(map(str, slow))}: NVLink bandwidth degraded (fabric health)", ev,
                   "an NVLink or an NVSwitch of the fabric is down, so collectives through these GPUs run slower: "
                   "`nvidia-smi nvlink --status`, the fabric manager log; a reset or a reboot of the node", data)
    return Row(name, OK, f"{len(reg)} GPU(s) registered with the NVSwitch fabric", ev, "", data)
