"""Per-tick telemetry: psutil per rank, GPUs per node, ranks mapped to GPUs.

A rank is mapped to a GPU by its pid in NVML's process list (``gpu_nvml``);
where NVML's pids cannot be ours -- ddptop in a PID namespace of its own (a
container, a pod), or NVML's pids never a process here -- by its device: the
GPU its environment gives it (CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES
and LOCAL_RANK, see :mod:`ddptop.core.sources.gpu_visible`), identified by UUID or
index (``device``).  Elsewhere the environment's word is ``env`` (the rank
is on no GPU NVML lists, yet), and ``guess`` where the environment leaves the
GPU open (LOCAL_RANK past the list, an index among GPUs CUDA may number in
another order, an environment that cannot be read).

``Telemetry.tick(ranks)`` returns the events of one sample.  It is called by
the supervisor's sampler thread once a second (poll, then reschedule: ticks
never overlap) and costs a few psutil reads per rank and one NVML read per
field per GPU.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

import psutil

from ddptop.core.analysis.wording import gpu_lost_words, xid_words
from ddptop.core.model.events import (
    AlarmEvent,
    Event,
    GpuEvent,
    GpuStatusEvent,
    ProcEvent,
)
from ddptop.core.sources import proc_tree as procs
from ddptop.core.sources.gpu_backend import GpuBackend
from ddptop.core.sources.gpu_nvml import NvmlBackend
from ddptop.core.sources.gpu_sim import SimBackend
from ddptop.core.sources.gpu_visible import Gpu, RankDevice, rank_device


@dataclass(frozen=True)
class RankProc:
    rank: int
    local_rank: int
    pid: int


def runnable_ns(pid: int) -> dict[str, int] | None:
    """thread id -> nanoseconds it spent on a CPU plus waiting in a run queue for one (the first
    two fields of ``/proc/PID/task/TID/schedstat``); None where the kernel does not say."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                run, wait = f.read().split()[:2]
            out[tid] = int(run) + int(wait)
        except (OSError, ValueError):  # a thread gone since the listing; no schedstat here
            continue
    return out or None


def _ppid_map() -> dict[int, int]:
    fn = getattr(psutil, "_ppid_map", None)
    if fn is not None:
        try:
            return fn()
        except (OSError, psutil.Error):  # /proc refused it: ask process by process
            pass
    return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"])}


def _descendants(pid: int, children_of: dict[int, list[int]]) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for c in children_of.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


class Telemetry:
    def __init__(self, backend: GpuBackend, node: str = ""):
        self.backend = backend
        self.node = node
        self._procs: dict[int, psutil.Process] = {}
        self._child_procs: dict[int, psutil.Process] = {}
        self._env: dict[int, dict[str, str] | None] = {}  # pid -> its environment (None: unreadable), read once
        self._device: dict[int, RankDevice] = {}  # pid -> the GPU its environment gives it, once GPUs are known
        self._namespace = procs.pid_namespace()  # ddptop in a PID namespace of its own: NVML's pids are not ours
        self._nvml_listed = False  # NVML has listed a process
        self._nvml_pid_here = False  # ... and one of them was a process here
        self._nvml_absent: set[int] = set()  # NVML pids that were no process here
        self._status_sent = False
        self._lost_reported: set[int] = set()
        self._runnable: dict[int, tuple[float, dict[str, int]]] = {}  # pid -> (when, thread -> run+wait ns)

    def _proc(self, pid: int, cache: dict) -> psutil.Process | None:
        p = cache.get(pid)
        if p is None:
            try:
                p = cache[pid] = psutil.Process(pid)
                p.cpu_percent(None)  # prime: the next call measures since now
            except psutil.Error:
                return None
        return p

    def _foreign(self, nvml_pids: dict[int, int]) -> bool:
        """NVML's pids cannot be ours: ddptop runs in a PID namespace of its own,
        or NVML has listed processes and none of them was ever a process here."""
        if self._namespace:
            return True
        if nvml_pids:
            self._nvml_listed = True
            if not self._nvml_pid_here:
                if len(self._nvml_absent) > 4096:  # (a long run's host pids: forget the old ones)
                    self._nvml_absent.clear()
                for pid in nvml_pids.keys() - self._nvml_absent:
                    if pid > 0 and psutil.pid_exists(pid):  # (psutil says pid 0 exists)
                        self._nvml_pid_here = True
                        break
                    self._nvml_absent.add(pid)
        return self._nvml_listed and not self._nvml_pid_here

    def _rank_device(self, r: RankProc, gpus: list[GpuEvent]) -> RankDevice:
        """The GPU the rank's environment gives it (worked out once per process)."""
        dev = self._device.get(r.pid)
        if dev is None:
            env = self._env.get(r.pid)
            dev = rank_device(env or {}, r.local_rank, [Gpu(g.index, g.uuid, g.name) for g in gpus],
                              self.backend.device_index)
            if env is None:  # unreadable: LOCAL_RANK alone says it
                dev = replace(dev, sure=False)
            if gpus:
                self._device[r.pid] = dev
        return dev

    def _busy(self, pid: int, cpu: float) -> float:
        """How busy a rank wants to be, in %: the share of the last interval its threads were
        runnable (on a CPU, or waiting in a run queue for one).  A rank spinning in a collective
        reads ~100% even where other processes share its cores (its CPU use there is its share of
        the cores, not its demand); a sleeping rank ~0%.  ``cpu`` (its CPU use) where the kernel
        does not say (no schedstat), and on the first look."""
        now = time.monotonic()
        threads = runnable_ns(pid)
        if threads is None:
            return cpu
        before = self._runnable.get(pid)
        self._runnable[pid] = (now, threads)
        if before is None or now <= before[0]:
            return cpu
        ns = sum(max(0, v - before[1].get(tid, 0)) for tid, v in threads.items())
        return max(0.0, min(100.0, 100.0 * ns / ((now - before[0]) * 1e9)))

    def tick(self, ranks: list[RankProc], now: float | None = None) -> list[Event]:
        now = time.time() if now is None else now
        out: list[Event] = []
        if not self._status_sent:
            backend, msg = self.backend.status()
            out.append(GpuStatusEvent(now, backend=backend, message=msg, fault=self.backend.fault or "",
                                      driver=self.backend.driver, count=self.backend.gpu_count(), node=self.node))
            self._status_sent = True
        children_of: dict[int, list[int]] | None = None  # the whole process table, only where needed
        stats: dict[int, tuple] = {}
        live = set()
        for r in ranks:
            p = self._proc(r.pid, self._procs)
            if p is None:
                continue
            try:
                with p.oneshot():
                    cpu = p.cpu_percent(None)
                    rss = p.memory_info().rss
                    status = p.status()
                    threads = p.num_threads()
            except psutil.Error:
                continue
            live.add(r.pid)
            kids = procs.descendant_pids(r.pid)  # data-loader workers and their children
            if kids is None:  # this kernel cannot list a process's children: scan every process
                if children_of is None:
                    children_of = {}
                    for pid, ppid in _ppid_map().items():
                        children_of.setdefault(ppid, []).append(pid)
                kids = _descendants(r.pid, children_of)
            live.update(kids)
            kid_cpu = 0.0
            for k in kids:
                kp = self._proc(k, self._child_procs)
                if kp is not None:
                    try:
                        kid_cpu += kp.cpu_percent(None)
                    except psutil.Error:
                        pass
            if r.pid not in self._env:
                try:
                    self._env[r.pid] = p.environ()
                except psutil.Error:
                    self._env[r.pid] = None
            stats[r.rank] = (r, cpu, rss, status, threads, len(kids), kid_cpu)
        # forget processes that are gone
        for cache in (self._procs, self._child_procs, self._env, self._device):
            for pid in [pid for pid in cache if pid not in live]:
                del cache[pid]

        # map ranks to GPUs
        rank_gpu: dict[int, tuple[int | None, str]] = {}
        if self.backend.simulated:  # a simulated GPU is as busy as its rank wants to be (see _busy)
            for pid in [pid for pid in self._runnable if pid not in live]:
                del self._runnable[pid]
            load = {s[0].local_rank: (rank, self._busy(s[0].pid, s[1]), s[2]) for rank, s in stats.items()}
        else:
            load = {s[0].local_rank: (rank, s[1], s[2]) for rank, s in stats.items()}
        gpus = self.backend.sample(now, load)
        if self.backend.simulated:
            for rank, s in stats.items():
                rank_gpu[rank] = (s[0].local_rank, "sim")
        else:
            nvml_pids = self.backend.processes() if gpus else {}
            foreign = self._foreign(nvml_pids)
            known = {g.index for g in gpus}
            for rank, s in stats.items():
                r = s[0]
                idx = nvml_pids.get(r.pid)
                dev = self._rank_device(r, gpus) if idx is None or foreign else None
                if idx is not None and foreign and dev is not None and dev.sure and dev.index in known and dev.index != idx:
                    idx = None  # in a namespace, a host pid that is our rank's number by chance: the device wins
                if idx is not None:
                    rank_gpu[rank] = (idx, "nvml")
                    continue
                assert dev is not None
                if dev.index is None or dev.index not in known:
                    rank_gpu[rank] = (None, "")  # no GPU here by its environment: no mapping
                elif not dev.sure:
                    rank_gpu[rank] = (dev.index, "guess")
                else:
                    # NVML's pids cannot be ours: the device is all there is to go by
                    rank_gpu[rank] = (dev.index, "device" if foreign else "env")
            by_gpu: dict[int, list[int]] = {}
            for rank, (idx, _) in rank_gpu.items():
                if idx is not None:
                    by_gpu.setdefault(idx, []).append(rank)
            gpus = [
                replace(g, ranks=tuple(sorted(by_gpu.get(g.index, ()))),
                        pids=tuple(sorted(p for p, i in nvml_pids.items() if i == g.index)),
                        mapping=_mapping(by_gpu.get(g.index, ()), rank_gpu))
                for g in gpus
            ]
            for idx in self.backend.lost_gpus():
                if idx not in self._lost_reported:
                    self._lost_reported.add(idx)
                    on = sorted(by_gpu.get(idx, ()))
                    out.append(AlarmEvent(now, type="gpu", id="gpu-lost", ranks=tuple(on), culprits=tuple(on),
                                          message=gpu_lost_words(idx, on), node=self.node))
            for x in self.backend.xid_errors():
                on = sorted(by_gpu.get(x.index, ()))
                out.append(AlarmEvent(now, type="gpu", id="xid", ranks=tuple(on), culprits=tuple(on),
                                      message=xid_words(x.xid, x.index), node=self.node))
        out.extend(gpus)
        for rank, (r, cpu, rss, status, threads, nkids, kid_cpu) in sorted(stats.items()):
            idx, how = rank_gpu.get(rank, (None, ""))
            out.append(ProcEvent(now, rank=rank, pid=r.pid, cpu=round(cpu, 1), rss=rss, status=status,
                                 threads=threads, children=nkids, children_cpu=round(kid_cpu, 1),
                                 gpu=idx, gpu_mapping=how, node=self.node))
        return out


def _mapping(ranks_on_gpu, rank_gpu) -> str:
    """A GPU's mapping: its weakest rank's."""
    hows = {rank_gpu[r][1] for r in ranks_on_gpu}
    if not hows:
        return ""
    for h in ("guess", "env", "device", "nvml"):
        if h in hows:
            return h
    return ""


def make_backend(mode: str, node: str = "") -> GpuBackend:
    """``auto``: NVML when it initialises, else none.  ``sim``: simulated."""

    if mode == "sim":
        return SimBackend(node)

    b = NvmlBackend(node=node)
    if mode == "none":
        b.error = "GPU sampling turned off (--gpu none)"
    else:
        b.init()
    return b
