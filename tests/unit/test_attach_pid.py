"""`ddptop attach --pid`, the pure parts: which command lines are torchrun, its options, where a rank's
history starts (the real jobs are tests/integration/test_attach_pid_e2e.py)."""

from __future__ import annotations

from ddptop.core.sessions.pid_target import start_offset
from ddptop.core.sources.proc_torchrun import parse_torchrun_options, torchrun_args


# -- pure parts ---------------------------------------------------------------------


def test_recognises_torchrun_command_lines():
    assert torchrun_args(["torchrun", "--nproc-per-node", "2", "t.py"]) == ["--nproc-per-node", "2", "t.py"]
    assert torchrun_args(["/usr/bin/python3", "/venv/bin/torchrun", "t.py"]) == ["t.py"]
    assert torchrun_args(["python3.11", "-u", "-m", "torch.distributed.run", "t.py"]) == ["t.py"]
    assert torchrun_args(["python", "-m", "torch.distributed.launch", "--nproc_per_node=2", "t.py"]) == [
        "--nproc_per_node=2", "t.py"]
    assert torchrun_args(["python", "/x/site-packages/torch/distributed/run.py", "t.py"]) == ["t.py"]
    # not torchrun: a wrapper around it, a rank, code that mentions it, ddptop itself
    assert torchrun_args(["timeout", "60", "python", "-m", "torch.distributed.run", "t.py"]) is None
    assert torchrun_args(["python", "-u", "t.py", "-m", "torch.distributed.run"]) is None
    assert torchrun_args(["python", "-c", "import torch.distributed.run"]) is None
    assert torchrun_args(["python", "-m", "ddptop", "attach", "--pid", "1"]) is None
    assert torchrun_args([]) is None


def test_parses_torchrun_options_in_every_spelling():
    o = parse_torchrun_options(["--nnodes=1", "--nproc_per_node", "4", "--standalone", "--log-dir=/l", "-r", "0:3,1:1",
                                "--tee", "3", "--node_rank=0", "train.py", "--log-dir", "not-torchrun's"])
    assert (o.nnodes, o.nproc_per_node, o.log_dir, o.redirects, o.tee, o.node_rank) == ("1", "4", "/l", "0:3,1:1", "3", "0")
    assert o.script == ["train.py", "--log-dir", "not-torchrun's"]
    # torchrun also takes every option from a PET_* variable
    o = parse_torchrun_options(["t.py"], {"PET_LOG_DIR": "/env-logs", "PET_NPROC_PER_NODE": "2"})
    assert (o.log_dir, o.nproc_per_node, o.redirects) == ("/env-logs", "2", None)


def test_history_starts_at_a_line_boundary(tmp_path):
    f = tmp_path / "out.log"
    f.write_bytes(b"".join(b"line %05d\n" % i for i in range(20000)))  # 200 000 bytes
    off = start_offset(str(f), 64 * 1024)
    data = f.read_bytes()
    assert 0 < len(data) - off <= 64 * 1024 and data[off - 1:off] == b"\n" and data[off:off + 5] == b"line "
    small = tmp_path / "small.log"
    small.write_bytes(b"a\nb\n")
    assert start_offset(str(small), 64 * 1024) == 0
