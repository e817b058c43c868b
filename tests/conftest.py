import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")
TIMEOUT = 180  # seconds, for any one ddptop/torchrun subprocess


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    d = tmp_path / "runs"
    monkeypatch.setenv("DDPTOP_RUNS_DIR", str(d))
    yield d
    # a test that failed midway must not leave its job running: stop it through
    # its supervisor, and check that no rank survives
    if d.exists():
        for run in d.iterdir():
            stop_run(run)


def stop_run(run: Path, timeout: float = 60) -> None:
    sup = run / "supervisor.json"
    if not sup.exists() or (run / "exit.json").exists():
        return
    from ddptop.core.session import Session

    s = Session.open(run)
    if s.is_live:
        s.stop()
        wait_for(lambda: (run / "exit.json").exists(), timeout=timeout, what=f"{run} to stop")
    left = [pid for pid in rank_pids(run).values() if alive(pid)]
    assert not left, f"ranks {left} of {run} survived the stop"


def ddptop_cmd(*args):
    return [sys.executable, "-m", "ddptop", *args]


def run_ddptop(*args, timeout=TIMEOUT, **kw):
    return subprocess.run(ddptop_cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kw)


def json_events(stdout: str):
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def wait_for(pred, timeout=60, interval=0.1, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def journal_events(run_dir: Path):
    p = Path(run_dir) / "events.jsonl"
    if not p.exists():
        return []
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()]


def rank_pids(run_dir: Path):
    return {e["rank"]: e["pid"] for e in journal_events(run_dir) if e["kind"] == "rank" and e["alive"]}


def only_run(runs_dir: Path) -> Path:
    runs = [d for d in runs_dir.iterdir() if (d / "meta.json").exists()]
    assert len(runs) == 1, runs
    return runs[0]


def alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
