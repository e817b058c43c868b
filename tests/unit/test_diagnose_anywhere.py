"""`ddptop diagnose` on logs from anywhere (issue 26): one file with every rank
mixed in, other launchers' prefixes, the agent's exit lines, stops from outside,
the NCCL warnings that explain an error, collective mismatches and desyncs, logs
that hold only consequences, and pastes a terminal wrapped or flattened.

The texts are written in the shapes the tools document (their format strings),
not copied from anyone's log; the torchrun ones are printed by real torchrun runs
on this machine.

(What runs processes: tests/integration/test_diagnose_anywhere_e2e.py.)"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ddptop.core.tools.diagnose import analyze_paths, build_report, format_report, report


def diagnosed(tmp_path: Path, text: str, name: str = "pasted.log") -> tuple[dict, str]:
    f = tmp_path / name
    f.write_text(text)
    typed = build_report(analyze_paths([str(f)]))
    return typed.to_dict(), format_report(typed)


def flattened(text: str) -> str:
    """A paste that lost its newlines (several log lines on one line)."""
    return " ".join(text.splitlines()) + "\n"


def hard_wrapped(text: str, width: int = 80) -> str:
    """A terminal's wrap: every line cut at ``width`` characters."""
    return "".join(ln[i:i + width] + "\n" for ln in text.splitlines() for i in range(0, max(len(ln), 1), width))


def soft_wrapped(text: str, width: int = 100) -> str:
    """A chat or tracker's wrap: lines broken at the last space before ``width``."""
    return "".join(textwrap.fill(ln, width, break_long_words=False, break_on_hyphens=False) + "\n"
                   if ln.strip() else "\n" for ln in text.splitlines())


# ---- 1. progress from a single file: the job's, never rank 0's --------------------------------------------


@pytest.mark.parametrize("lines, step", [
    # tqdm, redrawn in place with \r (what a terminal capture or `tee` keeps)
    (["Training:  10%|█         | 100/1000 [00:30<04:30,  3.33it/s]\rTraining:  25%|██▌       | 250/1000 "
      "[01:15<03:45,  3.33it/s]\rTraining:  31%|███       | 312/1000 [01:33<03:26,  3.33it/s]"], 312),
    # Lightning's bar
    (["Epoch 3:  45%|████▌     | 450/1000 [02:01<02:28,  3.70it/s, v_num=0, train_loss=0.412]"], 450),
    (["Epoch 2 Batch 280 loss 1.913", "Epoch 2 Batch 300 loss 1.907"], 300),
    (["iter 1150/5000 lr 3.0e-4 loss 2.31", "iter 1200/5000 lr 3.0e-4 loss 2.29"], 1200),
    (["Train: 4 [ 350/1000 ( 35%)]  Loss: 0.532 (0.601)  Time: 0.412s", "Train: 4 [ 400/1000 ( 40%)]  Loss: 0.528"], 400),
    (["Epoch [2/10], Step [300/600], Loss: 0.2351"], 300),
])
def test_a_single_files_progress_is_the_jobs(tmp_path, lines, step):
    text = "\n".join(["2026-11-26 02:00:00 INFO starting", *lines,
                      "RuntimeError: NCCL communicator was aborted on rank 1."]) + "\n"
    rep, out = diagnosed(tmp_path, text)
    assert rep["job_progress"] == {"last_step": step}
    assert rep["progress"] == {}  # (never filed under rank 0)
    assert "Last training step (the job's" in out and str(step) in out


def test_the_same_text_saved_as_a_ranks_file_is_that_ranks_progress(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    (d / "rank0.log").write_text("Epoch 2 Batch 300 loss 1.907\n")
    (d / "rank1.log").write_text("Epoch 2 Batch 290 loss 1.911\n")
    rep = report(analyze_paths([str(d)]))
    assert rep["progress"] == {"0": {"last_step": 300}, "1": {"last_step": 290}} and rep["job_progress"] is None


def test_an_eval_bar_is_no_training_step(tmp_path):
    rep, _ = diagnosed(tmp_path, "iter 40/500 loss 2.1\nValidation: [ 90/100] loss 0.2\n")
    assert rep["job_progress"] == {"last_step": 40}


OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 3 has a total capacity of "
       "79.15 GiB of which 512.00 MiB is free.")


# ---- 2. other launchers' rank prefixes --------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [
    "[1,{r}]<stderr>:",  # Open MPI --tag-output
    "{r:>2}: ",  # srun --label, padded
    "[pod/trainer-worker-{r}/pytorch] ",  # kubectl logs --prefix (the pod names the rank here only by its index)
    "gpu-node-{r}: [rank{r}]: ",  # pdsh (DeepSpeed's multi-node launcher) around torch's own prefix
    "10.0.0.{r}: [rank{r}]: ",  # pdsh, the hosts as a hostfile of IPv4 addresses names them
])
def test_a_finding_under_another_launchers_prefix_carries_its_rank(tmp_path, prefix):
    lines = []
    for step in (10, 11):
        lines += [prefix.format(r=r) + f"step {step} loss 0.5" for r in range(4)]
    lines += [prefix.format(r=3) + "Traceback (most recent call last):",
              prefix.format(r=3) + '  File "train.py", line 120, in <module>',
              prefix.format(r=3) + OOM,
              prefix.format(r=0) + "step 12 loss 0.4"]
    rep, out = diagnosed(tmp_path, "\n".join(lines) + "\n")
    if "pod/" in prefix:
        # (a pod's name is a host, not a rank: the finding is the pod's, and no rank is guessed)
        assert rep["root_cause"]["signature"] == "cuda-oom"
        return
    assert rep["root_cause"]["signature"] == "cuda-oom" and rep["root_cause"]["rank"] == 3, out
    assert rep["culprits"] == [3]
    assert rep["progress"]["0"]["last_step"] == 12 and rep["progress"]["3"]["last_step"] == 11
    assert rep["root_cause"]["text"].startswith("torch.OutOfMemoryError")  # (the prefix is off the evidence)


def test_a_ray_workers_rank_comes_from_ray_trains_start_up_table(tmp_path):
    text = """\
(TorchTrainer pid=90211) Started distributed worker processes:
(TorchTrainer pid=90211) - (node_id=6f1c0e, ip=10.0.0.11, pid=90311) world_rank=0, local_rank=0, node_rank=0
(TorchTrainer pid=90211) - (node_id=9a0b4d, ip=10.0.0.12, pid=90412) world_rank=1, local_rank=0, node_rank=1
(RayTrainWorker pid=90311, ip=10.0.0.11) Setting up process group for: env:// [rank=0, world_size=2]
(RayTrainWorker pid=90412, ip=10.0.0.12) Setting up process group for: env:// [rank=1, world_size=2]
(RayTrainWorker pid=90412, ip=10.0.0.12) Traceback (most recent call last):
(RayTrainWorker pid=90412, ip=10.0.0.12) ValueError: Expected input batch_size (30) to match target batch_size (32).
(RayTrainWorker pid=90311, ip=10.0.0.11) RuntimeError: Connection closed by peer [10.0.0.12]:51234
"""
    rep, _ = diagnosed(tmp_path, text)
    assert rep["root_cause"]["signature"] == "python-exception" and rep["root_cause"]["rank"] == 1
    assert rep["culprits"] == [1]


def test_the_live_analysis_reads_the_same_prefixes():
    """One prefix parser: a launcher's output read live (no rank known for the file) files its lines by rank."""
    from ddptop.core.analysis.analyzer import Analyzer
    from helpers import logs

    an = Analyzer(clock=lambda: 0.0, detect_stalls=False)
    alarms = an.feed([logs(1.0, None, "[1,2]<stderr>:step 5 loss 0.2", "[1,2]<stderr>:" + OOM, path="mpirun.log")])
    assert [(a.id, a.ranks) for a in alarms if a.kind == "alarm"] == [("cuda-oom", (2,))]


AGENT_SIGKILL = """\
W1126 02:10:11.204000 7731 torch/distributed/run.py:793] *****************************************
[rank0]:step 40 loss 0.31
[rank1]:step 40 loss 0.30
W1126 02:14:52.118000 7731 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 7802 closing signal SIGTERM
E1126 02:14:52.533000 7731 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 1 (pid: 7803) of binary: /opt/conda/bin/python3.11
"""


# ---- 3. the agent's exit lines; a SIGKILL is most often the OOM killer ------------------------------------


def test_a_sigkill_seen_by_the_agent_names_the_rank_and_the_oom_killer(tmp_path):
    """A paste cut before torchrun's summary: the agent's own exit line says who died, and how."""
    rep, out = diagnosed(tmp_path, AGENT_SIGKILL)
    rc = rep["root_cause"]
    assert rc["signature"] == "rank-signal" and rc["rank"] == 1 and rc["detail"]["signal"] == "SIGKILL"
    assert rep["culprits"] == [1]
    assert "OOM killer" in out and "dmesg" in out and "data-loader workers" in out


SIGHUP = """\
[rank0]:Epoch 1 Batch 120 loss 2.01
[rank1]:Epoch 1 Batch 120 loss 2.03
W1126 03:01:44.010000 5120 torch/distributed/elastic/agent/server/api.py:704] Received Signals.SIGHUP death signal, shutting down workers
W1126 03:01:44.011000 5120 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 5191 closing signal SIGHUP
W1126 03:01:44.012000 5120 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 5192 closing signal SIGHUP
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.api.SignalException: Process 5120 got signal: 1
"""


# ---- 4. stops from outside the job ------------------------------------------------------------------------


def test_a_closed_terminal_is_the_root_and_progress_up_to_it_is_said(tmp_path):
    rep, out = diagnosed(tmp_path, SIGHUP)
    rc = rep["root_cause"]
    assert rc["signature"] == "outside-stop" and rc["detail"]["signal"] == "SIGHUP"
    assert rep["culprits"] == []  # (no rank failed)
    assert "nohup" in out and "tmux" in out
    assert rep["progress"] == {"0": {"last_step": 120}, "1": {"last_step": 120}}


def test_a_scheduler_stop_outranks_the_ranks_ends_it_causes(tmp_path):
    text = ("[rank0]:step 900 loss 0.1\n"
            "slurmstepd: error: *** STEP 48213.0 ON gpu-node-07 CANCELLED AT 2026-11-26T03:00:12 DUE TO TIME LIMIT ***\n"
            "W1126 03:00:12.500000 811 torch/distributed/elastic/agent/server/api.py:704] Received Signals.SIGTERM "
            "death signal, shutting down workers\n"
            "E1126 03:00:20.100000 811 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -15) "
            "local_rank: 0 (pid: 902) of binary: /usr/bin/python3\n")
    rep, _ = diagnosed(tmp_path, text)
    assert rep["root_cause"]["signature"] == "scheduler-stopped"
    assert rep["culprits"] == []


P2P = """\
[rank0]:step 1 loss 6.90
gpu-a:4411:4502 [1] transport/p2p.cc:275 NCCL WARN Cuda failure 'peer access is not supported between these two devices'
gpu-a:4411:4502 [1] NCCL WARN Failed to open CUDA IPC handle : 217 peer access is not supported between these two devices
[rank1]: Traceback (most recent call last):
[rank1]:   File "train.py", line 61, in <module>
[rank1]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5
[rank0]:[E1126 02:21:00.123000 4410 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5
E1126 02:21:02.000000 4400 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 0 (pid: 4410) of binary: /usr/bin/python3
Root Cause (first observed failure):
[0]:
  time      : 2026-11-26_02:21:02
  host      : gpu-a
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 4410)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 4410
============================================================
"""


# ---- 5. the NCCL warnings that explain an NCCL error ------------------------------------------------------


def test_a_ranks_own_nccl_error_explained_by_its_warning_outranks_the_aborts(tmp_path):
    rep, out = diagnosed(tmp_path, P2P)
    rc = rep["root_cause"]
    assert rc["signature"] == "nccl-cuda-error" and rc["rank"] == 1, out
    assert rc["suggested_profiles"][0] == "p2p-off"
    assert "peer access is not supported" in rc["detail"]["explained_by"][-1]["text"]
    assert rep["culprits"] == [1]
    assert "because:" in out and "peer access is not supported" in out


def test_an_infiniband_retry_error_chooses_ib_off(tmp_path):
    text = ("node-3:881:990 [2] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE\n"
            "node-3:881:990 [2] NCCL WARN NET/IB : Got completion from peer 10.20.0.4<41822> with status=12 "
            "opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:10.20.0.3 remoteGidsfe80::1\n"
            "[rank6]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system "
            "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\n")
    rep, _ = diagnosed(tmp_path, text)
    assert rep["root_cause"]["signature"] in ("nccl-ib-error", "nccl-system-error")
    assert rep["root_cause"]["suggested_profiles"][0] == "ib-off"


# ---- 6. collective mismatches and desyncs -----------------------------------------------------------------


def _detail_line(a: int, op_a: str, b: int, op_b: str, shape: str = "[4]") -> str:
    fp = ("CollectiveFingerPrint(SequenceNumber=7, OpType={op}, TensorShape={shape}, TensorDtypes=Float, "
          "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda, layout=Strided (default)))")
    return (f"[rank{a}]: RuntimeError: Detected mismatch between collectives on ranks. Rank {a} is running collective: "
            + fp.format(op=op_a, shape=shape) + f", but Rank {b} is running collective: " + fp.format(op=op_b, shape=shape)
            + f".Collectives differ in the following aspects: \t Op type: {op_a}vs {op_b}")


def test_a_collective_mismatch_names_the_odd_rank_and_both_operations(tmp_path):
    text = "\n".join([_detail_line(0, "ALLREDUCE", 2, "ALLGATHER"), _detail_line(1, "ALLREDUCE", 2, "ALLGATHER"),
                      _detail_line(2, "ALLGATHER", 0, "ALLREDUCE")]) + "\n"
    rep, out = diagnosed(tmp_path, text)
    rc = rep["root_cause"]
    assert rc["signature"] == "collective-mismatch" and rc["rank"] == 2 and rep["culprits"] == [2]
    assert "ALLGATHER" in out and "ALLREDUCE" in out


def test_a_two_rank_mismatch_names_no_culprit(tmp_path):
    text = _detail_line(0, "ALLREDUCE", 1, "BROADCAST") + "\n" + _detail_line(1, "BROADCAST", 0, "ALLREDUCE") + "\n"
    rep, out = diagnosed(tmp_path, text)
    assert rep["root_cause"]["signature"] == "collective-mismatch" and rep["culprits"] == []
    assert "no majority" in out and "BROADCAST" in out


def _watchdog(rank: int, seq: int, op: str) -> str:
    return (f"[rank{rank}]:[E1126 04:00:00.000000 100 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=1048576, NumelOut=1048576, "
            "Timeout(ms)=600000) ran for 600087 milliseconds before timing out.")


def test_timeouts_in_different_collectives_are_a_desync_with_the_odd_rank(tmp_path):
    text = "\n".join([_watchdog(0, 1234, "ALLREDUCE"), _watchdog(1, 1234, "ALLREDUCE"), _watchdog(2, 1233, "BROADCAST"),
                      _watchdog(3, 1234, "ALLREDUCE")]) + "\n"
    rep, out = diagnosed(tmp_path, text)
    assert rep["root_cause"]["signature"] == "collective-desync" and rep["culprits"] == [2]
    assert "#1233 (BROADCAST)" in out and "#1234 (ALLREDUCE)" in out


def test_a_two_rank_desync_names_how_they_disagree_and_no_culprit(tmp_path):
    rep, out = diagnosed(tmp_path, _watchdog(0, 88, "ALLREDUCE") + "\n" + _watchdog(1, 89, "ALLREDUCE") + "\n")
    assert rep["root_cause"]["signature"] == "collective-desync" and rep["culprits"] == []
    assert "#88" in out and "#89" in out


def test_timeouts_in_the_same_collective_are_no_desync(tmp_path):
    rep, _ = diagnosed(tmp_path, _watchdog(0, 88, "ALLREDUCE") + "\n" + _watchdog(1, 88, "ALLREDUCE") + "\n")
    assert rep["root_cause"]["signature"] == "nccl-watchdog-timeout"


# ---- 7. only consequences ---------------------------------------------------------------------------------


def test_only_consequences_name_the_lost_peer_and_what_to_collect(tmp_path):
    text = ("[rank0]:step 77 loss 0.3\n"
            "node-1:2211:2290 [0] NCCL WARN NET/Socket : peer 10.0.0.9<53311> message truncated\n"
            "[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process "
            "exited or there was a network error, NCCL version 2.20.5\n"
            "[rank0]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
            "prematurely.\n")
    rep, out = diagnosed(tmp_path, text)
    assert rep["root_cause"] is None and rep["culprits"] == []
    assert rep["lost_peers"]["reported_by"] == [0] and "10.0.0.9:53311" in rep["lost_peers"]["peers"]
    assert "10.0.0.9:53311" in out and "dmesg" in out


CASES = {
    "agent-sigkill": (AGENT_SIGKILL, "rank-signal", 1),
    "sighup": (SIGHUP, "outside-stop", None),
    "p2p": (P2P, "nccl-cuda-error", 1),
    "mismatch": ("\n".join([_detail_line(0, "ALLREDUCE", 2, "ALLGATHER"), _detail_line(1, "ALLREDUCE", 2, "ALLGATHER"),
                            _detail_line(2, "ALLGATHER", 0, "ALLREDUCE")]) + "\n", "collective-mismatch", 2),
    "mpirun-oom": ("".join(f"[1,{r}]<stdout>:step 3 loss 0.2\n" for r in range(3)) + f"[1,1]<stderr>:{OOM}\n",
                   "cuda-oom", 1),
}


# ---- 8. wrapped and flattened pastes keep working, for every class ----------------------------------------


@pytest.mark.parametrize("mangle", [flattened, hard_wrapped, soft_wrapped], ids=["flattened", "hard-wrap", "soft-wrap"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_mangled_paste_reads_as_the_original(tmp_path, case, mangle):
    text, sig, rank = CASES[case]
    rep, out = diagnosed(tmp_path, mangle(text))
    assert rep["root_cause"] is not None, out
    assert (rep["root_cause"]["signature"], rep["root_cause"]["rank"]) == (sig, rank), out


def test_a_paste_that_mixes_classes(tmp_path):
    """srun --label around torchrun's --tee on two nodes, an NCCL warning explaining rank 5's error, every rank's
    abort after it, a scheduler's stop at the end, and no summary (cut): flattened by a chat client."""
    lines = []
    for r in range(8):
        lines.append(f"{r // 4}: [rank{r}]:Epoch 1 Batch 500 loss 1.2")
    lines += ["1: node-b:3120:3199 [1] NCCL WARN NET/IB : Got completion from peer 10.9.0.1<40222> with status=12 "
              "opcode=1 len=0 vendor err 129 (Send) localGid ::ffff:10.9.0.2",
              "1: [rank5]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled "
              "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3"]
    lines += [f"{r // 4}: [rank{r}]:[E1126 05:00:00.000000 1 ProcessGroupNCCL.cpp:1595] [PG ID 0 Rank {r}] Process "
              "group watchdog thread terminated with exception: NCCL error: remote process exited or there was a "
              "network error" for r in (0, 1, 2, 3, 4, 6, 7)]
    lines += ["0: E1126 05:00:03.000000 77 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) "
              "local_rank: 0 (pid: 3001) of binary: /usr/bin/python3",
              "slurmstepd: error: *** STEP 9911.0 ON node-a CANCELLED AT 2026-11-26T05:01:00 ***"]
    for text in ("\n".join(lines) + "\n", flattened("\n".join(lines))):
        rep, out = diagnosed(tmp_path, text)
        rc = rep["root_cause"]
        assert (rc["signature"], rc["rank"]) in {("nccl-ib-error", 5), ("nccl-system-error", 5)}, out
        assert rc["suggested_profiles"][0] == "ib-off" and rep["culprits"] == [5]
        assert rep["progress"]["7"]["last_step"] == 500


# ---- the launchers' own word on ranks ---------------------------------------------------------------------


def test_mpiruns_reports_name_the_rank(tmp_path):
    signal_report = ("[1,0]<stdout>:step 8 loss 0.3\n[1,1]<stdout>:step 8 loss 0.3\n"
                     "--------------------------------------------------------------------------\n"
                     "mpirun noticed that process rank 1 with PID 30412 on node gpu-node-4 exited on signal 9 (Killed).\n"
                     "--------------------------------------------------------------------------\n")
    rep, out = diagnosed(tmp_path, signal_report)
    assert (rep["root_cause"]["signature"], rep["root_cause"]["rank"]) == ("rank-signal", 1) and rep["culprits"] == [1]
    assert "OOM killer" in out
    exit_report = ("--------------------------------------------------------------------------\n"
                   "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
                   "the job to be terminated. The first process to do so was:\n\n"
                   "  Process name: [[41877,1],3]\n  Exit code:    2\n"
                   "--------------------------------------------------------------------------\n")
    rep, _ = diagnosed(tmp_path, exit_report, "mpi-exit.log")
    assert (rep["root_cause"]["signature"], rep["root_cause"]["rank"]) == ("rank-exit", 3)


def test_a_second_nodes_local_ranks_are_its_global_ones(tmp_path):
    """Node 1's console: torch elastic's rendezvous block says local ranks 0-3 are global 4-7."""
    text = ("I1126 06:00:00.000000 900 torch/distributed/elastic/agent/server/api.py:525] [default] Rendezvous "
            "complete for workers. Result:\n  restart_count=0\n  master_addr=node-0\n  master_port=29500\n"
            "  group_rank=1\n  group_world_size=2\n  local_ranks=[0, 1, 2, 3]\n  role_ranks=[4, 5, 6, 7]\n"
            "  global_ranks=[4, 5, 6, 7]\n  role_world_sizes=[8, 8, 8, 8]\n  global_world_sizes=[8, 8, 8, 8]\n"
            "[default2]:step 40 loss 0.2\n"
            "E1126 06:10:00.000000 900 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
            "local_rank: 2 (pid: 9931) of binary: /usr/bin/python3\n")
    rep, _ = diagnosed(tmp_path, text)
    assert (rep["root_cause"]["rank"], rep["culprits"]) == (6, [6])
    assert rep["progress"] == {"6": {"last_step": 40}}


def test_deepspeeds_rank_mapping_makes_a_pdsh_hosts_local_rank_global(tmp_path):
    text = ("worker-0: [2026-11-26 06:00:00,000] [INFO] [launch.py:164:main] global_rank_mapping=defaultdict("
            "<class 'list'>, {'worker-0': [0, 1], 'worker-1': [2, 3]})\n"
            "worker-1: [2026-11-26 06:00:00,000] [INFO] [launch.py:164:main] global_rank_mapping=defaultdict("
            "<class 'list'>, {'worker-0': [0, 1], 'worker-1': [2, 3]})\n"
            "worker-0: [rank0]: step 12 loss 1.1\n"
            "worker-1: [2026-11-26 06:05:00,000] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python3', '-u', "
            "'train.py', '--local_rank=1', '--deepspeed'] exits with return code = -9\n")
    rep, _ = diagnosed(tmp_path, text)
    assert (rep["root_cause"]["signature"], rep["root_cause"]["rank"]) == ("rank-signal", 3)


def test_the_traceback_in_torchruns_summary_is_its_ranks(tmp_path):
    """Without rank prefixes, @record's error file in the Root Cause block says whose exception it was."""
    text = ("Traceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n"
            "KeyError: 'labels'\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
            "============================================================\ntrain.py FAILED\n"
            "------------------------------------------------------------\nFailures:\n  <NO_OTHER_FAILURES>\n"
            "------------------------------------------------------------\nRoot Cause (first observed failure):\n[0]:\n"
            "  time      : 2026-11-26_06:20:00\n  host      : node-0\n  rank      : 1 (local_rank: 1)\n"
            "  exitcode  : 1 (pid: 5512)\n  error_file: /tmp/torchelastic_x/none_y/attempt_0/1/error.json\n"
            "  traceback : Traceback (most recent call last):\n    File \"train.py\", line 40, in <module>\n"
            "      batch['labels']\n  KeyError: 'labels'\n"
            "============================================================\n")
    rep, _ = diagnosed(tmp_path, text)
    assert (rep["root_cause"]["signature"], rep["root_cause"]["rank"]) == ("python-exception", 1)
    assert rep["culprits"] == [1]


def test_torch_1x_inconsistent_collective_form(tmp_path):
    line = ("RuntimeError: Detected mismatch between collectives on ranks. Rank {a} is running inconsistent collective: "
            "CollectiveFingerPrint(OpType={op_a}, TensorShape=[1024], TensorDtypes=Float, "
            "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda)), but Rank {b} is running inconsistent "
            "collective: CollectiveFingerPrint(OpType={op_b}, TensorShape=[1024], TensorDtypes=Float, "
            "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda))")
    text = "".join(f"[rank{a}]: " + line.format(a=a, op_a=op, b=3, op_b="BARRIER") + "\n"
                   for a, op in ((0, "ALLREDUCE"), (1, "ALLREDUCE"), (2, "ALLREDUCE")))
    rep, out = diagnosed(tmp_path, text)
    assert rep["root_cause"]["signature"] == "collective-mismatch" and rep["culprits"] == [3]
    assert "BARRIER" in out


def test_a_rank_that_only_lost_its_peer_is_no_cause_even_when_torchrun_saw_it_fail_first(tmp_path):
    text = ("[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
            "[10.3.1.22]:41822\n"
            "[W1126 06:30:00.000 socket.cpp:464] [c10d] recvValue failed on SocketImpl(fd=21, addr=[10.3.1.21]:50022, "
            "remote=[10.3.1.22]:29500): Connection reset by peer\n"
            "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 77)\n"
            "============================================================\n")
    rep, out = diagnosed(tmp_path, text)
    assert rep["root_cause"] is None and rep["culprits"] == []
    assert rep["lost_peers"]["peers"][:2] == ["10.3.1.22:41822", "10.3.1.22:29500"]
    assert "10.3.1.21" not in " ".join(rep["lost_peers"]["peers"])  # (this side's own address)


def _summary(root: tuple[int, int], failures: list[tuple[int, int]]) -> str:
    """torchrun's agent's line and its failure report (torch.distributed.elastic's ChildFailedError summary), as
    torchrun prints them: (rank, exit code) of the first failure and of the others."""
    def entry(i, rank, code):
        return (f"[{i}]:\n  time      : 2024-05-01_10:00:01\n  host      : box\n  rank      : {rank} (local_rank: "
                f"{rank})\n  exitcode  : {code} (pid: {2200 + rank})\n  error_file: <N/A>\n  traceback : Signal "
                f"{-code} received by PID {2200 + rank}\n")
    return (f"[2024-05-01 10:00:01,000] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: "
            f"{root[1]}) local_rank: {root[0]} (pid: {2200 + root[0]}) of binary: /usr/bin/python\n"
            "Traceback (most recent call last):\n  File \"/usr/local/bin/torchrun\", line 8, in <module>\n"
            "    sys.exit(main())\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            + "=" * 60 + "\ntrain.py FAILED\n" + "-" * 60 + "\nFailures:\n"
            + "".join(entry(i + 1, r, c) for i, (r, c) in enumerate(failures))
            + "-" * 60 + "\nRoot Cause (first observed failure):\n" + entry(0, *root) + "=" * 60 + "\n")


@pytest.mark.parametrize("alone", [False, True], ids=["after-the-agent", "the-report-alone"])
def test_ranks_that_died_of_the_same_bus_error_have_no_odd_one_out(tmp_path, alone):
    """Two ranks killed by SIGBUS (shared memory gone on their node): torchrun names the first, but the second's
    SIGBUS is no stop of torchrun's (it sends SIGTERM): the same failure on both, no culprit. A rank torchrun
    stopped after the first one's segfault is that one's consequence: the first is the culprit.  The report
    pasted alone (short lines between its 60-character rules: no wrapped paste) reads the same."""
    def cut(text):
        return text[text.index("torch.distributed.elastic.multiprocessing.errors"):] if alone else text

    rep, out = diagnosed(tmp_path, cut(_summary((0, -7), [(1, -7)])))
    assert rep["root_cause"]["signature"] == "rank-signal" and rep["culprits"] == [], out
    assert "no odd one out" in out
    rep, out = diagnosed(tmp_path, cut(_summary((0, -11), [(1, -15)])))
    assert rep["root_cause"]["rank"] == 0 and rep["culprits"] == [0], out
