"""The mission's own case on one real GPU: the GPU busy, no step progress.

Run on a GPU machine:  python3 -m pytest -q -s tests/gpu/test_one_gpu_hang_real.py

One GPU means one NCCL rank (NCCL refuses two ranks on one device), so the
hang here is a GPU that stops finishing its work: a one-rank NCCL job trains
(a matmul, an NCCL all-reduce, ``loss.item()``), then queues a kernel that
does not end for minutes (``torch.cuda._sleep``, as a spinning NCCL kernel
whose peer never comes would) and waits for it at its next sync.  ddptop,
launching it as torchrun would, must:

* raise one stall alarm, seconds after the missed step, while NVML reads the
  GPU busy (>= 90%);
* name the rank's own line, the sync it waits at, read as waiting on the GPU
  ("gpu-wait"): from the CUDA frames of a native dump, or from NVML;
* do it both ways a CUDA wait can look: spinning (CUDA's default) and asleep on
  a blocking event (``cudaEventBlockingSync``, the form that makes a waiting
  rank look idle rather than busy); and at a kernel's first launch behind the
  wedged kernel (lazy module loading holds it), said as a launch with the
  eager-load profile first, which under ``CUDA_MODULE_LOADING=EAGER`` moves
  the wait to the sync;
* stop the job it launched with ``--on-stall kill`` (exit 124), no rank left.

Figures (the alarm's latency after the missed step, the GPU's utilisation)
are printed (``-s``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU here (torch.cuda.is_available() is false)", allow_module_level=True)
try:
    torch.cuda.nccl.version()
except Exception:  # a build without NCCL  # noqa: BLE001
    pytest.skip("torch has no NCCL", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 300

JOB = r'''
import os, sys, time
import torch
import torch.distributed as dist

how, wedge = sys.argv[1], int(sys.argv[2])
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.manual_seed(0)
w = torch.randn(1024, 1024, device="cuda")
x = torch.randn(256, 1024, device="cuda")
for step in range(1, 100_000):
    loss = (x @ w).tanh().square().mean()
    dist.all_reduce(loss)
    if step == wedge:
        print("the GPU wedges now (a kernel that does not end)", flush=True)
        torch.cuda._sleep(10 ** 12)  # minutes of GPU time in one kernel
        if how == "launch":
            first = x.cumsum(0)  # WAIT launch
    if how == "blocking":
        done = torch.cuda.Event(blocking=True)
        done.record()
        done.synchronize()  # WAIT blocking
    value = loss.item()  # WAIT spin
    print(f"step {step} loss {value:.4f}", flush=True)
    time.sleep(0.1)
'''


def line_of(marker: str) -> int:
    return 1 + next(i for i, line in enumerate(JOB.splitlines()) if line.endswith(marker))


# how the rank meets the wedged GPU, the line it waits at, and the environment: at a sync (spinning, or asleep
# on a blocking event); at the first launch of a kernel (under CUDA's lazy module loading a first launch waits
# for the kernels running: on an H100 it sat in cuLaunchKernel, tests/data/h100/); and the same job under the
# eager-load profile's CUDA_MODULE_LOADING=EAGER, where that launch returns and the rank waits at its sync
CASES = {"spin": ("spin", "spin", {}), "blocking": ("blocking", "blocking", {}), "launch": ("launch", "launch", {}),
         "launch-eager": ("launch", "spin", {"CUDA_MODULE_LOADING": "EAGER"})}


@pytest.mark.parametrize("case", list(CASES))
def test_a_wedged_gpu_alarms_with_the_rank_at_its_cuda_wait(tmp_path, case):
    how, at, extra = CASES[case]
    script = tmp_path / "one_gpu_job.py"
    script.write_text(JOB)
    env = dict(os.environ, DDPTOP_RUNS_DIR=str(tmp_path / "runs"), DDPTOP_MIN_SILENCE="5", PYTHONUNBUFFERED="1",
               **extra)
    env.pop("CUDA_VISIBLE_DEVICES", None) if env.get("CUDA_VISIBLE_DEVICES") == "" else None
    p = subprocess.Popen([sys.executable, "-m", "ddptop", "--json", "--gpu", "auto", "--on-stall", "kill",
                          "torchrun", "--nproc-per-node", "1", str(script), how, "20"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                         cwd=ROOT, env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(30)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    rank_pids = {e["pid"] for e in events if e["kind"] == "rank" and e.get("pid")}
    left = [pid for pid in rank_pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    stalls = [e for e in events if e["kind"] == "alarm" and e["type"] == "stall"]
    steps = [e for e in events if e["kind"] == "log" and e.get("rank") == 0 and e["text"].startswith("step ")]
    gpus = [e for e in events if e["kind"] == "gpu"]
    print(f"\n[{case}] exit {p.returncode}; {len(steps)} steps, {len(gpus)} GPU samples, {len(stalls)} stall alarm(s)")
    assert p.returncode == 124, err[-3000:]
    assert not left, f"ranks {left} outlived the kill"
    assert len(stalls) == 1, stalls
    a = stalls[0]
    print(a["message"])
    last_step = max(e["t"] for e in steps if e["t"] <= a["t"])
    busy = [e["util"] for e in gpus if last_step <= e["t"] <= a["t"] and e.get("util") is not None]
    print(f"alarm {a['t'] - last_step:.1f} s after the last step; GPU utilisation meanwhile: {busy}")
    assert a["culprits"] in ([], [0]), a  # (one rank: no odd one out to name, or that rank)
    assert "every rank waits in the same collective" not in a["message"]  # (there is no other rank)
    # where the rank waits: the alarm's own (a culprit's), else the stack sample it was judged on
    samples = [e for e in events if e["kind"] == "stacks" and "0" in e["where"]]
    assert a["where"].get("0") or samples, "no stack sample of rank 0"
    w0 = a["where"].get("0") or ([e for e in samples if e["t"] <= a["t"]] or samples)[-1]["where"]["0"]
    print(f"rank 0: {w0['kind']} (gpu {w0.get('gpu')!r}, native {w0.get('native')!r}) at line {w0['line']}: "
          f"{w0['text']}")
    assert Path(w0["file"]).name == script.name and w0["line"] == line_of(f"# WAIT {at}"), w0
    assert w0["kind"] == "gpu-wait", w0
    wait = {"spin": "loss.item()", "blocking": "done.synchronize()", "launch": "x.cumsum(0)"}[at]
    assert f"Rank 0 waits on the GPU at {script.name}:{line_of(f'# WAIT {at}')} `" in a["message"], a["message"]
    assert wait in a["message"] and re.search(r"its GPU at (9\d|100)%", a["message"]), a["message"]
    assert busy and max(busy) >= 90, busy
    launching = "waits inside a kernel launch" in a["message"]
    print(f"suggested profiles: {a['suggested_profiles']}")
    assert launching == (at == "launch"), a["message"]
    assert (a["suggested_profiles"][:1] == ["eager-load"]) == (at == "launch"), a["suggested_profiles"]
