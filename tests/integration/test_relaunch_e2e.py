"""Relaunch with a profile: the example hangs unless NCCL_P2P_DISABLE=1."""

import json
import os
import signal
import subprocess

from conftest import EXAMPLE, ROOT, TIMEOUT, alive, ddptop_cmd, json_events, journal_events, wait_for
from ddptop.core.run.run_session import Session


P2P_HANG = ["--nproc-per-node", "2", EXAMPLE, "--steps", "40", "--step-time", "0.05", "--fault", "p2p-hang", "--fault-step", "10"]


def rank_pids_by_generation(events):
    gen, out = 0, {}
    for e in events:
        if e["kind"] == "launch":
            gen = e["generation"]
        if e["kind"] == "rank" and e["alive"]:
            out.setdefault(gen, set()).add(e["pid"])
    return out


def test_headless_on_stall_relaunch_finds_p2p_off_and_finishes(runs_dir):
    r = subprocess.run(ddptop_cmd("--json", "--gpu", "sim", "--on-stall", "relaunch", "torchrun", *P2P_HANG),
                       capture_output=True, text=True, timeout=2 * TIMEOUT, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:]
    events = json_events(r.stdout)
    launches = [e for e in events if e["kind"] == "launch"]
    assert [(l["generation"], l["profiles"]) for l in launches] == [(0, []), (1, ["p2p-off"])]
    assert launches[1]["env_diff"] == {"NCCL_P2P_DISABLE": "1"}
    stalls = [e for e in events if e["kind"] == "alarm" and e["type"] == "stall"]
    assert len(stalls) == 1 and stalls[0]["suggested_profiles"][0] == "p2p-off"
    steps = [e for e in events if e["kind"] == "log" and e["rank"] == 0 and e["text"].startswith("step 40 ")]
    assert steps and events[-1]["state"] == "succeeded"
    old = rank_pids_by_generation(events)[0]
    assert len(old) == 2 and not any(alive(p) for p in old)


def test_relaunch_through_the_session_stops_every_old_rank_first(runs_dir):
    p = subprocess.Popen(ddptop_cmd("--json", "--gpu", "sim", "torchrun", *P2P_HANG), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        run = wait_for(lambda: next(iter(runs_dir.glob("*")), None) if runs_dir.exists() else None, what="run dir")
        wait_for(lambda: any(e["kind"] == "alarm" and e["type"] == "stall" for e in journal_events(run)),
                 timeout=TIMEOUT, what="the stall")
        old = {e["pid"] for e in journal_events(run) if e["kind"] == "rank"}
        assert Session.open(run).relaunch(["p2p-off"], "test")
        out, _ = p.communicate(timeout=2 * TIMEOUT)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    events = json_events(out.decode())
    assert p.returncode == 0 and events[-1]["state"] == "succeeded"
    gens = rank_pids_by_generation(events)
    assert gens[0] == old and len(gens[1]) == 2 and not gens[0] & gens[1]
    # every old rank had ended before the first new one started
    idx_last_old_end = max(i for i, e in enumerate(events) if e["kind"] == "rank" and not e["alive"] and e["pid"] in old)
    idx_first_new = min(i for i, e in enumerate(events) if e["kind"] == "rank" and e["alive"] and e["pid"] in gens[1])
    assert idx_last_old_end < idx_first_new
    assert not any(alive(pid) for pid in old)


def test_fix_finds_p2p_off_and_reports_it(runs_dir):
    r = subprocess.run(ddptop_cmd("--json", "--gpu", "sim", "--fix-steps", "15", "fix", "torchrun", "--nproc-per-node", "2",
                                  EXAMPLE, "--steps", "1000", "--step-time", "0.05", "--fault", "p2p-hang", "--fault-step", "10"),
                       capture_output=True, text=True, timeout=4 * TIMEOUT, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    outcomes = [(a["label"], a["outcome"]) for a in rep["attempts"]]
    assert outcomes == [("as given", "stalled"), ("p2p-off", "progress")]
    assert rep["winner"]["profiles"] == ["p2p-off"] and rep["winner"]["steps_per_s"] > 0
    assert "--profile p2p-off" in rep["recommendation"] and "NCCL_P2P_DISABLE=1 torchrun" in rep["recommendation"]
    # each smoke attempt was stopped: nothing of it is left running
    for run in runs_dir.rglob("attempt*"):
        if (run / "events.jsonl").exists():
            assert (run / "exit.json").exists()
            assert not any(alive(e["pid"]) for e in journal_events(run) if e["kind"] == "rank")
