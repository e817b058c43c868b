"""Telemetry on real processes: ranks mapped to GPUs (a fake pynvml) across PID namespaces and
containers, and psutil's figures of busy and sleeping processes.  (The pure parts: tests/unit/test_telemetry.py.)"""

import os
import subprocess
import sys

import psutil
import pytest

import fake_nvml
from fake_nvml import UUIDS
from helpers import favour, wait_for
from ddptop.core.model.events import GpuEvent, ProcEvent
from ddptop.core.sources.gpu_nvml import NvmlBackend
from ddptop.core.sources.gpu_sim import SimBackend
from ddptop.core.sources import proc_tree as procs_mod
from ddptop.core.sources.telemetry import RankProc, Telemetry


@pytest.fixture(autouse=True)
def _on_the_host(monkeypatch):
    """ddptop as on a host (not in a PID namespace), whatever the test runs in (an xdist worker runs in a PID
    namespace of its own); the tests about namespaces say otherwise themselves."""
    from ddptop.core.sources import proc_tree as procs_mod

    monkeypatch.setattr(procs_mod, "pid_namespace", lambda proc="/proc": False)


def gpus_of(events):
    return {e.index: e for e in events if isinstance(e, GpuEvent)}


def test_nvml_pids_from_another_namespace_map_the_rank_by_its_device(monkeypatch):
    """NVML lists a pid that is no process here (a host pid, seen from a pod): the
    rank is mapped by the GPU its environment gives it, and says so ("device")."""
    monkeypatch.setattr(procs_mod, "pid_namespace", lambda proc="/proc": False)  # only NVML's pids tell
    (host,) = host_pids(1)
    gpus = [fake_nvml.FakeGpu(procs=[host]), fake_nvml.FakeGpu()]
    rank = start_rank({"CUDA_VISIBLE_DEVICES": "1"})
    try:
        ev = Telemetry(NvmlBackend(fake_nvml.make(gpus))).tick([RankProc(rank=0, local_rank=0, pid=rank.pid)])
    finally:
        rank.kill()
        rank.wait(10)
    (p,) = [e for e in ev if isinstance(e, ProcEvent)]
    assert (p.gpu, p.gpu_mapping) == (1, "device")
    assert gpus_of(ev)[1].mapping == "device" and gpus_of(ev)[1].ranks == (0,)


def host_pids(n):
    """``n`` pids that are no process here, as a host's pids are seen from inside a pod."""
    out = []
    for pid in range(4_190_000, 4_194_000):
        if not psutil.pid_exists(pid):
            out.append(pid)
            if len(out) == n:
                return out
    raise AssertionError("no free pids")


MIG = "MIG-5f1e2d3c-4b5a-5968-8776-a5b4c3d2e1f0"


def four_gpus(host, name="NVIDIA H100 80GB HBM3"):
    """Four GPUs, each busy with a host pid (none of them a process here), GPU i at 10*(i+1) % util;
    GPU 3 is split into MIG devices, one of them MIG."""
    return [fake_nvml.FakeGpu(name=name, uuid=UUIDS[i], util=10 * (i + 1), procs=[host[i]],
                              mig=[MIG, "MIG-00000000-0000-0000-0000-000000000000"] if i == 3 else [])
            for i in range(4)]


def start_rank(env):
    """A rank process with exactly this environment (psutil reads it from /proc/PID/environ)."""
    keep = {k: os.environ[k] for k in ("PATH", "HOME", "LD_LIBRARY_PATH") if k in os.environ}
    argv = [sys.executable, "-c", "import time; time.sleep(120)"]
    p = subprocess.Popen(argv, env={**keep, **env})
    # (a child just forked has this process's environment until it has exec'd: under load, read too soon, it
    # was another rank's)
    wait_for(lambda: psutil.Process(p.pid).cmdline()[1:] == argv[1:], timeout=30, what="the rank's exec")
    return p


# (environment, LOCAL_RANK) -> the GPU (NVML index) the rank uses
RANK_ENVS = [
    ({"CUDA_VISIBLE_DEVICES": UUIDS[2]}, 0, 2),  # a device plugin's one-GPU UUID
    ({"CUDA_VISIBLE_DEVICES": f"{UUIDS[3]},{UUIDS[0]}"}, 1, 0),  # UUIDs, in the order given
    ({"CUDA_VISIBLE_DEVICES": "GPU-1d0e"}, 0, 2),  # a leading part naming one GPU, as CUDA takes it
    ({"CUDA_VISIBLE_DEVICES": "3,1"}, 0, 3),  # indexes
    ({"CUDA_VISIBLE_DEVICES": "3,1"}, 1, 1),
    ({"CUDA_VISIBLE_DEVICES": MIG}, 0, 3),  # a MIG device: its GPU
    ({"CUDA_VISIBLE_DEVICES": f"MIG-{UUIDS[1]}/1/0"}, 0, 1),  # the MIG form of drivers before R470
    ({}, 2, 2),  # nothing set: LOCAL_RANK
    ({"NVIDIA_VISIBLE_DEVICES": f"{UUIDS[3]},{UUIDS[1]}"}, 0, 1),  # the container runtime's: NVML's (bus) order
    ({"NVIDIA_VISIBLE_DEVICES": f"{UUIDS[3]},{UUIDS[1]}"}, 1, 3),
    ({"NVIDIA_VISIBLE_DEVICES": "2,3"}, 1, 3),  # host indexes, NVML sees the host's four
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, 1, 1),
    ({"NVIDIA_VISIBLE_DEVICES": UUIDS[0], "CUDA_VISIBLE_DEVICES": "0"}, 0, 0),  # CUDA's within the container's
    ({"NVIDIA_VISIBLE_DEVICES": f"{UUIDS[1]},{UUIDS[2]}", "CUDA_VISIBLE_DEVICES": "1"}, 0, 2),
]


def test_ranks_in_a_pod_map_to_gpus_by_device_with_their_utilisation(monkeypatch):
    """ddptop in a pod: NVML lists only host pids, none of them a process here.
    Each rank -- a real process with its own environment -- is mapped to the GPU
    its CUDA_VISIBLE_DEVICES (UUIDs, a UUID's leading part, indexes, a MIG id),
    NVIDIA_VISIBLE_DEVICES or LOCAL_RANK names, labelled "device", and gets
    that GPU's utilisation."""
    monkeypatch.setattr(procs_mod, "pid_namespace", lambda proc="/proc": None)  # /proc cannot say
    gpus = four_gpus(host_pids(4))
    kids = [start_rank(env) for env, _, _ in RANK_ENVS]
    try:
        tel = Telemetry(NvmlBackend(fake_nvml.make(gpus)))
        ranks = [RankProc(rank=r, local_rank=lr, pid=k.pid) for r, ((_, lr, _), k) in enumerate(zip(RANK_ENVS, kids))]
        ev = tel.tick(ranks)
        procs = {e.rank: e for e in ev if isinstance(e, ProcEvent)}
        got = {r: (procs[r].gpu, procs[r].gpu_mapping) for r in procs}
        assert got == {r: (want, "device") for r, (_, _, want) in enumerate(RANK_ENVS)}
        g = gpus_of(ev)
        assert all(x.mapping == "device" for x in g.values())
        assert {i: x.ranks for i, x in g.items()} == {
            i: tuple(r for r, (_, _, want) in enumerate(RANK_ENVS) if want == i) for i in range(4)}
        per_rank_util = {r: x.util for x in g.values() for r in x.ranks}
        assert per_rank_util == {r: 10.0 * (want + 1) for r, (_, _, want) in enumerate(RANK_ENVS)}
        assert set(g[0].pids) == {gpus[0].procs[0]}  # NVML's own (host) pids are still shown
    finally:
        for k in kids:
            k.kill()
            k.wait(10)


def test_in_a_pid_namespace_a_rank_maps_by_device_before_nvml_lists_anything(monkeypatch):
    """/proc says ddptop runs in a PID namespace of its own: NVML's pids cannot be
    ours even before it lists one (a driver may list nothing in a container)."""
    monkeypatch.setattr(procs_mod, "pid_namespace", lambda proc="/proc": True)
    gpus = [fake_nvml.FakeGpu(uuid=UUIDS[i], util=30 + i) for i in range(2)]
    k = start_rank({"CUDA_VISIBLE_DEVICES": UUIDS[1]})
    try:
        ev = Telemetry(NvmlBackend(fake_nvml.make(gpus))).tick([RankProc(rank=5, local_rank=0, pid=k.pid)])
        (p,) = [e for e in ev if isinstance(e, ProcEvent)]
        assert (p.gpu, p.gpu_mapping) == (1, "device")
        assert gpus_of(ev)[1].ranks == (5,) and gpus_of(ev)[1].util == 31.0
    finally:
        k.kill()
        k.wait(10)


def test_in_a_namespace_a_host_pid_equal_to_a_ranks_by_chance_does_not_move_it(monkeypatch):
    """NVML's pids are the host's: one that happens to be a rank's pid here is
    believed only where the rank's device agrees (a driver that gives pids in
    the caller's namespace)."""
    monkeypatch.setattr(procs_mod, "pid_namespace", lambda proc="/proc": True)
    a = start_rank({"CUDA_VISIBLE_DEVICES": UUIDS[1]})
    b = start_rank({"CUDA_VISIBLE_DEVICES": UUIDS[0]})
    try:
        gpus = [fake_nvml.FakeGpu(uuid=UUIDS[0], procs=[a.pid, b.pid]), fake_nvml.FakeGpu(uuid=UUIDS[1])]
        ev = Telemetry(NvmlBackend(fake_nvml.make(gpus))).tick([RankProc(0, 0, a.pid), RankProc(1, 0, b.pid)])
        procs = {e.rank: (e.gpu, e.gpu_mapping) for e in ev if isinstance(e, ProcEvent)}
        assert procs == {0: (1, "device"), 1: (0, "nvml")}
    finally:
        for k in (a, b):
            k.kill()
            k.wait(10)


def test_outside_a_namespace_the_environment_is_env_and_nvml_pids_win(monkeypatch):
    """On the host, a rank that is on NVML's list is mapped by its pid ("nvml"),
    whatever its environment says; one not on it (yet) by its environment ("env"),
    while NVML's other pids are processes here."""
    monkeypatch.setattr(procs_mod, "pid_namespace", lambda proc="/proc": False)
    on = start_rank({"CUDA_VISIBLE_DEVICES": UUIDS[0]})
    off = start_rank({"CUDA_VISIBLE_DEVICES": UUIDS[1]})
    try:
        gpus = [fake_nvml.FakeGpu(uuid=UUIDS[0], procs=[os.getpid()]), fake_nvml.FakeGpu(uuid=UUIDS[1], procs=[on.pid])]
        ev = Telemetry(NvmlBackend(fake_nvml.make(gpus))).tick([RankProc(0, 0, on.pid), RankProc(1, 1, off.pid)])
        procs = {e.rank: (e.gpu, e.gpu_mapping) for e in ev if isinstance(e, ProcEvent)}
        assert procs == {0: (1, "nvml"), 1: (1, "env")}
        assert gpus_of(ev)[1].mapping == "env" and gpus_of(ev)[1].ranks == (0, 1)  # the weaker of its two
    finally:
        for k in (on, off):
            k.kill()
            k.wait(10)


def test_what_the_environment_leaves_open_is_a_guess_and_what_it_hides_no_mapping(monkeypatch):
    monkeypatch.setattr(procs_mod, "pid_namespace", lambda proc="/proc": True)
    gpus = [fake_nvml.FakeGpu(name="NVIDIA H100 80GB HBM3", uuid=UUIDS[0]),
            fake_nvml.FakeGpu(name="NVIDIA A100-SXM4-80GB", uuid=UUIDS[1])]
    envs = [({"CUDA_VISIBLE_DEVICES": "1"}, 0),  # CUDA numbers mixed models fastest first, NVML by bus
            ({"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, 0),  # ... unless told
            ({"CUDA_VISIBLE_DEVICES": "0,1"}, 3),  # LOCAL_RANK past the list
            ({"CUDA_VISIBLE_DEVICES": ""}, 0),  # no GPU
            ({"CUDA_VISIBLE_DEVICES": "-1,0"}, 0),  # CUDA stops at -1: no GPU
            ({"CUDA_VISIBLE_DEVICES": "GPU-ffff"}, 0),  # no such GPU here
            ({"NVIDIA_VISIBLE_DEVICES": "none"}, 0)]
    kids = [start_rank(env) for env, _ in envs]
    try:
        ev = Telemetry(NvmlBackend(fake_nvml.make(gpus))).tick([RankProc(r, lr, k.pid) for r, ((_, lr), k) in
                                                                enumerate(zip(envs, kids))])
        procs = {e.rank: (e.gpu, e.gpu_mapping) for e in ev if isinstance(e, ProcEvent)}
        assert procs == {0: (1, "guess"), 1: (1, "device"), 2: (None, ""), 3: (None, ""), 4: (None, ""),
                         5: (None, ""), 6: (None, "")}
        assert gpus_of(ev)[1].mapping == "guess"
    finally:
        for k in kids:
            k.kill()
            k.wait(10)


@pytest.mark.serial  # a busy loop's CPU use over 50% of a core: not with other workers' jobs on the cores
def test_proc_stats_of_real_processes_busy_and_sleeping():
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<120: pass"])
    favour(busy.pid)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        tel = Telemetry(SimBackend("n"), "n")
        ranks = [RankProc(0, 0, busy.pid), RankProc(1, 1, idle.pid)]
        tel.tick(ranks)

        def busy_seen():
            # each tick's CPU % is over the time since the last one: on a loaded
            # machine the busy process may take a while to get half a core, and the
            # idle one's start-up (on a CPU or waiting for one) may still be in the
            # interval its simulated GPU reads
            ev = tel.tick(ranks)
            procs = {e.rank: e for e in ev if isinstance(e, ProcEvent)}
            gpus = gpus_of(ev)
            return ((procs[0].cpu or 0) > 50 and (gpus[0].util or 0) > 50 and procs[1].cpu is not None
                    and procs[1].cpu < 10 and gpus[1].util is not None and gpus[1].util < 10 and (procs, gpus))

        procs, gpus = wait_for(busy_seen, timeout=60, interval=1.0,
                               what="the busy process at over 50% CPU, the sleeping one under 10%")
        assert procs[0].cpu > 50 and procs[1].cpu < 10
        assert procs[0].rss > 1_000_000 and procs[0].threads >= 1 and procs[0].status in ("running", "sleeping")
        assert procs[1].status == "sleeping"
        assert gpus[0].simulated and "SIMULATED" in gpus[0].name
        assert gpus[0].util > 50 and gpus[1].util < 10
        assert gpus[0].ranks == (0,) and gpus[1].ranks == (1,)
    finally:
        busy.kill(); idle.kill(); busy.wait(10); idle.wait(10)
