"""The catalogue of known failure signatures of distributed PyTorch jobs, and of
the reasons an NCCL warning gives for an NCCL error.

Each signature has a stable id, a pattern, a plain-words explanation, the
profiles to try and its level (how it ranks as a root cause).  The matcher
(``signatures``) reads lines against it; the ranking of findings
(``failure_ranking``) reads the levels.  The catalogue is data: an entry
added here is matched, ranked and shown with nothing else to change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# how a finding ranks as a root cause: lower is more likely the cause.  A known cause first; then an
# error no signature knows (an exception, any other error line: GENERIC); then how a rank ended (an exit
# code, a SIGKILL nobody explains: ENDED); then a timeout, which only says that a rank waited for another;
# consequences (a lost peer, a stop) are never the cause.  An unknown error comes before a timeout only if it
# came before it in time (root_cause).
CAUSE, GENERIC, ENDED, TIMEOUT, CONSEQUENCE, INFO = 0, 1, 2, 3, 4, 9


# a line a logger marks as a warning or as information, or a hint quoting an error's words: not the error itself
# (NCCL's WARN is its error level: never in this)
NOT_AN_ERROR_LINE = (r"(?<!NCCL )\bWARN(?:ING)?\b|\bINFO\b|^\[?[WI]\d{3,4} |^\[[WI] |\b\w*Warning\b|"
                     r"[Ww]arning:|\b[Nn]ote:|\b[Hh]int:|[Rr]etrying")


@dataclass(frozen=True)
class Signature:
    id: str
    pattern: re.Pattern
    explanation: str
    profiles: tuple[str, ...] = ()
    level: int = CAUSE
    # substrings one of which every match contains (None: no such set): a line
    # with none of them is not searched, which most training lines are not
    hints: tuple[str, ...] | None = None
    # a line this also matches is another signature's, not this one's (a full disk that is /dev/shm)
    unless: re.Pattern | None = None

    def search(self, text: str) -> re.Match | None:
        m = self.pattern.search(text)
        return m if m is not None and (self.unless is None or self.unless.search(text) is None) else None


def _s(id, rx, explanation, profiles=(), level=CAUSE, flags=0, unless=None):
    return Signature(id, re.compile(rx, flags), explanation, tuple(profiles), level, literal_hints(rx, flags),
                     re.compile(unless) if unless else None)


def literal_hints(rx: str, flags: int = 0, shortest: int = 3) -> tuple[str, ...] | None:
    """For each top-level alternative of ``rx``, its longest run of literal
    characters: any match contains one of them.  None when an alternative has
    no run of ``shortest`` characters (or the pattern ignores case)."""
    try:
        from re import _constants as C  # type: ignore[attr-defined]  # Python 3.11+
        from re import _parser as P  # type: ignore[attr-defined]
    except ImportError:  # 3.10
        import sre_constants as C
        import sre_parse as P
    if flags & re.IGNORECASE:
        return None
    try:
        tree = P.parse(rx, flags)
    except re.error:
        return None  # (a pattern the parser refuses: searched on every line, as without hints)
    items = list(tree)
    alternatives = items[0][1][1] if len(items) == 1 and items[0][0] is C.BRANCH else [items]
    hints = []
    for alt in alternatives:
        best, run = "", ""
        for op, av in list(alt) + [(None, None)]:
            if op is C.LITERAL:
                run += chr(av)
                continue
            best, run = max(best, run, key=len), ""
        if len(best) < shortest:
            return None
        hints.append(best)
    return tuple(hints)


# NCCL's InfiniBand completion warning, up to its status number (the formats of NCCL 2.x to 2.29)
_IB_COMPLETION = r"NET/IB ?: Got completion (?:from peer \S+ )?with (?:error |status=)(?:IBV_WC_\w+\()?"

CATALOG: list[Signature] = [
    _s("nccl-watchdog-timeout",
       # (a line a paste or a terminal cut is still the watchdog's: a number cut before its comma is unknown)
       r"Watchdog caught collective operation timeout(?:: WorkNCCL\((?:SeqNum=(?P<seq>\d+)(?=,)"
       r"(?:, OpType=(?P<op>\w+)(?P<op_end>[,)])?)?)?)?|"
       r"Timeout at NCCL work: (?P<seq_w>\d+)|"
       # (torch 2.5+: "Exception (either an error or timeout) detected by watchdog at work: N, last enqueued ...")
       r"Exception \(either an error or timeout\) detected(?: by watchdog at work: (?P<seq_x>\d+))?",
       "A collective did not finish within the NCCL timeout: at least one rank never joined it "
       "(hung, crashed, or stuck in a different collective). Compare the sequence numbers per rank: "
       "the rank with the lowest one fell behind.",
       ("flight-recorder", "nccl-debug", "p2p-off"), TIMEOUT),
    _s("nccl-heartbeat-timeout",
       r"[Hh]eartbeat monitor timed out|watchdog got stuck for \d+ seconds|Heartbeat .*timeout",
       "PyTorch's NCCL heartbeat monitor found the watchdog thread stuck (a collective or CUDA call never "
       "returned) and aborted the process.",
       ("flight-recorder", "nccl-debug"), TIMEOUT),
    _s("nccl-system-error", r"unhandled system error",
       "NCCL hit a system error (socket, shared memory, /dev/shm, IB or P2P setup). Run with NCCL_DEBUG=INFO to "
       "see which call failed; /dev/shm size and P2P are the usual suspects.",
       ("nccl-debug", "shm-off", "p2p-off")),
    _s("nccl-internal-error", r"NCCL error.*internal error|ncclInternalError",
       "NCCL reported an internal error, often a version mismatch between ranks or a broken transport.",
       ("nccl-debug", "p2p-off")),
    _s("nccl-cuda-error", r"unhandled cuda error|ncclUnhandledCudaError",
       "A CUDA call inside NCCL failed (often after another CUDA fault, a lost GPU, or P2P trouble).",
       ("nccl-debug", "p2p-off", "gloo")),
    _s("nccl-p2p-disabled", r"NCCL_P2P_DISABLE|P2P (?:is )?disabled|P2P.*not supported",
       "NCCL is not using GPU peer-to-peer: collectives go through host memory (slower, but avoids P2P hangs).",
       (), INFO),
    _s("nccl-socket-transport", r"NCCL INFO.*(?:NET/Socket|Using network Socket)",
       "NCCL chose the plain TCP socket transport: on multi-node jobs this usually means InfiniBand/RoCE was "
       "not found or not usable, and bandwidth will be low.",
       ("ib-off", "nccl-debug"), INFO),
    _s("gloo-timeout", r"[Gg]loo.*[Tt]imed out|gloo/transport/.*[Tt]imed out",
       "A gloo collective timed out (default 30 min): a rank never joined it.",
       ("fail-fast",), TIMEOUT),
    _s("peer-connection-reset",
       r"Connection reset by peer|Connection closed by (?:remote )?peer|connection refused by peer|"
       # (NCCL's socket calls to a peer that went away, misc/socket.cc: "socketProgressOpt: Call to send to
       # 10.0.0.3<44123> failed : Broken pipe"; older and other transports: "Call to recv failed : Broken pipe")
       r"Call to \w+(?: (?:to|from) \S+)? failed ?: ?Broken pipe|"
       r"RendezvousConnectionError|The connection to the C10d store has failed",
       "A rank lost its connection to another: almost always because that other rank died first. "
       "Look for the first rank that failed.",
       (), CONSEQUENCE, unless=r"failed to shutdown the rendezvous"),
    _s("nccl-comm-aborted", r"NCCL communicator was aborted|[Cc]ommunicator was aborted on rank",
       "This rank's NCCL communicator was aborted (by its watchdog after a timeout, or because of an error "
       "elsewhere): a consequence; look for the first failure.", (), CONSEQUENCE),
    _s("cuda-oom", r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA|CUDA error: out of memory|"
       r"Cuda failure '?out of memory|Failed to CUDA (?:calloc|malloc|host alloc)|cudaErrorMemoryAllocation",
       "A rank ran out of GPU memory.", ("single-gpu",)),
    _s("port-in-use", r"errno: 98 - Address already in use|EADDRINUSE|[Aa]ddress already in use",
       "The rendezvous/master port is taken (often a previous run still alive). Pick another --master-port "
       "or --rdzv-endpoint, or stop the old job.", ()),
    _s("rendezvous-connect-failed",
       r"RendezvousConnectionError|[Tt]he connection to the C10d store has failed|"
       r"[Ff]ailed to (?:connect to|create) (?:the )?(?:TCPStore|c10d store)",
       "This node's agent could not reach the rendezvous store (--rdzv-endpoint, or MASTER_ADDR:MASTER_PORT): "
       "the node hosting it was not up yet or is gone (its own log first), a wrong address or port, a firewall, "
       "or, on machines with several networks, a name that resolves to an address the other nodes cannot "
       "reach (give the endpoint as an IP they can reach; NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME pick the "
       "interface).", ("fail-fast",), TIMEOUT,
       # (torch's own shutdown after the job ended: the node holding the store left first; a warning, no failure)
       unless=r"failed to shutdown the rendezvous|" + NOT_AN_ERROR_LINE),
    _s("rendezvous-timeout",
       r"RendezvousTimeoutError|[Rr]endezvous.*timed? ?out|Timed out initializing process group|"
       r"TCPStore.*[Tt]imed? ?out|wait timeout after \d+ms, keys:|"
       r"The client socket has (?:timed out after|failed to connect to any network address)",
       "Ranks did not all arrive at the rendezvous in time (a node or rank crashed or did not start: look at "
       "its own log first; else a wrong address or port, or a firewall).", ("fail-fast",), TIMEOUT),
    _s("scheduler-stopped",
       r"\*\*\* (?:JOB|STEP) [\d.]+ ON \S+ CANCELLED AT \S+(?: DUE TO (?P<why>[A-Z][A-Z ]*[A-Z]))?",
       "The scheduler (SLURM) stopped the job: its time limit (DUE TO TIME LIMIT), preemption, a node failure, "
       "or scancel. The ranks' errors after this line are its consequences.", ()),
    _s("ddp-param-mismatch",
       r"DDP expects same model across all ranks|appears not to match sizes of the same param in process|"
       r"params\[\d+\] in this process with sizes",
       "The ranks built different models (shape or number of parameters differ), so DDP cannot average "
       "gradients. Check code paths that depend on rank, config or data.", ()),
    _s("tensor-size-mismatch",
       r"The size of tensor a \((?P<a>\d+)\) must match the size of tensor b \((?P<b>\d+)\)",
       "Two tensors had incompatible shapes; a zero-sized one often means an empty batch or shard on one rank.",
       ()),
    _s("shm-exhausted",
       r"insufficient shared memory|/dev/shm.*(?:[Nn]o space|too small)|NCCL WARN.*(?:shm|SHM)|"
       r"unable to (?:write|allocate|open).*shm|out of shared memory|"
       # (torch's shared-memory files of the data loader's tensors: /dev/shm/torch_*)
       r"unable to (?:write to|open) (?:shared memory )?(?:file|object) </?torch_",
       "Shared memory (/dev/shm) ran out: containers default to 64 MB, which breaks NCCL's SHM transport and "
       "DataLoader workers. Give the container more (--shm-size) or use fewer workers.",
       ("shm-off", "fewer-workers")),
    _s("disk-full",
       r"No space left on device|Not enough disk space|Disk quota exceeded|\bENOSPC\b|\bEDQUOT\b",
       "A disk filled up (or its quota ran out) while the job wrote to it: checkpoints, logs, a dataset's cache "
       "(~/.cache/huggingface), /tmp (torch.compile's and Triton's caches). `df -h` and `du -sh` on that node "
       "say which; point the checkpoint directory, HF_HOME or TMPDIR at a larger disk.",
       unless=r"/dev/shm|\bshm\b|\bSHM\b|shared memory|posix_fallocate|NCCL WARN|</?torch_|" + NOT_AN_ERROR_LINE),
    _s("gpu-lost",
       r"Unable to determine the device handle for GPU|GPU is lost\. Reboot|[Ff]allen off the bus",
       "A GPU dropped off its bus: the driver can no longer reach it (hardware, power, cooling or a PCIe link; "
       "`dmesg -T | grep -i -e xid -e aer` on the node shows when). Its rank waits or fails from then on; the node "
       "needs a reset and the GPU a check before it runs a job again: leave that node out.",
       # (the kernel's Xid line says it with the code and the pid: `xid`)
       unless=r"NVRM: Xid|" + NOT_AN_ERROR_LINE),
    _s("xid", r"NVRM: Xid \((?P<pci>PCI:[^)]*)\): (?P<xid>\d+)(?:, pid=(?P<pid>\d+))?|NVRM: Xid|\bXid\b.*\(PCI:",
       "The NVIDIA driver reported an Xid error: a GPU hardware or driver fault (79: the GPU fell off the bus; "
       "48, 63, 64, 94, 95: memory (ECC) errors; 13, 31, 43: usually an application's bad memory access; 74: "
       "NVLink). `pid` names the process it hit.", ("single-gpu",)),
    _s("nccl-not-available", r"Distributed package doesn't have NCCL built in|NCCL is not available|ProcessGroupNCCL is only supported with GPUs",
       "The script asks for the nccl backend but this PyTorch or machine has no NCCL/GPU. Run it on gloo.",
       ("gloo",)),
    _s("nccl-duplicate-gpu", r"Duplicate GPU detected : rank (?P<a>\d+) and rank (?P<b>\d+) both on CUDA device",
       "Two ranks on this node use the same GPU. The script does not call torch.cuda.set_device(LOCAL_RANK) "
       "before its first collective (or hard-codes cuda:0), or CUDA_VISIBLE_DEVICES gives every rank the same GPU, "
       "or there are more ranks per node than GPUs.", ()),
    _s("nccl-invalid-usage", r"ncclInvalidUsage|invalid usage \(run with NCCL_DEBUG",
       "NCCL was called in a way it does not allow; its 'Last error:' line says how (two ranks on one GPU, "
       "mismatched collectives, a communicator used after abort).", ("nccl-debug",), GENERIC),
    _s("nccl-remote-error", r"remote process exited or there was a network error|ncclRemoteError",
       "NCCL lost a peer: another rank died first (look for the first rank that failed), or, if none did, the "
       "network between nodes failed (the NET/IB or socket warning above it says which).",
       ("nccl-debug",), CONSEQUENCE),
    _s("nccl-net-plugin-error",
       r"NET/(?!IB\b|Socket\b)[A-Za-z][\w-]* ?:? .*?(?:completed with error|[Ee]rror(?: code)?[:=] ?-?[1-9])",
       "NCCL's network plugin (AWS OFI for EFA, or another NET plugin) reported a transfer that failed: a peer "
       "endpoint went away (look for the first rank that failed) or the fabric dropped the request "
       "(UNDELIVERABLE: the peer cannot be reached; check the fabric: `fi_info`, the EFA devices, the security "
       "group or firewall between the nodes).", ("nccl-debug",), unless=r"NCCL INFO"),
    _s("nccl-ib-error", _IB_COMPLETION + r"(?!5\b)(?P<status>\d+)",
       "An InfiniBand/RoCE transfer failed. Status 12 (retry exceeded) means the two NICs cannot reach each other "
       "or the link is bad or congested: check `ibstat` and the port counters, the RoCE GID index "
       "(NCCL_IB_GID_INDEX), or raise NCCL_IB_TIMEOUT. ib-off runs on TCP sockets to confirm.",
       ("ib-off", "nccl-debug")),
    _s("nccl-ib-flushed", _IB_COMPLETION + r"5\b",
       "InfiniBand work was flushed (status 5) because its connection had already failed: look for the first "
       "error before it, on this rank or a peer.", (), CONSEQUENCE),
    _s("ddp-unused-params", r"Expected to have finished reduction in the prior iteration before starting a new one",
       "A parameter got no gradient in the last step (an unused head, a branch not taken, an output left out of "
       "the loss), so DDP never finished reducing. Pass find_unused_parameters=True to DistributedDataParallel, or "
       "make every parameter take part in the loss (or freeze it). The line 'Parameter indices which did not "
       "receive grad' lists them; nccl-debug (TORCH_DISTRIBUTED_DEBUG=DETAIL) names them.", ("nccl-debug",)),
    _s("ddp-marked-twice", r"Expected to mark a variable ready only once|has been marked as ready twice",
       "A parameter's gradient hook fired twice in one backward: usually reentrant activation checkpointing "
       "(use use_reentrant=False), or a parameter shared between forward passes. static_graph=True in DDP is "
       "the other way out; nccl-debug (TORCH_DISTRIBUTED_DEBUG=DETAIL) names the parameter.", ("nccl-debug",)),
    _s("dataloader-worker-died",
       r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: (?!Terminated|Interrupt)(?P<signal>[\w ]+)|"
       r"DataLoader worker \(pid\(s\) [\d, ]+\) exited unexpectedly|"
       r"DataLoader worker \(pid \d+\) exited unexpectedly with exit code",
       "A data-loader worker process died. 'Killed' is almost always the kernel's OOM killer: the workers used up "
       "host memory (`dmesg` shows 'Out of memory: Killed process'); use fewer workers or a smaller "
       "prefetch_factor. 'Bus error' means /dev/shm is too small.", ("fewer-workers",)),
    _s("dataloader-transfer-failed", r"in rebuild_storage_fd$|received 0 items of ancdata",
       "A tensor from a data-loader worker could not be received: the worker died while handing it over (often "
       "the OOM killer; the traceback ends in a connection error), or the process ran out of file descriptors "
       "(`ulimit -n`; torch.multiprocessing.set_sharing_strategy('file_system') avoids them).", ("fewer-workers",)),
    _s("dataloader-worker-stopped",
       r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: (?P<signal>Terminated|Interrupt)",
       "A data-loader worker was stopped with the rest of its rank (torchrun stops a failed job's ranks by "
       "process group): a consequence; look for the first failure.", (), CONSEQUENCE),
    _s("cuda-fork", r"Cannot re-initialize CUDA in forked subprocess",
       "CUDA was used before a fork and then again in the child (a data-loader worker or a multiprocessing pool "
       "touching the GPU). Keep CUDA out of data-loader workers, or use the 'spawn' start method.", ()),
    _s("cuda-illegal-address", r"an illegal memory access was encountered|cudaErrorIllegalAddress",
       "A GPU kernel read or wrote outside its memory (a bad index, a custom or Triton kernel, a library bug). "
       "CUDA reports errors late, so the stack trace may name the wrong op: cuda-sync (CUDA_LAUNCH_BLOCKING=1) "
       "finds the real one. If it happens on one GPU or node only, suspect the hardware.", ("cuda-sync", "single-gpu")),
    _s("cuda-launch-failure",
       r"unspecified launch failure|cudaErrorLaunchFailure|CUDA_ERROR_LAUNCH_FAILED|"
       r"an illegal instruction was encountered|cudaErrorIllegalInstruction|"
       r"misaligned address|cudaErrorMisalignedAddress|hardware stack error|cudaErrorHardwareStackError",
       "A GPU kernel crashed on the device (an illegal instruction, a misaligned access or a fault the GPU "
       "reports only as a launch failure): a kernel's bug, a library built for another GPU, or the hardware. "
       "The kernel log of its node says which (`dmesg -T | grep -i xid`: Xid 13/31/43 are a program's fault, "
       "others the GPU's); cuda-sync (CUDA_LAUNCH_BLOCKING=1) names the op that launched it; on one GPU or node "
       "only, suspect the hardware.", ("cuda-sync", "single-gpu"), unless=NOT_AN_ERROR_LINE),
    _s("cuda-device-assert", r"device-side assert triggered|\.cu:\d+: [^\n]*?\bAssertion `[^\n]*` failed",
       "A GPU kernel's assertion failed, almost always an index out of range: a label >= the number of classes, "
       "a negative index, a token id past the embedding table. The 'Assertion ... failed' line names the kernel; "
       "cuda-sync (CUDA_LAUNCH_BLOCKING=1) names the op.", ("cuda-sync",)),
    _s("cuda-ecc", r"uncorrectable ECC error encountered|CUDA_ERROR_ECC_UNCORRECTABLE|cudaErrorECCUncorrectable",
       "The GPU's memory had an uncorrectable error: a hardware fault, not a code bug. Take the GPU or node out "
       "of service; `ddptop doctor` (GPU health) and `nvidia-smi -q -d ECC` show retired pages and remapped rows; "
       "it may need a reset or a reboot.", ("single-gpu",)),
    _s("cuda-fabric-manager",
       r"(?:Error 802: |CUDA error: |\(802\) : |Cuda failure (?:802 )?')system not yet initialized|code=802\b|"
       r"cudaErrorSystemNotReady",
       "CUDA cannot start (error 802): on an NVSwitch system (HGX/DGX) the nvidia-fabricmanager service is not "
       "running, has not finished, or is a different version from the driver. `systemctl status "
       "nvidia-fabricmanager`; install the fabric manager of the driver's exact version.", ()),
    _s("cuda-driver-mismatch",
       r"system has unsupported display driver / cuda driver combination|Driver/library version mismatch|"
       r"NVML/RM version mismatch",
       "The NVIDIA kernel module and the driver's libraries are different versions: the driver was upgraded "
       "without a reboot (or a container carries another driver's libraries). Reboot, or reload the nvidia "
       "kernel modules once nothing uses the GPUs.", ()),
    _s("cuda-driver-too-old",
       r"CUDA driver version is insufficient for CUDA runtime version|The NVIDIA driver on your system is too old",
       "This PyTorch build needs a newer NVIDIA driver than the one installed. Upgrade the driver, or install a "
       "PyTorch build for an older CUDA (the driver supports up to the CUDA version nvidia-smi shows).", ()),
    _s("store-clients-timeout",
       r"DistStoreError: Timed out after \d+ seconds waiting for clients\.? (?P<joined>\d+)/(?P<expected>\d+) "
       r"clients joined|[Tt]imed out (?:after \d+ seconds )?waiting for clients",
       "The rendezvous store waited for every rank and some never connected: they crashed or hung before "
       "init_process_group, started late (another node's torchrun), or cannot reach MASTER_ADDR:MASTER_PORT "
       "(firewall, wrong address or interface). Check the missing ranks' own logs first.",
       ("nccl-debug",), TIMEOUT),
    _s("collective-progress",
       r"last enqueued (?:NCCL )?work: (?P<enqueued>-?\d+), last completed (?:NCCL )?work: (?P<completed>-?\d+)",
       "PyTorch's per-rank collective counters at the timeout: the rank whose last enqueued collective is "
       "behind the others' never launched the collective they wait in; every rank at -1 means no collective "
       "was in flight (the processes were frozen, not waiting on the network).", (), INFO),
    _s("collective-mismatch",
       # (torch 1.10-1.13 said "is running inconsistent collective" and had no sequence number)
       r"Detected mismatch between collectives on ranks\. Rank (?P<rank_a>\d+) is running (?:inconsistent )?collective: "
       r"CollectiveFingerPrint\((?:SequenceNumber=(?P<seq_a>\d+), )?OpType=(?P<op_a>\w+)"
       r"(?:, TensorShape=(?P<shape_a>\[[^\]]*\]))?"
       r"(?:.*?but Rank (?P<rank_b>\d+) is running (?:inconsistent )?collective: CollectiveFingerPrint\("
       r"(?:SequenceNumber=(?P<seq_b>\d+), )?OpType=(?P<op_b>\w+)(?:, TensorShape=(?P<shape_b>\[[^\]]*\]))?)?",
       "The ranks called different collectives at the same point (TORCH_DISTRIBUTED_DEBUG=DETAIL's check): a code "
       "path that depends on the rank, its data or a condition that differs between ranks (an `if rank == 0` around a "
       "collective, an uneven last batch, a metric gathered on some ranks only).", ("nccl-debug",), GENERIC),
    _s("scheduler-oom-kill",
       r"Detected \d+ oom[-_ ]kill events?(?:\(s\))?|\btask \d+: Out Of Memory|oom[-_]kill event\(s\) in StepId|"
       r"Memory cgroup out of memory|Out of memory: Killed process|OOMKilled",
       "The kernel's OOM killer ended a process of the job: it ran out of memory on the host (RAM, not GPU "
       "memory), using more than its node or its cgroup (the scheduler's --mem, the container's limit) allows. The scheduler's stop that "
       "follows is its consequence. Fewer data-loader workers, a smaller prefetch_factor or a larger memory "
       "request.", ("fewer-workers",)),
    _s("nccl-ib-async-event", r"NET/IB ?: (?:\S+:\d+ )?(?:Got async event ?: ?|async fatal event on [^:]*: ?)"
                              r"(?P<event>[A-Za-z][\w ]*[A-Za-z])",
       "The InfiniBand/RoCE NIC reported an asynchronous event: a port error (the link went down or flapped), "
       "a GID table change (a RoCE address changed under the job), or a fatal device error. NCCL's transfers "
       "over that port fail after it. `ibstat`, the switch port and cable; ib-off runs on TCP sockets to confirm.",
       ("ib-off", "nccl-debug")),
    _s("nccl-no-algorithm", r"no algorithm/protocol available|[Nn]o algorithm (?:and|or|/) ?protocol",
       "NCCL found no algorithm and protocol for this collective: NCCL_ALGO or NCCL_PROTO (set in the job's "
       "environment) forces one this operation or topology cannot use (CollNet or NVLS without the hardware, "
       "Tree for an op it does not do). Unset them, or allow a fallback.", ("nccl-debug",)),
    # (NCCL's bootstrap, before any collective: "NCCL WARN Bootstrap : no socket interface found"; NET/ND's says
    # "... for out-of-band connections". Not NET/Socket's "no interface found", which a job on InfiniBand may
    # print and go on)
    _s("nccl-no-interface", r"no socket interface found",
       "NCCL found no network interface to bootstrap on: NCCL_SOCKET_IFNAME (or NCCL_SOCKET_FAMILY) names none "
       "that is up on this host, or the container has none but loopback. List them (`ip -br addr`) and set it "
       "to the one the nodes reach each other on (`NCCL_SOCKET_IFNAME=eth0`; `=eth0` for that name exactly, "
       "`^docker,lo` to leave some out), or unset it.", ("nccl-debug",)),
    _s("nccl-teardown",
       r"Some NCCL operations have failed or timed out|To avoid data inconsistency, we are taking the entire process down",
       "PyTorch's NCCL watchdog taking the process down after a collective failed or timed out: a consequence; the "
       "failure or timeout before it is the finding.", (), CONSEQUENCE),
    _s("launcher-task-ended",
       r"srun: error: \S+: tasks? (?P<tasks>[\d,\-]+): (?P<how>Exited with exit code (?P<code>\d+)|Terminated|Killed)",
       "SLURM's srun reporting how tasks (ranks) ended: what they printed before says why.", (), CONSEQUENCE),
    _s("launcher-stopping-ranks", r"sigkill_handler\] Killing subprocess \d+",
       "DeepSpeed's launcher stopping its ranks because one of them ended: its line `exits with return code = N` "
       "names that rank and how it ended, and the rank's own lines before it say why.", (), CONSEQUENCE),
    _s("child-failed", r"ChildFailedError|torch\.distributed\.elastic\.multiprocessing\.errors",
       "torchrun's summary that a rank failed (see the root cause it names).", (), CONSEQUENCE),
]

# InfiniBand async events that are not failures
BENIGN_IB_EVENT = re.compile(r"^(?:port active|client reregister|sm change|lid change)$", re.I)

# the prefilter: (hint, catalogue index), and the signatures searched on every line
HINTS = [(h, i) for i, sig in enumerate(CATALOG) if sig.hints is not None for h in sig.hints]
ALWAYS = frozenset(i for i, sig in enumerate(CATALOG) if sig.hints is None)


@dataclass(frozen=True)
class Reason:
    """What an NCCL warning says went wrong, in words, and the profile to try first."""

    id: str
    pattern: re.Pattern
    words: str
    profile: str


NCCL_REASONS: tuple[Reason, ...] = (
    Reason("p2p", re.compile(r"peer access|cudaIpc|CUDA IPC|IPC handle|P2P|p2p|cudaErrorPeerAccess", re.I),
           "NCCL's warning before it says GPU peer-to-peer failed (the GPUs cannot map each other's memory: "
           "peer access refused, IOMMU/ACS, a driver or virtualisation limit).", "p2p-off"),
    Reason("ib", re.compile(r"NET/IB|ibv_|IBV_WC|transport retry|mlx5|RoCE", re.I),
           "NCCL's warning before it says the InfiniBand/RoCE network failed (status 12: retry exceeded, the NICs "
           "cannot reach each other).", "ib-off"),
    Reason("shm", re.compile(r"/dev/shm|\bshm\b|shared memory|posix_fallocate|No space left on device", re.I),
           "NCCL's warning before it says shared memory (/dev/shm) failed: too small in a container.", "shm-off"),
    Reason("memory", re.compile(r"out of memory|cudaErrorMemoryAllocation|Failed to CUDA calloc|cuMemCreate|"
                                r"alloc(?:ation)? failed", re.I),
           "NCCL's warning before it says a GPU ran out of memory inside NCCL (its buffers did not fit next to the "
           "model: lower the batch size, or NCCL_BUFFSIZE / fewer channels).", "single-gpu"),
    Reason("socket", re.compile(r"NET/Socket|socket|Connection refused|Connection timed out|No route|"
                                r"Network is unreachable|bootstrap", re.I),
           "NCCL's warning before it says a TCP connection between ranks failed (firewall, a wrong interface: "
           "NCCL_SOCKET_IFNAME, or the peer is gone).", "nccl-debug"),
)

# the NCCL errors an NCCL warning just before them explains
EXPLAINED_BY_WARNINGS = frozenset({"nccl-system-error", "nccl-internal-error", "nccl-cuda-error", "nccl-invalid-usage",
                                   "nccl-remote-error", "nccl-ib-error"})
