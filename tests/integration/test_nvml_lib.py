"""The real pynvml module against a stand-in for the driver's libnvidia-ml.so.1.

``tests/support/fake_nvml.py`` replaces pynvml's Python functions; these tests instead
replace only the C library (``tests/support/nvml_stub/nvml_stub.c``, built here with
gcc) and load it as pynvml loads the driver's, by ``dlopen("libnvidia-ml.so.1")``
on ``LD_LIBRARY_PATH``.  What runs is what runs on a GPU machine above the C
boundary: nvidia-ml-py's versioned entry points, struct layouts, two-call
buffer protocols and error classes, and ddptop's use of them -- in ddptop's
own processes (a fresh Python per test: pynvml keeps the library it loaded).

Two things these tests caught that the Python fake could not: an Xid event
was never matched to its GPU (pynvml's handles are ctypes pointers, which do
not compare equal by address), and on a driver older than nvidia-ml-py
(no ``_v3`` process list, no ``ClocksEventReasons``) every telemetry tick
failed and throttle reasons were never shown.
"""

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

import fake_nvml
from conftest import EXAMPLE, ROOT, TIMEOUT, ddptop_cmd, wait_for
from ddptop.core.sources.proc_tree import pid_namespace

GiB = 1024**3

TWO_GPUS = """\
driver 535.104.05
cuda 12020
gpus 2
gpu 0 name NVIDIA A100-SXM4-80GB
gpu 0 util 97 41
gpu 0 mem 85899345920 10737418240
gpu 0 power 312000 400000
gpu 0 temp 61
gpu 0 sm 1410
gpu 0 pcie 4 16 1200 3400
gpu 0 ecc 3
gpu 0 retired 2
gpu 0 throttle 0x44
gpu 0 cc 8 0
gpu 0 bus 00000000:18:00.0
gpu 1 name NVIDIA A100-SXM4-80GB
gpu 1 util 5 1
gpu 1 cc 8 0
gpu 1 unsupported nvmlDeviceGetPowerUsage nvmlDeviceGetTotalEccErrors
p2p 0 1 4 4 5
level 0 1 30
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """{"new": dir, "old": dir}: the stand-in as a current driver and as one
    older than nvidia-ml-py (built with -DOLD_DRIVER)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        if os.environ.get("CI"):
            pytest.fail("no C compiler: the NVML library tests need gcc")
        pytest.skip("no C compiler to build the NVML stand-in")
    out = {}
    for kind in ("new", "old"):
        out[kind] = fake_nvml.build_stub(tmp_path_factory.mktemp(f"nvml-{kind}"), old_driver=kind == "old", cc=cc).parent
    return out


def nvml_env(libdir: Path, conf: Path, log: Path | None = None) -> dict:
    env = dict(os.environ, DDPTOP_FAKE_NVML=str(conf),
               LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(libdir), os.environ.get("LD_LIBRARY_PATH")])))
    if log is not None:
        env["DDPTOP_FAKE_NVML_LOG"] = str(log)
    return env


def python(script: str, env: dict, timeout: float = 60):
    """Run a script in a fresh Python; its last stdout line, as JSON."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def doctor(env: dict) -> tuple[dict, int]:
    """`ddptop doctor --json` in this environment: its rows by name, and its exit code."""
    p = subprocess.run(ddptop_cmd("doctor", "--json"), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
                       env=env)
    return {r["name"]: r for r in json.loads(p.stdout)["rows"]}, p.returncode


SAMPLE = """
    import json, pynvml
    from dataclasses import asdict
    from ddptop.core.sources.gpu_nvml import NvmlBackend
    b = NvmlBackend()
    ok = b.init()
    evs = [asdict(e) for e in b.sample()] if ok else []
    procs = b.processes() if ok else {}
    print(json.dumps({"ok": ok, "error": b.error, "status": b.status(), "lib": getattr(pynvml.nvmlLib, "_name", None),
                      "gpus": evs, "procs": procs}))
"""


def test_every_field_of_every_gpu_through_the_real_pynvml(libs, tmp_path):
    conf = tmp_path / "nvml.conf"
    conf.write_text(TWO_GPUS + "gpu 0 pids 4242 4343\ngpu 1 pids 5151\n")
    r = python(SAMPLE, nvml_env(libs["new"], conf))
    assert r["ok"] and r["lib"] == "libnvidia-ml.so.1"  # pynvml's own dlopen, not a fake module
    assert r["status"] == ["nvml", "2 GPU(s): NVIDIA A100-SXM4-80GB; driver 535.104.05"]
    g0, g1 = r["gpus"]
    assert (g0["index"], g0["name"], g0["uuid"]) == (0, "NVIDIA A100-SXM4-80GB", "GPU-00000000-0000-0000-0000-000000000000")
    assert (g0["util"], g0["mem_util"], g0["mem_used"], g0["mem_total"]) == (97, 41, 10 * GiB, 80 * GiB)
    assert (g0["power_w"], g0["power_limit_w"], g0["temp_c"], g0["sm_clock_mhz"]) == (312.0, 400.0, 61, 1410)
    assert (g0["pcie_gen"], g0["pcie_width"], g0["pcie_tx_kbs"], g0["pcie_rx_kbs"]) == (4, 16, 1200, 3400)
    assert (g0["ecc_uncorrected"], g0["retired_pages"]) == (3, 2)
    assert g0["throttle"] == ["sw-power-cap", "hw-thermal"]  # 0x4 | 0x40
    assert not g0["simulated"] and not g0["lost"]
    # what GPU 1 does not support is n/a for that field only
    assert g1["power_w"] is None and g1["ecc_uncorrected"] is None
    assert (g1["util"], g1["power_limit_w"], g1["temp_c"]) == (5, 700.0, 40)
    assert r["procs"] == {"4242": 0, "4343": 0, "5151": 1}


def test_an_older_driver_than_nvidia_ml_py_still_maps_processes_and_throttle(libs, tmp_path):
    """nvidia-ml-py 12+ asks for nvmlDeviceGetComputeRunningProcesses_v3 and
    ClocksEventReasons; a driver before ~510 has neither.  ddptop falls back to
    the older entry points instead of failing every tick."""
    conf = tmp_path / "nvml.conf"
    conf.write_text(TWO_GPUS.replace("535.104.05", "470.223.02") + "gpu 0 pids 4242\ngpu 1 pids 5151\n")
    r = python(SAMPLE, nvml_env(libs["old"], conf))
    assert r["ok"], r["error"]
    assert r["procs"] == {"4242": 0, "5151": 1}
    assert r["gpus"][0]["throttle"] == ["sw-power-cap", "hw-thermal"]


def test_a_field_a_gpu_does_not_support_is_asked_once(libs, tmp_path):
    conf = tmp_path / "nvml.conf"
    log = tmp_path / "calls.log"
    conf.write_text(TWO_GPUS)
    r = python("""
        import json
        from ddptop.core.sources.gpu_nvml import NvmlBackend
        b = NvmlBackend()
        powers = [[e.power_w for e in b.sample()] for _ in range(5)]
        print(json.dumps(powers))
    """, nvml_env(libs["new"], conf, log))
    assert r == [[312.0, None]] * 5
    calls = log.read_text().split()
    assert calls.count("nvmlDeviceGetPowerUsage") == 5 + 1  # GPU 0 every tick, GPU 1 once
    assert calls.count("nvmlDeviceGetHandleByIndex_v2") == 2  # handles fetched once, not per tick
    assert calls.count("nvmlDeviceGetName") == 2


def test_gpu_lost_mid_run_and_xid_become_alarms_naming_the_ranks_on_it(libs, tmp_path):
    conf = tmp_path / "nvml.conf"
    conf.write_text(TWO_GPUS)
    me = os.getpid()
    r = python(f"""
        import json, os, time
        from ddptop.core.sources.gpu_nvml import NvmlBackend
        from ddptop.core.sources.telemetry import RankProc, Telemetry
        conf = {str(conf)!r}
        tel = Telemetry(NvmlBackend())
        ranks = [RankProc(0, 0, os.getpid()), RankProc(1, 1, {me})]
        first = tel.tick(ranks)
        with open(conf, "a") as f:
            f.write("gpu 1 xid 79 1\\n")
        second = tel.tick(ranks)
        with open(conf, "a") as f:
            f.write("gpu 1 lost\\n")
        third = tel.tick(ranks)
        fourth = tel.tick(ranks)
        pick = lambda evs: [{{k: getattr(e, k, None) for k in ("kind", "index", "util", "lost", "id", "message", "ranks", "gpu", "gpu_mapping", "rank")}} for e in evs]
        print(json.dumps([pick(first), pick(second), pick(third), pick(fourth)]))
    """, nvml_env(libs["new"], conf))
    first, second, third, fourth = r
    by = lambda evs, kind: [e for e in evs if e["kind"] == kind]
    # no pid in NVML's lists: ranks mapped from LOCAL_RANK (this process has no CUDA_VISIBLE_DEVICES),
    # by device where this test itself runs in a container
    how = "device" if pid_namespace() else "env"
    assert [(p["rank"], p["gpu"], p["gpu_mapping"]) for p in by(first, "proc")] == [(0, 0, how), (1, 1, how)]
    assert not by(first, "alarm")
    (xid,) = by(second, "alarm")
    assert xid["id"] == "xid" and xid["ranks"] == [1]
    assert xid["message"].startswith("Xid 79 critical error on GPU 1: GPU has fallen off the bus, a hardware fault")
    (lost,) = by(third, "alarm")
    assert lost["id"] == "gpu-lost" and "GPU 1 fell off the bus" in lost["message"] and lost["ranks"] == [1]
    g = {e["index"]: e for e in by(third, "gpu")}
    assert g[1]["lost"] and not g[0]["lost"] and g[0]["util"] == 97  # the other GPU is still sampled
    assert not by(fourth, "alarm")  # said once
    assert [e["util"] for e in by(fourth, "gpu")] == [97, None]


@pytest.mark.parametrize("conf_text, message", [
    ("init_error 9\n", "no NVIDIA driver loaded"),
    (None, "no NVIDIA driver (libnvidia-ml not found)"),
])
def test_no_driver_is_a_state_not_a_crash(libs, tmp_path, conf_text, message):
    conf = tmp_path / "nvml.conf"
    if conf_text is not None:
        conf.write_text(conf_text)
    r = python(SAMPLE, nvml_env(libs["new"], conf))
    assert not r["ok"] and r["status"] == ["none", message] and r["gpus"] == []


def test_launched_ranks_are_mapped_to_the_gpus_nvml_lists_their_pids_on(libs, tmp_path, runs_dir):
    """ddptop --gpu auto with real torchrun: once NVML lists each rank's pid
    on a GPU (crossed over here: rank 0 on GPU 1), the proc and gpu events say
    so, with mapping "nvml" rather than the LOCAL_RANK guess."""
    conf = tmp_path / "nvml.conf"
    conf.write_text(TWO_GPUS)
    p = subprocess.Popen(ddptop_cmd("--json", "--gpu", "auto", "--sample-interval", "0.5", "torchrun",
                                    "--nproc-per-node", "2", EXAMPLE, "--steps", "100000", "--step-time", "0.05"),
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=nvml_env(libs["new"], conf), start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in p.stdout], daemon=True).start()
    deadline = time.monotonic() + TIMEOUT

    def events():  # ddptop's JSON events as they come, until the deadline
        while time.monotonic() < deadline:
            try:
                yield json.loads(lines.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                return

    try:
        pids, status = {}, None
        for e in events():
            if e.get("kind") == "rank" and e.get("alive"):
                pids[e["rank"]] = e["pid"]
            if e.get("kind") == "gpu_status":
                status = e
            if len(pids) == 2:
                break
        assert len(pids) == 2, f"no two ranks started: {pids}"
        with open(conf, "a") as f:
            f.write(f"gpu 1 pids {pids[0]}\ngpu 0 pids {pids[1]}\n")
        procs, gpus = {}, {}
        for e in events():
            if e.get("kind") == "gpu_status":
                status = e
            if e.get("kind") == "proc" and e["gpu_mapping"] == "nvml":
                procs[e["rank"]] = e
            if e.get("kind") == "gpu" and e["mapping"] == "nvml":
                gpus[e["index"]] = e
            if len(procs) == 2 and len(gpus) == 2:
                break
        assert status and status["backend"] == "nvml" and status["count"] == 2 and status["driver"] == "535.104.05"
        assert {r: (e["gpu"], e["pid"]) for r, e in procs.items()} == {0: (1, pids[0]), 1: (0, pids[1])}
        assert gpus[1]["ranks"] == [0] and gpus[1]["pids"] == [pids[0]]
        assert gpus[0]["ranks"] == [1] and gpus[0]["util"] == 97 and not gpus[0]["simulated"]
        os.killpg(p.pid, signal.SIGTERM)
        p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate(timeout=30)


def test_doctor_reads_gpus_versions_p2p_and_topology_through_the_real_pynvml(libs, tmp_path):
    conf = tmp_path / "nvml.conf"
    conf.write_text(TWO_GPUS.replace("gpu 1 name NVIDIA A100-SXM4-80GB", "gpu 1 name NVIDIA H100 80GB HBM3")
                    .replace("gpu 1 cc 8 0", "gpu 1 cc 9 0")
                    .replace("driver 535.104.05", "driver 545.23.08").replace("cuda 12020", "cuda 12030"))
    rows, code = doctor(nvml_env(libs["new"], conf))
    gpus = rows["GPUs"]
    assert gpus["status"] == "warn" and "mixed" in gpus["summary"]
    assert [(g["name"], g["cc"], g["pci_bus_id"]) for g in gpus["data"]["gpus"]] == [
        ("NVIDIA A100-SXM4-80GB", "8.0", "00000000:18:00.0"), ("NVIDIA H100 80GB HBM3", "9.0", "00000000:19:00.0")]
    assert "driver 545.23.08 (CUDA 12.3)" in rows["Driver / CUDA / NCCL"]["summary"]
    assert "driver-545.23.08-ddp-p2p-hang" in rows["Known problems"]["summary"]
    p2p = rows["GPU P2P"]
    assert p2p["status"] == "warn"
    assert p2p["evidence"][0] == ("GPU 0 <-> GPU 1: read disabled by regkey, write disabled by regkey, "
                                  "NVLink not supported; via host bridge")
    assert rows["NVLink"]["summary"] == "no NVLink on these 2 GPUs: peer traffic goes over PCIe"
    # TWO_GPUS: GPU 0 has 3 uncorrected ECC errors, 2 retired pages and runs throttled by hw-thermal
    health = rows["GPU health"]
    assert health["status"] == "warn"
    assert health["summary"] == ("GPU 0: 3 uncorrected ECC error(s) since the driver loaded; "
                                 "GPU 0: throttled by hw-thermal")
    assert health["evidence"][1].startswith("GPU 1 (NVIDIA H100 80GB HBM3): uncorrected ECC errors n/a, retired pages 0")
    assert code == 1  # warnings, no failure


def test_bench_link_rates_through_the_real_pynvml(libs, tmp_path):
    """What `ddptop bench p2p` compares its figures with, read through the real
    pynvml: 4 H100 SXM on NVSwitches (PCIe idling at gen 1) and 2 PCIe GPUs
    joined by an NVLink bridge of 4 links, next to one without NVLink."""
    conf = tmp_path / "nvml.conf"
    lines = ["gpus 7"]
    for i in range(4):
        lines += [f"gpu {i} pcie 1 16 0 0", f"gpu {i} pcie_max 5 16", f"gpu {i} nvlink " + " ".join(["switch"] * 18)]
    for i, other in ((4, 5), (5, 4)):
        lines += [f"gpu {i} cc 8 6", f"gpu {i} pcie 4 16 0 0", f"gpu {i} membus 384 9751",
                  f"gpu {i} nvlink " + " ".join([f"00000000:{0x18 + other:02X}:00.0"] * 4)]
    lines += ["gpu 6 cc 8 6", "gpu 6 pcie 4 8 0 0"]
    conf.write_text("\n".join(lines) + "\n")
    r = python("""
        import json
        from ddptop.core.tools.p2p_bench import link_rates
        from ddptop.core.sources.gpu_nvml import NvmlBackend
        r = link_rates(NvmlBackend().links())
        print(json.dumps({"pair": {f"{i}-{j}": v for (i, j), v in r.pair.items()}, "pcie": r.pcie,
                          "memory": r.memory, "lines": r.lines}))
    """, nvml_env(libs["new"], conf))
    assert r["pair"]["0-3"] == pytest.approx(450.0)  # 18 x 25 GB/s
    assert r["pcie"]["0"] == pytest.approx(63.008)  # gen 5 x16, the maximum, not the idle gen 1
    assert r["memory"]["0"] == pytest.approx(3352.32)
    assert r["pair"]["4-5"] == pytest.approx(56.25)  # 4 x 14.0625: an RTX 3090 bridge's 112.5 GB/s both ways
    assert r["pair"]["4-6"] == pytest.approx(15.752)  # no NVLink: the slower PCIe end, gen4 x8
    assert r["pair"]["0-4"] == pytest.approx(31.504)  # NVSwitch GPU to a bridged GPU: PCIe gen4 x16
    assert r["memory"]["4"] == pytest.approx(936.096)  # 384 bits x 9751 MHz x 2 / 8: an RTX 3090, 936 GB/s
    assert r["lines"][4] == "GPU 4: PCIe gen4 x16 (31.5 GB/s), NVLink x4 (56 GB/s), memory 936 GB/s"


def test_doctor_names_a_gpu_with_an_nvlink_down_through_the_real_pynvml(libs, tmp_path):
    conf = tmp_path / "nvml.conf"
    lines = ["gpus 4"] + [f"gpu {i} nvlink " + " ".join(["switch"] * (18 if i != 1 else 17)) for i in range(4)]
    conf.write_text("\n".join(lines) + "\ngpu 1 nvlink_down 1\ngpu 2 remap 0 1 1 0\ngpu 3 remap 0 4 0 1\n")
    rows, code = doctor(nvml_env(libs["new"], conf))
    assert rows["GPU health"]["status"] == "fail" and code == 2
    assert rows["GPU health"]["summary"] == "GPU 3: a row remap failed; GPU 2: a memory row remap waits for a reset"
    row = rows["NVLink"]
    assert row["status"] == "warn" and row["summary"] == "GPU 1 has 17 NVLinks up, other NVIDIA H100 80GB HBM3 GPUs 18"
    assert row["evidence"][1] == "GPU 1 (NVIDIA H100 80GB HBM3): 17 of 18 NVLinks up, 17 to NVSwitches"


def test_a_driver_upgraded_without_a_reboot_is_a_failure_with_the_fix_not_no_gpu(libs, tmp_path):
    """nvmlInit answers NVML_ERROR_LIB_RM_VERSION_MISMATCH (18) after a driver
    upgrade without a reboot (nvidia-smi: "Driver/library version mismatch").
    CUDA fails the same way, so it must not read as a machine without GPUs."""
    conf = tmp_path / "nvml.conf"
    conf.write_text("init_error 18\n")
    env = nvml_env(libs["new"], conf)
    rows, code = doctor(env)
    gpus = rows["GPUs"]
    assert gpus["status"] == "fail" and "version mismatch" in gpus["summary"], gpus
    assert "upgraded without a reboot" in gpus["advice"] and "reboot" in gpus["advice"]
    assert code == 2
    # the live view says so too: the GPU status carries the fault and the fix
    r = python("""
        import json
        from ddptop.headless import format_text
        from ddptop.core.sources.telemetry import Telemetry, make_backend
        (ev,) = Telemetry(make_backend("auto")).tick([])
        print(json.dumps([ev.to_dict(), format_text(ev)]))
    """, env)
    status, line = r
    assert status["backend"] == "none" and "version mismatch" in status["message"] and "reboot" in status["fault"]
    assert line.startswith("!! ddptop: GPUs not monitored, NVML failed to start: ") and "reboot" in line


@pytest.mark.parametrize("conf_text", ["init_error 9\n", None])
def test_no_driver_is_skipped_by_doctor_not_failed(libs, tmp_path, conf_text):
    conf = tmp_path / "nvml.conf"
    if conf_text is not None:
        conf.write_text(conf_text)
    rows, code = doctor(nvml_env(libs["new"], conf))
    gpus = rows["GPUs"]
    assert gpus["status"] == "skipped" and "no NVIDIA driver" in gpus["summary"]


SWITCHED_4 = "gpus 4\n" + "".join(f"gpu {i} nvlink " + " ".join(["switch"] * 18) + "\n" for i in range(4))


@pytest.mark.parametrize("lib, fabric, status, summary", [
    # 0 completed; 1 never registered; 2 registration failed (NVML_ERROR_UNKNOWN); 3 completed, bandwidth degraded
    ("new", ["3 0 2", "1 0 0", "3 999 2", "3 0 1"], "fail", "GPU 1, 2 not registered with the NVSwitch fabric"),
    ("new", ["3 0 2", "2 0 0", "3 0 2", "3 0 2"], "warn", "GPU 1: fabric registration in progress"),
    ("new", ["3 0 2", "3 0 2", "3 0 1", "3 0 2"], "warn", "GPU 2: NVLink bandwidth degraded (fabric health)"),
    ("new", ["3 0 2"] * 4, "ok", "4 GPU(s) registered with the NVSwitch fabric"),
    # a driver without nvmlDeviceGetGpuFabricInfoV
    ("old", ["3 0 2"] * 4, "skipped", "GPU 0, 1, 2, 3 on NVSwitches, but NVML reports no fabric state for them "
                                      "(before Hopper, or an older driver)"),
])
def test_doctor_reads_each_gpus_nvswitch_fabric_registration(libs, tmp_path, lib, fabric, status, summary):
    """Until nvidia-fabricmanager registers a GPU with the NVSwitch fabric,
    CUDA fails on it with error 802; read through the real pynvml (whose
    struct gives the one-byte state four bytes: the stand-in fills the
    padding, as a driver may)."""
    conf = tmp_path / "nvml.conf"
    conf.write_text(SWITCHED_4 + "".join(f"gpu {i} fabric {f}\n" for i, f in enumerate(fabric)))
    rows, code = doctor(nvml_env(libs[lib], conf))
    row = rows["NVSwitch fabric"]
    assert (row["status"], row["summary"]) == (status, summary), row
    if status == "fail":
        assert row["evidence"][1] == "GPU 1 (NVIDIA H100 80GB HBM3): registration not started"
        assert row["evidence"][2].startswith("GPU 2 (NVIDIA H100 80GB HBM3): registration completed, failed: Unknown")
        assert row["evidence"][3].endswith("registration completed, NVLink bandwidth degraded")
        assert "error 802" in row["advice"] and "nvidia-fabricmanager" in row["advice"] and "550.54.15" in row["advice"]
        assert code == 2
    if status == "skipped":
        assert "nvidia-fabricmanager" in row["advice"]


def test_gpus_without_a_fabric_skip_the_fabric_row(libs, tmp_path):
    conf = tmp_path / "nvml.conf"
    conf.write_text("gpus 2\ngpu 0 fabric 0 0 0\n")  # state NOT_SUPPORTED, or (GPU 1) NVML_ERROR_NOT_SUPPORTED
    rows, code = doctor(nvml_env(libs["new"], conf))
    row = rows["NVSwitch fabric"]
    assert (row["status"], row["summary"]) == ("skipped", "no NVSwitch fabric on these GPUs")


IN_POD = """
    import json, os, subprocess, sys, time
    from ddptop.core.sources.proc_tree import pid_namespace
    from ddptop.core.sources.gpu_nvml import NvmlBackend
    from ddptop.core.sources.telemetry import RankProc, Telemetry
    conf, envs = sys.argv[1], json.loads(sys.argv[2])
    keep = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "ddptop-test-rank"],
                             env={**keep, **env}) for env, _ in envs]
    print(json.dumps({"inner": [k.pid for k in kids]}), flush=True)
    deadline = time.time() + 60
    while "pids" not in open(conf).read() and time.time() < deadline:  # the test lists the ranks' host pids
        time.sleep(0.05)
    ranks = [RankProc(r, lr, k.pid) for r, ((_, lr), k) in enumerate(zip(envs, kids))]
    tel = Telemetry(NvmlBackend())
    evs = tel.tick(ranks)
    for k in kids:
        k.kill()
    print(json.dumps({"ns": pid_namespace(), "self": os.getpid(), "events": [e.to_dict() for e in evs]}))
"""

POD_GPUS = """\
gpus 3
gpu 0 uuid GPU-6b1f0e2a-0d4c-4f7e-9a51-3c2d1e0f9a8b
gpu 0 util 81 20
gpu 1 uuid GPU-c04e7d19-5a3b-4c2d-8e1f-7a6b5c4d3e2f
gpu 1 util 12 3
gpu 1 mig MIG-0b9c8d7e-6f5a-5b4c-9d3e-2f1a0b9c8d7e MIG-11112222-3333-5444-8555-666677778888
gpu 2 uuid GPU-f2e1d0c9-b8a7-4968-8574-63524130201f
gpu 2 util 47 9
"""


def unshare_cmd() -> list[str]:
    """A new user, PID and mount namespace with its own /proc (as a pod has), or skip."""
    cmd = [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
    try:
        ok = subprocess.run([*cmd, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        pytest.skip("unshare cannot make a PID namespace here (no unshare, or user namespaces off)")
    return cmd


def test_ranks_in_a_pid_namespace_map_to_gpus_by_device_through_the_real_pynvml(libs, tmp_path):
    """ddptop and its ranks in a PID namespace of their own, as in a pod: NVML
    (the stand-in library, through the real pynvml) lists each rank's *host* pid,
    which the namespace's /proc does not have.  The ranks map to their GPUs by
    device -- CUDA_VISIBLE_DEVICES as a UUID, NVIDIA_VISIBLE_DEVICES as the
    container runtime sets it, a MIG device's id -- labelled "device", each
    with its GPU's utilisation."""
    cmd = unshare_cmd()
    conf = tmp_path / "nvml.conf"
    conf.write_text(POD_GPUS)
    uuid = {i: line.split()[-1] for i, line in enumerate(l for l in POD_GPUS.splitlines() if " uuid " in l)}
    envs = [({"CUDA_VISIBLE_DEVICES": uuid[2]}, 0),  # the device plugin's, or torchrun --local-ranks-filter's
            ({"NVIDIA_VISIBLE_DEVICES": f"{uuid[1]},{uuid[0]}"}, 0),  # the container runtime's: bus order
            ({"CUDA_VISIBLE_DEVICES": "MIG-0b9c8d7e-6f5a-5b4c-9d3e-2f1a0b9c8d7e"}, 0),
            ({"CUDA_VISIBLE_DEVICES": uuid[1][:12]}, 0)]  # a leading part, as CUDA takes it
    want = {0: 2, 1: 0, 2: 1, 3: 1}
    p = subprocess.Popen([*cmd, sys.executable, "-c", textwrap.dedent(IN_POD), str(conf), json.dumps(envs)],
                         env=nvml_env(libs["new"], conf), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        inner = json.loads(p.stdout.readline())["inner"]
        host: dict[int, int] = {}  # inner pid -> host pid, from the host side's /proc (NSpid: host pid ... inner)

        def found() -> bool:
            # (a child just forked may not have exec'd its command line yet, under load: looked at until it has)
            for c in psutil.Process(p.pid).children(recursive=True):
                try:
                    ns = next(l.split()[1:] for l in open(f"/proc/{c.pid}/status") if l.startswith("NSpid:"))
                    named = "ddptop-test-rank" in c.cmdline()
                except (OSError, StopIteration, psutil.Error):
                    continue
                if len(ns) > 1 and int(ns[-1]) in inner and named:
                    host[int(ns[-1])] = c.pid
            return len(host) == len(inner)

        wait_for(found, timeout=30, what="every rank's host pid")
        with open(conf, "a") as f:  # NVML sees each rank on its GPU, by its host pid
            for r, pid in enumerate(inner):
                f.write(f"gpu {want[r]} pids {host[pid]}\n")
        out, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, err
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=30)
    r = json.loads(out.strip().splitlines()[-1])
    assert r["ns"] is True and r["self"] != p.pid  # a namespace of its own, with pids of its own
    procs = {e["rank"]: e for e in r["events"] if e["kind"] == "proc"}
    gpus = {e["index"]: e for e in r["events"] if e["kind"] == "gpu"}
    assert {rk: (e["gpu"], e["gpu_mapping"]) for rk, e in procs.items()} == {rk: (i, "device") for rk, i in want.items()}
    assert {i: (g["ranks"], g["mapping"]) for i, g in gpus.items()} == {
        0: ([1], "device"), 1: ([2, 3], "device"), 2: ([0], "device")}
    assert {rk: gpus[e["gpu"]]["util"] for rk, e in procs.items()} == {0: 47, 1: 81, 2: 12, 3: 12}
    assert gpus[2]["pids"] == [host[inner[0]]]  # NVML's own pids, the host's, as it gave them
