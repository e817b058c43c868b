"""Record how real failures of a one-GPU NCCL job look, live to ddptop and after the fact.

Run on a GPU machine (not a test: it writes evidence for the CPU tests to read):

    python3 tests/gpu/record_failures.py OUTDIR [CASE ...]

Each case launches ``ddptop --json ... torchrun --nproc-per-node 1 JOB MODE``
into ``OUTDIR/CASE/run`` and keeps what a person would look at:

* ``events.jsonl``: ddptop's live events (its alarms, its stack samples, the
  rank's lines as they came);
* ``native.txt``, ``nonblocking.txt``, ``threads.txt``: once ddptop has
  alarmed, ``py-spy dump --native`` and ``--nonblocking`` of the rank and its
  threads' states and kernel wait channels, taken by this script;
* ``diagnose.txt``, ``diagnose.json``: ``ddptop diagnose`` of the run when it
  has ended: the post-mortem, to set beside the live alarm;
* the run directory itself: the rank's log, the journal, any flight-recorder
  dump.

The cases (one GPU means one NCCL rank: the hangs are a GPU that stops
finishing its work, as a spinning NCCL kernel whose peer never comes would):

* ``collective-timeout``: a kernel that does not end, then an all-reduce and
  ``loss.item()``; the process group's 20 s timeout fires after ddptop's
  alarm: NCCL's watchdog, the flight recorder's dump (``--profile
  flight-recorder``), ``NCCL_DEBUG=INFO`` (``--profile nccl-debug``);
* ``barrier``: the same kernel, then ``dist.barrier()``, which blocks the host
  inside c10d's own code (native frames of libtorch_cuda);
* ``sleep-sync``: the CUDA context made with blocking sync
  (``CU_CTX_SCHED_BLOCKING_SYNC``, as some frameworks and users set), so the
  rank waits at ``loss.item()`` asleep in the driver, not spinning;
* ``oom``: a step asks for more memory than the GPU has;
* ``device-assert``: an index out of range on the GPU (a device-side assert).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

JOB = r'''
import ctypes, datetime, os, sys, time

mode = sys.argv[1]
if mode == "sleep-sync":
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    assert cuda.cuDevicePrimaryCtxSetFlags(0, 4) == 0  # CU_CTX_SCHED_BLOCKING_SYNC, before torch makes the context
import torch
import torch.distributed as dist

dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=20))
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.manual_seed(0)
w = torch.randn(1024, 1024, device="cuda")
x = torch.randn(256, 1024, device="cuda")
torch.cuda._sleep(1000)  # every kernel used below launched once first (lazy loading would hold a first launch)
torch.cuda.synchronize()
for step in range(1, 100_000):
    loss = (x @ w).tanh().square().mean()
    dist.all_reduce(loss)
    if step == 8:
        if mode in ("collective-timeout", "barrier", "sleep-sync"):
            print("the GPU wedges now (a kernel that does not end)", flush=True)
            torch.cuda._sleep(10 ** 12)  # minutes of GPU time in one kernel
            if mode == "barrier":
                dist.barrier()  # WAIT barrier
            else:
                dist.all_reduce(loss)  # WAIT collective
        elif mode == "oom":
            big = torch.empty(1 << 44, dtype=torch.uint8, device="cuda")  # WAIT oom: 16 TiB
        elif mode == "device-assert":
            index = torch.tensor([5000], device="cuda")
            picked = x[index]  # WAIT assert: row 5000 of 256
            torch.cuda.synchronize()
    value = loss.item()  # WAIT item
    print(f"step {step} loss {value:.4f}", flush=True)
    time.sleep(0.25)
dist.destroy_process_group()
'''

CASES = {
    "collective-timeout": ["--profile", "flight-recorder", "--profile", "nccl-debug"],
    "barrier": ["--profile", "flight-recorder"],
    "sleep-sync": [],
    "oom": [],
    "device-assert": [],
}
HANGS = {"collective-timeout", "barrier", "sleep-sync"}
CASE_TIMEOUT = 75  # seconds for one case at most: start, 8 steps, the alarm, the 20 s collective timeout, the teardown
AFTER_WATCHDOG = 12  # seconds a case runs on once NCCL's watchdog has said its timeout (its rank lingers: seen on an H100)
AFTER_ALARM = 25  # seconds a hang with no collective under way (no watchdog to come) runs on after the alarm


REHEARSAL = os.environ.get("RECORD_REHEARSAL") == "1"  # the same cases on gloo and the CPU: checks this script


def rehearsal(job: str) -> str:
    for a, b in (('"nccl"', '"gloo"'), ('device="cuda"', 'device="cpu"'), ("torch.cuda._sleep(10 ** 12)", "time.sleep(1000)"),
                 ("torch.cuda._sleep(1000)", "pass"), ("torch.cuda.synchronize()", "pass"),
                 ("torch.cuda.set_device(", "int("), ('ctypes.CDLL("libcuda.so.1")', "None"),
                 ("cuda.cuInit(0) == 0", "True"), ("cuda.cuDevicePrimaryCtxSetFlags(0, 4) == 0", "True")):
        job = job.replace(a, b)
    return job


def run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, -9, e.stdout or "", f"{e.stderr or ''}\n(timed out after {timeout} s)")


def threads_of(pid: int) -> str:
    rows = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda p: int(p.name)):
        try:
            stat = (task / "stat").read_text()
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            wchan = (task / "wchan").read_text().strip() if (task / "wchan").exists() else "?"
            rows.append(f"{task.name}\t{name}\tstate={fields[0]}\tutime={fields[11]}\tstime={fields[12]}\twchan={wchan}")
        except (OSError, ValueError, IndexError) as e:
            rows.append(f"{task.name}\t({e})")
    return "\n".join(rows) + "\n"


def rank_pids(events: list[dict]) -> list[int]:
    return sorted({e["pid"] for e in events if e.get("kind") == "rank" and e.get("pid")})


def record(case: str, out: Path, py_spy: str | None) -> dict:
    d = out / case
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    (d / "job.py").write_text(rehearsal(JOB) if REHEARSAL else JOB)
    env = dict(os.environ, DDPTOP_RUNS_DIR=str(d / "runs"), DDPTOP_MIN_SILENCE="5", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "ddptop", "--json", "--gpu", "auto", "--run-dir", str(d / "run"), *CASES[case],
           "torchrun", "--nproc-per-node", "1", "--master-port", str(29611 + list(CASES).index(case)), "job.py", case]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                         cwd=d, env=env, start_new_session=True)
    events: list[dict] = []
    alarmed = threading.Event()
    watchdog: list[float] = []
    flight_noted: list[str] = []
    err: list[str] = []

    def read_out() -> None:
        with open(d / "events.jsonl", "w") as f:
            for line in p.stdout:
                f.write(line)
                f.flush()
                if line.startswith("{"):
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue
                    events.append(e)
                    if e.get("kind") == "alarm":
                        alarmed.set()
                    if e.get("kind") == "note" and str(e.get("message", "")).startswith("flight recorder ("):
                        flight_noted.append(e["message"])
                    if e.get("kind") == "log" and "Watchdog caught collective operation timeout" in e.get("text", ""):
                        watchdog.append(time.monotonic())

    reader = threading.Thread(target=read_out, daemon=True)
    reader.start()
    threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True).start()
    took: dict = {"case": case}
    if case in HANGS and alarmed.wait(90):
        took["alarm_after_s"] = round(time.monotonic() - t0, 1)
        time.sleep(1.0)  # ddptop's own sampling done
        pids = rank_pids(events)
        if pids and py_spy:
            pid = pids[0]
            for flag, name in (("--native", "native"), ("--nonblocking", "nonblocking")):
                t = time.monotonic()
                r = run([py_spy, "dump", flag, "--pid", str(pid)], 60)
                took[f"{name}_dump_s"] = round(time.monotonic() - t, 2)
                (d / f"{name}.txt").write_text(r.stdout + (f"\n(stderr) {r.stderr}" if r.stderr.strip() else ""))
            try:
                (d / "threads.txt").write_text(threads_of(pid))
            except OSError as e:
                (d / "threads.txt").write_text(f"({e})\n")
        alarm_at = time.monotonic()
    else:
        alarm_at = None
    while p.poll() is None and time.monotonic() - t0 < CASE_TIMEOUT:
        if flight_noted and not (d / "flight-at-alarm").exists() and (d / "run" / "flight").is_dir():
            # the dump ddptop asked for after its alarm (the timeout's own dump, later, replaces it)
            shutil.copytree(d / "run" / "flight", d / "flight-at-alarm")
        if watchdog and time.monotonic() - watchdog[0] > AFTER_WATCHDOG:
            break
        if alarm_at is not None and not watchdog and time.monotonic() - alarm_at > AFTER_ALARM:
            break
        time.sleep(0.2)
    took["watchdog_after_s"] = round(watchdog[0] - t0, 1) if watchdog else None
    try:
        p.wait(0.1)
    except subprocess.TimeoutExpired:
        took["stopped"] = True  # ddptop stops what it launched (its process group) on SIGTERM
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
    reader.join(10)
    took["exit"] = p.returncode
    took["seconds"] = round(time.monotonic() - t0, 1)
    (d / "ddptop.stderr.txt").write_text("".join(err))
    for args, name in ((["diagnose", str(d / "run")], "diagnose.txt"),
                       (["diagnose", "--json", str(d / "run")], "diagnose.json")):
        r = run([sys.executable, "-m", "ddptop", *args], 120, cwd=d, env=env)
        (d / name).write_text(r.stdout + (f"\n(stderr, exit {r.returncode}) {r.stderr}" if r.stderr.strip() else ""))
    alarms = [e for e in events if e.get("kind") == "alarm"]
    steps = [e["t"] for e in events if e.get("kind") == "log" and str(e.get("text", "")).startswith("step ")]
    stalls = [a["t"] for a in alarms if a.get("type") == "stall"]
    if steps and stalls:
        took["stall_after_last_step_s"] = round(stalls[0] - max(t for t in steps if t <= stalls[0]), 1)
    took["alarms"] = [{k: a.get(k) for k in ("type", "culprits", "message", "t")} for a in alarms]
    (d / "summary.json").write_text(json.dumps(took, indent=1))
    return took


def main() -> int:
    out = Path(sys.argv[1]).resolve()
    cases = sys.argv[2:] or list(CASES)
    out.mkdir(parents=True, exist_ok=True)
    py_spy = shutil.which("py-spy")
    for case in cases:
        took = record(case, out, py_spy)
        print(json.dumps(took)[:3000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
