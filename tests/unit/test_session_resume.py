"""Session.cursor()/resume: what a reconnecting attach relies on."""

import itertools
import json
import random

from hypothesis import example, given, settings
from hypothesis import strategies as st

from helpers import per_line
from conftest import rank_started, write_run
from ddptop.core.run.run_session import Session
from ddptop.core.sources.log_tailer import Tailer


def read_all(run, max_bytes=1 << 20, resume_every=None, seed=0):
    """All log lines of a run; with resume_every, a fresh Session resumes from
    the last cursor after every few polls (a link drop each time).  A cursor
    stays at the start of a line until the line is complete, so when a whole
    connection made no progress the next one reads more (as the agent does,
    reading megabytes per poll)."""
    rnd = random.Random(seed)
    s = Session.open(run)
    out, polls, last = [], 0, None
    while not s.finished:
        out += [(e.path, e.offset, e.text, e.partial) for e in per_line(s.poll(max_bytes)) if e.kind == "log" and not e.transient]
        polls += 1
        if resume_every and polls % resume_every == 0 and not s.finished:
            cur = s.cursor()
            assert json.loads(json.dumps(cur)) == cur  # travels as JSON
            s = Session.open(run, resume=cur)
            stuck = last is not None and any(cur[k] == last.get(k) for k in cur)
            max_bytes = min(max_bytes * 4, 1 << 22) if stuck else rnd.choice([7, 64, 1000, 70000])
            last = cur
    return per_file(out)


def per_file(lines):
    """Lines of each file in the order they came (files interleave differently
    when reads are cut differently; within a file the order is the contract)."""
    files = {}
    for path, offset, text, partial in lines:
        files.setdefault(path, []).append((offset, text, partial))
    return files


BODY = ("step 1 loss 0.5\n" + "é" * 40000 + "\n" + "progress 10%\rprogress 50%\rprogress 100%\n"
        + "x" * 200_000 + "\n" + "bad \xff bytes\n" + "step 2 loss 0.4\nno newline at the end")


def test_resuming_anywhere_loses_and_repeats_nothing(tmp_path):
    run = write_run(tmp_path, events=[rank_started(1.0, 0, 11), rank_started(1.0, 1, 12),
                                      {"t": 2.0, "kind": "state", "state": "succeeded", "exit_code": 0}],
                    logs={0: BODY, 1: "a\nb\n" * 5000}, torchrun_log="torchrun says hi\n" * 300,
                    exit={"state": "succeeded", "exit_code": 0})
    want = read_all(run)
    texts = [t for lines in want.values() for _, t, _ in lines]
    assert "step 2 loss 0.4" in texts and "no newline at the end" in texts and "progress 100%" in texts
    for every in (1, 2, 3):
        for seed in range(3):
            assert read_all(run, max_bytes=5, resume_every=every, seed=seed) == want


def test_the_final_state_is_not_skipped_by_a_resume_before_it_was_returned(tmp_path):
    run = write_run(tmp_path, events=[rank_started(1.0, 0, 11),
                                      {"t": 2.0, "kind": "state", "state": "failed", "exit_code": 3}],
                    logs={0: "x\n" * 10}, exit={"state": "failed", "exit_code": 3})
    s = Session.open(run)
    s.poll(max_bytes=4)  # the final state is read, but lines remain: it is not returned yet
    assert not s.finished
    s2 = Session.open(run, resume=s.cursor())
    evs = []
    while not s2.finished:
        evs += s2.poll()
    assert evs[-1].kind == "state" and evs[-1].exit_code == 3


@settings(max_examples=400, deadline=None)
@example(lines=[b"\x00\r\x00", b""], ending=b"", splits=[], cuts=[1])  # a \r line cut mid-way: same offset
@given(lines=st.lists(st.binary(max_size=200).map(lambda b: b.replace(b"\n", b"")), min_size=1, max_size=12),
       ending=st.sampled_from([b"", b"\n", b"\r"]),
       splits=st.lists(st.integers(min_value=0, max_value=3000), max_size=7),
       cuts=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=6))
def test_tailer_cursor_resume_equals_one_reader(tmp_path_factory, lines, ending, splits, cuts):
    """A growing file (lines with \r, bad UTF-8, no final newline) read by one
    Tailer, or by a new Tailer at each cursor, gives the same completed lines.
    (Over-long lines are covered by the session test above.)"""
    data = b"\n".join(lines) + ending
    bounds = sorted({min(s, len(data)) for s in splits} | {0, len(data)})
    chunks = [data[a:b] for a, b in zip(bounds, bounds[1:])]
    path = tmp_path_factory.mktemp("t") / "f.log"
    path.write_bytes(b"")
    one = Tailer(path)
    resumed = Tailer(path)
    a, b = [], []
    cut_iter = itertools.cycle(cuts)
    with open(path, "ab") as f:
        for c in chunks:
            f.write(c)
            f.flush()
            a += [l for l in one.read() if not l.transient]
            b += [l for l in resumed.read(next(cut_iter)) if not l.transient]
            resumed = Tailer(path, resumed.cursor)
    while not resumed.at_eof():
        before = resumed.cursor
        b += [l for l in resumed.read(next(cut_iter)) if not l.transient]
        if resumed.cursor != before:  # a connection that got nowhere is not cut again
            resumed = Tailer(path, resumed.cursor)
    a += one.flush()
    b += resumed.flush()
    assert b == a
