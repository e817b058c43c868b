"""`ddptop diagnose` beyond its catalogue: an open-world root, the order of time, damaged fields, lost peers,
the training bar among several.

The lines are in the formats PyTorch, NCCL, SLURM, UCX and tqdm print (each named where it comes from); where a
line is quoted from a public thread, the thread is named.  Each test runs the real `ddptop diagnose --json`.

(The time stamps alone: tests/unit/test_open_world.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def diagnose(*paths) -> dict:
    r = subprocess.run([sys.executable, "-m", "ddptop", "diagnose", "--json", *map(str, paths)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


# --------------------------------------------------------------------------- an open-world root

# torchrun --tee 3 of a real 2-rank gloo job on this machine under load (tests/integration/test_diagnose_e2e.py's
# JOB, 2026-11-27): rank 1 printed steps 4 and 5, then its loader thread died; its stdout's two steps reached the
# console after its stderr's traceback (torchrun tails the two files by separate threads)
TEE_CONSOLE = """\
[default1]:step 1 loss 1.000
[default1]:step 2 loss 0.500
[default1]:step 3 loss 0.333
[default0]:step 1 loss 1.000
[default0]:step 2 loss 0.500
[default0]:step 3 loss 0.333
[default0]:step 4 loss 0.250
[default0]:step 5 loss 0.200
[default1]:Exception in thread loader:
[default1]:Traceback (most recent call last):
[default1]:  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner
[default1]:    self.run()
[default1]:  File "/usr/lib/python3.11/threading.py", line 982, in run
[default1]:    self._target(*self._args, **self._kwargs)
[default1]:  File "/tmp/plain0/job.py", line 10, in load
[default1]:    open("/nonexistent/shard_0007.tar")
[default1]:FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/shard_0007.tar'
[default1]:step 4 loss 0.250
[default1]:step 5 loss 0.200
[default0]:[rank0]: Traceback (most recent call last):
[default0]:[rank0]:   File "/tmp/plain0/job.py", line 15, in <module>
[default0]:[rank0]:     dist.all_reduce(t)
[default0]:[rank0]:   File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252, in all_reduce
[default0]:[rank0]:     work.wait()
[default0]:[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete
W1127 07:24:21.607000 2113 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 2119 closing signal SIGTERM
E1127 07:24:21.798000 2113 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 2118) of binary: /venv/bin/python3
"""


# the same job's console on another run here (2026-11-28): rank 1's first step, its loader's traceback, then rank
# 0's five steps, and only then rank 1's steps 2-5 (its stdout's steps, written before the traceback)
_TRACEBACK = TEE_CONSOLE[TEE_CONSOLE.index("[default1]:Exception in thread loader:"):
                         TEE_CONSOLE.index("[default1]:step 4 loss 0.250")]
TEE_CONSOLE_2 = ("[default1]:step 1 loss 1.000\n" + _TRACEBACK +
                 "".join(f"[default0]:step {s} loss {1 / s:.3f}\n" for s in range(1, 6)) +
                 "".join(f"[default1]:step {s} loss {1 / s:.3f}\n" for s in range(2, 6)) +
                 TEE_CONSOLE[TEE_CONSOLE.index("[default0]:[rank0]: Traceback"):])


@pytest.mark.parametrize("console", [TEE_CONSOLE, TEE_CONSOLE_2], ids=["steps-after", "peers-steps-after-too"])
def test_steps_that_reach_a_tee_console_after_the_error_are_not_a_recovery(tmp_path, console):
    assert console.index("FileNotFoundError") < console.index("[default1]:step 5")
    (tmp_path / "console.txt").write_text(console)
    rep = diagnose(tmp_path / "console.txt")
    rc = rep["root_cause"]
    assert rc["signature"] == "python-exception" and rc["rank"] == 1, rc
    assert "FileNotFoundError" in rc["text"]



def test_a_failure_no_signature_knows_is_the_root_quoted_whole_with_its_rank(tmp_path):
    (tmp_path / "rank0.log").write_text("step 1 loss 0.5\nstep 2 loss 0.4\n")
    deciding = ("ERROR: tokenizer model /data/tok.model could not be opened: the file is a Git LFS pointer "
                "(130 bytes), not a model")
    (tmp_path / "rank1.log").write_text(f"step 1 loss 0.5\n{deciding}\n")
    rep = diagnose(tmp_path)
    rc = rep["root_cause"]
    assert rc["signature"] == "unclassified-error" and rc["rank"] == 1 and rc["text"] == deciding
    assert rep["culprits"] == [1]


def test_a_python_exception_names_its_innermost_user_frame(tmp_path):
    (tmp_path / "rank3.log").write_text(
        'Traceback (most recent call last):\n  File "/w/train.py", line 40, in <module>\n    main()\n'
        '  File "/w/train.py", line 33, in main\n    batch = load(i)\n'
        '  File "/venv/lib/python3.11/site-packages/datasets/arrow_dataset.py", line 2800, in __getitem__\n'
        "    return self._getitem(key)\nIndexError: Invalid key: 9021 is out of bounds for size 9000\n")
    rc = diagnose(tmp_path)["root_cause"]
    assert rc["signature"] == "python-exception" and rc["rank"] == 3
    assert rc["text"] == "IndexError: Invalid key: 9021 is out of bounds for size 9000"
    assert rc["detail"]["where"] == "train.py:33 in main"


def test_an_error_line_after_which_its_rank_went_on_training_is_never_the_root(tmp_path):
    """A warning-like error a healthy run prints (an event file it failed to write) with steps after it."""
    (tmp_path / "rank0.log").write_text(
        "step 100 loss 0.5\nERROR: failed to write the tensorboard event file: Stale file handle\n"
        "step 101 loss 0.5\nstep 102 loss 0.4\nstep 103 loss 0.4\n")
    rep = diagnose(tmp_path)
    assert rep["root_cause"] is None
    f = [x for x in rep["findings"] if x["signature"] == "unclassified-error"]
    assert f and f[0]["detail"]["recovered"] is True
    # the same line as the log's last words is the root
    (tmp_path / "rank0.log").write_text("step 100 loss 0.5\nERROR: failed to write the tensorboard event file: "
                                        "Stale file handle\n")
    assert diagnose(tmp_path)["root_cause"]["signature"] == "unclassified-error"


@pytest.mark.parametrize("line", [
    "/venv/lib/python3.10/site-packages/torch/autograd/graph.py:744: UserWarning: Grad strides do not match bucket "
    "view strides. This may indicate grad was not created according to the gradient layout contract",
    "[W socket.cpp:558] [c10d] The client socket has failed to connect to [localhost]:29500 (errno: 99 - Cannot "
    "assign requested address).",
    "node1:1:1 [0] NCCL INFO NET/Plugin : Plugin load returned 2 : libnccl-net.so: cannot open shared object file: "
    "No such file or directory",
    "Last error:",
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f0d3a1b1446 in libc10.so)",
    "train.py FAILED",
    "  error_file: <N/A>",
])
def test_lines_healthy_runs_and_launchers_print_are_no_unknown_error(tmp_path, line):
    (tmp_path / "rank0.log").write_text(f"step 1 loss 0.5\n{line}\n")
    assert not [f for f in diagnose(tmp_path)["findings"] if f["signature"] == "unclassified-error"]


# --------------------------------------------------------------------------- the order of time


def test_causes_and_timeouts_are_ordered_by_their_lines_time_across_ranks_and_files(tmp_path):
    """Rank 0's watchdog timeout and rank 1's error no signature knows, in two files: the one written first is
    the root, whichever file is read first (PyTorch's C++ log stamps: E<MMDD> <time>)."""
    def job(error_at: str, timeout_at: str):
        (tmp_path / "rank0.log").write_text(
            f"[rank0]:[E1126 {timeout_at}.000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
            "ran for 600012 milliseconds before timing out.\n")
        (tmp_path / "rank1.log").write_text(f"[rank1]:[E1126 {error_at}.000000 train.py:9] ERROR: lost the lease on "
                                            "/mnt/ckpt/shard_3: the job cannot write checkpoints\n")

    job(error_at="10:00:00", timeout_at="10:10:00")
    rc = diagnose(tmp_path)["root_cause"]
    assert rc["signature"] == "unclassified-error" and rc["rank"] == 1 and rc["time"].endswith("10:00:00.000+00:00")
    job(error_at="10:20:00", timeout_at="10:10:00")  # the error came after the timeout: what the timeout set off
    rc = diagnose(tmp_path)["root_cause"]
    assert rc["signature"] == "nccl-watchdog-timeout" and rc["rank"] == 0


WATCHDOG = ("[rank{r}]:[E ProcessGroupNCCL.cpp:563] [Rank {r}] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=451, OpType={op}, NumelIn=4755456, NumelOut=38043648, Timeout(ms)=600000) ran for "
            "600017 milliseconds before timing out.")


# --------------------------------------------------------------------------- damaged fields, lost peers


def test_a_field_a_terminal_damaged_is_unknown_never_a_different_collective(tmp_path):
    (tmp_path / "rank0.log").write_text(WATCHDOG.format(r=0, op="_ALLGATHER_BASE") + "\n")
    # (tmux's "[451/1919]" scroll marker written over the line)
    (tmp_path / "rank1.log").write_text(WATCHDOG.format(r=1, op="_ALLGATHER_BA[451/1919]") + "\n")
    rep = diagnose(tmp_path)
    assert not [f for f in rep["findings"] if f["signature"] == "collective-desync"]
    # two clean and different operations at one sequence number still are
    (tmp_path / "rank1.log").write_text(WATCHDOG.format(r=1, op="ALLREDUCE") + "\n")
    assert [f for f in diagnose(tmp_path)["findings"] if f["signature"] == "collective-desync"]


def test_a_peer_lost_on_another_machine_is_named_by_its_host_and_the_reporter_is_not_the_root(tmp_path):
    # gloo's pair.cc / NCCL's socket.cc wording, the peer named by its host alone
    (tmp_path / "rank0.log").write_text("step 7 loss 0.3\nRuntimeError: [../third_party/gloo/gloo/transport/tcp/"
                                        "pair.cc:598] Connection closed by remote peer gpu004\n")
    rep = diagnose(tmp_path)
    assert rep["root_cause"] is None and rep["culprits"] == []
    assert "gpu004" in rep["lost_peers"]["peers"]


@pytest.mark.parametrize("name,text,signature,said", [
    # nextflow-io/nextflow#5932's lines, then SLURM's cancel (as in IGNF/myria3d#123)
    pytest.param(
        "slurm-1.out",
        "step 12 loss 0.5\nslurmstepd: error: Detected 1 oom_kill event in StepId=11300781.0. Some of the step "
        "tasks have been OOM Killed.\nsrun: error: sdumont6156: task 0: Out Of Memory\n"
        "slurmstepd: error: *** STEP 11300781.0 ON sdumont6156 CANCELLED AT 2025-03-31T10:00:00 ***\n",
        "scheduler-oom-kill", "oom_kill", id="a-schedulers-stated-reason-outranks-its-stop"),
    pytest.param(
        "rank0.log",
        "2024-04-29 06:01:12 ERROR [__main__] main failed\nTraceback (most recent call last):\n"
        '  File "/w/train.py", line 12, in <module>\n    save(model)\n'
        "OSError: [Errno 28] No space left on device\n",
        "disk-full", "No space left on device",
        id="a-loggers-error-line-yields-to-the-traceback-it-announces"),
])
def test_the_root_is_the_line_that_says_why(tmp_path, name, text, signature, said):
    (tmp_path / name).write_text(text)
    rc = diagnose(tmp_path)["root_cause"]
    assert rc["signature"] == signature and said in rc["text"]


# --------------------------------------------------------------------------- the classes


def test_torch_multiprocessing_spawn_names_the_process_and_its_signal(tmp_path):
    (tmp_path / "out.log").write_text(
        "Traceback (most recent call last):\n  File \"/w/train.py\", line 90, in <module>\n"
        "    mp.spawn(main, nprocs=4)\n"
        "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGKILL\n")
    rep = diagnose(tmp_path)
    rc = rep["root_cause"]
    assert rc["signature"] == "rank-signal" and rc["rank"] == 1 and rc["detail"]["signal"] == "SIGKILL"
    assert rep["culprits"] == [1]


def test_a_timeout_said_only_by_pytorchs_counters_is_a_timeout(tmp_path):
    (tmp_path / "rank1.log").write_text(
        "[rank1]:[E1120 10:13:51.421811 ProcessGroupNCCL.cpp:616] [PG ID 0 PG GUID 0(default_pg) Rank 1] Timeout at "
        "NCCL work: 4412, last enqueued NCCL work: 4412, last completed NCCL work: 4411.\n")
    rc = diagnose(tmp_path)["root_cause"]
    assert rc["signature"] == "nccl-watchdog-timeout" and rc["rank"] == 1 and rc["detail"]["seq"] == "4412"


@pytest.mark.parametrize("name,text,signature,detail", [
    # NVIDIA/nccl#905's warning (a flapping link), then the IB completion error and PyTorch's NCCL error
    pytest.param(
        "rank4.log",
        "[rank4]: node48:34050:34121 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error\n"
        "[rank4]: node51:73076:73185 [4] transport/net_ib.cc:1238 NCCL WARN NET/IB : Got completion from peer "
        "node48<37948> with error 12, opcode 2, len 1, vendor err 129\n"
        "[rank4]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system "
        "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1\n",
        "nccl-ib-async-event", {"event": "port error"},
        id="an-infiniband-port-error-is-the-cause-of-the-completion-errors-after-it"),
    # ProcessGroupNCCL.cpp (torch 2.5+): the watchdog's exception, and its counters
    pytest.param(
        "rank12.log",
        "[E909 09:55:29.313379098 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 12] Exception (either an error "
        "or timeout) detected by watchdog at work: 2070, last enqueued NCCL work: 2070, last completed NCCL work: "
        "2069.\n",
        "nccl-watchdog-timeout", {"seq": "2070"}, id="torchs-newer-watchdog-wording-is-a-timeout"),
])
def test_the_root_and_what_its_line_says(tmp_path, name, text, signature, detail):
    (tmp_path / name).write_text(text)
    rc = diagnose(tmp_path)["root_cause"]
    assert rc["signature"] == signature and {k: rc["detail"][k] for k in detail} == detail


@pytest.mark.parametrize("name,text,signature,rank", [
    pytest.param(
        "rank2.log",
        "[rank2]: gpu2:71:99 [2] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer "
        "gpu1<57557>\n"
        "[rank2]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system "
        "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
        "[rank2]: gpu2:71:104 [2] proxy.cc:1523 NCCL WARN Cuda failure 'out of memory'\n",
        "cuda-oom", 2, id="a-cuda-oom-in-nccls-proxy-printed-after-the-socket-error-it-caused"),
    # NVIDIA/nccl#1709's lines
    pytest.param(
        "rank238.log",
        "[rank238]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:3353, internal error - please report this issue to the NCCL developers, NCCL version "
        "2.26.2\n[rank238]: ncclInternalError: Internal check failed.\n[rank238]: Last error:\n"
        "[rank238]: Error : no algorithm/protocol available for function AllGather with datatype ncclInt8.\n",
        "nccl-no-algorithm", 238, id="nccls-no-algorithm-error-not-the-internal-error-it-raises"),
])
def test_the_error_that_caused_the_others_is_the_root(tmp_path, name, text, signature, rank):
    (tmp_path / name).write_text(text)
    rc = diagnose(tmp_path)["root_cause"]
    assert rc["signature"] == signature and rc["rank"] == rank


TORCHRUN_ROOT = """\
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_23:24:05
  host      : gpu-node-3
  rank      : 0 (local_rank: 0)
  exitcode  : -7 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 7 (SIGBUS) received by PID 4242
============================================================"""


@pytest.mark.parametrize("line", [
    TORCHRUN_ROOT,  # torchrun's failure report (torch/distributed/elastic/multiprocessing/errors)
    "[node7:4242:0:4242] Caught signal 7 (Bus error: nonexistent physical address)",  # UCX's handler
])
def test_sigbus_without_the_word_says_shared_memory(tmp_path, line):
    (tmp_path / "rank0.log").write_text(f"step 3 loss 0.9\n{line}\n")
    rep = diagnose(tmp_path)
    f = next(x for x in rep["findings"] if x["signature"] == "rank-signal")
    assert f["detail"]["signal"] == "SIGBUS" and "/dev/shm" in f["explanation"]
    assert "shm-off" in f["suggested_profiles"]


def test_the_training_bar_is_told_from_a_rollout_bar_beside_it(tmp_path):
    bars = []
    for i in range(1, 5):
        bars.append(f"Train: {i}%|#   | {5555 + i}/9008 [1:00:00<1:00:00, 1.00it/s]")
        bars.append("  0%|          | 0/48 [00:00<?, ?it/s]")  # a rollout bar, no word of its own
    (tmp_path / "rank0.log").write_text("\n".join(bars) + "\n")
    rep = diagnose(tmp_path)
    assert rep["progress"]["0"]["last_step"] == 5559


# --------------------------------------------------------------------------- NCCL's and C++'s own error lines


def test_an_nccl_warn_line_is_an_error_unless_it_says_a_peer_went_away(tmp_path):
    # NCCL's bootstrap.cc: WARN is NCCL's error level (NCCL_DEBUG=WARN prints only its errors); one no signature knows
    (tmp_path / "rank0.log").write_text("node1:22841:22841 [0] bootstrap.cc:112 NCCL WARN Bootstrap Root : mismatch "
                                        "in rank count from procs 8 : 16\n")
    rc = diagnose(tmp_path)["root_cause"]
    assert rc["signature"] == "unclassified-error" and "mismatch in rank count" in rc["text"]
    # (and one the catalogue names: no interface to bootstrap on)
    (tmp_path / "rank0.log").write_text("node1:22841:22841 [0] bootstrap.cc:37 NCCL WARN Bootstrap : no socket "
                                        "interface found\n")
    rc = diagnose(tmp_path)["root_cause"]
    assert rc["signature"] == "nccl-no-interface" and "no socket interface found" in rc["text"]
    # NCCL's socket.cc / proxy.cc on a peer that went away: what a lost peer looks like, never a root
    (tmp_path / "rank0.log").write_text(
        "node1:71:99 [2] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer node2<57557>\n"
        "node1:71:99 [2] proxy.cc:1143 NCCL WARN Socket recv failed while polling for opId=0x7f4774cc9620\n")
    rep = diagnose(tmp_path)
    assert rep["root_cause"] is None and "node2:57557" in rep["lost_peers"]["peers"]


def test_a_cpp_exceptions_what_is_the_error_on_one_line_or_the_next(tmp_path):
    for text in ("terminate called after throwing an instance of 'std::runtime_error'\n"
                 "  what():  expected ident but found 'eof' here:\n",
                 "terminate called after throwing an instance of 'std::runtime_error'  what():  expected ident but "
                 "found 'eof' here:\n"):
        (tmp_path / "rank0.log").write_text(text)
        rc = diagnose(tmp_path)["root_cause"]
        assert rc["signature"] == "unclassified-error" and "expected ident but found 'eof'" in rc["text"]


def test_logs_say_who_ended_the_job_when_a_scheduler_did(tmp_path):
    (tmp_path / "slurm-9.out").write_text(
        "step 1 loss 0.5\nslurmstepd: error: *** STEP 6053.0 ON node1 CANCELLED AT 2024-04-23T12:18:08 DUE TO TIME "
        "LIMIT ***\n")
    rep = diagnose(tmp_path)
    assert rep["ended_by"]["by"] == "scheduler" and rep["root_cause"]["signature"] == "scheduler-stopped"


# --------------------------------------------------------------------------- c10's log records; report heads

def test_a_c10_warning_with_an_unpadded_month_is_no_error_and_the_timeout_before_it_is_the_root(tmp_path):
    """c10's logging writes the month without its zero ("[W503 01:52:07..." is May 3): such a record is a warning
    like "[W0503 ...]", not an error, and its time is read (meta-pytorch/torchtune#2676's last lines)."""
    (tmp_path / "console.txt").write_text(
        "[rank2]:     work.wait()\n"
        "[rank2]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
        "1800000ms for recv operation to complete\n"
        "[W503 01:52:07.597517393 socket.cpp:204] [c10d] The hostname of the client socket cannot be retrieved. "
        "err=-3\n")
    rc = diagnose(tmp_path)["root_cause"]
    assert rc["signature"] == "gloo-timeout" and rc["rank"] == 2


def test_an_error_handlers_json_report_is_read_by_its_message_not_by_its_level(tmp_path):
    """torch elastic's error handler logs "[ERROR] <time> error_handler: {" and the error in the JSON's "message"
    lines after it (pytorch/pytorch#64926): the root is the message, never the bare level word."""
    (tmp_path / "console.txt").write_text(
        "[INFO] 2021-09-13 22:17:26,653 api: Starting elastic_operator with launch configs:\n"
        "  rdzv_endpoint    : 10.28.1.16\n\n"
        "[ERROR] 2021-09-13 22:18:26,678 error_handler: {\n"
        '  "message": {\n'
        '    "message": "RendezvousConnectionError: The connection to the C10d store has failed. See inner exception '
        'for details.",\n')
    rep = diagnose(tmp_path)
    rc = rep["root_cause"]
    assert rc["signature"] == "rendezvous-connect-failed" and "C10d store has failed" in rc["text"]
    assert not [f for f in rep["findings"] if f["signature"] == "unclassified-error"]


def test_a_folder_of_dumps_with_another_tools_meta_json_is_read_not_taken_for_a_run(tmp_path):
    """A folder holding someone's meta.json (many tools write one) is no ddptop run: its dumps and logs are read,
    and nothing crashes."""
    (tmp_path / "meta.json").write_text('{"tool": "gdb", "hung": true}\n')
    (tmp_path / "rank0.txt").write_text(
        "Thread 1 (Thread 0x7f0 (LWP 42)):\n"
        "#0  0x00007f1 in pthread_cond_timedwait@@GLIBC_2.3.2 () from /lib/x86_64-linux-gnu/libpthread.so.0\n"
        "#1  0x00007f2 in gloo::transport::tcp::UnboundBuffer::waitSend(int*, std::chrono::duration<long, "
        "std::ratio<1l, 1000l> >) () from /venv/torch/lib/libtorch_cpu.so\n"
        "#2  0x00007f3 in gloo::allgather(gloo::AllgatherOptions&) () from /venv/torch/lib/libtorch_cpu.so\n")
    r = subprocess.run([sys.executable, "-m", "ddptop", "diagnose", str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert "Traceback" not in r.stderr and r.returncode in (0, 1), r.stderr
    assert "waits in `gloo::allgather`" in r.stdout


def test_a_store_that_went_away_mid_run_is_the_peers_loss_not_the_root(tmp_path):
    """The rendezvous store's connection fails mid-run because its host died (another line says the peer reset
    the connection): a consequence, the peer is named; the same failure alone, at start, is the root (above)."""
    (tmp_path / "node1.log").write_text(
        "[rank3]: step 1200 loss 0.21\n"
        "[W1127 10:00:01.5 TCPStore.cpp:141] [c10d] recvValue failed on SocketImpl(fd=52, addr=[node1]:41230, "
        "remote=[node2]:29400): Connection reset by peer\n"
        '[E1127 10:00:02.0 api.py:1] RendezvousConnectionError: The connection to the C10d store has failed. See '
        'inner exception for details.\n')
    rep = diagnose(tmp_path)
    assert rep["root_cause"] is None or rep["root_cause"]["signature"] != "rendezvous-connect-failed", rep["root_cause"]


def test_open_mpis_own_signal_report_is_the_ranks_death_and_a_bus_error_is_not_taken_for_shm_alone(tmp_path):
    """Open MPI's handler on a rank's fatal signal ("Signal: Bus error (7)", under mpirun --tag-output), as in
    ChenRocks/UNITER#82 (an LMDB dataset read through mmap): the rank's death by SIGBUS, whose words name both
    usual causes (shared memory, a memory-mapped file), not a shared-memory finding from the word alone."""
    (tmp_path / "console.txt").write_text(
        "[1,0]<stderr>:08/15/2021 10:08:00 - INFO - __main__ -     Num steps = 6000\n"
        "[1,0]<stderr>:[1a62e574072d:00334] *** Process received signal ***\n"
        "[1,0]<stderr>:[1a62e574072d:00334] Signal: Bus error (7)\n"
        "[1,0]<stderr>:[1a62e574072d:00334] Signal code: Non-existant physical address (2)\n"
        "[1,0]<stderr>:[1a62e574072d:00334] [ 1] /opt/conda/lib/python3.6/site-packages/lmdb/cpython.cpython-36m-"
        "x86_64-linux-gnu.so(+0x128e0)[0x7f25aa5988e0]\n")
    rep = diagnose(tmp_path)
    rc = rep["root_cause"]
    assert rc["signature"] == "rank-signal" and rc["rank"] == 0 and "SIGBUS" in rc["explanation"], rc
    assert "memory-mapped" in rc["explanation"]
    assert not [f for f in rep["findings"] if f["signature"] == "shm-exhausted"]


def test_a_gpu_that_fell_off_the_bus_is_the_root_and_corrected_pcie_errors_are_not_errors(tmp_path):
    """rwth-i6/returnn#1486: the node of a hung job, its kernel log full of corrected PCIe errors, nvidia-smi unable
    to reach the GPU."""
    (tmp_path / "dmesg.txt").write_text(
        "[  +0.000316] pcieport 0000:00:03.0: AER: Corrected error received: 0000:00:03.0\n"
        "[  +0.000005] pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, "
        "(Transmitter ID)\n")
    (tmp_path / "nvidia-smi.txt").write_text(
        "zeyer@cn-234 ~ % nvidia-smi\nUnable to determine the device handle for GPU0000:03:00.0: Unknown Error\n")
    rep = diagnose(tmp_path)
    assert rep["root_cause"]["signature"] == "gpu-lost"
    assert not [f for f in rep["findings"] if f["signature"] == "unclassified-error"]


def test_a_rank_that_segfaults_is_said_with_where_it_crashed_and_its_report_is_no_hang_sample(tmp_path):
    """A real process here that segfaults under `-X faulthandler` (as a broken extension makes a rank do): the
    root is its death by SIGSEGV, with the frames faulthandler printed for the crashing thread (the innermost,
    and the user's own), and its thread dump is not judged as a hang's sample."""
    script = tmp_path / "train.py"
    script.write_text("import ctypes, threading, time\n"
                      "def next_batch():\n    time.sleep(60)\n"
                      "def train_step():\n    ctypes.string_at(0)\n"
                      "threading.Thread(target=next_batch, daemon=True).start()\n"
                      "time.sleep(0.2)\nprint('step 41 loss 0.3', flush=True)\ntrain_step()\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    with open(logs / "rank1.log", "w") as out:
        subprocess.run([sys.executable, "-X", "faulthandler", str(script)], stdout=out, stderr=subprocess.STDOUT,
                       timeout=60)
    rep = diagnose(logs)
    rc = rep["root_cause"]
    assert rc["signature"] == "rank-signal" and rc["rank"] == 1 and rc["detail"]["signal"] == "SIGSEGV", rc
    assert rc["detail"]["where"].startswith("__init__.py:") and "train.py:5 in train_step" in rc["detail"]["where"]
    assert rep["stacks"] is None or not rep["stacks"]["ranks"], rep["stacks"]


# --------------------------------------------------------------------------- a review's cases (torch's, SLURM's and
# Python's own formats; the lines as those tools print them)

_GLOO_RING = ('Thread 1 (Thread 0x7fa34c3ee700 (LWP {lwp}) "python"):\n'
              "#0  0x00007fa440cb3709 in pthread_cond_timedwait@@GLIBC_2.3.2 () from /lib/x86_64-linux-gnu/libpthread.so.0\n"
              "#1  0x00007fa317b97566 in gloo::transport::tcp::UnboundBuffer::{wait}(int*, std::chrono::duration<long, "
              "std::ratio<1l, 1000l> >) () from /venv/torch/lib/libtorch_cpu.so\n"
              "#2  0x00007fa317b6ca3a in gloo::allreduce(gloo::AllreduceOptions&) () from /venv/torch/lib/libtorch_cpu.so\n"
              "#3  0x00007fa317b6ca3b in c10d::ProcessGroupGloo::AsyncAllreduceWork::run() () from "
              "/venv/torch/lib/libtorch_cpu.so\n")


@pytest.mark.parametrize("files,root,rank", [
    pytest.param({"train.log": "[rank0]: step 10 loss 2.31\n[rank0]: Traceback (most recent call last):\n"
                  '[rank0]:   File "/opt/conda/lib/python3.10/site-packages/torch/multiprocessing/reductions.py", '
                  "line 568, in reduce_storage\n[rank0]:     fd, size = storage._share_fd_cpu_()\n"
                  "[rank0]: RuntimeError: unable to write to file </torch_1394_2747491098_0>: No space left on device "
                  "(28)\n"}, "shm-exhausted", 0, id="a-shared-tensors-file-is-shared-memory-not-a-disk"),
    pytest.param({"train.log": "Traceback (most recent call last):\n"
                  '  File "/opt/conda/lib/python3.9/multiprocessing/synchronize.py", line 57, in __init__\n'
                  "    sl = self._semlock = _multiprocessing.SemLock(\n"
                  "OSError: [Errno 28] No space left on device\n"}, "shm-exhausted", None,
                 id="a-semaphore-is-shared-memory-not-a-disk"),
    pytest.param({"train.log": "[rank1]: torch.AcceleratorError: CUDA error: CUDA-capable device(s) is/are busy or "
                  "unavailable\n[rank1]: Search for `cudaErrorDevicesUnavailable' in https://docs.nvidia.com/cuda/"
                  "cuda-runtime-api/group__CUDART__TYPES.html for more information.\n"}, "python-exception", 1,
                 id="a-busy-gpu-is-no-lost-gpu"),
    pytest.param({"node1.log": "INFO:torch.distributed.elastic.agent.server.api:Local worker group finished "
                  "(WorkerState.SUCCEEDED). Waiting 300 seconds for other agents to finish\n"
                  "WARNING:torch.distributed.elastic.rendezvous.dynamic_rendezvous:The node 'node1_4321_0' has failed "
                  "to shutdown the rendezvous '456' due to an error of type RendezvousConnectionError.\n"}, None, None,
                 id="torchruns-shutdown-warning-after-success-is-no-failure"),
    pytest.param({"slurm-123.out": "0: step 2 loss 2.2\n1: step 2 loss 2.2\nsrun: error: node1: task 0: Bus error\n"
                  "srun: error: node1: task 1: Aborted\n"}, "rank-signal", 0, id="srun-says-a-tasks-signal"),
    pytest.param({"wandb.log": "step 10 loss 0.5\nwandb: WARNING Failed to cache run history locally: [Errno 28] No "
                  "space left on device\nstep 11 loss 0.4\n"}, None, None, id="a-warning-is-no-full-disk"),
])
def test_a_reviews_cases_are_read_by_where_the_words_come_from(tmp_path, files, root, rank):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    rc = diagnose(tmp_path)["root_cause"]
    if root is None:
        assert rc is None, rc
    else:
        assert rc is not None and rc["signature"] == root and rc["rank"] == rank, rc


def test_ranks_of_a_ring_waiting_to_send_or_to_receive_in_one_allreduce_have_no_odd_one_out(tmp_path):
    for r, (lwp, wait) in enumerate([(41, "waitSend"), (42, "waitSend"), (43, "waitRecv")]):
        (tmp_path / f"rank{r}.gdb.txt").write_text(_GLOO_RING.format(lwp=lwp, wait=wait))
    st = diagnose(tmp_path)["stacks"]
    assert st["culprits"] == [] and {w["kind"] for w in st["ranks"].values()} == {"collective"}, st


def test_a_rank_that_prints_each_step_just_after_its_peer_still_goes_on_after_a_warning(tmp_path):
    """Rank 0's step k+1 always reaches the console before rank 1's step k (in step, one behind): rank 1's error
    line after its step 5, with both ranks going on to step 30, is a run that went on, not the root."""
    lines = []
    for k in range(1, 31):
        lines.append(f"[rank0]: step {k + 1} loss 0.5")
        lines.append(f"[rank1]: step {k} loss 0.5")
        if k == 5:
            lines.append("[rank1]: ERROR could not reach the metrics server; will send later")
    (tmp_path / "console.txt").write_text("\n".join(lines) + "\n")
    assert diagnose(tmp_path)["root_cause"] is None
