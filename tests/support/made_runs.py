"""Run directories made by hand, as the supervisor leaves them (with ``conftest.write_run``), for the tests of
more than one tier that read the same run: in process (tests/unit) and through a real ``ddptop`` process
(tests/integration)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil

from conftest import rank_started, write_run

# -- a journal damaged in every way a reader must survive (tests/*/test_jobs*.py) ----------------------------

DAMAGE = [
    b"[1, 2]\n",
    b"null\n",
    b'{"t": 3.0, "kind": "rank", "rank": 1, "local_rank"\n',  # a truncated object, then a newline
    b'{"t": 3.1, "kind": "note", "level": "info", "message": "caf\xe9 \xff\xfe"}\n',  # invalid UTF-8
    b'{"t": 3.2, "kind": "rank", "rank": "zero", "local_rank": 0, "pid": 5, "alive": true}\n',
    b'{"t": 3.3, "kind": "state", "state": "failed", "exit_code": "x"}\n',
    b'{"t": 3.4, "kind": "rank", "rank": 0, "local_rank": 0, "attempt": [0], "alive": true}\n',
    b'{"t": 3.5, "kind": "from-a-newer-ddptop", "whatever": 1}\n',  # unknown kind: ignored, no note
    b'{"t": 3.6, "kind": "note", "level": "info", "message": "still here", "new_field": [1]}\n',  # unknown field
]


def damaged_run(tmp_path: Path, exit_code: int = 3) -> Path:
    run = write_run(tmp_path, events=[rank_started(1.0, 0, 100), rank_started(1.0, 1, 101)],
                    logs={0: "".join(f"step {i} loss 0.5\n" for i in range(1, 6)),
                          1: "".join(f"step {i} loss 0.6\n" for i in range(1, 6))},
                    exit={"state": "failed", "exit_code": exit_code})
    with open(run / "events.jsonl", "ab") as f:
        f.write(b"".join(DAMAGE))
        f.write(json.dumps({"t": 9.0, "kind": "state", "state": "failed", "exit_code": exit_code,
                            "message": "torchrun exited with 3"}).encode() + b"\n")
    return run


# -- a run ddptop stopped because it hung, as its journal tells it (tests/*/test_run_story*.py) -------------

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


# -- a live run whose supervisor is the test process (tests/*/test_live_reading*.py) ------------------------

def live_run(tmp_path):
    """A run whose supervisor is this test process (alive as long as the test)."""
    run = write_run(tmp_path, events=[rank_started(1.0, 0, 100), rank_started(1.0, 1, 101)],
                    logs={0: "step 1 loss 0.5\n", 1: "step 1 loss 0.6\n"})
    (run / "supervisor.json").write_text(json.dumps({"pid": os.getpid(), "create_time": psutil.Process().create_time()}))
    return run


def rank_log(run, rank):
    return next(run.glob(f"logs/*/attempt_0/{rank}/stdout.log"))


# -- a run whose steps ddptop knew from its log lines alone, hung on a busy GPU (tests/unit/test_run_story.py) --

def log_stepped_run(tmp_path, *, marks=True):
    """One rank printing ``step N`` every 0.25 s with no hook, its GPU at 100%, then a wait on the GPU: the
    stall the live analysis raised 10.5 s after the last step (the least silence, 10 s by default), stopped by a person 30 s later.  With ``marks``
    the journal says how far the supervisor had read the log, every 0.5 s (``LogMarks``), as it writes it."""
    lines = [f"step {i} loss 0.5\n" for i in range(1, 41)]
    starts = [sum(len(x) for x in lines[:i]) for i in range(len(lines))]
    read_at = [T0 + 1 + i * 0.25 for i in range(len(lines))]
    last = read_at[-1]
    ev = [{"kind": "state", "t": T0, "state": "running", "message": "torchrun pid 10"},
          {"kind": "rank", "t": T0 + 0.1, "rank": 0, "local_rank": 0, "pid": 100, "attempt": 0, "alive": True}]
    ev += [{"kind": "gpu", "t": T0 + s, "index": 0, "util": 100.0, "ranks": [0], "mapping": "nvml"} for s in range(46)]
    if marks:
        path = "logs/x_abc/attempt_0/0/stdout.log"
        for k in range(0, len(lines), 2):  # (a mark each 0.5 s: the two reads since the last one)
            reads = [[starts[i], read_at[i]] for i in range(k, min(k + 2, len(lines)))]
            ev.append({"kind": "marks", "t": reads[-1][1] + 0.01, "upto": {path: reads}})
    w = dict(where(0, "gpu-wait", 36, "<module>"), call="loss.item", gpu="cudaStreamSynchronize")
    ev.append({"kind": "stacks", "t": last + 9.0, "span": 0.6, "ranks": [0], "samples": 2, "hung": True,
               "culprits": [], "waiting": [0], "summary": "hung, no single culprit", "where": {"0": w},
               "groups": [], "dir": "", "native": True})
    alarm_t = last + 10.5
    ev.append({"kind": "alarm", "t": alarm_t, "type": "stall", "id": "stall-hot", "ranks": [0], "culprits": [],
               "message": "Hot stall: GPUs busy but no step progress ...", "where": {}})
    ev.append({"kind": "state", "t": alarm_t + 30, "state": "stopped", "exit_code": 143, "ended_by": "ddptop-stop",
               "message": "stopped on request (SIGTERM to ddptop's supervisor)"})
    ev.sort(key=lambda e: e["t"])
    return write_run(tmp_path, events=ev, logs={0: "".join(lines)}, nproc=1), last, alarm_t
