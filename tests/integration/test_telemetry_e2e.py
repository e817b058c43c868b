"""Real torchrun, 2 ranks, --gpu sim: the spinning hang shows as ~100% on the
waiting rank's simulated GPU and ~0% on the hung (sleeping) rank's."""

import json
import os
import signal
import subprocess

import pytest

from conftest import EXAMPLE, ROOT, TIMEOUT, ddptop_cmd, journal_events, wait_for
from helpers import favour


@pytest.fixture(autouse=True)
def least_silence(monkeypatch):
    """The least silence that is a hang: 5 s here (DDPTOP_MIN_SILENCE, 10 s by default), so that the
    hangs below are alarmed sooner."""
    monkeypatch.setenv("DDPTOP_MIN_SILENCE", "5")


def latest(run, kind):
    out = {}
    for e in journal_events(run):
        if e["kind"] == kind:
            out[e.get("index", e.get("rank"))] = e
    return out


@pytest.mark.serial  # a spinning rank's CPU use over 70% of a core: not with other workers' jobs on the cores
def test_sim_gpu_reads_hot_for_spinning_rank_and_idle_for_hung_rank(runs_dir):
    p = subprocess.Popen(ddptop_cmd("--json", "--gpu", "sim", "--sample-interval", "0.5", "torchrun", "--nproc-per-node", "2",
                                    EXAMPLE, "--steps", "100000", "--step-time", "0.02", "--fault", "hang",
                                    "--fault-rank", "1", "--fault-step", "5"),
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        run = wait_for(lambda: next(iter(runs_dir.glob("*")), None) if runs_dir.exists() else None, what="run dir")
        wait_for(lambda: any("hangs now" in f.read_text() for f in run.glob("logs/*/attempt_0/*/stdout.log")),
                 timeout=TIMEOUT, what="the injected hang")
        for e in journal_events(run):
            if e["kind"] == "rank" and e["rank"] == 0:
                favour(e["pid"])  # the spinning rank
        def hot_and_cold():
            g = latest(run, "gpu")
            return len(g) == 2 and g[0]["util"] is not None and g[0]["util"] > 70 and g[1]["util"] < 20 and g
        g = wait_for(hot_and_cold, timeout=60, what="sim GPU 0 hot, GPU 1 idle")
        assert all(x["simulated"] and "SIMULATED" in x["name"] for x in g.values())
        assert g[0]["ranks"] == [0] and g[1]["ranks"] == [1]
        # a sample with the spinning rank's CPU use high (on a loaded machine not every 0.5 s sample is:
        # its share of the cores dips while other processes run)
        def spinning_and_idle():
            procs = latest(run, "proc")
            return len(procs) == 2 and procs[0]["cpu"] > 70 and procs[1]["cpu"] < 20 and procs
        procs = wait_for(spinning_and_idle, timeout=60, what=lambda: f"rank 0's CPU use high, rank 1's low: "
                                                                     f"{latest(run, 'proc')}")
        pids = {e["rank"]: e["pid"] for e in journal_events(run) if e["kind"] == "rank"}
        assert {r: procs[r]["pid"] for r in (0, 1)} == pids
        assert procs[0]["cpu"] > 70 and procs[1]["cpu"] < 20 and procs[0]["rss"] > 10_000_000
        status = [e for e in journal_events(run) if e["kind"] == "gpu_status"]
        assert status and status[0]["backend"] == "sim"
        os.kill(p.pid, signal.SIGTERM)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    kinds = {json.loads(l)["kind"] for l in out.decode().splitlines()}
    assert {"gpu", "proc", "gpu_status", "state", "log", "rank"} <= kinds
