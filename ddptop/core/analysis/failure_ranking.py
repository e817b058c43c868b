"""Which finding is the cause: the cascade after a failure (the teardown noise
of a crash or a timeout: the others' SIGTERM, their lost peer, the watchdog's
abort) ranked below what started it (``root_cause``), what several ranks'
lines say together (``across_ranks``: a collective mismatch, a desync) and
what the watchdog's counters say (``collective_counters``,
``counter_verdict``).  Pure: findings in, findings out.
"""

from __future__ import annotations

from typing import Mapping

from ddptop.core.analysis.signature_catalog import (
    CAUSE,
    CONSEQUENCE,
    ENDED,
    GENERIC,
    INFO,
    TIMEOUT,
)
from ddptop.core.analysis.signatures import Detail, Finding

# timeouts that PyTorch answers by aborting the process: the SIGABRT (and torchrun's report of it) that
# follows is their consequence, never the cause
ABORTING_TIMEOUTS = frozenset({"nccl-watchdog-timeout", "nccl-heartbeat-timeout"})


# what NCCL or the transport say when a peer went away
PEER_LOSS = frozenset({"peer-connection-reset", "nccl-remote-error", "nccl-ib-flushed", "nccl-comm-aborted"})
# communication errors that are causes on their own, and consequences when a peer went away first
COMM_ERRORS = frozenset({"nccl-system-error", "nccl-internal-error", "nccl-ib-error", "nccl-cuda-error",
                         "nccl-net-plugin-error"})
_ENDINGS = frozenset({"rank-signal", "rank-exit"})
# NCCL's generic errors, and the specific failures that explain them when both are there
_GENERIC_COMM = frozenset({"nccl-system-error", "nccl-internal-error", "nccl-cuda-error", "nccl-ib-error",
                           "nccl-invalid-usage", "nccl-net-plugin-error"})
_EXPLAINS_COMM = frozenset({"cuda-oom", "shm-exhausted", "scheduler-oom-kill", "nccl-ib-async-event",
                            "nccl-no-algorithm", "nccl-no-interface", "nccl-duplicate-gpu", "cuda-ecc", "xid",
                            "cuda-launch-failure", "cuda-illegal-address"})
# NCCL errors after which PyTorch's watchdog aborts the process (a SIGABRT on every rank follows)
ABORTING_ERRORS = COMM_ERRORS | {"nccl-remote-error", "nccl-invalid-usage"}


def cascade_level(f: Finding, findings: list[Finding]) -> int:
    """``f``'s level once the cascade is known:

    * a rank's SIGABRT after a watchdog or heartbeat timeout is that timeout's consequence;
    * how a rank ended (its exit code, a SIGABRT; any signal after a known cause) is a consequence
      of what its own log says (an exception, an out-of-memory): that is the finding;
    * a communication error on a rank that lost a peer (its own log says the peer closed, reset or
      aborted) is a consequence when a rank failed on its own (that rank may share its number: two
      nodes' local ranks);
    * a rendezvous store that could not be reached, where another line says a peer went away (the store's
      host, mid-run; not a line that is the same failure, such as its traceback's `raise` line), is that peer's
      loss; alone (at start: a wrong address, a firewall) it is the finding."""
    if f.level >= CONSEQUENCE:
        return f.level
    if (f.signature == "rank-signal" and f.detail.signal == "SIGABRT"
            and any(x.signature in ABORTING_TIMEOUTS or x.signature in ABORTING_ERRORS for x in findings)):
        return CONSEQUENCE  # (PyTorch's watchdog aborts every rank after an NCCL timeout or error)
    if f.signature in _ENDINGS and any(x.signature == "outside-stop" for x in findings):
        return CONSEQUENCE  # (the ranks' ends after a stop from outside)
    if (f.signature in _ENDINGS and f.rank is not None and f.detail.signal != "SIGKILL"
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
        lenient = f.signature == "rank-exit" or f.detail.signal == "SIGABRT"
        if any(x.rank == f.rank and x.signature not in _ENDINGS and x is not f
               and (x.level < CONSEQUENCE if lenient else x.level == CAUSE) for x in findings):
            return CONSEQUENCE
    if f.signature == "rendezvous-connect-failed" and any(
            x.signature in PEER_LOSS and (x.line, x.source, x.text) != (f.line, f.source, f.text)
            and not any(y.signature == f.signature and (y.line, y.source) == (x.line, x.source) for y in findings)
            for x in findings):
        return CONSEQUENCE  # (the store's connection failed because its host went away: another line says so)
    if f.signature in _GENERIC_COMM and any(x.signature in _EXPLAINS_COMM and x.level < CONSEQUENCE
                                            and not x.detail.recovered for x in findings):
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
                out[f.rank] = (int(f.detail.matched["enqueued"]), int(f.detail.matched["completed"]))
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


def first_failed(findings: list[Finding]) -> set[int]:
    """The ranks the launcher's failure report says failed first (torchrun's *Root Cause* block)."""
    return {f.rank for f in findings if f.detail.root and f.rank is not None and f.detail.summary}


def root_cause(findings: list[Finding], when: Mapping[Finding, float] | None = None) -> Finding | None:
    """The finding most likely to be the cause, not a consequence, in this
    order (``cascade_level``): a known cause; an error no signature knows
    (an exception, any other error line), earliest first, unless a timeout
    came before it (then after the timeouts); how a rank ended; a timeout.
    Among equals: a failure its own warnings explain; one on the rank the
    launcher saw fail first (torchrun's *Root Cause*); then the earliest, by
    the lines' own time stamps (``when``) where every candidate has one,
    else in read order.  A finding after which its own rank made progress
    again (``detail.recovered``: a warning a healthy run prints, a retry
    that worked) is never the root.  None when there are only consequences
    (a lost peer, a stop): they say that something failed elsewhere, not what."""
    when = when or {}
    first = first_failed(findings)
    cands = [(i, f, cascade_level(f, findings)) for i, f in enumerate(findings)
             if f.level < INFO and not f.detail.recovered and f.detail.superseded_by is None]
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
        if lv == GENERIC and timeouts and not f.detail.derived and after_a_timeout(i, f):
            return TIMEOUT + 0.5  # (an unknown error after a timeout: what the timeout set off)
        return lv

    # among equals: a failure its own warnings explain; then the rank the launcher saw fail first (its summary's
    # global rank before its agent's local one); then the earliest
    ranked = [(level(i, f, lv), 0 if f.detail.explained_by else 1,
               0 if (f.detail.root and f.detail.summary) or f.rank in first else
               1 if f.detail.root else 2, pos(i, f), f)
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
    mismatches = [f for f in findings if f.signature == "collective-mismatch" and not f.detail.derived]
    if mismatches:
        ops: dict[int, str] = {}
        for f in mismatches:
            for side in ("a", "b"):
                r, op = f.detail.matched.get(f"rank_{side}"), f.detail.matched.get(f"op_{side}")
                if r is not None and op:
                    shape = f.detail.matched.get(f"shape_{side}")
                    ops.setdefault(int(r), f"{op}" + (f" of shape {shape}" if shape else ""))
        odd, said = _odd_ones(ops, "ran")
        # (the evidence: the odd rank's own check when it printed one)
        first = next((f for f in mismatches if len(odd) == 1 and f.rank == odd[0]), mismatches[0])
        seq = first.detail.matched.get("seq_a")
        out.append(Finding(
            "collective-mismatch", odd[0] if len(odd) == 1 else None, first.line, first.text,
            f"The ranks called different collectives{f' at collective #{seq}' if seq else ''}: {said}. "
            + first.explanation, first.suggested_profiles, CAUSE, first.source,
            Detail(derived=True, odd=odd, collectives=dict(sorted(ops.items())))))
    seen: dict[int, tuple[str, str | None]] = {}
    first_wait = None
    for f in findings:
        if f.signature == "nccl-watchdog-timeout" and f.rank is not None and "seq" in f.detail.matched:
            seen.setdefault(f.rank, (f.detail.matched["seq"], f.detail.matched.get("op")))
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
            Detail(derived=True, odd=odd, collectives=dict(sorted(waits.items())))))
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
