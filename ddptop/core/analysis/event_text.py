"""Events in words: the one event-to-text conversion of headless mode and the UI.

``describe(ev)`` says what a non-log event means, in one line, with its
urgency; each front end only decorates it: headless mode prints
``== ddptop: ... ==`` (``!! ddptop ...`` when urgent), the UI writes a note
line into its merged log.  A new event kind, or a new field worth a word,
is taught here once and both front ends say it the same way.  Log lines are
not described here: each front end lays them out itself (prefixes, colours).
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddptop.core.analysis.wording import exit_words
from ddptop.core.model.events import (
    AlarmEvent,
    Event,
    GpuStatusEvent,
    LaunchEvent,
    LinkEvent,
    NoteEvent,
    RankEvent,
    RasEvent,
    StacksEvent,
    StateEvent,
)
from ddptop.core.model.evidence import StackEvidence


@dataclass(frozen=True, slots=True)
class Said:
    """One event in words.

    ``level`` is "info", "warning", "error" or "alarm" (how it is styled);
    ``label`` is the word a note carries before its text ("warning", "info",
    ...), "" for everything else; ``urgent``: said with ``!!`` by headless
    mode (alarms, a GPU driver that is there but broken)."""

    text: str
    level: str = "info"
    label: str = ""
    urgent: bool = False

    def line(self) -> str:
        """The UI's merged-log text."""
        return f"{self.label}: {self.text}" if self.label else self.text


def describe(ev: Event, *, nodes: bool = False) -> Said | None:
    """What ``ev`` says, or None for what is not said in words (log lines,
    telemetry and progress: tables and panes show them; the first launch).
    ``nodes``: the job spans several nodes, so an alarm names its node."""
    if isinstance(ev, StateEvent):
        s = f"job {ev.state}"
        if ev.exit_code is not None:
            s += f", exit code {ev.exit_code}"
        if ev.message:
            s += f" ({ev.message})"
        return Said(s, "error" if ev.state in ("failed", "lost") else "info")
    if isinstance(ev, RankEvent):
        if ev.alive:
            what = "started"
        elif ev.exit_code is None:
            what = "ended"
        else:
            what = exit_words(ev.exit_code)
        return Said(f"rank {ev.rank} (local {ev.local_rank}, pid {ev.pid}, attempt {ev.attempt}) {what}")
    if isinstance(ev, LaunchEvent):
        if ev.node_restart:
            return Said(f"{ev.node}: attempt {ev.node_restart} ({ev.reason})", "warning")
        if ev.generation == 0:
            return None
        return Said(f"relaunch #{ev.generation} with profiles {', '.join(ev.profiles) or 'default'}"
                    f" ({ev.reason}); env changes: {ev.env_diff}")
    if isinstance(ev, GpuStatusEvent):
        if ev.fault:  # a driver that is there but broken is a problem, not "no GPU"
            return Said(f"GPUs not monitored, {ev.message}: {ev.fault}", "error", urgent=True)
        return Said(f"GPUs ({ev.backend}): {ev.message}")
    if isinstance(ev, AlarmEvent):
        where = f" ({ev.node})" if nodes and ev.node else ""
        return Said(f"ALARM [{ev.type}/{ev.id}]{where} {ev.message}", "alarm", urgent=True)
    if isinstance(ev, StacksEvent):
        if ev.error and not ev.samples:
            return Said(f"no stack samples: {ev.error}", "warning")
        verdict = ("the others wait for ranks that work (their stacks move): not a hang unless it lasts"
                   if waiting_on_work(ev) else {True: "frozen", False: "moving (work)", None: "unclear"}[ev.hung])
        return Said(f"stacks of {len(ev.ranks)} ranks, {ev.samples} samples over {ev.span:.1f} s: {verdict}"
                    + (f"; {ev.summary}" if ev.summary else "") + (f" ({ev.dir})" if ev.dir else ""))
    if isinstance(ev, RasEvent):
        if not ev.ok:
            return Said(f"no NCCL RAS answer ({ev.addr}): {ev.error}", "info")
        said = ev.text or "every rank launched the same collectives, none missing"
        return Said(f"NCCL RAS (NCCL {ev.version or '?'}, {ev.format}, {ev.took:.2f} s): {said}"
                    + (f" ({ev.file})" if ev.file else ""), "warning" if ev.culprits else "info")
    if isinstance(ev, NoteEvent):
        return Said(ev.message, ev.level if ev.level in ("warning", "error") else "info", label=ev.level)
    if isinstance(ev, LinkEvent):
        # a node that drops is said once: its first drop, then nothing while it is retried with backoff (the
        # header shows its state), then when it is back (128 nodes, one of them down for an hour, is two lines)
        if ev.tries and ev.state in ("down", "connecting"):
            return None
        s = f"link to {ev.node} {ev.state}"
        if ev.message:
            s += f": {ev.message}"
        if ev.retry_in is not None:
            s += f" (retrying in {ev.retry_in:g} s, then less often, in silence)"
        if ev.state == "up" and ev.tries:
            s += f" (back after {ev.tries} tr{'y' if ev.tries == 1 else 'ies'})"
        return Said(s, "warning" if ev.state in ("down", "failed") else "info")
    return None


def waiting_on_work(ev: StacksEvent) -> bool:
    """Stack samples in which the ranks that the others wait for are themselves
    working (their stacks move, or they run on the CPU outside any wait):
    rank 0 evaluating alone while the others sit in a barrier.  The stall
    detector gives that the work patience; a person should not read it as a
    hang.  (The rule is ``StackEvidence.waits_on_work``.)"""

    return bool(StackEvidence.from_event(ev).waits_on_work())
