"""`ddptop diagnose` on logs ddptop did not write: a plain torchrun --log-dir
(at any level of it), torchrun's --tee console, SLURM's per-task files, and
files that are nobody's rank (dmesg).  The cause, not its consequences.

(The pure parts: tests/unit/test_diagnose.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

# rank 1's data loader thread dies on a missing file and its main thread waits for it forever; rank 0
# times out in the next all-reduce and exits first, so torchrun's "Root Cause (first observed
# failure)" names rank 0: the classic misdirection
JOB = """\
import datetime, threading, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
r = dist.get_rank()
t = torch.ones(1)
for step in range(1, 6):
    dist.all_reduce(t)
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
def load():
    open("/nonexistent/shard_0007.tar")
if r == 1:
    th = threading.Thread(target=load, name="loader")
    th.start(); th.join()
    time.sleep(120)
dist.all_reduce(t)
"""


def diagnose(*paths, cwd=None) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-m", "ddptop", "diagnose", "--json", *map(str, paths)], capture_output=True,
                       text=True, timeout=120, cwd=cwd or ROOT)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


@pytest.fixture(scope="module")
def plain_torchrun_job(tmp_path_factory):
    """A real 2-rank torchrun job, not launched by ddptop: its --log-dir and its --tee console."""
    d = tmp_path_factory.mktemp("plain")
    (d / "job.py").write_text(JOB)
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    with open(d / "console.txt", "w") as out:
        r = subprocess.run([torchrun, "--nproc-per-node", "2", "--log-dir", str(d / "logs"), "--redirects", "3",
                            "--tee", "3", str(d / "job.py")], stdout=out, stderr=subprocess.STDOUT, timeout=180, cwd=d,
                           env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert r.returncode != 0
    console = (d / "console.txt").read_text()
    assert "Root Cause (first observed failure)" in console and "rank      : 0" in console.split("Root Cause")[1]
    return d


def test_a_rank_that_failed_on_its_own_is_the_cause_not_the_rank_torchrun_saw_fail_first(plain_torchrun_job):
    d = plain_torchrun_job
    (run_dir,) = (d / "logs").iterdir()
    layouts = [d / "logs", run_dir, run_dir / "attempt_0", d / "console.txt"]
    for path in layouts:
        code, rep = diagnose(path)
        rc = rep["root_cause"]
        assert code == 1 and rc["signature"] == "python-exception" and rc["rank"] == 1, (path, rc)
        assert "FileNotFoundError" in rc["text"] and rep["culprits"] == [1], path
        # rank 0's timeout is there, as what it is
        assert any(f["signature"] == "gloo-timeout" and f["rank"] == 0 for f in rep["findings"]), path
    code, rep = diagnose(run_dir / "attempt_0" / "1")  # one rank's directory
    assert rep["root_cause"]["rank"] == 1


def test_a_ranks_own_file_says_its_global_rank(tmp_path):
    """A --log-dir knows local ranks only (they repeat on every node); torch's "[rankN]:" prefixes
    inside a rank's file say its global rank."""
    f = tmp_path / "logs" / "job_ab12" / "attempt_0" / "1" / "stderr.log"
    f.parent.mkdir(parents=True)
    f.write_text("[rank5]: Traceback (most recent call last):\n[rank5]:   File \"train.py\", line 9, in <module>\n"
                 "[rank5]: KeyError: 'pixel_values'\n")
    code, rep = diagnose(tmp_path / "logs")
    assert rep["root_cause"]["rank"] == 5 and rep["culprits"] == [5]


def test_per_task_files_are_ranks_by_their_number_and_other_files_are_nobodys(tmp_path):
    """SLURM's one file per task (job-77-0.out, job-77-1.out) are ranks 0 and 1; a file of the
    kernel's (dmesg.txt) is no rank, never rank 0 by default."""
    (tmp_path / "job-77-0.out").write_text("step 10 loss 0.5\nstep 11 loss 0.4\n")
    (tmp_path / "job-77-1.out").write_text(
        "step 10 loss 0.5\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a "
        "total capacity of 79.15 GiB of which 1.12 GiB is free.\n")
    code, rep = diagnose(tmp_path)
    assert rep["root_cause"]["signature"] == "cuda-oom" and rep["culprits"] == [1]
    assert rep["progress"] == {"0": {"last_step": 11}, "1": {"last_step": 10}}
    (tmp_path / "job-77-1.out").write_text("step 10 loss 0.5\n")
    (tmp_path / "dmesg.txt").write_text(
        "[2419388.120551] NVRM: Xid (PCI:0000:5d:00): 79, pid=8802, name=python3, GPU has fallen off the bus.\n")
    code, rep = diagnose(tmp_path)
    assert rep["root_cause"]["signature"] == "xid" and rep["root_cause"]["rank"] is None
    assert rep["root_cause"]["detail"]["pid"] == 8802


def test_consequences_alone_are_no_failure(tmp_path):
    """A clean run whose teardown logged a reset connection: exit 0, no root cause, no culprit."""
    log = tmp_path / "train.log"
    log.write_text("[rank0]: step 100 loss 0.1\n[rank1]: step 100 loss 0.1\n"
                   "[rank1]:[W1125 10:00:00.000 TCPStore.cpp:131] [c10d] recvValue failed on SocketImpl(fd=77): "
                   "Connection reset by peer\n")
    code, rep = diagnose(log)
    assert code == 0 and rep["root_cause"] is None and rep["culprits"] == []
    assert [f["signature"] for f in rep["findings"]] == ["peer-connection-reset"]
