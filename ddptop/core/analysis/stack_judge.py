"""Who hangs and who is the odd one out, from where every rank is (pure).

``judge(where, io, frames)`` takes each rank's ``Where`` (its status across the
samples, its kind, its stack's signature) and decides once, for one node or
for the whole job: ``hung``, the ``culprits``, the ``waiting`` ranks, a
``mismatch``, a ``deadlock`` in the CUDA driver, the ``workers`` the others
wait for.  ``analysis.stack_verdict.verdict`` calls it on one node's samples;
``combine`` calls it on every node's ranks together (never a union of each
node's culprits: a node holding only waiting ranks names nobody, the node
holding the odd rank out names it, and together they are one verdict).

The rules (the same at 2 ranks and at 1,024):

* every rank frozen => hung; ranks waiting (in a collective, backward, at a
  GPU sync, in NCCL) while others move => hung and the movers are the
  culprits, unless a mover itself passed through a wait between samples
  (then the job progresses); a frozen rank outside the wait the others are in
  is a culprit; ranks waiting at different places are a mismatch whose
  minority is the culprit when there is a majority; every rank on the CUDA
  driver's lock is a deadlock with no odd rank out; all moving => no hang;
* a rank that cannot be told ("unclear": maybe a GPU sync, nothing to tell)
  is never a culprit nor a waiter, unless it sits elsewhere than a majority
  that waits (then it is the odd one out whichever it is);
* with one sample per rank ("seen") frozen and moving cannot be told apart:
  ``hung`` is None, the odd rank out is still named by where each rank is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping

from ddptop.core.model.evidence import (
    WAITING_KINDS,
    StackEvidence,
    StackGroup,
    Where,
    ranks_text,
)

__all__ = ["judge", "combine", "describe", "signature_of"]


def signature_of(w: Where) -> tuple[str, ...]:
    """The stack a rank shares with others (the signature its samples gave;
    for evidence of an earlier release, where it is)."""
    return w.signature or (w.kind, w.file, str(w.line), w.call)


def describe(w: Where) -> str:
    """Where one rank is, as the verdict's summary says it."""
    status, text = w.status, w.text
    if status == "unclear":
        return (f"cannot tell: {text.replace(' called from ', ' from ', 1)}, possibly a GPU synchronisation "
                "(no native frames, no GPU telemetry to tell)")
    at = f"{w.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{w.line}" if w.line else ""
    if status in ("frozen", "seen") and w.kind == "backward":
        return "waits in backward (DDP all-reduce)" + (f" at {at}" if at and w.file else "")
    if status in ("frozen", "seen") and w.kind == "collective":
        return text.replace(" called from ", " from ", 1)
    if w.kind in ("gpu-wait", "gpu-lock", "nccl"):
        return text.replace(" called from ", " at ", 1)
    if status in ("frozen", "seen"):
        return text if text.startswith("waits ") else "is " + text
    if status == "busy":
        return "is busy " + text.replace(" (running)", "") + " (on CPU, same line in every sample)"
    if status == "moving":
        return "is moving (stack changes between samples), last " + text
    return "has no usable stack"


def _plural(desc: str, n: int) -> str:
    if n < 2:
        return desc
    verb, _, rest = desc.partition(" ")
    return {"waits": "wait", "is": "are"}.get(verb, verb) + " " + rest


def _minority(sigs: Mapping[int, tuple[str, ...]]) -> list[int]:
    by: dict[tuple[str, ...], list[int]] = {}
    for r, s in sigs.items():
        by.setdefault(s, []).append(r)
    if len(by) < 2:
        return []
    sizes = sorted(len(v) for v in by.values())
    if sizes[-1] == sizes[-2]:
        return []  # no majority: nobody is the odd one out
    return [r for v in by.values() if len(v) < sizes[-1] for r in v]


def groups_of(where: Mapping[int, Where], culprits: Iterable[int] = (),
              frames: Mapping[int, tuple[tuple[str, ...], tuple[int, ...]]] | None = None) -> tuple[StackGroup, ...]:
    """Ranks sharing a status and (frozen, busy, seen) one stack, described once, largest first."""
    odd = set(culprits)
    by: dict[tuple, list[int]] = {}
    for r, w in where.items():
        key = (w.status, signature_of(w)) if w.status in ("frozen", "busy", "seen", "unclear") else (w.status,)
        by.setdefault(key, []).append(r)
    out = []
    for key, rs in by.items():
        st = key[0]
        w = where[rs[0]]
        kind = w.kind if st in ("frozen", "busy", "seen") else ("moving" if st == "moving" else "unknown")
        desc = describe(w) if st in ("frozen", "busy", "seen", "unclear") else (
            "stack changes between samples (working)" if st == "moving" else "no usable stack samples")
        fr, user = (frames or {}).get(rs[0], ((), ()))
        out.append(StackGroup(tuple(sorted(rs)), st, kind, _plural(desc, len(rs)), any(r in odd for r in rs),
                              tuple(fr), tuple(user)))
    return tuple(sorted(out, key=lambda g: (-len(g.ranks), g.ranks)))


def judge(where: Mapping[int, Where], io: Iterable[int] = (),
          frames: Mapping[int, tuple[tuple[str, ...], tuple[int, ...]]] | None = None,
          t: float = 0.0, node: str = "", error: str = "") -> StackEvidence:
    """The verdict of every rank's ``Where`` (see the module).  ``io``: the
    ranks in I/O in every sample (a checkpoint write: work, unless it lasts);
    ``frames``: each rank's main-thread frames, for the groups."""
    where = {r: where[r] for r in sorted(where)}
    status = {r: w.status for r, w in where.items()}
    one_sample = any(st == "seen" for st in status.values())
    unclear = [r for r, s in status.items() if s == "unclear"]
    notes: list[str] = []
    if unclear:
        # a rank that cannot be told (stuck there, or waiting at a GPU sync?) but sits elsewhere than a
        # majority that waits is the odd one out either way: stuck, or waiting at another sync (a mismatch)
        waiters = [r for r, w in where.items() if w.status in ("frozen", "seen") and w.kind in WAITING_KINDS]
        waiting_sigs = {signature_of(where[r]) for r in waiters}
        odd = [r for r in unclear if signature_of(where[r]) not in waiting_sigs]
        if waiting_sigs and odd and len(odd) < len(waiters):
            for r in odd:
                where[r] = replace(where[r], status="frozen" if where[r].samples != 1 else "seen")
                status[r] = where[r].status
            unclear = [r for r in unclear if r not in odd]
            notes.append(f"{ranks_text(odd)} {'has' if len(odd) == 1 else 'have'} no native frames: "
                         f"stuck there, or waiting at a GPU sync, but not where the others wait")
    known = [r for r, s in status.items() if s not in ("unknown", "unclear")]
    if not known:
        why = ("cannot tell: no usable stack" if not unclear else
               "cannot tell: " + "; ".join(f"rank {r} {describe(where[r])}" for r in unclear))
        return StackEvidence(t, None, where=where, groups=groups_of(where, (), frames), summary=why, error=error,
                             node=node)

    io = [r for r in known if r in set(io) and status[r] in ("frozen", "busy")]
    frozen = [r for r in known if status[r] in ("frozen", "seen") and r not in io]
    movers = [r for r in known if status[r] in ("moving", "busy") or r in io]
    waiting = [r for r in frozen if where[r].kind in WAITING_KINDS]
    outside = [r for r in frozen if r not in waiting]
    locked = [r for r in frozen if where[r].kind == "gpu-lock"]
    mismatch = deadlock = False
    hung: bool | None
    culprits: list[int]

    if not movers:
        hung = True
        if (waiting or unclear) and outside:
            # (a rank that cannot be told may be waiting at a GPU sync: the ranks outside any wait are odd still)
            culprits = outside
        elif waiting:
            # everyone waits: at one place (the same collective: no odd one out), or at several (a mismatch:
            # the minority took another path, when there is a majority)
            sigs = {r: signature_of(where[r]) for r in waiting}
            mismatch = len(set(sigs.values())) > 1
            culprits = _minority(sigs)
        elif locked and len(locked) == len(frozen) and len(frozen) > 1:
            # every rank blocked on the CUDA driver's lock: a deadlock in the driver, nobody the odd one out
            culprits, deadlock = [], True
        else:
            culprits = _minority({r: signature_of(where[r]) for r in frozen})
            if not culprits and len(frozen) == 1 and status[frozen[0]] == "frozen":
                culprits = list(frozen)  # a single rank stuck outside any collective (seen stuck in 2 samples)
    elif waiting:
        passed = [r for r in movers if where[r].passed]
        if passed:
            hung, culprits = False, []
            notes.append(f"{ranks_text(passed)} went through a collective/backward between samples, so "
                         f"{ranks_text(waiting)}, seen waiting there in every sample, most likely just waits"
                         f" for the others at each step")
        elif io and not outside and all(r in io for r in movers):
            hung, culprits = False, []
            notes.append(f"{ranks_text(io)} {'is' if len(io) == 1 else 'are'} in I/O (a checkpoint write?) and "
                         f"{ranks_text(waiting)} {'waits' if len(waiting) == 1 else 'wait'} for it: work, unless it lasts")
        else:
            hung = True
            culprits = [r for r in movers if r not in io] + outside or list(io)
    elif outside and all(status[r] == "busy" and r not in io for r in movers):
        # nobody's stack changes: some ranks frozen in their own code, the others spinning on one line
        # (polling for the frozen ones, as a collective's wait does): the frozen ones are the culprits
        hung, culprits, waiting = True, outside, list(movers)
        notes.append(f"{ranks_text(movers)} {'spins' if len(movers) == 1 else 'spin'} on one line (polling) while "
                     f"{ranks_text(outside)} {'is' if len(outside) == 1 else 'are'} frozen")
    else:
        hung = None if unclear else False
        culprits, waiting = [], []

    culprits = sorted(set(culprits))
    waiting = sorted(set(waiting) - set(culprits))
    workers: list[int] = []
    if hung and culprits and waiting and all(where[r].working for r in culprits):
        # the others wait for ranks that visibly work (rank 0 evaluating alone): not a hang, unless it lasts
        hung, workers, culprits = False, culprits, []
        notes.append(f"{ranks_text(waiting)} {'waits' if len(waiting) == 1 else 'wait'} for {ranks_text(workers)}, "
                     f"which {'works' if len(workers) == 1 else 'work'}: not a hang unless it lasts")
    if unclear:
        notes.append("; ".join(f"rank {r} {describe(where[r])}" for r in unclear))
    if one_sample:
        notes.insert(0, "one sample per rank: frozen and moving cannot be told apart")
        hung = None if hung else hung
    groups = groups_of(where, culprits, frames)
    summary = _summary(hung, culprits, groups, where, notes, mismatch, deadlock, one_sample)
    return StackEvidence(t, hung, tuple(culprits), tuple(waiting), mismatch, where, tuple(io), summary, error, node,
                         groups, tuple(workers), deadlock)


def _summary(hung: bool | None, culprits: list[int], groups: tuple[StackGroup, ...], where: Mapping[int, Where],
             notes: list[str], mismatch: bool, deadlock: bool, one_sample: bool) -> str:
    parts = [f"rank {r} {describe(where[r])}" + (f" (on {where[r].node})" if where[r].node else "")
             for r in culprits]
    for g in groups:
        rs = [r for r in g.ranks if r not in culprits]
        if not rs or g.status == "unclear":
            continue
        if g.status in ("frozen", "busy", "seen"):
            parts.append(f"{ranks_text(rs)} {_plural(describe(where[rs[0]]), len(rs))}")
        elif g.status == "moving":
            parts.append(f"{ranks_text(rs)} {'is' if len(rs) == 1 else 'are'} moving")
        else:
            parts.append(f"{ranks_text(rs)}: no usable samples")
    head = {True: "hung: ", False: "no hang: ", None: ""}[hung]
    if deadlock:
        head = "hung: a deadlock in the CUDA driver (every rank blocked on its lock), no odd rank out: "
    elif hung and mismatch:
        head = "hung, ranks wait in different places: " if culprits else "hung, no single culprit: "
    elif hung and not culprits:
        head = "hung, no single culprit: "
    elif one_sample and culprits:
        head = "if it is hung, the odd rank out: "
    return head + "; ".join(notes[:1] + parts + notes[1:] if one_sample else parts + notes)


def combine(evidence: list[StackEvidence]) -> StackEvidence | None:
    """One verdict from the latest evidence of each node: every node's ranks
    judged together (``judge``), each ``Where`` keeping its node."""
    if not evidence:
        return None
    if len(evidence) == 1:
        return evidence[0]
    t = max(v.t for v in evidence)
    where: dict[int, Where] = {}
    frames: dict[int, tuple[tuple[str, ...], tuple[int, ...]]] = {}
    for v in evidence:
        for r, w in v.where.items():
            where[r] = w if w.node else replace(w, node=v.node)
        for g in v.groups:
            for r in g.ranks:
                frames[r] = (g.frames, g.user)
    error = "; ".join(v.error for v in evidence if v.error)
    io = sorted({r for v in evidence for r in v.io})
    return judge(where, io, frames, t=t, error=error)
