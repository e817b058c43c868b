"""Processes a test starts itself, for the tests of `ddptop attach --pid` (jobs ddptop did not launch):
each in a session of its own, all killed by process group at teardown (the ``procs`` fixture), and a
one-rank job without torch (``start_lone_rank``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, alive
from helpers import wait_for


class Procs:
    """Every process a test starts, killed by process group at teardown."""

    def __init__(self):
        self.popens: list[subprocess.Popen] = []
        self.pids: set[int] = set()  # ranks and other descendants seen (each leads its own group or not)

    def popen(self, argv, **kw) -> subprocess.Popen:
        kw.setdefault("cwd", ROOT)
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen(argv, start_new_session=True, **kw)
        self.popens.append(p)
        return p

    def remember_tree(self, p: subprocess.Popen) -> None:
        try:
            self.pids.update(c.pid for c in psutil.Process(p.pid).children(recursive=True))
        except psutil.Error:
            pass

    def kill_all(self) -> list[int]:
        for p in self.popens:
            self.remember_tree(p)
        for pid in [p.pid for p in self.popens] + sorted(self.pids):
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for p in self.popens:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(alive(pid) for pid in self.pids):
            time.sleep(0.1)
        return [pid for pid in self.pids if alive(pid)]


@pytest.fixture
def procs():
    ps = Procs()
    try:
        yield ps
    finally:
        left = ps.kill_all()
        assert not left, f"processes left behind: {left}"


LONE = textwrap.dedent("""
    import sys, time
    for i in range(1, 100000):
        print(f"step {i} loss 0.5", flush=True)
        time.sleep(0.1)
""")


def start_lone_rank(procs, tmp_path) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "lone.out"
    with open(out, "wb") as f:
        f.write(b"".join(b"old line %d\n" % i for i in range(10000)))  # ~130 KiB of history
        p = procs.popen([sys.executable, "-c", LONE], stdout=f, stderr=subprocess.STDOUT,
                        env=dict(os.environ, RANK="3", LOCAL_RANK="0", WORLD_SIZE="4"))
    wait_for(lambda: b"step 2 " in out.read_bytes(), timeout=60, what="the lone rank's output")
    return p, out
