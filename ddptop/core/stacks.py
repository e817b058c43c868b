"""Python stacks of every rank, with py-spy (an optional extra).

``dump_stacks(pids)`` runs ``py-spy dump`` on each rank (under a timeout),
groups identical stacks and says which ranks differ: in a hang, the odd rank
out is usually the one whose stack is not inside the collective the others
are waiting in.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

_ADDR = re.compile(r"0x[0-9a-f]+|\(idle\)|\(active[^)]*\)|Thread \d+|Process \d+:.*|Python v[\d.]+.*")


@dataclass(frozen=True)
class StackGroup:
    ranks: tuple[int, ...]
    stack: str


def normalise(dump: str) -> str:
    """Drop what differs between identical stacks (pids, thread ids, addresses)."""
    return "\n".join(_ADDR.sub("", l).rstrip() for l in dump.splitlines() if l.strip())


def dump_stacks(rank_pids: dict[int, int], timeout: float = 15.0) -> tuple[dict[int, str], list[StackGroup], str | None]:
    """(raw dump per rank, groups of identical stacks, error message or None).

    ``--nonblocking``: py-spy reads the rank's memory without stopping it, so a
    dump can never wedge or kill a rank, even if py-spy itself is killed.
    """
    exe = shutil.which("py-spy")
    if exe is None:
        return {}, [], "py-spy is not installed: `pip install py-spy` (or `pip install ddptop[stacks]`) to get every rank's Python stack on a stall"
    raw: dict[int, str] = {}
    errors = []
    for rank, pid in sorted(rank_pids.items()):
        try:
            r = subprocess.run([exe, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            errors.append(f"rank {rank}: py-spy timed out")
            continue
        if r.returncode != 0:
            msg = (r.stderr or r.stdout).strip().splitlines()
            msg = msg[-1] if msg else f"exit {r.returncode}"
            if "ptrace" in msg.lower() or "permission" in msg.lower() or "Operation not permitted" in msg:
                msg += " (ptrace denied: run as the job's user with CAP_SYS_PTRACE, or set kernel.yama.ptrace_scope=0)"
            errors.append(f"rank {rank}: {msg}")
            continue
        raw[rank] = r.stdout
    groups: dict[str, list[int]] = {}
    for rank, dump in raw.items():
        groups.setdefault(normalise(dump), []).append(rank)
    out = sorted((StackGroup(tuple(rs), s) for s, rs in groups.items()), key=lambda g: (-len(g.ranks), g.ranks))
    return raw, out, "; ".join(errors) or None


def summarise(groups: list[StackGroup]) -> str:
    if not groups:
        return "no stacks"
    if len(groups) == 1:
        return f"all {len(groups[0].ranks)} ranks have the same Python stack"
    main = groups[0]
    odd = [g for g in groups[1:]]
    def who(g):
        return f"ranks {', '.join(map(str, g.ranks))}" if len(g.ranks) > 1 else f"rank {g.ranks[0]}"
    head = f"{who(main)} share one stack" if len(main.ranks) > 1 else f"{who(main)} has one stack"
    return head + "; " + "; ".join(f"{who(g)} {'differ' if len(g.ranks) > 1 else 'differs'}" for g in odd)
