"""Flight-recorder dumps asked for at a stall of a real job.

(The pure parts: tests/unit/test_flight.py.)"""

import json
import os
import subprocess
import threading

import pytest

from conftest import EXAMPLE, ROOT, TIMEOUT, ddptop_cmd


@pytest.fixture(autouse=True)
def least_silence(monkeypatch):
    """The least silence that is a hang: 5 s here (DDPTOP_MIN_SILENCE, 10 s by default), so that the
    hangs below are alarmed sooner."""
    monkeypatch.setenv("DDPTOP_MIN_SILENCE", "5")


def test_at_a_stall_every_rank_dumps_and_ddptop_names_the_one_that_never_joined(tmp_path):
    """A real 2-rank gloo job under --profile flight-recorder: rank 1 hangs; at the
    stall ddptop asks the ranks for their flight recorders (the hook's thread answers
    while the main thread waits in the collective) and says rank 1 never joined."""
    run = tmp_path / "run"
    env = dict(os.environ, DDPTOP_RUNS_DIR=str(tmp_path / "runs"))
    p = subprocess.Popen(ddptop_cmd("--json", "--gpu", "sim", "--stall-after", "5", "--profile", "flight-recorder",
                                    "--run-dir", str(run), "torchrun", "--nproc-per-node", "2", EXAMPLE,
                                    "--steps", "100000", "--step-time", "0.05", "--fault", "hang", "--fault-rank", "1",
                                    "--fault-step", "30"),
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    note = None
    watchdog = threading.Timer(TIMEOUT, lambda: os.killpg(p.pid, 9))  # no note in time: end the reading below
    watchdog.start()
    try:
        for line in p.stdout:
            e = json.loads(line)
            if e["kind"] == "note" and e["message"].startswith("flight recorder (") and "never joined" in e["message"]:
                note = e["message"]
                break
    finally:
        watchdog.cancel()
        if p.poll() is None:
            os.killpg(p.pid, 15)  # the supervisor stops the job and every rank
        p.wait(timeout=TIMEOUT)
    assert note is not None
    assert "(2 of 2 ranks dumped" in note and "rank 1 never joined" in note and "rank 0 is in collective #" in note
    assert sorted(f.name for f in (run / "flight").glob("rank_*")) == ["rank_0", "rank_1"]
    r = subprocess.run(ddptop_cmd("diagnose", str(run)), capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "Flight recorder (" in r.stdout and "rank 1 never joined" in r.stdout
