"""`ddptop bench p2p`: the CPU/gloo path end to end, and a hang reported as a hang.

(The pure parts: tests/unit/test_bench_p2p.py.)"""

import json
import os
import subprocess
import uuid

import psutil
import pytest

from conftest import ROOT, ddptop_cmd


def run_bench(*args, env=None, timeout=300):
    r = subprocess.run(ddptop_cmd("bench", "p2p", "--json", *args), capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT, env=env)
    return r.returncode, json.loads(r.stdout), r.stderr


def test_without_a_gpu_pairs_are_skipped_and_the_all_reduce_runs_on_gloo():
    # (no CUDA GPU for the benchmark's workers on any machine: conftest.no_cuda_outside_tests_gpu;
    # tests/gpu measures real ones)
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == ""
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
    code, rep, err = run_bench("--sizes", "4096,65536", "--timeout", "12", env=env)
    ar = [r for r in rep["rows"] if r["test"] == "allreduce"]
    assert code == 2
    # one hang ends the sweep: a collective that hangs once hangs for every size
    assert len(ar) == 1 and ar[0]["status"] == "hang" and "no answer in 12 s" in ar[0]["message"], ar
    # the hung worker and its ranks were killed, by process group
    left = [p.pid for p in psutil.process_iter() if _tagged(p, tag)]
    assert not left, f"benchmark processes left behind: {left}"


@pytest.mark.parametrize("how, said", [
    ("CRASH", "rank 1 died (killed by SIGSEGV) during the all-reduce"),
    # an exception on one rank while rank 0 waits in the collective
    ("FAIL", "rank 1: RuntimeError: injected failure"),
])
def test_a_rank_that_fails_in_the_all_reduce_is_an_error_naming_it_not_a_hang(how, said):
    tag = uuid.uuid4().hex
    env = dict(os.environ, DDPTOP_TEST_TAG=tag, **{f"DDPTOP_BENCH_{how}_RANK": "1"})
    code, rep, err = run_bench("--sizes", "4096", "--timeout", "60", env=env)
    (ar,) = [r for r in rep["rows"] if r["test"] == "allreduce"]
    assert code == 1, err  # an error, not a hang (2)
    # noticed when the rank failed: at the 60 s timeout it would say "hang"
    assert ar["status"] == "error" and said in ar["message"], ar
    left = [p.pid for p in psutil.process_iter() if _tagged(p, tag)]
    assert not left, f"benchmark processes left behind: {left}"


def _tagged(p, tag) -> bool:
    try:
        return p.environ().get("DDPTOP_TEST_TAG") == tag
    except psutil.Error:
        return False
