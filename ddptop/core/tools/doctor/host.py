"""The host's resources and limits: the size of /dev/shm (NCCL's SHM transport
and data-loader workers), the locked-memory limit (RDMA), free disk under the
runs directory, and the CPU budget (data-loader workers x GPUs against the
usable cores, with the worker count given or read from a running torchrun by
:func:`ddptop.core.sources.proc_torchrun.running_job_workers`).
"""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Callable

from ddptop.core.sources.proc_torchrun import JobWorkers
from ddptop.core.tools.doctor.report import FAIL, OK, SKIPPED, WARN, Row

GiB = 1024**3
MiB = 1024**2


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


def check_shm(path: str = "/dev/shm", statvfs: Callable = os.statvfs) -> Row:
    try:
        st = statvfs(path)
    except OSError as e:
        return Row("/dev/shm", WARN, f"{path} unreadable: {e.strerror or e}", [f"statvfs({path}): {e}"],
                   "NCCL's SHM transport and DataLoader workers need /dev/shm; mount a tmpfs there "
                   "(docker --shm-size=16g or --ipc=host) or use the shm-off profile")
    total, free = st.f_frsize * st.f_blocks, st.f_frsize * st.f_bavail
    ev = [f"statvfs({path}): {_gib(total)} total, {_gib(free)} free"]
    data = {"total_bytes": total, "free_bytes": free}
    if total < GiB:
        return Row("/dev/shm", WARN, f"{_gib(total)}: too small", ev,
                   "containers default to 64 MB: NCCL's SHM transport and DataLoader workers break (bus error, "
                   "`unhandled system error`); docker --shm-size=16g (or --ipc=host), or ddptop --profile shm-off", data)
    if free < GiB:
        return Row("/dev/shm", WARN, f"{_gib(free)} free of {_gib(total)}", ev,
                   "something fills /dev/shm (leftover segments of crashed jobs?): `ls -la /dev/shm`", data)
    return Row("/dev/shm", OK, f"{_gib(total)} ({_gib(free)} free)", ev, "", data)


def check_memlock(ib_devices: list[str], getrlimit: Callable = resource.getrlimit) -> Row:
    soft, hard = getrlimit(resource.RLIMIT_MEMLOCK)

    def fmt(v):
        return "unlimited" if v == resource.RLIM_INFINITY else f"{v // 1024} KiB"
    ev = [f"RLIMIT_MEMLOCK soft {fmt(soft)}, hard {fmt(hard)}"]
    data = {"soft": None if soft == resource.RLIM_INFINITY else soft, "hard": None if hard == resource.RLIM_INFINITY else hard}
    if soft == resource.RLIM_INFINITY:
        return Row("ulimit -l", OK, "unlimited", ev, "", data)
    if ib_devices:
        return Row("ulimit -l", WARN, f"{fmt(soft)} with InfiniBand present ({', '.join(ib_devices)})", ev,
                   "RDMA pins memory: a small locked-memory limit makes NCCL's IB transport fail to register buffers; "
                   "set `ulimit -l unlimited` (/etc/security/limits.conf memlock, or docker --ulimit memlock=-1)", data)
    return Row("ulimit -l", OK, f"{fmt(soft)} (matters for InfiniBand/RDMA only; none here)", ev, "", data)


def check_disk(path: Path, statvfs: Callable = os.statvfs) -> Row:
    p = Path(path)
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = statvfs(str(probe))
    except OSError as e:
        return Row("Run directory disk", WARN, f"{probe} unreadable: {e}", [], "")
    free = st.f_frsize * st.f_bavail
    ev = [f"runs directory {p}" + ("" if probe == p else f" (not created yet; measured at {probe})"),
          f"statvfs: {_gib(free)} free of {_gib(st.f_frsize * st.f_blocks)}"]
    data = {"path": str(p), "free_bytes": free}
    if free < 100 * MiB:
        return Row("Run directory disk", FAIL, f"{_gib(free)} free", ev,
                   "rank logs and the journal will not fit: free space or point DDPTOP_RUNS_DIR elsewhere", data)
    if free < GiB:
        return Row("Run directory disk", WARN, f"{_gib(free)} free", ev,
                   "a long job's rank logs can fill this; free space or set DDPTOP_RUNS_DIR", data)
    return Row("Run directory disk", OK, f"{_gib(free)} free", ev, "", data)


def check_cpu(cores: int, n_gpus: int, workers: int | None, job: JobWorkers | None = None) -> Row:
    ev = [f"{cores} core(s) usable by this process (os.sched_getaffinity)"]
    src = "--workers"
    if workers is None and job is not None:
        workers, src = job.workers_per_rank, f"torchrun pid {job.torchrun_pid}: {job.ranks} rank(s), up to " \
                                             f"{job.workers_per_rank} child process(es) each"
        n_gpus = job.ranks or n_gpus
    if workers is None:
        return Row("CPU budget", SKIPPED, "no worker count: pass --workers N (data-loader workers per GPU), "
                   "or run doctor while the job runs", ev)
    ev.append(f"workers per GPU: {workers} ({src})")
    if n_gpus <= 0:
        return Row("CPU budget", SKIPPED, "no GPUs (and no running job's ranks) to multiply the workers by", ev)
    need = workers * n_gpus
    ev.append(f"{workers} worker(s) x {n_gpus} GPU(s) = {need} data-loader processes for {cores} core(s)")
    data = {"cores": cores, "gpus": n_gpus, "workers": workers, "needed": need}
    if need > cores:
        fit = max(cores // n_gpus, 0)
        return Row("CPU budget", WARN, f"{need} workers for {cores} cores", ev,
                   f"rule of thumb: workers x GPUs <= cores; starved ranks fall behind until the NCCL watchdog kills "
                   f"the job. Use num_workers <= {fit} (ddptop --profile fewer-workers halves them)", data)
    return Row("CPU budget", OK, f"{need} workers for {cores} cores", ev, "", data)


CAP_SYS_PTRACE = 19


def check_ptrace(root: Path = Path("/")) -> Row:
    """Can ddptop read the ranks' stacks (py-spy needs ptrace access to them)?
    CAP_SYS_PTRACE in this process's effective set, and the Yama scope."""
    name = "Stack sampling (ptrace)"
    cap = None
    try:
        for line in (root / "proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                cap = bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except (OSError, ValueError, IndexError):
        cap = None
    try:
        scope: int | None = int((root / "proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        scope = None  # no Yama: the classic rule (same user, or CAP_SYS_PTRACE)
    ev = [f"CAP_SYS_PTRACE: {'yes' if cap else 'no' if cap is False else 'unknown'}",
          f"kernel.yama.ptrace_scope: {scope if scope is not None else 'not present'}"]
    data = {"cap_sys_ptrace": cap, "yama_ptrace_scope": scope}
    fix = ("run ddptop as the job's user with CAP_SYS_PTRACE (in a container: --cap-add SYS_PTRACE), or set "
           "kernel.yama.ptrace_scope=0: without it a hang alarm has no stacks, so no culprit line")
    if scope == 3:
        return Row(name, FAIL, "ptrace is disabled on this kernel (Yama scope 3)", ev,
                   "no stack samples are possible here until reboot with a lower kernel.yama.ptrace_scope", data)
    if cap:
        return Row(name, OK, "CAP_SYS_PTRACE: every rank's stack can be read", ev, "", data)
    if scope in (1, 2):
        return Row(name, WARN, f"Yama ptrace_scope={scope} without CAP_SYS_PTRACE: stack samples of the ranks "
                   "will be refused", ev, fix, data)
    return Row(name, OK, "ranks of the same user can be read (no Yama restriction)", ev, "", data)
