"""Process-tree reads from /proc/PID/task/*/children agree with psutil's scan
of every process, on a real tree (a child forked from a non-main thread too)."""

import subprocess
import sys

import psutil
import pytest

from ddptop.core.sources import proc_tree as procs
from helpers import wait_for

TREE = r"""
import subprocess, sys, threading, time
for _ in range(2):  # two workers, each with a child of its own
    subprocess.Popen([sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"])
t = threading.Thread(target=lambda: subprocess.Popen(["sleep", "60"]))  # forked by another thread
t.start(); t.join()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def tree():
    p = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True)
    me = psutil.Process(p.pid)
    try:
        assert p.stdout.readline().strip() == "ready"
        wait_for(lambda: len(me.children(recursive=True)) >= 5, timeout=20, interval=0.05, what="the process tree")
        yield me
    finally:
        for c in me.children(recursive=True):
            c.kill()
        p.kill()
        p.wait(timeout=10)


def test_children_and_descendants_match_psutil(tree):
    want_kids = sorted(c.pid for c in tree.children())
    want_all = sorted(c.pid for c in tree.children(recursive=True))
    assert len(want_kids) == 3 and len(want_all) == 5
    assert sorted(procs.child_pids(tree.pid)) == want_kids
    assert sorted(c.pid for c in procs.children(tree)) == want_kids
    assert sorted(procs.descendant_pids(tree.pid)) == want_all
    assert sorted(p.pid for p in procs.descendants(tree)) == want_all
    # pids already known are left out
    assert sorted(c.pid for c in procs.children(tree, known=set(want_kids[:2]))) == want_kids[2:]


def test_a_process_that_is_gone_has_no_children(monkeypatch):
    """...from the first look of a process too (whether the kernel keeps the children files is not learnt from
    the pid asked about)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=30)
    monkeypatch.setattr(procs, "_SUPPORTED", None)
    assert procs.child_pids(p.pid) == [] and procs.descendant_pids(p.pid) == []


def test_without_the_children_file_it_falls_back_to_psutil(tree, monkeypatch):
    monkeypatch.setattr(procs, "_SUPPORTED", False)
    assert procs.child_pids(tree.pid) is None
    assert sorted(c.pid for c in procs.children(tree)) == sorted(c.pid for c in tree.children())
    assert sorted(p.pid for p in procs.descendants(tree)) == sorted(c.pid for c in tree.children(recursive=True))
