"""`ddptop diagnose` on what real torchrun runs on this machine print: a TORCH_DISTRIBUTED_DEBUG=DETAIL
collective mismatch, a stop from outside (SIGHUP) and a rank killed by SIGKILL.

(Logs from anywhere, written in the shapes the tools document: tests/unit/test_diagnose_anywhere.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from helpers import free_port, wait_for

from ddptop.core.tools.diagnose import analyze_paths, report


# ---- 6. collective mismatches and desyncs -----------------------------------------------------------------


def test_a_real_detail_mismatch_from_this_machines_torch(tmp_path):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL, 3 real gloo ranks, rank 2 broadcasting where the others all-reduce."""
    script = tmp_path / "mm.py"
    script.write_text("import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                      "t = torch.ones(4)\ndist.all_reduce(t)\n"
                      "dist.broadcast(t, 0) if dist.get_rank() == 2 else dist.all_reduce(t)\n")
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    out = tmp_path / "console.txt"
    with open(out, "w") as fh:
        subprocess.run([torchrun, "--nproc-per-node", "3", "--master-port", str(free_port()), str(script)],
                       stdout=fh, stderr=subprocess.STDOUT, timeout=120, cwd=tmp_path,
                       env=dict(os.environ, TORCH_DISTRIBUTED_DEBUG="DETAIL"))
    rep = report(analyze_paths([str(out)]))
    assert rep["root_cause"]["signature"] == "collective-mismatch", out.read_text()[-3000:]
    assert rep["culprits"] == [2]


LOOP = """\
import os, signal, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
for step in range(1, 10000):
    print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    if step == 3 and r == 1 and sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
"""


# ---- the real thing: torchrun's own lines for an outside stop and a SIGKILL -------------------------------


@pytest.mark.parametrize("how", ["sighup", "kill"])
def test_real_torchrun_an_outside_stop_and_a_sigkill(tmp_path, how):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    out = tmp_path / "console.txt"
    with open(out, "w") as fh:
        p = subprocess.Popen([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), "--tee", "3",
                              str(script), how], stdout=fh, stderr=subprocess.STDOUT, cwd=tmp_path,
                             start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            if how == "sighup":
                wait_for(lambda: "step 5 " in out.read_text(), timeout=60, what="the ranks' 5th step")
                p.send_signal(signal.SIGHUP)  # (what a closed terminal sends torchrun)
            p.wait(timeout=60)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
    r = subprocess.run([sys.executable, "-m", "ddptop", "diagnose", "--json", str(out)], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    rep = json.loads(r.stdout)
    rc = rep["root_cause"]
    if how == "sighup":
        assert rc["signature"] == "outside-stop" and rc["detail"]["signal"] == "SIGHUP", out.read_text()[-2000:]
        assert rep["culprits"] == [] and rep["progress"]["0"]["last_step"] >= 5
    else:
        assert rc["signature"] == "rank-signal" and rc["rank"] == 1 and rc["detail"]["signal"] == "SIGKILL", \
            out.read_text()[-2000:]
        assert rep["culprits"] == [1]
