"""A run's own story (ddptop.core.tools.run_story): the journal replayed through the live analysis on its own clock.

The journals here are written as the supervisor writes them (steps from the hook, a stack sampling at a
suspected stall, the alarm it raised, the stop it made), without torchrun; the end-to-end hang tests diagnose
real runs the same way (conftest.diagnose_agrees).
"""

from __future__ import annotations

import json

from conftest import run_ddptop, write_run

from ddptop.core.tools.run_story import story

T0 = 1_700_000_000.0


def where(rank, kind, line, fn="main"):
    return {"rank": rank, "status": "frozen", "kind": kind, "function": fn, "file": "/w/train.py", "line": line,
            "call": "time.sleep" if kind != "collective" else "all_reduce",
            "text": f"in `{fn}` at train.py:{line}", "signature": [f"{fn}@train.py:{line}", kind]}


def hung_run(tmp_path, *, recorded_culprits=(1,), final=None):
    ev = [{"kind": "state", "t": T0, "state": "running", "message": "torchrun pid 10"}]
    ev += [{"kind": "rank", "t": T0 + 0.1, "rank": r, "local_rank": r, "pid": 100 + r, "attempt": 0, "alive": True}
           for r in (0, 1)]
    for i in range(1, 51):
        ev += [{"kind": "progress", "t": T0 + 1 + i * 0.1, "rank": r, "step": i, "source": "hook"} for r in (0, 1)]
    last = T0 + 1 + 50 * 0.1
    stacks = {"kind": "stacks", "t": last + 2.2, "span": 1.1, "ranks": [0, 1], "samples": 2, "hung": True,
              "culprits": [1], "waiting": [0], "summary": "hung: rank 1 ...",
              "where": {"0": where(0, "collective", 80, "step"), "1": where(1, "sleep/wait in user code", 60)},
              "groups": [], "dir": "", "native": False}
    ev.append(stacks)
    alarm_t = last + 3.4
    ev.append({"kind": "alarm", "t": alarm_t, "type": "stall", "id": "stall-collective", "ranks": [0, 1],
               "culprits": list(recorded_culprits), "message": "Collective hang: ...",
               "where": {str(r): where(r, "sleep/wait in user code", 60) for r in recorded_culprits}})
    ev.append({"kind": "state", "t": alarm_t + 1, "state": "stopping", "message": "stop requested"})
    ev.append(final or {"kind": "state", "t": alarm_t + 2, "state": "stopped", "exit_code": 124,
                        "message": "stopped by ddptop: the job stalled (--on-stall kill)"})
    return write_run(tmp_path, events=ev, logs={0: "step 1\n", 1: "step 1\n"}), alarm_t


def test_the_replay_raises_the_runs_hang_with_the_same_culprit_and_says_who_ended_it(tmp_path):
    run, alarm_t = hung_run(tmp_path)
    s = story(run)
    assert [a.culprits for a in s.stalls] == [(1,)] and s.stalls[0].id == "stall-collective"
    assert abs(s.stalls[0].t - alarm_t) < 1.5  # when the live analysis had the samples
    assert s.stalls[0].where[1].line == 60 and s.differences == ()
    # a journal of an earlier release (no ended_by): read from the supervisor's words
    assert s.ended_by.by == "ddptop-on-stall" and s.ended_by.exit_code == 124


def test_where_the_replay_and_the_recorded_alarm_differ_both_are_said(tmp_path):
    run, _t = hung_run(tmp_path, recorded_culprits=(0,))
    s = story(run)
    assert s.stalls[0].culprits == (1,) and s.recorded[0].culprits == (0,)
    assert len(s.differences) == 1 and "culprits [1]" in s.differences[0] and "culprits [0]" in s.differences[0]


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
