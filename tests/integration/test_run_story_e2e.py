"""A run's own story (ddptop.core.tools.run_story): the journal replayed through the live analysis on its own clock.

The journals here are written as the supervisor writes them (steps from the hook, a stack sampling at a
suspected stall, the alarm it raised, the stop it made), without torchrun; the end-to-end hang tests diagnose
real runs the same way (conftest.diagnose_agrees).

(The pure parts: tests/unit/test_run_story.py.)"""

from __future__ import annotations

import json

from conftest import run_ddptop, write_run
from made_runs import T0, hung_run

from ddptop.core.tools.run_story import story


def test_diagnose_of_a_run_ddptop_stopped_because_it_hung_starts_from_the_hang(tmp_path):
    run, _t = hung_run(tmp_path, final={"kind": "state", "t": T0 + 20, "state": "stopped", "exit_code": 143,
                                        "message": "stopped on request (SIGTERM to ddptop's supervisor)",
                                        "ended_by": "ddptop-stop"})
    rep = json.loads(run_ddptop("diagnose", "--json", str(run)).stdout)
    rc = rep["root_cause"]
    assert rc["signature"] == "stall-collective" and rc["culprits"] == [1] and rc["rank"] == 1
    assert rc["time"].startswith("2023-11-14T") and rc["replayed"] is True
    assert rep["culprits"] == [1] and rep["ended_by"]["by"] == "ddptop-stop"
    text = run_ddptop("diagnose", str(run)).stdout
    assert text.startswith("Root cause: the job hung (stall-collective; odd rank out: rank 1") and \
        "ended by: a stop asked of ddptop" in text, text


def test_a_run_that_ended_on_its_own_without_a_hang_has_no_hang_root(tmp_path):
    ev = [{"kind": "state", "t": T0, "state": "running"},
          {"kind": "rank", "t": T0 + 0.1, "rank": 0, "local_rank": 0, "pid": 100, "attempt": 0, "alive": True}]
    ev += [{"kind": "progress", "t": T0 + 1 + i * 0.1, "rank": 0, "step": i, "source": "hook"} for i in range(1, 30)]
    ev.append({"kind": "state", "t": T0 + 5, "state": "succeeded", "exit_code": 0, "message": "torchrun exited with 0",
               "ended_by": "job"})
    run = write_run(tmp_path, events=ev, logs={0: "step 1\n"}, nproc=1)
    s = story(run)
    assert s.stalls == () and s.hang is None and s.ended_by.by == "job"
    rep = json.loads(run_ddptop("diagnose", "--json", str(run)).stdout)
    assert rep["root_cause"] is None and rep["ended_by"]["by"] == "job"
