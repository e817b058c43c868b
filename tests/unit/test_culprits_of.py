"""culprits_of: the one place that names culprits, for live stalls, failures and post-mortems alike."""

from __future__ import annotations

from dataclasses import replace

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


def test_one_rank_waiting_on_its_busy_gpu_is_said_as_such_not_as_every_rank_in_one_collective():
    """As seen on a real H200 (tests/gpu/test_one_gpu_hang_real.py): a one-rank job whose GPU runs a kernel
    that does not end.  There is no other rank to wait for or to compare with, so the alarm says that, then
    where the rank waits; and a rank at module level is "at file:line", not "in  at"."""
    from ddptop.core.analysis.wording import stall_message, where_words

    w = Where(0, "frozen", "gpu-wait", function="<module>", file="/tmp/job.py", line=22, call="item",
              code="value = loss.item()  # WAIT", gpu="cuda-runtime", native="cudaStreamSynchronize (libcudart.so.13)",
              library="the CUDA runtime")
    v = StackEvidence(hung=True, waiting=(0,), where={0: w})
    ranks = [RankState(0, step=19, util=100.0)]
    msg = stall_message("hot", ranks, ranks, 5.2, 0.1, v, [])
    assert msg.startswith("Hot stall: GPUs busy but no step progress: the only rank watched waits, with no "
                          "other rank to compare it with."), msg
    assert "every rank waits in the same collective" not in msg
    assert "Rank 0 waits on the GPU at job.py:22 `value = loss.item()` (`cudaStreamSynchronize`, the CUDA " \
           "runtime), its GPU at 100%." in msg, msg
    # two ranks in one wait: the old sentence stands
    two = [RankState(0, step=19, util=100.0), RankState(1, step=19, util=100.0)]
    both = StackEvidence(hung=True, waiting=(0, 1), where={0: w, 1: replace(w, rank=1)})
    assert "every rank waits in the same collective" in stall_message("hot", two, two, 5.2, 0.1, both, [])
    sleeping = Where(0, "frozen", "sleep/wait in user code", function="<module>", file="/tmp/job.py", line=15,
                     call="time.sleep")
    assert where_words(sleeping) == "is at job.py:15 (`time.sleep`)"


def test_at_1024_ranks_the_waiting_group_is_said_with_its_count_and_ranges_the_culprit_by_its_node():
    from ddptop.core.analysis.wording import stall_message

    wait = Where(0, "frozen", "gpu-wait", function="train", file="/w/train.py", line=88, call="item",
                 gpu="cuda-runtime", native="cudaStreamSynchronize (libcudart.so.12)", library="the CUDA runtime")
    stuck = Where(777, "frozen", "data", function="next_batch", file="/w/loader.py", line=40, node="node-97")
    where = {r: replace(wait, rank=r, node=f"node-{r // 8}") for r in range(1024) if r != 777}
    where[777] = stuck
    v = StackEvidence(hung=True, culprits=(777,), waiting=tuple(r for r in range(1024) if r != 777), where=where)
    ranks = [RankState(r, step=120 if r != 777 else 119, util=100.0 if r != 777 else 0.0) for r in range(1024)]
    msg = stall_message("collective", ranks, ranks, 9.0, 0.5, v, [777])
    assert "Odd rank out: rank 777 on node-97 waits for data at loader.py:40" in msg, msg
    assert "1,023 ranks (0-776,778-1023) wait on the GPU at train.py:88" in msg, msg
    # a few ranks: as before, no count
    two = StackEvidence(hung=True, culprits=(1,), waiting=(0, 2), where={0: wait, 2: replace(wait, rank=2),
                                                                         1: replace(stuck, rank=1, node="")})
    msg = stall_message("collective", ranks[:3], ranks[:3], 9.0, 0.5, two, [1])
    assert "Ranks 0,2 wait on the GPU at train.py:88" in msg, msg
