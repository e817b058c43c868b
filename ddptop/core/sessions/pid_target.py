"""Finding a job from outside: which torchrun (or lone rank) a pid belongs to
(``resolve_pid``), and where its processes' output goes (``fd_target``: what
a process's stdout or stderr is; ``log_file_key``: a torchrun per-rank log
file's attempt, local rank and stream; ``start_offset``: where to begin
reading a file that is not one).  The session that watches the job is
``pid.ForeignSession``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

from ddptop.core.sources import proc_tree as procs
from ddptop.core.sources.proc_torchrun import (
    is_rank,
    is_torchrun,
    rank_env,
    torchrun_args,
)

_ATTEMPT = re.compile(r"attempt_(\d+)$")


class ForeignError(Exception):
    """The pid names no process, or one that is not part of a torchrun job; the message says which."""


@dataclass
class Target:
    """What ``--pid`` found: a torchrun, or a lone rank (a one-rank job)."""

    torchrun: psutil.Process | None
    lone_rank: psutil.Process | None = None
    asked: int = 0  # the pid given

    @property
    def root(self) -> psutil.Process:
        """torchrun, or the lone rank."""
        p = self.torchrun or self.lone_rank
        if p is None:
            raise ForeignError("neither a torchrun nor a rank")
        return p

    @property
    def pid(self) -> int:
        return self.root.pid


def resolve_pid(pid: int) -> Target:
    """The torchrun job that ``pid`` belongs to.

    ``pid`` may be torchrun itself, or any process under it (a rank, a rank's
    data-loader worker): the parents are walked up to torchrun.  A process
    with RANK in its environment and no torchrun above it (started by srun,
    mpirun, a script...) is a one-rank job.
    """
    try:
        proc = psutil.Process(pid)
        cmd = proc.cmdline()
    except psutil.NoSuchProcess:
        raise ForeignError(f"no process with pid {pid}") from None
    except psutil.AccessDenied:
        raise ForeignError(f"pid {pid} belongs to another user: ddptop cannot look at it") from None
    if not procs.alive(proc):
        raise ForeignError(f"pid {pid} has ended (it is a zombie)")
    if torchrun_args(cmd) is not None:
        return Target(proc, asked=pid)
    try:
        parents = proc.parents()
    except psutil.Error:
        parents = []
    for anc in parents:
        if is_torchrun(anc):
            return Target(anc, asked=pid)
    what = " ".join(cmd)[:120] or "?"
    try:
        env = proc.environ()
    except psutil.AccessDenied:
        raise ForeignError(f"pid {pid} ({what}) is not a torchrun process, and its environment cannot be "
                           f"read (permission denied) to tell whether it is a rank") from None
    except psutil.Error as e:
        raise ForeignError(f"pid {pid}: {e}") from None
    if is_rank(env, under_torchrun=False):
        # the topmost process of that rank (not one of its data-loader workers)
        top = proc
        for anc in parents:
            anc_env = rank_env(anc, under_torchrun=False)
            if anc_env is None or anc_env.get("RANK") != env["RANK"]:
                break
            top = anc
        return Target(None, top, asked=pid)
    raise ForeignError(f"pid {pid} ({what}) is neither a torchrun process nor a rank of one "
                       f"(no torchrun among its parents, no RANK in its environment)")


def int_or_none(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None



def fd_target(pid: int, fd: int) -> tuple[str, os.stat_result | None, str | None]:
    """(where /proc/PID/fd/FD points, the target's stat, why it could not be looked at)."""
    link = f"/proc/{pid}/fd/{fd}"
    try:
        target = os.readlink(link)
    except FileNotFoundError:
        return "", None, "closed"
    except PermissionError:
        return "", None, "permission denied"
    except OSError as e:
        return "", None, e.strerror or str(e)
    try:
        st = os.stat(link)
    except OSError:
        st = None
    return target, st, None


def start_offset(path: str, history: int) -> int:
    """Where to start reading a file: ``history`` bytes before its end, at a line start."""
    try:
        size = os.path.getsize(path)
        if size <= history:
            return 0
        with open(path, "rb") as f:
            f.seek(size - history)
            chunk = f.read(history)
    except OSError:
        return 0
    nl = chunk.find(b"\n")
    return size - history + nl + 1 if nl >= 0 else size


def log_file_key(path: str) -> tuple[Path, int, int, str] | None:
    """(run subdirectory, attempt, local rank, stream) of a torchrun per-rank log file."""
    p = Path(path)
    m = _ATTEMPT.match(p.parent.parent.name)
    if m is None or not p.parent.name.isdigit() or p.name not in ("stdout.log", "stderr.log"):
        return None
    return p.parent.parent.parent, int(m.group(1)), int(p.parent.name), p.name[:-4]
