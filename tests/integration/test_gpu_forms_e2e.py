"""The NCCL hang forms on GPUs, reproduced at the CUDA boundary: real torchrun, real ranks.

NCCL collectives are asynchronous: a rank whose peers never come does not
block inside the collective but spins at the next CUDA synchronisation point.
``examples/train_ddp.py --sim-cuda on`` runs its collectives (gloo, async) on a
simulated CUDA stream of ``examples/cuda_stub`` (a ``libcudart.so.12`` with the
runtime's own entry points, built here with gcc), and synchronises where real
training code does, through that library.  ddptop sees only what it would see
on a GPU: py-spy's frames (the CUDA runtime's among the native ones) and the
(simulated) GPU readings, which here are each rank's CPU use, as an NCCL
kernel's spin reads on a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
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
METRICS_SYNC = line_of("cudart.cudaEventSynchronize(metrics_done)")
STUCK = line_of("time.sleep(86400)")  # the hung rank, in its data loading


@pytest.fixture
def cuda_cache(tmp_path_factory, monkeypatch):
    """One build of the stand-in for the whole module (the example builds it on first use)."""
    d = Path(os.environ.get("DDPTOP_TEST_CUDA_CACHE") or tmp_path_factory.getbasetemp() / "cuda-cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(d))
    return d


# the least silence that is a hang, for the hang tests: 5 s (DDPTOP_MIN_SILENCE; 10 s by default)
HANG_ENV = {"DDPTOP_MIN_SILENCE": "5"}


def launch(*args, nproc=2, ddptop=("--on-stall", "kill"), timeout=240, env=None):
    """``env``: settings for ddptop on top of this environment (a test's shorter thresholds)."""
    r = run_ddptop("--json", "--gpu", "sim", *ddptop, "torchrun", "--nproc-per-node", str(nproc),
                   "--master-port", str(free_port()), EXAMPLE, "--sim-cuda", "on", *args, timeout=timeout,
                   env={**os.environ, **(env or {})})
    return r, json_events(r.stdout)


def stalls(events):
    return [e for e in events if e["kind"] == "alarm" and e["type"] == "stall"]


def last_step_t(events) -> float:
    return max(e["t"] for e in events if e["kind"] == "log" and e["text"].startswith("step "))


def test_a_rank_stuck_in_python_while_the_others_spin_at_their_cuda_sync_is_named_with_its_line(runs_dir, cuda_cache):
    r, events = launch("--steps", "100000", "--step-time", "0.05", "--fault", "hang", "--fault-rank", "1",
                       "--fault-step", "30", env=HANG_ENV)
    assert r.returncode == 124, r.stderr[-2000:]
    (a,) = stalls(events)
    assert a["culprits"] == [1] and a["where"]["1"]["line"] == STUCK, a
    msg = a["message"]
    assert f"rank 1 is in `next_batch` at train_ddp.py:{STUCK} (`time.sleep`)" in msg, msg
    assert f"Rank 0 waits on the GPU at train_ddp.py:{SYNC}" in msg and "(`cudaStreamSynchronize`, the CUDA runtime)" in msg, msg
    assert "its GPU idle" in msg
    # the stack samples read native frames, and say rank 0 waits on the GPU, not that it works
    (s,) = [e for e in events if e["kind"] == "stacks"]
    assert s["native"] and s["waiting"] == [0] and s["where"]["0"]["kind"] == "gpu-wait"
    assert s["where"]["0"]["gpu"] == "cuda-runtime" and s["where"]["0"]["line"] == SYNC
    diagnose_agrees(only_run(runs_dir), a)


def test_a_rank_in_another_collective_is_a_collective_mismatch_naming_it_and_both_places(runs_dir, cuda_cache):
    """3 ranks: ranks 0, 2 spin at the sync of their gradient all-reduce; rank 1 issued another
    collective and spins at the sync of that one (a metric's .item())."""
    r, events = launch("--steps", "100000", "--step-time", "0.05", "--fault", "other-collective",
                       "--fault-rank", "1", "--fault-step", "30", nproc=3, env=HANG_ENV)
    assert r.returncode == 124, r.stderr[-2000:]
    (a,) = stalls(events)
    assert a["id"] == "stall-mismatch" and a["culprits"] == [1], a
    assert a["where"]["1"]["line"] == METRICS_SYNC and a["where"]["0"]["line"] == SYNC
    assert "Collective mismatch" in a["message"]
    assert f"rank 1 waits on the GPU at train_ddp.py:{METRICS_SYNC}" in a["message"], a["message"]
    assert f"Ranks 0,2 wait on the GPU at train_ddp.py:{SYNC}" in a["message"], a["message"]
    diagnose_agrees(only_run(runs_dir), a)


def test_every_rank_in_the_first_collective_alarms_when_the_grace_runs_out_with_p2p_off_first(runs_dir, cuda_cache):
    """The broken-P2P start-up hang: every rank spins in the very first collective, the log empty but
    for the start-up lines.  No rank is the odd one out; the alarm comes when the first-step grace
    (120 s by default; 10 s here, DDPTOP_FIRST_STEP_GRACE) runs out, and suggests p2p-off first."""
    r, events = launch("--steps", "100000", "--fault", "p2p-hang", "--fault-step", "1", timeout=400,
                       env={"DDPTOP_FIRST_STEP_GRACE": "10"})
    assert r.returncode == 124, r.stderr[-2000:]
    (a,) = stalls(events)
    assert a["culprits"] == [] and a["suggested_profiles"][0] == "p2p-off", a
    started = min(e["t"] for e in events if e["kind"] == "rank" and e["alive"])
    assert a["t"] - started >= 10
    assert "since start-up without a first training step" in a["message"]
    assert f"Ranks 0,1 wait on the GPU at train_ddp.py:{SYNC}" in a["message"], a["message"]
    assert not any(e["kind"] == "log" and e["text"].startswith("step ") for e in events)
    diagnose_agrees(only_run(runs_dir), a)


def test_with_p2p_off_the_same_start_trains(runs_dir, cuda_cache, monkeypatch):
    """...and a healthy first step shorter than the grace stays silent (a slow start: 8 s, the grace 20 s:
    on a loaded machine the data loader's start and the first all-reduce around those 8 s take seconds)."""
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    r, events = launch("--steps", "40", "--step-time", "0.05", "--first-step-time", "8", "--fault", "p2p-hang",
                       "--fault-step", "1", timeout=300, env={"DDPTOP_FIRST_STEP_GRACE": "20"})
    assert r.returncode == 0, (stalls(events), r.stderr[-2000:])
    assert stalls(events) == []
    assert any(e["kind"] == "log" and e["text"].startswith("step 40 ") for e in events)


def test_steps_that_sit_at_the_cuda_sync_for_seconds_are_no_hang(runs_dir, cuda_cache):
    """Every step's GPU work takes 0.7 to 4 s (varying; the least silence that is a hang is 3 s here,
    DDPTOP_MIN_SILENCE, so the longest steps outlast it), all of it spent by every rank spinning at the
    sync line: no alarm."""
    import random

    steps = 8
    # (the example draws step N's GPU time from random.Random(N): two of these eight outlast the 3 s)
    assert sum(random.Random(n).uniform(0.7, 4) > 3 for n in range(1, steps + 1)) >= 2
    r, events = launch("--steps", str(steps), "--step-time", "0", "--gpu-step-time", "0.7:4", ddptop=(),
                       timeout=400, env={"DDPTOP_MIN_SILENCE": "3"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert stalls(events) == [], stalls(events)
    assert any(e["kind"] == "log" and e["text"].startswith(f"step {steps} ") for e in events)


def test_a_straggler_five_times_slower_is_never_a_hang(runs_dir, cuda_cache):
    r, events = launch("--steps", "40", "--step-time", "0.1", "--fault", "straggler", "--fault-rank", "1",
                       "--fault-step", "20", ddptop=(), timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    assert stalls(events) == [], stalls(events)
    assert any(e["kind"] == "log" and e["text"].startswith("step 40 ") for e in events)


@contextmanager
def _two_nodes_attached(tmp_path, sshd, fault: str):
    """Two torchrun nodes on this machine (a single torchrun would stop the survivor itself), one rank each,
    one ddptop per node, the example on the simulated CUDA runtime with ``fault`` on rank 1 at step 30,
    attached together over a real sshd: the attachment's process.  Afterwards every node's job is stopped
    and no rank is left."""
    import subprocess

    from conftest import ROOT, alive, ddptop_cmd, journal_events
    from ddptop.core.run.run_session import Session
    from sshd import remote_ddptop
    from test_attach_ssh import finish, launch as launch_node

    port = free_port()
    jobs = [launch_node(tmp_path / f"runs-{name}", "--nnodes", "2", "--node-rank", str(node_rank),
                        "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                        EXAMPLE, "--sim-cuda", "on", "--steps", "100000", "--step-time", "0.05",
                        "--fault", fault, "--fault-rank", "1", "--fault-step", "30")
            for node_rank, name in enumerate(("a", "b"))]
    w = None
    try:
        w = subprocess.Popen(ddptop_cmd("--json", "attach", f"node-a:{jobs[0][1]}", f"node-b:{jobs[1][1]}",
                                        "--ssh", " ".join(sshd.ssh), "--remote-ddptop", remote_ddptop(tmp_path)),
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        yield w
    finally:
        if w is not None and w.poll() is None:
            os.killpg(w.pid, 9)
        for p, run in jobs:
            if p.poll() is None:
                Session.open(run).stop()
    for p, run in jobs:
        finish(p)
        assert not any(alive(e["pid"]) for e in journal_events(run) if e["kind"] == "rank")


def test_a_peer_that_died_on_another_node_is_said_at_once_in_the_merged_view(tmp_path, sshd, cuda_cache):
    """Two torchrun nodes on this machine (a single torchrun would stop the survivor itself), one rank
    each, one ddptop per node, attached together over a real sshd.  Rank 1 (node-b) exits; rank 0
    (node-a) goes on spinning at its CUDA sync, as it would until NCCL's watchdog.  The merged view
    says so within seconds of the exit, naming rank 1 and its node."""
    from conftest import TIMEOUT, wait_for
    from test_attach_ssh import finish

    seen: list[dict] = []
    with _two_nodes_attached(tmp_path, sshd, "die") as w:

        def merged_stall():
            line = w.stdout.readline()
            if not line:
                return True
            seen.append(json.loads(line))
            e = seen[-1]
            return e["kind"] == "alarm" and e["type"] == "stall"

        wait_for(merged_stall, timeout=TIMEOUT, interval=0, what="the merged stall alarm")
        alarm = seen[-1]
        assert alarm["kind"] == "alarm", seen[-5:]
        assert alarm["id"] == "stall-lost-peer" and alarm["culprits"] == [1], alarm
        assert alarm["node"] == "node-b", alarm  # the culprit's node (issue 27)
        assert "rank 1 exited with code 1" in alarm["message"], alarm["message"]
        died = next(e for e in seen if e["kind"] == "rank" and e["rank"] == 1 and not e["alive"])
        assert died["node"] == "node-b" and alarm["t"] - died["t"] < 15, (died, alarm)
        # rank 0 is still there, spinning: nothing but ddptop's alarm has said anything yet
        assert any(e["kind"] == "rank" and e["rank"] == 0 and e["alive"] for e in seen)
        os.killpg(w.pid, 2)  # SIGINT: stop the job through the attachment
        finish(w)


def test_two_node_hang_with_the_culprit_on_the_second_node_is_one_alarm_naming_that_node(tmp_path, sshd, cuda_cache):
    """Issue 27: two torchrun nodes on this machine, one rank each, one ddptop per node, attached
    together over a real sshd.  Rank 1 (node-b) hangs in its data loading; rank 0 (node-a) spins at
    its CUDA sync.  Each node's ddptop has its own detector, the merged view one across both: what
    the person sees is one stall alarm, naming rank 1 and node-b in its fields; node-a's own view of
    the stall (its rank waiting, nobody of its own to blame) is not a separate alarm."""
    import threading
    import time

    from conftest import TIMEOUT, wait_for
    from ddptop.core.analysis.nodes import HOLD

    seen: list[dict] = []
    bad: list[bytes] = []

    def read(stdout):
        for line in stdout:
            if line.endswith(b"\n"):  # (a last line cut by the stop at the end is no event)
                try:
                    seen.append(json.loads(line))
                except ValueError:
                    bad.append(line)

    with _two_nodes_attached(tmp_path, sshd, "hang") as w:
        # (the only reader of its stdout: a second one, communicate(), would take parts of lines)
        reader = threading.Thread(target=read, args=(w.stdout,), daemon=True)
        reader.start()
        wait_for(lambda: stalls(seen) or w.poll() is not None, timeout=TIMEOUT, what="the stall alarm")
        # every node's own detector has had its say well before this: theirs come within a second or so of
        # the merged view's, and a node's own is held back at most HOLD seconds
        first = stalls(seen)[0]["t"]
        time.sleep(HOLD + 8)
        evs = list(seen)
        assert any(e["kind"] == "stacks" and e["node"] == "node-a" for e in evs), "node-a's own samples"
        (alarm,) = stalls(evs)
        assert alarm["culprits"] == [1], alarm
        assert alarm["node"] == "node-b", alarm  # the culprit's node, in the field
        assert alarm["where"]["1"]["node"] == "node-b" and alarm["where"]["1"]["line"] == STUCK, alarm["where"]
        assert "rank 1 on node-b" in alarm["message"], alarm["message"]
        # the nodes' own stall alarms are in it (folded), or notes after it; never alarms of their own
        own = [(d["node"], d["id"]) for d in alarm["folded"]] + [
            (e["node"], e["message"]) for e in evs if e["kind"] == "note" and "own stall alarm" in e["message"]]
        assert all(n in ("node-a", "node-b") for n, _ in own), own
        assert not [e for e in evs if e["kind"] == "alarm" and e["type"] == "stall" and e["node"] == "node-a"]
        assert alarm["t"] - first < 1
        os.killpg(w.pid, 2)  # SIGINT: stop the job through the attachment
        try:
            w.wait(timeout=TIMEOUT)
        finally:
            if w.poll() is None:
                os.killpg(w.pid, 9)
                w.wait()
        reader.join(timeout=TIMEOUT)
        assert not reader.is_alive()
        assert not bad, bad[:3]  # every --json line whole, to the end
