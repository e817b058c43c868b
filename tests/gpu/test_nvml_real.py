"""Real NVML on a real GPU.  Skipped where NVML does not initialise (CI, laptops).

Run on a GPU machine:  python3 -m pytest -q tests/gpu
"""

import os
import subprocess
import sys
import time

import pytest

from ddptop.core.gpu.nvml import NvmlBackend
from ddptop.core.telemetry import RankProc, Telemetry

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
    from ddptop.core.gpu_bench import link_rates

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
