"""The stacks of a 1,024-rank job: 128 nodes' samples (8 ranks each, one rank stuck on node-97) judged
together, and what the stacks pane says of them: groups by count and ranges, the culprit first with its node,
a large group opened into its ranks by node.  A single node's samples stay as they were."""

from __future__ import annotations

from dataclasses import replace

from textual.content import Content

from ddptop.core.analysis.job_state import STACKS_ROUND, JobState
from ddptop.core.analysis.stack_judge import judge
from ddptop.core.analysis.stack_verdict import verdict
from ddptop.core.model.events import StacksEvent
from ddptop.ui.stacks_screen import stacks_markup
from test_stacks_verdict import NATIVE_SYNC, PYTHON_SYNC, SLEEPING

NODES, PER_NODE, ODD = 128, 8, 777  # rank 777: node-97's second rank
T = 1_700_000_000.0


def _templates():
    """Where a rank waiting at the GPU sync and the stuck one are, and their frames, as a node's own verdict
    reads them from py-spy dumps (judged again per node below: a real verdict of 128 nodes takes a second)."""
    spin = [PYTHON_SYNC.format(line=88), NATIVE_SYNC.format(line=88)]
    stuck = SLEEPING.replace("/w/train.py:60", "/w/loader.py:40")
    v = verdict({0: spin, 1: [stuck, stuck]})
    frames = {g.ranks[0]: (g.frames, g.user) for g in v.groups}
    return v.where[0], frames[0], v.where[1], frames[1]


WAIT, WAIT_FRAMES, STUCK, STUCK_FRAMES = _templates()


def node_event(n: int, t: float = T, odd: int | None = ODD) -> StacksEvent:
    """Node ``n``'s own samples of its 8 ranks, as its agent sends them."""
    rs = range(n * PER_NODE, (n + 1) * PER_NODE)
    where = {r: replace(STUCK if r == odd else WAIT, rank=r) for r in rs}
    frames = {r: STUCK_FRAMES if r == odd else WAIT_FRAMES for r in rs}
    fields = judge(where, (), frames, t=t).to_event_fields()
    fields["node"] = f"node-{n}"
    return StacksEvent(t + n * 0.002, ranks=tuple(rs), samples=2, span=1.1, dir=f"/runs/r{n}/stacks/s-samples",
                       native=True, pause=0.8 + n / 1000, **fields)


def plain(markup: str) -> str:
    return Content.from_markup(markup).plain


def test_128_nodes_are_judged_together_the_culprit_named_with_its_node():
    m = JobState()
    m.apply([node_event(n) for n in range(NODES)])
    assert len(m.stacks_round()) == NODES
    v = m.stacks_evidence
    assert v is not None and v.hung is True and v.culprits == (ODD,)
    assert len(v.where) == 1024 and v.where[ODD].node == "node-97" and v.where[0].node == "node-0"
    assert v.waiting == tuple(r for r in range(1024) if r != ODD)
    # two groups, not 128 nodes' worth: the 1,023 waiting ranks at one line, the stuck one apart
    assert [(len(g.ranks), g.culprit) for g in v.groups] == [(1023, False), (1, True)]
    assert v.groups[1].ranks == (ODD,) and "loader.py" in v.groups[1].text
    # (a node without the culprit names nobody on its own; the culprit's node names it)
    assert node_event(0).culprits == () and node_event(97).culprits == (ODD,)
    ev = m.stacks
    assert ev is not None and len(ev.ranks) == 1024 and ev.node == "" and ev.samples == 2
    assert ev.native and ev.pause == max(0.8 + n / 1000 for n in range(NODES))
    assert ev.dir == "node-97:/runs/r97/stacks/s-samples"  # the culprit's node keeps its dumps


def test_the_pane_says_groups_by_count_and_ranges_the_culprit_first():
    m = JobState()
    m.apply([node_event(n) for n in range(NODES)])
    text = plain(stacks_markup(m.stacks))
    lines = text.splitlines()
    assert "(2 samples of 1,024 ranks on 128 nodes over 1.1 s, native frames read" in lines[0], lines[0]
    assert lines[1] == "culprit: rank 777 on node-97"
    culprit = next(i for i, ln in enumerate(lines) if ln.startswith("rank 777 on node-97 waits for data"))
    waiting = next(i for i, ln in enumerate(lines)
                   if ln.startswith("1,023 ranks (0-776,778-1023) on 128 nodes wait on the GPU"))
    assert culprit < waiting, text
    assert "at `train_step` at train.py:88 (frozen)" in lines[waiting]
    assert lines[waiting + 1].strip() == "(n: its ranks by node)"
    assert "► next_batch (loader.py:40)" in lines[culprit + 1]
    assert "dumps: node-97:/runs/r97/stacks/s-samples (each node keeps its own)" in text
    assert "ranks 0, 1" not in text and "node-3:" not in text  # no rank listed one by one, no node until opened
    # opened: the large group's ranks, one line per node, the node short of a rank says which
    opened = plain(stacks_markup(m.stacks, by_node=True)).splitlines()
    by_node = [ln.strip() for ln in opened[waiting + 1:waiting + 1 + NODES]]
    assert by_node[:2] == ["node-0: 0-7", "node-1: 8-15"] and by_node[-1] == "node-127: 1016-1023"
    assert by_node[97] == "node-97: 776,778-783 (777 in another group)"
    assert len([ln for ln in opened if ln.strip().startswith("node-")]) == NODES


def test_a_small_group_lists_its_ranks_as_before_and_one_node_is_its_own_event():
    m = JobState()
    ev = node_event(97)
    m.apply([ev])
    assert m.stacks is ev and len(m.stacks_round()) == 1  # a single node: exactly its own samples
    assert m.stacks_evidence is not None and m.stacks_evidence.culprits == (ODD,)
    text = plain(stacks_markup(m.stacks))
    assert "2 samples of 8 ranks over 1.1 s" in text and "nodes" not in text
    assert "culprit: rank 777\n" in text
    assert "\nranks 776, 778, 779, 780, 781, 782, 783 wait on the GPU" in text, text
    assert "(n: its ranks" not in text
    # two nodes of 8: 16 waiting ranks said by count, on 2 nodes; 7 of them on node-97, listed one by one
    m.apply([node_event(96, t=T + 1)])
    text = plain(stacks_markup(m.stacks))
    assert "of 16 ranks on 2 nodes" in text and "culprit: rank 777 on node-97" in text
    assert "15 ranks (768-776,778-783) on 2 nodes wait on the GPU" in text, text


def test_a_node_whose_latest_samples_are_from_an_earlier_round_is_left_out():
    m = JobState()
    m.apply([node_event(n, t=T - 60) for n in range(4)])  # an earlier stall, every node
    m.apply([node_event(n, t=T, odd=None) for n in range(2)])  # this one: two nodes sampled so far
    assert [ev.node for ev in m.stacks_round()] == ["node-0", "node-1"]
    assert m.stacks is not None and len(m.stacks.ranks) == 16 and m.stacks.culprits == ()
    # within the round, a node that sampled a few seconds later is in it
    m.apply([node_event(2, t=T + STACKS_ROUND - 1)])
    assert [ev.node for ev in m.stacks_round()] == ["node-0", "node-1", "node-2"]
    assert m.stacks is not None and len(m.stacks.ranks) == 24
