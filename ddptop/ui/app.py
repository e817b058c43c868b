"""The Textual UI: a live view of one job (any ``JobSession``).

``make_app(session)`` builds it; after ``app.run()`` the return value is
``"detach"`` (the job keeps running), ``"stop"`` (``session.stop()`` was
called; the caller waits for the end) or ``"finished"`` (the job had ended).

This module is the app itself: the layout, the keys, the poll thread and
what each key does.  The parts have their own modules:

* ``header.py``: the header line and the launch/env panel;
* ``alarm_box.py``: the alarms above the rank table;
* ``rank_table.py``: the rank table;
* ``gpu_pane.py``: the GPU pane;
* ``log_panes.py`` and ``logview.py``: the log tabs and their buffers;
* ``dialogs.py``: quit, fix, help and the relaunch profile picker;
* ``stacks_screen.py``, ``tool_screens.py``: the stacks pane, doctor and bench;
* ``ddptop.core.analysis.event_text``: what an event says, shared with headless mode.

Data flow: a thread worker calls ``session.poll()`` and hands events over in a
list; at most one ``EventsReady`` message is in flight at a time, and the UI
takes the whole accumulated batch per message.  Each log pane writes a bounded
number of lines per batch, in one call.

One module, though over 500 lines: it is the app class, the one owner of the
screen's state and of the key bindings; every part that could stand alone (the
list above) already does, and what is left here is the wiring between them.
"""

from __future__ import annotations

import threading
import time
from typing import ClassVar

from textual import on, work
from textual.app import App, ComposeResult, ScreenStackError
from textual.binding import Binding
from textual.content import Content
from textual.css.query import NoMatches
from textual.markup import escape
from textual.message import Message
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Input, Static, TabbedContent, TabPane

from ddptop.core.analysis.event_text import describe
from ddptop.core.analysis.job_state import JobState
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
from ddptop.core.model.session_protocol import JobSession, Nodes, RemoteRun
from ddptop.core.run.profiles import ProfileError, load_all
from ddptop.ui.alarm_box import AlarmBox, is_recent
from ddptop.ui.dialogs import (
    DEFAULT_CHOICE,
    FixScreen,
    HelpScreen,
    ProfilePicker,
    QuitScreen,
    picker_choices,
)
from ddptop.ui.gpu_pane import GpuPane
from ddptop.ui.header import HeaderBar, HeaderState, env_markup
from ddptop.ui.log_panes import FLUSH_EVERY, LogPanes
from ddptop.ui.logview import Line
from ddptop.ui.rank_table import RankTable
from ddptop.ui.stacks_screen import StacksScreen
from ddptop.ui.theme_files import DEFAULT_THEME, FALLBACK_THEME, load_themes
from ddptop.ui.tool_screens import BenchScreen, DoctorScreen

TABLE_EVERY = 0.5  # seconds between rank-table updates
WAIT = 1.0  # seconds the poller waits for a file to change (or a line to arrive) at most
BACKLOG_LINES = 200_000  # the poller waits while this many lines (and other events) wait for the UI
# shown elsewhere than the log: the rank table, the GPU pane, the header
_NOT_IN_LOG = (LogBatch, RankEvent, LaunchEvent, GpuEvent, ProcEvent, ProgressEvent, GpuStatusEvent)
_STYLE = {"alarm": "bold", "error": "bold", "warning": "bold", "info": "dim"}


class EventsReady(Message):
    """Events are waiting in the app's inbox (one message per batch)."""


class PollFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class FilterInput(Input):
    BINDINGS = [Binding("escape", "app.clear_filter", "Clear filter", show=False)]


class DdptopApp(App[str]):
    TITLE = "ddptop"
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]  # applied to the screen as the terminal resizes
    DEFAULT_CSS = """
    Screen { layout: vertical; }
    #header {
        height: 1; width: 100%; padding: 0 1;
        background: $panel; color: $foreground;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    #header.-links { height: 2; }
    #ranks {
        height: auto; max-height: 12;
        border-bottom: solid $primary 40%;
    }
    #panes { height: 1fr; min-height: 6; }
    #panes TabPane { padding: 0; }
    .logview RichLog { height: 1fr; background: $surface; scrollbar-size-vertical: 1; overflow-x: hidden; }
    .logview .live {
        height: auto; max-height: 4; display: none;
        background: $surface; color: $text-muted; padding: 0 0 0 0;
    }
    .logview .live.-on { display: block; }
    #envpanel {
        height: auto; max-height: 12; display: none; padding: 0 1;
        background: $panel; border-bottom: solid $accent;
    }
    #envpanel.-on { display: block; }
    #filter { dock: bottom; display: none; height: 3; border: tall $accent; }
    /* short terminals: keep room for the logs (the merged log has every alarm in full) */
    Screen.-short #alarms { max-height: 5; }
    #filter.-on { display: block; }
    """

    BINDINGS: ClassVar[list[Binding | tuple[str, str] | tuple[str, str, str]]] = [
        Binding("q", "request_quit", "Quit"),
        Binding("ctrl+c,ctrl+q", "request_quit", "Quit", show=False, priority=True),
        Binding("question_mark", "help", "Help"),
        Binding("slash", "open_filter", "Filter"),
        Binding("m", "pane('merged')", "Merged"),
        Binding("t", "pane('torchrun')", "torchrun", show=False),
        Binding("tab", "cycle(1)", "Next pane", priority=True),
        Binding("shift+tab", "cycle(-1)", "Prev pane", show=False, priority=True),
        Binding("w", "toggle_wrap", "Wrap", show=False),
        Binding("g", "toggle_gpus", "GPUs"),
        Binding("r", "relaunch", "Relaunch"),
        Binding("e", "toggle_env", "Env"),
        Binding("p", "stacks", "Stacks", show=False),
        Binding("s", "stacks_pane", "Stacks pane", show=False),
        Binding("D", "doctor", "Doctor", show=False),
        Binding("F", "fix", "Fix search", show=False),
        Binding("B", "bench", "P2P bench", show=False),
        Binding("end", "follow", "Follow", show=False),
        Binding("home", "top", "Top", show=False),
        *(Binding(str(n), f"rank({n})", f"Rank {n}", show=False) for n in range(10)),
    ]

    MAIN_ACTIONS = {"request_quit", "help", "open_filter", "pane", "cycle", "rank", "follow", "top", "clear_filter", "toggle_wrap", "toggle_gpus",
                    "relaunch", "toggle_env", "stacks", "stacks_pane", "doctor", "bench", "fix"}

    def __init__(self, session: JobSession, *, theme: str | None = None, poll_interval: float = 0.1) -> None:
        super().__init__()
        self.session = session
        self.poll_interval = poll_interval
        self.model = JobState()
        self._requested_theme = theme
        self._inbox: list = []
        self._inbox_lines = 0  # lines (and other events) in the inbox
        self._inbox_lock = threading.Lock()
        self._posted = False
        self.logs = LogPanes(self)
        self._stopping = False
        self._flush_timer: Timer | None = None
        self._last_flush = 0.0
        self._last_table = 0.0
        self._table_rows = 0
        self._poll_error: str | None = None
        self._alarm_list: list | None = None
        self._alarms_seen = 0
        self._gpus_hidden = False
        self._generation = 0  # the launch whose separator the panes have shown
        self._relaunching: str | None = None  # profiles asked for, until the new launch shows
        self._link_logged: dict[str, str] = {}  # node -> link state last written to the log
        self._gpu_error_shown = False
        self._ui_errors: set[tuple[str, str, str]] = set()
        loc = session.location
        self._remote = isinstance(loc, (RemoteRun, Nodes))  # named by its target until the node says the run
        meta = session.meta
        self.run_id = meta.run_id if meta is not None else str(loc)
        self.attach_hint = loc.attach_hint if self._remote else ""
        self._remote_run_id = ""
        self.sub_title = self.attach_hint or self.run_id
        self._theme_warning = ""
        self._setup_themes()  # before the first paint: a theme set after it styles every widget twice

    # -- layout ---------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        yield Static("", id="envpanel")
        alarms = AlarmBox(id="alarms")
        alarms.can_relaunch = not self.session.control().refused  # a job ddptop did not start: no r
        yield alarms
        yield RankTable(id="ranks")
        yield GpuPane(id="gpu-pane")
        with TabbedContent(id="panes", initial="pane-merged"):
            with TabPane("merged", id="pane-merged"):
                yield from self.logs.make_view("merged")
        yield FilterInput(placeholder="filter: lines containing… (esc clears, enter keeps)", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        if self._theme_warning:
            self.notify(self._theme_warning, severity="warning")
        self._update_palette()
        self._refresh_header()
        self.call_after_refresh(self.logs.after_first_frame)  # (a screenful of lines is in the first frame)
        self.set_interval(1.0, self._tick)
        self._poll_loop()

    def exit(self, *args, **kwargs) -> None:
        self.session.wake()  # the poll thread may be waiting for a file to change: let it see the end now
        super().exit(*args, **kwargs)

    def _setup_themes(self) -> None:
        broken: list[str] = []
        for th in load_themes(errors=broken):
            self.register_theme(th)
        wanted = self._requested_theme or DEFAULT_THEME
        if wanted in self.available_themes:
            self.theme = wanted
        elif self._requested_theme:
            self.theme = FALLBACK_THEME
            self._theme_warning = f"unknown theme {self._requested_theme!r}; using {FALLBACK_THEME}"
        else:
            self.theme = FALLBACK_THEME if DEFAULT_THEME not in self.available_themes else DEFAULT_THEME
        if broken:
            said = "; ".join(broken[:3]) + (f" (and {len(broken) - 3} more)" if len(broken) > 3 else "")
            self._theme_warning = "; ".join(x for x in (self._theme_warning, f"theme files skipped: {said}") if x)
        self._update_palette()

    def watch_theme(self, theme: str) -> None:
        self._update_palette()
        self.logs.mark_dirty()
        try:
            self.logs.render_active()
            self._refresh_table()
        except Exception as e:  # noqa: BLE001 - a UI callback must not take the monitor down: said once
            self._ui_error("the screen in this theme", e)

    def _update_palette(self) -> None:
        th = self.current_theme  # (textual falls back to its default theme: never raises)
        self.logs.palette = [c for c in (th.primary, th.accent, th.success, th.secondary, th.warning) if c]

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
                with self._inbox_lock:
                    self._inbox.extend(events)
                    self._inbox_lines += sum(len(ev) if isinstance(ev, LogBatch) else 1 for ev in events)
                    backlog = self._inbox_lines
                    post = not self._posted
                    self._posted = True
                if post:
                    self.post_message(EventsReady())
                if backlog > BACKLOG_LINES:
                    time.sleep(self.poll_interval)  # the UI is behind: let it catch up before reading on
            if session.finished:
                break
            if not events:
                session.wait(WAIT)  # until a file changes (or a line arrives), or a deadline

    def on_poll_failed(self, msg: PollFailed) -> None:
        if msg.error != self._poll_error:
            self._poll_error = msg.error
            self._add_line(Line(-1, "note", f"reading the journal failed: {msg.error}", "bold"))
            self.logs.flush()

    def on_events_ready(self, _msg: EventsReady) -> None:
        with self._inbox_lock:
            events, self._inbox = self._inbox, []
            self._inbox_lines = 0
            self._posted = False
        if events:
            self.ingest(events)

    # -- events -> model, buffers, widgets ------------------------------------

    def ingest(self, events: list) -> None:
        """Apply one batch of events (also usable directly from tests)."""
        try:
            self.model.apply(events)
        except Exception as e:  # noqa: BLE001 - a UI callback must not take the monitor down: said in the log
            self._add_line(Line(-1, "note", f"could not apply events: {e}", "bold"))
        new_ranks = False
        for ev in events:
            try:
                if isinstance(ev, LogBatch):
                    if ev.rank is not None and self.logs.ensure_rank(ev.rank):
                        new_ranks = True
                    self.logs.add_batch(ev.rank, ev.stream, ev.done, ev.node)
                    if ev.live is not None:
                        self.logs.set_live(ev.rank, ev.stream, ev.live)
                    continue
                if isinstance(ev, RankEvent):
                    if self.logs.ensure_rank(ev.rank):
                        new_ranks = True
                elif isinstance(ev, LaunchEvent):
                    self._on_launch(ev)
                elif isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
                    self._relaunching = None
                if isinstance(ev, LinkEvent):
                    self._on_link(ev)
                elif not isinstance(ev, _NOT_IN_LOG):
                    said = describe(ev, nodes=bool(self.model.links))
                    if said is not None:
                        style = "bold" if isinstance(ev, StateEvent) else _STYLE.get(said.level, "dim")
                        self._add_line(Line(-1, "note", said.line(), style))
            except Exception as e:  # noqa: BLE001 - one bad event must not take the monitor down; said in the log
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
        if now - self._last_table >= TABLE_EVERY or len(self.model.ranks) != self._table_rows:
            self._refresh_table()
            self._refresh_header()

    # -- header and table -----------------------------------------------------

    def _tick(self) -> None:
        self._refresh_header()
        if time.monotonic() - self._last_table >= TABLE_EVERY:
            self._refresh_table()

    def _refresh_alarms(self) -> None:
        """Show the alarm box; ring the bell once per new (recent) alarm."""
        alarms = self.model.alarms
        if alarms is not self._alarm_list:  # a relaunch starts a new list
            self._alarm_list = alarms
            self._alarms_seen = 0
        new = alarms[self._alarms_seen:]
        self._alarms_seen = len(alarms)
        for a in new[-3:]:
            if is_recent(a.t):
                self.bell()
        try:
            self.query_one("#alarms", AlarmBox).show(self.model)
        except Exception as e:  # noqa: BLE001 - a UI callback must not take the monitor down: said once
            self._ui_error("the alarm box", e)

    def _refresh_gpus(self) -> None:
        try:
            self.query_one("#gpu-pane", GpuPane).show(self.model, self.current_theme)
        except Exception as e:  # noqa: BLE001 - a UI callback must not take the monitor down: said once
            if not self._gpu_error_shown:
                self._gpu_error_shown = True
                self._add_line(Line(-1, "note", f"could not show GPUs: {e}", "dim"))

    def _refresh_header(self) -> None:
        try:
            meta = self.session.meta
            ui = HeaderState(self._run_label(), started=meta.started if meta is not None else None,
                             relaunching=self._relaunching, stopping=self._stopping, filter=self.logs.filter)
            self.query_one("#header", HeaderBar).show(self.model, ui, time.time())
        except Exception as e:  # noqa: BLE001 - a UI callback: the header keeps its last text; said once
            self._ui_error("the header", e)

    def _ui_error(self, where: str, e: Exception) -> None:
        """A part of the screen that could not be drawn: one note in the log per
        place and error (a viewer never writes the journal)."""
        key = (where, type(e).__name__, str(e)[:200])
        if key in self._ui_errors:
            return
        self._ui_errors.add(key)
        self._add_line(Line(-1, "note", f"error: could not draw {where}: {type(e).__name__}: {e}", "bold"))
        self._schedule_flush()

    def _run_label(self) -> str:
        """The run id; for a remote attachment, before its run is known, the target."""
        if not self._remote:
            return self.run_id
        meta = self.session.meta
        if meta is not None and meta.run_id:
            self._remote_run_id = meta.run_id  # kept: a failed reconnect may forget it
        hint = self.session.location.attach_hint
        if hint != self.sub_title:
            self.sub_title = hint  # pinned to the run once the link is up
        return self._remote_run_id or hint.removeprefix("ddptop attach ")

    def _refresh_table(self) -> None:
        try:
            table = self.query_one("#ranks", RankTable)
        except (NoMatches, ScreenStackError):  # (not mounted yet, no screen yet, or gone while quitting)
            return
        self._last_table = time.monotonic()
        self._table_rows = len(self.model.ranks)
        table.show(self.model, self.current_theme, self._ui_error)
        self._refresh_gpus()

    # -- actions --------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in self.MAIN_ACTIONS and len(self.screen_stack) > 1:
            return False
        if action == "rank" and parameters and f"r{parameters[0]}" not in self.logs.buffers:
            return None if len(self.screen_stack) <= 1 else False
        return True

    def show_pane(self, key: str) -> bool:
        return self.logs.show(key)

    def action_pane(self, key: str) -> None:
        if not self.show_pane(key):
            self.notify(f"no {key} output yet", timeout=2)

    def action_rank(self, n: int) -> None:
        if not self.show_pane(f"r{n}"):
            self.notify(f"no rank {n} yet", timeout=2)

    def action_cycle(self, step: int) -> None:
        self.logs.cycle(step)

    def action_follow(self) -> None:
        log = self.logs.active_log()
        if log is not None:
            log.auto_scroll = True
            log.scroll_end(animate=False)

    def action_toggle_wrap(self) -> None:
        wrap = self.logs.toggle_wrap()
        self.notify("long lines wrap" if wrap else "long lines are cut at the edge", timeout=2)

    def action_toggle_gpus(self) -> None:
        self._gpus_hidden = not self._gpus_hidden
        pane = self.query_one("#gpu-pane", GpuPane)
        pane.set_class(self._gpus_hidden, "-hidden")
        if not self._gpus_hidden:
            self._refresh_gpus()
        self.notify("GPU pane hidden (g shows it)" if self._gpus_hidden else "GPU pane shown", timeout=2)

    def _refresh_env(self) -> None:
        try:
            panel = self.query_one("#envpanel", Static)
            if panel.has_class("-on"):
                panel.update(Content.from_markup(env_markup(self.model)))
        except Exception as e:  # noqa: BLE001 - a UI callback must not take the monitor down: said once
            self._ui_error("the launch panel", e)

    def action_toggle_env(self) -> None:
        panel = self.query_one("#envpanel", Static)
        on_ = not panel.has_class("-on")
        panel.set_class(on_, "-on")
        self._refresh_env()

    def _job_ended(self) -> bool:
        return self.model.finished or self.session.finished

    def action_relaunch(self) -> None:
        control = self.session.control()
        refused = control.refused if not control.relaunch else ""  # a job ddptop did not start
        if refused:
            self.notify(refused, title="cannot relaunch", severity="warning", timeout=15)
            self._add_line(Line(-1, "note", f"relaunch refused: {refused}", "bold"))
            self._schedule_flush()
            return
        if self._relaunching is not None:
            self.notify(f"a relaunch ({self._relaunching}) is on its way", timeout=3)
            return
        try:

            profiles = load_all()
        except (ProfileError, OSError) as e:  # a broken or unreadable profiles file
            self.notify(f"could not read the profiles: {e}", severity="error")
            return
        choices = picker_choices(self.model, profiles)
        cur = ", ".join(self.model.profiles) or "none"
        if self._job_ended():
            title = "[b]The job has ended[/b]: pick a profile to see the command that re-runs it with it"
        else:
            title = f"[b]Relaunch with a profile[/b] (launch #{self.model.generation}, current profiles: {escape(cur)})"
        self.push_screen(ProfilePicker(choices, title), self._relaunch_chosen)

    def _relaunch_names(self, choice: str) -> list[str]:
        if choice == DEFAULT_CHOICE:
            return []
        names = list(self.model.profiles)
        if choice not in names:
            names.append(choice)
        return names

    def _rerun_hint(self, names: list[str]) -> str:
        meta = self.session.meta
        cmd = list(meta.user_command if meta is not None and meta.user_command else ["torchrun", "..."])
        try:
            import shlex

            cmd_s = shlex.join(cmd)
        except TypeError:  # a damaged meta.json with arguments that are not strings
            cmd_s = " ".join(map(str, cmd))
        flags = "".join(f"--profile {n} " for n in names)
        return f"the job has ended: re-run `ddptop {flags}{cmd_s}`"

    def _relaunch_chosen(self, result: tuple[str, str] | None) -> None:
        if not result:
            return
        choice, reason = result
        names = self._relaunch_names(choice)
        if self._job_ended():
            self.notify(self._rerun_hint(names), title="cannot relaunch", severity="warning", timeout=15)
            return
        self._relaunching = ", ".join(names) or "no profile"
        self._refresh_header()
        self._do_relaunch(names, reason)

    def action_fix(self) -> None:
        if self._stopping:
            return
        c = self.session.control()
        if not c.fix:
            if c.fix_refused:
                self.notify(c.fix_refused, title="cannot search for a fix from here", severity="warning", timeout=10)
            else:
                self.notify("this run has no command to run again", severity="warning", timeout=6)
            return
        running = not self._job_ended()
        self.push_screen(FixScreen(running), lambda go: self._fix_chosen(go, running))

    def _fix_chosen(self, go: bool, running: bool) -> None:
        if not go:
            return
        if not running:
            self._quit("fix")
            return
        self._stopping = True
        self._refresh_header()
        self._stop_job("fix")

    def action_stacks_pane(self) -> None:

        self.push_screen(StacksScreen(self.model.stacks))

    def action_doctor(self) -> None:

        self.push_screen(DoctorScreen())

    def action_bench(self) -> None:

        self.push_screen(BenchScreen())

    def action_stacks(self) -> None:
        if self._job_ended():
            self.notify("the job has ended: no stacks to capture", timeout=4)
            return
        self._do_stacks()

    @work(thread=True, exclusive=True, group="stacks", exit_on_error=False)
    def _do_stacks(self) -> None:
        try:
            r = self.session.dump_stacks()
            ok, msg = r.ok, r.message
        except Exception as e:  # noqa: BLE001 - the stacks worker thread's boundary: said in a notification
            ok, msg = False, f"stack capture failed: {type(e).__name__}: {e}"
        self.call_from_thread(self._stacks_done, ok, msg)

    def _stacks_done(self, ok: bool, message: str) -> None:
        if ok:
            self.notify("capturing every rank's Python stack (py-spy); the result shows in the merged log", timeout=5)
        else:
            self.notify(f"no stack capture: {message}", severity="warning", timeout=8)

    @work(thread=True, exclusive=True, group="relaunch", exit_on_error=False)
    def _do_relaunch(self, names: list[str], reason: str) -> None:
        try:
            r = self.session.relaunch(names, reason)
            ok, err, why = r.ok, None, r.message
        except Exception as e:  # noqa: BLE001 - the relaunch worker thread's boundary: said in the log
            ok, err, why = False, f"{type(e).__name__}: {e}", ""
        self.call_from_thread(self._relaunch_done, names, ok, err, why)

    def _relaunch_done(self, names: list[str], ok: bool, err: str | None, why: str = "") -> None:
        what = ", ".join(names) or "no profile"
        if ok:
            self.notify(f"relaunching with profiles: {what} (stopping every rank first)", timeout=4)
            self._add_line(Line(-1, "note", f"relaunch requested with profiles: {what}", "bold"))
            self._schedule_flush()
        else:
            self._relaunching = None
            if err:
                self.notify(f"relaunch failed: {err}", severity="error", timeout=10)
            elif self._job_ended() or not self.session.is_live:
                self.notify(self._rerun_hint(names), title="cannot relaunch", severity="warning", timeout=15)
            else:
                self.notify(f"relaunch failed: {why}", severity="error", timeout=10)
        self._refresh_header()

    def action_top(self) -> None:
        log = self.logs.active_log()
        if log is not None:
            log.scroll_home(animate=False)

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.logs.render_active()

    @on(DataTable.RowSelected, "#ranks")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        self.show_pane(f"r{event.row_key.value}")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_open_filter(self) -> None:
        inp = self.query_one("#filter", FilterInput)
        inp.add_class("-on")
        inp.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.set_filter(event.value)

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        if not event.value:
            self.action_clear_filter()
            return
        log = self.logs.active_log()
        if log is not None:
            log.focus()

    def set_filter(self, text: str) -> None:
        if self.logs.set_filter(text):
            self._refresh_header()

    def action_clear_filter(self) -> None:
        inp = self.query_one("#filter", FilterInput)
        inp.value = ""
        inp.remove_class("-on")
        self.set_filter("")
        log = self.logs.active_log()
        if log is not None:
            log.focus()

    def action_request_quit(self) -> None:
        if self._stopping:
            return
        if isinstance(self.screen, QuitScreen):
            return
        if self.model.finished or self.session.finished:
            self._quit("finished")
            return
        self.push_screen(QuitScreen(), self._quit_chosen)

    def _quit_chosen(self, choice: str | None) -> None:
        if choice == "detach":
            self._quit("detach")
        elif choice == "stop":
            self._stopping = True
            self._refresh_header()
            self._stop_job()

    @work(thread=True, exclusive=True, group="stop", exit_on_error=False)
    def _stop_job(self, result: str = "stop") -> None:
        refused = None
        try:
            r = self.session.stop()
            if not r.ok and (r.refused or self.session.is_live):
                refused = r.message  # a job ddptop did not start, a node out of reach: keep watching
        finally:
            if refused:
                self.call_from_thread(self._stop_refused, refused)
            else:
                self.call_from_thread(self._quit, result)

    def _stop_refused(self, why: str) -> None:
        """The session will not stop this job: say why and keep watching."""
        self._stopping = False
        self.notify(why, title="cannot stop", severity="warning", timeout=15)
        self._add_line(Line(-1, "note", f"stop refused: {why}", "bold"))
        self._schedule_flush()
        self._refresh_header()

    def _quit(self, result: str) -> None:
        self.workers.cancel_group(self, "poll")
        self.exit(result)


def make_app(session: JobSession, *, theme: str | None = None, poll_interval: float = 0.1) -> DdptopApp:
    """The one factory for the CLI and the tests."""
    return DdptopApp(session, theme=theme, poll_interval=poll_interval)
