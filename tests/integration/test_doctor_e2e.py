"""`ddptop doctor`: every row against fixture data (a fake NVML, fake sysfs trees,
fake statvfs / rlimits, env dicts), the exit code, --json, and a real run here.

(The pure parts: tests/unit/test_doctor.py.)"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT, run_ddptop, wait_for
from ddptop.core.sources import proc_torchrun as torchrun
from ddptop.core.tools import doctor as d
from ddptop.core.sources.gpu_nvml import NvmlBackend


def row(rows, name):
    (r,) = [r for r in rows if r.name == name]
    return r


# -- versions ----------------------------------------------------------------------------


def test_the_real_probe_reads_torch_in_a_subprocess():
    got = d.probe_torch(timeout=120)
    import torch  # the test process may; the doctor process does not

    assert got.get("cuda") == torch.version.cuda


# -- CPU budget ---------------------------------------------------------------------------


def test_a_running_torchrun_is_found_and_its_workers_counted(tmp_path):
    # a stand-in torchrun: 2 "ranks", each with 3 "data-loader workers"
    fake = tmp_path / "torchrun"
    fake.write_text(textwrap.dedent("""
        import subprocess, sys, time
        rank = ("import subprocess, sys, time\\n"
                "w = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']) for _ in range(3)]\\n"
                "time.sleep(120)\\n")
        ranks = [subprocess.Popen([sys.executable, "-c", rank]) for _ in range(2)]
        time.sleep(120)
    """))
    p = subprocess.Popen([sys.executable, str(fake), "--nproc-per-node", "2", "train.py"], start_new_session=True)
    try:
        def counted():
            job = next((j for j in torchrun.torchrun_jobs() if j.pid == p.pid), None)
            w = torchrun.job_workers(job) if job else None
            return w if w and w.ranks == 2 and w.workers_per_rank == 3 else None
        w = wait_for(counted, timeout=60, what="the fake torchrun's tree")
        assert (w.torchrun_pid, w.ranks, w.workers_per_rank) == (p.pid, 2, 3)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


# -- the whole report ---------------------------------------------------------------------


def _nvml_here():
    b = NvmlBackend()
    ok = b.init()
    b.shutdown()
    return ok, b.error


@pytest.mark.own_pids  # (the CPU budget counts the newest running torchrun's workers: twice, compared)
def test_real_doctor_on_this_machine(runs_dir):
    t0 = time.monotonic()
    r = run_ddptop("doctor", "--json", timeout=120)
    took = time.monotonic() - t0
    assert r.returncode in (0, 1, 2), r.stderr
    doc = json.loads(r.stdout)
    rows = {row["name"]: row for row in doc["rows"]}
    assert list(rows) == ["GPUs", "GPU health", "Driver / CUDA / NCCL", "Known problems", "GPU P2P", "NVLink", "NVSwitch fabric",
                          "PCIe ACS", "IOMMU",
                          "/dev/shm", "ulimit -l", "Run directory disk", "Stack sampling (ptrace)", "CPU budget", "InfiniBand", "NCCL network",
                          "Master port", "Environment"]
    statuses = {row["status"] for row in doc["rows"]}
    assert statuses <= {"ok", "warn", "fail", "skipped"}
    assert r.returncode == (2 if "fail" in statuses else 1 if "warn" in statuses else 0) == doc["summary"]["exit_code"]
    ok, err = _nvml_here()
    if not ok:
        for name in ("GPUs", "GPU P2P"):
            assert rows[name]["status"] == "skipped" and err in rows[name]["summary"]
    else:
        assert rows["GPUs"]["status"] in ("ok", "warn", "fail")
    cores = len(os.sched_getaffinity(0))
    assert rows["CPU budget"]["evidence"][0] == f"{cores} core(s) usable by this process (os.sched_getaffinity)"
    print(f"doctor took {took:.1f}s")
    # the table says the same, and exits the same
    t = run_ddptop("doctor", timeout=120)
    assert t.returncode == r.returncode
    for name, row in rows.items():
        assert f"{row['status']:<8} {name} " in t.stdout
    assert t.stdout.rstrip().endswith(f"(exit {r.returncode})")


def test_the_doctor_process_never_imports_torch():
    code = ("import sys, io, contextlib\nfrom ddptop.core.tools.doctor import run_checks\nrun_checks(workers=1)\n"
            "print('torch' in sys.modules, 'textual' in sys.modules, 'rich' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-3:] == ["False", "False", "False"]


def test_help_lists_doctor():
    r = run_ddptop("--help", timeout=60)
    assert "ddptop doctor [--json] [--workers N] [--master-port P]" in r.stdout
    r = run_ddptop("doctor", "--help", timeout=60)
    assert r.returncode == 0 and "--master-port" in r.stdout
