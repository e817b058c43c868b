"""JobState: the state of a job, folded from events.  Pure, no I/O."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from ddptop.core.analysis.stack_judge import combine
from ddptop.core.model.events import (
    FINAL_STATES,
    STARTING,
    AlarmEvent,
    Event,
    GpuEvent,
    GpuStatusEvent,
    LaunchEvent,
    LinkEvent,
    LogBatch,
    NoteEvent,
    ProcEvent,
    ProgressEvent,
    RankEvent,
    RasEvent,
    StacksEvent,
    StateEvent,
)
from ddptop.core.model.evidence import StackEvidence

HISTORY = 300  # telemetry samples kept per GPU (5 minutes at 1 Hz)
STEP_LOOKBACK = 256  # lines of a batch looked at (from its end) for the rank table's step
from ddptop.core.analysis.progress import TrainingBars

# One sampling round of a multi-node job: the nodes' latest stack samples taken within this many seconds of the
# newest.  A stall makes every node sample at once (the cross-node view asks them all, and each node's own
# detector sees the same silence); a node takes its samples a second apart, up to 3 s more per native dump,
# and its clock is corrected to ours within a link's delay, so one round spreads over a few seconds.  A node
# whose latest samples are older belongs to an earlier stall and is left out, not judged with this one.
STACKS_ROUND = 10.0


@dataclass
class RankInfo:
    rank: int
    local_rank: int | None = None
    node: str = ""
    pid: int | None = None
    alive: bool | None = None  # None: not seen as a process yet
    exit_code: int | None = None
    attempt: int = 0
    last_output_t: float | None = None
    last_step: int | None = None
    batches: int | None = None  # batches drawn from data loaders (the hook)
    phase: str = ""  # train | eval | save (the hook)
    lines: int = 0
    last_line: str = ""
    proc: ProcEvent | None = None  # latest psutil sample (cpu, rss, status, gpu...)
    step_source: str = "log"  # log | hook | beat: where last_step comes from
    last_step_t: float | None = None


@dataclass
class JobState:
    state: str = STARTING
    exit_code: int | None = None
    message: str = ""
    started: float | None = None
    ended: float | None = None
    attempt: int = 0
    ranks: dict[int, RankInfo] = field(default_factory=dict)
    torchrun_lines: int = 0
    gpu_status: GpuStatusEvent | None = None
    gpus: dict[tuple[str, int], GpuEvent] = field(default_factory=dict)  # (node, index) -> latest
    gpu_history: dict[tuple[str, int], deque] = field(default_factory=dict)  # -> deque[(t, util, power_w)]
    generation: int = 0  # ddptop relaunches (torchrun's own restarts are `attempt`)
    node_restart: tuple[str, int] | None = None  # the latest launch was a node's restart by its cluster: (node, attempt)
    profiles: tuple[str, ...] = ()  # profiles of the current launch
    env_diff: dict = field(default_factory=dict)  # current launch vs the first
    alarms: list[AlarmEvent] = field(default_factory=list)
    stacks_by_node: dict[str, StacksEvent] = field(default_factory=dict)  # each node's latest stack samples
    ras: RasEvent | None = None  # what NCCL's RAS port said last (an answer, not an error)
    notes: list[NoteEvent] = field(default_factory=list)
    links: dict[str, LinkEvent] = field(default_factory=dict)  # attached node -> its link's latest state
    bars: TrainingBars = field(default_factory=TrainingBars, repr=False, compare=False)  # the one step rule
    # (the latest round's combined view, made when first read after a node's samples came: 128 nodes' events
    # arrive one by one, and judging 1,024 ranks takes tens of ms, so it is not redone at each)
    _stacks_view: tuple[StacksEvent, StackEvidence] | None = field(default=None, init=False, repr=False,
                                                                   compare=False)

    @property
    def nodes(self) -> list[str]:
        """The nodes of an attachment to several (or remote) hosts, in order seen; [] for a local job."""
        return list(self.links)

    def stacks_round(self) -> list[StacksEvent]:
        """The nodes' latest stack samples of the latest sampling round (``STACKS_ROUND``), in the order the
        nodes were first seen; one event for a single-node job."""
        if not self.stacks_by_node:
            return []
        newest = max(ev.t for ev in self.stacks_by_node.values())
        return [ev for ev in self.stacks_by_node.values() if ev.t >= newest - STACKS_ROUND]

    @property
    def stacks(self) -> StacksEvent | None:
        """The latest stack samples as one event (the stacks pane): a single node's own event, or every node's
        of the latest round judged together (``stack_judge.combine``: the culprit on one node, the ranks waiting
        for it on the others), its ranks all the nodes' ranks."""
        view = self._stacks_of_round()
        return view[0] if view is not None else None

    @property
    def stacks_evidence(self) -> StackEvidence | None:
        """What the latest round's samples say, every node's ranks judged together (``combine``)."""
        view = self._stacks_of_round()
        return view[1] if view is not None else None

    def _stacks_of_round(self) -> tuple[StacksEvent, StackEvidence] | None:
        if self._stacks_view is not None or not self.stacks_by_node:
            return self._stacks_view
        evs = self.stacks_round()
        if len(evs) == 1:
            self._stacks_view = (evs[0], StackEvidence.from_event(evs[0]))
            return self._stacks_view
        v = combine([StackEvidence.from_event(ev) for ev in evs])
        assert v is not None
        fields = v.to_event_fields()
        fields["node"] = ""  # every node's
        # the dumps stay on each node: the culprits' node's (or the first node's) said as NODE:PATH
        odd = {v.where[r].node for r in v.culprits if r in v.where}
        home = next((ev for ev in evs if ev.dir and len(odd) == 1 and ev.node in odd), None) or next(
            (ev for ev in evs if ev.dir), None)
        sampled = [ev.samples for ev in evs if ev.samples]
        ev = StacksEvent(v.t, ranks=tuple(sorted({r for ev in evs for r in ev.ranks})),
                         samples=min(sampled) if sampled else 0, span=max(ev.span for ev in evs),
                         dir=f"{home.node}:{home.dir}" if home is not None else "",
                         native=any(ev.native for ev in evs), pause=max(ev.pause for ev in evs),
                         given_up=tuple(sorted({r for ev in evs for r in ev.given_up})), **fields)
        self._stacks_view = (ev, v)
        return self._stacks_view

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    def rank(self, r: int) -> RankInfo:
        info = self.ranks.get(r)
        if info is None:
            info = self.ranks[r] = RankInfo(rank=r)
        return info

    def apply(self, events: Iterable[Event]) -> None:
        for ev in events:
            if isinstance(ev, LogBatch):
                done = len(ev.texts) - 1 if ev.transient else len(ev.texts)
                if ev.rank is None:
                    self.torchrun_lines += done
                    continue
                elif ev.node and ev.rank not in self.ranks:
                    self.rank(ev.rank).node = ev.node
                info = self.rank(ev.rank)
                info.last_output_t = ev.t
                if ev.attempt > info.attempt:
                    info.attempt = ev.attempt
                info.lines += done
                if not ev.texts:
                    continue
                info.last_line = ev.texts[-1]
                if info.step_source == "log":
                    # the last line that says a step, looked for from the end (one
                    # parse per batch, usually; at most STEP_LOOKBACK lines)
                    for text in reversed(ev.texts[-STEP_LOOKBACK:]):
                        step = self.bars.step(ev.rank, text)
                        if step is not None:
                            info.last_step = step
                            info.last_step_t = ev.t
                            break
            elif isinstance(ev, GpuEvent):
                key = (ev.node, ev.index)
                self.gpus[key] = ev
                h = self.gpu_history.get(key)
                if h is None:
                    h = self.gpu_history[key] = deque(maxlen=HISTORY)
                h.append((ev.t, ev.util, ev.power_w))
            elif isinstance(ev, LaunchEvent):
                if ev.generation > self.generation:
                    for info in self.ranks.values():
                        info.last_step = None
                        info.step_source = "log"
                        info.pid = None
                        info.alive = None
                    self.alarms = []
                    self.ras = None
                if ev.generation > self.generation or ev.node_restart:
                    # (the node whose cluster restarted it, and its attempt; none for ddptop's own launches)
                    self.node_restart = (ev.node, ev.node_restart) if ev.node_restart else None
                self.generation = ev.generation
                self.profiles = ev.profiles
                self.env_diff = ev.env_diff
            elif isinstance(ev, ProgressEvent):
                info = self.rank(ev.rank)
                if ev.source == "batch":  # batches drawn and the model's phase, not training steps
                    info.batches = ev.step
                    info.phase = ev.phase
                    continue
                if ev.source == "stack":  # the stack watch of a job ddptop did not launch: life, not steps
                    continue
                info.last_step = ev.step
                info.step_source = ev.source
                info.last_step_t = ev.t
            elif isinstance(ev, ProcEvent):
                self.rank(ev.rank).proc = ev
            elif isinstance(ev, GpuStatusEvent):
                self.gpu_status = ev
            elif isinstance(ev, AlarmEvent):
                self.alarms.append(ev)
            elif isinstance(ev, StacksEvent):
                self.stacks_by_node[ev.node] = ev
                self._stacks_view = None
            elif isinstance(ev, RasEvent):
                if ev.ok:
                    self.ras = ev
            elif isinstance(ev, NoteEvent):
                self.notes.append(ev)
            elif isinstance(ev, LinkEvent):
                self.links[ev.node] = ev
            elif isinstance(ev, RankEvent):
                info = self.rank(ev.rank)
                if ev.attempt > info.attempt or info.pid is None or ev.pid == info.pid:
                    info.local_rank = ev.local_rank
                    info.node = ev.node
                    info.pid = ev.pid
                    info.alive = ev.alive
                    info.exit_code = ev.exit_code
                    if ev.attempt > info.attempt:
                        info.last_step = None
                    info.attempt = ev.attempt
                self.attempt = max(self.attempt, ev.attempt)
            elif isinstance(ev, StateEvent):
                if self.started is None:
                    self.started = ev.t
                self.state = ev.state
                self.message = ev.message or self.message
                if ev.state in FINAL_STATES:
                    self.ended = ev.t
                    self.exit_code = ev.exit_code


def ras_of(model: JobState, rank: int) -> str:
    """What NCCL's RAS port said of ``rank`` ("AllReduce #4411 (others #4412)",
    "dead"), while no step has come since it answered; "" otherwise."""
    ev = model.ras
    if ev is None or not ev.behind:
        return ""
    if any(info.last_step_t is not None and info.last_step_t > ev.t for info in model.ranks.values()):
        return ""  # progress since: the stall is over
    return ev.behind.get(rank, "ok" if ev.behind else "")


def culprits_of(model: JobState) -> tuple[int, ...]:
    """The ranks the latest alarm names as the odd ones out (the rank table
    marks them); () once every rank has stepped since a stall alarm."""
    for a in reversed(model.alarms):
        if not a.culprits:
            continue
        if a.type == "stall" and model.ranks and all(
                info.last_step_t is not None and info.last_step_t > a.t for info in model.ranks.values()):
            return ()  # the stall is over
        return tuple(a.culprits)
    return ()
