"""`ddptop bench p2p`: the arithmetic (bandwidths, link rates, CUDA devices matched to NVML GPUs, timing).

(What runs processes: tests/integration/test_bench_p2p_e2e.py.)"""

import time

import pytest

import fake_nvml
from ddptop.core.tools.p2p_bench import _nvml_index, algbw, busbw, link_rates, memory_rate, nvlink_link_rate, pcie_rate, percent
from ddptop.core.sources.gpu_nvml import NvmlBackend


def test_bandwidth_arithmetic_against_hand_computed_values():
    # 1 GB all-reduced in 0.5 s on 8 ranks: algbw 2 GB/s, busbw 2 x 2*7/8 = 3.5 GB/s (nccl-tests' factor)
    assert algbw(10 ** 9, 0.5) == pytest.approx(2.0)
    assert busbw(10 ** 9, 0.5, 8) == pytest.approx(3.5)
    assert busbw(10 ** 9, 0.5, 2) == pytest.approx(2.0)  # 2 ranks: factor 1
    assert busbw(10 ** 9, 0.5, 1) == pytest.approx(2.0)
    # PCIe gen4 x16: 16 x 1.969 GB/s = 31.5 GB/s per direction; gen3 x8: 7.88
    assert pcie_rate(4, 16) == pytest.approx(31.504)
    assert pcie_rate(3, 8) == pytest.approx(7.88)
    assert pcie_rate(None, 16) is None and pcie_rate(9, 16) is None
    assert percent(25.2, 31.5) == pytest.approx(80.0) and percent(1.0, None) is None


def rates_of(gpus):
    b = NvmlBackend(lib=fake_nvml.make(gpus))
    return link_rates(b.links())


def bus(i):  # fake_nvml's default bus id of GPU i
    return f"00000000:{0x10 + i:02X}:00.0"


def test_link_rates_of_an_nvswitch_box_use_nvlink_max_pcie_and_hbm():
    # 8 x H100 SXM, 18 NVLinks each to the NVSwitches, PCIe idling at gen 1
    switch = "00000000:C1:00.0"
    gpus = [fake_nvml.FakeGpu(gen=1, max_gen=5, nvlinks=[switch] * 18) for _ in range(8)]
    r = rates_of(gpus)
    # 18 links x 25 GB/s = 450 GB/s per direction (NVIDIA: 900 GB/s both ways)
    assert r.pair[(0, 7)] == pytest.approx(450.0) and r.nvlink[(3, 5)] == 18
    # PCIe at its maximum, gen 5 x16 = 16 x 3.938 = 63.0 GB/s, not the idle gen 1 x16 = 4 GB/s
    assert r.pcie[0] == pytest.approx(63.008)
    # HBM3: 5120 bits x 2619 MHz x 2 / 8 = 3352 GB/s (the H100 SXM data sheet's 3.35 TB/s)
    assert r.memory[0] == pytest.approx(3352.32)
    assert r.lines[0] == "GPU 0: PCIe gen5 x16 (63.0 GB/s), NVLink x18 (18 to switches) (450 GB/s), memory 3352 GB/s"


def test_link_rates_of_a_direct_nvlink_mesh_and_a_pcie_only_gpu():
    # V100s (NVLink 2, 25 GB/s a link): GPU 0 has 2 links to GPU 1 and one to GPU 2; GPU 3 has no NVLink
    gpus = [fake_nvml.FakeGpu(cc=(7, 0), gen=3, nvlinks=[bus(1), bus(1), bus(2)]),
            fake_nvml.FakeGpu(cc=(7, 0), gen=3, nvlinks=[bus(0), bus(0)]),
            fake_nvml.FakeGpu(cc=(7, 0), gen=3, nvlinks=[bus(0)]),
            fake_nvml.FakeGpu(cc=(7, 0), gen=3, width=8)]
    r = rates_of(gpus)
    assert r.pair[(0, 1)] == pytest.approx(50.0) and r.pair[(1, 0)] == pytest.approx(50.0)
    assert r.pair[(0, 2)] == pytest.approx(25.0)
    # no NVLink between 1 and 2: the slower PCIe end, gen3 x16 = 15.76 GB/s
    assert (1, 2) not in r.nvlink and r.pair[(1, 2)] == pytest.approx(15.76)
    assert r.pair[(0, 3)] == pytest.approx(7.88)  # GPU 3 sits on gen3 x8
    assert nvlink_link_rate("10.0") == 50.0 and nvlink_link_rate("8.9") is None and nvlink_link_rate(None) is None
    assert memory_rate(384, 10501) == pytest.approx(1008.096)  # an RTX 4090: 384 x 10501 x 2 / 8, its data sheet 1008 GB/s
    assert memory_rate(None, 2619) is None


def test_cuda_devices_are_matched_to_nvml_gpus_by_bus_id():
    r = rates_of([fake_nvml.FakeGpu(), fake_nvml.FakeGpu(), fake_nvml.FakeGpu()])
    # CUDA_VISIBLE_DEVICES=2,0: cuda:0 is NVML GPU 2, cuda:1 is GPU 0
    info = {"gpus": 2, "buses": ["0000:12:00.0", "0000:10:00.0"]}
    assert _nvml_index(info, r) == {0: 2, 1: 0}
    assert _nvml_index({"gpus": 2, "buses": [None, None]}, r) == {0: 0, 1: 1}


def test_timing_repeats_a_fast_copy_until_launch_and_sync_are_a_small_part():
    """The copy workers time many calls of a fast operation (a 256 MiB copy
    takes 0.1 ms at H100 memory bandwidth) and few of a slow one."""
    import torch

    from ddptop._inject.bench_worker import _timed

    a = torch.zeros(1)
    b = torch.empty_like(a)
    _, fast = _timed(torch, lambda: b.copy_(a), 10, target=0.05, most=500)
    _, slow = _timed(torch, lambda: time.sleep(0.02), 3, target=0.05)
    assert fast >= 100 and slow == 3  # (500 unless one 4-byte copy took over 0.1 ms)
