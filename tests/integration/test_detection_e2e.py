"""Real torchrun, 2 ranks on CPU: the example's injected faults are recognised."""

import json
import os

import pytest

from conftest import EXAMPLE, diagnose_agrees, json_events, only_run, run_ddptop


@pytest.fixture(autouse=True)
def least_silence(monkeypatch):
    """The least silence that is a hang: 5 s here (DDPTOP_MIN_SILENCE, 10 s by default), for ddptop and
    the `ddptop diagnose` that replays its runs; the pauses of the healthy jobs below are scaled with it."""
    monkeypatch.setenv("DDPTOP_MIN_SILENCE", "5")


def alarms(events):
    return [e for e in events if e["kind"] == "alarm"]


def test_spinning_hang_raises_stall_naming_the_hung_rank_captures_every_stack_and_notifies_then_exits_124(
        runs_dir, tmp_path):
    """One hung job answers all of it: the alarm, every rank's stack captured before the stop, the notify
    command given the alarm, the exit code, and the post-mortem."""
    import shutil
    import sys
    got = tmp_path / "alarm.json"
    notify = f"{sys.executable} -c \"import sys; open({str(got)!r}, 'w').write(sys.stdin.read())\""
    r = run_ddptop("--json", "--gpu", "sim", "--on-stall", "kill", "--notify-cmd", notify, "torchrun",
                   "--nproc-per-node", "2", EXAMPLE,
                   "--steps", "100000", "--step-time", "0.05", "--fault", "hang", "--fault-rank", "1", "--fault-step", "20")
    assert r.returncode == 124, r.stderr[-2000:]
    events = json_events(r.stdout)
    stalls = [a for a in alarms(events) if a["type"] == "stall"]
    assert len(stalls) == 1
    a = stalls[0]
    assert a["culprits"] == [1] and a["id"] == "stall-hot"
    assert "rank 1" in a["message"] and "p2p-off" in a["suggested_profiles"]
    assert events[-1]["state"] == "stopped" and events[-1]["exit_code"] == 124
    # rank 1 hung in step 20; rank 0 waits for it in that step's all-reduce
    assert any(e["kind"] == "log" and e["rank"] == 1 and "hangs now" in e["text"] for e in events)
    steps = {r_: max(int(e["text"].split()[1]) for e in events if e["kind"] == "log" and e["rank"] == r_ and e["text"].startswith("step "))
             for r_ in (0, 1)}
    assert steps == {0: 19, 1: 19}
    # the notify command got the alarm on its stdin
    alarm = json.loads(got.read_text())
    assert alarm["kind"] == "alarm" and alarm["type"] == "stall" and alarm["culprits"] == [1]
    # the post-mortem of this run starts from the hang ddptop saw, and names the same rank and line
    diagnose_agrees(only_run(runs_dir), a)
    notes = [e["message"] for e in events if e["kind"] == "note"]
    if shutil.which("py-spy") is None:
        assert any("py-spy is not installed" in n for n in notes), notes
        return
    captured = [n for n in notes if n.startswith("stacks captured")]
    if not captured:  # ptrace may be denied in some sandboxes: then the note says so
        assert any("ptrace" in n or "stack capture" in n for n in notes), notes
        return
    assert "2 different stacks" in captured[0], captured  # the hung rank's stack is not the spinning one's
    # read before the job was stopped: no rank had gone away under py-spy
    assert notes.index(captured[0]) < next(i for i, n in enumerate(notes) if "stopping the job" in n), notes
    assert not [n for n in notes if n.startswith("stack capture")], notes
    (stack1,) = only_run(runs_dir).glob("stacks/*/rank1.txt")
    (stack0,) = only_run(runs_dir).glob("stacks/*/rank0.txt")
    hang_line = 1 + next(i for i, l in enumerate(open(EXAMPLE)) if "time.sleep(3600)" in l)
    assert f"train_ddp.py:{hang_line})" in stack1.read_text()  # rank 1 sits in the injected hang
    assert f"train_ddp.py:{hang_line})" not in stack0.read_text()  # rank 0 is elsewhere (the spin)


def test_without_gpu_telemetry_ranks_spinning_for_a_hung_rank_make_a_collective_hang(runs_dir):
    """--gpu none (a CPU job, or no driver): rank 0 spins a core polling its all-reduce while rank 1
    sleeps; that is a hang in a collective with rank 1 the culprit, not a CPU-bound data-loading stall.
    The job runs with NCCL_P2P_DISABLE=1 already (set by the person, not by a profile): the alarm does
    not suggest p2p-off, which it would otherwise.  And without ddptop's hook (--no-inject), as for a
    job whose steps ddptop learns from its log lines alone: the post-mortem replays those lines at the
    times the live analysis read them (the journal's marks), and tells the same hang."""
    r = run_ddptop("--json", "--gpu", "none", "--no-inject", "--on-stall", "kill", "torchrun", "--nproc-per-node", "2", EXAMPLE,
                   "--steps", "100000", "--step-time", "0.05", "--fault", "hang", "--fault-rank", "1", "--fault-step", "15",
                   env={**os.environ, "NCCL_P2P_DISABLE": "1"})
    assert r.returncode == 124, r.stderr[-2000:]
    stalls = [a for a in alarms(json_events(r.stdout)) if a["type"] == "stall"]
    assert len(stalls) == 1
    a = stalls[0]
    assert a["id"] == "stall-collective" and a["culprits"] == [1], a
    assert "fewer-workers" not in a["suggested_profiles"] and "train_ddp.py" in a["message"]
    assert "p2p-off" not in a["suggested_profiles"] and "flight-recorder" in a["suggested_profiles"], a
    # --no-inject: no hook in the ranks (nothing put on their PYTHONPATH), so no step from it: steps from the logs
    assert not [e for e in json_events(r.stdout) if e["kind"] == "progress"]
    meta = json.loads((only_run(runs_dir) / "meta.json").read_text())
    assert "_inject" not in meta["env_set"].get("PYTHONPATH", ""), meta["env_set"]
    diagnose_agrees(only_run(runs_dir), a)


LONE_EVAL = """\
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
t = torch.ones(1)
def evaluate(seconds):  # rank 0 alone, computing (its stack and variables move)
    end, acc = time.time() + seconds, 0.0
    while time.time() < end:
        acc += float(torch.randn(64, 64).sum())
    return acc
for step in range(1, 81):
    dist.all_reduce(t)
    time.sleep(0.05)
    print(f"step {step} loss {1 / step:.3f}", flush=True)
    if step % 40 == 0:
        if r == 0:
            print(f"eval at step {step}: {evaluate(9):.1f}", flush=True)
        dist.barrier()  # rank 1 waits here for rank 0's evaluation
print("done", flush=True)
"""


def test_a_rank_evaluating_alone_while_the_others_wait_in_a_barrier_is_no_hang(runs_dir, tmp_path):
    """Rank 0 evaluates for 9 s (twice) while rank 1 waits in a barrier: the others wait for a rank
    whose stack moves, which is work, not a hang (with a learned threshold of ~5 s here)."""
    script = tmp_path / "lone_eval.py"
    script.write_text(LONE_EVAL)
    r = run_ddptop("--json", "--gpu", "sim", "torchrun", "--nproc-per-node", "2", str(script))
    assert r.returncode == 0, r.stderr[-2000:]
    events = json_events(r.stdout)
    assert sum(1 for e in events if e["kind"] == "log" and e["text"].startswith("eval at step")) == 2
    assert [a for a in alarms(events) if a["type"] == "stall"] == []
    # it was looked at: stack samples said rank 0 works while rank 1 waits
    looks = [e for e in events if e["kind"] == "stacks" and e.get("workers")]
    assert looks and all(e["workers"] == [0] and e["hung"] is False and e["culprits"] == [] for e in looks), looks


def test_segfault_is_named_with_signal_and_rank(runs_dir):
    r = run_ddptop("--json", "torchrun", "--nproc-per-node", "2", EXAMPLE, "--steps", "50", "--step-time", "0",
                   "--fault", "segv", "--fault-rank", "1", "--fault-step", "3")
    assert r.returncode == 1
    crash = [a for a in alarms(json_events(r.stdout)) if a["id"] == "rank-signal" and a["culprits"]]
    assert len(crash) == 1 and crash[0]["type"] == "crash"
    assert crash[0]["culprits"] == [1] and "SIGSEGV" in crash[0]["message"]
    # each rank's exit code, from torchrun's failure summary (ddptop cannot wait() for torchrun's children)
    codes = {e["rank"]: e["exit_code"] for e in json_events(r.stdout) if e["kind"] == "rank" and e["exit_code"] is not None}
    assert codes.get(1) == -11, codes
    # and post-mortem, from the journal
    d = run_ddptop("diagnose", "--json", str(only_run(runs_dir)))
    rep = json.loads(d.stdout)
    assert rep["root_cause"]["signature"] == "rank-signal" and rep["root_cause"]["rank"] == 1
    assert "SIGSEGV" in rep["root_cause"]["explanation"]
    assert rep["progress"]["0"]["last_step"] == 2 and rep["progress"]["1"]["last_step"] == 2


def test_parameter_mismatch_is_recognised(runs_dir):
    r = run_ddptop("--json", "torchrun", "--nproc-per-node", "2", EXAMPLE, "--steps", "5", "--fault", "mismatch", "--fault-rank", "1")
    assert r.returncode == 1
    ids = {(a["id"], tuple(a["ranks"])) for a in alarms(json_events(r.stdout))}
    assert ("ddp-param-mismatch", (1,)) in ids
    rep = json.loads(run_ddptop("diagnose", "--json", str(only_run(runs_dir))).stdout)
    assert rep["root_cause"]["signature"] == "ddp-param-mismatch" and rep["root_cause"]["rank"] == 1


def test_healthy_run_with_slow_first_step_and_eval_pause_raises_no_alarm(runs_dir, monkeypatch):
    monkeypatch.setenv("DDPTOP_MIN_SILENCE", "5")  # (half the default, the least a person should set: its pauses
    # are 1.5 times it, as 15 s pauses are to the default)
    r = run_ddptop("--json", "--gpu", "sim", "torchrun", "--nproc-per-node", "2", EXAMPLE, "--steps", "70", "--step-time", "0.05",
                   "--first-step-time", "7.5", "--eval-every", "60", "--eval-time", "7.5")
    assert r.returncode == 0, r.stderr[-2000:]
    events = json_events(r.stdout)
    assert alarms(events) == []
    assert any(e["kind"] == "log" and "Evaluating" in e["text"] for e in events)
    assert events[-1]["state"] == "succeeded"
    # torchrun exits 0 only when every rank did
    assert {e["rank"]: e["exit_code"] for e in events if e["kind"] == "rank" and not e["alive"]
            and e["exit_code"] is not None} == {0: 0, 1: 0}


def test_a_parameter_without_gradient_is_named_with_the_ddp_fix(runs_dir):
    """DDP without find_unused_parameters, and a head that stops taking part
    in the loss at step 3: every rank fails at the next step."""
    r = run_ddptop("--json", "torchrun", "--nproc-per-node", "2", EXAMPLE, "--steps", "20", "--step-time", "0",
                   "--fault", "unused-param", "--fault-step", "3")
    assert r.returncode == 1
    # every rank fails at step 4; torchrun may stop the second before it prints why
    found = [a for a in alarms(json_events(r.stdout)) if a["id"] == "ddp-unused-params"]
    assert found and {a["ranks"][0] for a in found} <= {0, 1}, found
    assert "find_unused_parameters=True" in found[0]["message"] and "nccl-debug" in found[0]["suggested_profiles"]
    # no bare "python-exception" alarm for a rank the signature explains
    assert not [a for a in alarms(json_events(r.stdout)) if a["id"] == "python-exception"]
    rep = json.loads(run_ddptop("diagnose", "--json", "latest").stdout)  # (the newest run, as for attach)
    assert rep["root_cause"]["signature"] == "ddp-unused-params"


def test_a_data_loader_worker_killed_like_the_oom_killer_does_is_named(runs_dir):
    r = run_ddptop("--json", "torchrun", "--nproc-per-node", "2", EXAMPLE, "--steps", "50", "--step-time", "0",
                   "--workers", "1", "--fault", "worker-killed", "--fault-rank", "1", "--fault-step", "3")
    assert r.returncode == 1
    (a,) = [a for a in alarms(json_events(r.stdout)) if a["id"] == "dataloader-worker-died"]
    assert a["ranks"] == [1] and a["culprits"] == [1]
    assert "OOM killer" in a["message"] and a["suggested_profiles"] == ["fewer-workers"]
    rep = json.loads(run_ddptop("diagnose", "--json", only_run(runs_dir).name).stdout)  # (a run id)
    assert rep["root_cause"]["signature"] == "dataloader-worker-died" and rep["root_cause"]["rank"] == 1


def test_without_py_spy_the_stall_is_still_alarmed_and_says_what_is_missing(runs_dir):
    """Stack sampling off (as without py-spy or ptrace): the alarm comes from
    progress and telemetry alone, and says that the stacks are missing and why."""
    import os

    env = dict(os.environ, DDPTOP_PY_SPY="")
    r = run_ddptop("--json", "--gpu", "sim", "--on-stall", "kill", "torchrun", "--nproc-per-node", "2", EXAMPLE,
                   "--steps", "100000", "--step-time", "0.05", "--fault", "hang", "--fault-rank", "1", "--fault-step", "10",
                   env=env)
    assert r.returncode == 124, r.stderr[-2000:]
    events = json_events(r.stdout)
    (alarm,) = [a for a in alarms(events) if a["type"] == "stall"]
    assert alarm["culprits"] == [1] and alarm["where"] == {}  # from telemetry: rank 1's GPU idle, rank 0's hot
    assert "no stacks: stack sampling is off (DDPTOP_PY_SPY is empty)" in alarm["message"], alarm["message"]
    stacks = [e for e in events if e["kind"] == "stacks"]
    assert stacks and stacks[0]["hung"] is None and "DDPTOP_PY_SPY" in stacks[0]["error"]
