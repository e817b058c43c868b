"""`ddptop attach HOST` over a real sshd on 127.0.0.1, to real torchrun jobs."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from helpers import per_line
from conftest import EXAMPLE, ROOT, TIMEOUT, alive, ddptop_cmd, json_events, journal_events, wait_for
from ddptop.core.sessions.cross_node import MultiSession
from ddptop.core.sessions.ssh import RemoteSession
from ddptop.core.run.run_session import Session
from sshd import remote_ddptop

P2P_HANG = ["--nproc-per-node", "2", EXAMPLE, "--steps", "40", "--step-time", "0.05", "--fault", "p2p-hang",
            "--fault-step", "10"]


def launch(runs_dir, *torchrun_args, extra=()):
    env = dict(os.environ, DDPTOP_RUNS_DIR=str(runs_dir))
    p = subprocess.Popen(ddptop_cmd("--json", "--gpu", "sim", *extra, "torchrun", *torchrun_args), cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    run = wait_for(lambda: next((d for d in runs_dir.glob("*") if (d / "meta.json").exists()), None)
                   if runs_dir.exists() else None, what="the run directory")
    return p, run


def finish(p, timeout=TIMEOUT):
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return out.decode(), err.decode()


def drain(session, until, timeout=TIMEOUT, what="condition"):
    """Poll a session, keeping every event, until until(events) is true."""
    events: list = []

    def done():
        events.extend(session.poll())
        return until(events)

    wait_for(done, timeout, interval=0.05, what=lambda: f"{what}; last events: {events[-5:]}")
    return events


def test_attach_over_ssh_shows_the_job_and_relaunches_it(runs_dir, sshd):
    job, run = launch(runs_dir, *P2P_HANG)
    remote = remote_ddptop(runs_dir)
    # a person watching from the CLI, headless, over ssh...
    watcher = subprocess.Popen(ddptop_cmd("--json", "attach", "node-a", "--ssh", " ".join(sshd.ssh),
                                          "--remote-ddptop", remote),
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    # ...and another one who relaunches through the attachment
    rs = RemoteSession("node-a", ssh=sshd.ssh, remote_cmd=remote)
    try:
        evs = drain(rs, lambda es: any(e.kind == "logs" and e.rank == 1 for e in es), what="rank 1's first line")
        assert rs.dump_stacks()  # the p key: every rank's stack, now, through the attachment
        evs += drain(rs, lambda es: any(e.kind == "alarm" and e.type == "stall" for e in es), what="the stall alarm")
        assert rs.link == "up" and rs.meta is not None and rs.meta.run_id == run.name
        assert rs.relaunch(["p2p-off"], "test: through ssh")
        evs += drain(rs, lambda es: rs.finished, what="the relaunched job to finish")
    finally:
        rs.close()
    out, err = finish(job)
    w_out, w_err = finish(watcher)
    assert json_events(out)[-1]["state"] == "succeeded"
    assert rs.exit_status().code == 0 and rs.final_state.state == "succeeded"
    kinds = {e.kind for e in evs}
    assert {"link", "launch", "rank", "logs", "gpu", "proc", "progress", "alarm", "state"} <= kinds
    # every line of both ranks, tagged with the node
    logs = [e for e in per_line(evs) if e.kind == "log" and e.rank is not None]
    assert all(e.node == "node-a" for e in logs)
    assert any(e.rank == 0 and e.text.startswith("step 40 ") for e in logs)
    assert any(e.rank == 1 and e.text.startswith("step 40 ") for e in logs)
    gpus = [e for e in evs if e.kind == "gpu"]
    assert gpus and all(e.simulated and e.node == "node-a" for e in gpus)
    assert [(e.generation, e.profiles) for e in evs if e.kind == "launch"] == [(0, ()), (1, ("p2p-off",))]
    assert any(e.kind == "note" and "relaunching with p2p-off" in e.message for e in evs)
    # the stacks asked for came back before the stall's own capture
    notes = [e.message for e in evs if e.kind == "note"]
    asked = notes.index("capturing every rank's Python stack (asked for)")
    assert "stacks captured in" in " ".join(notes[asked:])
    stall_at = next(i for i, e in enumerate(evs) if e.kind == "alarm" and e.type == "stall")
    captured_at = next(i for i, e in enumerate(evs) if e.kind == "note" and "stacks captured in" in e.message)
    assert captured_at < stall_at, "the asked-for stacks should arrive before the stall alarm"
    # the CLI watcher saw the same job to its end, and exits with its code
    assert watcher.returncode == 0, w_err[-2000:]
    w = json_events(w_out)
    assert w[0]["kind"] == "link" and w[0]["state"] == "connecting"
    assert any(e["kind"] == "link" and e["state"] == "up" for e in w)
    assert sum(1 for e in w if e["kind"] == "log" and e["text"].startswith("step 40 ")) == 2
    assert w[-1]["kind"] == "state" and w[-1]["state"] == "succeeded"


def test_two_nodes_one_view_names_the_odd_rank_out(tmp_path, sshd):
    """A real 2-node torchrun job (one rank per node), one ddptop per node; the
    attach merges both and its stall detector names the hung rank on node-b."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    jobs = []
    for node_rank, name in enumerate(("a", "b")):
        d = tmp_path / f"runs-{name}"
        jobs.append(launch(d, "--nnodes", "2", "--node-rank", str(node_rank), "--nproc-per-node", "1",
                           "--master-addr", "127.0.0.1", "--master-port", str(port), EXAMPLE, "--steps", "1000",
                           "--step-time", "0.05", "--fault", "hang", "--fault-rank", "1", "--fault-step", "20"))
    try:
        remote = remote_ddptop(tmp_path / "unused")
        w = subprocess.Popen(ddptop_cmd("--json", "attach", f"node-a:{jobs[0][1]}", f"node-b:{jobs[1][1]}",
                                        "--ssh", " ".join(sshd.ssh), "--remote-ddptop", remote),
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        seen = []

        def merged_stall():
            line = w.stdout.readline()
            if not line:
                return True
            e = json.loads(line)
            seen.append(e)
            return e["kind"] == "alarm" and e["type"] == "stall"

        wait_for(merged_stall, timeout=TIMEOUT, interval=0, what="the merged stall alarm")
        alarm = seen[-1]
        assert alarm["kind"] == "alarm", seen[-5:]
        # the cross-node alarm (node-b's own is folded into it, not shown first), with the culprit's node
        assert alarm["culprits"] == [1] and sorted(alarm["ranks"]) == [0, 1], alarm
        assert alarm["node"] == "node-b", alarm
        # one rank a node: nothing between one node's GPUs to turn off (each node's launch command says it)
        assert "p2p-off" not in alarm["suggested_profiles"] and alarm["suggested_profiles"], alarm
        nodes = {(e["rank"], e["node"]) for e in seen if e["kind"] == "log" and e["rank"] is not None}
        assert nodes == {(0, "node-a"), (1, "node-b")}
        assert {e["node"] for e in seen if e["kind"] == "link" and e["state"] == "up"} == {"node-a", "node-b"}
        # stopping through the attachment stops both nodes' jobs
        os.killpg(w.pid, signal.SIGINT)
        w_out, w_err = finish(w)
    finally:
        for p, run in jobs:
            if p.poll() is None:
                Session.open(run).stop()
    outs = [finish(p) for p, _ in jobs]
    for (p, run), (out, err) in zip(jobs, outs):
        assert json_events(out)[-1]["state"] == "stopped", err[-2000:]
        assert not any(alive(e["pid"]) for e in journal_events(run) if e["kind"] == "rank")
    tail = json_events(w_out)
    assert tail[-1]["kind"] == "state" and tail[-1]["state"] == "stopped"


def fake_agent(tmp_path, body: str) -> str:
    """A scripted remote `ddptop` (to test what the client does with bad protocol lines)."""
    script = tmp_path / "fake_ddptop.py"
    script.write_text("import json, sys, time\n" + body)
    return f"{sys.executable} {script}"


HELLO = ('{"kind":"hello","proto":"ddptop-agent","version":1,"host":"h","ddptop":"0.1.0","run":"r","run_dir":"/r",'
         '"meta":null}')
LOG = '{"t":1.0,"kind":"log","rank":0,"stream":"stdout","text":"step %d","attempt":0,"path":"logs/0","offset":%d}'


def test_malformed_and_truncated_protocol_lines_are_errors_with_context(tmp_path, sshd):
    body = f"""
print({HELLO!r})
print({(LOG % (1, 0))!r})
print("this is not json")
print('{{"kind":"log","rank":0,"text":"cut')
print('{{"kind":"gpu","index":"zero","ranks":5}}')
print('{{"no_kind":1}}')
print({(LOG % (2, 7))!r})
print('{{"kind":"cursor","files":{{"logs/0":14}}}}')
print('{{"t":2.0,"kind":"state","state":"succeeded","exit_code":0}}')
print('{{"kind":"cursor","files":{{}}}}')
print('{{"kind":"bye","exit_code":0}}')
"""
    r = subprocess.run(ddptop_cmd("--json", "attach", "node-a", "--ssh", " ".join(sshd.ssh), "--remote-ddptop",
                                  fake_agent(tmp_path, body)), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    evs = json_events(r.stdout)
    assert [e["text"] for e in evs if e["kind"] == "log"] == ["step 1", "step 2"]
    warnings = [e["message"] for e in evs if e["kind"] == "note" and e["level"] == "warning"]
    assert any("agent line 3 unreadable" in m and "this is not json" in m for m in warnings), warnings
    assert any("agent line 4 unreadable" in m and '"cut' in m for m in warnings), warnings
    assert any("agent line 6 unreadable" in m and "no_kind" in m for m in warnings), warnings
    assert evs[-1]["kind"] == "state" and evs[-1]["state"] == "succeeded"


SKEWED_AGENT = """
import json, sys, time
skew, rank = float(sys.argv[1]), int(sys.argv[2])  # this node's clock minus the real time
now = lambda: time.time() + skew
send = lambda d: print(json.dumps(d), flush=True)
send({"kind": "hello", "proto": "ddptop-agent", "version": 1, "host": "h", "ddptop": "0.1.0", "run": "r",
      "run_dir": "/r", "meta": None, "t": now()})
send({"t": now(), "kind": "rank", "rank": rank, "local_rank": 0, "node": "h", "pid": 1, "attempt": 0, "alive": True})
off = 0
for step in range(1, 21):
    text = f"step {step}"
    send({"t": now(), "kind": "log", "rank": rank, "stream": "stdout", "text": text, "attempt": 0,
          "path": "logs/0", "offset": off})
    off += len(text) + 1
    send({"t": now(), "kind": "progress", "rank": rank, "step": step, "source": "hook"})
    send({"kind": "cursor", "files": {"logs/0": off}})
    time.sleep(0.1)
for _ in range(120):  # then the job hangs: the link stays up, no step comes
    send({"kind": "cursor", "files": {"logs/0": off}})
    time.sleep(0.5)
"""


def test_a_node_whose_clock_is_ahead_does_not_delay_the_stall_alarm(tmp_path, sshd):
    """node-b's clock is 60 s ahead.  Its times are moved onto this machine's
    clock (and it says so), so when both nodes stop stepping the cross-node
    stall alarm comes after --stall-after, not a minute later."""
    script = tmp_path / "skewed_agent.py"
    script.write_text(SKEWED_AGENT)
    agent = f"{sys.executable} {script}"
    ms = MultiSession([RemoteSession("node-a", ssh=sshd.ssh, remote_cmd=f"{agent} 0 0"),
                       RemoteSession("node-b", ssh=sshd.ssh, remote_cmd=f"{agent} 60 1")], stall_after=2.0)
    t0 = time.time()
    try:
        evs = drain(ms, lambda es: any(e.kind == "alarm" for e in es), timeout=30,
                    what="the stall alarm (late if node-b's clock were taken as it is)")
    finally:
        ms.close()
    t1 = time.time()
    alarm = next(e for e in evs if e.kind == "alarm")
    assert alarm.type == "stall" and alarm.node == "all nodes", alarm
    logs = [e for e in per_line(evs) if e.kind == "log"]
    assert {(e.node, e.text) for e in logs} >= {("node-b", "step 20"), ("node-a", "step 20")}
    assert all(t0 - 1 <= e.t <= t1 + 1 for e in logs), [(e.node, e.t - t0) for e in logs if not t0 - 1 <= e.t <= t1][:3]
    last_step = max(e.t for e in logs)
    assert alarm.t - last_step < 15, alarm.t - last_step  # 2 s of silence and the detector's own margin
    notes = [e.message for e in evs if e.kind == "note" and e.node == "node-b"]
    assert any("clock is 6" in m and "ahead of" in m for m in notes), notes
    assert not any("clock" in e.message for e in evs if e.kind == "note" and e.node == "node-a")


LAGGING_AGENT = """
import json, sys, time
rank, hold_from, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
out = []
def send(d):
    out.append(json.dumps(d))
def flush():
    print("\\n".join(out), flush=True)
    out.clear()
send({"kind": "hello", "proto": "ddptop-agent", "version": 1, "minor": 5, "host": "h", "ddptop": "0.1.0",
      "run": "r", "run_dir": "/r", "meta": None, "t": time.time()})
send({"t": time.time(), "kind": "rank", "rank": rank, "local_rank": 0, "node": "h", "pid": 1, "attempt": 0,
      "alive": True})
held_until = None
for step in range(1, 61):  # 10 steps a second, each with its cursor as the agent sends them
    send({"t": time.time(), "kind": "progress", "rank": rank, "step": step, "source": "hook"})
    send({"kind": "cursor", "files": {}, "t": time.time()})
    if step == hold_from:
        held_until = time.time() + hold  # the link holds what it carries (a slow link, a busy reader)
    if held_until is None or time.time() >= held_until:
        flush()
    time.sleep(0.1)
flush()
for _ in range(120):  # then the job hangs: the link stays up, heartbeats only
    send({"kind": "cursor", "files": {}, "t": time.time()})
    flush()
    time.sleep(0.5)
"""


def test_a_link_read_late_is_not_a_silent_node(tmp_path, sshd):
    """Both links hold their lines for 8 s while the nodes step on (this machine too busy to read its links
    as they come, or a slow network): the ranks are not silent for those 8 s, they are not read yet.  The
    cross-node detector judges at the time every live link has been read up to (the agent's cursors carry
    their time), so no stall is raised then (before, the whole job looked silent: a stall without a
    culprit); when both nodes stop stepping, the alarm comes."""
    script = tmp_path / "lagging_agent.py"
    script.write_text(LAGGING_AGENT)
    agent = f"{sys.executable} {script}"
    ms = MultiSession([RemoteSession("node-a", ssh=sshd.ssh, remote_cmd=f"{agent} 0 15 8"),
                       RemoteSession("node-b", ssh=sshd.ssh, remote_cmd=f"{agent} 1 15 8")], stall_after=4.0)
    try:
        evs = drain(ms, lambda es: any(e.kind == "alarm" for e in es), timeout=40, what="the stall alarm")
    finally:
        ms.close()
    steps = {(e.rank, e.step): e.t for e in evs if e.kind == "progress"}
    assert (0, 60) in steps and (1, 60) in steps, sorted(steps)[-3:]  # the held steps came, late
    alarm = next(e for e in evs if e.kind == "alarm")
    assert alarm.type == "stall", alarm
    # not while the steps were held: only once both nodes had stopped stepping
    assert alarm.t >= max(steps.values()), (alarm.t - max(steps.values()), alarm.message)


def test_a_hello_read_late_is_not_taken_for_a_skewed_clock(tmp_path, sshd):
    """The node's clock agrees with ours, but its hello reaches us 2.5 s after
    the agent stamped it (a loaded machine, a slow link): no clock warning, and
    the node's times are taken as they are.  (The bound: a hello is sent after
    the connection was started, so a late one cannot make a clock look behind.)"""
    body = """
t = time.time()
time.sleep(2.5)  # the hello stamped, then held up on its way
print(json.dumps({"kind": "hello", "proto": "ddptop-agent", "version": 1, "host": "h", "ddptop": "0.1.0",
                  "run": "r", "run_dir": "/r", "meta": None, "t": t}), flush=True)
print(json.dumps({"t": time.time(), "kind": "log", "rank": 0, "stream": "stdout", "text": "step 1", "attempt": 0,
                  "path": "logs/0", "offset": 0}), flush=True)
print('{"kind":"cursor","files":{"logs/0":7}}')
print(json.dumps({"t": time.time(), "kind": "state", "state": "succeeded", "exit_code": 0}))
print('{"kind":"bye","exit_code":0}', flush=True)
"""
    rs = RemoteSession("node-a", ssh=sshd.ssh, remote_cmd=fake_agent(tmp_path, body), backoff=(0.1,))
    t0 = time.time()
    try:
        evs = drain(rs, lambda es: rs.finished, timeout=60, what="the end")
    finally:
        rs.close()
    t1 = time.time()
    assert rs.skew == 0.0
    assert not [e.message for e in evs if e.kind == "note" and "clock" in e.message]
    logs = [e for e in per_line(evs) if e.kind == "log"]
    assert [e.text for e in logs] == ["step 1"] and t0 <= logs[0].t <= t1


def test_link_cut_mid_line_resumes_from_the_last_cursor(tmp_path, sshd):
    """The first connection dies in the middle of a batch and of a line: nothing
    of that batch is shown, and the second connection resumes at its cursor."""
    mark = tmp_path / "first-done"
    body = f"""
import os, pathlib, base64
mark = pathlib.Path({str(mark)!r})
args = sys.argv[1:]
resume = json.loads(base64.urlsafe_b64decode(args[args.index("--resume") + 1])) if "--resume" in args else {{}}
print({HELLO!r}, flush=True)
if not mark.exists():
    mark.write_text("x")
    print({(LOG % (1, 0))!r})
    print('{{"kind":"cursor","files":{{"logs/0":7}}}}')
    print({(LOG % (2, 7))!r})
    sys.stdout.write('{{"kind":"log","rank":0,"text":"step 3 cut in the mid')
    sys.stdout.flush()
    os._exit(1)
assert resume == {{"logs/0": 7}}, resume
print({(LOG % (2, 7))!r})
print({(LOG % (3, 14))!r})
print('{{"kind":"cursor","files":{{"logs/0":21}}}}')
print('{{"t":2.0,"kind":"state","state":"succeeded","exit_code":0}}')
print('{{"kind":"bye","exit_code":0}}')
"""
    rs = RemoteSession("node-a", ssh=sshd.ssh, remote_cmd=fake_agent(tmp_path, body), backoff=(0.1,))
    try:
        evs = drain(rs, lambda es: rs.finished, timeout=60, what="the end")
    finally:
        rs.close()
    assert rs.error is None, rs.error
    assert [e.text for e in per_line(evs) if e.kind == "log"] == ["step 1", "step 2", "step 3"]
    assert [e.state for e in evs if e.kind == "link"] == ["connecting", "up", "down", "connecting", "up", "closed"]
    assert rs.exit_status().code == 0


def test_remote_without_ddptop_or_with_another_protocol_says_what_to_install(tmp_path, sshd):
    r = subprocess.run(ddptop_cmd("--headless", "attach", "node-a", "--ssh", " ".join(sshd.ssh),
                                  "--remote-ddptop", "/nonexistent/bin/ddptop"),
                       cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 2
    assert "ddptop is not installed on node-a" in r.stderr and "pip install 'ddptop==" in r.stderr
    other = HELLO.replace('"version":1', '"version":99').replace('"0.1.0"', '"9.9"')
    r = subprocess.run(ddptop_cmd("--headless", "attach", "node-a", "--ssh", " ".join(sshd.ssh), "--remote-ddptop",
                                  fake_agent(tmp_path, f"print({other!r})")),
                       cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 2
    assert "node-a runs ddptop 9.9 (agent protocol 99)" in r.stderr and "pip install 'ddptop==" in r.stderr


def test_a_host_name_ssh_rejects_fails_at_once_with_its_message(tmp_path, sshd):
    """A hosts file with a name ssh calls invalid: a permanent error, so no retry
    with backoff: ddptop ends at once with ssh's own words."""
    hosts = tmp_path / "hosts"
    hosts.write_text("bad'host\n")
    r = subprocess.run(ddptop_cmd("--headless", "attach", "--hosts-file", str(hosts), "--ssh", " ".join(sshd.ssh)),
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "hostname contains invalid characters" in r.stdout + r.stderr, (r.stdout, r.stderr)
    assert "retry" not in (r.stdout + r.stderr).lower()


def test_agent_on_a_missing_run_is_a_clear_error(runs_dir, sshd):
    r = subprocess.run(ddptop_cmd("--headless", "attach", "node-a:no-such-run", "--ssh", " ".join(sshd.ssh),
                                  "--remote-ddptop", remote_ddptop(runs_dir)),
                       cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 2 and "no ddptop run called 'no-such-run'" in r.stderr, r.stderr


def test_two_separate_jobs_with_the_same_ranks_are_called_out(tmp_path, sshd):
    """Attaching to two unrelated jobs (both with rank 0) says so instead of silently mixing them."""
    from conftest import rank_started, write_run

    runs = [write_run(tmp_path / n, events=[rank_started(1.0, 0, 11), {"t": 2.0, "kind": "state", "state": "succeeded",
                                                                        "exit_code": 0}],
                      logs={0: f"hello from {n}\n"}, nproc=1, exit={"state": "succeeded", "exit_code": 0})
            for n in ("node-a", "node-b")]
    ms = MultiSession([RemoteSession(n, run=str(r), ssh=sshd.ssh, remote_cmd=remote_ddptop(tmp_path))
                       for n, r in zip(("node-a", "node-b"), runs)])
    try:
        evs = drain(ms, lambda es: ms.finished, what="both runs to end")
    finally:
        ms.close()
    warnings = [e.message for e in evs if e.kind == "note" and "is reported by both" in e.message]
    assert len(warnings) == 1 and "rank 0" in warnings[0] and "separate jobs" in warnings[0], warnings
    assert {e.text for e in per_line(evs) if e.kind == "log"} == {"hello from node-a", "hello from node-b"}


def test_hosts_from_a_file_and_from_slurm(tmp_path, sshd):
    """--hosts-file (comments, HOST:RUN lines) and --slurm JOBID (the job's node list
    from squeue, expanded by scontrol) attach to every node named."""
    from conftest import rank_started, write_run

    runs = {}
    for n, rank in (("node-a", 0), ("node-b", 1)):
        runs[n] = write_run(tmp_path / n, events=[rank_started(1.0, rank, 11), {"t": 2.0, "kind": "state",
                                                                                "state": "succeeded", "exit_code": 0}],
                            logs={rank: f"hello from {n}\n"}, nproc=1, exit={"state": "succeeded", "exit_code": 0})
    common = ["--ssh", " ".join(sshd.ssh), "--remote-ddptop", remote_ddptop(tmp_path)]
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"# the job's nodes\nnode-a:{runs['node-a']}   # rank 0\n\nnode-b:{runs['node-b']}\n")
    r = subprocess.run(ddptop_cmd("--json", "attach", "--hosts-file", str(hosts), *common), capture_output=True,
                       text=True, timeout=TIMEOUT, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    ev = json_events(r.stdout)
    assert {(e["node"], e["text"]) for e in ev if e["kind"] == "log"} == {("node-a", "hello from node-a"),
                                                                           ("node-b", "hello from node-b")}
    assert ev[-1]["kind"] == "state" and ev[-1]["state"] == "succeeded"
    # SLURM is not installed here: its two tools are stood in for by scripts that answer as SLURM does
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text('#!/bin/sh\n[ "$*" = "-h -j 4242 -o %N" ] && echo "node-[a-b]" && exit 0\n'
                                    'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1\n')
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ "$*" = "show hostnames node-[a-b]" ] && printf "node-a\\nnode-b\\n"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    r = subprocess.run(ddptop_cmd("--json", "attach", "--slurm", "4242", "--run", str(runs["node-a"]), *common),
                       capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    ev = json_events(r.stdout)
    assert {e["node"] for e in ev if e["kind"] == "link" and e["state"] == "up"} == {"node-a", "node-b"}
    assert {e["node"] for e in ev if e["kind"] == "log"} == {"node-a", "node-b"}
    r = subprocess.run(ddptop_cmd("--json", "attach", "--slurm", "99", *common), capture_output=True, text=True,
                       timeout=TIMEOUT, cwd=ROOT, env=env)
    assert r.returncode == 2 and "Invalid job id specified" in r.stderr, r.stderr
    r = subprocess.run(ddptop_cmd("--json", "attach", "--slurm", "4242", *common), capture_output=True, text=True,
                       timeout=TIMEOUT, cwd=ROOT, env=dict(os.environ, PATH="/usr/bin:/bin"))
    assert r.returncode == 2 and "--slurm needs `squeue`" in r.stderr, r.stderr


def test_nodes_that_differ_in_nccl_version_or_transport_are_a_finding(tmp_path, sshd):
    """NCCL's INFO lines (the nccl-debug profile) on two nodes of one job: a different
    NCCL version, or InfiniBand on one node and sockets on the other, is said once."""
    from conftest import rank_started, write_run

    logs = {"node-a": "NCCL INFO NCCL version 2.21.5+cuda12.4\nNCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n",
            "node-b": "NCCL INFO NCCL version 2.18.1+cuda12.1\nNCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via NET/Socket/0\n"
                      "NCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via NET/Socket/0\n"}
    runs = {n: write_run(tmp_path / n, events=[rank_started(1.0, r, 11), {"t": 2.0, "kind": "state",
                                                                          "state": "succeeded", "exit_code": 0}],
                         logs={r: logs[n]}, nproc=1, exit={"state": "succeeded", "exit_code": 0})
            for r, n in enumerate(("node-a", "node-b"))}
    ms = MultiSession([RemoteSession(n, run=str(r), ssh=sshd.ssh, remote_cmd=remote_ddptop(tmp_path))
                       for n, r in runs.items()])
    try:
        evs = drain(ms, lambda es: ms.finished, what="both runs to end")
    finally:
        ms.close()
    notes = [e.message for e in evs if e.kind == "note" and e.message.startswith("nodes differ")]
    assert sorted(notes) == sorted([
        "nodes differ in NCCL (from its log): node-a: 2.21.5+cuda12.4; node-b: 2.18.1+cuda12.1 "
        "(one job should run the same versions on every node)",
        "nodes differ in NCCL transport: node-a: NET/IB; node-b: NET/Socket "
        "(InfiniBand on some nodes, sockets on others: check NCCL_IB_* and the IB devices)"]), notes
    # the agents said what they run (the same here: one machine), so no note about torch
    assert all(s.versions.get("torch") for s in ms.sessions) and not any("in torch" in n for n in notes)


def gpus_row_here():
    """The doctor's GPUs row for this machine, from the same check run here."""
    from ddptop.core.tools.doctor import check_gpus
    from ddptop.core.sources.gpu_nvml import NvmlBackend

    b = NvmlBackend()
    try:
        return check_gpus(b.topology(), b.error, b.fault)
    finally:
        b.shutdown()


def test_doctor_on_remote_nodes_over_ssh(tmp_path, sshd):
    """`ddptop doctor --host H`: the node's own ddptop runs the checks there; a host
    without ddptop is a failed row with the install command."""
    common = ["--ssh", " ".join(sshd.ssh)]
    r = subprocess.run(ddptop_cmd("doctor", "--json", "--host", "node-a", "--host", "node-b", *common,
                                  "--remote-ddptop", remote_ddptop(tmp_path)),
                       capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
    d = json.loads(r.stdout)
    assert sorted(d["hosts"]) == ["node-a", "node-b"]
    here = gpus_row_here()  # both "nodes" are this machine: with or without GPUs, the same row
    for h in ("node-a", "node-b"):
        rows = {row["name"]: row for row in d["hosts"][h]["rows"]}
        assert (rows["GPUs"]["status"], rows["GPUs"]["summary"]) == (here.status, here.summary)
        assert "/dev/shm" in rows and "Master port" in rows
    assert r.returncode == max(h["summary"]["exit_code"] for h in d["hosts"].values())
    r = subprocess.run(ddptop_cmd("doctor", "--host", "node-a", *common, "--remote-ddptop", "/nonexistent/ddptop"),
                       capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
    assert r.returncode == 2
    assert "== node-a ==" in r.stdout and "ddptop is not installed on node-a" in r.stdout
    assert "pip install 'ddptop==" in r.stdout


def test_remote_ddptop_under_the_remote_home_and_nothing_else_expanded(runs_dir, sshd):
    """`--remote-ddptop '~/venv/bin/ddptop'`: the leading ~/ is the remote home
    (quoted, the remote shell would not expand it); any other text is quoted."""
    import shutil

    from ddptop.core.sessions.transports import remote_command

    assert remote_command(["~/venv/bin/ddptop", "agent"]) == '"$HOME"/venv/bin/ddptop agent'
    assert remote_command(["$HOME/my env/ddptop"]) == '"$HOME"/\'my env/ddptop\''
    assert remote_command(["/opt/$(touch x)/ddptop", "~/x"]) == "'/opt/$(touch x)/ddptop' '~/x'"
    r = subprocess.run(ddptop_cmd("--headless", "torchrun", "--nproc-per-node", "1", EXAMPLE, "--steps", "3",
                                  "--step-time", "0"), capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    home_dir = Path.home() / f".ddptop-test-{os.getpid()}"
    home_dir.mkdir()
    try:
        wrapper = home_dir / "ddptop"
        wrapper.write_text(f"#!/bin/sh\nexec {remote_ddptop(runs_dir)} \"$@\"\n")
        wrapper.chmod(0o755)
        a = subprocess.run(ddptop_cmd("--json", "attach", "node-a:latest", "--ssh", " ".join(sshd.ssh),
                                      "--remote-ddptop", f"~/{home_dir.name}/ddptop"),
                           capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
        assert a.returncode == 0, a.stderr[-2000:]
        evs = json_events(a.stdout)
        assert any(e["kind"] == "log" and e["rank"] == 0 and e["text"].startswith("step 3 ") for e in evs)
        assert evs[-1]["kind"] == "state" and evs[-1]["state"] == "succeeded"
    finally:
        shutil.rmtree(home_dir)


def test_doctor_refuses_a_host_name_that_ssh_would_read_as_an_option(tmp_path, sshd):
    """`ddptop doctor --host=-oProxyCommand=...`: a failed row naming the host,
    and ssh never runs it (the file the ProxyCommand would create is not there)."""
    marker = tmp_path / "proxy-ran"
    r = subprocess.run(ddptop_cmd("doctor", "--json", f"--host=-oProxyCommand=touch {marker}", "--host", "node-a",
                                  "--ssh", " ".join(sshd.ssh), "--remote-ddptop", remote_ddptop(tmp_path)),
                       capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
    d = json.loads(r.stdout)
    bad = d["hosts"][f"-oProxyCommand=touch {marker}"]["rows"]
    assert bad[0]["status"] == "fail" and "begins with '-': refused" in bad[0]["summary"]
    assert not marker.exists()
    assert any(row["name"] == "GPUs" for row in d["hosts"]["node-a"]["rows"])  # the good host is still checked
    assert r.returncode == 2
