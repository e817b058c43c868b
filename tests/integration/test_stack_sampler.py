"""The stack sampler on real processes: native frames of every rank, idle ones included, within a time limit.

A rank sleeping at a GPU synchronisation (blocking sync) is idle, 0% CPU: read
without its native frames it looks like a rank stuck in its own code.  So the
sampler reads native frames of every rank, and gives a native dump up (for a
Python-only one) when it takes longer than its limit, saying so once per rank.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from ddptop.core.model.events import NoteEvent, StacksEvent
from ddptop.core.sources.stack_probe import StackSampler
from ddptop.core.sources.stack_pyspy import py_spy

pytestmark = pytest.mark.skipif(py_spy() is None, reason="py-spy is not installed")

SLEEPER = "import time, sys\nprint('ready', flush=True)\nwhile True:\n    time.sleep(3600)\n"


@pytest.fixture
def sleepers():
    procs = [subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        yield {r: p.pid for r, p in enumerate(procs)}
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def sample(pids, tmp_path, **kw):
    out: list = []
    done = threading.Event()

    def emit(evs):
        out.extend(evs)
        if any(isinstance(e, StacksEvent) for e in evs):
            done.set()

    s = StackSampler(tmp_path, lambda: pids, emit, samples=2, gap=0.2, **kw)
    assert s.request()
    assert done.wait(120), out
    return s, out


def test_idle_ranks_get_their_native_frames_read(sleepers, tmp_path):
    _s, out = sample(sleepers, tmp_path)
    (ev,) = [e for e in out if isinstance(e, StacksEvent)]
    assert ev.native and ev.given_up == ()
    # the second sample of every (idle) rank holds its native frames: the sleep's libc call under the Python line
    for r in sleepers:
        text = (tmp_path / "stacks").glob(f"*-samples/rank{r}.1.txt")
        second = next(text).read_text()
        assert "(idle)" in second and ".so" in second, second


def test_a_native_dump_past_its_limit_is_given_up_for_python_frames_and_said_once(sleepers, tmp_path):
    s, out = sample(sleepers, tmp_path, native_timeout=0.001)
    (ev,) = [e for e in out if isinstance(e, StacksEvent)]
    assert set(ev.given_up) == set(sleepers) and ev.samples == 2  # the Python-only dump took its place
    notes = [e.message for e in out if isinstance(e, NoteEvent) and "native stack frames" in e.message]
    assert len(notes) == 1 and "given up after 0.001 s" in notes[0] and "rank 0" in notes[0]
    assert "given up" not in ev.error
    # a second sampling says nothing new about those ranks
    out.clear()
    done = threading.Event()
    s.emit = lambda evs: (out.extend(evs), done.set() if any(isinstance(e, StacksEvent) for e in evs) else None)
    deadline = time.monotonic() + 60
    while not s.request():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert done.wait(120)
    assert not [e for e in out if isinstance(e, NoteEvent) and "native stack frames" in e.message]
