"""The session protocol: a line still being written, the one factory, front ends that never probe sessions.

(What runs processes: tests/integration/test_jobs_e2e.py.)"""

import json
import os

import psutil
import pytest

from conftest import ROOT, rank_started, write_run
from helpers import per_line
from made_runs import damaged_run
from ddptop.core.model.session_protocol import AttachedPid, LocalRun, Nodes, RemoteRun
from ddptop.core.sessions.factory import AttachRequest, OpenError, open_target
from ddptop.core.run.run_session import Session


def test_a_line_still_being_written_waits_for_its_end(tmp_path):
    run = write_run(tmp_path, events=[rank_started(1.0, 0, 100)], logs={0: "step 1\n"})
    (run / "supervisor.json").write_text(json.dumps({"pid": os.getpid(), "create_time": psutil.Process().create_time()}))
    s = Session.open(run)
    whole = json.dumps({"t": 2.0, "kind": "note", "level": "info", "message": "written in two goes"}) + "\n"
    with open(run / "events.jsonl", "a") as f:
        f.write(whole[:25])
    evs = s.poll()
    assert not [e for e in evs if e.kind == "note"], evs  # no "damaged" note for half a line
    with open(run / "events.jsonl", "a") as f:
        f.write(whole[25:])
    evs = s.poll()
    assert [e.message for e in evs if e.kind == "note"] == ["written in two goes"]
    assert not s.finished and s.is_live  # this test process stands in for a live supervisor


def test_a_run_launched_a_moment_ago_is_starting_until_its_exit_record_says_it_ended(tmp_path):
    """No supervisor.json yet, launched a second ago: still starting (its supervisor may not have written it).
    With its exit.json there, it has ended: a reader ends at once, with the recorded state, not after the
    start-up grace."""
    starting = write_run(tmp_path / "a", events=[rank_started(1.0, 0, 100)], logs={0: "step 1\n"})
    s = Session.open(starting)
    s.poll()
    assert not s.finished and s.is_live
    ended = write_run(tmp_path / "b", events=[rank_started(1.0, 0, 100)], logs={0: "step 1\n"},
                      exit={"state": "succeeded", "exit_code": 0, "t": 2.0})
    s = Session.open(ended)
    evs = s.poll()
    assert s.finished and evs[-1].kind == "state" and evs[-1].state == "succeeded" and evs[-1].exit_code == 0
    assert [e.text for e in per_line(evs) if e.kind == "log"] == ["step 1"]


def test_the_factory_opens_what_the_person_named(tmp_path, runs_dir):
    run = damaged_run(tmp_path)
    s = open_target(AttachRequest(targets=(str(run),))).session
    assert s.location == LocalRun(run) and s.location.attach_hint == f"ddptop attach {run}"
    with pytest.raises(OpenError, match="no runs under"):
        open_target(AttachRequest(targets=("latest",)))
    with pytest.raises(OpenError, match="no ddptop run called"):
        open_target(AttachRequest(targets=(str(tmp_path / "nowhere"),)))
    with pytest.raises(OpenError, match="begins with '-'"):
        open_target(AttachRequest(targets=("-oProxyCommand=touch /tmp/x", "node-b")))
    with pytest.raises(OpenError, match="--pid 999999999"):
        open_target(AttachRequest(pid=999999999))
    assert RemoteRun("::1", "r1").attach_hint == "ddptop attach [::1]:r1"
    from ddptop.core.sessions.ssh import parse_target

    assert parse_target("[::1]:r1") == ("::1", "r1") and parse_target("[::1]") == ("::1", "latest")
    assert parse_target("user@gpu3:pid:42") == ("user@gpu3", "pid:42")
    assert str(Nodes((RemoteRun("a", "r", "/x"), RemoteRun("b", "r")))) == "a:/x b:r"
    assert "pid 7" in str(AttachedPid(7, "h"))


def test_front_ends_never_probe_sessions():
    """The TUI, the CLI, headless and the agent use the JobSession protocol, never getattr/hasattr on a session."""
    import re

    pkg = ROOT / "ddptop"
    front = [pkg / "cli.py", pkg / "headless.py", pkg / "core" / "sessions" / "agent.py", *sorted((pkg / "ui").glob("*.py"))]
    probe = re.compile(r"\b(getattr|hasattr)\(\s*(self\.)?(session|s)\b")
    bad = [f"{f.name}:{i}: {l.strip()}" for f in front for i, l in enumerate(f.read_text().splitlines(), 1)
           if probe.search(l)]
    assert not bad, bad
