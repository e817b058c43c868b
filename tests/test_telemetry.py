"""NVML layer against a fake pynvml; psutil and the simulator on real processes."""

import os
import subprocess
import sys

import pynvml
import pytest

import fake_nvml
from helpers import favour, wait_for
from ddptop.core.events import AlarmEvent, GpuEvent, GpuStatusEvent, ProcEvent
from ddptop.core.gpu.nvml import NvmlBackend
from ddptop.core.gpu.sim import SimBackend
from ddptop.core.telemetry import RankProc, Telemetry, gpu_from_env


def gpus_of(events):
    return {e.index: e for e in events if isinstance(e, GpuEvent)}


def test_no_driver_is_a_normal_state_with_a_reason():
    b = NvmlBackend(fake_nvml.make([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert b.sample() == [] and b.processes() == {}
    assert b.status() == ("none", "no NVIDIA driver (libnvidia-ml not found)")
    ev = Telemetry(b).tick([])
    assert [type(e) for e in ev] == [GpuStatusEvent]
    assert ev[0].backend == "none" and "no NVIDIA driver" in ev[0].message


def test_driver_not_loaded():
    b = NvmlBackend(fake_nvml.make([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert b.status() == ("none", "no NVIDIA driver loaded")


def test_fields_and_static_facts():
    g = fake_nvml.FakeGpu(util=97, throttle=pynvml.nvmlClocksThrottleReasonSwPowerCap | pynvml.nvmlClocksThrottleReasonGpuIdle)
    b = NvmlBackend(fake_nvml.make([g]))
    (e,) = b.sample(now=1.0)
    assert (e.name, e.util, e.mem_util, e.mem_used, e.mem_total) == (g.name, 97.0, 20.0, g.used, g.total)
    assert (e.power_w, e.power_limit_w, e.temp_c, e.sm_clock_mhz, e.pcie_gen, e.pcie_width) == (300.0, 700.0, 55.0, 1980, 5, 16)
    assert e.throttle == ("sw-power-cap",)  # "idle" is not a problem worth showing
    assert not e.simulated and not e.lost


def test_unsupported_field_is_none_for_that_field_only_and_not_asked_again():
    calls = []
    g = fake_nvml.FakeGpu(unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEccErrors"})
    b = NvmlBackend(fake_nvml.make([g], calls=calls))
    e1 = b.sample()[0]
    assert e1.power_w is None and e1.ecc_uncorrected is None
    assert e1.util == 50.0 and e1.temp_c == 55.0
    n = calls.count("nvmlDeviceGetPowerUsage")
    b.sample()
    assert calls.count("nvmlDeviceGetPowerUsage") == n  # not re-asked every tick


def test_handles_and_static_facts_are_fetched_once():
    calls = []
    b = NvmlBackend(fake_nvml.make([fake_nvml.FakeGpu() for _ in range(8)], calls=calls))
    for _ in range(5):
        b.sample()
    assert calls.count("nvmlDeviceGetHandleByIndex") == 8
    assert calls.count("nvmlDeviceGetName") == 8
    assert calls.count("nvmlInit") == 1


def test_gpu_lost_mid_run_raises_one_alarm_and_the_others_go_on():
    gpus = [fake_nvml.FakeGpu(procs=[111]), fake_nvml.FakeGpu(procs=[222])]
    tel = Telemetry(NvmlBackend(fake_nvml.make(gpus)))
    # rank pids 111/222 don't exist here, so feed none; the mapping is tested below
    first = gpus_of(tel.tick([]))
    assert not first[1].lost
    gpus[1].lost = True
    ev = tel.tick([])
    alarms = [e for e in ev if isinstance(e, AlarmEvent)]
    assert len(alarms) == 1 and alarms[0].id == "gpu-lost" and "GPU 1" in alarms[0].message
    g = gpus_of(ev)
    assert g[1].lost and g[1].util is None
    assert not g[0].lost and g[0].util == 50.0
    ev = tel.tick([])
    assert not [e for e in ev if isinstance(e, AlarmEvent)]  # once, not every second
    assert gpus_of(ev)[1].lost


def test_rank_mapped_to_gpu_by_nvml_process_list():
    me = os.getpid()
    gpus = [fake_nvml.FakeGpu(), fake_nvml.FakeGpu(procs=[me])]
    ev = Telemetry(NvmlBackend(fake_nvml.make(gpus))).tick([RankProc(rank=3, local_rank=0, pid=me)])
    g = gpus_of(ev)
    assert g[1].ranks == (3,) and g[1].mapping == "nvml" and g[0].ranks == ()
    (p,) = [e for e in ev if isinstance(e, ProcEvent)]
    assert (p.rank, p.pid, p.gpu, p.gpu_mapping) == (3, me, 1, "nvml")


def test_mapping_is_a_guess_when_nvml_pids_are_from_another_namespace():
    me = os.getpid()
    gpus = [fake_nvml.FakeGpu(procs=[999999]), fake_nvml.FakeGpu()]
    ev = Telemetry(NvmlBackend(fake_nvml.make(gpus))).tick([RankProc(rank=0, local_rank=0, pid=me)])
    (p,) = [e for e in ev if isinstance(e, ProcEvent)]
    assert p.gpu_mapping == "guess"
    assert gpus_of(ev)[p.gpu].mapping == "guess" if p.gpu is not None else True


def test_gpu_from_env():
    assert gpu_from_env({}, 2) == 2
    assert gpu_from_env({"CUDA_VISIBLE_DEVICES": "4,5,6"}, 1) == 5
    assert gpu_from_env({"CUDA_VISIBLE_DEVICES": "GPU-abc"}, 0) is None


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
