"""Notes that many nodes make alike, counted instead of listed.

At 128 nodes one stack capture brings three notes from every node (``node-97:
stacks: capturing every rank's Python stack`` ...) and one hang 127 notes of
node alarms folded into the alarm shown: 510 lines that push the log a person
reads off the screen.  A :class:`NoteFolder` lets the first note of a kind
through at once and counts the alike ones that follow from any node for
``window`` seconds, then says them in one note: how many, from which nodes,
and the last one's text whole.  Two notes are *alike* when their text is
equal once the node's own name and every number are masked (the first
``KEY_CHARS`` characters of it: a node's own alarm words, kept at the end of a
note, differ from node to node).  Pure: the caller gives the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddptop.core.analysis.line_folds import alike_key
from ddptop.core.model.events import NoteEvent

WINDOW = 30.0  # seconds after the first note of a kind in which the alike ones are counted
KEY_CHARS = 96  # what of a masked note decides that two notes are alike
FOLD_FROM = 8  # more nodes than this: alike notes are folded (a few nodes' notes are read one by one)


@dataclass(slots=True)
class _Group:
    opened: float
    level: str
    nodes: list[str] = field(default_factory=list)  # the nodes of the notes counted, in order, each once
    first: str = ""  # the text of the note shown
    count: int = 0
    last: NoteEvent | None = None


def nodes_text(nodes: list[str], most: int = 4) -> str:
    """``node-1, node-2, node-3`` or, past ``most``, ``node-1, node-2, … node-127``."""
    if len(nodes) <= most:
        return ", ".join(nodes)
    return f"{nodes[0]}, {nodes[1]}, … {nodes[-1]}"


class NoteFolder:
    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._open: dict[bytes, _Group] = {}
        self.counted = 0  # notes counted into a fold, in all

    @staticmethod
    def key(note: NoteEvent) -> bytes:
        text = note.message.replace(note.node, "\0") if note.node else note.message
        return note.level.encode() + b"\0" + alike_key(text)[:KEY_CHARS]

    def add(self, events: list, now: float) -> list:
        """The counting notes of the folds whose window ended, then ``events``
        with each node's note that is alike an earlier one of its window taken
        out (counted)."""
        out: list = self.due(now)
        for ev in events:
            if not isinstance(ev, NoteEvent) or not ev.node:
                out.append(ev)
                continue
            k = self.key(ev)
            g = self._open.get(k)
            if g is None:
                self._open[k] = _Group(now, ev.level, first=ev.message)
                out.append(ev)
                continue
            g.count += 1
            self.counted += 1
            g.last = ev
            if ev.node not in g.nodes:
                g.nodes.append(ev.node)
        return out

    def due(self, now: float, flush: bool = False) -> list[NoteEvent]:
        """The counting notes of the folds whose window ended (every fold: ``flush``)."""
        out = []
        for k, g in list(self._open.items()):
            if flush or now - g.opened >= self.window:
                del self._open[k]
                if g.last is not None:
                    out.append(self._said(g, now))
        return out

    @staticmethod
    def _said(g: _Group, now: float) -> NoteEvent:
        assert g.last is not None
        n, k = g.count, len(g.nodes)
        first = g.first if len(g.first) <= 80 else g.first[:79] + "…"
        return NoteEvent(now, g.level, f"{n} more note{'s' if n != 1 else ''} like “{first}” from {k} "
                                       f"node{'s' if k != 1 else ''} ({nodes_text(g.nodes)}) in "
                                       f"{max(now - g.opened, 0.0):.0f} s; the last: {g.last.message}")
