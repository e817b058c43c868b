"""The PCIe rows, read from sysfs: ACS P2P redirect on PCI bridges (the ACS
control register parsed from each bridge's config space by
:func:`acs_control`) and an IOMMU in translated mode, the two classic causes of
slow or hanging GPU peer-to-peer traffic on bare metal.
"""

from __future__ import annotations

import os
from pathlib import Path

from ddptop.core.tools.doctor.report import OK, SKIPPED, WARN, Row

# ACS control register bits (PCIe spec, ACS extended capability, offset 6)
_ACS_BITS = {0: "SV", 1: "TB", 2: "RR", 3: "CR", 4: "UF", 5: "EC", 6: "DT"}
_ACS_CAP_ID = 0x000D


def acs_control(config: bytes) -> int | None:
    """The ACS control register from a device's PCI config space, None without ACS."""
    off, seen = 0x100, set()
    while 0x100 <= off and off + 8 <= len(config) and off not in seen:
        seen.add(off)
        hdr = int.from_bytes(config[off:off + 4], "little")
        if hdr in (0, 0xFFFFFFFF):
            return None
        if hdr & 0xFFFF == _ACS_CAP_ID:
            return int.from_bytes(config[off + 6:off + 8], "little")
        off = (hdr >> 20) & 0xFFC
    return None


def check_acs(root: Path = Path("/"), n_gpus: int = 0, is_root: bool | None = None) -> Row:
    devs = root / "sys/bus/pci/devices"
    if not devs.is_dir():
        return Row("PCIe ACS", SKIPPED, f"{devs} not found (no PCI sysfs here)")
    is_root = (os.geteuid() == 0) if is_root is None else is_root
    bridges, unread, redirect, noacs = [], [], [], 0
    for d in sorted(devs.iterdir()):
        try:
            cls = (d / "class").read_text().strip()
        except OSError:
            continue
        if not cls.lower().startswith("0x0604"):
            continue  # PCI-to-PCI bridges (and PCIe switch / root ports)
        bridges.append(d.name)
        try:
            cfg = (d / "config").read_bytes()
        except OSError:
            unread.append(d.name)
            continue
        if len(cfg) <= 0x100:
            if len(cfg) <= 0x40 or not is_root:
                unread.append(d.name)  # the kernel gives non-root only the first 64 bytes
            else:
                noacs += 1  # no extended config space, so no ACS
            continue
        ctl = acs_control(cfg)
        if ctl is None:
            noacs += 1
        elif ctl & 0b1100:  # P2P request / completion redirect
            redirect.append((d.name, ctl))
    data = {"bridges": len(bridges), "acs_redirect": [b for b, _ in redirect], "unreadable": unread}
    if not bridges:
        return Row("PCIe ACS", OK, "no PCI-to-PCI bridges (class 0x0604): nothing to redirect P2P", [str(devs)], "", data)
    ev = [f"{len(bridges)} PCI bridge(s) under {devs}; {noacs} without ACS"]
    ev += [f"{b}: ACS control 0x{c:04x} ({' '.join(n for bit, n in _ACS_BITS.items() if c >> bit & 1)})"
           for b, c in redirect]
    if unread and len(unread) == len(bridges):
        return Row("PCIe ACS", SKIPPED, f"needs root: the extended config space of {len(bridges)} bridge(s) is "
                   "readable only by root (sudo ddptop doctor, or sudo setpci -s BUS ECAP_ACS+6.w)", ev, "", data)
    if unread:
        ev.append(f"{len(unread)} bridge(s) unreadable (needs root): {', '.join(unread[:8])}")
    if redirect:
        st = WARN if n_gpus >= 2 else OK
        why = "" if st == WARN else f" (matters only for P2P between GPUs; {n_gpus} GPU(s) here)"
        return Row("PCIe ACS", st, f"ACS P2P redirect on {len(redirect)} bridge(s){why}", ev,
                   "ACS redirects GPU peer-to-peer traffic through the root complex: slow P2P or NCCL hangs. Disable it "
                   "on bare metal (BIOS, or `setpci -s BUS ECAP_ACS+6.w=0000` for each bridge, as NCCL's "
                   "troubleshooting guide shows), or run with NCCL_P2P_DISABLE=1" if st == WARN else "", data)
    return Row("PCIe ACS", OK, f"no ACS P2P redirect on {len(bridges) - len(unread)} readable bridge(s)", ev, "", data)


def check_iommu(root: Path = Path("/"), n_gpus: int = 0) -> Row:
    units = sorted(p.name for p in (root / "sys/class/iommu").glob("*")) if (root / "sys/class/iommu").is_dir() else []
    try:
        cmdline = (root / "proc/cmdline").read_text().split()
    except OSError:
        cmdline = []
    opts = [a for a in cmdline if a.split("=")[0] in ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough")]
    types = {}
    groups = root / "sys/kernel/iommu_groups"
    if groups.is_dir():
        for g in groups.iterdir():
            try:
                t = (g / "type").read_text().strip()
            except OSError:
                continue
            types[t] = types.get(t, 0) + 1
    ev = [f"/sys/class/iommu: {', '.join(units) if units else 'no entries'}",
          f"/proc/cmdline IOMMU options: {' '.join(opts) if opts else 'none'}"]
    if types:
        ev.append("IOMMU group types: " + ", ".join(f"{n}x {t}" for t, n in sorted(types.items())))
    data = {"units": units, "cmdline": opts, "group_types": types}
    if not units and not types:
        return Row("IOMMU", OK, "no IOMMU active", ev, "", data)
    translated = sum(n for t, n in types.items() if t.startswith("DMA"))
    passthrough = "iommu=pt" in opts or "iommu.passthrough=1" in opts or (types and not translated)
    if passthrough:
        return Row("IOMMU", OK, f"IOMMU on, passthrough mode ({len(units)} unit(s))", ev, "", data)
    mode = "translated DMA" if translated else "mode unknown"
    st = WARN if n_gpus >= 2 else OK
    return Row("IOMMU", st, f"IOMMU on, {mode} ({len(units)} unit(s))" + ("" if st == WARN else
               f"; matters only for P2P between GPUs ({n_gpus} GPU(s) here)"), ev,
               "IOMMU translation is a classic cause of GPU P2P hangs and slow P2P on bare metal: boot with iommu=pt "
               "(passthrough), or run with NCCL_P2P_DISABLE=1" if st == WARN else "", data)
