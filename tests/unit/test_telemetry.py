"""NVML layer against a fake pynvml, and how a rank is mapped to its GPU.  (On real processes:
tests/integration/test_telemetry_procs_e2e.py.)"""

import os

import pynvml
import pytest

import fake_nvml
from fake_nvml import UUIDS
from ddptop.core.model.events import AlarmEvent, GpuEvent, GpuStatusEvent, ProcEvent
from ddptop.core.sources.gpu_nvml import NvmlBackend
from ddptop.core.sources import proc_tree as procs_mod
from ddptop.core.sources.gpu_visible import Gpu, cuda_ids, match_uuid, rank_device
from ddptop.core.sources.telemetry import RankProc, Telemetry


@pytest.fixture(autouse=True)
def _on_the_host(monkeypatch):
    """ddptop as on a host (not in a PID namespace), whatever the test runs in (an xdist worker runs in a PID
    namespace of its own); the tests about namespaces say otherwise themselves."""
    from ddptop.core.sources import proc_tree as procs_mod

    monkeypatch.setattr(procs_mod, "pid_namespace", lambda proc="/proc": False)


_REAL_PID_NAMESPACE = procs_mod.pid_namespace


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


def test_cuda_ids_and_uuid_prefixes_as_cuda_reads_them():
    assert cuda_ids("0, 2 ,GPU-ab,MIG-cd") == ["0", "2", "GPU-ab", "MIG-cd"]
    assert cuda_ids("0,2,-1,1") == ["0", "2"]  # CUDA's own example: device 1 is hidden
    assert cuda_ids("") == [] and cuda_ids("NoDevFiles") == []
    uuids = {u: i for i, u in enumerate(UUIDS)}
    assert match_uuid(UUIDS[3], uuids) == 3 and match_uuid(UUIDS[3].upper(), uuids) == 3
    assert match_uuid("GPU-8f3c9", uuids) == 1
    assert match_uuid("GPU-8f3c", uuids) is None  # GPU 0 and 1 both start so: CUDA refuses it too
    assert match_uuid("8f3c9b77", uuids) is None and match_uuid("GPU-", uuids) is None


def test_rank_device_in_a_container_that_sees_only_its_own_gpus():
    """NVIDIA_VISIBLE_DEVICES=5,7 on the host; inside, NVML sees two GPUs numbered 0 and 1."""
    gpus = [Gpu(0, UUIDS[0], "H100"), Gpu(1, UUIDS[1], "H100")]
    none = lambda ident: None
    for lr in (0, 1):
        d = rank_device({"NVIDIA_VISIBLE_DEVICES": "5,7"}, lr, gpus, none)
        assert (d.index, d.sure, d.by) == (lr, True, "local_rank"), d
    d = rank_device({"NVIDIA_VISIBLE_DEVICES": "5,7", "CUDA_VISIBLE_DEVICES": "1"}, 0, gpus, none)
    assert (d.index, d.sure, d.by) == (1, True, "index")
    one = rank_device({"NVIDIA_VISIBLE_DEVICES": "GPU-x"}, 1, gpus[:1], lambda i: 0)
    assert (one.index, one.sure) == (0, False)  # two ranks on a one-GPU pod: the second may share it


def test_pid_namespace_from_proc(tmp_path):
    def fake_proc(nspid, ns):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        (d / "self" / "ns").mkdir(parents=True)
        (d / "self" / "status").write_text(f"Name:\tpython\nNSpid:\t{nspid}\nNSpgid:\t1\n")
        if ns is not None:
            os.symlink(ns, d / "self" / "ns" / "pid")
        return str(d)

    assert _REAL_PID_NAMESPACE(fake_proc("4486", "pid:[4026531836]")) is False  # the kernel's first
    assert _REAL_PID_NAMESPACE(fake_proc("1", "pid:[4026532179]")) is True  # a container's: NSpid is 1
    assert _REAL_PID_NAMESPACE(fake_proc("83412\t7", "pid:[4026531836]")) is True  # seen from outside
    assert _REAL_PID_NAMESPACE(fake_proc("7", None)) is None
    assert _REAL_PID_NAMESPACE(str(tmp_path / "none")) is None
    assert _REAL_PID_NAMESPACE() in (True, False)  # this machine's /proc says one or the other
