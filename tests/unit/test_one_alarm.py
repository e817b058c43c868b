"""One hang, one alarm across nodes (issue 27): the folding rule of ``analysis.nodes`` on synthetic
events, and the cross-node detector naming the culprit's node in the alarm's fields.  Pure, fast."""

from ddptop.core.analysis.analyzer import Analyzer
from ddptop.core.analysis.nodes import ACROSS, HOLD, HOLD_SUSPECTED, OneAlarm, stands_alone
from ddptop.core.model.events import AlarmEvent, LogBatch, NoteEvent, ProgressEvent, RankEvent, StacksEvent
from ddptop.core.model.evidence import Where

TWO = {0: "node-a", 1: "node-b"}  # rank -> node: one rank per node, the culprit (rank 1) on the second


def stall(node, culprits=(), id="stall-collective", t=100.0, ranks=(0, 1), msg="Collective hang: ..."):
    return AlarmEvent(t, type="stall", id=id, ranks=tuple(ranks), culprits=tuple(culprits), message=msg, node=node)


def apply(f, events=(), cross=(), now=100.0, silence=90.0, rank_nodes=TWO, flush=False, suspected=False):
    return f.apply(list(events), list(cross), now, silence_began=silence, rank_nodes=rank_nodes, flush=flush,
                   suspected=suspected)


def alarms(evs):
    return [e for e in evs if isinstance(e, AlarmEvent)]


def test_the_cross_node_alarm_takes_the_nodes_own_in_as_its_evidence():
    f = OneAlarm()
    own_a = stall("node-a", msg="Collective hang: the other ranks wait. Rank 0 waits in `all_reduce`.")
    own_b = stall("node-b", (1,), id="stall-idle", ranks=(1,), msg="Idle stall: no progress and nothing busy. ...")
    log = LogBatch.fast(100.0, 0, "stdout", 0, "logs/0", [0], ["step 20"], node="node-a")
    # the nodes' own alarms come first: held back, the rest of the stream goes through
    assert apply(f, [log, own_a, own_b], now=100.0) == [log]
    cross = stall("node-b", (1,), id="stall-hot", msg="Hot stall: ... Odd rank out: rank 1 on node-b ...")
    out = apply(f, [], [cross], now=100.3)
    (a,) = alarms(out)
    assert a.id == "stall-hot" and a.node == "node-b" and a.culprits == (1,)
    assert [(d.node, d.id, list(d.culprits)) for d in a.folded] == [
        ("node-a", "stall-collective", []), ("node-b", "stall-idle", [1])]
    assert a.folded[0].message == own_a.message  # their text is kept whole
    assert "node-a: Collective hang, none of its ranks the odd one out" in a.message, a.message
    assert "node-b: Idle stall, naming rank 1" in a.message, a.message
    # nothing more is shown for this hang, however long it lasts
    assert alarms(apply(f, now=100.0 + 10 * HOLD)) == []


def test_a_node_alarm_after_the_cross_node_one_is_a_note_with_its_text():
    f = OneAlarm()
    cross = stall("node-b", (1,), id="stall-hot")
    assert alarms(apply(f, [], [cross], now=100.0)) == [cross]
    late = stall("node-a", msg="Collective hang: rank 0 still working after 300 s.")
    out = apply(f, [late], now=400.0)
    assert alarms(out) == []
    (note,) = out
    assert isinstance(note, NoteEvent) and note.level == "info" and note.node == "node-a"
    assert "[stall-hot] (node-b)" in note.message and late.message in note.message


def test_a_new_silence_is_a_new_episode():
    f = OneAlarm()
    apply(f, [], [stall(ACROSS, id="stall-hot")], now=100.0, silence=90.0)
    again = stall("node-b", (1,), t=300.0)
    assert apply(f, [], [again], now=300.0, silence=250.0) == [again]  # life came back at 250 s


def test_without_a_cross_node_alarm_a_node_naming_its_own_culprit_stands_alone():
    f = OneAlarm()
    own_a, own_b = stall("node-a"), stall("node-b", (1,), id="stall-idle")
    assert stands_alone(own_b, None, TWO) and not stands_alone(own_b, stall(ACROSS), TWO)
    assert not stands_alone(own_a, None, TWO)
    assert apply(f, [own_a, own_b], now=100.0) == []
    assert apply(f, now=100.0 + HOLD / 2) == []
    (a,) = apply(f, now=100.0 + HOLD)
    assert a.node == "node-b" and a.id == "stall-idle" and [d.node for d in a.folded] == ["node-a"]


def test_a_node_alarm_naming_nobody_of_its_own_is_never_lost_and_points_elsewhere():
    f = OneAlarm()
    own_a = stall("node-a")
    assert apply(f, [own_a], now=100.0) == []
    (a,) = apply(f, now=100.0 + HOLD)
    assert a.node == "node-a" and "the cause may be on node-b" in a.message, a.message


def test_a_node_that_has_every_rank_holds_the_whole_story():
    f = OneAlarm()
    only_a = {0: "node-a", 1: "node-a"}
    cross = stall("node-a", (1,), id="stall-hot")
    own = stall("node-a", (1,), id="stall-collective", msg="Collective hang: the other ranks wait.")
    assert stands_alone(own, cross, only_a)
    assert apply(f, [], [cross], now=100.0, rank_nodes=only_a) == []  # held: the node's own may tell it all
    (a,) = apply(f, [own], now=100.2, rank_nodes=only_a)
    assert a.id == "stall-collective" and a.node == "node-a"
    assert [(d.node, d.id) for d in a.folded] == [(ACROSS, "stall-hot")]
    # and when the node's own never comes, the cross-node one is shown after all
    g = OneAlarm()
    apply(g, [], [cross], now=100.0, rank_nodes=only_a)
    assert alarms(apply(g, now=100.0 + HOLD, rank_nodes=only_a)) == [cross]


def test_crash_and_signature_alarms_pass_untouched_and_the_end_releases_what_is_held():
    f = OneAlarm()
    crash = AlarmEvent(100.0, type="crash", id="rank-exit", ranks=(1,), culprits=(1,), node="node-b")
    sig = AlarmEvent(100.0, type="signature", id="nccl-watchdog-timeout", ranks=(0,), node="node-a")
    own_a = stall("node-a")
    assert apply(f, [crash, own_a, sig], now=100.0) == [crash, sig]
    (a,) = apply(f, now=100.1, flush=True)
    assert a.node == "node-a"


def test_the_cross_node_detector_names_the_culprits_node_in_the_alarm_fields():
    """The merged view's analyzer (node "all nodes") with one rank per node: rank 1, on node-b, is
    frozen where node-b's stacks say while rank 0 waits in a collective on node-a."""
    t = [1000.0]
    an = Analyzer(lambda: t[0], node=ACROSS)
    an.feed([RankEvent(t[0], rank=0, node="node-a", pid=10), RankEvent(t[0], rank=1, node="node-b", pid=11)])
    for step in range(1, 41):
        t[0] += 0.1
        an.feed([ProgressEvent(t[0], rank=r, step=step, node=n) for r, n in TWO.items()])
        assert an.check() == []
    t[0] += 3.0
    where0 = Where(0, "frozen", "collective", "main", "train.py", 9, "all_reduce")
    where1 = Where(1, "frozen", "sleep/wait in user code", "next_batch", "train.py", 5, "time.sleep")
    an.feed([StacksEvent(t[0], ranks=(0,), samples=2, hung=True, summary="hung: every rank waits",
                         where={0: where0}, waiting=(0,), node="node-a"),
             StacksEvent(t[0], ranks=(1,), samples=2, hung=True, culprits=(1,), summary="hung: rank 1 frozen",
                         where={1: where1}, node="node-b")])
    (a,) = an.check()
    assert a.type == "stall" and a.culprits == (1,)
    assert a.node == "node-b", a  # the culprit's node, in the field
    assert a.where[1].node == "node-b" and a.where[1].line == 5
    assert "rank 1 on node-b" in a.message


def test_a_job_on_one_node_keeps_its_alarm_on_the_watching_node():
    """One node (the supervisor's own analyzer, or a single attach): the alarm's node is the
    analyzer's, as before, whatever its rank events say."""
    t = [1000.0]
    an = Analyzer(lambda: t[0], node="vm")
    an.feed([RankEvent(t[0], rank=r, node="vm", pid=10 + r) for r in (0, 1)])
    for step in range(1, 41):
        t[0] += 0.1
        an.feed([ProgressEvent(t[0], rank=0, step=step), ProgressEvent(t[0], rank=1, step=min(step, 20))])
    a = None
    while a is None and t[0] < 1100:
        t[0] += 0.5
        a = next(iter(an.check()), None)
    assert a is not None and a.node == "vm" and " on vm" not in a.message, a


def test_a_node_alarm_waits_longer_while_the_cross_node_view_suspects_the_same_stall():
    """node-b names its own rank 1; the cross-node view suspects the stall too (its alarm is on its way, slowed
    by the nodes' stack samples on a loaded machine): node-b's alarm is held past HOLD, and the cross-node alarm
    that comes takes it in: one alarm, every rank in it.  Not suspected, it stands alone after HOLD."""
    own_b = stall("node-b", (1,), id="stall-idle", ranks=(1,))
    f = OneAlarm()
    assert alarms(apply(f, [own_b], now=100.0, suspected=True)) == []
    assert alarms(apply(f, now=100.0 + HOLD + 1, suspected=True)) == []
    cross = stall("node-b", (1,), id="stall-hot", ranks=(0, 1))
    (a,) = alarms(apply(f, [], [cross], now=100.0 + HOLD + 2, suspected=True))
    assert a.id == "stall-hot" and a.ranks == (0, 1) and [d.id for d in a.folded] == ["stall-idle"]
    # the cross-node alarm never comes: node-b's is shown at HOLD_SUSPECTED (an alarm is never lost)
    f = OneAlarm()
    apply(f, [own_b], now=100.0, suspected=True)
    assert alarms(apply(f, now=100.0 + HOLD_SUSPECTED - 0.5, suspected=True)) == []
    assert alarms(apply(f, now=100.0 + HOLD_SUSPECTED, suspected=True)) == [own_b]
    # nothing suspected across nodes: HOLD, as before
    f = OneAlarm()
    apply(f, [own_b], now=100.0)
    assert alarms(apply(f, now=100.0 + HOLD)) == [own_b]
