"""`ddptop bench p2p` on real GPUs.  Skipped without NVML and a CUDA torch.

Run on a GPU machine:  python3 -m pytest -q -s tests/gpu
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddptop.core.sources.gpu_nvml import NvmlBackend

ROOT = Path(__file__).resolve().parents[2]
backend = NvmlBackend()
pytestmark = pytest.mark.skipif(not backend.init(), reason=f"no NVML here: {backend.error}")


def test_bench_figures_sit_under_the_links_theoretical_rates():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    r = subprocess.run([sys.executable, "-m", "ddptop", "bench", "p2p", "--json", "--copy-mb", "256",
                        "--sizes", "1048576,67108864,268435456", "--timeout", "120"],
                       capture_output=True, text=True, timeout=1800, cwd=ROOT)
    rep = json.loads(r.stdout)
    print("\n" + "\n".join(rep["links"]))
    for row in rep["rows"]:
        print({k: row[k] for k in ("test", "where", "size", "status", "gbs", "pct", "latency_us", "message")})
    assert r.returncode in (0, 1), r.stderr  # 2 would be a hang
    assert rep["links"] and all("PCIe gen" in line for line in rep["links"])
    by = lambda test: [x for x in rep["rows"] if x["test"] == test]  # noqa: E731
    for test in ("d2d", "h2d", "d2h"):
        rows = by(test)
        assert rows and all(x["status"] == "ok" and x["gbs"] > 0 for x in rows), rows
        # against the link's theoretical rate: a figure above it means the rate (or the timing) is wrong
        assert all(x["pct"] is not None and 5 < x["pct"] <= 105 for x in rows), rows
    if torch.cuda.device_count() >= 2:
        p2p = [x for x in by("copy p2p") if x["status"] == "ok"]
        assert all(x["pct"] is not None and x["pct"] <= 105 for x in p2p), p2p
        ar = by("allreduce")
        assert ar and all(x["status"] == "ok" and "nccl" in x["where"] for x in ar), ar
