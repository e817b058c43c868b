"""Real torchrun, two ranks on CPU (gloo), launched and watched by ddptop."""

import json
import os
import signal
import subprocess


from conftest import (EXAMPLE, ROOT, TIMEOUT, alive, ddptop_cmd, json_events, journal_events,
                      only_run, rank_pids, run_ddptop, wait_for)

STEPS = 30


def step_lines(events, rank):
    return [e["text"] for e in events if e["kind"] == "log" and e["rank"] == rank and e["text"].startswith("step ")]


def test_every_rank_line_reaches_journal_and_json_with_its_rank_and_the_hook_counts_its_steps(runs_dir):
    """One healthy job: every line of every rank in the JSON and the journal, and the step hook injected into
    the ranks (no change to the script) counting their optimizer steps and DataLoader batches.  It runs with
    torchrun --virtual-local-rank: every worker's LOCAL_RANK is 0, yet each rank's lines are its own."""
    # (torchrun gives each worker one entry of CUDA_VISIBLE_DEVICES; "-1" is no device, as every test's job has)
    r = run_ddptop("--json", "torchrun", "--virtual-local-rank", "--nproc-per-node", "2", EXAMPLE, "--steps", str(STEPS),
                   "--step-time", "0.05", env=dict(os.environ, CUDA_VISIBLE_DEVICES="-1,-1"))
    assert r.returncode == 0, r.stderr[-2000:]
    events = json_events(r.stdout)
    assert all("t" in e and "kind" in e for e in events)
    assert {(e["rank"], e["local_rank"]) for e in events if e["kind"] == "rank" and e["alive"]} == {(0, 0), (1, 1)}
    for rank in (0, 1):
        steps = step_lines(events, rank)
        assert [int(s.split()[1]) for s in steps] == list(range(1, STEPS + 1))
        assert any(e["kind"] == "log" and e["rank"] == rank and e["text"].startswith(f"rank {rank}/2 up") for e in events)
        # the hook: optimizer steps, in order, to the last
        hooked = [e["step"] for e in events if e["kind"] == "progress" and e["rank"] == rank and e["source"] == "hook"]
        assert hooked and hooked[-1] == STEPS and hooked == sorted(hooked), hooked[-3:]
        # and every batch drawn from the example's DataLoader, with the model's phase
        batches = [e for e in events if e["kind"] == "progress" and e["rank"] == rank and e["source"] == "batch"]
        assert batches and [e["step"] for e in batches] == sorted(e["step"] for e in batches)
        assert batches[-1]["step"] >= STEPS - 5 and {e["phase"] for e in batches} == {"train"}, batches[-3:]
    final = events[-1]
    assert final["kind"] == "state" and final["state"] == "succeeded" and final["exit_code"] == 0
    # the journal holds the same lines, written by the ranks themselves
    run = only_run(runs_dir)
    assert oct(run.stat().st_mode & 0o777) == "0o700"
    meta = json.loads((run / "meta.json").read_text())
    assert meta["user_command"][0] == "torchrun" and "--redirects" in meta["command"]
    assert "_inject" in meta["env_set"]["PYTHONPATH"]
    logs = sorted((run / "logs").glob("*/attempt_0/*/stdout.log"))
    assert len(logs) == 2
    for log in logs:
        text = log.read_text()
        assert sum(1 for l in text.splitlines() if l.startswith("step ")) == STEPS
    assert json.loads((run / "exit.json").read_text())["exit_code"] == 0
    assert (run / "torchrun.log").stat().st_size > 0


def test_failing_script_exit_code_passes_through(runs_dir):
    r = run_ddptop("--headless", "torchrun", "--nproc-per-node", "2", EXAMPLE, "--steps", "2", "--step-time", "0", "--fail")
    assert r.returncode == 1
    assert "[r0!]" in r.stdout and "RuntimeError: failing on purpose" in r.stdout
    assert "job failed, exit code 1" in r.stdout


def _start_background(*args):
    return subprocess.Popen(ddptop_cmd(*args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def test_kill_9_of_ddptop_loses_nothing_and_attach_shows_the_run(runs_dir):
    steps = 40
    p = _start_background("--headless", "torchrun", "--nproc-per-node", "2", EXAMPLE,
                          "--steps", str(steps), "--step-time", "0.1")
    try:
        run = wait_for(lambda: next(iter(runs_dir.glob("*")), None) if runs_dir.exists() else None, what="run dir")
        wait_for(lambda: len(rank_pids(run)) == 2, timeout=TIMEOUT, what="both ranks")
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        # the job carries on without ddptop and records its end
        wait_for(lambda: (run / "exit.json").exists(), timeout=TIMEOUT, what="job end")
    finally:
        if p.poll() is None:
            p.kill()
    assert json.loads((run / "exit.json").read_text())["exit_code"] == 0
    r = run_ddptop("--json", "attach", run.name)
    assert r.returncode == 0, r.stderr
    events = json_events(r.stdout)
    for rank in (0, 1):
        assert [int(s.split()[1]) for s in step_lines(events, rank)] == list(range(1, steps + 1))
    assert events[-1]["state"] == "succeeded"


def test_stopping_from_ddptop_leaves_no_rank_behind(runs_dir):
    p = _start_background("--json", "torchrun", "--nproc-per-node", "2", EXAMPLE, "--steps", "100000", "--step-time", "0.05")
    try:
        run = wait_for(lambda: next(iter(runs_dir.glob("*")), None) if runs_dir.exists() else None, what="run dir")
        pids = wait_for(lambda: (lambda d: d if len(d) == 2 else None)(rank_pids(run)), timeout=TIMEOUT, what="both ranks")
        wait_for(lambda: any("step 3 " in f.read_text() for f in run.glob("logs/*/attempt_0/*/stdout.log")), timeout=TIMEOUT, what="steps")
        sup = json.loads((run / "supervisor.json").read_text())["pid"]
        torchrun_pid = next(int(e["message"].split()[-1]) for e in journal_events(run) if e["kind"] == "state" and e["state"] == "running")
        workers = []
        import psutil
        for pid in pids.values():
            workers += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        os.kill(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    events = json_events(out.decode())
    assert events[-1]["kind"] == "state" and events[-1]["state"] == "stopped"
    assert p.returncode == events[-1]["exit_code"] != 0
    for pid in [*pids.values(), torchrun_pid, *workers]:  # gone before "stopped" is said
        assert not alive(pid), f"pid {pid} survived the stop"
    # the supervisor says "stopped", then exits
    wait_for(lambda: not alive(sup), timeout=10, what=f"the supervisor (pid {sup}) to exit")


def test_ranks_left_by_a_killed_torchrun_are_stopped(runs_dir):
    """torchrun killed with SIGKILL orphans its ranks; the supervisor sweeps them."""
    p = _start_background("--json", "torchrun", "--nproc-per-node", "2", EXAMPLE, "--steps", "100000", "--step-time", "0.05")
    try:
        run = wait_for(lambda: next(iter(runs_dir.glob("*")), None) if runs_dir.exists() else None, what="run dir")
        pids = wait_for(lambda: (lambda d: d if len(d) == 2 else None)(rank_pids(run)), timeout=TIMEOUT, what="both ranks")
        torchrun_pid = next(int(e["message"].split()[-1]) for e in journal_events(run) if e["kind"] == "state" and e["state"] == "running")
        os.kill(torchrun_pid, signal.SIGKILL)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    events = json_events(out.decode())
    assert events[-1]["state"] == "failed" and events[-1]["exit_code"] == 137
    assert any(e["kind"] == "note" and "leaving ranks" in e["message"] for e in events)
    for pid in pids.values():
        assert not alive(pid)


def test_ddptops_own_options_after_a_sub_command_but_never_after_torchrun(runs_dir):
    """`ddptop fix --json --fix-steps 3 torchrun ...`: --json and --fix-steps are
    ddptop's; a `--json` after the word torchrun goes to the script unchanged."""
    r = run_ddptop("fix", "--json", "--fix-steps", "3", "torchrun", "--nproc-per-node", "1", EXAMPLE,
                   "--steps", "5", "--step-time", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)  # --json was taken: the report is JSON
    assert rep["winner"]["label"] == "as given" and rep["attempts"][0]["outcome"] == "progress"
    # after torchrun, an option named like ddptop's is the script's: train_ddp.py rejects it
    bad = run_ddptop("--json", "torchrun", "--nproc-per-node", "1", EXAMPLE, "--steps", "1", "--fix-steps", "3")
    assert bad.returncode != 0
    assert any("unrecognized arguments: --fix-steps 3" in e.get("text", "") for e in json_events(bad.stdout))
    # and no abbreviation: --run is not --run-dir
    ab = run_ddptop("--run", "x", "torchrun", "--nproc-per-node", "1", EXAMPLE)
    assert ab.returncode == 2 and "unrecognized arguments: --run" in ab.stderr


def test_secret_options_are_masked_wherever_the_command_is_shown_and_the_job_gets_them(runs_dir, tmp_path):
    """`--hf-token X` and `--api-key=X` reach the script as typed, but meta.json,
    the journal's launch event and --json show them masked; the real command
    line is kept in a 0600 file that only the supervisor (relaunch) and fix read."""
    import hashlib
    import stat

    script = tmp_path / "train.py"
    script.write_text("import hashlib, sys\n"
                      "print('args digest', hashlib.sha256(' '.join(sys.argv[1:]).encode()).hexdigest(), flush=True)\n")
    args = ["--hf-token", "hf_SEKRETvalue123", "--api-key=sk-SEKRET456", "--lr", "0.1"]
    r = run_ddptop("--json", "torchrun", "--nproc-per-node", "1", str(script), *args)
    assert r.returncode == 0, r.stderr[-2000:]
    digest = hashlib.sha256(" ".join(args).encode()).hexdigest()
    assert f"args digest {digest}" in r.stdout  # the script got the real values
    run = only_run(runs_dir)
    shown = r.stdout.replace(digest, "") + (run / "meta.json").read_text() + (run / "events.jsonl").read_text()
    assert "SEKRET" not in shown
    launch = [e for e in json_events(r.stdout) if e["kind"] == "launch"][0]
    assert launch["command"][-5:] == ["--hf-token", "***", "--api-key=***", "--lr", "0.1"]
    private = run / "argv.private.json"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and "hf_SEKRETvalue123" in private.read_text()
    # a viewer shows the run without it
    a = run_ddptop("--json", "attach", str(run))
    assert a.returncode == 0 and "SEKRET" not in a.stdout.replace(digest, "")


def test_a_runs_directory_of_another_user_is_refused(runs_dir, tmp_path, monkeypatch):
    """What ddptop writes (commands, logs, stacks) never goes into a runs
    directory that another user owns: the launch fails before anything starts,
    and a capture for an attached job is refused the same way."""
    import pytest

    if os.getuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    runs_dir.mkdir(mode=0o700)
    os.chown(runs_dir, 65534, 65534)
    r = run_ddptop("--headless", "torchrun", "--nproc-per-node", "1", EXAMPLE, "--steps", "1")
    assert r.returncode == 2 and "belongs to another user (uid 65534)" in r.stderr, r.stderr[-2000:]
    assert list(runs_dir.iterdir()) == [] and "step 1" not in r.stdout  # nothing started, nothing written
    from ddptop.core.model import run_dirs
    from ddptop.core.run import journal

    monkeypatch.setenv("DDPTOP_RUNS_DIR", str(runs_dir))
    with pytest.raises(run_dirs.JournalError, match="belongs to another user"):
        run_dirs.make_private_dir(journal.attached_dir("pid-1") / "stacks" / "x")
    assert not (runs_dir / "attached").exists()
    os.chown(runs_dir, 0, 0)  # ours again: the same launch goes ahead
    ok = run_ddptop("--headless", "torchrun", "--nproc-per-node", "1", EXAMPLE, "--steps", "1", "--step-time", "0")
    assert ok.returncode == 0, ok.stderr[-2000:]
