"""How a rank waits on a GPU, beyond spinning: real ddptop, real torchrun, real ranks.

A rank of an NCCL job whose peers never come waits at its next CUDA
synchronisation.  By default CUDA spins there (tests/integration/test_gpu_forms_e2e.py);
with blocking synchronisation (``cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync)``,
``torch.cuda.Event(blocking=True)``) the waiting thread *sleeps* under the CUDA
call: py-spy shows it idle, at 0% CPU, while its GPU reads busy.  And a rank
can be stuck in the CUDA driver itself: a call that does not wait for the GPU
(``cudaEventDestroy``) blocked on the driver's lock, which a Python host
function holds while it waits for the GIL the rank holds.

``examples/train_ddp.py --sim-cuda on`` reproduces both on a CPU, on the CUDA
runtime stand-in (examples/cuda_stub, built with gcc): ``--sim-cuda-sync
blocking`` and ``--fault driver-lock``.  ddptop sees only what it would see on
a GPU: py-spy's frames (with the CUDA runtime's and libc's native ones) and
the simulated GPUs (a rank's runnable time: its stream's kernels keep it busy
while the rank itself sleeps).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import EXAMPLE, diagnose_agrees, json_events, only_run, run_ddptop
from helpers import free_port

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                                reason="the CUDA runtime stand-in is built with a C compiler")

SOURCE = Path(EXAMPLE).read_text().splitlines()


def line_of(text: str) -> int:
    return 1 + next(i for i, line in enumerate(SOURCE) if text in line)


SYNC = line_of("cudart.cudaStreamSynchronize(stream.handle)")  # loss.item() on a GPU
STUCK = line_of("time.sleep(86400)")  # the hung rank, in its data loading
LOCKED = line_of("cudart_gil.cudaEventDestroy(timer)")  # the rank deadlocked on the driver's lock


@pytest.fixture
def cuda_cache(tmp_path_factory, monkeypatch):
    """One build of the stand-in for the whole module (the example builds it on first use)."""
    d = Path(os.environ.get("DDPTOP_TEST_CUDA_CACHE") or tmp_path_factory.getbasetemp() / "cuda-cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(d))
    return d


# the least silence that is a hang, for the hang tests: 5 s (DDPTOP_MIN_SILENCE; 10 s by default)
HANG_ENV = {"DDPTOP_MIN_SILENCE": "5"}


def launch(*args, nproc=2, sync="blocking", ddptop=("--on-stall", "kill"), timeout=240, env=None):
    """``env``: settings for ddptop on top of this environment (a test's shorter thresholds)."""
    r = run_ddptop("--json", "--gpu", "sim", *ddptop, "torchrun", "--nproc-per-node", str(nproc),
                   "--master-port", str(free_port()), EXAMPLE, "--sim-cuda", "on", "--sim-cuda-sync", sync, *args,
                   timeout=timeout, env={**os.environ, **(env or {})})
    return r, json_events(r.stdout)


def stalls(events):
    return [e for e in events if e["kind"] == "alarm" and e["type"] == "stall"]


def samples(events, alarm):
    """The stack samples the alarm rests on (the last stacks event before it)."""
    return [e for e in events if e["kind"] == "stacks" and e["t"] <= alarm["t"]][-1]


def main_threads(text: str) -> list[list[str]]:
    """Every MainThread block in a file of py-spy dumps: header, then frames innermost first
    (without --locals' arguments and locals)."""
    blocks, cur = [], None
    for line in text.splitlines():
        if line.startswith("Thread "):
            cur = [line.strip()] if '"MainThread"' in line else None
            if cur is not None:
                blocks.append(cur)
        elif cur is not None and line.startswith("    ") and not line.startswith("     "):
            cur.append(line.strip())
    return blocks


def dumped(runs_dir: Path, rank: int) -> list[list[str]]:
    """Rank ``rank``'s main thread in every dump ddptop took of it (its stacks directories:
    the samples, native or not, and the dump kept for the person)."""
    files = sorted(only_run(runs_dir).glob(f"stacks/*/rank{rank}.*txt"))
    assert files, f"no dumps of rank {rank}"
    return [block for f in files for block in main_threads(f.read_text())]


def native(blocks: list[list[str]]) -> list[list[str]]:
    """The native dumps among them (those with the CUDA runtime stand-in's frames)."""
    return [b for b in blocks if any("libcudart.so.12)" in f for f in b)]


def gpu_util(events, alarm, index) -> list[float]:
    """The simulated GPU ``index``'s utilisation in the 10 s before the alarm."""
    return [e["util"] for e in events if e["kind"] == "gpu" and e["index"] == index
            and alarm["t"] - 10 <= e["t"] <= alarm["t"] and e["util"] is not None]


def test_ranks_asleep_at_their_cuda_sync_wait_and_the_rank_stuck_in_python_is_named(runs_dir, cuda_cache):
    """3 ranks, blocking sync.  Rank 1 is stuck in its data loading (``time.sleep``, before
    its all-reduce); ranks 0 and 2 sleep at their sync line (idle, inside
    ``cudaStreamSynchronize`` in ``pthread_cond_wait``), their GPUs busy with the all-reduce
    kernel that waits for rank 1.  Two ranks idle in C and one idle in Python: the sleeping
    ones wait on the GPU; the culprit is rank 1, at its line."""
    r, events = launch("--steps", "100000", "--step-time", "0.05", "--fault", "hang", "--fault-rank", "1",
                       "--fault-step", "30", nproc=3, env=HANG_ENV)
    assert r.returncode == 124, r.stderr[-2000:]
    (a,) = stalls(events)
    # the setup: ddptop's own dumps found ranks 0 and 2 asleep inside the CUDA call at the sync line
    for rank in (0, 2):
        for frames in dumped(runs_dir, rank):
            assert "(idle" in frames[0] and f"train_sim_cuda ({EXAMPLE}:{SYNC})" in frames, frames
        assert native(dumped(runs_dir, rank)), dumped(runs_dir, rank)
        for frames in native(dumped(runs_dir, rank)):
            inner = frames[1:next(i for i, f in enumerate(frames) if f.startswith("cudaStreamSynchronize ("))]
            assert any(f.startswith("pthread_cond_wait (") for f in inner), frames
    # ... their GPUs busy, rank 1's idle, as on GPUs
    assert max(gpu_util(events, a, 0)) > 50 and max(gpu_util(events, a, 2)) > 50, events
    assert min(gpu_util(events, a, 1)) < 20, gpu_util(events, a, 1)
    # the verdict
    assert a["culprits"] == [1] and a["where"]["1"]["line"] == STUCK, a
    msg = a["message"]
    assert f"rank 1 is in `next_batch` at train_ddp.py:{STUCK} (`time.sleep`)" in msg, msg
    assert f"Ranks 0,2 wait on the GPU at train_ddp.py:{SYNC}" in msg and "cudaStreamSynchronize" in msg, msg
    s = samples(events, a)
    assert s["native"] and sorted(s["waiting"]) == [0, 2] and s["culprits"] == [1], s
    for rank in ("0", "2"):
        assert s["where"][rank]["kind"] == "gpu-wait" and s["where"][rank]["line"] == SYNC, s["where"]
    diagnose_agrees(only_run(runs_dir), a)


@pytest.mark.parametrize("sync", ["spin", "blocking"])
def test_a_rank_deadlocked_on_the_cuda_driver_lock_is_named_as_such(runs_dir, cuda_cache, sync):
    """``--fault driver-lock``: rank 1, holding the GIL, blocks in ``cudaEventDestroy`` on the
    driver's lock (``pthread_rwlock_wrlock``), held by its stream's thread, which runs a Python
    host function and waits for the GIL; rank 1 never issues its all-reduce, and rank 0 waits at
    its sync (spinning, or asleep).  Rank 1 does not wait for the GPU, it is stuck in the
    driver: the culprit, at its line, said to be on the CUDA driver's lock (kind ``gpu-lock``)."""
    r, events = launch("--steps", "100000", "--step-time", "0.05", "--fault", "driver-lock", "--fault-rank", "1",
                       "--fault-step", "30", sync=sync, env=HANG_ENV)
    assert r.returncode == 124, r.stderr[-2000:]
    (a,) = stalls(events)
    # the setup: rank 1's main thread idle in pthread_rwlock_wrlock inside cudaEventDestroy, at its line
    for f in dumped(runs_dir, 1):
        assert "(idle" in f[0] and f"deadlock_on_the_driver_lock ({EXAMPLE}:{LOCKED})" in f, f
    assert native(dumped(runs_dir, 1)), dumped(runs_dir, 1)
    for f in native(dumped(runs_dir, 1)):
        inner = f[1:next(i for i, x in enumerate(f) if x.startswith("cudaEventDestroy ("))]
        assert inner and inner[-1].startswith("pthread_rwlock_wrlock ("), f
    # the verdict
    assert a["culprits"] == [1] and a["where"]["1"]["line"] == LOCKED, a
    assert "lock" in a["message"].lower(), a["message"]
    assert f"train_ddp.py:{LOCKED}" in a["message"], a["message"]
    s = samples(events, a)
    assert s["native"] and s["culprits"] == [1] and s["waiting"] == [0], s
    assert s["where"]["1"]["kind"] == "gpu-lock" and s["where"]["1"]["line"] == LOCKED, s["where"]
    assert s["where"]["0"]["kind"] == "gpu-wait" and s["where"]["0"]["line"] == SYNC, s["where"]
    rep = diagnose_agrees(only_run(runs_dir), a)
    assert rep["stacks"]["ranks"]["1"]["kind"] == "gpu-lock"  # (the run's latest sampling, read post-mortem)


def test_steps_asleep_at_the_cuda_sync_for_seconds_are_no_hang(runs_dir, cuda_cache):
    """A healthy job with blocking sync whose every step's GPU work takes 0.7 to 4 s (varying; the
    least silence that is a hang is 3 s here, DDPTOP_MIN_SILENCE, so the longest steps outlast it):
    every rank sleeps at its sync line, idle, for most of each step, while its GPU is busy.
    No alarm."""
    import random

    steps = 8
    # (the example draws step N's GPU time from random.Random(N): two of these eight outlast the 3 s)
    assert sum(random.Random(n).uniform(0.7, 4) > 3 for n in range(1, steps + 1)) >= 2
    r, events = launch("--steps", str(steps), "--step-time", "0", "--gpu-step-time", "0.7:4", ddptop=(),
                       timeout=400, env={"DDPTOP_MIN_SILENCE": "3"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert stalls(events) == [], stalls(events)
    assert any(e["kind"] == "log" and e["text"].startswith(f"step {steps} ") for e in events)
    # the GPUs were busy meanwhile (the ranks' own threads asleep)
    busy = [e["util"] for e in events if e["kind"] == "gpu" and e["util"] is not None]
    assert sum(u > 50 for u in busy) > len(busy) / 2, busy
