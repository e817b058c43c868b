"""Readers sleep until a file changes (watchfiles), and fall back to polling
where file events do not come; the agent sends log batches to a client that
takes them.

(What runs processes: tests/integration/test_live_reading_e2e.py.)"""

import json
import threading
import time

import pytest

from conftest import TIMEOUT, rank_started, write_run
from made_runs import live_run, rank_log
from ddptop.core.run import run_session as session_mod
from ddptop.core.run.run_session import Session
from ddptop.core.sources.log_wake import FileWaker
from helpers import per_line, wait_for


@pytest.fixture
def watched(tmp_path, monkeypatch):
    """(run, session) of a live run; a wait without a file event lasts up to
    120 s, so a wait that ends sooner was ended by an event (or a backlog)."""
    monkeypatch.setattr(session_mod, "WAIT_AT_MOST", 120.0)
    run = live_run(tmp_path)
    s = Session.open(run)
    yield run, s
    s.close()


def test_a_wait_ends_when_a_rank_writes_not_when_a_timer_fires(watched):
    run, s = watched
    assert [e.text for e in per_line(s.poll()) if e.kind == "log"]  # the lines already there
    s.wait(0.01)  # (the watcher starts)

    def write_later():
        time.sleep(0.3)
        with open(rank_log(run, 1), "a") as f:
            f.write("step 2 loss 0.4\n")

    w = threading.Thread(target=write_later)
    w.start()
    t0 = time.monotonic()
    s.wait(120)
    waited = time.monotonic() - t0
    w.join()
    got = [e.text for e in per_line(s.poll()) if e.kind == "log"]
    assert got == ["step 2 loss 0.4"]
    assert waited < 60, f"the wait ran {waited:.1f} s: no file event ended it"
    assert s._waker is not None and s._waker.mode == "file events"


def test_files_that_change_without_file_events_are_noticed_and_polled(tmp_path):
    """A network filesystem: the files grow, no event comes.  The reader's
    deadline polls find the data; after two such, it polls, and says so once."""
    watched, elsewhere = tmp_path / "watched", tmp_path / "elsewhere"
    watched.mkdir()
    elsewhere.mkdir()
    w = FileWaker([watched])
    try:
        assert w.mode == "file events"
        for i in range(3):
            (elsewhere / "log").write_text(f"line {i}\n")  # a change its events cannot see
            assert w.wait(0.05) is False  # the deadline ends the wait
            w.saw(True)  # ...and the poll after it finds new data
        assert w.mode == "polling"
        note = w.take_note()
        assert note and "without a file event" in note and "polling every" in note
        assert w.take_note() is None  # said once
        # a change its events do see is not a miss
        w2 = FileWaker([watched])
        (watched / "log").write_text("x\n")
        assert w2.wait(30) is True
        w2.saw(True)
        for _ in range(3):
            assert w2.wait(0.02) is False
            w2.saw(False)
        assert w2.mode == "file events" and w2.take_note() is None
        w2.close()
    finally:
        w.close()


def test_file_events_turned_off_still_reads_every_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPTOP_FILE_EVENTS", "off")
    run = live_run(tmp_path)
    s = Session.open(run)
    try:
        got = []
        s.poll()
        s.wait(5)
        assert s._waker is not None and s._waker.mode == "polling"
        with open(rank_log(run, 0), "a") as f:
            f.write("step 2 loss 0.3\n")
        wait_for(lambda: got.extend(e.text for e in per_line(s.poll()) if e.kind == "log") or got,
                 timeout=TIMEOUT, what="the new line")
        assert got == ["step 2 loss 0.3"]
    finally:
        s.close()


def test_what_a_poll_leaves_unread_is_read_without_waiting(watched):
    """A poll reads a bounded share of each file; the rest comes with the next
    poll at once, not after a file event that will never come again."""
    run, s = watched
    s.poll()
    s.wait(0.01)
    with open(rank_log(run, 0), "a") as f:
        f.write("".join(f"step {i} loss 0.5 {'x' * 40}\n" for i in range(2, 202)))
    s.wait(60)  # the write's event
    got = [e.text for e in per_line(s.poll(max_bytes=2000)) if e.kind == "log"]
    assert 0 < len(got) < 200 and s.backlog
    t0 = time.monotonic()
    rounds = 0
    while s.backlog:
        s.wait(60)  # returns at once: there is more to read
        got += [e.text for e in per_line(s.poll(max_bytes=2000)) if e.kind == "log"]
        rounds += 1
    assert time.monotonic() - t0 < 30, "a wait ran to its timeout with bytes left to read"
    assert got == [f"step {i} loss 0.5 {'x' * 40}" for i in range(2, 202)] and rounds > 1
    assert s._waker.mode == "file events"  # the backlog was not taken for a missing file event


def test_a_new_rank_log_is_read_as_soon_as_it_appears(watched, monkeypatch):
    run, s = watched
    monkeypatch.setattr(session_mod, "SCAN_EVERY", 3600.0)  # only the file event can make it look
    s.poll()
    s.wait(0.01)
    d = rank_log(run, 0).parent.parent / "2"
    d.mkdir()
    (d / "stdout.log").write_text("rank 2 is up\n")
    got: list = []
    for _ in range(3):  # the directory, then the file: an event each
        s.wait(60)
        got += [(e.rank, e.text) for e in per_line(s.poll()) if e.kind == "log"]
        if got:
            break
    assert got == [(2, "rank 2 is up")]


def test_a_wake_does_not_lose_a_file_event(watched):
    """watchfiles drops the changes it gathered when a wait is ended by wake():
    the poll after a wake reads every file."""
    run, s = watched
    s.poll()
    s.wait(0.05)
    assert s.poll() == [] and s._waker.quiet
    with open(rank_log(run, 1), "a") as f:
        f.write("step 2 loss 0.1\n")
    s.wake()
    s.wait(60)
    assert [e.text for e in per_line(s.poll()) if e.kind == "log"] == ["step 2 loss 0.1"]


def test_diagnose_reads_past_an_over_long_line(tmp_path):
    from ddptop.core.tools.diagnose import analyze_paths

    log = "x\n" + "y" * (10 << 20) + "\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    f = tmp_path / "rank_0.log"
    f.write_text(log)
    assert "cuda-oom" in {x.signature for x in analyze_paths([str(f)]).findings}
    run = write_run(tmp_path / "r", events=[rank_started(1.0, 0, 100)], logs={0: log},
                    exit={"state": "failed", "exit_code": 1})
    with open(run / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"t": 9.0, "kind": "state", "state": "failed", "exit_code": 1}) + "\n")
    assert "cuda-oom" in {x.signature for x in analyze_paths([str(run)]).findings}


def test_a_poll_reads_the_files_events_named_and_loses_none_of_the_others(watched, monkeypatch):
    """After a file event a poll reads only the files it named (a node's agent
    polls 20 times a second: every file stat'ed each time was most of its CPU);
    lines and steps written to other files meanwhile come with their own
    events, each once, and a file the session does not read makes it read all."""
    run, s = watched
    monkeypatch.setattr(session_mod, "SIZE_CHECK_EVERY", 3600.0)  # (no slow full read to hide a lost line)
    s.poll()
    s.wait(0.05)
    assert s.poll() == [] and s._waker.mode == "file events"
    got: list = []

    def take():
        for e in per_line(s.poll()):
            if e.kind == "log":
                got.append((e.rank, e.text))
            elif e.kind == "progress":
                got.append((e.rank, f"beat {e.step}"))

    beats = run / "beats"
    beats.mkdir(exist_ok=True)
    for i in range(2, 12):  # the two ranks' logs and rank 1's hook beat, written in turn
        with open(rank_log(run, i % 2), "a") as f:
            f.write(f"step {i} loss 0.5\n")
        if i % 3 == 0:
            (beats / "hook.1").write_text(f"{i:020d} {time.time():.6f}\n")
        s.wait(5)
        take()
    want = [(i % 2, f"step {i} loss 0.5") for i in range(2, 12)] + [(1, f"beat {i}") for i in (3, 6, 9)]
    wait_for(lambda: s.wait(0.2) or take() or sorted(set(got)) == sorted(want), timeout=TIMEOUT,
             what="every line and beat")
    assert sorted(got) == sorted(want)  # each once
    # a path the session does not read (a stack dump, exit.json): the next poll reads every file
    with open(rank_log(run, 0), "a") as f:
        f.write("step 12 loss 0.5\n")
    s._waker.wait(5)  # its event, taken and dropped here: as if it had been missed
    s._waker.take_changed()
    (run / "stacks.txt").write_text("a dump\n")
    wait_for(lambda: s.wait(0.2) or take() or (0, "step 12 loss 0.5") in got, timeout=20,
             what="the line, read with every file")
