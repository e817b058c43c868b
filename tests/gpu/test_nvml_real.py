"""Real NVML on a real GPU.  Skipped where NVML does not initialise (CI, laptops).

Run on a GPU machine:  python3 -m pytest -q tests/gpu
"""

import os
import subprocess
import sys
import time

import pytest

from ddptop.core.sources.gpu_nvml import NvmlBackend
from ddptop.core.sources.telemetry import RankProc, Telemetry

backend = NvmlBackend()
pytestmark = pytest.mark.skipif(not backend.init(), reason=f"no NVML here: {backend.error}")

MATMUL = r"""
import time, torch
x = torch.randn(8192, 8192, device="cuda:0")
print("ready", flush=True)
t = time.time()
while time.time() - t < 25:
    y = x @ x
torch.cuda.synchronize()
"""


def test_static_facts_and_fields_of_every_gpu():
    evs = backend.sample()
    assert len(evs) == len(backend.devices) >= 1
    for e in evs:
        assert e.name and e.mem_total and e.mem_total > 0
        assert e.util is not None and 0 <= e.util <= 100
        assert not e.simulated and not e.lost
    print("\n".join(f"GPU {e.index}: {e.name} util {e.util}% mem {e.mem_used / 2**30:.1f}/{e.mem_total / 2**30:.1f} GiB "
                    f"power {e.power_w} W / {e.power_limit_w} W temp {e.temp_c} C sm {e.sm_clock_mhz} MHz "
                    f"pcie gen{e.pcie_gen} x{e.pcie_width} throttle {e.throttle}" for e in evs))


def test_matmul_child_is_mapped_to_its_gpu_and_utilisation_rises():
    pytest.importorskip("torch")
    p = subprocess.Popen([sys.executable, "-c", MATMUL], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0")))
    try:
        assert p.stdout.readline().strip() == "ready"
        tel = Telemetry(backend)
        rank = RankProc(rank=0, local_rank=0, pid=p.pid)
        best = None
        deadline = time.time() + 20
        while time.time() < deadline:
            evs = tel.tick([rank])
            procs = [e for e in evs if e.kind == "proc"]
            gpus = {e.index: e for e in evs if e.kind == "gpu"}
            if procs and procs[0].gpu is not None and procs[0].gpu_mapping == "nvml":
                g = gpus[procs[0].gpu]
                if g.util is not None and g.util > 50:
                    best = (procs[0], g)
                    break
            time.sleep(1)
        assert best is not None, "the matmul process was never seen on a busy GPU through NVML"
        proc, g = best
        assert 0 in g.ranks and p.pid in g.pids
        print(f"pid {p.pid} -> GPU {proc.gpu} ({proc.gpu_mapping}); util {g.util}%, power {g.power_w} W")
    finally:
        p.kill()
        p.wait(30)


def test_link_facts_and_health_of_every_gpu():
    from ddptop.core.tools.p2p_bench import link_rates

    facts = backend.links()
    health = backend.health()
    assert set(facts) == set(health) == {d.index for d in backend.devices if not d.lost}
    rates = link_rates(facts)
    print("\n" + "\n".join(rates.lines))
    for i, f in facts.items():
        cur = next(e for e in backend.sample() if e.index == i)
        assert f.pcie_gen and f.pcie_width and f.pcie_gen >= (cur.pcie_gen or 0)  # the maximum, not the idle state
        assert rates.memory[i] and 100 < rates.memory[i] < 20000  # GB/s: any GPU from a T4 to a B200
        assert f.bus and f.bus == f.bus.lower() and f.cc
        print(f"GPU {i} health: {health[i]}")


IN_POD = r"""
import json, os, subprocess, sys, time
from ddptop.core.sources import proc_tree as procs
from ddptop.core.sources.gpu_nvml import NvmlBackend
from ddptop.core.sources.telemetry import RankProc, Telemetry
uuid, matmul, hide = sys.argv[1], sys.argv[2], sys.argv[3] == "hide"
backend = NvmlBackend()
if hide:  # no PID namespace to be had: as a driver that lists no process inside a container
    procs.pid_namespace = lambda proc="/proc": True
    backend.processes = lambda: {}
child = subprocess.Popen([sys.executable, "-c", matmul], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES=uuid, LOCAL_RANK="0"))
assert child.stdout.readline().strip() == "ready"
tel = Telemetry(backend)
seen = {}
deadline = time.time() + 20
while time.time() < deadline:
    evs = tel.tick([RankProc(rank=0, local_rank=0, pid=child.pid)])
    proc = next(e for e in evs if e.kind == "proc")
    gpus = {e.index: e for e in evs if e.kind == "gpu"}
    g = gpus.get(proc.gpu)
    seen = {"gpu": proc.gpu, "mapping": proc.gpu_mapping, "util": g.util if g else None,
            "ranks": list(g.ranks) if g else None, "gpu_mapping": g.mapping if g else None}
    if g is not None and g.util is not None and g.util > 50:
        break
    time.sleep(1)
seen.update(ns=procs.pid_namespace(), child=child.pid, nvml_pids=sorted(backend.processes()))
child.kill()
print(json.dumps(seen))
"""


def test_a_rank_given_its_gpu_by_uuid_maps_to_it_by_device():
    """A rank started with CUDA_VISIBLE_DEVICES=<a GPU's UUID> (as the Kubernetes
    device plugin and many clusters give GPUs) maps to that GPU by device, with
    its utilisation: the whole UUID, a leading part of it, and a matmul rank
    watched from a PID namespace of its own (unshare, as in a pod), where
    NVML's pids are the host's.  Where no namespace can be made, NVML's process
    list is hidden instead (as a driver that lists none in a container)."""
    pytest.importorskip("torch")
    import json
    import shutil

    from ddptop.core.sources.gpu_visible import Gpu, rank_device

    evs = backend.sample()
    target = next(e for e in reversed(evs) if not e.lost)  # the last GPU: not GPU 0 where there are several
    assert target.uuid.startswith("GPU-"), target.uuid
    assert backend.device_index(target.uuid) == target.index
    others = [e.uuid for e in evs if e.index != target.index]
    prefix = next(target.uuid[:n] for n in range(12, len(target.uuid) + 1)
                  if not any(u.startswith(target.uuid[:n]) for u in others))
    assert backend.device_index(prefix) == target.index
    gpus = [Gpu(e.index, e.uuid, e.name) for e in evs]
    dev = rank_device({"CUDA_VISIBLE_DEVICES": target.uuid}, 0, gpus, backend.device_index)
    assert (dev.index, dev.sure, dev.by) == (target.index, True, "uuid")

    unshare = [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
    try:
        pod = subprocess.run([*unshare, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        pod = False
    cmd = [sys.executable, "-c", IN_POD, target.uuid, MATMUL, "pod" if pod else "hide"]
    p = subprocess.run([*unshare, *cmd] if pod else cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"\n{'in a PID namespace' if pod else 'NVML process list hidden'}: {r}")
    assert r["gpu"] == target.index and r["ranks"] == [0], r
    assert r["util"] is not None and r["util"] > 50, r
    if pod and r["child"] in r["nvml_pids"]:  # a driver that gives pids in the caller's namespace
        assert r["mapping"] == "nvml", r
    else:
        assert r["ns"] is True and (r["mapping"], r["gpu_mapping"]) == ("device", "device"), r
