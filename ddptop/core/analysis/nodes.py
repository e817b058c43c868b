"""One hang, one alarm across nodes: which stall alarms the merged view of several nodes shows.

Each node's supervisor judges its own ranks and raises its own stall alarm;
the merged view (``MultiSession``) judges every node's ranks together.  Left
alone, one hang would be one alarm per node plus the cross-node one, and a
node without the culprit names none.  The rule, applied to the merged stream:

* **the cross-node finding is the alarm.**  It carries the culprits' node in
  its fields (``AlarmEvent.node`` when they are all on one node, each
  ``where`` entry's node: the detector sets them) and takes the nodes' own
  stall alarms in as its evidence (``AlarmEvent.folded``, and one sentence
  per node) instead of showing them;
* **a node's own stall alarm stands alone only when that node holds the
  whole story**: every rank of the job is on it (then a cross-node alarm of
  the same hang is what is folded), or it names culprits, all on that node,
  and no cross-node alarm came within ``HOLD`` seconds (the cross-node view
  has nothing better).  A node alarm that names nobody on its node, with
  nothing across nodes after ``HOLD``, is still shown (an alarm is never
  lost), saying that the cause may be on another node;
* **one stall alarm per episode** (one silence of the job, as the cross-node
  detector sees it: it ends when a rank shows life again): a stall alarm that
  comes after the episode's is a note (info), its text kept.

Crash, signature and GPU alarms pass untouched.  Pure: events in, events
out, on the caller's clock.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping

from ddptop.core.analysis.wording import cause_elsewhere_words, folded_words
from ddptop.core.model.events import AlarmEvent, Event, NoteEvent
from ddptop.core.model.evidence import FoldedAlarm, ranks_text

HOLD = 5.0  # seconds a node's stall alarm waits for the cross-node alarm of the same hang
# ... and while the cross-node view itself suspects the stall (every rank silent long enough to look at its
# stacks: its alarm is on the way, slowed by the nodes' stack samples over their links on a loaded machine)
HOLD_SUSPECTED = 10.0
ACROSS = "all nodes"  # the node of a cross-node alarm whose culprits are not on one node


def whole_story(node: str, rank_nodes: Mapping[int, str]) -> bool:
    """Every rank of the job (``rank_nodes``: rank -> its node) is on ``node``."""
    return bool(rank_nodes) and set(rank_nodes.values()) == {node}


def stands_alone(alarm: AlarmEvent, cross: AlarmEvent | None, rank_nodes: Mapping[int, str]) -> bool:
    """Whether a node's own alarm is shown by itself in the merged view
    (``cross``: the cross-node stall alarm of the same hang, None while there
    is none): anything but a stall; a stall of the node that holds every
    rank of the job; or, with no cross-node alarm, one whose culprits are all
    on its own node."""
    if alarm.type != "stall" or whole_story(alarm.node, rank_nodes):
        return True
    if cross is not None:
        return False
    return bool(alarm.culprits) and all(rank_nodes.get(r) == alarm.node for r in alarm.culprits)


def own_view(alarm: AlarmEvent, rank_nodes: Mapping[int, str]) -> str:
    """A node's own stall alarm in a few words: what it called the stall and
    whom it named (a node without the culprit names nobody of its own)."""
    head = alarm.message.split(". ", 1)[0].split(":", 1)[0].strip()
    said = f"{alarm.node}: {head or alarm.id}"
    mine = [r for r in alarm.culprits if rank_nodes.get(r, alarm.node) == alarm.node]
    if mine:
        return f"{said}, naming {ranks_text(mine)}"
    return f"{said}, none of its ranks the odd one out"


def take_in(alarm: AlarmEvent, others: Iterable[AlarmEvent], rank_nodes: Mapping[int, str],
            across: AlarmEvent | None = None) -> AlarmEvent:
    """``alarm`` with ``others`` (the nodes' own stall alarms of the same hang)
    and ``across`` (a cross-node one, when a node's alarm tells the whole
    story) folded in: kept whole in ``folded`` (a cross-node one under the
    node "all nodes"), said in one sentence at the end of its message."""
    others = list(others)
    if not others and across is None:
        return alarm
    said = [own_view(a, rank_nodes) for a in others]
    entries = [FoldedAlarm(a.t, a.node, a.id, tuple(a.culprits), a.message) for a in others]
    if across is not None:
        said.append(f"across nodes: {across.id}")
        entries.append(FoldedAlarm(across.t, ACROSS, across.id, tuple(across.culprits), across.message))
    return replace(alarm, folded=tuple(alarm.folded) + tuple(entries),
                   message=folded_words(alarm.message, said))


def folded_note(alarm: AlarmEvent, into: AlarmEvent, t: float) -> NoteEvent:
    """A stall alarm of an episode whose alarm is already shown: a note, its text kept."""
    where = f" ({into.node})" if into.node else ""
    return NoteEvent(t, "info", f"{alarm.node or 'the cross-node view'}'s own stall alarm [{alarm.id}] belongs to "
                                f"the stall already raised [{into.id}]{where}: {alarm.message}", node=alarm.node)


class OneAlarm:
    """Applies the rule to the merged stream, on the caller's clock.

    ``apply`` takes the nodes' events (their own alarms among them) and the
    cross-node view's new alarms and returns what the merged view shows: a
    node's stall alarm is held back until the cross-node alarm of the same
    hang takes it in, or ``hold`` seconds have passed."""

    def __init__(self, hold: float = HOLD, hold_suspected: float = HOLD_SUSPECTED):
        self.hold = hold
        self.hold_suspected = hold_suspected
        self.shown: AlarmEvent | None = None  # the stall alarm of the current episode
        self._episode = 0.0  # when the silence it was raised in began
        self._pending: list[tuple[float, AlarmEvent]] = []  # nodes' stall alarms held back (arrival, alarm)
        self._cross: tuple[float, AlarmEvent] | None = None  # a cross-node alarm held back (one node has every rank)

    @property
    def holding(self) -> bool:
        return bool(self._pending) or self._cross is not None

    def apply(self, events: list[Event], cross: list[AlarmEvent], now: float, *, silence_began: float,
              rank_nodes: Mapping[int, str], flush: bool = False, suspected: bool = False) -> list[Event]:
        """``events``: the nodes' merged events; ``cross``: the cross-node
        view's new alarms; ``silence_began``: when the job's current silence
        began (the cross-node detector's ``silence_began()``: a later value
        means life came back, and a new episode); ``rank_nodes``: each rank's
        node; ``flush``: release whatever is held (the job has ended);
        ``suspected``: the cross-node view suspects the stall too (its alarm
        is on the way: a node's alarm waits ``hold_suspected`` for it)."""
        if self.shown is not None and silence_began > self._episode:
            self.shown = None  # life came back since: the next stall is a new episode
        out: list[Event] = []
        for ev in events:
            if isinstance(ev, AlarmEvent) and ev.type == "stall":
                self._node_alarm(ev, now, silence_began, rank_nodes, out)
            else:
                out.append(ev)
        for c in cross:
            if c.type != "stall":
                out.append(c)
            elif self.shown is not None:
                out.append(folded_note(c, self.shown, c.t))
            elif len(set(rank_nodes.values())) == 1 and not flush:
                self._cross = (now, c)  # one node has every rank: its own alarm tells the story, if it comes
            else:
                self._show(take_in(c, [a for _, a in self._pending], rank_nodes), silence_began, out)
        self._due(now, silence_began, rank_nodes, flush, out, self.hold_suspected if suspected else self.hold)
        return out

    def _node_alarm(self, a: AlarmEvent, now: float, silence_began: float, rank_nodes: Mapping[int, str],
                    out: list[Event]) -> None:
        if self.shown is not None:
            out.append(folded_note(a, self.shown, a.t))
        elif whole_story(a.node, rank_nodes):
            self._show(take_in(a, [x for _, x in self._pending], rank_nodes, self._cross[1] if self._cross else None),
                       silence_began, out)
        else:
            self._pending.append((now, a))

    def _due(self, now: float, silence_began: float, rank_nodes: Mapping[int, str], flush: bool,
             out: list[Event], hold: float) -> None:
        """Release what waited ``hold`` seconds for the alarm that would take it in."""
        if self._cross is not None and (flush or now - self._cross[0] >= self.hold or self._pending):
            self._show(take_in(self._cross[1], [a for _, a in self._pending], rank_nodes), silence_began, out)
        if not self._pending or not (flush or now - self._pending[0][0] >= hold):
            return
        pending = [a for _, a in self._pending]
        first = next((i for i, a in enumerate(pending) if stands_alone(a, None, rank_nodes)), None)
        main = pending[0 if first is None else first]
        rest = [a for a in pending if a is not main]
        if first is None:
            elsewhere = sorted(set(rank_nodes.values()) - {main.node})
            if elsewhere:
                main = replace(main, message=cause_elsewhere_words(main.message, main.node, elsewhere))
        self._show(take_in(main, rest, rank_nodes), silence_began, out)

    def _show(self, a: AlarmEvent, silence_began: float, out: list[Event]) -> None:
        self.shown, self._episode = a, silence_began
        self._pending = []
        self._cross = None
        out.append(a)
