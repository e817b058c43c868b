"""A session read in a process of its own (``ddptop.core.sessions.hosted``, what the TUI of ``ddptop attach``
uses): the same job seen as in process, lines that come live, the commands' answers, the opener's errors, and
a reading process that dies or outlives its viewer."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from conftest import ROOT
from ddptop.core.run.run_session import Session
from ddptop.core.sessions.factory import OpenError, open_local
from ddptop.core.sessions.hosted import HostedError, HostedSession
from helpers import wait_for
from made_runs import hung_run, live_run, rank_log


def read_to_end(session, timeout=60.0) -> list:
    events, deadline = [], time.monotonic() + timeout
    while not session.finished:
        assert time.monotonic() < deadline, "the session did not finish"
        new = session.poll()
        events += new
        if not new:
            session.wait(1.0)
    return events


def shown(events) -> list:
    """What a person is shown of the events: each one's JSON form, in order (the lines one by one)."""
    out = []
    for e in events:
        if e.kind == "logs":
            out += [(e.rank, text) for text in e.texts]
        else:
            out.append(e.to_dict())
    return out


def test_a_finished_run_read_in_its_own_process_is_the_same_as_read_here(tmp_path):
    run, _ = hung_run(tmp_path)
    here = Session.open(run)
    try:
        expected = read_to_end(here)
    finally:
        here.close()
    opened = HostedSession.start(functools.partial(open_local, str(run)))
    s = opened.session
    try:
        got = read_to_end(s)
        assert shown(got) == shown(expected)
        assert [e.kind for e in got].count("alarm") == 1
        assert s.final_state == here.final_state and s.final_state.exit_code == 124
        assert s.exit_status() == here.exit_status()
        assert s.control() == here.control() and not s.control().stop
        assert s.location == here.location and s.meta == here.meta and not s.is_live and s.error is None
        # a command goes to the reading process and its answer comes back: a stopped job cannot be stopped
        answer = s.stop()
        assert not answer and "not running" in answer.message
        assert s.cursor() == here.cursor()
    finally:
        s.close()
    assert s.pid and not psutil.pid_exists(s.pid) or psutil.Process(s.pid).status() == psutil.STATUS_ZOMBIE


def test_lines_written_live_reach_poll_and_wake_its_wait(tmp_path):
    run = live_run(tmp_path)
    s = HostedSession.start(functools.partial(open_local, str(run))).session
    try:
        seen: list = []

        def has(text):
            seen.extend(shown(s.poll()))
            return (1, text) in seen

        wait_for(lambda: has("step 1 loss 0.6"), timeout=60, what="the first lines")
        assert s.is_live and not s.finished and s.control().stop
        t0 = time.monotonic()
        with open(rank_log(run, 1), "a") as f:
            f.write("step 2 loss 0.4\n")
        while not has("step 2 loss 0.4"):
            assert time.monotonic() - t0 < 30, seen[-5:]
            s.wait(20.0)  # a wait ends when the line comes, not at its timeout
        assert time.monotonic() - t0 < 15
        assert seen.count((1, "step 2 loss 0.4")) == 1
    finally:
        s.close()


def test_what_the_opener_refuses_is_raised_here_with_its_code(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPTOP_RUNS_DIR", str(tmp_path))
    with pytest.raises(OpenError) as e:
        HostedSession.start(functools.partial(open_local, "no-such-run"))
    assert e.value.code == "no-run" and "no-such-run" in str(e.value)


def test_a_reading_process_that_dies_is_said_not_waited_for(tmp_path):
    run = live_run(tmp_path)
    s = HostedSession.start(functools.partial(open_local, str(run))).session
    try:
        wait_for(lambda: s.poll() or True, timeout=10)
        os.kill(s.pid, signal.SIGKILL)
        err = wait_for(lambda: s.error, timeout=30, what="the error")
        assert "reading process failed" in err and "-9" in err, err
        with pytest.raises(HostedError):  # (what it sent before it died comes first, then the error)
            for _ in range(100):
                s.poll()
        with pytest.raises(HostedError):
            s.dump_stacks()
        assert not s.is_live
    finally:
        t0 = time.monotonic()
        s.close()
        assert time.monotonic() - t0 < 10


def test_the_reading_process_ends_with_its_viewer_even_killed(tmp_path):
    """A viewer killed with SIGKILL closes nothing; its reading process sees its stream end and leaves."""
    run = live_run(tmp_path)
    script = textwrap.dedent(f"""
        import functools, sys
        from ddptop.core.sessions.factory import open_local
        from ddptop.core.sessions.hosted import HostedSession
        s = HostedSession.start(functools.partial(open_local, {str(run)!r})).session
        print(s.pid, flush=True)
        sys.stdin.read()
    """)
    viewer = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        child = psutil.Process(int(viewer.stdout.readline()))
        assert "ddptop.core.sessions.hosted" in " ".join(child.cmdline())
        viewer.kill()
        viewer.wait(timeout=30)
        gone, alive = psutil.wait_procs([child], timeout=30)
        assert gone and not alive
    finally:
        viewer.kill()
        viewer.wait(timeout=30)
