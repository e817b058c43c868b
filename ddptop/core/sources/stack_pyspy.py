"""Python stacks of every rank, with py-spy (an optional extra).

``dump_stacks(pids)`` runs ``py-spy dump`` on each rank (under a timeout),
groups identical stacks and says which ranks differ: in a hang, the odd rank
out is usually the one whose stack is not inside the collective the others
are waiting in.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ddptop.core.model.settings import settings

_ADDR = re.compile(r"0x[0-9a-f]+|\(idle\)|\(active[^)]*\)|Thread \d+|Process \d+:.*|Python v[\d.]+.*")


@dataclass(frozen=True)
class StackGroup:
    ranks: tuple[int, ...]
    stack: str


def normalise(dump: str) -> str:
    """Drop what differs between identical stacks (pids, thread ids, addresses)."""
    return "\n".join(_ADDR.sub("", l).rstrip() for l in dump.splitlines() if l.strip())


def missing_words() -> str:
    forced = settings().py_spy
    if forced == "":
        return "stack sampling is off (DDPTOP_PY_SPY is empty)"
    if forced is not None:
        return f"DDPTOP_PY_SPY={forced!r} is not an executable file"
    return ("py-spy is not installed: `pip install py-spy` (or `pip install ddptop[stacks]`) to get every rank's "
            "Python stack on a stall")


def py_spy() -> str | None:
    """py-spy: ``DDPTOP_PY_SPY`` when set (a path; empty turns stack sampling
    off), else on PATH, else beside this interpreter (a venv not activated)."""
    forced = settings().py_spy
    if forced is not None:
        return forced if forced and os.path.isfile(forced) and os.access(forced, os.X_OK) else None
    exe = shutil.which("py-spy")
    if exe is None:
        here = Path(sys.executable).parent / "py-spy"
        exe = str(here) if here.is_file() and os.access(here, os.X_OK) else None
    return exe


def _alive(pid: int) -> bool:
    """The process is there and not a zombie (py-spy fails on one that is going away)."""
    import psutil

    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


# a frame line of a dump: "    function (file:line)", indented under its "Thread ..." line
_FRAME = re.compile(r"^\s{2,}\S.*\(.*\)\s*$", re.M)
# ranks (pids) whose non-blocking reads came back without frames: read paused from then on
_PAUSED_READS: set[int] = set()


def has_frames(dump: str) -> bool:
    """The dump shows at least one Python frame.  A non-blocking read races
    the rank and can come back with its threads and no frames (recorded on an
    H200 machine: tests/data/h200), which says nothing of where it is."""
    return bool(_FRAME.search(dump))


def python_dump(exe: str, pid: int, *, timeout: float, with_locals: bool = False) -> subprocess.CompletedProcess:
    """``py-spy dump`` of the Python frames, without stopping the rank when
    that reads: ``--nonblocking`` first (twice), then, when it keeps coming back
    without frames, a paused read (py-spy stops the rank for the few
    milliseconds a Python-only read takes), which that rank gets from then on.
    ``args[-1]`` of the result says which ("paused" when paused).  Raises as
    ``subprocess.run`` does."""
    base = [exe, "dump", "--full-filenames", *(["--locals"] if with_locals else []), "--pid", str(pid)]
    if pid not in _PAUSED_READS:
        for _ in range(2):
            r = subprocess.run([*base[:2], "--nonblocking", *base[2:]], capture_output=True, text=True,
                               errors="replace", timeout=timeout)
            if r.returncode != 0 or has_frames(r.stdout):
                return r
    r = subprocess.run(base, capture_output=True, text=True, errors="replace", timeout=timeout)
    if r.returncode == 0 and has_frames(r.stdout):
        if len(_PAUSED_READS) > 4096:
            _PAUSED_READS.clear()
        _PAUSED_READS.add(pid)
    r.args = [*r.args, "paused"]
    return r


# seconds a native dump (py-spy --native, which stops the rank while it unwinds) may take before it is given
# up for a Python-only one: a CPU torch rank takes about 1 s on a 2-core machine (docs/performance.md), a
# first dump of a rank with libtorch_cuda loaded can take far longer (benfred/py-spy#872)
NATIVE_TIMEOUT = 3.0  # (the default of DDPTOP_NATIVE_TIMEOUT: settings().native_timeout)


def dump_stacks(rank_pids: dict[int, int], timeout: float = 15.0, with_locals: bool = False,
                native: frozenset[int] | set[int] = frozenset(),
                took: dict[int, float] | None = None, native_timeout: float = NATIVE_TIMEOUT,
                given_up: set[int] | None = None) -> tuple[dict[int, str], list[StackGroup], str | None]:
    """(raw dump per rank, groups of identical stacks, error message or None).

    ``--nonblocking``: py-spy reads the rank's memory without stopping it, so a
    dump can never wedge or kill a rank, even if py-spy itself is killed (a
    rank whose non-blocking reads show no frames is read paused instead, for
    milliseconds: :func:`python_dump`).
    The ranks in ``native`` are dumped with ``--native`` instead (C frames:
    the CUDA runtime, the driver, NCCL), which pauses the rank while py-spy
    unwinds it (``took``: seconds each such dump ran, an upper bound on the
    pause).  A native dump that takes longer than ``native_timeout`` is given
    up (py-spy is killed, which lets the rank go on: the kernel detaches a
    dead tracer's tracees) for a Python-only one, and its rank is added to
    ``given_up`` and named in the error.
    """
    exe = py_spy()
    if exe is None:
        return {}, [], missing_words()
    raw: dict[int, str] = {}
    errors: dict[int, str] = {}

    def one(rank: int, pid: int, use_native: bool) -> None:
        # --full-filenames: the verdict tells the user's files from the libraries' by
        # their path, and reads the line a frame is blocked on.  (An error already said for this
        # rank, by a native attempt, is kept: the Python-only retry's own failure says less.)
        say = errors.setdefault
        t0 = time.monotonic()
        try:
            if use_native:
                r = subprocess.run([exe, "dump", "--native", "--full-filenames",
                                    *(["--locals"] if with_locals else []), "--pid", str(pid)],
                                   capture_output=True, text=True, errors="replace",
                                   timeout=min(timeout, native_timeout))
            else:
                r = python_dump(exe, pid, timeout=timeout, with_locals=with_locals)
            if use_native and took is not None:
                took[rank] = time.monotonic() - t0
        except subprocess.TimeoutExpired:
            if use_native:
                if took is not None:
                    took[rank] = time.monotonic() - t0
                if given_up is not None:
                    given_up.add(rank)
                say(rank, f"rank {rank}: native frames given up after {min(timeout, native_timeout):g} s "
                          "(Python frames only)")
                one(rank, pid, False)
                return
            say(rank, f"rank {rank}: py-spy timed out")
            return
        except OSError as e:
            say(rank, f"rank {rank}: py-spy could not run: {e}")
            return
        if r.returncode != 0 and use_native and _alive(pid):
            # native frames could not be read (an unwinder that fails on this build): the Python stack still can
            say(rank, f"rank {rank}: no native frames ({_last_line(r)})")
            one(rank, pid, False)
            return
        if r.returncode != 0:
            if not _alive(pid):
                say(rank, f"rank {rank}: ended before its stack was read")
            elif ptrace_refused(pid):
                say(rank, f"rank {rank}: {PTRACE_REFUSED}")
            else:
                say(rank, f"rank {rank}: {_last_line(r)}")
            return
        raw[rank] = r.stdout

    # every rank at once (at most 8 py-spy at a time), so that one sample of
    # all ranks is one moment, not a walk across them
    threads = []
    items = sorted(rank_pids.items())
    for i in range(0, len(items), 8):
        for rank, pid in items[i:i + 8]:
            t = threading.Thread(target=one, args=(rank, pid, rank in native), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(timeout + 5)
        threads.clear()
    raw = dict(sorted(raw.items()))
    groups: dict[str, list[int]] = {}
    for rank, dump in raw.items():
        groups.setdefault(normalise(dump), []).append(rank)
    out = sorted((StackGroup(tuple(rs), s) for s, rs in groups.items()), key=lambda g: (-len(g.ranks), g.ranks))
    return raw, out, "; ".join(errors[r] for r in sorted(errors)) or None


# what to say when the kernel refuses to let ddptop read a rank's memory, and the fix
PTRACE_REFUSED = "ptrace is refused"
PTRACE_FIX = ("ddptop may not read the ranks' memory: run it as the job's user with CAP_SYS_PTRACE (in a "
              "container: --cap-add SYS_PTRACE), or set kernel.yama.ptrace_scope=0")


def ptrace_refused(pid: int) -> bool:
    """The kernel refuses this process read access to ``pid``'s memory (the
    access py-spy needs), as the failure itself says: opening
    ``/proc/PID/mem`` needs the same ptrace permission and fails with EPERM
    or EACCES when it is refused (another user, no CAP_SYS_PTRACE, Yama)."""
    try:
        with open(f"/proc/{pid}/mem", "rb"):
            return False
    except PermissionError:
        return True
    except OSError:  # gone, or no /proc: not a refusal
        return False


def _last_line(r: subprocess.CompletedProcess) -> str:
    lines = (r.stderr or r.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit {r.returncode}"


def summarise(groups: list[StackGroup]) -> str:
    if not groups:
        return "no stacks"
    if len(groups) == 1:
        return f"all {len(groups[0].ranks)} ranks have the same Python stack"
    main = groups[0]
    odd = [g for g in groups[1:]]
    def who(g):
        return f"ranks {', '.join(map(str, g.ranks))}" if len(g.ranks) > 1 else f"rank {g.ranks[0]}"
    if len(main.ranks) == len(odd[0].ranks):  # no majority: nobody's stack is the odd one
        return f"{len(groups)} different stacks: " + "; ".join(who(g) for g in groups)
    head = f"{who(main)} share one stack" if len(main.ranks) > 1 else f"{who(main)} has one stack"
    return head + "; " + "; ".join(f"{who(g)} {'differ' if len(g.ranks) > 1 else 'differs'}" for g in odd)
