import pytest

from ddptop.core.signatures import SignatureMatcher, root_cause

REAL = {
    "nccl-watchdog-timeout": "[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.",
    "nccl-heartbeat-timeout": "[rank0]:[F ProcessGroupNCCL.cpp:1169] [PG 0 Rank 0] [PG 0 Rank 0] Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=1",
    "nccl-system-error": "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.14.3",
    "nccl-internal-error": "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, internal error, NCCL version 2.10.3",
    "nccl-cuda-error": "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3",
    "nccl-socket-transport": "node1:12345:12400 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    "nccl-p2p-disabled": "node1:1:1 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1.",
    "gloo-timeout": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete",
    "peer-connection-reset": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4372",
    "cuda-oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.14 GiB of which 1.02 GiB is free.",
    "port-in-use": "[W socket.cpp:436] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).",
    "rendezvous-timeout": "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
    "ddp-param-mismatch": "RuntimeError: DDP expects same model across all ranks, but Rank 0 has 237 params, while rank 1 has inconsistent 0 params.",
    "tensor-size-mismatch": "RuntimeError: The size of tensor a (192) must match the size of tensor b (0) at non-singleton dimension 1",
    "shm-exhausted": "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
    "xid": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
}


@pytest.mark.parametrize("sig,line", sorted(REAL.items()))
def test_each_signature_matches_its_real_text(sig, line):
    found = {f.signature for f in SignatureMatcher().feed(line, 1)}
    assert sig in found, found


def test_watchdog_reports_the_sequence_number():
    (f,) = [f for f in SignatureMatcher().feed(REAL["nccl-watchdog-timeout"], 1) if f.signature == "nccl-watchdog-timeout"]
    assert f.detail == {"seq": "1580", "op": "ALLREDUCE"} and f.rank == 1


def test_rank_from_torchrun_tee_prefix():
    fs = SignatureMatcher().feed("[default3]:" + REAL["cuda-oom"], None)
    assert fs[0].rank == 3


TORCHRUN_SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-22_23:24:05
  host      : gpu-node-3
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 9294)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 9294
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_23:24:05
  host      : gpu-node-3
  rank      : 5 (local_rank: 1)
  exitcode  : -11 (pid: 9295)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 9295
============================================================"""


def test_torchrun_root_cause_block_names_signal_and_rank_and_beats_the_teardown():
    m = SignatureMatcher()
    fs = [f for i, l in enumerate(TORCHRUN_SUMMARY.splitlines()) for f in m.feed(l, None, i + 1)]
    rc = root_cause(fs)
    assert rc.signature == "rank-signal" and rc.rank == 5 and rc.detail["signal"] == "SIGSEGV"
    assert "gloo" in rc.suggested_profiles
    sigterm = [f for f in fs if f.signature == "rank-signal" and f.rank == 0]
    assert sigterm and sigterm[0].detail["signal"] == "SIGTERM"


def test_failure_summary_gives_each_named_rank_its_exit_code():
    from ddptop.core.signatures import failure_summary

    lines = ["[r0] step 3 exitcode : 7 (pid: 1)", *TORCHRUN_SUMMARY.splitlines(), "  rank      : 9 (local_rank: 1)",
             "  exitcode  : 3 (pid: 5)"]  # lines outside the summary name nothing
    assert failure_summary(lines) == {0: -15, 5: -11}
    assert failure_summary(["torchrun exited"]) == {}


def test_consequences_are_not_the_root_cause():
    m = SignatureMatcher()
    fs = m.feed(REAL["peer-connection-reset"], 0) + m.feed(REAL["tensor-size-mismatch"], 1)
    assert root_cause(fs).signature == "tensor-size-mismatch"


def test_python_exception_is_the_final_traceback_line():
    fs = SignatureMatcher().feed("[rank1]: ValueError: bad config key 'lr'", 1)
    assert [(f.signature, f.rank) for f in fs] == [("python-exception", 1)]
    assert root_cause(fs).signature == "python-exception"
