"""The hang detector on real training frameworks: PyTorch Lightning (strategy="ddp")
and Hugging Face Trainer (ddp_backend="gloo"), under real torchrun, 2 ranks on CPU.

The jobs are examples/frameworks/*.py: tiny models built in code, random data,
nothing downloaded.  One job of each answers both questions: its validation or
evaluation and its checkpoint write, each quiet for at least three times the
alarm threshold, must raise nothing; the hang in a callback that comes after
them must be alarmed with the rank and its file:line.
"""

from __future__ import annotations

import os
from pathlib import Path

from conftest import ROOT, diagnose_agrees, json_events, only_run, run_ddptop

LIGHTNING = ROOT / "examples" / "frameworks" / "lightning_job.py"
HF = ROOT / "examples" / "frameworks" / "hf_trainer_job.py"
OFFLINE = dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               WANDB_DISABLED="true")


# the detector's alarm threshold for jobs stepping this fast: its least silence (DDPTOP_MIN_SILENCE, 10 s by
# default).  The jobs here run under 5 s, the least a person should set (under 5 s a framework's validation that
# shows no progress for its first seconds is alarmed): the hangs are alarmed sooner, and the jobs' quiet
# phases, three times the threshold and more (16 s), cost half what they would under the default (32 s of
# computing evaluation on each rank, the suite's dearest tests).
THRESHOLD = 5.0
QUIET = 16  # seconds of each healthy job's validation or evaluation, and of its checkpoint write (> 3 x THRESHOLD)


def env(threshold: float = THRESHOLD):
    """The environment now (with the runs_dir fixture's DDPTOP_RUNS_DIR), offline, with the threshold."""
    return dict(os.environ, **OFFLINE, DDPTOP_MIN_SILENCE=str(threshold))


def stall_alarms(events):
    return [e for e in events if e["kind"] == "alarm" and e["type"] == "stall"]


def steps_at(events, rank=0):
    """Clock times of the rank's optimizer steps (the injected hook)."""
    return [e["t"] for e in events if e["kind"] == "progress" and e["rank"] == rank and e["source"] == "hook"]


def check_named(events, script: Path, function: str):
    stalls = stall_alarms(events)
    assert len(stalls) == 1, [a["message"] for a in stalls]
    a = stalls[0]
    assert a["culprits"] == [1], a["message"]
    w = a["where"]["1"]
    # where rank 1 is: the callback's own function, at a line of the training script that sleeps
    assert w["function"].endswith(function) and Path(w["file"]).name == script.name, w
    assert "time.sleep" in script.read_text().splitlines()[w["line"] - 1] and w["call"] == "time.sleep", w
    assert f"{script.name}:{w['line']}" in a["message"] and "(`time.sleep`)" in a["message"], a["message"]
    # and where the other rank waits: in a collective (DDP), said in the same alarm
    assert "Rank 0 waits in" in a["message"], a["message"]
    stacks = [e for e in events if e["kind"] == "stacks" and e["t"] <= a["t"]]
    assert stacks and stacks[-1]["hung"] is True and stacks[-1]["culprits"] == [1]
    last_step = max(t for t in steps_at(events) if t < a["t"])
    print(f"\n{script.name}: stall alarm {a['t'] - last_step:.1f} s after the last optimizer step; "
          f"stacks sampled {min(s['t'] for s in stacks if s['t'] >= last_step) - last_step:.1f} s after it")
    return a


def quiet_gaps(events):
    """Gaps between optimizer steps (rank 0) longer than three alarm thresholds."""
    ts = steps_at(events)
    return [b - a for a, b in zip(ts, ts[1:]) if b - a >= 3 * THRESHOLD]


def phases(events, rank=0):
    return {e["phase"] for e in events if e["kind"] == "progress" and e["rank"] == rank and e["source"] == "batch"}


def quiet_then_hung(r, script: Path, function: str):
    """The job's long quiet phases raised nothing; the hang in its callback after them is alarmed once, naming
    the rank and its line."""
    events = json_events(r.stdout)
    assert r.returncode == 124, (r.returncode, r.stderr[-2000:])
    a = check_named(events, script, function)
    assert [x["message"] for x in events if x["kind"] == "alarm" and x["t"] < a["t"]] == []
    # the quiet phases were real and came before the hang: two spells of 3 x THRESHOLD or more without an
    # optimizer step (validation or evaluation, checkpoint)
    assert len(quiet_gaps(events)) >= 2, quiet_gaps(events)
    assert {"train", "eval", "save"} <= phases(events), phases(events)
    return events, a


def test_a_lightning_job_stays_quiet_through_a_long_validation_and_a_slow_checkpoint_then_names_a_hung_callback(runs_dir):
    """One job answers both: a healthy validation and a checkpoint write, each quiet for over three alarm
    thresholds, raise nothing; the hang in a callback that follows is alarmed with its rank and line."""
    r = run_ddptop("--json", "--gpu", "sim", "--on-stall", "kill", "torchrun", "--nproc-per-node", "2", str(LIGHTNING),
                   "--steps", "100000", "--val-every", "60", "--val-time", str(QUIET), "--ckpt-every", "70",
                   "--ckpt-time", str(QUIET), "--hang-rank", "1", "--hang-at-batch", "85", env=env(THRESHOLD),
                   timeout=480)  # (a loaded machine stretches it)
    events, a = quiet_then_hung(r, LIGHTNING, "on_train_batch_start")
    assert events[-1]["kind"] == "state" and events[-1]["state"] == "stopped"
    diagnose_agrees(only_run(runs_dir), a)


def test_a_trainer_job_stays_quiet_through_a_long_evaluation_and_a_slow_checkpoint_then_names_a_hung_callback(runs_dir):
    r = run_ddptop("--json", "--gpu", "sim", "--on-stall", "kill", "torchrun", "--nproc-per-node", "2", str(HF),
                   "--steps", "100000", "--eval-every", "30", "--eval-time", str(QUIET), "--ckpt-every", "40",
                   "--ckpt-time", str(QUIET), "--hang-rank", "1", "--hang-at-step", "45", env=env(THRESHOLD),
                   timeout=480)
    _, a = quiet_then_hung(r, HF, "on_step_begin")
    diagnose_agrees(only_run(runs_dir), a)
