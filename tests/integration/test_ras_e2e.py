"""NCCL RAS through ddptop: a hung job's culprit named from RAS, and a dead peer that NCCL pushes
raised as an alarm at once.  The answers come from ``tests/support/ras_server.py``, a stand-in that speaks
NCCL's protocol.  (The client and the parsers: tests/unit/test_ras.py.)"""

from __future__ import annotations

import random

import pytest

from ras_server import Job, Rank, RasServer


@pytest.fixture(autouse=True)
def least_silence(monkeypatch):
    """The least silence that is a hang: 5 s here (DDPTOP_MIN_SILENCE, 10 s by default), so that the
    hangs below are alarmed sooner."""
    monkeypatch.setenv("DDPTOP_MIN_SILENCE", "5")


def test_a_hung_job_names_its_culprit_from_nccl_ras(runs_dir, tmp_path):
    """A real 2-rank job (CPU, gloo) whose user-set NCCL_RAS_ADDR points at the
    stand-in, the ordinary way: with stack sampling off and no GPU telemetry,
    nothing but RAS can tell the ranks apart (both stop at the same step).  The
    stand-in answers from the real job: its ranks' pids from the journal, their
    steps from the step hook, and the held-back rank, chosen at random, one
    collective behind.  The alarm names that rank, says what RAS saw, and the
    raw answer is kept beside the stall's stacks."""
    import json
    import os

    from conftest import EXAMPLE, journal_events, json_events, rank_pids, run_ddptop

    held = random.randrange(2)
    state = {}

    def job():
        runs = [d for d in runs_dir.iterdir() if (d / "meta.json").exists()] if runs_dir.exists() else []
        if not runs:
            return Job([])
        run = runs[0]
        state["run"] = run
        ranks = []
        for rank, pid in sorted(rank_pids(run).items()):
            try:
                step = int((run / "beats" / f"hook.{rank}").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                step = 0
            # every rank but the held one has launched the next step's all-reduce
            ranks.append(Rank(rank, pid, "127.0.0.1", gpu=rank, counts={"AllReduce": step + (rank != held)}))
        return Job(ranks)

    srv = RasServer(job, version="2.29.2")
    try:
        env = dict(os.environ, NCCL_RAS_ADDR=srv.addr, DDPTOP_PY_SPY="")
        r = run_ddptop("--json", "--gpu", "none", "--on-stall", "kill", "torchrun", "--nproc-per-node", "2", EXAMPLE,
                       "--steps", "100000", "--step-time", "0.05", "--fault", "hang", "--fault-rank", str(held),
                       "--fault-step", "10", env=env)
    finally:
        srv.close()
    assert r.returncode == 124, r.stderr[-2000:]
    events = json_events(r.stdout)
    (alarm,) = [e for e in events if e["kind"] == "alarm" and e["type"] == "stall"]
    assert alarm["culprits"] == [held], alarm["message"]
    assert f"rank {held} stopped at #" in alarm["message"] and "(NCCL RAS)" in alarm["message"], alarm["message"]
    said = [e for e in events if e["kind"] == "ras" and e["ok"]]
    assert said and said[0]["culprits"] == [held] and said[0]["addr"] == srv.addr
    raw = json.loads(open(said[0]["file"]).read())
    assert raw["nccl_version"] == "2.29.2" and {x["pid"] for x in raw["communicators"][0]["ranks"]} == set(
        rank_pids(state["run"]).values())
    assert any(e["kind"] == "ras" for e in journal_events(state["run"]))
    status = [q for q in srv.queries if q.endswith("STATUS")]
    assert status and status[0].startswith("CLIENT PROTOCOL 2|TIMEOUT ")
    assert srv.queries.count("CLIENT PROTOCOL 2|MONITOR lifecycle") == 1  # followed once, for the whole job
    # post-mortem, from the answer kept in the run
    d = run_ddptop("diagnose", "--json", str(state["run"]))
    rep = json.loads(d.stdout)
    assert rep["nccl_ras"][0]["culprits"] == [held] and rep["culprits"] == [held], d.stdout[-2000:]


def test_a_dead_peer_nccl_pushes_is_an_alarm_at_once(runs_dir):
    """NCCL 2.29+ pushes PEER_DEAD to a MONITOR client: ddptop follows the port
    of a job that uses it and alarms at once, naming the rank by its pid (the
    rank, chosen at random, is reported dead by the stand-in while the job
    still trains: no stall, no crash to see otherwise)."""
    import json
    import os
    import signal
    import subprocess
    import time

    from conftest import EXAMPLE, ROOT, TIMEOUT, ddptop_cmd, json_events, rank_pids
    from helpers import wait_for

    held = random.randrange(2)
    srv = RasServer(lambda: Job([]), version="2.29.2")
    env = dict(os.environ, NCCL_RAS_ADDR=srv.addr)
    p = subprocess.Popen(ddptop_cmd("--json", "torchrun", "--nproc-per-node", "2", EXAMPLE, "--steps", "100000",
                                    "--step-time", "0.05"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, cwd=ROOT)
    try:
        run = wait_for(lambda: next((d for d in runs_dir.glob("*") if (d / "meta.json").exists()), None)
                       if runs_dir.exists() else None, timeout=TIMEOUT, what="the run")
        pids = wait_for(lambda: (lambda x: x if len(x) == 2 else None)(rank_pids(run)), timeout=TIMEOUT,
                        what="both ranks")
        wait_for(lambda: srv.monitors, timeout=TIMEOUT, what="ddptop to follow the RAS port (MONITOR)")
        assert srv.queries[-1] == "CLIENT PROTOCOL 2|MONITOR lifecycle"
        t0 = time.time()
        assert srv.push_peer("PEER_DEAD", Rank(held, pids[held], "127.0.0.1", gpu=held)) == 1

        def alarm():
            evs = [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines())
                   if e.get("kind") == "alarm" and e.get("id") == "nccl-peer-dead"]
            return evs[0] if evs else None

        a = wait_for(alarm, timeout=30, what="the dead-peer alarm")
        print(f"PEER_DEAD pushed -> alarm in the journal after {time.time() - t0:.2f} s")
        assert a["culprits"] == [held] and f"process {pids[held]} on 127.0.0.1 (rank {held}) is dead" in a["message"]
    finally:
        p.send_signal(signal.SIGTERM)
        out, _err = p.communicate(timeout=TIMEOUT)
        srv.close()
    assert any(e["kind"] == "alarm" and e["id"] == "nccl-peer-dead" for e in json_events(out))
