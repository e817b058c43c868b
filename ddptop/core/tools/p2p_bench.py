"""`ddptop bench p2p`: GPU peer-to-peer copy and all-reduce bandwidth, each test under its own timeout.

This module (the orchestration) never imports torch, which the monitor never
does: the measurements run in worker processes it starts (``python -m
ddptop._inject.bench_worker ...``, which imports torch), one per measurement,
each under a timeout, so a hanging copy or collective is reported as a hang
instead of freezing the benchmark.

Measured (where the hardware is there):

* per GPU pair: unidirectional copy bandwidth with peer access and staged
  through pinned host memory (P2P "disabled"), bidirectional bandwidth, latency;
* per GPU: device-to-device copy bandwidth (bytes read plus written, as
  ``p2pBandwidthLatencyTest`` counts) and pinned host-to-device / device-to-host;
* all-reduce bus bandwidth across the local GPUs (NCCL) over a size sweep, or,
  without GPUs, across CPU processes on gloo (so the code path runs in CI):
  ``busbw = algbw * 2(n-1)/n`` as nccl-tests defines it.

Each figure is shown next to the link's theoretical rate where NVML gives it
(PCIe generation x width).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field

from ddptop.core.model.gpu_facts import switch_links
from ddptop.core.sources.gpu_nvml import NvmlBackend, bus_id

GB = 1e9
# PCIe per-lane, per-direction data rate after encoding, GB/s (gen 1-2: 8b/10b; 3+: 128b/130b; 6: FLIT)
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
DEFAULT_SIZES = [1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 26]  # bytes, all-reduce sweep


def pcie_rate(gen: int | None, width: int | None) -> float | None:
    """Theoretical one-direction PCIe bandwidth in GB/s (None when unknown)."""
    if not gen or not width or gen not in PCIE_LANE_GBS:
        return None
    return PCIE_LANE_GBS[gen] * width


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth, GB/s: the buffer size over the time of one operation."""
    return nbytes / seconds / GB


def busbw(nbytes: int, seconds: float, ranks: int) -> float:
    """All-reduce bus bandwidth, GB/s (nccl-tests): algbw x 2(n-1)/n, comparable
    with the hardware's link rate whatever the number of ranks."""
    return algbw(nbytes, seconds) * (2 * (ranks - 1) / ranks if ranks > 1 else 1.0)


def percent(measured: float | None, theoretical: float | None) -> float | None:
    if measured is None or not theoretical:
        return None
    return 100.0 * measured / theoretical


@dataclass
class Row:
    test: str  # "copy p2p", "copy staged", "bidir", "latency", "d2d", "h2d", "d2h", "allreduce"
    where: str  # "0->1", "gpu 0", "4 ranks (nccl)"
    size: int | None = None
    status: str = "ok"  # ok | hang | error | skipped
    gbs: float | None = None  # GB/s (busbw for all-reduce)
    algbw: float | None = None
    latency_us: float | None = None
    theoretical: float | None = None
    pct: float | None = None
    message: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


class _Rows(list):
    """Rows that tell a listener about each one as it comes (the TUI pane)."""

    listener = None

    def append(self, row) -> None:
        super().append(row)
        if self.listener is not None:
            self.listener(row)


@dataclass
class Report:
    device: str
    rows: list[Row] = field(default_factory=_Rows)
    links: list[str] = field(default_factory=list)  # each GPU's links, in words (from NVML)

    def to_dict(self) -> dict:
        return {"device": self.device, "links": self.links, "rows": [r.to_dict() for r in self.rows]}


# -- the orchestrator (no torch here) ------------------------------------------------


def _worker(args: list[str], timeout: float, env: dict | None = None) -> tuple[str, dict | None, str]:
    """Run one measurement in its own process: ("ok", result, "") or ("hang"|"error", None, why)."""
    argv = [sys.executable, "-m", "ddptop._inject.bench_worker", *args]
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, env=env)
    except OSError as e:
        return "error", None, str(e)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        import signal

        try:
            os.killpg(p.pid, signal.SIGKILL)  # the worker and any rank it started
        except ProcessLookupError:
            pass
        p.communicate()
        return "hang", None, f"no answer in {timeout:g} s (killed): a hang"
    if p.returncode != 0:
        lines = [l for l in (err or "").splitlines() if l.strip()]
        return "error", None, (lines[-1] if lines else f"exit {p.returncode}")[:300]
    try:
        return "ok", json.loads(out.strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return "error", None, f"unreadable worker output: {out[-200:]!r}"


# NVLink rate per link and direction, GB/s, by GPU architecture (compute
# capability), from NVIDIA's data sheets: P100 160 GB/s over 4 links (both
# directions), V100 300/6, A100 600/12, RTX 3090 (8.6) 112.5/4, H100 900/18,
# B200 1800/18; Turing's NVLink bridge (7.5) 100/2.  Not from
# nvmlDeviceGetNvLinkVersion: its numbering has differed between drivers (an
# H100 has been reported as NVLink 5).
NVLINK_GBS = {"6.0": 20.0, "7.0": 25.0, "7.5": 25.0, "8.0": 25.0, "8.6": 14.0625, "9.0": 25.0, "10": 50.0}


def nvlink_link_rate(cc: str | None) -> float | None:
    if not cc:
        return None
    return NVLINK_GBS.get(cc, NVLINK_GBS.get(cc.split(".")[0]))


def memory_rate(bus_bits: int | None, clock_mhz: int | None) -> float | None:
    """Theoretical memory bandwidth in GB/s: bus width x max memory clock x 2
    (double data rate), e.g. an H100 SXM's 5120 bits at 2619 MHz: 3352 GB/s."""
    if not bus_bits or not clock_mhz:
        return None
    return bus_bits * clock_mhz * 2 / 8 / 1000


@dataclass
class LinkRates:
    """Theoretical one-direction rates, GB/s, by NVML GPU index."""

    pcie: dict = field(default_factory=dict)  # i -> PCIe (max gen x width)
    memory: dict = field(default_factory=dict)  # i -> device memory
    pair: dict = field(default_factory=dict)  # (i, j) -> NVLink between them, else the slower PCIe
    nvlink: dict = field(default_factory=dict)  # (i, j) -> NVLinks usable between i and j
    buses: dict = field(default_factory=dict)  # i -> PCI bus id
    lines: list = field(default_factory=list)  # what each GPU has, in words


def link_rates(facts: dict) -> LinkRates:
    """Rates from NVML's link facts (``NvmlBackend.links()``).  NVLinks that end
    at another local GPU count for that pair only; the others end at an
    NVSwitch (or where NVML could not say), and any two GPUs on switches get
    the smaller of their two switch link counts."""

    r = LinkRates()
    switched = switch_links(facts)
    for i, f in sorted(facts.items()):
        r.buses[i] = f.bus
        r.pcie[i] = pcie_rate(f.pcie_gen, f.pcie_width)
        r.memory[i] = memory_rate(f.mem_bus_bits, f.mem_clock_mhz)
        words = [f"GPU {i}", f"PCIe gen{f.pcie_gen} x{f.pcie_width} ({r.pcie[i]:.1f} GB/s)" if r.pcie[i] else "PCIe ?"]
        if f.nvlink_remotes:
            per = nvlink_link_rate(f.cc)
            words.append(f"NVLink x{len(f.nvlink_remotes)}" + (f" ({switched[i]} to switches)" if switched[i] else "")
                         + (f" ({len(f.nvlink_remotes) * per:.0f} GB/s)" if per else " (rate unknown for this GPU)"))
        if r.memory[i]:
            words.append(f"memory {r.memory[i]:.0f} GB/s")
        r.lines.append(": ".join([words[0], ", ".join(words[1:])]))
    for i, a in facts.items():
        for j, b in facts.items():
            if i == j:
                continue
            n = a.nvlink_remotes.count(b.bus) + min(switched[i], switched[j])
            per = [nvlink_link_rate(a.cc), nvlink_link_rate(b.cc)]
            if n and all(per):
                r.nvlink[(i, j)] = n
                r.pair[(i, j)] = n * min(per)
            else:
                r.pair[(i, j)] = min(filter(None, [r.pcie[i], r.pcie[j]]), default=None)
    return r


def _link_rates() -> LinkRates:
    """The link rates of this machine's GPUs (empty without a driver: the
    backend answers every NVML failure itself, as ``doctor`` relies on too)."""

    b = NvmlBackend()
    try:
        return link_rates(b.links())
    finally:
        b.shutdown()


def run(sizes: list[int] | None = None, timeout: float = 60.0, ranks: int | None = None,
        copy_mb: int = 256, env: dict | None = None, progress=None) -> Report:
    """Every measurement this machine allows; ``progress(row)`` is called as each row comes."""
    sizes = sizes or DEFAULT_SIZES
    status, info, why = _worker(["probe"], timeout, env)
    if status != "ok":
        rep = Report("unknown")
        rep.rows.listener = progress
        rep.rows.append(Row("probe", "torch", status=status, message=f"could not start torch: {why}"))
        return rep
    n = info["gpus"]
    rep = Report(info["device"])
    rep.rows.listener = progress
    rates = _link_rates() if n else LinkRates()
    rep.links = rates.lines
    nv = _nvml_index(info, rates)  # CUDA device -> NVML index (they can differ in order)
    pcie = lambda i: rates.pcie.get(nv[i])  # noqa: E731
    pair = lambda i, j: rates.pair.get((nv[i], nv[j]))  # noqa: E731
    if n < 2:
        rep.rows.append(Row("copy p2p", "GPU pairs", status="skipped",
                            message=f"{'no CUDA GPU' if n == 0 else 'one GPU'}: no pair to measure"
                                    + (f" ({info.get('why')})" if info.get("why") else "")))
    for i in range(n):
        for what in ("d2d", "h2d", "d2h"):
            rep.rows.append(_copy_row(what, [what, str(i), str(i), str(copy_mb)], f"gpu {i}", timeout, env,
                                      pcie(i) if what != "d2d" else rates.memory.get(nv[i])))
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            peer = info["peer"][i][j]
            if peer:
                rep.rows.append(_copy_row("copy p2p", ["p2p", str(i), str(j), str(copy_mb)], f"{i}->{j}", timeout,
                                          env, pair(i, j)))
            else:
                rep.rows.append(Row("copy p2p", f"{i}->{j}", status="skipped",
                                    message="peer access not supported between these GPUs (torch.cuda.can_device_access_peer)"))
            staged = min(filter(None, [pcie(i), pcie(j)]), default=None)  # through host memory: PCIe both ways
            rep.rows.append(_copy_row("copy staged", ["staged", str(i), str(j), str(copy_mb)], f"{i}->{j}", timeout,
                                      env, staged))
            if i < j:
                theo = pair(i, j) if peer else staged
                rep.rows.append(_copy_row("bidir", ["bidir", str(i), str(j), str(copy_mb)], f"{i}<->{j}", timeout,
                                          env, 2 * theo if theo else None))
                rep.rows.append(_copy_row("latency", ["latency", str(i), str(j), "0"], f"{i}->{j}", timeout, env, None))
    nranks = ranks or (n if n >= 2 else 2)
    backend = "nccl" if n >= 2 else "gloo"
    where = f"{nranks} ranks ({backend}{', CPU' if backend == 'gloo' else ''})"
    # a ring all-reduce runs at the speed of its slowest hop
    theo = (min(filter(None, (pair(i, j) for i in range(nranks) for j in range(nranks) if i != j)), default=None)
            if backend == "nccl" and nranks <= n else None)
    for size in sizes:
        st, res, why = _worker(["allreduce", str(nranks), backend, str(size)], timeout, env)
        if st != "ok":
            rep.rows.append(Row("allreduce", where, size, st, message=why))
            if st == "hang":
                break  # a collective that hangs once hangs for every size
            continue
        secs = res["seconds"]
        bw = busbw(size, secs, nranks)
        rep.rows.append(Row("allreduce", where, size, gbs=bw, algbw=algbw(size, secs), latency_us=secs * 1e6,
                            theoretical=theo, pct=percent(bw, theo)))
    return rep


def _nvml_index(info: dict, rates: LinkRates) -> dict[int, int]:
    """CUDA device i -> NVML index, matched by PCI bus id (CUDA orders devices
    fastest first and CUDA_VISIBLE_DEVICES renumbers them; NVML goes by bus);
    the same number where the bus id is unknown."""

    by_bus = {b: i for i, b in rates.buses.items()}
    buses = info.get("buses") or [None] * info["gpus"]
    return {i: by_bus.get(bus_id(buses[i]), i) if buses[i] else i for i in range(info["gpus"])}


def _copy_row(test: str, args: list[str], where: str, timeout: float, env, theo: float | None) -> Row:
    st, res, why = _worker(args, timeout, env)
    if st != "ok":
        return Row(test, where, status=st, message=why)
    if test == "latency":
        return Row(test, where, latency_us=res["seconds"] * 1e6)
    bw = res["bytes"] / res["seconds"] / GB
    return Row(test, where, res["bytes"], gbs=bw, theoretical=theo, pct=percent(bw, theo))


def size_text(n: int | None) -> str:
    if n is None:
        return ""
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:g} {unit}"
    return f"{n} B"


def format_report(rep: Report) -> str:
    out = [f"ddptop bench p2p on {rep.device}", *(f"  {line}" for line in rep.links), "",
           f"{'test':<12} {'where':<22} {'size':>9} {'GB/s':>9} {'of link':>8} {'latency':>11}  note"]
    for r in rep.rows:
        gbs = f"{r.gbs:.3g}" if r.gbs is not None else ""
        pct = f"{r.pct:.0f}%" if r.pct is not None else ""
        lat = f"{r.latency_us:.1f} us" if r.latency_us is not None else ""
        note = r.message if r.status != "ok" else (f"algbw {r.algbw:.3g} GB/s" if r.algbw is not None else "")
        status = "" if r.status == "ok" else f"{r.status.upper()}: "
        out.append(f"{r.test:<12} {r.where:<22} {size_text(r.size):>9} {gbs:>9} {pct:>8} {lat:>11}  {status}{note}")
    hangs = [r for r in rep.rows if r.status == "hang"]
    if hangs:
        out += ["", f"{len(hangs)} test(s) HUNG: " + ", ".join(f"{r.test} {r.where}" for r in hangs)]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="ddptop bench p2p", description=(
        "GPU peer-to-peer and all-reduce bandwidth, each test in its own process under --timeout "
        "(a hang is reported as a hang). Without a GPU, the all-reduce runs on gloo across CPU processes."))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per test (default 60)")
    ap.add_argument("--sizes", default=None, help="all-reduce sizes in bytes, comma separated")
    ap.add_argument("--ranks", type=int, default=None, help="all-reduce ranks (default: the GPUs, or 2 on CPU)")
    ap.add_argument("--copy-mb", type=int, default=256, help="copy size per test in MiB (default 256)")
    a = ap.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else None
    rep = run(sizes, a.timeout, a.ranks, a.copy_mb)
    print(json.dumps(rep.to_dict(), indent=2) if a.json else format_report(rep))
    bad = [r for r in rep.rows if r.status in ("hang", "error")]
    return 2 if any(r.status == "hang" for r in bad) else (1 if bad else 0)


# -- the workers (torch lives here only) ------------------------------------------------
