"""culprits_of: the one place that names culprits, for live stalls, failures and post-mortems alike."""

from __future__ import annotations

from ddptop.core.analysis.culprits import Evidence, culprits_of, overdue
from ddptop.core.model.evidence import StackEvidence, Where
from ddptop.core.analysis.rank_state import RankState
from ddptop.core.analysis.signatures import SignatureMatcher

WATCHDOG = ("[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=40, OpType=ALLREDUCE, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.")


def timeouts(*ranks):
    m = SignatureMatcher()
    return tuple(f for r in ranks for f in m.feed(WATCHDOG.format(r=r), r))


def test_when_the_logs_name_nobody_the_flight_recorder_does():
    ev = Evidence(failure=True, findings=timeouts(0, 1, 2, 3), seen=frozenset({0, 1, 2, 3}), flight=((2,),))
    assert culprits_of(ev).culprits == (2,)
    # NCCL's own view (RAS) comes before it
    assert culprits_of(Evidence(failure=True, findings=ev.findings, seen=ev.seen, flight=((2,),),
                                ras_answers=((1,),))).culprits == (1,)


def test_when_the_logs_name_nobody_the_stacks_do():
    v = StackEvidence(hung=True, culprits=(3,), waiting=(0, 1, 2), where={3: Where(3, "frozen", "user code")})
    ev = Evidence(failure=True, findings=timeouts(0, 1, 2, 3), seen=frozenset(range(4)), stacks=v)
    assert culprits_of(ev).culprits == (3,)


def test_a_stall_names_the_stacks_culprit_over_a_rank_behind_and_ras_over_both():
    ranks = (RankState(0, step=10), RankState(1, step=9))
    v = StackEvidence(hung=True, culprits=(0,), waiting=(1,), where={0: Where(0, "frozen", "user code")})
    assert culprits_of(Evidence(ranks=ranks)).culprits == (1,)  # behind
    assert culprits_of(Evidence(ranks=ranks, stacks=v)).culprits == (0,)  # the stacks
    assert culprits_of(Evidence(ranks=ranks, stacks=v, ras=(1,))).culprits == (1,)  # NCCL's own view


def test_after_ddptops_patience_those_the_others_waited_for_are_the_culprits():
    v = StackEvidence(hung=False, workers=(2,), waiting=(0, 1))
    late = overdue(v, v.workers)
    assert late.hung is True and late.culprits == (2,)
