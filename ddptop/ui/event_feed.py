"""The app's event feed: a thread polls the session, the UI takes the events in.

A thread worker calls ``session.poll()`` and hands events over in a list; at
most one ``EventsReady`` message is in flight at a time, and the UI takes the
whole accumulated batch per message (``ingest``): into the job's state, the
log buffers (a bounded number of lines per batch, written at most every
``FLUSH_EVERY`` seconds) and the separator of a relaunch.  A mixin of
``DdptopApp`` (``app.py``), which owns the state it writes.
"""

from __future__ import annotations

import time

from textual import work
from textual.message import Message

from ddptop.core.analysis.event_text import describe
from ddptop.core.model.events import (
    FINAL_STATES,
    AlarmEvent,
    GpuEvent,
    GpuStatusEvent,
    LaunchEvent,
    LinkEvent,
    LogBatch,
    NoteEvent,
    ProcEvent,
    ProgressEvent,
    RankEvent,
    StateEvent,
)
from ddptop.ui.log_panes import FLUSH_EVERY
from ddptop.ui.logview import Line

TABLE_EVERY = 0.5  # seconds between rank-table updates
WAIT = 1.0  # seconds the poller waits for a file to change (or a line to arrive) at most
BACKLOG_LINES = 200_000  # the poller waits while this many lines (and other events) wait for the UI
# shown elsewhere than the log: the rank table, the GPU pane, the header
INGEST_SLICE = 20_000  # lines taken from the inbox at a time at most (a screen refresh may come between slices)
INGEST_BUDGET = 0.05  # seconds one slice should take: the slice is sized by what the last ones cost a line
INGEST_SLICE_MIN = 500
_NOT_IN_LOG = (LogBatch, RankEvent, LaunchEvent, GpuEvent, ProcEvent, ProgressEvent, GpuStatusEvent)
_NO_LINE = (RankEvent, GpuEvent, ProcEvent, ProgressEvent, GpuStatusEvent)  # events that add no line to a pane
_STYLE = {"alarm": "bold", "error": "bold", "warning": "bold", "info": "dim"}


def event_line(ev, nodes: bool) -> Line | None:
    """The line an event (not a log batch, nor a link's) puts in the merged log, if any; ``nodes``: the job is
    watched through links to its nodes."""
    if isinstance(ev, (_NOT_IN_LOG, LinkEvent)):
        return None
    said = describe(ev, nodes=nodes)
    if said is None:
        return None
    return Line(-1, "note", said.line(), "bold" if isinstance(ev, StateEvent) else _STYLE.get(said.level, "dim"))


class EventsReady(Message):
    """Events are waiting in the app's inbox (one message per batch)."""


class PollFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


# what an alarm may go ahead of in the inbox: readings whose order against it tells nothing
_READINGS = (LogBatch, GpuEvent, ProcEvent, ProgressEvent)


def queue_events(inbox: list, events: list) -> None:
    """Put ``events`` at the end of the inbox, but each alarm ahead of the readings (log lines, GPU and
    process readings, steps) queued before it: an interface that is seconds behind a 1,024-rank job's lines
    shows the alarm at once, not after them (never ahead of a rank, state, launch or link event)."""
    for ev in events:
        if isinstance(ev, AlarmEvent):
            i = len(inbox)
            while i and isinstance(inbox[i - 1], _READINGS):
                i -= 1
            inbox.insert(i, ev)
        else:
            inbox.append(ev)


class EventFeed:
    """The poll thread, the inbox and the intake of events (mixed into ``DdptopApp``)."""

    _poll_error: str | None
    _preapplied: set[int]
    _table_every: float
    _relaunching: str | None  # profiles asked for, until the new launch shows

    # -- polling (thread) -----------------------------------------------------

    @work(thread=True, exclusive=True, group="poll", exit_on_error=False)
    def _poll_loop(self) -> None:
        from textual.worker import get_current_worker

        worker = get_current_worker()
        session = self.session
        while not worker.is_cancelled:
            try:
                events = session.poll()
            except Exception as e:  # noqa: BLE001 - the poll thread's boundary: the UI stays alive and says what happened
                self.post_message(PollFailed(f"{type(e).__name__}: {e}"))
                time.sleep(max(self.poll_interval, 1.0))
                continue
            if events:
                backlog = self._queue(events)
                if backlog > BACKLOG_LINES:
                    time.sleep(self.poll_interval)  # the UI is behind: let it catch up before reading on
            if session.finished:
                break
            if not events:
                session.wait(WAIT)  # until a file changes (or a line arrives), or a deadline

    def _queue(self, events: list) -> int:
        """Put ``events`` in the inbox and tell the screen, once until it takes them; the lines now waiting."""
        with self._inbox_lock:
            queue_events(self._inbox, events)
            self._inbox_lines += sum(len(ev) if isinstance(ev, LogBatch) else 1 for ev in events)
            backlog = self._inbox_lines
            post = not self._posted
            self._posted = True
        if post:
            self.post_message(EventsReady())
        return backlog

    def on_poll_failed(self, msg: PollFailed) -> None:
        if msg.error != self._poll_error:
            self._poll_error = msg.error
            self._add_line(Line(-1, "note", f"reading the job failed: {msg.error}", "bold"))
            self.logs.flush()

    def on_events_ready(self, _msg: EventsReady) -> None:
        """Take what the inbox holds, a slice at a time (the rest stays first in it, for the next message): a
        replay of 1,024 ranks' logs shows its lines after its first slice, and the screen answers keys
        between slices, rather than after all of it.  A slice is what INGEST_BUDGET allows at the cost a line
        had in the last slices (a live 1,024-rank view that fell behind takes 50 ms at a time, not seconds),
        INGEST_SLICE lines at most."""
        with self._inbox_lock:
            events, taken = [], 0
            for ev in self._inbox:
                k = len(ev) if isinstance(ev, LogBatch) else 1
                if events and taken + k > self._slice:
                    break
                events.append(ev)
                taken += k
            self._inbox = self._inbox[len(events):]
            self._inbox_lines = max(0, self._inbox_lines - taken) if self._inbox else 0
            more = bool(self._inbox)
            self._posted = more
        if more:
            self.call_after_refresh(self.post_message, EventsReady())
        if events:
            t0 = time.perf_counter()
            self.ingest(events)
            if taken >= INGEST_SLICE_MIN:  # (a few lines say little about the cost of many)
                per_line = (time.perf_counter() - t0) / taken
                self._slice = max(INGEST_SLICE_MIN, min(INGEST_SLICE, int(INGEST_BUDGET / max(per_line, 1e-7))))

    # -- events -> model, buffers, widgets ------------------------------------

    def ingest(self, events: list) -> None:
        """Apply one batch of events (also usable directly from tests)."""
        fresh = events
        if self._preapplied:  # (the first frame's events: the model has them)
            fresh = [ev for ev in events if id(ev) not in self._preapplied]
            self._preapplied.difference_update(id(ev) for ev in events)
        try:
            self.model.apply(fresh)
        except Exception as e:  # noqa: BLE001 - a UI callback must not take the monitor down: said in the log
            self._add_line(Line(-1, "note", f"could not apply events: {e}", "bold"))
        new_ranks = False
        # a finished run's replay folds every line; a live job's flood is capped (logview.FOLD_RATE)
        self.logs.buffers["merged"].fold_capped = not (self._replay or self._job_ended())
        merged: list = []  # the merged pane's lines of the batches since the last other line, folded at once
        for ev in events:
            try:
                if isinstance(ev, LogBatch):
                    if ev.rank is not None and self.logs.ensure_rank(ev.rank):
                        new_ranks = True
                    self.logs.add_batch_later(merged, ev.rank, ev.stream, ev.done, ev.node, ev.path, ev.offsets)
                    if ev.live is not None:
                        self.logs.add_later(merged)
                        self.logs.set_live(ev.rank, ev.stream, ev.live)
                    continue
                if not isinstance(ev, _NO_LINE):
                    self.logs.add_later(merged)  # (what this event adds to the merged pane comes after them)
                if isinstance(ev, RankEvent):
                    if self.logs.ensure_rank(ev.rank):
                        new_ranks = True
                elif isinstance(ev, LaunchEvent):
                    self._on_launch(ev)
                elif isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
                    self._relaunching = None
                if isinstance(ev, LinkEvent):
                    self._on_link(ev)
                else:
                    line = event_line(ev, bool(self.model.links))
                    if line is not None:
                        self._add_line(line)
            except Exception as e:  # noqa: BLE001 - one bad event must not take the monitor down; said in the log
                self._add_line(Line(-1, "note", f"could not show an event: {e}", "dim"))
        try:
            self.logs.add_later(merged)
        except Exception as e:  # noqa: BLE001 - as for one event above: said in the log, the monitor goes on
            self._add_line(Line(-1, "note", f"could not show an event: {e}", "dim"))
        if any(isinstance(ev, LogBatch) and ev.rank is None for ev in events):
            self.logs.ensure("torchrun")
        self._check_multi_node()
        links = any(isinstance(ev, LinkEvent) for ev in events)
        if links or any(isinstance(ev, (AlarmEvent, NoteEvent, LaunchEvent)) for ev in events):  # a relaunch clears them
            self._refresh_alarms()
        if links:
            self._refresh_header()
        self._schedule_flush()
        if new_ranks:
            self.refresh_bindings()

    def _on_link(self, ev: LinkEvent) -> None:
        """A line in the merged log when a node's link comes up, drops or fails
        (once per change: a node that stays unreachable does not repeat it)."""
        if ev.state not in ("up", "down", "failed") or self._link_logged.get(ev.node) == ev.state:
            return
        self._link_logged[ev.node] = ev.state
        said = describe(ev)
        if said is not None:
            self._add_line(Line(-1, "note", said.line(), _STYLE.get(said.level, "dim"), node=ev.node))

    def _check_multi_node(self) -> None:
        """Several nodes (attached, or ranks on several hosts): torchrun's lines
        then name their node; the panes re-render once when that changes."""
        m = self.model
        multi = len(m.nodes) > 1
        if not multi and len(m.ranks) > 1:
            first = None
            for info in m.ranks.values():
                if info.node:
                    if first is None:
                        first = info.node
                    elif info.node != first:
                        multi = True
                        break
        self.logs.set_multi_node(multi)

    def _on_launch(self, ev: LaunchEvent) -> None:
        """A new launch: a separator line in every pane, so the new attempt stands out."""
        if ev.generation > self._generation:
            self._generation = ev.generation
            self._relaunching = None
            profs = ", ".join(ev.profiles) or "no profile"
            if ev.node_restart:  # the node's cluster restarted it: a new attempt of that node
                text = f"──── {ev.node}: attempt {ev.node_restart}, restarted by the cluster ────"
            else:
                text = f"──── relaunch #{ev.generation} with profiles {profs} ────"
            if ev.reason:
                reason = ev.reason if len(ev.reason) <= 60 else ev.reason[:59] + "…"
                text += f"  ({reason})"
            self.logs.separator(Line(-1, "sep", text, "bold"))
            self.notify(f"{ev.node}: attempt {ev.node_restart} started (restarted by the cluster)" if ev.node_restart
                        else f"relaunch #{ev.generation} started with profiles: {profs}", timeout=4)
        self._refresh_env()
        self._refresh_header()

    def _add_line(self, line: Line) -> None:
        self.logs.add_line(line)

    def _schedule_flush(self) -> None:
        """Write to the widgets at most every FLUSH_EVERY seconds (batches coalesce)."""
        if self._flush_timer is not None:
            return
        wait = self._last_flush + FLUSH_EVERY - time.monotonic()
        if wait <= 0:
            self._flush_now()
        else:
            self._flush_timer = self.set_timer(wait, self._flush_now)

    def _flush_now(self) -> None:
        self._flush_timer = None
        self._last_flush = time.monotonic()
        self.logs.flush()
        now = time.monotonic()
        if now - self._last_table >= self._table_every or len(self.model.ranks) != self._table_rows:
            self._refresh_table()
            self._refresh_header()
