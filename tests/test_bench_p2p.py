"""`ddptop bench p2p`: the arithmetic, the CPU/gloo path end to end, and a hang reported as a hang."""

import json
import os
import subprocess
import uuid

import psutil
import pytest

from conftest import ROOT, ddptop_cmd
from ddptop.bench_p2p import algbw, busbw, pcie_rate, percent


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


def run_bench(*args, env=None, timeout=300):
    r = subprocess.run(ddptop_cmd("bench", "p2p", "--json", *args), capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT, env=env)
    return r.returncode, json.loads(r.stdout), r.stderr


def test_without_a_gpu_pairs_are_skipped_and_the_all_reduce_runs_on_gloo():
    code, rep, err = run_bench("--sizes", "4096,1048576", "--timeout", "120")
    assert code == 0, err
    rows = rep["rows"]
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert skipped and "no CUDA GPU" in skipped[0]["message"]
    ar = [r for r in rows if r["test"] == "allreduce"]
    assert [r["size"] for r in ar] == [4096, 1048576]
    assert all(r["status"] == "ok" and r["where"] == "2 ranks (gloo, CPU)" for r in ar)
    for r in ar:  # the figures are consistent with the time measured
        assert r["gbs"] > 0 and r["algbw"] == pytest.approx(r["size"] / (r["latency_us"] / 1e6) / 1e9, rel=1e-6)
        assert r["gbs"] == pytest.approx(r["algbw"])  # 2 ranks: busbw = algbw


def test_a_hanging_all_reduce_is_reported_as_a_hang_within_its_timeout():
    tag = uuid.uuid4().hex
    env = dict(os.environ, DDPTOP_BENCH_HANG_RANK="1", DDPTOP_TEST_TAG=tag)
    code, rep, err = run_bench("--sizes", "4096,65536", "--timeout", "20", env=env)
    ar = [r for r in rep["rows"] if r["test"] == "allreduce"]
    assert code == 2
    # one hang ends the sweep: a collective that hangs once hangs for every size
    assert len(ar) == 1 and ar[0]["status"] == "hang" and "no answer in 20 s" in ar[0]["message"], ar
    # the hung worker and its ranks were killed, by process group
    left = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("DDPTOP_TEST_TAG") == tag:
                left.append(p.pid)
        except psutil.Error:
            pass
    assert not left, f"benchmark processes left behind: {left}"
