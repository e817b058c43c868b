"""The session protocol end to end: lost runs, damaged journals, the one factory, the wire's compatibility.

(The pure parts: tests/unit/test_jobs.py.)"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers import per_line
from conftest import EXAMPLE, ROOT, TIMEOUT, alive, ddptop_cmd, json_events, rank_pids, wait_for
from made_runs import damaged_run
from ddptop.core.run import journal
from ddptop.core.model.session_protocol import LocalRun, RemoteRun
from ddptop.core.sessions.factory import open_local


def _env(runs_dir: Path) -> dict:
    return dict(os.environ, DDPTOP_RUNS_DIR=str(runs_dir))


def _kill_everything(run: Path) -> None:
    """A machine crash, as far as one run can tell: the supervisor, torchrun and every rank, SIGKILL."""
    sup = json.loads((run / "supervisor.json").read_text())
    procs = [psutil.Process(sup["pid"])]
    procs += procs[0].children(recursive=True)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


@pytest.fixture
def killed_run(runs_dir):
    """A real 2-rank torchrun job under ddptop, then kill -9 of the whole tree mid-run."""
    p = subprocess.Popen(ddptop_cmd("--json", "--gpu", "none", "torchrun", "--nproc-per-node", "2", EXAMPLE,
                                    "--steps", "100000", "--step-time", "0.05"),
                         cwd=ROOT, env=_env(runs_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        run = wait_for(lambda: next(iter(runs_dir.glob("*/supervisor.json")), None) if runs_dir.exists() else None,
                       timeout=60, what="the supervisor").parent
        wait_for(lambda: len(rank_pids(run)) == 2, timeout=120, what="both ranks")
        wait_for(lambda: any("step 3 " in f.read_text(errors="replace") for f in run.glob("logs/*/attempt_0/1/stdout.log")),
                 timeout=120, what="rank 1's step 3")
        pids = list(rank_pids(run).values())
        _kill_everything(run)
        p.wait(timeout=30)  # the viewer ends when the run is lost
        assert not any(alive(pid) for pid in pids)
        yield run
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_a_killed_run_is_lost_for_every_reader_and_no_reader_writes_the_journal(killed_run, runs_dir):
    run = killed_run
    for attempt in range(3):
        t0 = time.monotonic()
        r = subprocess.run(ddptop_cmd("--headless", "attach", str(run)), cwd=ROOT, env=_env(runs_dir),
                           capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        assert r.returncode == 1, (attempt, r.stdout[-1500:], r.stderr)
        last = r.stdout.strip().splitlines()[-1]
        assert last.startswith("== ddptop: job lost") and journal.LOST_MESSAGE in last, last
        assert "[r1] step 3 " in r.stdout  # every rank's lines are still shown
        print(f"attach #{attempt + 1} to a killed run ended in {took:.1f} s")
    # only the supervisor writes a run's journal: no reader wrote an exit.json for it
    assert not (run / "exit.json").exists()
    runs = subprocess.run(ddptop_cmd("runs"), cwd=ROOT, env=_env(runs_dir), capture_output=True, text=True,
                          timeout=60)
    assert f"{run.name}\tlost\t" in runs.stdout, runs.stdout
    # Ctrl-C to an attach of a lost job: it never offers to stop a job that is gone
    p = subprocess.Popen(ddptop_cmd("--headless", "attach", str(run)), cwd=ROOT, env=_env(runs_dir),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode != 0
    assert "stopping the job" not in err and "again to stop waiting" not in err, err


def test_a_running_run_is_running_by_its_supervisor_not_by_a_missing_exit_json(runs_dir):
    p = subprocess.Popen(ddptop_cmd("--json", "--gpu", "none", "torchrun", "--nproc-per-node", "2", EXAMPLE,
                                    "--steps", "100000", "--step-time", "0.05"),
                         cwd=ROOT, env=_env(runs_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        run = wait_for(lambda: next(iter(runs_dir.glob("*/supervisor.json")), None) if runs_dir.exists() else None,
                       timeout=60, what="the supervisor").parent
        assert journal.run_state(run).state == "running"
        # a plain `ddptop attach` picks the running run (not a job ddptop did not launch)
        opened = open_local(options=__import__("ddptop.core.sessions.factory", fromlist=["WatchOptions"]).WatchOptions())
        assert opened.session.location == LocalRun(run)
        c = opened.session.control()
        assert c.stop and c.relaunch and c.stacks and c.fix and not c.refused
        r = opened.session.stop()
        assert r.ok, r
        wait_for(lambda: (run / "exit.json").exists(), timeout=60, what="the supervisor to record the stop")
        s = opened.session
        wait_for(lambda: s.poll() is not None and s.finished, timeout=60, what="the session to end")
        assert s.final_state.state == "stopped" and s.exit_status().code is not None
        assert not s.control().stop and not s.stop().ok
        assert journal.run_state(run).state == "stopped"
    finally:
        p.wait(timeout=60)


def test_a_damaged_journal_shows_every_rank_line_and_the_real_exit_code(tmp_path, runs_dir):
    run = damaged_run(tmp_path)
    r = subprocess.run(ddptop_cmd("--headless", "attach", str(run)), cwd=ROOT, env=_env(runs_dir),
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 3, (r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    lines = r.stdout.splitlines()
    for rank in (0, 1):
        assert [l for l in lines if l.startswith(f"[r{rank}] step ")] == [
            f"[r{rank}] step {i} loss 0.{5 + rank}" for i in range(1, 6)]
    assert not any(l.startswith("[rzero]") for l in lines)
    assert lines[-1] == "== ddptop: job failed, exit code 3 (torchrun exited with 3) =="
    notes = [l for l in lines if "events.jsonl line" in l]
    # one note per damaged line, naming the file and the line (lines 1-2 are the ranks)
    expected = {3: "not a JSON object", 4: "not a JSON object", 5: "not JSON", 6: "invalid UTF-8",
                7: "field 'rank'", 8: "field 'exit_code'", 9: "field 'attempt'"}
    assert len(notes) == len(expected), notes
    for n, why in expected.items():
        assert any(f"{run / 'events.jsonl'} line {n}: damaged, skipped" in l and why in l for l in notes), (n, notes)
    assert "== ddptop info: still here ==" in lines  # an unknown field is ignored, the event kept


def test_the_agent_streams_a_damaged_run_to_its_end_without_looping(tmp_path, runs_dir):
    run = damaged_run(tmp_path)
    # stdin stays open, as ssh keeps it: the agent ends by itself once the run is streamed
    p = subprocess.Popen(ddptop_cmd("agent", "--run", str(run)), cwd=ROOT, env=_env(runs_dir), text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    stdout, stderr = p.stdout.read(), p.stderr.read()
    p.stdin.close()
    assert p.returncode == 0, stderr
    out = json_events(stdout)
    assert out[0]["kind"] == "hello" and out[0]["version"] == 1 and out[0]["minor"] >= 1
    assert out[-1]["kind"] == "bye" and out[-1]["exit"] == {"code": 3, "reason": "", "exit_with": 3}
    logs = [e for e in out if e["kind"] == "log"]
    assert sorted({e["rank"] for e in logs}) == [0, 1] and len(logs) == 10
    assert sum(1 for e in out if e["kind"] == "note" and "damaged, skipped" in e["message"]) == 7


def test_the_agent_and_its_ssh_client_end_on_a_damaged_run(tmp_path, runs_dir, sshd):
    from ddptop.core.sessions.ssh import RemoteSession
    from sshd import remote_ddptop

    run = damaged_run(tmp_path)
    rs = RemoteSession("node-a", run=str(run), ssh=sshd.ssh, remote_cmd=remote_ddptop(runs_dir))
    evs = []
    try:
        wait_for(lambda: evs.extend(rs.poll()) or rs.finished, timeout=TIMEOUT, what="the end of the stream")
    finally:
        rs.close()
    assert rs.error is None and rs.exit_status().code == 3 and rs.exit_status().exit_with == 3
    assert rs.connects == 1  # never a reconnect into the same bad line
    assert len([e for e in per_line(evs) if e.kind == "log" and e.rank is not None]) == 10
    assert isinstance(rs.location, RemoteRun) and rs.location.run == run.name
    assert rs.location.attach_hint == f"ddptop attach node-a:{run.name}"


NEWER_AGENT = """
import json, sys, time
send = lambda d: print(json.dumps(d), flush=True)
send({"kind": "hello", "proto": "ddptop-agent", "version": 1, "minor": 9, "host": "h", "ddptop": "0.9.0",
      "run": "r", "run_dir": "/r", "meta": None, "t": time.time(), "something_new": {"a": 1}})
send({"t": 1.0, "kind": "log", "rank": 0, "stream": "stdout", "text": "step 1", "attempt": 0, "path": "logs/0",
      "offset": 0, "lines_in_batch": 1})
send({"t": 1.0, "kind": "ras", "collectives": {"0": 4412}})
send({"kind": "cursor", "files": {"logs/0": 7}})
send({"t": 2.0, "kind": "state", "state": "succeeded", "exit_code": 0})
send({"kind": "cursor", "files": {"logs/0": 7}})
send({"kind": "bye", "exit_code": 0, "exit": {"code": 0, "reason": "", "exit_with": 0}, "extra": True})
"""


def test_a_newer_minor_agent_is_understood_and_its_new_kinds_ignored(tmp_path, sshd):
    script = tmp_path / "newer.py"
    script.write_text(NEWER_AGENT)
    r = subprocess.run(ddptop_cmd("--json", "attach", "node-a", "--ssh", " ".join(sshd.ssh), "--remote-ddptop",
                                  f"{sys.executable} {script}"), cwd=ROOT, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    evs = json_events(r.stdout)
    assert [e["text"] for e in evs if e["kind"] == "log"] == ["step 1"]
    assert not [e for e in evs if e["kind"] == "note" and e["level"] == "warning"], evs
    assert evs[-1]["kind"] == "state" and evs[-1]["state"] == "succeeded"
