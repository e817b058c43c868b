"""Several nodes' sessions as one: ``MultiSession`` merges the nodes'
streams (each a ``RemoteSession`` over ssh, ``ssh``) and runs a stall
detector across all of them (the odd rank out may be on another machine);
one hang is one alarm (``analysis.nodes``: the cross-node alarm takes the
nodes' own stall alarms in); a command goes to every node or to none.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import replace

from ddptop.core.analysis.nodes import ACROSS, OneAlarm
from ddptop.core.analysis.note_folds import FOLD_FROM as NOTES_FOLD_FROM, NoteFolder
from ddptop.core.model.events import (
    FINAL_STATES,
    LOST,
    AlarmEvent,
    Event,
    LaunchEvent,
    LogBatch,
    NoteEvent,
    RankEvent,
    StateEvent,
)
from ddptop.core.model.session_protocol import CommandResult, Control, ExitStatus, Nodes
from ddptop.core.run import journal
from ddptop.core.run.launcher import launch_options
from ddptop.core.run.pipeline import Pipeline
from ddptop.core.run.profiles import ProfileError, in_effect, load_all
from ddptop.core.sessions import wire
from ddptop.core.sessions.ssh import FIX_ELSEWHERE, RemoteSession

MULTI_STEP = 0.02  # seconds between looks at the nodes' links while a cross-node view waits
# a link read up to T is known quiet up to T + this (its agent would have sent a heartbeat cursor by then)
HEARD_SLACK = wire.HEARTBEAT + 0.5
JUDGE_EVERY = 0.25  # seconds between readings of the detector for the one-alarm rule, with no stall alarm to place
_NCCL_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+\S*)")
_NCCL_VIA = re.compile(r"\bvia (NET/[A-Za-z]+|P2P/[A-Za-z]+|SHM|direct pointer)")


class MultiSession:
    """Several nodes' sessions as one (a ``JobSession``): merged events, the
    cross-node stall check of the live-analysis pipeline (the odd rank out may
    be on another machine), commands to every node or to none."""

    def __init__(self, sessions: list[RemoteSession], clock=time.time, stall_after: float | None = None):

        self.sessions = sessions
        self.clock = clock
        self._woken = threading.Event()  # wake()
        self._judged_until = float("-inf")
        # (the cross-node analysis judges silences at judge_time(): no later than every live link has been read)
        self.pipeline = Pipeline(node=ACROSS, stall_after=stall_after, clock=self.judge_time, stall_only=True,
                                 on_stall=self._stacks_everywhere, in_effect=self._in_effect_everywhere)
        self.one_alarm = OneAlarm()  # one hang, one stall alarm: the nodes' own are folded into the cross-node one
        # past a few nodes, the notes every node makes alike (a stack capture's, its own folded alarm) are counted
        self.note_folds = NoteFolder() if len(sessions) > NOTES_FOLD_FROM else None
        self._final: StateEvent | None = None
        self.finished = False
        self._seen: dict[str, dict[str, set]] = {}  # what -> node -> values (NCCL version, transports)
        self._said: set = set()
        self._versions_read: dict[str, dict] = {}  # node -> its versions as last read (the same dict: not again)
        self._rank_node: dict[tuple, str] = {}  # (launch, attempt, rank) -> the node that first reported it
        self._clashes: set[int] = set()
        self._launches = 0  # the highest launch generation shown
        self._judged: tuple[float, tuple[float, dict[int, str], bool]] | None = None  # (when, _judgement())

    def _in_effect_everywhere(self) -> set[str]:
        """The profiles that would change nothing on any node (``profiles.in_effect`` of each node's run: its
        environment and its launch command's shape, p2p-off where every node runs one rank): the cross-node
        alarm does not suggest them.  Nothing while a node's run is not known yet."""
        try:
            profiles = load_all()
        except (ProfileError, OSError):  # (a broken profile file: every suggestion stays)
            return set()
        out: set[str] | None = None
        for s in self.sessions:
            meta = s.meta
            if meta is None:
                return set()
            here = in_effect(profiles, meta.env_set, None, launch_options(meta.command, meta.launch_env()))
            out = here if out is None else out & here
        return out or set()

    def judge_time(self) -> float:
        """The time the cross-node stall detector judges at: now, or, when a node's link that is up has been
        read only up to an earlier time (a slow link, or this machine too busy to read 128 links as they
        come), that time (and a heartbeat's interval: a node quiet since its last cursor would have sent one
        by then): the nodes' lines not read yet are not silence.  A link that is down is not waited
        for (its own state says it); one that stays silent is dropped after ``ssh.SILENCE`` and reconnected.
        Never goes back."""
        now = self.clock()
        heard = [s.heard_until for s in self.sessions
                 if s.heard_until is not None and s.link == "up" and not s.finished]
        t = min(now, min(heard) + HEARD_SLACK) if heard else now
        self._judged_until = max(self._judged_until, t)
        return self._judged_until

    @property
    def meta(self) -> journal.Meta | None:
        return next((s.meta for s in self.sessions if s.meta is not None), None)

    @property
    def error(self) -> str | None:
        """Why watching a node failed for good (each such node named)."""
        errs = [f"{s.node}: {s.error}" for s in self.sessions if s.error]
        return "; ".join(errs) if errs else None

    @property
    def location(self) -> Nodes:
        return Nodes(tuple(s.location for s in self.sessions))

    @property
    def is_live(self) -> bool:
        return any(s.is_live for s in self.sessions)

    @property
    def final_state(self) -> StateEvent | None:
        return self._final

    def exit_status(self) -> ExitStatus:
        """The first node that did not succeed decides; all succeeded: 0."""
        if self._final is None:
            return ExitStatus.unknown("the job has not ended")
        statuses = [s.exit_status() for s in self.sessions]
        bad = [st for st in statuses if st.code != 0]
        return bad[0] if bad else statuses[0]

    def control(self) -> Control:
        parts = [s.control() for s in self.sessions]
        refused = "; ".join(p.refused for p in parts if p.refused)
        return Control(stop=all(p.stop for p in parts), relaunch=all(p.relaunch for p in parts),
                       stacks=any(p.stacks for p in parts), refused=refused if not all(p.stop for p in parts) else "",
                       fix_refused=FIX_ELSEWHERE)

    def cursor(self) -> dict[str, int]:
        return {f"{s.node}:{path}": off for s in self.sessions for path, off in s.cursor().items()}

    def wake(self) -> None:
        """End a ``wait`` under way."""
        self._woken.set()

    def wait(self, timeout: float) -> None:
        """Until a node's link delivers something, or ``timeout`` (looked at every MULTI_STEP)."""
        deadline = time.monotonic() + timeout
        while not self.finished:
            left = deadline - time.monotonic()
            if left <= 0 or any(s.has_news for s in self.sessions):
                return
            if self._woken.wait(min(left, MULTI_STEP)):
                self._woken.clear()
                return

    def poll(self) -> list[Event]:
        out: list[Event] = []
        for s in self.sessions:
            for ev in s.poll():
                if isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
                    # per node; the job's final state comes once all have ended
                    out.append(NoteEvent(ev.t, "info" if ev.exit_code == 0 else "warning",
                                         f"{ev.node}: job {ev.state}" + (f", exit code {ev.exit_code}"
                                                                         if ev.exit_code is not None else "")
                                         + (f" ({ev.message})" if ev.message else ""), node=ev.node))
                else:
                    out.append(ev)
        out += self._node_differences(out)
        for i, ev in enumerate(out):
            # each node counts its own restarts' launches: one job's count, so that each is a new launch here
            if isinstance(ev, LaunchEvent):
                if ev.node_restart and ev.generation <= self._launches:
                    ev = out[i] = replace(ev, generation=self._launches + 1)
                self._launches = max(self._launches, ev.generation)
        gen = self.pipeline.generation
        for ev in list(out):
            if isinstance(ev, LaunchEvent) and ev.generation > gen:
                gen = ev.generation
            if isinstance(ev, RankEvent) and ev.alive:
                # torchrun may give ranks to other nodes on a restart: compare within one attempt
                first = self._rank_node.setdefault((gen, ev.attempt, ev.rank), ev.node)
                if first != ev.node and ev.rank not in self._clashes:
                    self._clashes.add(ev.rank)
                    out.append(NoteEvent(ev.t, "warning", (
                        f"rank {ev.rank} is reported by both {first} and {ev.node}: these nodes run separate jobs "
                        "(or torchrun's --node-rank is the same on both); ranks are shown by number, so their "
                        "lines and the stall detector mix them. Attach to one node at a time.")))
        alarms = self.pipeline.process(out)
        ending = not self.finished and all(s.finished for s in self.sessions)
        # (what the one-alarm rule reads of the detector walks every rank: at 1,024 ranks, read on each of the
        # many polls a second that a busy job brings, it was most of the viewer's CPU; read when a stall alarm
        # is to be placed, else at most every JUDGE_EVERY)
        urgent = ending or bool(alarms) or any(isinstance(ev, AlarmEvent) and ev.type == "stall" for ev in out)
        silence_began, rank_nodes, suspected = self._judgement(urgent)
        out = self.one_alarm.apply(out, [a for a in alarms if isinstance(a, AlarmEvent)], self.clock(),
                                   silence_began=silence_began, rank_nodes=rank_nodes, flush=ending,
                                   suspected=suspected)
        out.extend(a for a in alarms if not isinstance(a, AlarmEvent))
        self.pipeline.react(alarms)
        if self.note_folds is not None:
            now = self.clock()
            out = self.note_folds.add(out, now)
            if ending:
                out += self.note_folds.due(now, flush=True)
        if ending:
            finals = [s.final_state for s in self.sessions if s.final_state is not None]
            bad = [f for f in finals if f.exit_code != 0]
            f = bad[0] if bad else (finals[0] if finals else None)
            nodes = ", ".join(f"{s.node}: {s.final_state.state if s.final_state else 'unknown'}" for s in self.sessions)
            self._final = StateEvent(self.clock(), f.state if f else LOST, f.exit_code if f else None, nodes)
            out.append(self._final)
            self.finished = True
        return out

    def _judgement(self, fresh: bool) -> tuple[float, dict[int, str], bool]:
        """The detector's silence_began, rank_nodes and suspects_stall, read now when ``fresh`` or when the
        last reading is JUDGE_EVERY old, else that reading."""
        now = self.clock()
        if fresh or self._judged is None or not 0 <= now - self._judged[0] < JUDGE_EVERY:
            an = self.pipeline.analyzer
            self._judged = (now, (an.silence_began(), an.rank_nodes(), an.suspects_stall()))
        return self._judged[1]

    def _stacks_everywhere(self, alarm: AlarmEvent) -> None:
        for s in self.sessions:
            if s.control().stacks:
                s.dump_stacks()

    def _all_or_none(self, what: str, ask) -> CommandResult:
        """A command goes to every node or to none: a link that is down is named and nothing is sent."""
        if self.finished:
            return CommandResult(False, "the job has ended")
        c = self.control()
        if c.refused:
            return CommandResult(False, c.refused, refused=True)
        down = [f"{s.node} ({s.error or s.link})" for s in self.sessions if s.link != "up" or s.error]
        if down:
            return CommandResult(False, f"not sent to any node: the link to {', '.join(down)} is not up")
        results = [ask(s) for s in self.sessions]
        failed = [r.message for r in results if not r.ok]
        if failed:
            return CommandResult(False, "; ".join(failed))
        return CommandResult(True, f"asked every node to {what}")

    def stop(self) -> CommandResult:
        return self._all_or_none("stop the job", lambda s: s.stop())

    def relaunch(self, profiles: list[str], reason: str = "asked for") -> CommandResult:
        return self._all_or_none(f"relaunch with {', '.join(profiles) or 'no profile'}",
                                 lambda s: s.relaunch(profiles, reason))

    def dump_stacks(self) -> CommandResult:
        results = [s.dump_stacks() for s in self.sessions]
        if any(results):
            return CommandResult(True, "; ".join(r.message for r in results))
        return CommandResult(False, "; ".join(r.message for r in results))

    def _node_differences(self, events: list[Event]) -> list[Event]:
        """Nodes of one job that run different software or NCCL transports: a
        finding (one note per difference), from the agents' hellos and from
        NCCL's INFO lines (the nccl-debug profile)."""
        seen = self._seen
        for s in self.sessions:
            if s.versions is self._versions_read.get(s.node):
                continue  # (a node's versions are a new dict at each hello: read once each)
            self._versions_read[s.node] = s.versions
            for what, v in s.versions.items():
                if what in ("torch", "nccl"):
                    seen.setdefault(what, {}).setdefault(s.node, set()).add(v)
        for ev in events:
            if not isinstance(ev, LogBatch) or "NCCL" not in "\n".join(ev.texts):
                continue  # (one C-level search for the batch; lines one by one only where NCCL speaks)
            for text in ev.texts:
                if "NCCL" not in text:
                    continue
                m = _NCCL_VERSION.search(text)
                if m:
                    seen.setdefault("NCCL (from its log)", {}).setdefault(ev.node, set()).add(m.group(1))
                m = _NCCL_VIA.search(text)
                if m:
                    seen.setdefault("NCCL transport", {}).setdefault(ev.node, set()).add(m.group(1))
        out: list[Event] = []
        for what, per_node in seen.items():
            if len(per_node) < 2:
                continue
            if what == "NCCL transport":
                # between nodes: InfiniBand on one, sockets on another
                per_node = {n: {v for v in vs if v.startswith("NET/")} for n, vs in per_node.items()}
                per_node = {n: v for n, v in per_node.items() if v}
                if len(per_node) < 2:
                    continue
            if len({frozenset(v) for v in per_node.values()}) < 2:
                continue
            key = (what, tuple(sorted((n, tuple(sorted(v))) for n, v in per_node.items())))
            if key in self._said:
                continue
            self._said.add(key)
            desc = "; ".join(f"{n}: {', '.join(sorted(v))}" for n, v in sorted(per_node.items()))
            hint = (" (InfiniBand on some nodes, sockets on others: check NCCL_IB_* and the IB devices)"
                    if what == "NCCL transport" else " (one job should run the same versions on every node)")
            out.append(NoteEvent(self.clock(), "warning", f"nodes differ in {what}: {desc}{hint}"))
        return out

    def close(self) -> None:
        for s in self.sessions:
            s.close()
