"""Real NCCL RAS on real GPUs.  Skipped without CUDA GPUs or without NCCL >= 2.24.

Run on a GPU machine:  python3 -m pytest -q tests/gpu/test_nccl_ras_real.py

* one GPU: a 1-rank NCCL job launched by ddptop answers a real RAS query on
  the port ddptop gave it (version, format, the rank's pid);
* two or more: one rank held back before an all-reduce the others launched is
  named by the alarm, from RAS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU here", allow_module_level=True)
try:
    NCCL = torch.cuda.nccl.version()
except Exception:  # a build without NCCL
    pytest.skip("torch has no NCCL", allow_module_level=True)
if tuple(NCCL[:2]) < (2, 24):
    pytest.skip(f"NCCL {NCCL} has no RAS (2.24+)", allow_module_level=True)

from ddptop.core.model import ras_types  # noqa: E402
from ddptop.core.sources import ras_client  # noqa: E402
from ddptop.core.analysis.ras_verdict import verdict as ras_verdict  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 240

SCRIPT = r"""
import os, sys, time, torch, torch.distributed as dist
held = int(sys.argv[1])
dist.init_process_group("nccl")
r = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.ones(1 << 20, device="cuda")
for step in range(1, 31):
    if r == held and step == 20:
        print(f"rank {r} holds back", flush=True)
        time.sleep(3600)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print(f"step {step}", flush=True)
    time.sleep(0.1)
if held < 0:
    print("waiting", flush=True)
    time.sleep(3600)
"""


def launch(tmp_path, n: int, held: int) -> subprocess.Popen:
    script = tmp_path / "ras_job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, DDPTOP_RUNS_DIR=str(tmp_path / "runs"))
    env.pop("NCCL_RAS_ADDR", None)
    return subprocess.Popen([sys.executable, "-m", "ddptop", "--json", "--on-stall", "kill", "torchrun",
                             "--nproc-per-node", str(n), str(script), str(held)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def test_one_rank_answers_a_real_ras_query(tmp_path):
    p = launch(tmp_path, 1, -1)
    try:
        deadline = time.time() + TIMEOUT
        run = None
        while time.time() < deadline:
            runs = list((tmp_path / "runs").glob("*/meta.json"))
            if runs and any("waiting" in f.read_text(errors="replace")
                            for f in runs[0].parent.glob("logs/*/attempt_0/0/stdout.log")):
                run = runs[0].parent
                break
            time.sleep(0.5)
        assert run is not None, "the job never got to its wait"
        meta = json.loads((run / "meta.json").read_text())
        addr = meta["env_set"]["NCCL_RAS_ADDR"]  # one port per launch, chosen by ddptop
        t0 = time.monotonic()
        st = ras_client.query(addr, timeout=10)
        took = time.monotonic() - t0
        print(f"RAS query: {took * 1000:.0f} ms, NCCL {st.version}, {st.format}")
        assert st.version.startswith(".".join(map(str, NCCL[:2])))
        pids = {e["pid"] for e in map(json.loads, (run / "events.jsonl").read_text().splitlines())
                if e.get("kind") == "rank" and e.get("alive")}
        assert ras_types.job_pids(st) == pids
        assert ras_verdict(st).culprits == []
        # the text report, as NCCL before 2.28.7 gives it (and any version without SET FORMAT)
        text = ras_client.query(addr, timeout=10, json_format=False)
        print(text.raw)
        assert text.format == "text" and text.version == st.version and not text.partial
        assert ras_verdict(text).culprits == [] and "Communicators" in text.raw
    finally:
        p.terminate()
        p.wait(timeout=60)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_the_held_back_rank_is_named_from_ras(tmp_path):
    n = min(torch.cuda.device_count(), 4)
    held = n - 1
    p = launch(tmp_path, n, held)
    out, err = p.communicate(timeout=TIMEOUT)
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    alarm = next(e for e in events if e["kind"] == "alarm" and e["type"] == "stall")
    said = [e for e in events if e["kind"] == "ras" and e["ok"]]
    print(alarm["message"])
    print("RAS query times:", [round(e["took"], 3) for e in said])
    assert said, [e for e in events if e["kind"] == "ras"]
    assert alarm["culprits"] == [held] and "(NCCL RAS)" in alarm["message"]
