"""Alike notes of many nodes counted, not listed (issue 35: one hang at 128
nodes brought 510 notes)."""

from ddptop.core.analysis.note_folds import NoteFolder
from ddptop.core.model.events import LogBatch, NoteEvent


def note(t, node, text, level="info"):
    return NoteEvent(t, level, f"{node}: {text}", node=node)


def test_a_stack_capture_on_128_nodes_is_one_note_then_one_count():
    f = NoteFolder(window=30)
    shown = []
    for i in range(128):  # each node says it, over 12 s, one of them as a warning
        t = 100 + i * 0.1
        shown += f.add([note(t, f"node-{i}", "stacks: capturing every rank's Python stack")], now=t)
        shown += f.add([note(t, f"node-{i}", f"stacks captured in {1 + i % 7}.{i % 10} s")], now=t)
    shown += f.add([note(113, "node-97", "rank 777: py-spy cannot read its stack", "warning")], now=113)
    assert [n.message for n in shown] == ["node-0: stacks: capturing every rank's Python stack",
                                          "node-0: stacks captured in 1.0 s",
                                          "node-97: rank 777: py-spy cannot read its stack"]
    assert f.add([], now=129) == []  # the window is not over
    said = f.add([], now=130.5)
    assert len(said) == 2 and f.counted == 254
    capturing = next(n for n in said if "capturing" in n.message)
    assert capturing.level == "info" and capturing.message.startswith(
        "127 more notes like “node-0: stacks: capturing every rank's Python stack” from 127 nodes "
        "(node-1, node-2, … node-127) in 30 s; the last: node-127: stacks: capturing")
    captured = next(n for n in said if "captured in" in n.message)
    assert captured.message.endswith("the last: node-127: stacks captured in 2.7 s")
    assert f.add([], now=200) == []


def test_different_kinds_levels_and_the_next_window_are_shown():
    f = NoteFolder(window=10)
    out = f.add([note(0, "node-1", "job succeeded"), note(0, "node-2", "job failed, exit code 1", "warning"),
                 note(0, "node-3", "job failed, exit code 1", "info"),  # (another level: another kind)
                 NoteEvent(0, "warning", "nodes differ in torch: ..."),  # not a node's own: never folded
                 NoteEvent(0, "warning", "nodes differ in torch: ..."),
                 LogBatch(0, rank=0, texts=("step 1",))], now=0)
    assert [getattr(e, "message", None) for e in out[:5]] == [
        "node-1: job succeeded", "node-2: job failed, exit code 1", "node-3: job failed, exit code 1",
        "nodes differ in torch: ...", "nodes differ in torch: ..."]
    assert isinstance(out[5], LogBatch)
    assert f.add([note(1, "node-4", "job failed, exit code 9", "warning")], now=1) == []
    late = f.add([note(12, "node-5", "job failed, exit code 1", "warning")], now=12)
    # the first window's count, then the same kind shown again: it opens a new window
    assert [n.message for n in late] == [
        "1 more note like “node-2: job failed, exit code 1” from 1 node (node-4) in 12 s; "
        "the last: node-4: job failed, exit code 9", "node-5: job failed, exit code 1"]
    flushed = f.due(13, flush=True)
    assert flushed == []  # node-5's window has counted nothing: nothing to say


def test_a_node_saying_it_again_counts_once_as_a_node():
    f = NoteFolder(window=5)
    f.add([note(0, "node-1", "stacks: capturing every rank's Python stack")], now=0)
    f.add([note(1, "node-1", "stacks: capturing every rank's Python stack")], now=1)
    f.add([note(2, "node-1", "stacks: capturing every rank's Python stack")], now=2)
    said = f.due(3, flush=True)
    assert len(said) == 1 and said[0].message.startswith("2 more notes like “node-1: stacks: capturing every "
                                                         "rank's Python stack” from 1 node (node-1)")
