"""`ddptop doctor`: every row against fixture data (a fake NVML, fake sysfs trees,
fake statvfs / rlimits, env dicts), the exit code, --json, and a real run here.

(What runs processes: tests/integration/test_doctor_e2e.py.)"""

import importlib.metadata
import json
import resource
import socket
import types
from pathlib import Path

import pynvml
import pytest

import fake_nvml
from ddptop.core.sources import proc_torchrun as torchrun
from ddptop.core.tools import doctor as d
from ddptop.core.sources.gpu_nvml import NvmlBackend

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
NO_SUPPORT = pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED


def topo(gpus, **kw):
    b = NvmlBackend(lib=fake_nvml.make(gpus, **kw))
    return b.topology(), b.error


# -- NVML topology and the GPU rows ------------------------------------------------------


def test_topology_reads_cc_versions_p2p_and_ancestors_through_nvml():
    gpus = [fake_nvml.FakeGpu(), fake_nvml.FakeGpu(), fake_nvml.FakeGpu(name=A100, cc=(8, 0))]
    t, err = topo(gpus, driver="535.104.05", cuda=12020, p2p={(0, 2): (NO_SUPPORT, NO_SUPPORT, 5)},
                  levels={(0, 1): 0, (0, 2): 50, (1, 2): 30}, p2p_default=(0, 0, 0))
    assert err is None
    assert t.driver == "535.104.05" and t.cuda_driver == "12.2"
    assert [(g.index, g.name, g.cc) for g in t.gpus] == [(0, H100, "9.0"), (1, H100, "9.0"), (2, A100, "8.0")]
    pairs = {(p.a, p.b): p for p in t.pairs}
    assert set(pairs) == {(0, 1), (0, 2), (1, 2)}
    assert (pairs[0, 1].read, pairs[0, 1].nvlink, pairs[0, 1].ancestor) == ("ok", "ok", "same board")
    assert (pairs[0, 2].read, pairs[0, 2].write, pairs[0, 2].ancestor) == (
        "chipset not supported", "chipset not supported", "other CPU socket")
    assert pairs[1, 2].ancestor == "host bridge"


def test_no_driver_skips_every_gpu_row_with_the_reason():
    t, err = topo([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert t is None and err == "no NVIDIA driver (libnvidia-ml not found)"
    for r in (d.check_gpus(t, err), d.check_p2p(t, err), d.check_versions(t, err, d.Packages(torch="2.4.0+cu121",
                                                                                              torch_cuda="12.1"))):
        assert r.status == "skipped"
        assert "no NVIDIA driver (libnvidia-ml not found)" in r.summary


def test_mixed_gpu_models_warn_and_name_the_fix():
    t, err = topo([fake_nvml.FakeGpu(), fake_nvml.FakeGpu(name=A100, cc=(8, 0)), fake_nvml.FakeGpu()])
    r = d.check_gpus(t, err)
    assert r.status == "warn"
    assert "2x NVIDIA H100 80GB HBM3" in r.summary and "1x NVIDIA A100-SXM4-80GB" in r.summary
    assert "compute capabilities 8.0, 9.0" in r.summary
    assert "GPU 1: NVIDIA A100-SXM4-80GB, compute capability 8.0" in r.evidence
    assert "SIGSEGV" in r.advice and "CUDA_VISIBLE_DEVICES=0,2" in r.advice


def test_same_model_with_different_compute_capability_also_warns():
    t, err = topo([fake_nvml.FakeGpu(cc=(9, 0)), fake_nvml.FakeGpu(cc=(8, 9))])
    assert d.check_gpus(t, err).status == "warn"


def test_identical_gpus_are_ok():
    t, err = topo([fake_nvml.FakeGpu() for _ in range(4)])
    r = d.check_gpus(t, err)
    assert (r.status, r.summary) == ("ok", "4 GPU(s): 4x NVIDIA H100 80GB HBM3, compute capability 9.0")
    assert r.data["count"] == 4


def test_a_lost_gpu_fails():
    t, err = topo([fake_nvml.FakeGpu(), fake_nvml.FakeGpu(lost=True)])
    r = d.check_gpus(t, err)
    assert r.status == "fail" and "GPU 1 lost" in r.summary


def test_p2p_row_flags_the_pairs_without_p2p():
    t, err = topo([fake_nvml.FakeGpu() for _ in range(3)], p2p={(2, 0): (NO_SUPPORT, NO_SUPPORT, 5)},
                  levels={(0, 2): 50})
    r = d.check_p2p(t, err)
    assert r.status == "warn" and r.summary == "P2P unavailable for 1 of 3 pair(s)"
    assert ("GPU 0 <-> GPU 2: read chipset not supported, write chipset not supported, NVLink not supported; "
            "via other CPU socket") in r.evidence
    assert "NCCL_P2P_DISABLE=1" in r.advice


def test_p2p_ok_everywhere_counts_nvlink_pairs():
    t, err = topo([fake_nvml.FakeGpu() for _ in range(2)], p2p_default=(0, 0, 0), level_default=0)
    r = d.check_p2p(t, err)
    assert (r.status, r.summary) == ("ok", "P2P read/write ok for all 1 pair(s), 1 over NVLink")


def test_p2p_needs_two_gpus():
    t, err = topo([fake_nvml.FakeGpu()])
    r = d.check_p2p(t, err)
    assert (r.status, r.summary) == ("skipped", "needs 2 GPUs, found 1")


# -- versions ----------------------------------------------------------------------------


class FakeMetadata:
    def __init__(self, versions, requires=()):
        self.versions, self.requires = versions, list(requires)

    def version(self, name):
        if name not in self.versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return self.versions[name]

    def distribution(self, name):
        self.version(name)
        return types.SimpleNamespace(requires=self.requires)


def test_torch_cuda_from_the_version_suffix_and_nccl_from_its_package():
    pk = d.read_packages(FakeMetadata({"torch": "2.4.0+cu121", "nvidia-nccl-cu12": "2.20.5"}),
                         probe=lambda: pytest.fail("metadata was enough"))
    assert (pk.torch_cuda, pk.nccl, pk.nccl_from) == ("12.1", "2.20.5", "package nvidia-nccl-cu12")


def test_torch_cuda_and_nccl_from_requires_dist_without_importing_torch():
    md = FakeMetadata({"torch": "2.5.1"}, ["nvidia-cuda-runtime-cu12==12.4.127; platform_system == 'Linux'",
                                           "nvidia-nccl-cu12==2.21.5; platform_system == 'Linux'", "filelock"])
    pk = d.read_packages(md, probe=lambda: pytest.fail("metadata was enough"))
    assert (pk.torch_cuda, pk.nccl) == ("12.4", "2.21.5")
    assert pk.torch_cuda_from == "torch requires nvidia-cuda-runtime-cu12==12.4.127"


def test_the_torch_subprocess_probe_only_when_metadata_cannot_tell():
    calls = []
    pk = d.read_packages(FakeMetadata({"torch": "2.3.0"}), probe=lambda: calls.append(1) or {"cuda": "11.8", "nccl": "2.18.1"})
    assert calls == [1] and (pk.torch_cuda, pk.nccl) == ("11.8", "2.18.1")
    pk = d.read_packages(FakeMetadata({"torch": "2.13.0+cpu"}), probe=lambda: pytest.fail("a CPU build has no NCCL"))
    assert pk.torch_cuda == "cpu"
    assert d.read_packages(FakeMetadata({})).torch is None


@pytest.mark.parametrize("torch_cuda, driver_cuda, status, words", [
    ("12.1", "12.4", "ok", ""),
    ("12.4", "12.2", "warn", "minor-version compatibility"),
    ("12.1", "11.8", "fail", "CUDA will not initialise"),
    ("cpu", "12.4", "warn", "CPU-only build"),
])
def test_torch_cuda_against_the_driver(torch_cuda, driver_cuda, status, words):
    t, err = topo([fake_nvml.FakeGpu()], cuda=int(driver_cuda.split(".")[0]) * 1000 + int(driver_cuda.split(".")[1]) * 10)
    r = d.check_versions(t, err, d.Packages(torch="2.4.0", torch_cuda=torch_cuda, nccl="2.20.5"))
    assert r.status == status, r
    assert words in r.advice
    assert f"supports CUDA {driver_cuda} (NVML)" in r.evidence[0]


# -- known problems ----------------------------------------------------------------------


def test_the_shipped_known_problems_load_and_cite_public_sources():
    problems = d.load_known_problems()
    ids = {p.id for p in problems}
    assert "driver-545.23.08-ddp-p2p-hang" in ids
    for p in problems:
        assert p.source.startswith("https://github.com/"), p
        assert p.symptom and p.fix
    p545 = next(p for p in problems if p.id == "driver-545.23.08-ddp-p2p-hang")
    assert p545.source == "https://github.com/Lightning-AI/pytorch-lightning/issues/19425"
    assert "535" in p545.fix and "NCCL_P2P_DISABLE=1" in p545.fix


def test_the_known_problem_list_is_found():
    # (that a wheel ships it is checked in test_packaging.py)
    assert d.KNOWN_PROBLEMS.is_file()
    assert d.load_known_problems()


def test_driver_545_23_08_with_two_gpus_warns_with_its_source():
    t, err = topo([fake_nvml.FakeGpu(), fake_nvml.FakeGpu()], driver="545.23.08", cuda=12030)
    r = d.check_known_problems(d.load_known_problems(), t, err, "2.18.1", {})
    assert r.status == "warn"
    assert "driver-545.23.08-ddp-p2p-hang" in r.data["matched"]
    assert "driver-545-branch-p2p" in r.data["matched"]
    assert "driver-545.29.02-tensor-parallel-hang" not in r.data["matched"]
    assert "  source: https://github.com/Lightning-AI/pytorch-lightning/issues/19425" in r.evidence
    assert "roll the driver back to the 535 branch" in r.advice


def test_a_workaround_in_effect_turns_the_match_into_ok():
    t, err = topo([fake_nvml.FakeGpu(), fake_nvml.FakeGpu()], driver="545.23.08")
    r = d.check_known_problems(d.load_known_problems(), t, err, None, {"NCCL_P2P_DISABLE": "1"})
    assert r.status == "ok" and "worked around" in r.summary
    assert "driver-545.23.08-ddp-p2p-hang" in r.data["worked_around"]
    # ... and the environment row then does not call NCCL_P2P_DISABLE a mistake
    env = d.check_env({"NCCL_P2P_DISABLE": "1"}, needed={"NCCL_P2P_DISABLE"})
    assert env.status == "ok"


def test_one_gpu_or_another_driver_matches_nothing():
    problems = d.load_known_problems()
    t, err = topo([fake_nvml.FakeGpu()], driver="545.23.08")
    assert d.check_known_problems(problems, t, err, None, {}).status == "ok"
    t, err = topo([fake_nvml.FakeGpu(), fake_nvml.FakeGpu()], driver="550.54.15")
    r = d.check_known_problems(problems, t, err, "2.21.5", {})
    assert r.status == "ok" and r.data["matched"] == []


def test_gpu_name_and_nccl_range_entries():
    problems = d.load_known_problems()
    t, err = topo([fake_nvml.FakeGpu(name="NVIDIA GeForce RTX 4090") for _ in range(2)], driver="550.54.15")
    assert d.check_known_problems(problems, t, err, None, {}).data["matched"] == ["rtx-4090-multi-gpu-p2p-hang"]
    # NCCL-only entries match without any GPU
    r = d.check_known_problems(problems, None, "no NVIDIA driver", "2.19.3", {})
    assert r.status == "warn" and r.data["matched"] == ["nccl-2.19-cumem-alltoall-hang"]
    assert d.check_known_problems(problems, None, "x", "2.19.3", {"NCCL_CUMEM_ENABLE": "0"}).status == "ok"
    assert d.check_known_problems(problems, None, "x", "2.20.3", {}).status == "ok"
    r = d.check_known_problems(problems, None, "no NVIDIA driver", None, {})
    assert r.status == "skipped" and "no NVIDIA driver" in r.summary


def test_a_bad_entry_is_refused(tmp_path):
    f = tmp_path / "kp.toml"
    f.write_text('[[problem]]\nid = "x"\ndriver = "1"\nsymptom = "s"\nfix = "f"\n')
    with pytest.raises(d.KnownProblemsError, match="`source` is required"):
        d.load_known_problems(f)
    f.write_text('[[problem]]\nid = "x"\ndriver = "1"\nsymptom = "s"\nfix = "f"\nsource = "somewhere"\n')
    with pytest.raises(d.KnownProblemsError, match="https"):
        d.load_known_problems(f)
    f.write_text('[[problem]]\nid = "x"\nsymptom = "s"\nfix = "f"\nsource = "https://x.org/1"\n')
    with pytest.raises(d.KnownProblemsError, match="matches nothing"):
        d.load_known_problems(f)


# -- PCIe ACS and IOMMU from sysfs trees -------------------------------------------------------


def pci_tree(root: Path, devices: dict[str, tuple[str, bytes]]):
    for name, (cls, cfg) in devices.items():
        p = root / "sys/bus/pci/devices" / name
        p.mkdir(parents=True)
        (p / "class").write_text(cls + "\n")
        (p / "config").write_bytes(cfg)


def bridge_config(acs_ctl: int | None, size: int = 4096) -> bytes:
    cfg = bytearray(size)
    if acs_ctl is not None and size > 0x100:
        # an AER capability first, pointing at ACS at 0x148
        cfg[0x100:0x104] = (0x0001 | 1 << 16 | 0x148 << 20).to_bytes(4, "little")
        cfg[0x148:0x14C] = (0x000D | 1 << 16).to_bytes(4, "little")
        cfg[0x14E:0x150] = acs_ctl.to_bytes(2, "little")
    return bytes(cfg)


def test_acs_redirect_on_a_bridge_warns_with_two_gpus(tmp_path):
    pci_tree(tmp_path, {"0000:00:01.0": ("0x060400", bridge_config(0x001D)),  # SV RR CR UF
                        "0000:00:02.0": ("0x060400", bridge_config(0x0000)),
                        "0000:01:00.0": ("0x030200", bridge_config(None))})
    r = d.check_acs(tmp_path, n_gpus=2, is_root=True)
    assert r.status == "warn" and r.summary == "ACS P2P redirect on 1 bridge(s)"
    assert "0000:00:01.0: ACS control 0x001d (SV RR CR UF)" in r.evidence
    assert "setpci" in r.advice
    assert d.check_acs(tmp_path, n_gpus=0, is_root=True).status == "ok"


def test_acs_off_everywhere_is_ok(tmp_path):
    pci_tree(tmp_path, {"0000:00:01.0": ("0x060400", bridge_config(0x0001)), "0000:00:02.0": ("0x060400", bridge_config(None))})
    r = d.check_acs(tmp_path, n_gpus=8, is_root=True)
    assert (r.status, r.summary) == ("ok", "no ACS P2P redirect on 2 readable bridge(s)")


def test_acs_without_root_is_skipped_with_the_reason(tmp_path):
    pci_tree(tmp_path, {"0000:00:01.0": ("0x060400", bridge_config(0x001D, size=64))})
    r = d.check_acs(tmp_path, n_gpus=2, is_root=False)
    assert r.status == "skipped" and r.summary.startswith("needs root")
    assert "setpci" in r.summary


def test_acs_without_pci_bridges(tmp_path):
    pci_tree(tmp_path, {"0000:00:00.0": ("0x060000", bridge_config(None))})
    assert d.check_acs(tmp_path, n_gpus=2).status == "ok"
    assert d.check_acs(tmp_path / "nothing", n_gpus=2).status == "skipped"


def iommu_tree(root: Path, units=(), cmdline="", groups=()):
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/cmdline").write_text(cmdline + "\n")
    for u in units:
        (root / "sys/class/iommu" / u).mkdir(parents=True)
    for i, t in enumerate(groups):
        (root / f"sys/kernel/iommu_groups/{i}").mkdir(parents=True)
        (root / f"sys/kernel/iommu_groups/{i}/type").write_text(t + "\n")


def test_iommu_translation_warns_with_gpus(tmp_path):
    iommu_tree(tmp_path, units=["dmar0", "dmar1"], cmdline="ro quiet intel_iommu=on", groups=["DMA-FQ", "DMA-FQ", "DMA"])
    r = d.check_iommu(tmp_path, n_gpus=4)
    assert r.status == "warn" and r.summary == "IOMMU on, translated DMA (2 unit(s))"
    assert "/proc/cmdline IOMMU options: intel_iommu=on" in r.evidence
    assert "IOMMU group types: 1x DMA, 2x DMA-FQ" in r.evidence
    assert "iommu=pt" in r.advice


def test_iommu_passthrough_or_absent_is_ok(tmp_path):
    iommu_tree(tmp_path / "a", units=["ivhd0"], cmdline="amd_iommu=on iommu=pt", groups=["identity"])
    assert d.check_iommu(tmp_path / "a", n_gpus=4).summary == "IOMMU on, passthrough mode (1 unit(s))"
    iommu_tree(tmp_path / "b", cmdline="quiet")
    r = d.check_iommu(tmp_path / "b", n_gpus=4)
    assert (r.status, r.summary) == ("ok", "no IOMMU active")


# -- /dev/shm, ulimit -l, disk ----------------------------------------------------------------


def statvfs_of(total, free, frsize=4096):
    return lambda path: types.SimpleNamespace(f_frsize=frsize, f_blocks=total // frsize, f_bavail=free // frsize)


def test_a_64mb_shm_warns_with_the_docker_fix():
    r = d.check_shm("/dev/shm", statvfs_of(64 * 1024**2, 60 * 1024**2))
    assert r.status == "warn" and r.summary == "64 MiB: too small"
    assert "docker --shm-size=16g" in r.advice and "shm-off" in r.advice
    assert r.evidence == ["statvfs(/dev/shm): 64 MiB total, 60 MiB free"]


def test_a_big_shm_is_ok_and_a_missing_one_warns(tmp_path):
    assert d.check_shm("/dev/shm", statvfs_of(16 * 1024**3, 16 * 1024**3)).status == "ok"
    assert d.check_shm(str(tmp_path / "missing")).status == "warn"


def test_small_memlock_warns_only_with_infiniband():
    small = lambda which: (64 * 1024, 64 * 1024)
    r = d.check_memlock(["mlx5_0"], small)
    assert r.status == "warn" and "64 KiB" in r.summary and "unlimited" in r.advice
    assert d.check_memlock([], small).status == "ok"
    inf = lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    assert d.check_memlock(["mlx5_0"], inf).summary == "unlimited"


def test_run_directory_space(tmp_path):
    runs = tmp_path / "not" / "yet"
    r = d.check_disk(runs, statvfs_of(10 * 1024**3, 50 * 1024**2))
    assert r.status == "fail" and f"measured at {tmp_path}" in r.evidence[0]
    assert d.check_disk(runs, statvfs_of(10 * 1024**3, 500 * 1024**2)).status == "warn"
    assert d.check_disk(runs, statvfs_of(10 * 1024**3, 5 * 1024**3)).status == "ok"


# -- CPU budget ---------------------------------------------------------------------------


def test_workers_times_gpus_over_cores_warns():
    r = d.check_cpu(16, 8, 4)
    assert r.status == "warn" and r.summary == "32 workers for 16 cores"
    assert "num_workers <= 2" in r.advice and "fewer-workers" in r.advice
    assert d.check_cpu(16, 8, 2).status == "ok"
    assert d.check_cpu(16, 0, 2).status == "skipped"
    r = d.check_cpu(16, 8, None)
    assert r.status == "skipped" and "--workers" in r.summary


def test_workers_read_from_a_running_job_tree():
    r = d.check_cpu(8, 0, None, torchrun.JobWorkers(4242, ranks=4, workers_per_rank=3))
    assert r.status == "warn" and "torchrun pid 4242: 4 rank(s)" in r.evidence[1]


# -- network ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, expected", [
    ("eth", ["eth0", "eth1"]),
    ("eth0", ["eth0"]),
    ("=eth0", ["eth0"]),
    ("^lo,docker", ["eth0", "eth1", "ib0"]),
    ("^=docker0", ["lo", "eth0", "eth1", "docker01", "ib0"]),
    ("ib0,eth1", ["eth1", "ib0"]),
    ("=eth", []),
])
def test_nccl_interface_list_rules(spec, expected):
    assert d.nccl_list_match(spec, ["lo", "eth0", "eth1", "docker0", "docker01", "ib0"]) == expected


def test_socket_ifname_that_matches_nothing_fails():
    r = d.check_nccl_net({"NCCL_SOCKET_IFNAME": "ib0"}, ["eth0", "lo"], {})
    assert r.status == "fail" and "matches no interface" in r.summary
    assert "NCCL_SOCKET_IFNAME=ib0 selects: nothing" in r.evidence
    r = d.check_nccl_net({"NCCL_SOCKET_IFNAME": "=eth0"}, ["eth0", "lo"], {})
    assert r.status == "ok" and "NCCL_SOCKET_IFNAME==eth0 selects: eth0" in r.evidence
    assert d.check_nccl_net({"NCCL_SOCKET_IFNAME": "lo"}, ["eth0", "lo"], {}).status == "warn"
    assert d.check_nccl_net({"GLOO_SOCKET_IFNAME": "eth9"}, ["eth0", "lo"], {}).status == "fail"
    assert d.check_nccl_net({}, ["eth0"], {}).status == "ok"


def test_ib_hca_against_the_devices(tmp_path):
    for dev, state in (("mlx5_0", "4: ACTIVE"), ("mlx5_1", "1: DOWN")):
        (tmp_path / f"sys/class/infiniband/{dev}/ports/1").mkdir(parents=True)
        (tmp_path / f"sys/class/infiniband/{dev}/ports/1/state").write_text(state + "\n")
    ib = d.infiniband_devices(tmp_path)
    assert ib == {"mlx5_0": ["port 1: 4: ACTIVE"], "mlx5_1": ["port 1: 1: DOWN"]}
    assert d.check_infiniband(ib).summary == "2 device(s), 1 with an active port"
    assert d.check_infiniband({"mlx5_1": ["port 1: 1: DOWN"]}).status == "warn"
    assert d.check_nccl_net({"NCCL_IB_HCA": "mlx5_2:1"}, ["eth0"], ib).status == "fail"
    assert d.check_nccl_net({"NCCL_IB_HCA": "=mlx5_0:1"}, ["eth0"], ib).status == "ok"
    assert d.check_nccl_net({"NCCL_IB_HCA": "mlx5"}, ["eth0"], {}).status == "warn"
    env = d.check_env({"NCCL_IB_DISABLE": "1"}, ib)
    assert env.status == "warn" and any("InfiniBand (mlx5_0, mlx5_1)" in e for e in env.evidence)
    assert d.check_env({"NCCL_IB_DISABLE": "1"}, {}).status == "ok"


def test_master_port_in_use_warns():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = d.check_master_port(port)
        assert r.status == "warn" and r.summary.startswith(f"{port} is in use")
        assert f"bind 127.0.0.1:{port}: EADDRINUSE (Address already in use)" in r.evidence
    r = d.check_master_port(port)
    assert (r.status, r.summary) == ("ok", f"{port} is free")


# -- environment ------------------------------------------------------------------------


def test_env_lists_nccl_and_torch_vars_masks_secrets_and_flags_the_harmful():
    env = {"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO", "TORCH_HUB_TOKEN": "hunter2", "HOME": "/root",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "NCCL_SOCKET_IFNAME": "eth0"}
    r = d.check_env(env)
    assert r.status == "warn" and r.summary == "5 set, 3 known to hurt"
    assert "TORCH_HUB_TOKEN=***" in r.evidence and "hunter2" not in json.dumps(r.to_dict())
    assert "HOME=/root" not in r.evidence
    assert set(r.data["flagged"]) == {"NCCL_P2P_DISABLE=1", "NCCL_DEBUG=INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING=0"}
    assert d.check_env({"NCCL_DEBUG": "WARN"}).status == "ok"
    assert d.check_env({}).summary == "no NCCL_* or TORCH_* variables set"


def health(gpus, **kw):
    b = NvmlBackend(lib=fake_nvml.make(gpus, **kw))
    return b.health(), b.error


def test_gpu_health_ok_warn_and_fail():
    r = d.check_gpu_health(*health([fake_nvml.FakeGpu(), fake_nvml.FakeGpu()]))
    assert r.status == "ok"
    assert r.summary == "2 GPU(s): no uncorrected memory errors, nothing pending, no hardware throttling"
    assert r.evidence[0] == (f"GPU 0 ({H100}): uncorrected ECC errors 0, retired pages 0, "
                             "rows remapped after uncorrectable errors 0")
    # GPU 1 has a row remap waiting for a reset; GPU 2 runs hot enough for the hardware to slow it
    gpus = [fake_nvml.FakeGpu(), fake_nvml.FakeGpu(ecc=2, remap=(0, 1, 1, 0)), fake_nvml.FakeGpu(throttle=0x40)]
    r = d.check_gpu_health(*health(gpus))
    assert r.status == "warn"
    assert r.summary == "GPU 1: a memory row remap waits for a reset; GPU 2: throttled by hw-thermal"
    assert "(one pending)" in r.evidence[1] and "nvidia-smi -r" in r.advice
    # a failed remap is a hardware fault; a GPU without ECC (a consumer card) is n/a, not an error
    gpus = [fake_nvml.FakeGpu(remap=(0, 3, 0, 1)),
            fake_nvml.FakeGpu(name="NVIDIA GeForce RTX 4090", unsupported={"nvmlDeviceGetTotalEccErrors",
                              "nvmlDeviceGetRetiredPages", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPagesPendingStatus"})]
    r = d.check_gpu_health(*health(gpus))
    assert r.status == "fail" and r.summary == "GPU 0: a row remap failed"
    assert r.evidence[1] == ("GPU 1 (NVIDIA GeForce RTX 4090): uncorrected ECC errors n/a, retired pages n/a, "
                             "rows remapped after uncorrectable errors n/a")
    r = d.check_gpu_health(*health([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert r.status == "skipped"


def links(gpus, **kw):
    b = NvmlBackend(lib=fake_nvml.make(gpus, **kw))
    return b.links(), b.error


def test_nvlink_row_names_the_gpu_with_a_link_down():
    switch = "00000000:C1:00.0"
    gpus = [fake_nvml.FakeGpu(nvlinks=[switch] * 18) for _ in range(4)]
    gpus[2] = fake_nvml.FakeGpu(nvlinks=[switch] * 16, nvlinks_down=2)
    r = d.check_nvlink(*links(gpus))
    assert r.status == "warn"
    assert r.summary == f"GPU 2 has 16 NVLinks up, other {H100} GPUs 18"
    assert r.evidence[2] == f"GPU 2 ({H100}): 16 of 18 NVLinks up, 16 to NVSwitches"
    assert "nvidia-smi nvlink --status" in r.advice
    assert r.data["gpus"][2] == {"index": 2, "up": 16, "down": 2, "remotes": ["0000:c1:00.0"] * 16}


def test_nvlink_row_when_all_links_are_up_and_when_there_is_none():
    bus = lambda i: f"00000000:{0x10 + i:02X}:00.0"
    # a pair of PCIe cards joined by a 4-link bridge: each uses 4 of its links, which is how they are made
    r = d.check_nvlink(*links([fake_nvml.FakeGpu(name=A100, cc=(8, 0), nvlinks=[bus(1)] * 4, nvlinks_down=8),
                               fake_nvml.FakeGpu(name=A100, cc=(8, 0), nvlinks=[bus(0)] * 4, nvlinks_down=8)]))
    assert r.status == "ok" and r.summary == "8 NVLinks up on 2 GPU(s), none down against the others of their model"
    assert r.evidence[0] == f"GPU 0 ({A100}): 4 of 12 NVLinks up, to GPU 1"
    r = d.check_nvlink(*links([fake_nvml.FakeGpu(), fake_nvml.FakeGpu()]))
    assert r.status == "ok" and r.summary == "no NVLink on these 2 GPUs: peer traffic goes over PCIe"
    r = d.check_nvlink(*links([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert r.status == "skipped" and "no NVIDIA driver" in r.summary


# -- the whole report ---------------------------------------------------------------------


def test_exit_code_mapping():
    R = lambda s: d.Row("x", s, "")
    assert d.exit_code([R("ok"), R("skipped")]) == 0
    assert d.exit_code([R("ok"), R("warn"), R("skipped")]) == 1
    assert d.exit_code([R("warn"), R("fail")]) == 2
    assert d.exit_code([]) == 0


def test_run_checks_on_a_mixed_545_box_and_its_text_and_json(tmp_path, runs_dir):
    iommu_tree(tmp_path, units=["dmar0"], cmdline="intel_iommu=on")
    gpus = [fake_nvml.FakeGpu(), fake_nvml.FakeGpu(name=A100, cc=(8, 0))]
    backend = NvmlBackend(lib=fake_nvml.make(gpus, driver="545.23.08", cuda=12030, p2p={(0, 1): (NO_SUPPORT,) * 3}))
    rows = d.run_checks(workers=2, master_port=0, root=tmp_path, env={"NCCL_SOCKET_IFNAME": "nosuch9"},
                        backend=backend, packages=d.Packages(torch="2.4.0+cu121", torch_cuda="12.1", nccl="2.20.5"))
    st = {r.name: r.status for r in rows}
    assert st["GPUs"] == "warn" and st["GPU P2P"] == "warn" and st["Known problems"] == "warn"
    assert st["NVLink"] == "ok"
    assert st["Driver / CUDA / NCCL"] == "ok" and st["IOMMU"] == "warn" and st["NCCL network"] == "fail"
    assert st["/dev/shm"] == "warn"  # no dev/shm under the fixture root
    assert d.exit_code(rows) == 2
    text = d.format_rows(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["STATUS", "CHECK", "SUMMARY"]
    col = lines[0].index("SUMMARY")
    for r in rows:  # one aligned line per check, evidence and advice indented below it
        (line,) = [l for l in lines if l.startswith(f"{r.status:<8} {r.name} ")]
        assert line[col:] == r.summary
    assert "           -> mixed GPU models" in text
    assert lines[-1] == f"{sum(s == 'ok' for s in st.values())} ok, {sum(s == 'warn' for s in st.values())} warn, " \
                        f"1 fail, {sum(s == 'skipped' for s in st.values())} skipped (exit 2)"
    doc = json.loads(d.to_json(rows))
    assert doc["summary"]["exit_code"] == 2 and doc["summary"]["fail"] == 1
    assert {"name", "status", "summary", "evidence", "advice", "data"} <= set(doc["rows"][0])
    gpus_row = next(r for r in doc["rows"] if r["name"] == "GPUs")
    assert [g["cc"] for g in gpus_row["data"]["gpus"]] == ["9.0", "8.0"]


def test_interfaces_that_cannot_be_listed_are_said_so_not_failed_as_matching_nothing(tmp_path, runs_dir, monkeypatch):
    """psutil failing to list the interfaces (a sandbox without netlink) is not
    an empty list: NCCL_SOCKET_IFNAME is not checked, and the row says why."""
    import psutil

    def denied():
        raise psutil.AccessDenied(msg="netlink socket refused")

    monkeypatch.setattr(psutil, "net_if_addrs", denied)
    rows = d.run_checks(workers=2, master_port=0, root=tmp_path, env={"NCCL_SOCKET_IFNAME": "eth0"},
                        backend=NvmlBackend(lib=fake_nvml.make([fake_nvml.FakeGpu()])), packages=d.Packages())
    (net,) = [r for r in rows if r.name == "NCCL network"]
    assert net.status == "warn" and "could not list this machine's network interfaces" in net.summary
    assert "netlink socket refused" in net.summary and "NCCL_SOCKET_IFNAME not checked" in net.summary
    assert "matches no interface" not in d.format_rows(rows)
    assert d.check_nccl_net({}, "OSError: x", {}).status == "skipped"
