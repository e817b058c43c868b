"""Known failure signatures of distributed PyTorch jobs.

Each signature has a stable id, a plain-words explanation, and the profiles or
actions to try.  :class:`SignatureMatcher` is fed lines (with the rank they
came from) and returns :class:`Finding` objects; :func:`root_cause` tells the
cause from its consequences (the teardown noise after a crash or timeout).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ddptop.core.analysis.prefixes import RankMapping, split
from ddptop.core.analysis.progress import clean

# how a finding ranks as a root cause: lower is more likely the cause.  A known cause first; then an
# error no signature knows (an exception, any other error line: GENERIC); then how a rank ended (an exit
# code, a SIGKILL nobody explains: ENDED); then a timeout, which only says that a rank waited for another;
# consequences (a lost peer, a stop) are never the cause.  An unknown error comes before a timeout only if it
# came before it in time (root_cause).
CAUSE, GENERIC, ENDED, TIMEOUT, CONSEQUENCE, INFO = 0, 1, 2, 3, 4, 9


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


def _s(id, rx, explanation, profiles=(), level=CAUSE, flags=0):
    return Signature(id, re.compile(rx, flags), explanation, tuple(profiles), level, literal_hints(rx, flags))


def literal_hints(rx: str, flags: int = 0, shortest: int = 3) -> tuple[str, ...] | None:
    """For each top-level alternative of ``rx``, its longest run of literal
    characters: any match contains one of them.  None when an alternative has
    no run of ``shortest`` characters (or the pattern ignores case)."""
    try:
        from re import _constants as C  # Python 3.11+
        from re import _parser as P
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
       r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
       r"(?P<op_end>[,)])?|"
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
       r"RendezvousConnectionError|The connection to the C10d store has failed",
       "A rank lost its connection to another: almost always because that other rank died first. "
       "Look for the first rank that failed.",
       (), CONSEQUENCE),
    _s("nccl-comm-aborted", r"NCCL communicator was aborted|[Cc]ommunicator was aborted on rank",
       "This rank's NCCL communicator was aborted (by its watchdog after a timeout, or because of an error "
       "elsewhere): a consequence; look for the first failure.", (), CONSEQUENCE),
    _s("cuda-oom", r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA|CUDA error: out of memory|"
       r"Cuda failure '?out of memory|Failed to CUDA (?:calloc|malloc|host alloc)|cudaErrorMemoryAllocation",
       "A rank ran out of GPU memory.", ("single-gpu",)),
    _s("port-in-use", r"errno: 98 - Address already in use|EADDRINUSE|[Aa]ddress already in use",
       "The rendezvous/master port is taken (often a previous run still alive). Pick another --master-port "
       "or --rdzv-endpoint, or stop the old job.", ()),
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
       r"unable to (?:write|allocate|open).*shm|Bus error",
       "Shared memory (/dev/shm) ran out: containers default to 64 MB, which breaks NCCL's SHM transport and "
       "DataLoader workers. Give the container more (--shm-size) or use fewer workers.",
       ("shm-off", "fewer-workers")),
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
    _s("cuda-device-assert", r"device-side assert triggered",
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
       "The kernel's OOM killer ended a process of the job: it used more host memory (RAM, not GPU memory) than "
       "its node or its cgroup (the scheduler's --mem, the container's limit) allows. The scheduler's stop that "
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
    _s("nccl-teardown",
       r"Some NCCL operations have failed or timed out|To avoid data inconsistency, we are taking the entire process down",
       "PyTorch's NCCL watchdog taking the process down after a collective failed or timed out: a consequence; the "
       "failure or timeout before it is the finding.", (), CONSEQUENCE),
    _s("launcher-task-ended",
       r"srun: error: \S+: tasks? (?P<tasks>[\d,\-]+): (?P<how>Exited with exit code (?P<code>\d+)|Terminated|Killed)",
       "SLURM's srun reporting how tasks (ranks) ended: what they printed before says why.", (), CONSEQUENCE),
    _s("child-failed", r"ChildFailedError|torch\.distributed\.elastic\.multiprocessing\.errors",
       "torchrun's summary that a rank failed (see the root cause it names).", (), CONSEQUENCE),
]

# InfiniBand async events that are not failures
_BENIGN_IB_EVENT = re.compile(r"^(?:port active|client reregister|sm change|lid change)$", re.I)

# the prefilter: (hint, catalogue index), and the signatures searched on every line
_HINTS = [(h, i) for i, sig in enumerate(CATALOG) if sig.hints is not None for h in sig.hints]
_ALWAYS = frozenset(i for i, sig in enumerate(CATALOG) if sig.hints is None)

_SIGNAL = re.compile(r"Signal (?P<num>\d+) \((?P<name>SIG\w+)\) received by PID (?P<pid>\d+)")
# UCX's (and Open MPI's) handler, on the process's own fatal signal: "Caught signal 7 (Bus error: nonexistent ...)"
_UCX_SIGNAL = re.compile(r"Caught signal (?P<num>\d+) \((?:Bus error|Segmentation fault|Aborted|Floating point|"
                         r"Illegal instruction)")
# the process's own last words on a fatal signal: faulthandler's, or the shell's
_FATAL_NAMES = r"Segmentation fault|Aborted|Bus error|Floating point exception|Illegal instruction"
_FATAL = re.compile(rf"Fatal Python error: (?P<what>{_FATAL_NAMES})|^\S+: line \d+: +\d+ (?P<shell>{_FATAL_NAMES})\b|"
                    rf"^(?P<dumped>{_FATAL_NAMES}) \(core dumped\)")
_FATAL_SIGNALS = {"Segmentation fault": (11, "SIGSEGV"), "Aborted": (6, "SIGABRT"), "Bus error": (7, "SIGBUS"),
                  "Floating point exception": (8, "SIGFPE"), "Illegal instruction": (4, "SIGILL")}
# DeepSpeed's launcher on the first rank process that failed (then it stops the others):
# "[...sigkill_handler] ['python', '-u', 'train.py', '--local_rank=2', ...] exits with return code = -9"
_LAUNCHER_EXIT = re.compile(r"exits with return code = (?P<code>-?\d+)")
_LOCAL_RANK_ARG = re.compile(r"--local[_-]rank[= ']+(?P<rank>\d+)")
# Open MPI's mpirun on the first rank that failed: "mpirun noticed that process rank 3 with PID 4711 on node gpu-2
# exited on signal 9 (Killed)."; or, on an exit code, "The first process to do so was:" then
# "Process name: [[61379,1],2]" and "Exit code: 1"
_MPI_SIGNAL = re.compile(r"noticed that process rank (?P<rank>\d+) with PID (?P<pid>\d+) on node (?P<node>\S+) "
                         r"exited on signal (?P<num>\d+)")
_MPI_PROCESS = re.compile(r"^\s*Process name: \[\[\d+,\d+\],(?P<rank>\d+)\]")
_MPI_EXIT = re.compile(r"^\s*Exit code:\s+(?P<code>-?\d+)")
# exceptions that say a wait ran out (a timeout: another rank did not come), or that the process was
# stopped from outside (a consequence)
_TIMEOUT_EXC = re.compile(r"[Tt]ime[dD]?[ _-]?[Oo]ut|timed out|TimeoutError|DistStoreError")
_STOPPED_EXC = re.compile(r"^(?:[\w.]*\.)?(?:KeyboardInterrupt|SignalException|BrokenPipeError)\b")
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): (?P<msg>.*)$")
_ROOT_BLOCK = re.compile(r"Root Cause \(first observed failure\)")
# a Python traceback's frame line, and an exception named without a message at a traceback's end
_TB_FRAME = re.compile(r'^File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')
_BARE_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception))$")
_LIBRARY_PATH = re.compile(r"[/\\](?:site|dist)-packages[/\\]|[/\\]lib(?:64)?[/\\]python\d|^<frozen ")
# an error line no signature knows: error words, and none of a warning's, an INFO line's or a healthy run's
_ERROR_WORDS = re.compile(r"\b(?:error|ERROR|Error|FATAL|Fatal|fatal|CRITICAL|failed|Failed|FAILED|failure|Failure|"
                          r"cannot|Cannot|can't|Can't|could not|Could not|unable to|Unable to|"
                          r"No such file or directory|Permission denied|core dumped|refused|denied|exceeded|"
                          r"Assertion .* failed)\b|what\(\):|^\[?E\d{4} \d\d:")
_NOT_ERROR = re.compile(r"\b(?:WARN|WARNING|\w*Warning|warning|INFO|DEBUG|[Dd]eprecat\w*|retry\w*|[Rr]etrying|[Ii]f you|"
                        r"[Yy]ou (?:can|may|might|should)|[Cc]onsider|[Hh]int|ignor\w*|[Nn]o errors?|without errors?|"
                        r"0 errors?|errors?[:=] ?0\b|error[_ ]?(?:rate|count|file)|[Tt]raceback|[Tt]o enable)\b|"
                        r"^\[?[WI]\d{4} |^\[[WI] |above exception|handling of the|^=+$|^-+$|^\S+ FAILED$|"
                        # (a heading whose error is on the next line; PyTorch's C++ backtrace lines)
                        r"^Last error:?$|^frame #\d+:|^Exception raised from ")
_NCCL_PEER_WARN = re.compile(r"\bpeer\b|\bremote\b|[Cc]onnection (?:closed|reset|refused)|truncated|[Bb]roken pipe|"
                             r"\b[Cc]losed\b|[Aa]bort|[Ss]ocket (?:recv|send|poll)|Failed to execute operation|"
                             r"retcode \d")
_MAX_UNKNOWN = 200
_SUPERSEDE_LINES = 60  # an exception this many lines after an unknown error line on its rank says what it was  # unclassified error lines kept per matcher (a log full of one error says it already)


# substrings one of which every match of _ERROR_WORDS contains (a cheap look first: most lines have none)
_ERROR_HINTS = ("rror", "RROR", "atal", "ATAL", "RITICAL", "ail", "AIL", "annot", "an't", "ould not", "nable to",
                "No such", "denied", "refused", "exceeded", "core dumped", "what():", "ssertion")


def _looks_like_error(s: str) -> bool:
    if "NCCL WARN " in s:
        # (WARN is NCCL's error level: NCCL_DEBUG=WARN, its default, prints only its errors; those that say a peer
        # went away are what a lost peer looks like, the reasons of the errors they explain, never a root)
        return _NCCL_PEER_WARN.search(s) is None
    if len(s) <= 3 or not (any(h in s for h in _ERROR_HINTS) or (s[:1] in "E[" and s[1:2].isdigit() or
                                                                 s[:2] == "[E")):
        return False
    return _ERROR_WORDS.search(s) is not None and _NOT_ERROR.search(s) is None


# torch.multiprocessing.spawn's report of the first process that failed
_SPAWN = re.compile(r"[Pp]rocess (?P<rank>\d+) terminated with (?:signal (?P<sig>SIG[A-Z]+)|exit code (?P<code>-?\d+)|"
                    r"(?P<error>the following error))")
# torch elastic's agent, on the first worker it saw fail (before its summary):
# "failed (exitcode: -9) local_rank: 0 (pid: 4711) of binary: /usr/bin/python3"
_AGENT_EXIT = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)")
# a stop from outside the job, as torch elastic's agent says it ("Received Signals.SIGHUP death signal, shutting
# down workers"; "Received 15 death signal"), or as it raises it ("SignalException: Process 4711 got signal: 1")
_OUTSIDE_STOP = re.compile(r"Received (?:Signals\.)?(?P<name>SIG[A-Z]+|\d+) death signal|"
                           r"SignalException: Process (?P<pid>\d+) got signal: (?P<num>\d+)")
# NCCL's own warnings (NCCL_DEBUG=WARN, the default, prints them): "host:pid:tid [gpu] ... NCCL WARN <what>"
_NCCL_WARN = re.compile(r"NCCL WARN (?P<what>.+)")
_WARN_WINDOW = 60  # lines: how far back an NCCL warning still explains an NCCL error on the same rank
_FAILURES_BLOCK = re.compile(r"^\s*Failures:\s*$")
_BLOCK_RANK = re.compile(r"^\s*rank\s*:\s*(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)")
_BLOCK_EXIT = re.compile(r"^\s*exitcode\s*:\s*(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?")
# "[Rank 3] Watchdog caught ...", "[PG ID 0 PG GUID 0(default_pg) Rank 1] Timeout at NCCL work ..."
_RANK_IN_MESSAGE = re.compile(r"\[(?:PG [^\]]*?)?\b[Rr]ank (?P<rank>\d+)\]")
_SIGNAMES = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
_CONSEQUENTIAL_SIGNALS = {"SIGTERM", "SIGKILL", "SIGINT", "SIGHUP"}
# exceptions raised by the collective machinery itself after a timeout: the timeout is the finding
# (and NCCL's own result names, on the line after its error: "ncclSystemError: System call ... failed")
_CASCADE_EXC = re.compile(r"^(?:torch\.distributed\.)?(?:DistBackendError|DistStoreError):|^nccl[A-Z]\w*Error:")

RANK_SIGNAL_PROFILES = ("gloo", "single-gpu", "nccl-debug")


@dataclass(frozen=True)
class Finding:
    signature: str
    rank: int | None
    line: int | None  # 1-based line number in its source, when known
    text: str
    explanation: str
    suggested_profiles: tuple[str, ...]
    level: int
    source: str = ""
    detail: dict = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict:
        return {
            "signature": self.signature, "rank": self.rank, "line": self.line, "text": self.text,
            "explanation": self.explanation, "suggested_profiles": list(self.suggested_profiles),
            "source": self.source, **({"detail": self.detail} if self.detail else {}),
        }


class SignatureMatcher:
    """Feed lines one by one; stateful only for torchrun's failure summary."""

    def __init__(self):
        self._block: str | None = None  # "root" | "failures" | None
        self._block_rank: int | None = None
        self._in_traceback: dict[int | None, bool] = {}
        self._warns: dict[int | None, list[tuple[int, int | None, str]]] = {}  # rank -> (seen at, line, text)
        self._seen = 0  # lines fed
        self.mapping = RankMapping()
        self._mpi_rank: int | None = None  # the rank of mpirun's "Process name:" line, for its "Exit code:" line
        self._spawn_rank: int | None = None  # the process torch.multiprocessing.spawn's error report is about
        self._frame: dict[int | None, tuple[str, str]] = {}  # per rank, the traceback's innermost frame and user frame
        self._what: dict[int | None, bool] = {}  # per rank, a C++ exception ("terminate called") waiting for its what()
        self._echo: dict[int | None, bool] = {}  # per rank, the next line echoes a traceback frame's source
        self._unknown = 0  # unclassified errors found (at most _MAX_UNKNOWN)
        self._recent_unknown: dict[int | None, list[Finding]] = {}  # per rank, its last unknown error lines

    def feed(self, text: str, rank: int | None, line: int | None = None, source: str = "",
             on_error: Callable[[Exception], None] | None = None, node: str = "") -> list[Finding]:
        """The findings in one line (``node``: the host or pod it came from,
        when known).  An exception inside the matcher (a bug: it must never
        take the monitor down) skips this line only, and is passed to
        ``on_error`` when given."""
        try:
            return self._feed(text, rank, line, source, node)
        except Exception as e:  # noqa: BLE001 (a matcher bug skips this line only, and is reported through on_error)
            if on_error is not None:
                on_error(e)
            return []

    def _feed(self, text, rank, line, source, node=""):
        self._seen += 1
        if rank is None:
            said = split(text).rank
            if said is not None:
                rank = said
            else:
                m = _RANK_IN_MESSAGE.search(text)
                if m:
                    rank = int(m.group("rank"))
        if rank is None and self._spawn_rank is not None:
            rank = self._spawn_rank  # (the traceback torch.multiprocessing.spawn prints for a failed process)
        t = clean(text)[:8192]
        out: list[Finding] = []
        if "_ranks=" in t or "global_rank_mapping=" in t:
            self.mapping.learn(t, node)  # (which local rank is which global one, as the launcher says)
        if "NCCL WARN" in t:
            w = _NCCL_WARN.search(t)
            if w:
                self._warns.setdefault(rank, []).append((self._seen, line, w.group("what").strip()))
                del self._warns[rank][:-8]
        # torchrun's failure summary: "Root Cause (first observed failure): rank : N ... exitcode : -11"
        if _ROOT_BLOCK.search(t):
            self._block, self._block_rank = "root", None
            return out
        if _FAILURES_BLOCK.match(t):
            self._block, self._block_rank = "failures", None
            return out
        if self._block:
            m = _BLOCK_RANK.match(t)
            if m:
                self._block_rank = int(m.group("rank"))
                return out
            m = _BLOCK_EXIT.match(t)
            if m:
                code = int(m.group("code"))
                r = self._block_rank
                pid = int(m.group("pid")) if m.group("pid") else None
                if code < 0:
                    out.append(_signal_finding(-code, r, line, t.strip(), source, self._block == "root",
                                               consequence=self._block == "failures", who="torchrun", pid=pid))
                elif code != 0 and self._block == "root":
                    out.append(Finding("rank-exit", r, line, t.strip(),
                                       f"Rank {r} exited with code {code} (the first failure torchrun observed); "
                                       "its own log says why.", (), ENDED, source,
                                       {"exit_code": code, "root": True, **({"pid": pid} if pid else {})}))
                elif code != 0 and pid:
                    out.append(Finding("rank-exit", r, line, t.strip(), f"Rank {r} exited with code {code}.", (),
                                       CONSEQUENCE, source, {"exit_code": code, "pid": pid}))
                return out
            if t.startswith("====="):
                self._block = None
            elif rank is None and self._block_rank is not None:
                rank = self._block_rank  # (a traceback the summary holds: its rank's, from @record's error file)
        m = _AGENT_EXIT.search(t) if "(exitcode: " in t else None
        if m and int(m.group("code")) != 0:
            code, local, pid = int(m.group("code")), int(m.group("local")), int(m.group("pid"))
            g = self.mapping.global_rank(local, node)
            local = g if g is not None else local
            if code < 0:
                out.append(_signal_finding(-code, local, line, t.strip(), source, True, who="torchrun's agent",
                                           pid=pid, summary=False))
            else:
                out.append(Finding("rank-exit", local, line, t.strip(),
                                   f"Local rank {local} exited with code {code} (the first failure torchrun's agent "
                                   "saw); its own log says why.", (), ENDED, source,
                                   {"exit_code": code, "root": True, "pid": pid}))
            return out
        m = _MPI_SIGNAL.search(t) if "noticed that process rank" in t else None
        if m:
            out.append(_signal_finding(int(m.group("num")), int(m.group("rank")), line, t.strip(), source, True,
                                       who="mpirun", pid=int(m.group("pid")) or None))
            return out
        if "Process name: [[" in t:
            m = _MPI_PROCESS.match(t)
            self._mpi_rank = int(m.group("rank")) if m else None
            return out
        if self._mpi_rank is not None and "Exit code:" in t:
            m = _MPI_EXIT.match(t)
            if m and int(m.group("code")) != 0:
                r, code = self._mpi_rank, int(m.group("code"))
                out.append(Finding("rank-exit", r, line, t.strip(),
                                   f"Rank {r} exited with code {code} (the first failure mpirun saw); its own log says "
                                   "why.", (), ENDED, source, {"exit_code": code, "root": True}))
            self._mpi_rank = None
            return out
        m = _SPAWN.search(t) if "terminated with" in t else None
        if m:
            # torch.multiprocessing.spawn on the first process that failed: its index is its (local) rank
            r = int(m.group("rank"))
            if m.group("sig"):
                num = next((n for n, name in _SIGNAMES.items() if name == m.group("sig")), 0)
                out.append(_signal_finding(num, r, line, t.strip(), source, True, who="torch.multiprocessing.spawn"))
            elif m.group("code") and int(m.group("code")) != 0:
                out.append(Finding("rank-exit", r, line, t.strip(),
                                   f"Process {r} exited with code {m.group('code')} (the first failure "
                                   "torch.multiprocessing.spawn saw); its own traceback says why.", (), ENDED, source,
                                   {"exit_code": int(m.group("code")), "root": True}))
            elif m.group("error"):
                self._spawn_rank = r  # (the traceback spawn prints next is that process's)
            return out
        m = _OUTSIDE_STOP.search(t) if (" death signal" in t or "got signal: " in t) else None
        if m:
            out.append(_outside_stop(m, rank, line, t.strip(), source))
            return out
        m = _SIGNAL.search(t) or (_UCX_SIGNAL.search(t) if "Caught signal" in t else None)
        if m and not self._block:
            num = int(m.group("num"))
            name = m.group("name") if "name" in m.groupdict() and m.group("name") else _SIGNAMES.get(num, f"signal {num}")
            level = CONSEQUENCE if name in _CONSEQUENTIAL_SIGNALS else CAUSE
            out.append(Finding("rank-signal", rank, line, t.strip(), f"A rank was killed by {name}." + _signal_words(name),
                               _signal_profiles(name) if level == CAUSE else (), level, source,
                               {"signal": name, "signum": num}))
        m = _FATAL.search(t.strip()) if ("Fatal Python" in t or "core dumped" in t or ": line " in t) else None
        if m:
            num, name = _FATAL_SIGNALS[m.group("what") or m.group("shell") or m.group("dumped")]
            out.append(Finding("rank-signal", rank, line, t.strip(),
                               f"{'Rank ' + str(rank) if rank is not None else 'A process'} died of {name} "
                               "(its own last words: faulthandler or the shell)." + _signal_words(name),
                               _signal_profiles(name), CAUSE, source, {"signal": name, "signum": num}))
        m = _LAUNCHER_EXIT.search(t) if "exits with return code" in t else None
        if m and int(m.group("code")) != 0:
            lr = _LOCAL_RANK_ARG.search(t)
            r = int(lr.group("rank")) if lr else rank
            if lr:
                g = self.mapping.global_rank(r, node)
                r = g if g is not None else r
            code = int(m.group("code"))
            if code < 0:
                out.append(_signal_finding(-code, r, line, t.strip(), source, True, who="the launcher"))
            else:
                out.append(Finding("rank-exit", r, line, t.strip(),
                                   f"Rank {r} exited with code {code} (the first failure the launcher saw); its own "
                                   "log says why.", (), ENDED, source, {"exit_code": code, "root": True}))
        for i in sorted(_ALWAYS | {i for h, i in _HINTS if h in t}):  # in catalogue order
            sig = CATALOG[i]
            m = sig.pattern.search(t)
            if m:
                detail = {k: v for k, v in m.groupdict().items() if v is not None}
                level = sig.level
                for k in ("seq_w", "seq_x"):
                    if k in detail:
                        detail["seq"] = detail.pop(k)  # (the watchdog's timeout, said by its counters alone)
                if "op" in detail and sig.id == "nccl-watchdog-timeout" and not detail.pop("op_end", None):
                    # (an operation name a terminal or a paste cut or garbled, "_ALLGATHER_BA[451/1919]": unknown,
                    # never a different collective)
                    detail["op_damaged"] = detail.pop("op")
                if sig.id == "scheduler-stopped" and not detail.get("why"):
                    level = ENDED  # (a stop that gives no reason says how the job ended; a reason beside it is the cause)
                if sig.id == "nccl-ib-async-event" and _BENIGN_IB_EVENT.search(detail.get("event", "")):
                    level = INFO  # (a port coming back)
                f = Finding(sig.id, rank, line, t.strip(), sig.explanation, sig.profiles, level, source, detail)
                if sig.id in EXPLAINED_BY_WARNINGS:
                    f = self._explained(f, t, m.start())
                out.append(f)
        s = t.strip()
        fm = _TB_FRAME.match(s)
        if fm:
            # a traceback's frame: the innermost one (and the innermost of the user's own code) so far
            path, n, fn = fm.group("file"), fm.group("line"), fm.group("fn")
            where = f"{path.replace(chr(92), '/').rsplit('/', 1)[-1]}:{n} in {fn}"
            anyf, userf = self._frame.get(rank, ("", ""))
            self._frame[rank] = (where, where if not _LIBRARY_PATH.search(path) else userf)
            self._echo[rank] = True  # (the next line is the frame's source, echoed: not an error of its own)
            return out
        echo = self._echo.pop(rank, False)
        m = _EXCEPTION.match(s) or (_BARE_EXCEPTION.match(s) if rank in self._frame else None)
        if m and not out and not _CASCADE_EXC.match(s):
            # (an exception whose message a signature already reads, a lost peer included, is that finding)
            # one that says a wait ran out is a timeout (another rank did not come); a stop from outside is
            # a consequence
            level = (CONSEQUENCE if _STOPPED_EXC.match(s) else
                     TIMEOUT if _TIMEOUT_EXC.search(s[:300]) else GENERIC)
            who = f"Rank {rank}" if rank is not None else "A process (rank unknown)"
            msg = m.groupdict().get("msg") or ""
            detail: dict = {"type": m.group("type")}
            anyf, userf = self._frame.pop(rank, ("", ""))
            if userf or anyf:
                detail["where"] = userf or anyf  # the innermost frame of the user's own code, else the innermost
            for u in self._recent_unknown.pop(rank, []):
                if line is None or u.line is None or line - u.line <= _SUPERSEDE_LINES:
                    u.detail["superseded_by"] = line  # (the traceback's own words say what the error line did not)
            out.append(Finding("python-exception", rank, line, s,
                               f"{who} raised {m.group('type')}" + (f": {msg[:200]}" if msg else "") +
                               (f", at {detail['where']}" if "where" in detail else ""),
                               (), level, source, detail))
        elif m:
            self._frame.pop(rank, None)
        if "terminate called after throwing" in s and "what():" not in s:
            self._what[rank] = True  # (its what(), on the next line, is the error's text)
            return out
        if not out and not m and not echo and not self._block and _looks_like_error(s):
            # an error no signature knows: its own words are the finding (the root when nothing known came first)
            what = self._what.pop(rank, False) or s.lstrip().startswith("what():")
            if self._unknown < _MAX_UNKNOWN:
                self._unknown += 1
                u = Finding("unclassified-error", rank, line, s,
                            "An error no signature of ddptop's knows" + (" (a C++ exception's what())" if what
                                                                        else "") + ": its own words say what failed.",
                            (), GENERIC, source, {"unknown": True})
                out.append(u)
                self._recent_unknown.setdefault(rank, []).append(u)
                del self._recent_unknown[rank][:-8]
        return out


    def _explained(self, f: Finding, t: str, at: int) -> Finding:
        """``f`` (an NCCL error) with the NCCL warnings that came just before it
        on its rank (or on its own line, in a flattened paste; ``at``: where the
        error's text starts in ``t``): they say why, and choose the profile to
        try first."""
        # its rank's own warnings, and those no rank is known for (NCCL's "host:pid:tid [gpu]" lines outside a
        # rank's file): the ones just before it
        mine = self._warns.get(f.rank, []) + (self._warns.get(None, []) if f.rank is not None else [])
        own = _NCCL_WARN.search(t)
        if own is not None and at >= own.start():
            return f  # (the finding is an NCCL warning itself, such as an IB completion error: its own reason)
        recent = [(n, txt) for seen, n, txt in sorted(mine) if self._seen - seen <= _WARN_WINDOW]
        if own:
            recent.append((f.line, own.group("what").strip()))  # (a flattened paste: the warning on its line)
        if not recent:
            return f
        reason = next((r for _n, txt in reversed(recent) for r in NCCL_REASONS if r.pattern.search(txt)), None)
        why = [{"line": n, "text": txt[:300]} for n, txt in recent[-3:]]
        explanation = f.explanation
        profiles = f.suggested_profiles
        if reason is not None:
            explanation = f"{reason.words} {explanation}"
            profiles = (reason.profile,) + tuple(p for p in profiles if p != reason.profile)
        return Finding(f.signature, f.rank, f.line, f.text, explanation, profiles, f.level, f.source,
                       {**f.detail, "explained_by": why, **({"reason": reason.id} if reason else {})})


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


def _outside_stop(m: re.Match, rank: int | None, line: int | None, text: str, source: str) -> Finding:
    """torchrun's agent (or a process) stopped by a signal from outside the job."""
    if m.group("name"):
        n = m.group("name")
        name = n if n.startswith("SIG") else _SIGNAMES.get(int(n), f"signal {n}")
    else:
        name = _SIGNAMES.get(int(m.group("num")), f"signal {m.group('num')}")
    why = {
        "SIGHUP": "the terminal or ssh session it ran in closed (a dropped connection, a closed laptop). Run the "
                  "job under nohup, tmux or screen, or as a scheduler job, so that it outlives the session",
        "SIGINT": "Ctrl-C (or a SIGINT from a script)",
        "SIGTERM": "a scheduler (its time limit, preemption, scancel), Kubernetes (an evicted or deleted pod), a "
                   "container runtime, or a person's kill; the scheduler's own log says which",
    }.get(name, "a person or another program")
    return Finding("outside-stop", rank, line, text,
                   f"The job was stopped from outside: torchrun's agent received {name}, which means {why}. No rank "
                   "failed on its own: the ranks' errors after this line are the stop's consequences.",
                   (), CAUSE, source, {"signal": name})


# what a fatal signal most often means for a training rank, in words, and the profiles to try
_SIGNAL_WORDS = {
    "SIGBUS": (" A bus error: in a container this is almost always shared memory (/dev/shm, 64 MB by default in "
               "Docker) running out under the data loader's workers or NCCL's shared-memory transport: give the "
               "container more (--shm-size, a memory-backed emptyDir on Kubernetes) or use fewer workers.",
               ("shm-off", "fewer-workers")),
    "SIGSEGV": (" A segmentation fault in native code: a CUDA, NCCL or C extension library, or a driver. If it runs "
                "on one GPU or on gloo, the multi-GPU path (NCCL, P2P) is the suspect.", RANK_SIGNAL_PROFILES),
}


def _signal_words(name: str) -> str:
    return _SIGNAL_WORDS.get(name, ("", ()))[0]


def _signal_profiles(name: str) -> tuple[str, ...]:
    return _SIGNAL_WORDS.get(name, ("", RANK_SIGNAL_PROFILES))[1] or RANK_SIGNAL_PROFILES


def _signal_finding(num: int, rank: int | None, line: int | None, text: str, source: str, root: bool, *,
                    consequence: bool = False, who: str = "torchrun", pid: int | None = None,
                    summary: bool = True) -> Finding:
    """A rank ended by signal ``num``, as its launcher reports it.  The first failure the launcher saw
    (``root``) is a cause, unless it is a stop from outside (SIGTERM, SIGINT); a SIGKILL there is most
    often the kernel's OOM killer.  Later failures are the launcher stopping the rest."""
    name = _SIGNAMES.get(num, f"signal {num}")
    if consequence or (name in _CONSEQUENTIAL_SIGNALS and not (root and name == "SIGKILL")):
        level = CONSEQUENCE
    elif name == "SIGKILL":
        level = ENDED
    else:
        level = CAUSE
    said = f"Rank {rank} was killed by {name}" + (f" (the first failure {who} observed)" if root else "")
    if name == "SIGKILL" and level != CONSEQUENCE:
        said += ("; with nothing in its own log, that is most often the kernel's OOM killer (host memory, not GPU "
                 "memory), else the scheduler or a person. To confirm: the kernel log on its node (`dmesg -T | grep -i "
                 "'killed process'` or `journalctl -k`), the job's memory (`sacct -j JOB -o MaxRSS` on SLURM, a "
                 "container's OOMKilled status); the usual fix is fewer data-loader workers or a smaller "
                 "prefetch_factor")
    if level == CAUSE:
        said += "." + _signal_words(name)
    return Finding("rank-signal", rank, line, text, said if said.endswith(".") else said + ".",
                   _signal_profiles(name) if level == CAUSE else ("fewer-workers",) if name == "SIGKILL" else (),
                   level, source, {"signal": name, "signum": num, "root": root, **({"pid": pid} if pid else {}),
                                   **({} if summary else {"summary": False})})


def failure_summary(lines) -> dict[int, int]:
    """Global rank -> exit code, from torchrun's failure summary ("Root Cause
    (first observed failure)" and "Failures" blocks: ``rank : N (local_rank: L)``
    then ``exitcode : C (pid: P)``).  Ranks it does not name are not in it."""
    codes: dict[int, int] = {}
    block, rank = False, None
    for raw in lines:
        t = clean(raw)
        if _ROOT_BLOCK.search(t) or _FAILURES_BLOCK.match(t):
            block, rank = True, None
            continue
        if not block:
            continue
        if t.startswith("====="):
            block = False
            continue
        m = _BLOCK_RANK.match(t)
        if m:
            rank = int(m.group("rank"))
            continue
        m = _BLOCK_EXIT.match(t)
        if m and rank is not None:
            codes.setdefault(rank, int(m.group("code")))
            rank = None
    return codes


# timeouts that PyTorch answers by aborting the process: the SIGABRT (and torchrun's report of it) that
# follows is their consequence, never the cause
ABORTING_TIMEOUTS = frozenset({"nccl-watchdog-timeout", "nccl-heartbeat-timeout"})


# what NCCL or the transport say when a peer went away
PEER_LOSS = frozenset({"peer-connection-reset", "nccl-remote-error", "nccl-ib-flushed", "nccl-comm-aborted"})
# communication errors that are causes on their own, and consequences when a peer went away first
COMM_ERRORS = frozenset({"nccl-system-error", "nccl-internal-error", "nccl-ib-error", "nccl-cuda-error"})
_ENDINGS = frozenset({"rank-signal", "rank-exit"})
# NCCL's generic errors, and the specific failures that explain them when both are there
_GENERIC_COMM = frozenset({"nccl-system-error", "nccl-internal-error", "nccl-cuda-error", "nccl-ib-error",
                           "nccl-invalid-usage"})
_EXPLAINS_COMM = frozenset({"cuda-oom", "shm-exhausted", "scheduler-oom-kill", "nccl-ib-async-event",
                            "nccl-no-algorithm", "nccl-duplicate-gpu", "cuda-ecc", "xid"})
# NCCL errors after which PyTorch's watchdog aborts the process (a SIGABRT on every rank follows)
ABORTING_ERRORS = COMM_ERRORS | {"nccl-remote-error", "nccl-invalid-usage"}


def cascade_level(f: Finding, findings: list[Finding]) -> int:
    """``f``'s level once the cascade is known:

    * a rank's SIGABRT after a watchdog or heartbeat timeout is that timeout's consequence;
    * how a rank ended (its exit code, a SIGABRT; any signal after a known cause) is a consequence
      of what its own log says (an exception, an out-of-memory): that is the finding;
    * a communication error on a rank that lost a peer (its own log says the peer closed, reset or
      aborted) is a consequence when a rank failed on its own (that rank may share its number: two
      nodes' local ranks)."""
    if f.level >= CONSEQUENCE:
        return f.level
    if (f.signature == "rank-signal" and f.detail.get("signal") == "SIGABRT"
            and any(x.signature in ABORTING_TIMEOUTS or x.signature in ABORTING_ERRORS for x in findings)):
        return CONSEQUENCE  # (PyTorch's watchdog aborts every rank after an NCCL timeout or error)
    if f.signature in _ENDINGS and any(x.signature == "outside-stop" for x in findings):
        return CONSEQUENCE  # (the ranks' ends after a stop from outside)
    if (f.signature in _ENDINGS and f.rank is not None and f.detail.get("signal") != "SIGKILL"
            and any(x.rank == f.rank and x.signature in PEER_LOSS for x in findings)
            and not any(x.rank == f.rank and x.level < CONSEQUENCE and x.signature not in _ENDINGS for x in findings)):
        return CONSEQUENCE  # (a rank that ended after losing its peer, with nothing of its own: the peer's failure)
    if (f.signature == "rank-exit" and f.rank is not None
            and any(x.rank is None and x.signature in PEER_LOSS for x in findings)
            and not any(x.level < CONSEQUENCE and x.signature not in _ENDINGS for x in findings)):
        return CONSEQUENCE  # (an exit code, in logs whose only errors say a peer went away: no rank prefix said whose)
    if f.signature in _ENDINGS and f.rank is not None:
        # (an exit code or an abort follows whatever the rank's log says, a timeout included; another
        # signal only a known cause, such as running out of memory)
        lenient = f.signature == "rank-exit" or f.detail.get("signal") == "SIGABRT"
        if any(x.rank == f.rank and x.signature not in _ENDINGS and x is not f
               and (x.level < CONSEQUENCE if lenient else x.level == CAUSE) for x in findings):
            return CONSEQUENCE
    if f.signature in _GENERIC_COMM and any(x.signature in _EXPLAINS_COMM and x.level < CONSEQUENCE
                                            and not x.detail.get("recovered") for x in findings):
        # (memory, shared memory, a NIC's port or a forced algorithm that failed explains the communication errors
        # that followed, on its rank and its peers', whatever order the lines were printed in)
        return CONSEQUENCE
    if f.signature in COMM_ERRORS and f.rank is not None:
        lost_peer = any(x.rank == f.rank and x.signature in PEER_LOSS for x in findings)
        # (another finding that is a failure of its own: on another rank, or on this one, such as an
        # out-of-memory; not this rank's own ending, which says only how it ended)
        if lost_peer and any(x.rank is not None and x.level <= ENDED and x.signature not in COMM_ERRORS
                             and not (x.rank == f.rank and x.signature in _ENDINGS) for x in findings):
            return CONSEQUENCE
    return f.level


def collective_counters(findings: list[Finding]) -> dict[int, tuple[int, int]]:
    """Per rank, PyTorch's (last enqueued, last completed) collective at the timeout (the latest seen)."""
    out: dict[int, tuple[int, int]] = {}
    for f in findings:
        if f.signature == "collective-progress" and f.rank is not None:
            try:
                out[f.rank] = (int(f.detail["enqueued"]), int(f.detail["completed"]))
            except (KeyError, ValueError):
                continue
    return out


def counter_verdict(counters: dict[int, tuple[int, int]]) -> tuple[tuple[int, ...], str]:
    """(culprit ranks, what the counters say): the ranks whose last enqueued
    collective differs from the rest (behind: never launched the one the others
    wait in; ahead: launched one the others did not)."""
    if not counters:
        return (), ""
    enq = {r: e for r, (e, _c) in counters.items()}
    if all(e < 0 for e in enq.values()):
        return (), ("every rank's last enqueued collective is -1: no collective was in flight, so the ranks were "
                    "frozen outside communication (file system, CPU, data loading), not waiting on the network")
    if len(enq) < 2 or len(set(enq.values())) == 1:
        n = next(iter(enq.values()))
        return (), f"every rank reporting enqueued collective #{n}: the counters do not single out a rank"
    from collections import Counter

    common, _ = Counter(enq.values()).most_common(1)[0]
    odd = tuple(sorted(r for r, e in enq.items() if e != common))
    parts = []
    for r in odd:
        how = "stopped at" if enq[r] < common else "enqueued an extra collective,"
        parts.append(f"rank {r} {how} #{enq[r]}")
    return odd, (f"the other ranks enqueued collective #{common}; " + "; ".join(parts)
                 + " (PyTorch's per-rank collective counters)")


def root_cause(findings: list[Finding], when: Mapping[Finding, float] | None = None) -> Finding | None:
    """The finding most likely to be the cause, not a consequence, in this
    order (``cascade_level``): a known cause; an error no signature knows
    (an exception, any other error line), earliest first, unless a timeout
    came before it (then after the timeouts); how a rank ended; a timeout.
    Among equals: a failure its own warnings explain; one on the rank the
    launcher saw fail first (torchrun's *Root Cause*); then the earliest, by
    the lines' own time stamps (``when``) where every candidate has one,
    else in read order.  A finding after which its own rank made progress
    again (``detail["recovered"]``: a warning a healthy run prints, a retry
    that worked) is never the root.  None when there are only consequences
    (a lost peer, a stop): they say that something failed elsewhere, not what."""
    when = when or {}
    first = {f.rank for f in findings if f.detail.get("root") and f.rank is not None
             and f.detail.get("summary", True)}
    cands = [(i, f, cascade_level(f, findings)) for i, f in enumerate(findings)
             if f.level < INFO and not f.detail.get("recovered") and f.detail.get("superseded_by") is None]
    cands = [(i, f, lv) for i, f, lv in cands if lv < CONSEQUENCE]
    if not cands:
        return None
    timed = all(f in when for _i, f, _lv in cands)

    def pos(i: int, f: Finding) -> tuple:
        return (when[f], i) if timed else (i,)

    timeouts = [(i, f) for i, f, lv in cands if lv == TIMEOUT]

    def after_a_timeout(i: int, f: Finding) -> bool:
        """A timeout came before ``f``: by both lines' time stamps, or (without them) earlier in the same file,
        whose lines are in the order they were written; across untimed files nothing says which came first."""
        for j, x in timeouts:
            if f in when and x in when:
                if when[x] < when[f]:
                    return True
            elif x.source == f.source and x.rank == f.rank and j < i:
                return True
        return False

    def level(i: int, f: Finding, lv: int) -> float:
        if lv == GENERIC and timeouts and not f.detail.get("derived") and after_a_timeout(i, f):
            return TIMEOUT + 0.5  # (an unknown error after a timeout: what the timeout set off)
        return lv

    # among equals: a failure its own warnings explain; then the rank the launcher saw fail first (its summary's
    # global rank before its agent's local one); then the earliest
    ranked = [(level(i, f, lv), 0 if f.detail.get("explained_by") else 1,
               0 if (f.detail.get("root") and f.detail.get("summary", True)) or f.rank in first else
               1 if f.detail.get("root") else 2, pos(i, f), f)
              for i, f, lv in cands]
    ranked.sort(key=lambda x: x[:4])
    return ranked[0][4]


# line findings that say something about the job only together, across ranks
ACROSS_RANKS = frozenset({"collective-mismatch", "nccl-watchdog-timeout"})


def across_ranks(findings: list[Finding]) -> list[Finding]:
    """The findings several ranks' lines make together (marked ``derived``):

    * ``collective-mismatch``: TORCH_DISTRIBUTED_DEBUG=DETAIL's checks, each
      naming two ranks' collectives: the rank whose collective differs from
      the majority's is the odd one (none when no majority singles one out);
    * ``collective-desync``: watchdog timeouts whose collective (sequence
      number or type) differs between ranks: the ranks went out of step."""
    out: list[Finding] = []
    mismatches = [f for f in findings if f.signature == "collective-mismatch" and not f.detail.get("derived")]
    if mismatches:
        ops: dict[int, str] = {}
        for f in mismatches:
            for side in ("a", "b"):
                r, op = f.detail.get(f"rank_{side}"), f.detail.get(f"op_{side}")
                if r is not None and op:
                    shape = f.detail.get(f"shape_{side}")
                    ops.setdefault(int(r), f"{op}" + (f" of shape {shape}" if shape else ""))
        odd, said = _odd_ones(ops, "ran")
        # (the evidence: the odd rank's own check when it printed one)
        first = next((f for f in mismatches if len(odd) == 1 and f.rank == odd[0]), mismatches[0])
        seq = first.detail.get("seq_a")
        out.append(Finding(
            "collective-mismatch", odd[0] if len(odd) == 1 else None, first.line, first.text,
            f"The ranks called different collectives{f' at collective #{seq}' if seq else ''}: {said}. "
            + first.explanation, first.suggested_profiles, CAUSE, first.source,
            {"derived": True, "odd": list(odd), "collectives": {str(r): v for r, v in sorted(ops.items())}}))
    seen: dict[int, tuple[str, str | None]] = {}
    first_wait = None
    for f in findings:
        if f.signature == "nccl-watchdog-timeout" and f.rank is not None and "seq" in f.detail:
            seen.setdefault(f.rank, (f.detail["seq"], f.detail.get("op")))
            first_wait = first_wait or f
    # a field a rank's line does not say (damaged, or not printed) is unknown, never different: the operations are
    # compared only where every rank's is known
    ops_known = all(op for _seq, op in seen.values())
    waits = {r: f"#{seq}" + (f" ({op})" if ops_known else "") for r, (seq, op) in seen.items()}
    if len(waits) >= 2 and len(set(waits.values())) > 1 and first_wait is not None:
        odd, said = _odd_ones(waits, "timed out in collective")
        out.append(Finding(
            "collective-desync", odd[0] if len(odd) == 1 else None, first_wait.line, first_wait.text,
            f"The ranks timed out in different collectives: {said}. They went out of step: one rank skipped or added "
            "a collective (a code path that depends on the rank or its data, an uneven number of batches, an early "
            "exit from a loop), so each waits in a collective the others never launch.",
            ("flight-recorder", "nccl-debug"), GENERIC, first_wait.source,
            {"derived": True, "odd": list(odd), "collectives": {str(r): v for r, v in sorted(waits.items())}}))
    return out


def _odd_ones(by_rank: dict[int, str], verb: str) -> tuple[tuple[int, ...], str]:
    """(the ranks outside a strict majority, none without one; in words)."""
    from collections import Counter

    groups: dict[str, list[int]] = {}
    for r, v in sorted(by_rank.items()):
        groups.setdefault(v, []).append(r)
    common, n = Counter(by_rank.values()).most_common(1)[0]
    odd: tuple[int, ...] = ()
    if n * 2 > len(by_rank) and len(groups) > 1:
        odd = tuple(sorted(r for r, v in by_rank.items() if v != common))
    parts = [f"{'rank' if len(rs) == 1 else 'ranks'} {', '.join(map(str, rs))} {verb} {v}" for v, rs in
             sorted(groups.items(), key=lambda g: (-len(g[1]), g[1]))]
    if not odd:
        parts.append("no majority singles out one rank")
    return odd, "; ".join(parts)
