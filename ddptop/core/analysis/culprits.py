"""Who is the odd rank out: the one place that names culprits.

``culprits_of(Evidence(...)) -> Culprits`` is the one entry point.  The caller
gathers what it has (the detector's per-rank state, the stack verdict of every
node judged together, NCCL RAS's answer, the failure findings of the logs with
PyTorch's collective counters and the Flight Recorder's, the run's last steps)
and this module weighs it in one order of trust:

* a job that stopped making progress (``Evidence.failure`` False: the live stall
  alarm, and ``diagnose`` of a run that hung): dead ranks, then ranks behind,
  then an idle GPU among busy ones, then the stacks, then NCCL's own view;
* a job that failed (``Evidence.failure`` True: the live failure alarm and
  ``diagnose`` of logs and saved dumps): the root cause's rank, a pid the
  launcher maps, the collective counters, NCCL's view, the stacks when the logs
  name nobody, then who did not time out or is behind.

Readers (the UI, the journal reader, the wire) never decide culprits: they show
the ones an alarm or a report carries.  Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from ddptop.core.analysis.failure_ranking import (
    PEER_LOSS,
    cascade_level,
    collective_counters,
    counter_verdict,
    root_cause,
)
from ddptop.core.analysis.rank_state import RankState
from ddptop.core.analysis.signature_catalog import ENDED, TIMEOUT
from ddptop.core.analysis.signatures import Finding
from ddptop.core.analysis.wording import exit_words
from ddptop.core.model.evidence import HOT_UTIL, IDLE_UTIL, StackEvidence, Where


@dataclass(frozen=True)
class Culprits:
    culprits: tuple[int, ...] = ()
    where: Mapping[int, Where] = field(default_factory=dict)  # the culprits' (in a mismatch: every waiting rank's)
    evidence: tuple[str, ...] = ()  # each rule that named one, in words
    why: str = ""  # one sentence, when no single rule did (a failure)


@dataclass(frozen=True)
class Evidence:
    """Everything that may name the odd rank out, as the caller has it."""

    failure: bool = False  # a failed job (findings in its logs), else one that stopped making progress
    ranks: tuple[RankState, ...] = ()  # the live analysis's per-rank state (a stall)
    stacks: StackEvidence | None = None  # every node's stacks, judged together (stack_judge.combine)
    ras: tuple[int, ...] | None = None  # NCCL RAS's culprits at this stall
    findings: tuple["Finding", ...] = ()  # a failure's findings, its root cause among them
    seen: frozenset[int] = frozenset()  # every rank the logs show
    last_steps: Mapping[int, int | None] = field(default_factory=dict)
    ras_answers: tuple[tuple[int, ...], ...] = ()  # the culprits of each NCCL RAS answer kept (post-mortem)
    flight: tuple[tuple[int, ...], ...] = ()  # the culprits of each Flight Recorder analysis (who diverged)
    when: Mapping["Finding", float] = field(default_factory=dict)  # each finding's time, where its line said it


def culprits_of(ev: Evidence) -> Culprits:
    """The culprits, from all the evidence, in one order of trust (see the module)."""
    if not ev.failure:
        return _stall(ev.ranks, ev.stacks, ev.ras)
    found = _failure(list(ev.findings), set(ev.seen), ev.last_steps, ev.ras_answers, ev.when, ev.flight)
    v = ev.stacks
    if not found.culprits and v is not None and v.culprits and not found.why:
        # the logs name nobody: the stacks' odd rank out (saved dumps beside the logs)
        return Culprits(tuple(v.culprits), v.shown(), ("stacks: " + v.summary,), "")
    return found


def overdue(stacks: StackEvidence, ranks: Iterable[int]) -> StackEvidence:
    """The stacks' verdict once ddptop's patience with work ran out: the ranks
    the others wait for (working alone, or in I/O: a hung file system) are
    now the culprits of a hang."""
    return replace(stacks, hung=True, culprits=tuple(sorted(set(ranks))))


def _stall(ranks: Iterable[RankState], stacks: StackEvidence | None, ras: tuple[int, ...] | None = None) -> Culprits:
    """The culprits of a stall, strongest evidence last (it wins):

    1. a dead, zombie or disk-waiting rank;
    2. a rank whose step count is behind the others';
    3. a rank whose GPU is idle while the others' are busy;
    4. the stacks: the rank(s) outside the wait the others are in, or
       moving while they are frozen, or (a mismatch) the minority waiting
       elsewhere;
    5. NCCL's own view (RAS): who launched fewer collectives, who is missing
       or dead."""
    everyone = sorted(ranks, key=lambda s: s.rank)
    evidence: list[str] = []
    culprits: list[int] = []
    for st in everyone:
        if not st.alive or st.status in ("zombie", "dead"):
            culprits.append(st.rank)
            gone = "dead" if not st.alive else st.status
            if not st.alive and st.exit_code is not None:

                gone = exit_words(st.exit_code)
            evidence.append(f"rank {st.rank} {'is ' if not gone.startswith('exited') else ''}{gone}")
        elif st.status == "disk-sleep":
            culprits.append(st.rank)
            evidence.append(f"rank {st.rank} is in disk wait (D state)")
    steps = {st.rank: st.step for st in everyone if st.step is not None}
    if not culprits and len(steps) >= 2 and len(set(steps.values())) > 1:
        top = max(steps.values())
        behind = [r for r, s in steps.items() if s < top]
        if len(behind) < len(steps) / 2 or len(behind) == 1:
            culprits += behind
            evidence += [f"rank {r} is at step {steps[r]}, the others at {top}" for r in behind]
    utils = {st.rank: st.util for st in everyone if st.util is not None and st.alive}
    hot = [r for r, u in utils.items() if u >= HOT_UTIL]
    idle = [r for r, u in utils.items() if u <= IDLE_UTIL]
    if not culprits and hot and idle and len(idle) < len(utils):
        culprits += idle
        others = f"rank {hot[0]} is" if len(hot) == 1 else f"ranks {', '.join(map(str, hot))} are"
        evidence += [f"rank {r}'s GPU is idle ({utils[r]:.0f}%) while {others} busy "
                     f"({min(utils[h] for h in hot):.0f}%)" for r in idle]
    where: dict[int, Where] = {}
    v = stacks
    if v is not None and v.hung and (v.culprits or v.mismatch):
        if v.culprits:
            culprits = list(v.culprits)
        where = v.shown()
        where = {r: w for r, w in where.items() if r in v.culprits or v.mismatch}
    if v is not None and v.summary and not v.hung:
        evidence.insert(0, f"stacks (unclear): {v.summary}")
    elif v is not None and v.error:
        evidence.append(f"no stacks: {v.error}")
    if ras:
        if set(ras) != set(culprits):
            where = {r: w for r, w in where.items() if r in ras}
        culprits = list(ras)
    return Culprits(tuple(sorted(set(culprits))), where, tuple(evidence))


# timeouts a rank reports while it waits in a collective for the others
WAITED = ("nccl-watchdog-timeout", "nccl-heartbeat-timeout", "gloo-timeout")


def _failure(findings: list["Finding"], seen: set[int], last_steps: Mapping[int, int | None],
             ras: Iterable[Iterable[int]] = (), when: Mapping["Finding", float] | None = None,
             flight: Iterable[Iterable[int]] = ()) -> Culprits:
    """The culprits of a failure, from its findings (``seen``: every rank the
    logs show; ``ras``: the culprits of each NCCL RAS answer kept):

    * the root cause's rank when the root cause is a rank's own failure, unless
      most ranks failed the same way (then nobody is the odd one out);
    * a process id the root cause names that the launcher's report maps to a
      rank (the kernel's Xid);
    * the collective counters of PyTorch's watchdog lines (who is behind);
    * NCCL's own view (RAS);
    * the ranks that did not time out while the others did, else the ranks
      whose last step is behind."""

    rc = root_cause(findings, when)
    counters = collective_counters(findings)
    culprits, _said = counter_verdict(counters)
    why = ""
    if rc is not None and rc.detail.derived and not culprits:
        # what several ranks' lines say together (a collective mismatch, a desync): the odd ones, if any
        culprits = rc.detail.odd
        why = "" if culprits else rc.explanation.split(". ")[0]
    if rc is not None and rc.rank is None and rc.detail.pid:
        # a line that names a process, not a rank (the kernel's Xid): the launcher's report says whose pid it is
        by_pid = {f.detail.pid: f.rank for f in findings if f.detail.pid and f.rank is not None
                  and f.signature in ("rank-signal", "rank-exit")}
        if rc.detail.pid in by_pid:
            culprits = (by_pid[rc.detail.pid],)
            why = f"pid {rc.detail.pid} is rank {culprits[0]}'s (torchrun's failure report)"
    if rc is not None and rc.rank is not None and rc.level <= ENDED and not culprits and not rc.detail.derived:
        # the same failure (not its consequences: the others' SIGTERM, their lost peer) on most ranks
        kind = (rc.signature, rc.detail.signal)
        same = sorted({f.rank for f in findings if (f.signature, f.detail.signal) == kind
                       and f.rank is not None and cascade_level(f, findings) <= ENDED})
        if len(same) >= 2 and len(same) * 2 > len(seen):
            why = f"{rc.signature} on ranks {', '.join(map(str, same))}: the same failure on most ranks, no odd one out"
        else:
            culprits = (rc.rank,)
    for r in ras:
        r = tuple(r)
        if not culprits and r:
            culprits = r  # NCCL's own view
    for r in flight:
        r = tuple(r)
        if not culprits and r:
            culprits = r  # PyTorch's Flight Recorder: the rank whose collectives diverged, or that did not answer
    if not culprits and not why and (rc is None or rc.level >= TIMEOUT) and not (rc and rc.detail.derived):
        culprits, why = _behind(findings, seen, last_steps)
    return Culprits(tuple(culprits), {}, (), why)


def _behind(findings: list["Finding"], seen: set[int],
            last_steps: Mapping[int, int | None]) -> tuple[tuple[int, ...], str]:
    """When nothing names a culprit: the ranks that did not time out while the
    others did (they were not in the collective the others waited in), else the
    ranks whose last training step is behind the others'."""
    waited = {f.rank for f in findings if f.signature in WAITED and f.rank is not None}
    others = sorted(seen - waited)
    if len(waited) >= 2 and others and len(others) < len(waited):
        return tuple(others), (f"{_r(sorted(waited))} timed out waiting in a collective; {_r(others)} did "
                               f"not: {'it was' if len(others) == 1 else 'they were'} elsewhere (its last lines say "
                               "where)")
    steps = {r: s for r, s in last_steps.items() if s is not None}
    if len(steps) >= 2 and len(set(steps.values())) > 1:
        top = max(steps.values())
        behind = sorted(r for r, s in steps.items() if s < top)
        if len(behind) * 2 < len(steps):
            return tuple(behind), "; ".join(f"rank {r}'s last training step was {steps[r]}" for r in behind) + (
                f", the others reached {top}")
    return (), ""


def _r(rs: list[int]) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


# where a lost peer is: "[10.0.0.5]:43210", "10.0.0.5:43210", NCCL's "node-5<44821>" / "10.0.0.5<44821>"
_ADDRESS = re.compile(r"\[(?P<ip6>[0-9a-fA-F:.]*:[0-9a-fA-F:.]+)\]:(?P<port6>\d+)|"
                      r"\[?(?P<ip>\d{1,3}(?:\.\d{1,3}){3})\]?(?::(?P<port>\d{1,5})\b|<(?P<nport>\d+)>)?|"
                      r"\b(?P<host>[A-Za-z][\w.-]*)<(?P<hport>\d+)>|\[(?P<bhost>[A-Za-z][\w.-]*)\]:(?P<bport>\d+)|"
                      # (a peer named by its host alone: "Connection closed by remote peer gpu004")
                      r"\b(?:by|from) (?:remote )?peer (?P<phost>[A-Za-z][\w-]*(?:\.[\w-]+)*)(?![\w<:.\[])")
_REMOTE = re.compile(r"\bremote=(\[[^\]]+\]:\d+|\S+)")
_PEER_RANK = re.compile(r"\b(?:peer|remote|from|to) (?:local)?[Rr]ank (?P<rank>\d+)\b|\b[Rr]ank (?P<r2>\d+) (?:is )?"
                        r"(?:disconnected|unreachable|dead|died|exited)")


@dataclass(frozen=True)
class LostPeers:
    """What logs with only consequences point to: who lost whom."""

    reported_by: tuple[int, ...] = ()  # the ranks that lost a peer
    peers: tuple[str, ...] = ()  # the addresses they lost ("10.0.0.5:43210", "node-5:44821")
    ranks: tuple[int, ...] = ()  # the ranks they name as the lost peer
    signatures: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"reported_by": list(self.reported_by), "peers": list(self.peers), "ranks": list(self.ranks),
                "signatures": list(self.signatures)}


def lost_peers(findings: list["Finding"]) -> LostPeers:
    """The peers that the lost-peer findings name (addresses, ranks): where
    the cause is, when these logs hold only its consequences."""

    reported, peers, ranks, sigs = set(), [], set(), []
    texts = [f for f in findings if f.signature in PEER_LOSS]
    for f in texts:
        if f.rank is not None:
            reported.add(f.rank)
        if f.signature not in sigs:
            sigs.append(f.signature)
        for text in [f.text] + [w.text for w in f.detail.explained_by]:
            remote = _REMOTE.search(text)
            if remote:
                text = remote.group(1)  # (a socket's "addr=" is this side's own: its "remote=" is the peer)
            for m in _ADDRESS.finditer(text):
                ip = m.group("ip6") or m.group("ip") or m.group("host") or m.group("bhost") or m.group("phost")
                port = m.group("port6") or m.group("port") or m.group("nport") or m.group("hport") or m.group("bport")
                if not ip or (m.group("ip") and not port and "peer" not in text.lower()):
                    continue
                peer = f"{ip}:{port}" if port else ip
                if peer not in peers:
                    peers.append(peer)
            for m in _PEER_RANK.finditer(text):
                r = int(m.group("rank") or m.group("r2"))
                if r != f.rank:
                    ranks.add(r)
    return LostPeers(tuple(sorted(reported)), tuple(peers[:8]), tuple(sorted(ranks)), tuple(sigs))
