"""What NCCL's RAS report says about who is behind, in the job's ranks (pure).

The client and the report's parsers are ``ddptop.core.sources.ras_client``; this module
judges a parsed report: who launched fewer collectives, who is missing,
dead, or in another state than the rest, mapped to global ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from ddptop.core.model.ras_types import KINDS, RasRank, RasStatus


@dataclass
class RasVerdict:
    culprits: list[int]  # global ranks (or communicator ranks where the mapping is unknown)
    text: str  # one sentence for the alarm, "" when RAS sees nothing wrong
    behind: dict[int, str] = field(default_factory=dict)  # global rank -> what RAS says of it (rank table)



# -- who is behind ---------------------------------------------------------------

# what a rank's communicator status says, when most ranks are RUNNING
_STATUS_SAYS = {
    "ABORT": "aborted its communicator",
    "FINALIZE": "finalized or destroyed its communicator (it left the collectives)",
    "INIT": "is still initialising its communicator",
    "NOCOMM": "answered, but is not in this communicator (destroyed, aborted or never created it)",
    "UNKNOWN": "is in an unknown state",
}


def _names(ranks: Iterable[int]) -> str:
    rs = sorted(set(ranks))
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def verdict(st: RasStatus, rank_of: Callable[[str, int], int | None] | None = None) -> RasVerdict:
    """Who RAS says is behind, in global ranks.

    ``rank_of(host, pid)`` maps a process to its global rank; where it cannot
    (or there is none), a rank of the job's largest communicator (the world's)
    is taken as the global rank, and a rank of a smaller one is said with its
    communicator, process and node but not named a culprit: its number is not
    the job's.  Per communicator and collective kind, the ranks that launched
    fewer operations than most ranks are behind (most ranks wait in a
    collective they never launched); a rank that went on further than most is
    said but not blamed (it waits there for the others).  Ranks that are
    missing, unresponsive, dead, in another state than the others (aborted,
    finalized, still initialising, without the communicator) or that reported
    an error are named too."""
    world = max((c.size or len(c.ranks) + len(c.missing) for c in st.comms), default=0)

    culprits: list[int] = []
    behind: dict[int, str] = {}
    says: list[str] = []
    seen: set[str] = set()

    def say(sentence: str) -> None:
        if sentence not in seen:
            seen.add(sentence)
            says.append(sentence)

    def blame(g: int, what: str) -> None:
        behind.setdefault(g, what)
        if g not in culprits:
            culprits.append(g)

    for comm in st.comms:
        size = comm.size or len(comm.ranks) + len(comm.missing)

        def glob(r: RasRank) -> int | None:
            g = rank_of(r.host, r.pid) if rank_of is not None and r.pid >= 0 else None
            if g is None and (size >= world or len(st.comms) == 1):
                g = r.rank  # the world communicator: its ranks are the job's
            return g

        def who(r: RasRank) -> str:
            g = glob(r)
            if g is not None:
                return f"rank {g}"
            where = f", pid {r.pid} on {r.host}" if r.pid >= 0 else ""
            return f"rank {r.rank} of communicator {comm.hash[:8]} ({size} ranks{where})"

        kinds = set(comm.groups) | {k for r in comm.ranks for k in r.counts}
        for kind in sorted(kinds, key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS)):
            counted = [r for r in comm.ranks if kind in r.counts]
            # most ranks' count (a tie goes to the higher count: those ranks wait in a collective
            # the others never launched)
            sizes: dict[int, int] = {}
            for r in counted:
                if kind not in r.grouped:
                    sizes[r.counts[kind]] = sizes.get(r.counts[kind], 0) + 1
            for n_ranks, op in comm.groups.get(kind, []):
                sizes[op] = sizes.get(op, 0) + n_ranks
            if len(sizes) < 2:
                continue
            rest = max(sizes, key=lambda op: (sizes[op], op))
            odd = [r for r in counted if r.counts[kind] != rest]
            if not odd:  # text, non-verbose: only the groups differ, no rank is named
                say(f"{sizes[rest]} ranks launched {kind} #{rest}; " + "; ".join(
                    f"{sizes[op]} ranks are at #{op}" for op in sorted(op for op in sizes if op != rest)))
                continue
            at_rest = [r for r in counted if r.counts[kind] == rest]
            names = [glob(r) for r in at_rest]
            head = (_names(g for g in names if g is not None)
                    if at_rest and len(at_rest) == sizes[rest] and None not in names else f"{sizes[rest]} ranks")
            parts = []
            for n in sorted({r.counts[kind] for r in odd}):
                rs = [r for r in odd if r.counts[kind] == n]
                gs = [glob(r) for r in rs]
                label = (_names(g for g in gs if g is not None) if None not in gs
                         else ", ".join(who(r) for r in rs))
                if n > rest:
                    parts.append(f"{label} went on to #{n} (and {'waits' if len(rs) == 1 else 'wait'} there)")
                    continue
                parts.append(f"{label} stopped at #{n}" if n else f"{label} launched none")
                for g in gs:
                    if g is not None:
                        blame(g, f"{kind} #{n} (others #{rest})")
            say(f"{head} launched {kind} #{rest}; " + "; ".join(parts))
        tally = dict(comm.status_groups)
        for r in comm.ranks:
            if r.status and "status" not in r.grouped:
                tally[r.status] = tally.get(r.status, 0) + 1
        # the state most ranks are in (a tie: RUNNING)
        usual = max(tally, key=lambda k: (tally[k], k == "RUNNING")) if tally else ""
        for r in comm.ranks:
            if r.status and r.status != usual:
                g = glob(r)
                say(f"{who(r)} {_STATUS_SAYS.get(r.status, 'has status ' + r.status)} ({r.status})")
                if g is not None:
                    blame(g, r.status)
        for r in comm.missing:
            g = glob(r)
            if r.status == "NOCOMM":
                what, short = _STATUS_SAYS["NOCOMM"], "no communicator"
            elif r.dead:
                what, short = "is dead", "dead"
            elif r.unresponsive:
                what, short = "does not answer (stopped, hung in the kernel, or its node unreachable)", "no answer"
            else:
                what, short = "is missing (no data)", "missing"
            where = f" (pid {r.pid} on {r.host})" if r.pid >= 0 and r.host and g is not None else ""
            say(f"{who(r)}{where} {what}")
            if r.pid < 0 and rank_of is not None and (st.silent_processes or st.dead_processes):
                continue  # (2.24/2.25 give no pid here: the processes listed by pid are blamed instead)
            if g is not None:
                blame(g, short)
        for r in comm.ranks:
            if r.error:
                g = glob(r)
                say(f"{who(r)} reported {r.error}")
                if g is not None:
                    blame(g, r.error)
    for label, procs in (("is dead", st.dead_processes), ("does not answer", st.silent_processes)):
        for host, pid in procs:
            g = rank_of(host, pid) if rank_of is not None else None
            say(f"process {pid} on {host}" + (f" (rank {g})" if g is not None else "") + f" {label}")
            if g is not None:
                blame(g, "dead" if label == "is dead" else "no answer")
    text = "; ".join(says) + " (NCCL RAS)" if says else ""
    if text and st.unreliable:
        text += f" [{st.unreliable}]"
    if text and st.partial:
        text += " [the report was cut at ddptop's deadline: ranks it had not come to are not in it]"
    return RasVerdict(culprits, text, behind)


