"""`ddptop attach --pid`: real torchrun jobs that ddptop did not launch.

Every job here is a plain `python -m torch.distributed.run` started by the
test in its own session; the test kills it (torchrun's group and each rank's:
torchrun starts every rank in a session of its own) in a finally/teardown and
checks that nothing it started is left.

(The pure parts: tests/unit/test_attach_pid.py; the UI: tests/ui/test_app_attach_pid.py.)"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers import per_line
from conftest import EXAMPLE, ROOT, TIMEOUT, alive, ddptop_cmd, json_events, wait_for
from foreign_jobs import Procs, procs, start_lone_rank  # noqa: F401  (procs: a fixture)
from ddptop.core.model.events import ENDED, FINAL_STATES
from ddptop.core.model.session_protocol import EXIT_UNKNOWN
from ddptop.core.sessions.pid import ForeignSession
from ddptop.core.sessions.pid_target import ForeignError, resolve_pid


# -- helpers ------------------------------------------------------------------------


def start_job(procs: Procs, tmp_path: Path, *script_args, log_dir: bool = True, stdout=None, torchrun=()):
    """torchrun --standalone --nproc-per-node 2 [--log-dir D --redirects 3] [TORCHRUN] train_ddp.py ARGS."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *torchrun]
    if log_dir:
        argv += ["--log-dir", str(tmp_path / "logs"), "--redirects", "3"]
    argv += [EXAMPLE, *script_args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if "--virtual-local-rank" in torchrun:  # (one entry of it per worker; "-1" is no device, as every test's job has)
        env["CUDA_VISIBLE_DEVICES"] = "-1,-1"
    env.pop("DDPTOP_BEAT_DIR", None)
    if stdout is None:
        out = open(tmp_path / "torchrun.out", "wb")
        p = procs.popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
    else:
        p = procs.popen(argv, env=env, stdout=stdout, stderr=subprocess.STDOUT)
    return p


def wait_ranks(procs: Procs, job: subprocess.Popen, n: int = 2) -> dict[int, int]:
    """{rank: pid} of the job's workers, once all n have started."""

    def ranks():
        out = {}
        try:
            for c in psutil.Process(job.pid).children():
                env = c.environ()
                if "RANK" in env:
                    out[int(env["RANK"])] = c.pid
        except psutil.Error:
            return None
        return out if len(out) == n else None

    found = wait_for(ranks, timeout=TIMEOUT, what="the ranks to start")
    procs.pids.update(found.values())
    return found


class Reader:
    """Collect a subprocess's stdout lines in a thread (never blocks the test)."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._t = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._t.start()

    def _run(self, stream):
        for raw in stream:
            self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def events(self) -> list[dict]:
        out = []
        for l in list(self.lines):
            try:
                out.append(json.loads(l))
            except ValueError:
                pass
        return out

    def join(self, timeout=30):
        self._t.join(timeout)


def finish(p: subprocess.Popen, timeout=TIMEOUT) -> tuple[str, str]:
    out, err = p.communicate(timeout=timeout)
    return out.decode(), err.decode()


def attach(procs, *args, env=None):
    return procs.popen(ddptop_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=env or dict(os.environ))


def file_has(path_glob: Path, pattern: str, text: str) -> bool:
    return any(text in p.read_text(errors="replace") for p in path_glob.glob(pattern))


# -- a one-rank job (no torch): the session object and the UI -----------------------


def test_a_lone_rank_is_a_one_rank_job(procs, tmp_path):
    p, out = start_lone_rank(procs, tmp_path)
    s = ForeignSession(p.pid, gpu="sim")
    try:
        assert s.target.torchrun is None and s.meta.run_id == f"pid-{p.pid}"
        assert s.location.attach_hint == f"ddptop attach --pid {p.pid}" and s.location.pid == p.pid
        evs = []
        wait_for(lambda: evs.extend(s.poll()) or any(e.kind == "proc" for e in evs), timeout=30, what="telemetry")
        logs = [e for e in per_line(evs) if e.kind == "log"]
        assert logs and all(e.rank == 3 for e in logs)
        # the history is the last 64 KiB, from a line start
        assert logs[0].text.startswith("old line ") and int(logs[0].text.split()[-1]) > 4000
        notes = [e.message for e in evs if e.kind == "note"]
        assert any(f"rank 3 stdout goes to {out}" in n and "last 64 KiB" in n for n in notes), notes
        ranks = [e for e in evs if e.kind == "rank"]
        assert [(e.rank, e.pid, e.alive) for e in ranks] == [(3, p.pid, True)]
        # stop and relaunch are refused, and say why
        stop, relaunch = s.stop(), s.relaunch(["p2p-off"])
        assert not stop and not relaunch and stop.refused and relaunch.refused
        assert alive(p.pid)
        assert "will not stop" in stop.message and f"kill -INT {p.pid}" in stop.message, stop
        c = s.control()
        assert not c.stop and not c.relaunch and c.stacks and f"kill -INT {p.pid}" in c.refused
        p.kill()
        p.wait(timeout=10)
        evs = []
        wait_for(lambda: evs.extend(s.poll()) or s.finished, timeout=30, what="the end")
        assert [(e.rank, e.alive, e.exit_code) for e in evs if e.kind == "rank"] == [(3, False, None)]
        final = evs[-1]
        assert final.kind == "state" and final.state == ENDED and final.state in FINAL_STATES
        assert final.exit_code is None and "exit code unknown" in final.message
        st = s.exit_status()
        assert st.code is None and st.exit_with == EXIT_UNKNOWN and "did not start" in st.reason
        assert not s.is_live
    finally:
        s.close()


# -- real torchrun jobs ---------------------------------------------------------------


@pytest.mark.own_pids  # (attach with no target: the only torchrun not launched by ddptop)
def test_attach_by_pid_follows_the_job_to_its_end(procs, tmp_path):
    """The job runs with torchrun --virtual-local-rank, which gives every worker LOCAL_RANK=0 (each sees its GPU
    as device 0): each rank's log is still its own (torchrun's attempt_0/<local rank>/ directories), the local
    rank taken from RANK, GROUP_RANK and LOCAL_WORLD_SIZE."""
    job = start_job(procs, tmp_path, "--steps", "40", "--step-time", "0.1", torchrun=("--virtual-local-rank",))
    ranks = wait_ranks(procs, job)
    assert {psutil.Process(p).environ()["LOCAL_RANK"] for p in ranks.values()} == {"0"}  # (as torchrun sets it)
    env = dict(os.environ, DDPTOP_RUNS_DIR=str(tmp_path / "no-runs"))
    # (a) by torchrun's pid, (b) by a rank's pid, and with no target at all
    by_torchrun = attach(procs, "--headless", "--gpu", "sim", "attach", "--pid", str(job.pid), env=env)
    by_rank = attach(procs, "--json", "--gpu", "sim", "attach", "--pid", str(ranks[1]), env=env)
    by_default = attach(procs, "--headless", "--gpu", "none", "attach", env=env)
    assert job.wait(timeout=TIMEOUT) == 0
    t_end = time.monotonic()
    out, err = finish(by_torchrun)
    j_out, j_err = finish(by_rank)
    d_out, d_err = finish(by_default)
    assert time.monotonic() - t_end < 20, "the attachments outlived the job"
    # (a) every line of both ranks, with the right rank numbers, and the end
    assert by_torchrun.returncode == EXIT_UNKNOWN, (out[-2000:], err)
    assert "[r0] rank 0/2 up on cpu" in out and "[r1] rank 1/2 up on cpu" in out
    for r in (0, 1):
        assert f"[r{r}] step 1 loss" in out and f"[r{r}] step 40 loss" in out
        assert f"== ddptop: rank {r} (local {r}, pid {ranks[r]}, attempt 0) started ==" in out
        assert f"== ddptop: rank {r} (local {r}, pid {ranks[r]}, attempt 0) ended ==" in out
    assert "[r0] training done" in out
    assert f"attached to torchrun pid {job.pid}" in out
    assert out.rstrip().splitlines()[-1] == "== ddptop: job ended (exit code unknown: ddptop did not start this job) =="
    # (b) the same job, found from rank 1's pid
    assert by_rank.returncode == EXIT_UNKNOWN, (j_out[-2000:], j_err)
    evs = json_events(j_out)
    assert evs[0]["kind"] == "state" and f"torchrun pid {job.pid}" in evs[0]["message"]
    assert {(e["rank"], e["pid"]) for e in evs if e["kind"] == "rank" and e["alive"]} == {(0, ranks[0]), (1, ranks[1])}
    assert {(e["rank"], e["local_rank"]) for e in evs if e["kind"] == "rank" and e["alive"]} == {(0, 0), (1, 1)}
    logs = [e for e in evs if e["kind"] == "log" and e["rank"] is not None]
    for r in (0, 1):  # each rank's lines its own
        mine = [e["text"] for e in logs if e["rank"] == r]
        assert any(t.startswith(f"rank {r}/2 up") for t in mine) and not any(t.startswith(f"rank {1 - r}/2 up") for t in mine)
    assert {e["rank"] for e in logs if e["text"].startswith("step 40 ")} == {0, 1}
    assert any(e["kind"] == "proc" for e in evs) and any(e["kind"] == "gpu" and e["simulated"] for e in evs)
    assert evs[-1]["kind"] == "state" and evs[-1]["state"] == "ended" and evs[-1]["exit_code"] is None
    # no target: the only torchrun not launched by ddptop, unless others run on this machine
    if by_default.returncode == 2:
        assert "pick one with `ddptop attach --pid PID`" in d_err and f" {job.pid} " in d_err, d_err
    else:
        assert f"ddptop: attaching to torchrun pid {job.pid} (not launched by ddptop)" in d_err, d_err
        assert by_default.returncode == EXIT_UNKNOWN and "[r1] step 40 loss" in d_out


def test_output_to_a_pipe_is_named_with_the_remedy_and_ctrl_c_only_detaches(procs, tmp_path):
    job = start_job(procs, tmp_path, "--steps", "100000", "--step-time", "0.2", log_dir=False, stdout=subprocess.PIPE)
    job_out = Reader(job.stdout)  # keep the pipe drained
    ranks = wait_ranks(procs, job)
    pipe = os.readlink(f"/proc/{ranks[1]}/fd/1")
    assert pipe.startswith("pipe:[")
    att = attach(procs, "--json", "--gpu", "none", "attach", "--pid", str(job.pid))
    r = Reader(att.stdout)

    def warning_for(who):
        return next((e["message"] for e in r.events() if e["kind"] == "note" and e["message"].startswith(who)), None)

    msg = wait_for(lambda: warning_for("rank 1 stdout"), timeout=60, what="the warning about rank 1's stdout")
    assert msg == (f"rank 1 stdout is a pipe ({pipe}): ddptop cannot read it. Relaunch under ddptop, or give torchrun "
                   f"--log-dir DIR --redirects 3 (or --tee 3)")
    assert warning_for("rank 0 stderr") and warning_for("torchrun stdout").startswith(f"torchrun stdout is a pipe ({pipe})")
    # nothing readable from the ranks: their stacks, sampled in turn, are what shows them alive
    def moved(rank):
        return max((e["step"] for e in r.events() if e["kind"] == "progress" and e["source"] == "stack"
                    and e["rank"] == rank), default=0)

    wait_for(lambda: moved(0) >= 2 and moved(1) >= 2, timeout=60, what="both ranks' stacks seen moving")
    # the warnings came once per rank and stream
    notes = [e["message"] for e in r.events() if e["kind"] == "note"]
    assert sum(n.startswith("rank 1 stdout") for n in notes) == 1
    assert any(n.startswith("no rank's own output can be read") for n in notes), notes
    # Ctrl-C detaches, and never touches the job
    att.send_signal(signal.SIGINT)
    assert att.wait(timeout=30) == 130
    r.join()
    err = att.stderr.read().decode()
    assert "will not stop" in err and "the job keeps running" in err
    # the attachment has exited: the job trains on after it (new steps), not just "is not dead yet"
    seen = len(job_out.lines)
    wait_for(lambda: any("step " in l for l in job_out.lines[seen:]), timeout=60,
             what="the job to go on training after the detach")
    assert job.poll() is None and alive(ranks[0]) and alive(ranks[1])


def test_output_shared_with_torchrun_in_one_file_is_read_as_torchrun_output(procs, tmp_path):
    # `torchrun ... > torchrun.out 2>&1` with no --log-dir: every rank writes into torchrun's file
    job = start_job(procs, tmp_path, "--steps", "100000", "--step-time", "0.1", log_dir=False)
    ranks = wait_ranks(procs, job)
    out_file = tmp_path / "torchrun.out"
    wait_for(lambda: "step 2 " in out_file.read_text(errors="replace"), timeout=TIMEOUT, what="training steps")
    att = attach(procs, "--json", "--gpu", "none", "attach", "--pid", str(ranks[0]))
    r = Reader(att.stdout)
    try:
        wait_for(lambda: any(e["kind"] == "log" and e["text"].startswith("step ") and int(e["text"].split()[1]) > 5
                             for e in r.events()), timeout=60, what="new steps")
        evs = r.events()
        notes = [e["message"] for e in evs if e["kind"] == "note"]
        assert any(n.startswith(f"torchrun stdout goes to {out_file}: reading it from its start") for n in notes), notes
        mixed = [n for n in notes if n.startswith(f"torchrun and its ranks write to the same file {out_file}: "
                                                  f"its lines are shown as torchrun's output")]
        assert len(mixed) == 1 and mixed[0].endswith("--log-dir DIR --redirects 3 (or --tee 3)"), notes
        assert any(n.startswith("no rank's own output can be read") for n in notes), notes
        steps = [e for e in evs if e["kind"] == "log" and e["text"].startswith("step ")]
        assert steps and all(e["rank"] is None and e["stream"] == "torchrun" for e in steps)
    finally:
        att.send_signal(signal.SIGINT)
        assert att.wait(timeout=30) == 130
        r.join(5)
    assert job.poll() is None


def test_a_hang_raises_a_stall_alarm_and_stopping_the_attachment_leaves_the_job(procs, tmp_path):
    job = start_job(procs, tmp_path, "--steps", "100000", "--step-time", "0.1", "--fault", "hang",
                    "--fault-step", "25")
    ranks = wait_ranks(procs, job)
    # attach once training runs (so the stall is the hang, not the start-up)
    wait_for(lambda: file_has(tmp_path / "logs", "*/attempt_0/0/stdout.log", "step 3 "), timeout=TIMEOUT,
             what="training steps")
    att = attach(procs, "--json", "--gpu", "sim", "--stall-after", "4", "attach", "--pid", str(job.pid),
                 env=dict(os.environ, DDPTOP_RUNS_DIR=str(tmp_path / "runs")))
    r = Reader(att.stdout)
    try:
        alarm = wait_for(lambda: next((e for e in r.events() if e["kind"] == "alarm" and e["type"] == "stall"), None),
                         timeout=TIMEOUT, what="the stall alarm")
        assert alarm["culprits"] == [1], alarm
        # two ranks on this node: turning off peer-to-peer between its GPUs may change something (torchrun's
        # command line says the shape)
        assert "p2p-off" in alarm["suggested_profiles"], alarm
        assert any(e["kind"] == "log" and e["rank"] == 1 and "hangs now" in e["text"] for e in r.events())
        # every rank's stack, read without stopping the ranks, kept under the runs directory
        note = wait_for(lambda: next((e for e in r.events() if e["kind"] == "note"
                                      and e["message"].startswith("stacks captured in ")), None),
                        timeout=TIMEOUT, what="the stacks captured at the stall")
        where = Path(note["message"][len("stacks captured in "):].split(": ")[0])
        assert where.is_relative_to(tmp_path / "runs") and sorted(p.name for p in where.iterdir()) == ["rank0.txt", "rank1.txt"]
        assert note["message"].endswith("2 different stacks: rank 0; rank 1"), note  # the hung rank's is not the other's
        # (e) asking the attachment to stop does not stop the job
        att.send_signal(signal.SIGINT)
        assert att.wait(timeout=30) == 130
        # (the job is hung: no new output to wait for.  The attachment has exited, so it
        # can do nothing more; the pause gives a signal it might have sent time to act)
        time.sleep(2)
        assert job.poll() is None and all(alive(pid) for pid in ranks.values())
        assert all(psutil.Process(pid).ppid() == job.pid for pid in ranks.values())
    finally:
        r.join(5)
    # the test stops the job itself, by process group: nothing is left (checked by the fixture too)
    procs.remember_tree(job)
    left = procs.kill_all()
    assert not left


def test_a_lightning_hang_in_a_job_ddptop_did_not_launch_is_named_from_its_stacks(procs, tmp_path):
    """No hook (plain torchrun) and no progress in the logs (Lightning's bar prints
    nothing into a file): the ranks' stacks, sampled in turn, are the life signal.
    The hang is alarmed long before the 120 s first-step grace, naming rank 1 and
    its line."""
    script = ROOT / "examples" / "frameworks" / "lightning_job.py"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            "--log-dir", str(tmp_path / "logs"), "--redirects", "3", str(script),
            "--steps", "100000", "--hang-rank", "1", "--hang-at-batch", "40"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("DDPTOP_BEAT_DIR", None)
    with open(tmp_path / "torchrun.out", "wb") as out:
        job = procs.popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    ranks = wait_ranks(procs, job)
    wait_for(lambda: file_has(tmp_path / "logs", "*/attempt_0/1/stdout.log", "hanging"), timeout=TIMEOUT,
             what="rank 1 to hang")
    attached = time.time()
    att = attach(procs, "--json", "--gpu", "sim", "attach", "--pid", str(job.pid),
                 env=dict(os.environ, DDPTOP_RUNS_DIR=str(tmp_path / "runs")))
    r = Reader(att.stdout)
    try:
        alarm = wait_for(lambda: next((e for e in r.events() if e["kind"] == "alarm" and e["type"] == "stall"), None),
                         timeout=TIMEOUT, what="the stall alarm")
        print(f"\nattach --pid, no hook: stall alarm {alarm['t'] - attached:.1f} s after attaching")
        assert alarm["t"] - attached < 120, "no earlier than the first-step grace: the stacks gave no life signal"
        assert alarm["culprits"] == [1], alarm["message"]
        w = alarm["where"]["1"]
        assert w["function"].endswith("on_train_batch_start") and Path(w["file"]).name == script.name, w
        assert "time.sleep" in script.read_text().splitlines()[w["line"] - 1]
        watched = [e for e in r.events() if e["kind"] == "progress" and e["source"] == "stack"]
        assert {e["rank"] for e in watched} == {0, 1}
        att.send_signal(signal.SIGINT)
        assert att.wait(timeout=30) == 130
        assert job.poll() is None and all(alive(pid) for pid in ranks.values())  # the job was left alone
    finally:
        r.join(5)
    procs.remember_tree(job)
    assert not procs.kill_all()


def test_a_crash_seen_in_the_output_gives_exit_code_1(procs, tmp_path):
    job = start_job(procs, tmp_path, "--steps", "100000", "--step-time", "0.1", "--fault", "segv",
                    "--fault-step", "15")
    ranks = wait_ranks(procs, job)
    att = attach(procs, "--headless", "--gpu", "none", "attach", "--pid", str(ranks[0]))
    assert job.wait(timeout=TIMEOUT) != 0
    out, err = finish(att)
    assert att.returncode == 1, (out[-3000:], err)
    assert "[r1] rank 1 segfaults now (injected fault)" in out
    assert "!! ddptop ALARM [crash/rank-signal] rank-signal (rank 1)" in out  # from torchrun's failure report
    assert out.rstrip().endswith("== ddptop: job ended (exit code unknown: ddptop did not start this job) ==")


def test_pid_that_is_not_a_torchrun_job_is_a_clear_error(procs, tmp_path):
    sleeper = procs.popen(["sleep", "300"])
    r = subprocess.run(ddptop_cmd("--headless", "attach", "--pid", str(sleeper.pid)), capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 2
    assert f"--pid {sleeper.pid}: pid {sleeper.pid} (sleep 300) is neither a torchrun process nor a rank of one" in r.stderr
    dead = procs.popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    r = subprocess.run(ddptop_cmd("--headless", "attach", "--pid", str(dead.pid)), capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 2 and f"no process with pid {dead.pid}" in r.stderr, r.stderr
    from conftest import write_run

    run = write_run(tmp_path / "runs", events=[], logs={})
    r = subprocess.run(ddptop_cmd("attach", "--pid", str(sleeper.pid), str(run)), capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "--pid cannot be combined with a RUN" in r.stderr, r.stderr
    r = subprocess.run(ddptop_cmd("attach", "--pid", str(sleeper.pid), "node-a", "node-b"), capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "--pid takes one HOST at most" in r.stderr, r.stderr
    with pytest.raises(ForeignError, match="neither a torchrun process"):
        resolve_pid(sleeper.pid)


# -- over ssh ---------------------------------------------------------------------------


SSH_STEPS = 500  # the job's steps (2 ranks: 2 x SSH_STEPS step lines)


def step_lines(log_dir: Path) -> int:
    """How many step lines the job's ranks have written to their torchrun log files so far."""
    return sum(1 for f in log_dir.glob("*/attempt_0/*/stdout.log")
               for line in f.read_text(errors="replace").splitlines() if line.startswith("step "))


def resumed(evs, after: int) -> bool:
    """A link made after the first ``after`` connections is up and has brought lines."""
    ups = [i for i, e in enumerate(evs) if e.kind == "link" and e.state == "up" and e.connects > after]
    return bool(ups) and any(e.kind == "log" and not e.transient for e in per_line(evs[ups[0] + 1:]))


def test_attach_over_ssh_to_a_job_ddptop_did_not_launch(procs, tmp_path, sshd):
    """`ddptop attach HOST --pid PID`: the agent watches the job from outside on
    its node; links cut again and again lose and repeat no line."""
    from sshd import remote_ddptop

    from ddptop.core.sessions.ssh import RemoteSession

    job = start_job(procs, tmp_path, "--steps", str(SSH_STEPS), "--step-time", "0.004")
    wait_ranks(procs, job)
    remote = remote_ddptop(tmp_path / "runs")
    # a person watching with the CLI...
    w = attach(procs, "--json", "--gpu", "sim", "attach", "node-a", "--pid", str(job.pid),
               "--ssh", " ".join(sshd.ssh), "--remote-ddptop", remote, env=dict(os.environ))
    r = Reader(w.stdout)
    # ...and a client whose link is cut again and again while the job runs
    rs = RemoteSession("node-a", run=f"pid:{job.pid}", ssh=sshd.ssh, remote_cmd=remote, backoff=(0.2,), gpu="sim")
    # a job ddptop did not start is never stopped or relaunched through the link either
    stop, relaunch = rs.stop(), rs.relaunch(["p2p-off"])
    assert not stop and stop.refused and not relaunch and relaunch.refused
    assert "did not start this job" in rs.control().refused and "did not start this job" in stop.message
    evs, drops, after = [], 0, 0  # drops: the links cut (the CLI's too); after: rs's connections before the last cut
    written_at_drops: list[int] = []  # the job's step lines in its log files at each cut (at most 5 cuts)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not rs.finished and time.monotonic() < deadline:
            time.sleep(0.2)
            evs += rs.poll()
            # a cut once a new link is up and has brought lines, and only while more than 40 % of the job's
            # lines are still to be written: the job writes on after the last cut (and never near the end: a job
            # ddptop did not launch leaves no journal to reconnect to once it is gone)
            if len(written_at_drops) < 5 and rs.link == "up" and job.poll() is None and resumed(evs, after):
                written = step_lines(tmp_path / "logs")
                if written < 0.6 * 2 * SSH_STEPS:
                    after = rs.connects
                    n = sshd.drop_links()
                    drops += n
                    if n:
                        written_at_drops.append(written)
        assert rs.finished, "the attachment did not see the job end"
    finally:
        rs.close()
    assert job.wait(timeout=TIMEOUT) == 0
    assert w.wait(timeout=TIMEOUT) == 3  # ended; its exit status cannot be known from outside
    r.join()
    assert drops >= 3 and rs.connects >= 3, (drops, rs.connects)
    # (each cut with 40 % of the job's lines still to write; a link made after the last one brought them)
    assert written_at_drops and resumed(evs, after), written_at_drops
    assert rs.error is None
    # every line of every rank log, exactly once and in order
    got: dict[str, list] = {}
    for e in per_line(evs):
        if e.kind == "log" and e.rank is not None and not e.transient:
            got.setdefault(e.path, []).append(e.text)
    files = sorted((tmp_path / "logs").glob("*/attempt_0/*/stdout.log"))
    assert len(files) == 2
    for f in files:
        want = f.read_text().splitlines()
        key = next(p for p in got if os.path.samefile(p, f))
        assert got[key] == want, f"{f}: {len(got[key])} lines received, {len(want)} in the file"
    assert sum(1 for lines in got.values() for t in lines if t.startswith("step ")) == 2 * SSH_STEPS
    assert any(e.kind == "gpu" and e.simulated for e in evs)
    assert evs[-1].kind == "state" and evs[-1].state == ENDED and evs[-1].exit_code is None
    # the CLI saw the same job, named by pid, to its end
    ev = r.events()
    assert any(e["kind"] == "link" and e["state"] == "up" for e in ev)
    assert sum(1 for e in ev if e["kind"] == "log" and e["text"].startswith("step ")) == 2 * SSH_STEPS
    assert ev[-1]["kind"] == "state" and ev[-1]["state"] == ENDED


def test_a_job_ddptop_did_not_launch_is_named_from_nccl_ras(procs, tmp_path, monkeypatch):
    """attach --pid to a plain torchrun job whose ranks have NCCL_RAS_ADDR (the
    user's own setting) pointing at the RAS stand-in: the port is read from a
    rank's environment, the answer (built from the real ranks' pids and steps,
    the held-back rank chosen at random) is used because it names this job's
    processes, and the alarm names the held rank with stack sampling off."""
    import random

    from ras_server import Job, Rank, RasServer

    held = random.randrange(2)
    ranks: dict[int, int] = {}

    def steps(r: int) -> int:
        logs = list((tmp_path / "logs").glob(f"*/attempt_0/{r}/stdout.log"))
        lines = [l for l in logs[0].read_text(errors="replace").splitlines() if l.startswith("step ")] if logs else []
        return int(lines[-1].split()[1]) if lines else 0

    srv = RasServer(lambda: Job([Rank(r, pid, "127.0.0.1", gpu=r, counts={"AllReduce": steps(r) + (r != held)})
                                 for r, pid in sorted(ranks.items())]))
    try:
        monkeypatch.setenv("NCCL_RAS_ADDR", srv.addr)
        job = start_job(procs, tmp_path, "--steps", "100000", "--step-time", "0.1", "--fault", "hang",
                        "--fault-rank", str(held), "--fault-step", "25")
        monkeypatch.delenv("NCCL_RAS_ADDR")  # (ddptop finds it in the ranks, not in its own environment)
        ranks.update(wait_ranks(procs, job))
        wait_for(lambda: file_has(tmp_path / "logs", "*/attempt_0/0/stdout.log", "step 3 "), timeout=TIMEOUT,
                 what="training steps")
        att = attach(procs, "--json", "--gpu", "none", "--stall-after", "4", "attach", "--pid", str(job.pid),
                     env=dict(os.environ, DDPTOP_RUNS_DIR=str(tmp_path / "runs"), DDPTOP_PY_SPY=""))
        r = Reader(att.stdout)
        try:
            alarm = wait_for(lambda: next((e for e in r.events() if e["kind"] == "alarm" and e["type"] == "stall"),
                                          None), timeout=TIMEOUT, what="the stall alarm")
            assert alarm["culprits"] == [held] and "(NCCL RAS)" in alarm["message"], alarm["message"]
            said = [e for e in r.events() if e["kind"] == "ras"]
            assert said and said[0]["ok"] and said[0]["addr"] == srv.addr
            assert Path(said[0]["file"]).is_relative_to(tmp_path / "runs")
            att.send_signal(signal.SIGINT)
            assert att.wait(timeout=30) == 130
        finally:
            r.join(5)
    finally:
        srv.close()
    procs.remember_tree(job)
    assert not procs.kill_all()
