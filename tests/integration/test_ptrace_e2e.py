"""A kernel that refuses ptrace (no CAP_SYS_PTRACE, another user, Yama): recognised by the failure itself,
said once per run with the fix (the doctor's check: tests/unit/test_ptrace.py).

The refusal is real: the sampling runs as user nobody with an empty capability bounding set
(``setpriv``), against a process of root's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv to make a real ptrace refusal")

UNPRIVILEGED = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--bounding-set=-all",
                "--inh-caps=-all"]


def run_unprivileged(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([*UNPRIVILEGED, sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd="/")


@pytest.fixture
def victim():
    p = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
    try:
        yield p.pid
    finally:
        p.kill()
        p.wait(timeout=30)


def test_a_refused_ptrace_is_recognised_by_the_failure_itself(victim):
    r = run_unprivileged(f"""
        from ddptop.core.sources.stack_pyspy import dump_stacks, ptrace_refused
        raw, groups, err = dump_stacks({{3: {victim}}})
        print(repr((ptrace_refused({victim}), raw, err)))
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    refused, raw, err = eval(r.stdout.strip())  # (our own repr)
    assert refused is True and raw == {} and err == "rank 3: ptrace is refused", err
    # and as ourselves (root), nothing is refused
    from ddptop.core.sources.stack_pyspy import ptrace_refused

    assert ptrace_refused(victim) is False


def test_the_sampler_says_it_once_per_run_with_the_fix(victim, tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    os.chmod(tmp_path, 0o777)
    os.chmod(d, 0o777)
    r = run_unprivileged(f"""
        import json
        from ddptop.core.sources.stack_probe import StackSampler
        out = []
        s = StackSampler({str(d)!r}, lambda: {{0: {victim}, 1: {victim}}}, out.extend, samples=2, gap=0.1)
        for _ in range(3):
            assert s.request()
            s.wait(60)
        print(json.dumps([e.to_dict() for e in out]))
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    events = json.loads(r.stdout)
    notes = [e for e in events if e["kind"] == "note"]
    stacks = [e for e in events if e["kind"] == "stacks"]
    assert len(notes) == 1 and "ptrace is refused" in notes[0]["message"] and "CAP_SYS_PTRACE" in notes[0]["message"]
    assert len(stacks) == 3 and all(e["error"] == "ptrace is refused for ranks 0,1 (see the note)" for e in stacks)
