import pytest

from ddptop.core.analysis.failure_ranking import root_cause
from ddptop.core.analysis.signatures import SignatureMatcher

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

# more real lines (from the users' logs quoted in the public issues named, or
# from this machine's torch), each with the signature it must raise
REAL_MORE = [
    # TORCH_DISTRIBUTED_DEBUG=DETAIL's check, printed by this machine's torch (2.13, gloo, 3 ranks, rank 2 broadcast
    # where the others all-reduced)
    ("collective-mismatch", 'RuntimeError: Detected mismatch between collectives on ranks. Rank 2 is running collective: CollectiveFingerPrint(SequenceNumber=1, OpType=BROADCAST, TensorShape=[4], TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, layout=Strided (default), requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt))), but Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, layout=Strided (default), requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt))).Collectives differ in the following aspects:   Op type: BROADCASTvs ALLREDUCE'),
    # slurmstepd, as in desihub/desitarget#628 and IGNF/myria3d#123 (with and without the reason)
    ("scheduler-stopped", "slurmstepd: error: *** STEP 32233190.0 ON nid01934 CANCELLED AT 2020-07-03T02:59:56 DUE TO "
                          "TIME LIMIT ***"),
    ("scheduler-stopped", "slurmstepd: error: *** STEP 6053.0 ON DEL2212S020 CANCELLED AT 2024-04-23T12:18:08 ***"),
    # ProcessGroupNCCL's NCCLComm::getNcclComm on a communicator its watchdog aborted
    ("nccl-comm-aborted", "[rank2]: torch.distributed.DistBackendError: NCCL communicator was aborted on rank 2.  "
                          "Original reason for failure was: [Rank 2] Watchdog caught collective operation timeout"),
    # pytorch reducer.cpp, as torch 2.13 prints it here (examples/train_ddp.py --fault unused-param)
    ("ddp-unused-params", "[rank0]: RuntimeError: Expected to have finished reduction in the prior iteration before "
                          "starting a new one. This error indicates that your module has parameters that were not used "
                          "in producing loss."),
    # johnsmith0031/alpaca_lora_4bit#46, shibing624/MedicalGPT#408
    ("ddp-marked-twice", "RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the "
                         "following reasons: 1) Use of a module parameter outside the `forward` function."),
    ("ddp-marked-twice", "[rank0]: Parameter at index 286 with name model.layers.23.mlp.down_proj.weight has been marked "
                         "as ready twice. This means that multiple autograd engine  hooks have fired"),
    # NVIDIA/Megatron-LM#661, horovod/horovod#3929
    ("nccl-duplicate-gpu", "Duplicate GPU detected : rank 3 and rank 0 both on CUDA device f000"),
    ("nccl-duplicate-gpu", "smc-gpu-03:29880:30398 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 2 and rank 0 "
                           "both on CUDA device 1000"),
    # NVIDIA/Megatron-LM#661 (the line before "Duplicate GPU detected")
    ("nccl-invalid-usage", "torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/pytorch/torch/csrc/distributed/"
                           "c10d/ProcessGroupNCCL.cpp:1727, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL "
                           "version 2.19.3"),
    # NVIDIA/nccl#2076
    ("nccl-remote-error", "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
                          "NCCLUtils.hpp:268, remote process exited or there was a network error, NCCL version 2.21.5"),
    ("nccl-remote-error", "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
                          "prematurely."),
    # NVIDIA/nccl#902, #1814, and the newest format
    ("nccl-ib-error", "NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129"),
    ("nccl-ib-error", "NCCL WARN NET/IB : Got completion from peer 10.0.3.4<55921> with status=12 opcode=1 len=0 "
                      "vendor err 129 (Send) localGid ::ffff:29.87.4.221"),
    ("nccl-ib-error", "NET/IB: Got completion from peer 100.126.0.9<4431> with status=IBV_WC_RETRY_EXC_ERR(12) "
                      "opcode=IBV_WC_RECV_RDMA_WITH_IMM(129) vendor_err=129  hca mlx5_3"),
    # a flush after the connection failed (a watchdog log quoted with NVIDIA/nccl#2076's kind of failure)
    ("nccl-ib-flushed", "NET/IB : Got completion from peer 10.42.0.2<47534> with error 5, opcode 48, len 32764, "
                        "vendor err 244"),
    # torch/csrc/DataLoader.cpp (Megatron-LM#1657) and dataloader.py (azadis/MC-GAN#19)
    ("dataloader-worker-died", "[rank0]: RuntimeError: DataLoader worker (pid 2637) is killed by signal: Killed. "),
    ("dataloader-worker-died", "RuntimeError: DataLoader worker (pid(s) 18360) exited unexpectedly"),
    # this machine's CI: a worker killed while it handed a tensor over (the frame line of the traceback);
    # pytorch/pytorch#973: out of file descriptors
    ("dataloader-transfer-failed", '[rank1]:   File "/tmp/ci/.venv/lib/python3.11/site-packages/torch/multiprocessing/'
                                   'reductions.py", line 538, in rebuild_storage_fd'),
    ("dataloader-transfer-failed", "RuntimeError: received 0 items of ancdata"),
    # open-mmlab/mmsegmentation#2085: a worker stopped with its rank
    ("dataloader-worker-stopped", "RuntimeError: DataLoader worker (pid 2911) is killed by signal: Terminated. "),
    # vllm-project/vllm#8893, flairNLP/flair#1316
    ("cuda-fork", "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
                  "you must use the 'spawn' start method"),
    # Bing-su/adetailer#346, the newest torch.AcceleratorError form, layumi/Person_reID_baseline_pytorch#372
    ("cuda-illegal-address", "RuntimeError: CUDA error: an illegal memory access was encountered"),
    ("cuda-illegal-address", "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"),
    ("cuda-device-assert", "RuntimeError: CUDA error: device-side assert triggered"),  # layumi/Person_reID_baseline_pytorch#372
    # kohya-ss/sd-scripts#1434
    ("cuda-ecc", "[E ProcessGroupNCCL.cpp:916] [Rank 1] NCCL watchdog thread terminated with exception: CUDA error: "
                 "uncorrectable ECC error encountered"),
    # microsoft/lisa#2823, huggingface/huggingface_hub#4134, pytorch/pytorch#35710
    ("cuda-fabric-manager", "UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run "
                            "some cuda functions before calling NumCudaDevices() that might have already set an error? "
                            "Error 802: system not yet initialized (Triggered internally at  "
                            "../c10/cuda/CUDAFunctions.cpp:112.)"),
    ("cuda-fabric-manager", "node1:1234:1290 [0] NCCL WARN Cuda failure 'system not yet initialized'"),
    ("cuda-fabric-manager", "RuntimeError: cuda runtime error (802) : system not yet initialized at /opt/conda/"
                            "conda-bld/pytorch_1579022034529/work/aten/src/THC/THCGeneral.cpp:50"),
    # easydiffusion/easydiffusion#379, nvidia-smi, pynvml (rapidsai/dask-cuda#949)
    ("cuda-driver-mismatch", "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions "
                             "before calling NumCudaDevices() that might have already set an error? Error 803: system "
                             "has unsupported display driver / cuda driver combination"),
    ("cuda-driver-mismatch", "Failed to initialize NVML: Driver/library version mismatch"),
    ("cuda-driver-mismatch", "pynvml.nvml.NVMLError_LibRmVersionMismatch: RM has detected an NVML/RM version mismatch."),
    # lllyasviel/Fooocus#1313, nagadomi/nunif#702
    ("cuda-driver-too-old", "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please "
                            "update your GPU driver by downloading and installing a new version"),
    ("cuda-driver-too-old", "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version"),
    # c10/cuda/CUDAException.cpp's "CUDA error: " + cudaGetErrorString(cudaErrorMemoryAllocation)
    ("cuda-oom", "RuntimeError: CUDA error: out of memory"),
    # torch on a CPU-only build asked for nccl; torchrun's failure summary
    ("nccl-not-available", "RuntimeError: Distributed package doesn't have NCCL built in"),
    ("child-failed", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"),
    # AILab-CVC/YOLO-World#163, GRL-Image-Restoration#27
    ("rendezvous-timeout", "[E socket.cpp:957] [c10d] The client socket has timed out after 600s while trying to "
                           "connect to (127.0.0.1, 3333)."),
    ("rendezvous-timeout", "[E socket.cpp:610] [c10d] The client socket has failed to connect to any network address "
                           "of (05, 40323)."),
    # torch/distributed/elastic/utils/store.py (barrier of the store-based rendezvous)
    ("store-clients-timeout", "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. "
                              "1/3 clients joined."),
    # ProcessGroupNCCL.cpp, torch 2.2-2.5 and 2.6+ wordings
    ("collective-progress", "[rank1]:[E1120 10:13:51.421811 ProcessGroupNCCL.cpp:616] [PG ID 0 PG GUID 0(default_pg) "
                            "Rank 1] Timeout at NCCL work: 4412, last enqueued NCCL work: 4412, last completed NCCL "
                            "work: 4411."),
    # the scheduler's reason for a stop: nextflow-io/nextflow#5932 (SLURM 23+: "oom_kill event"), lanl/PyBNF#118
    # (older: "oom-kill event(s) in step ... cgroup"), and srun's line for the task
    ("scheduler-oom-kill", "slurmstepd: error: Detected 1 oom_kill event in StepId=11300781.0. Some of the step tasks "
                           "have been OOM Killed."),
    ("scheduler-oom-kill", "slurmstepd: error: Detected 2 oom-kill event(s) in step 3756240.batch cgroup."),
    ("scheduler-oom-kill", "srun: error: sdumont6156: task 0: Out Of Memory"),
    # ProcessGroupNCCL::WorkNCCL::handleException's message (torch's source; the log line as users quote it, with
    # torch 1.x's location); srun's report of a task's end (SLURM's wording, as quoted in many job logs)
    ("nccl-teardown", "[E ProcessGroupNCCL.cpp:414] Some NCCL operations have failed or timed out. Due to the "
                      "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/"
                      "incomplete data."),
    ("launcher-task-ended", "srun: error: cn-0013: task 0: Exited with exit code 127"),
    ("launcher-task-ended", "srun: error: irene1949: task 0: Exited with exit code 1"),
    # NVIDIA/nccl#905 (a flapping link, as NCCL's maintainer read it), NVIDIA/nccl#1919 (a fatal QP event)
    ("nccl-ib-async-event", "NCCL WARN NET/IB : Got async event : port error"),
    ("nccl-ib-async-event", "node-0:139577:139678 [0] transport/net_ib.cc:154 NCCL WARN NET/IB : mlx5_1:1 async fatal "
                            "event on QP (0x7309dc3bb338): invalid request local work queue error"),
    # NVIDIA/TensorRT-LLM#953, NVIDIA/nccl#1709 (the newer wording names the function and datatype)
    ("nccl-no-algorithm", "dc:255756:255756 [3] enqueue.cc:1182 NCCL WARN Error : no algorithm/protocol available"),
    ("nccl-no-algorithm", "[rank238]: Error : no algorithm/protocol available for function AllGather with datatype "
                          "ncclInt8."),
    # NCCL's misc/socket.cc WARN ("socketProgressOpt: Call to %s %s failed : %s": send to a peer whose end closed),
    # and the form without the address that a Neuron (torch-xla) training script's comment quotes
    ("peer-connection-reset", "gpu-st-2:3322:3399 [1] misc/socket.cc:538 NCCL WARN socketProgressOpt: Call to send "
                              "to 10.0.1.27<50124> failed : Broken pipe"),
    ("peer-connection-reset", "Call to recv failed : Broken pipe"),
    # NCCL's bootstrap.cc (WARN "Bootstrap : no socket interface found"), as a public cluster guide quotes a vLLM
    # tensor-parallel job's failure on one node with a hard-coded NCCL_SOCKET_IFNAME
    ("nccl-no-interface", "NCCL WARN Bootstrap : no socket interface found"),
    ("collective-progress", "[rank0]:[E1120 10:13:51.42 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
                            "failure detected by watchdog at work sequence id: 4412 PG status: last enqueued work: 4412, "
                            "last completed work: 4411"),
    # hao-ai-lab/FastVideo#1008: the watchdog thread ends on a kernel's launch failure (c10's month unpadded: E113)
    ("cuda-launch-failure", "[rank9]:[E113 11:43:02.241131296 ProcessGroupNCCL.cpp:1899] [PG ID 5 PG GUID "
                            "55(mesh_replicate) Rank 1] Process group watchdog thread terminated with exception: CUDA "
                            "error: unspecified launch failure"),
    # pytorch/pytorch#64926: torch elastic's error handler, on an agent that could not reach the store
    ("rendezvous-connect-failed", '    "message": "RendezvousConnectionError: The connection to the C10d store has '
                                  'failed. See inner exception for details.",'),
    # NVIDIA/nccl#1928: AWS OFI's reason under an ncclRemoteError ("Last error:")
    ("nccl-net-plugin-error", "[rank3]: NET/OFI Request 0x7f14cc5b60c0 completed with error. RC: 113. Error: 2 "
                              "(UNDELIVERABLE). Completed length: 0"),
    # zai-org/ChatGLM2-6B#463 (datasets' own words), and the kernel's
    ("disk-full", "OSError: Not enough disk space. Needed: Unknown size (download: Unknown size, generated: Unknown "
                  "size, post-processed: Unknown size)"),
    ("disk-full", "OSError: [Errno 28] No space left on device"),
    # rwth-i6/returnn#1486: nvidia-smi on the node of a hung job whose GPU dropped off the bus
    ("gpu-lost", "Unable to determine the device handle for GPU0000:03:00.0: Unknown Error"),
    # deepspeedai/DeepSpeed#2946: the launcher's teardown after a rank died
    ("launcher-stopping-ranks", "[2023-03-05 06:40:25,173] [INFO] [launch.py:318:sigkill_handler] Killing subprocess "
                                "3698707"),
]


@pytest.mark.parametrize("sig,line", sorted(REAL.items()) + REAL_MORE)
def test_each_signature_matches_its_real_text(sig, line):
    found = {f.signature for f in SignatureMatcher().feed(line, 1)}
    assert sig in found, found


def test_every_signature_has_a_real_line_and_names_only_profiles_that_exist():
    from ddptop.core.run.profiles import BUILTIN
    from ddptop.core.analysis.signature_catalog import CATALOG

    tested = set(REAL) | {s for s, _ in REAL_MORE}
    untested = [s.id for s in CATALOG if s.id not in tested]
    assert not untested, f"signatures with no real line in the tests: {untested}"
    names = {p.name for p in BUILTIN}
    assert {p for s in CATALOG for p in s.profiles} <= names


@pytest.mark.parametrize("line", [
    # a per-address connect warning that torch retries (often harmless)
    "[W socket.cpp:558] [c10d] The client socket has failed to connect to [localhost]:29500 (errno: 99 - Cannot "
    "assign requested address).",
    "INFO logging system not yet initialized, buffering messages",
    # NCCL's InfiniBand set-up lines, and a connect retry torch recovers from
    "node1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>",
    "[W socket.cpp:663] [c10d] The client socket has failed to connect to [node0]:29500 (errno: 110 - Connection "
    "timed out).",
])
def test_near_misses_raise_nothing(line):
    assert SignatureMatcher().feed(line, 1) == []


def test_two_ranks_on_one_gpu_is_the_root_cause_not_nccls_invalid_usage():
    m = SignatureMatcher()
    fs = m.feed(next(line for sig, line in REAL_MORE if sig == "nccl-invalid-usage"), 1)
    fs += m.feed("ncclInvalidUsage: This usually reflects invalid usage of NCCL library.", 1)
    fs += m.feed("Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000", 1)
    rc = root_cause(fs)
    assert rc.signature == "nccl-duplicate-gpu" and rc.detail.matched == {"a": "1", "b": "0"}


def test_watchdog_reports_the_sequence_number():
    (f,) = [f for f in SignatureMatcher().feed(REAL["nccl-watchdog-timeout"], 1) if f.signature == "nccl-watchdog-timeout"]
    assert f.detail.matched == {"seq": "1580", "op": "ALLREDUCE"} and f.rank == 1


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
    assert rc.signature == "rank-signal" and rc.rank == 5 and rc.detail.signal == "SIGSEGV"
    assert "gloo" in rc.suggested_profiles
    sigterm = [f for f in fs if f.signature == "rank-signal" and f.rank == 0]
    assert sigterm and sigterm[0].detail.signal == "SIGTERM"


def test_failure_summary_gives_each_named_rank_its_exit_code():
    from ddptop.core.analysis.signatures import failure_summary

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


def test_the_literal_prefilter_finds_what_every_pattern_finds():
    """Lines are searched only by the signatures whose literal hints they
    contain; on every real line the result equals searching with all of them."""
    from ddptop.core.analysis.progress import clean
    from ddptop.core.analysis.signature_catalog import CATALOG, literal_hints

    assert all(s.hints for s in CATALOG), [s.id for s in CATALOG if not s.hints]  # no signature searched on every line
    lines = list(REAL.values()) + [line for _, line in REAL_MORE] + TORCHRUN_SUMMARY.splitlines()
    for line in lines:
        everything = {s.id for s in CATALOG if s.search(clean(line))}
        found = {f.signature for f in SignatureMatcher().feed(line, 1)} - {"rank-signal", "rank-exit", "python-exception"}
        assert found == everything, line
    # the hints themselves: per top-level alternative, its longest literal run
    assert literal_hints(r"[Hh]eartbeat monitor timed out|watchdog got stuck for \d+ seconds") == (
        "eartbeat monitor timed out", "watchdog got stuck for ")
    assert literal_hints(r"DataLoader worker \(pid \d+\)|DataLoader worker \(pid\(s\)") == ("DataLoader worker (pid",)
    assert literal_hints(r"\bXid\b|ab") is None  # an alternative without 3 literal characters: no prefilter


def test_teardown_noise_after_a_failure_is_not_the_root_cause():
    """torchrun stops the other ranks by process group, so their data-loader
    workers die of SIGTERM; InfiniBand work is flushed after a failed link."""
    m = SignatureMatcher()
    fs = m.feed("RuntimeError: DataLoader worker (pid 2911) is killed by signal: Terminated. ", 0)
    fs += m.feed("NET/IB : Got completion from peer 10.0.0.2<47534> with error 5, opcode 48, len 32764, vendor err 244", 0)
    fs += m.feed("NET/IB : Got completion from peer 10.0.0.3<5521> with error 12, opcode 0, len 0, vendor err 129", 1)
    fs += m.feed("RuntimeError: DataLoader worker (pid 2937) is killed by signal: Killed. ", 2)
    assert [f.signature for f in fs if f.signature != "python-exception"] == [
        "dataloader-worker-stopped", "nccl-ib-flushed", "nccl-ib-error", "dataloader-worker-died"]
    rc = root_cause(fs)
    assert (rc.signature, rc.rank) == ("nccl-ib-error", 1)


# a watchdog timeout cascade as it reaches a person: the timeout, PyTorch's counters, the
# SIGABRT the watchdog raises, torchrun's failure summary naming that SIGABRT as first failure
CASCADE = [
    (0, "[rank0]:[E1120 10:13:51 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=4412, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600015 "
        "milliseconds before timing out."),
    (0, "[rank0]:[E1120 10:13:51 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID 0(default_pg) Rank 0] failure detected "
        "by watchdog at work sequence id: 4412 PG status: last enqueued work: 4412, last completed work: 4411"),
    (2, "[rank2]:[E1120 10:13:51 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID 0(default_pg) Rank 2] failure detected "
        "by watchdog at work sequence id: 4412 PG status: last enqueued work: 4412, last completed work: 4411"),
    (1, "[rank1]:[E1120 10:13:51 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID 0(default_pg) Rank 1] failure detected "
        "by watchdog at work sequence id: 4411 PG status: last enqueued work: 4411, last completed work: 4411"),
    (0, "[rank0]: torch.distributed.DistBackendError: [Rank 0] Watchdog caught collective operation timeout"),
    (None, "Root Cause (first observed failure):"),
    (None, "[0]:"),
    (None, "  time      : 2025-11-20_10:13:58"),
    (None, "  rank      : 0 (local_rank: 0)"),
    (None, "  exitcode  : -6 (pid: 4242)"),
    (None, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"),
]


def test_a_watchdog_cascade_has_the_timeout_as_its_root_and_the_counters_name_the_rank_behind():
    from ddptop.core.analysis.failure_ranking import collective_counters, counter_verdict

    m, findings = SignatureMatcher(), []
    for i, (rank, line) in enumerate(CASCADE, 1):
        findings += m.feed(line, rank, i, "log")
    rc = root_cause(findings)
    assert rc is not None and rc.signature == "nccl-watchdog-timeout", rc
    culprits, said = counter_verdict(collective_counters(findings))
    assert culprits == (1,) and "rank 1 stopped at #4411" in said and "#4412" in said


def test_every_rank_at_minus_one_means_frozen_outside_communication_and_a_rank_in_the_message_counts():
    from ddptop.core.analysis.failure_ranking import collective_counters, counter_verdict

    lines = [f"[PG ID 0 PG GUID 0(default_pg) Rank {r}] failure detected by watchdog at work sequence id: 0 "
             f"PG status: last enqueued work: -1, last completed work: -1" for r in range(3)]
    m, findings = SignatureMatcher(), []
    for i, line in enumerate(lines, 1):
        findings += m.feed(line, None, i, "log")
    assert sorted(f.rank for f in findings if f.signature == "collective-progress") == [0, 1, 2]
    culprits, said = counter_verdict(collective_counters(findings))
    assert culprits == () and "no collective was in flight" in said
    (f,) = [f for f in SignatureMatcher().feed(
        "[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
        "OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=1800000)", None) if f.signature == "nccl-watchdog-timeout"]
    assert f.rank == 3


def test_a_store_timeout_waiting_for_clients_is_its_own_root_cause():
    m = SignatureMatcher()
    findings = m.feed("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/3 "
                      "clients joined.", 0, 1, "log")
    rc = root_cause(findings)
    assert rc is not None and rc.signature == "store-clients-timeout" and rc.detail.matched["joined"] == "1"


def test_a_line_the_signature_matcher_fails_on_is_noted_once_and_later_lines_are_still_matched(monkeypatch):
    """A matcher bug on some lines must neither pass silently nor turn signature
    detection off: one warning note, and the signatures after still alarm."""
    from ddptop.core.analysis.analyzer import Analyzer
    from ddptop.core.model.events import AlarmEvent, NoteEvent
    from helpers import log_line, matcher_fails_on

    matcher_fails_on(monkeypatch)
    an = Analyzer(lambda: 0.0)
    lines = ["BAD line", "step 1", "BAD again", REAL["cuda-oom"], "BAD once more", REAL["port-in-use"]]
    out = []
    for i, text in enumerate(lines):
        out += an.feed([log_line(float(i), rank=None, text=text, path="torchrun.log")])
    notes = [e for e in out if isinstance(e, NoteEvent)]
    assert len(notes) == 1, notes
    assert notes[0].level == "warning" and notes[0].t == 0.0
    assert notes[0].message.startswith("signature matcher failed on line 1 of torchrun's output: KeyError: 'boom'")
    assert [a.id for a in out if isinstance(a, AlarmEvent)] == ["cuda-oom", "port-in-use"]


# -- the cause, not its consequences ----------------------------------------------------------------

def _feed(lines):
    m = SignatureMatcher()
    return [f for i, (rank, text) in enumerate(lines) for f in m.feed(text, rank, i + 1)]


def test_a_rank_that_failed_on_its_own_beats_the_timeouts_of_the_ranks_that_waited_for_it():
    """Rank 2 raised an exception no signature knows; ranks 0 and 1 timed out waiting in the next
    collective ten minutes later, and their lines come first in the file: rank 2 is the cause."""
    fs = _feed([(0, REAL["nccl-watchdog-timeout"].replace("rank1", "rank0").replace("Rank 1", "Rank 0")),
                (1, REAL["nccl-watchdog-timeout"]),
                (2, "[rank2]: FileNotFoundError: [Errno 2] No such file or directory: '/data/shard_0007.tar'")])
    rc = root_cause(fs)
    assert rc.signature == "python-exception" and rc.rank == 2
    # alone, the timeout is the finding
    assert root_cause(fs[:1]).signature == "nccl-watchdog-timeout"


def test_an_exception_that_says_a_wait_ran_out_is_a_timeout_not_a_failure_of_its_own():
    fs = _feed([(0, "[rank0]: TimeoutError: timed out waiting for the barrier"),
                (1, "[rank1]: KeyError: 'pixel_values'")])
    assert root_cause(fs).rank == 1


def test_only_consequences_is_no_root_cause():
    """A clean run whose teardown logged a reset connection, or a rank stopped from outside: no
    failure is named (and diagnose exits 0)."""
    fs = _feed([(1, "[rank1]:[W TCPStore.cpp:131] [c10d] recvValue failed on SocketImpl(fd=77): "
                    "Connection reset by peer"),
                (0, "[rank0]: KeyboardInterrupt")])
    assert fs and root_cause(fs) is None


def test_a_communication_error_after_a_lost_peer_is_the_consequence_of_the_rank_that_died():
    """Rank 0's NCCL 'unhandled system error' whose last error says the remote peer closed the
    connection is a consequence when rank 3 failed on its own; with no such rank it stays the cause."""
    system = REAL["nccl-system-error"]
    lost = "socketProgressOpt: Call to recv from 10.0.0.2<43127> failed : Connection closed by remote peer"
    oom = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    fs = _feed([(0, system), (0, lost), (3, oom)])
    assert root_cause(fs).signature == "cuda-oom" and root_cause(fs).rank == 3
    fs = _feed([(0, system), (0, lost)])
    assert root_cause(fs).signature == "nccl-system-error"
    segv = _feed([(0, "NET/IB : Got completion from peer 10.0.0.2<1234> with error 12, opcode 0, len 0"),
                  (0, "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting"),
                  (3, "Fatal Python error: Segmentation fault")])
    assert root_cause(segv).signature == "rank-signal" and root_cause(segv).rank == 3


def test_how_a_rank_ended_is_the_consequence_of_what_its_own_log_says():
    """torchrun's summary says rank 1 died of SIGABRT (or exited 1); its own log says why (a CUDA
    device-side assert, a ZeroDivisionError): that is the cause."""
    summary = TORCHRUN_SUMMARY.replace("rank      : 5 (local_rank: 1)", "rank      : 1 (local_rank: 1)")
    abort = summary.replace("exitcode  : -11", "exitcode  : -6").replace("Signal 11 (SIGSEGV)", "Signal 6 (SIGABRT)")
    fs = _feed([(1, "[rank1]: RuntimeError: CUDA error: device-side assert triggered")]
               + [(None, l) for l in abort.splitlines()])
    assert any(f.signature == "rank-signal" and f.detail.signal == "SIGABRT" for f in fs)
    assert root_cause(fs).signature == "cuda-device-assert"
    exit1 = summary.replace("exitcode  : -11 (pid: 9295)", "exitcode  : 1 (pid: 9295)").replace(
        "traceback : Signal 11 (SIGSEGV) received by PID 9295", "traceback : To enable traceback see: ...")
    fs = _feed([(1, "[rank1]: ZeroDivisionError: division by zero")] + [(None, l) for l in exit1.splitlines()])
    assert root_cause(fs).signature == "python-exception"


def test_among_equal_findings_the_rank_torchrun_saw_fail_first_wins():
    summary = TORCHRUN_SUMMARY.replace("exitcode  : -11", "exitcode  : 1").replace(
        "traceback : Signal 11 (SIGSEGV) received by PID 9295", "traceback : To enable traceback see: ...")
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    fs = _feed([(0, f"[rank0]: {oom}"), (5, f"[rank5]: {oom}")] + [(None, l) for l in summary.splitlines()])
    assert root_cause(fs).signature == "cuda-oom" and root_cause(fs).rank == 5


def test_a_process_dead_of_a_signal_says_so_in_its_own_last_words():
    for line, sig in (("Fatal Python error: Segmentation fault", "SIGSEGV"),
                      ("Segmentation fault (core dumped)", "SIGSEGV"),
                      ("/bin/sh: line 1: 48213 Bus error               python train.py", "SIGBUS"),
                      ("Fatal Python error: Aborted", "SIGABRT")):
        fs = SignatureMatcher().feed(line, 3)
        assert [(f.signature, f.rank, f.detail.signal) for f in fs if f.signature == "rank-signal"] == [
            ("rank-signal", 3, sig)], line
    assert SignatureMatcher().feed("Aborted training: loss is nan", 3) == []


def test_deepspeeds_launcher_names_the_first_rank_that_failed():
    line = ("[2024-03-01 10:00:01,000] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', "
            "'--local_rank=2', '--deepspeed'] exits with return code = -9")
    (f,) = SignatureMatcher().feed(line, None)
    assert f.signature == "rank-signal" and f.rank == 2 and f.detail.signal == "SIGKILL" and f.detail.root
    assert "OOM killer" in f.explanation and root_cause([f]) is f


def test_torchrun_tee_and_torch_prefixes_together_give_the_global_rank():
    (f,) = SignatureMatcher().feed("[default1]:[rank5]: ValueError: bad shard", None)
    assert f.rank == 5


def test_the_live_alarm_and_diagnose_name_the_same_culprit_of_a_rank_killed_by_sigkill():
    """A rank killed with SIGKILL (the OOM killer), nothing in its own log: torchrun's report names it.
    The live alarm (the analyzer, as the supervisor runs it) and ``ddptop diagnose`` (its report) name
    it alike: one culprit function serves both."""
    from ddptop.core.analysis.analyzer import Analyzer
    from ddptop.core.tools.diagnose import report
    from helpers import logs

    summary = TORCHRUN_SUMMARY.replace("exitcode  : -11", "exitcode  : -9").replace(
        "Signal 11 (SIGSEGV)", "Signal 9 (SIGKILL)")
    an = Analyzer(lambda: 10.0)
    alarms = an.feed([logs(1.0, 0, "step 1 loss 0.5"), logs(1.0, 5, "step 1 loss 0.5"),
                      logs(9.0, None, *summary.splitlines(), path="torchrun.log")])
    crash = [a for a in alarms if a.type == "crash"]
    assert crash and crash[-1].culprits == (5,), [(a.id, a.culprits) for a in alarms]
    assert report(an)["culprits"] == [5]


def test_no_interface_to_bootstrap_on_is_the_cause_of_the_internal_error_after_it():
    """NCCL's bootstrap finding no interface (NCCL_SOCKET_IFNAME naming none that is up) is the cause of the
    "internal error" PyTorch then raises; NET/Socket's own "no interface found", which a job on InfiniBand may
    print and go on, is not that cause."""
    m = SignatureMatcher()
    lines = ["node1:2310:2310 [0] NCCL INFO Bootstrap : Using eth9",
             "node1:2310:2310 [0] NCCL WARN Bootstrap : no socket interface found",
             "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, internal error, "
             "NCCL version 2.18.1"]
    found = [f for i, ln in enumerate(lines) for f in m.feed(ln, 0, i + 1)]
    rc = root_cause(found)
    assert rc is not None and rc.signature == "nccl-no-interface" and rc.line == 2, rc
    m = SignatureMatcher()
    lines = ["node1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>",
             "node1:1:1 [0] NCCL WARN NET/Socket : no interface found",
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]
    found = [f for i, ln in enumerate(lines) for f in m.feed(ln, 0, i + 1)]
    assert "nccl-no-interface" not in {f.signature for f in found}
    rc = root_cause(found)
    assert rc is not None and rc.signature == "cuda-oom", rc



def test_a_peer_that_went_away_under_nccls_send_is_named_by_its_address():
    """NCCL's send to a peer whose end closed (a broken pipe) is a lost peer, not a cause: the logs that hold only
    it name where the cause is, the peer's address."""
    from ddptop.core.analysis.culprits import lost_peers

    m = SignatureMatcher()
    lines = ["gpu-st-2:3322:3399 [1] misc/socket.cc:538 NCCL WARN socketProgressOpt: Call to send to "
             "10.0.1.27<50124> failed : Broken pipe",
             "RuntimeError: NCCL communicator was aborted on rank 1."]
    found = [f for i, ln in enumerate(lines) for f in m.feed(ln, 1, i + 1)]
    assert root_cause(found) is None
    assert lost_peers(found).peers == ("10.0.1.27:50124",)
