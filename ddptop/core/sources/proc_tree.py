"""Process-tree reads that stay cheap on a busy node.

psutil finds a process's children by reading ``/proc/*/stat`` for every
process on the machine.  On a GPU node with a thousand processes that is tens
of milliseconds, and ddptop asks twice a second (rank discovery) and once a
second (data-loader workers per rank).  Linux keeps each thread's children in
``/proc/PID/task/TID/children``: a few small reads for the processes we watch.
Where that file is missing (kernels without CONFIG_PROC_CHILDREN, non-Linux)
everything falls back to psutil.

The file is a snapshot: a child forked or reparented while it is read can be
missed, and is then seen at the next look, which is all a poller needs.
"""

from __future__ import annotations

import os
import re

import psutil

_SUPPORTED: bool | None = None  # learnt on first use


def _supported() -> bool:
    """Whether this kernel keeps ``children`` files, learnt once from this process's own main thread (which
    is there: a pid that is gone says nothing either way)."""
    global _SUPPORTED
    if _SUPPORTED is None:
        me = os.getpid()
        _SUPPORTED = os.path.exists(f"/proc/{me}/task/{me}/children")
    return _SUPPORTED


def child_pids(pid: int) -> list[int] | None:
    """Direct children of ``pid`` (every thread's), [] when it is gone, or None
    when this kernel cannot say (use psutil)."""
    if not _supported():
        return None
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except FileNotFoundError:
        return []
    except OSError:
        return None
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"{base}/{tid}/children", "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        except OSError:
            return None
        out.extend(int(x) for x in data.split())
    return out


def children(proc: psutil.Process, known: set[int] | dict | frozenset = frozenset()) -> list[psutil.Process]:
    """``proc.children()`` without scanning every process; pids in ``known``
    are left out before anything is read about them."""
    pids = child_pids(proc.pid)
    if pids is None:
        return [c for c in proc.children() if c.pid not in known]
    out = []
    for pid in pids:
        if pid in known:
            continue
        try:
            c = psutil.Process(pid)
            if c.ppid() == proc.pid:  # (not a recycled pid)
                out.append(c)
        except psutil.Error:
            pass
    return out


def descendant_pids(pid: int) -> list[int] | None:
    """Every descendant of ``pid``, parents before children; None as ``child_pids``."""
    first = child_pids(pid)
    if first is None:
        return None
    out, todo = [], list(first)
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(child_pids(c) or ())
    return out


def descendants(proc: psutil.Process) -> list[psutil.Process]:
    """``proc.children(recursive=True)`` without scanning every process."""
    pids = descendant_pids(proc.pid)
    if pids is None:
        return proc.children(recursive=True)
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.Error:
            pass
    return out


def alive(proc: psutil.Process) -> bool:
    """``proc`` still runs (it has not ended, and is not a zombie waiting for its parent)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# the inode of the kernel's first PID namespace (PROC_PID_INIT_INO): fixed, so any
# other number in /proc/self/ns/pid is a namespace of its own (a container's)
INIT_PID_NS_INODE = 0xEFFFFFFC


def pid_namespace(proc: str = "/proc") -> bool | None:
    """Whether this process runs in a PID namespace of its own (a container's,
    a pod's), where the host's pids (NVML's, for one) name no process or
    another one: True, False, or None when ``proc`` cannot say.

    Read from ``/proc/self/status`` NSpid (more than one pid: a namespace seen
    from an outer /proc) and ``/proc/self/ns/pid`` (inside a container NSpid
    shows only the inner pid, but the namespace is not the kernel's first)."""
    try:
        with open(f"{proc}/self/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    if len(line.split()) > 2:
                        return True
                    break
    except OSError:
        pass
    try:
        link = os.readlink(f"{proc}/self/ns/pid")
    except OSError:
        return None
    if link.startswith("pid:[") and link.endswith("]") and link[5:-1].isdigit():
        return int(link[5:-1]) != INIT_PID_NS_INODE
    return None


# what a process that can wait on a GPU has in its address space: the CUDA driver or runtime, ROCm's HIP or HSA
# runtime, NCCL or RCCL, or the GPU device files the drivers map (/dev/nvidia*, /dev/kfd).  (A CUDA build of
# torch maps its runtime at import, GPU or not: then nothing is concluded.)
_GPU_MAPPED = re.compile(rb"/dev/nvidia|/dev/kfd|/libcuda\.so|/libcudart[.-]|/libamdhip64|/libhsa-runtime64|"
                         rb"/libnccl|/librccl")


def gpu_runtime_mapped(pid: int) -> bool | None:
    """Whether the process has a GPU runtime in its address space (its
    ``/proc/PID/maps``); None when that cannot be read (another OS, another
    user's process, gone).  A process without one cannot be waiting on a GPU,
    whatever its Python line looks like (``float(t)`` syncs only a GPU tensor)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return _GPU_MAPPED.search(data) is not None
