"""Readers sleep until a file changes (watchfiles), and fall back to polling
where file events do not come; the agent sends log batches to a client that
takes them.

(The pure parts: tests/unit/test_live_reading.py.)"""

import json
import os
import queue
import subprocess
import threading
import time

from conftest import ROOT, TIMEOUT, ddptop_cmd
from made_runs import live_run, rank_log


def end_run(run, code=0):
    with open(run / "events.jsonl", "a") as f:
        f.write(json.dumps({"t": 9.0, "kind": "state", "state": "succeeded" if code == 0 else "failed",
                            "exit_code": code}) + "\n")
    (run / "exit.json").write_text(json.dumps({"state": "succeeded", "exit_code": code}))


def _reader(stream, q):
    for line in stream:
        q.put(line)
    q.put(None)


def test_the_agent_sends_log_batches_once_the_client_takes_them(tmp_path, runs_dir):
    run = live_run(tmp_path)
    env = dict(os.environ, DDPTOP_RUNS_DIR=str(runs_dir))
    p = subprocess.Popen(ddptop_cmd("agent", "--run", str(run)), cwd=ROOT, env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(p.stdout, q), daemon=True).start()
    seen: list[dict] = []

    def until(cond, what):
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                line = q.get(timeout=1)
            except queue.Empty:
                continue
            assert line is not None, f"the agent ended before {what}: {p.stderr.read()[-2000:]}"
            d = json.loads(line)
            seen.append(d)
            if cond(d):
                return d
        raise AssertionError(f"no {what} within {TIMEOUT} s")

    try:
        hello = until(lambda d: d["kind"] == "hello", "hello")
        assert hello["minor"] >= 3
        # before the client says it takes batches: one log object a line, as --json prints them
        first = until(lambda d: d["kind"] == "log" and d["rank"] == 1, "rank 1's first line")
        assert first["text"] == "step 1 loss 0.6" and first["offset"] == 0
        p.stdin.write(json.dumps({"cmd": "accept", "kinds": ["logs"]}) + "\n")
        p.stdin.flush()
        reply = until(lambda d: d["kind"] == "reply", "the reply to accept")
        assert reply["cmd"] == "accept" and reply["ok"]
        with open(rank_log(run, 0), "a") as f:
            f.write("step 2 loss 0.4\nstep 3 loss 0.3\n")
        b = until(lambda d: d["kind"] == "logs", "a logs batch")
        assert b["rank"] == 0 and b["texts"] == ["step 2 loss 0.4", "step 3 loss 0.3"]
        size = len("step 1 loss 0.5\n")
        assert b["offsets"] == [size, size + len("step 2 loss 0.4\n")] and b["partial"] == [] and not b["transient"]
        end_run(run)
        until(lambda d: d["kind"] == "bye", "bye")
        after = seen[seen.index(reply):]
        assert not [d for d in after if d["kind"] == "log"], "a log object after the client took batches"
    finally:
        p.stdin.close()
        p.kill()
        p.wait(timeout=TIMEOUT)
