"""The Textual UI: a live view of one job (any ``JobSession``).

``make_app(session)`` builds it; after ``app.run()`` the return value is
``"detach"`` (the job keeps running), ``"stop"`` (``session.stop()`` was
called; the caller waits for the end) or ``"finished"`` (the job had ended).

This module is the app itself: the keys, the screen's state and its refresh,
and the first frame's hand-over to the full screen.  The parts have their own modules:

* ``first_frame.py``, ``screen_body.py``: the first frame, and the full screen's widgets;
* ``event_feed.py``: the poll thread and the intake of events;
* ``commands.py``: what each key does (actions, dialogs, workers);
* ``header.py``: the header line and the launch/env panel;
* ``alarm_box.py``: the alarms above the rank table;
* ``rank_table.py``: the rank table;
* ``gpu_pane.py``: the GPU pane;
* ``log_panes.py`` and ``logview.py``: the log tabs and their buffers;
* ``dialogs.py``: quit, fix, help and the relaunch profile picker;
* ``stacks_screen.py``, ``tool_screens.py``: the stacks pane, doctor and bench;
* ``ddptop.core.analysis.event_text``: what an event says, shared with headless mode.

Data flow: ``event_feed`` polls the session in a thread and hands events over
in batches; the app folds them into its ``JobState`` and redraws the parts of
the screen from it.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, ClassVar, cast

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult, ScreenStackError
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import MountError
from textual.timer import Timer
from textual.widgets import Input

from ddptop.core.analysis.job_state import JobState
from ddptop.core.model import run_dirs
from ddptop.core.model.session_protocol import JobSession, LocalRun, Nodes, RemoteRun
from ddptop.ui.alarm_box import AlarmBox, is_recent
from ddptop.ui.commands import Commands
from ddptop.ui.event_feed import INGEST_SLICE, TABLE_EVERY, EventFeed, PollFailed
from ddptop.ui.first_frame import FirstFrame
from ddptop.ui.header import HeaderBar, HeaderState
from ddptop.ui.log_panes import LogPanes
from ddptop.ui.logview import Line
from ddptop.ui.theme_files import DEFAULT_THEME, FALLBACK_THEME, load_themes

if TYPE_CHECKING:
    from textual.widgets import DataTable, TabbedContent

    from ddptop.ui.gpu_pane import GpuPane
    from ddptop.ui.rank_table import RankTable


FIRST_FRAME_MOST = 2.0  # seconds the first frame stays at most once the full screen is built under it


class DdptopApp(EventFeed, Commands, App[str]):
    TITLE = "ddptop"
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]  # applied to the screen as the terminal resizes
    DEFAULT_CSS = """
    Screen { layout: vertical; layers: default first-frame; }
    #body { height: 1fr; }
    #header, #ff-header {
        height: 1; width: 100%; padding: 0 1;
        background: $panel; color: $foreground;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    #header.-links, #ff-header.-links { height: 2; }
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
    #picker { dock: bottom; display: none; height: 3; border: tall $accent; }
    #picker.-on { display: block; }
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
        Binding("z", "toggle_folding", "Fold alike lines", show=False),
        Binding("o", "open_picker", "Open rank", show=False),
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
        Binding("L", "earlier", "Earlier lines", show=False),
        *(Binding(str(n), f"rank({n})", f"Rank {n}", show=False) for n in range(10)),
    ]

    MAIN_ACTIONS = {"request_quit", "help", "open_filter", "open_picker", "toggle_folding", "pane", "cycle", "rank", "follow", "top", "clear_filter", "toggle_wrap", "toggle_gpus",
                    "relaunch", "toggle_env", "stacks", "stacks_pane", "doctor", "bench", "fix", "earlier"}

    def __init__(self, session: JobSession, *, theme: str | None = None, poll_interval: float = 0.1,
                 first_frame: bool = False) -> None:
        super().__init__()
        self.session = session
        # first_frame: paint the job's first read before the full screen is built (first_frame.py)
        self._first_frame = first_frame
        self._built = not first_frame
        self._preapplied: set[int] = set()  # ids of inbox events the model has already taken (the first frame's)
        self._first_events: list = []  # the first frame's read, until the full screen takes it
        self._first_frame_until = 0.0
        self._main_screen: Screen | None = None  # the app's own screen (a dialog may be over it at the build)
        # a run that had ended when opened: its replay folds every line (a live job's flood is capped, and a
        # replay's final state comes only once every file is read, too late to tell it by)
        loc = session.location
        self._replay = not session.is_live or (isinstance(loc, LocalRun) and (loc.run_dir / run_dirs.EXIT).exists())
        self.poll_interval = poll_interval
        self.model = JobState()
        self._requested_theme = theme
        self._inbox: list = []
        self._inbox_lines = 0  # lines (and other events) in the inbox
        self._inbox_lock = threading.Lock()
        self._posted = False
        self._slice = INGEST_SLICE  # lines taken from the inbox at a time: what INGEST_BUDGET allows (event_feed)
        self.logs = LogPanes(self)
        self._stopping = False
        self._flush_timer: Timer | None = None
        self._last_flush = 0.0
        self._last_table = 0.0
        self._table_every = TABLE_EVERY  # seconds between table refreshes (longer where one takes long)
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
        if self._first_frame:
            yield FirstFrame()  # (the full screen is built under it once it is painted: _build)
        else:
            yield self._body()

    @staticmethod
    def _body():
        """The full screen (screen_body.py: its widgets load only now)."""
        from ddptop.ui.screen_body import ScreenBody

        return ScreenBody(id="body")

    def on_mount(self) -> None:
        if self._theme_warning:
            self.notify(self._theme_warning, severity="warning")
        self._update_palette()
        self.set_interval(1.0, self._tick)
        self._main_screen = self.screen
        if self._first_frame:
            self._show_first_frame()
            return
        self._refresh_header()
        self.call_after_refresh(self.logs.after_first_frame)  # (a screenful of lines is in the first frame)
        self._poll_loop()

    # -- the first frame (first_frame.py) ---------------------------------------

    def _show_first_frame(self) -> None:
        """Read the job once (a run on this machine: files, a read that never waits on the job), paint what it
        says, and build the full screen after that paint.  The events read go to the inbox, already applied to
        the model (``ingest`` does not apply them again)."""
        events: list = []
        if isinstance(self.session.location, LocalRun):
            try:
                events = self.session.poll()
            except Exception as e:  # noqa: BLE001 - said in the log as the poll thread says it; the screen comes
                self.post_message(PollFailed(f"{type(e).__name__}: {e}"))
            self._preapplied = {id(ev) for ev in events}  # (before: a failure part-way is not applied twice)
            try:
                self.model.apply(events)
            except Exception as e:  # noqa: BLE001 - as ingest does: said in the log, the monitor goes on
                self._add_line(Line(-1, "note", f"could not apply events: {e}", "bold"))
        self._first_events = events  # (to the inbox once the panes are there: _build)
        try:
            self.query_one(FirstFrame).show(self.model, self._header_state(), events, theme=self.current_theme,
                                            palette=self.logs.palette, keys=self._keys_text())
        except Exception as e:  # noqa: BLE001 - the full screen comes next either way; said once in its log
            self._ui_error("the first frame", e)
        self.call_after_refresh(self._build)

    def _keys_text(self) -> Text:
        """The footer's keys, as a line."""
        accent = self.current_theme.accent or ""
        out = Text(no_wrap=True, overflow="crop", end="")
        shown = [b for b in self.BINDINGS if isinstance(b, Binding) and b.show]
        for b in sorted(shown, key=lambda b: not b.priority):  # (the footer lists the priority keys first)
            out.append(f" {self.get_key_display(b)} ", style=f"bold {accent}")
            out.append(f"{b.description} ")
        return out

    async def _build(self) -> None:
        """The full screen, under the first frame; the first frame goes once the merged log shows its lines."""
        if self._exit:
            return  # (quit while the first read was taken: nothing to build)
        screen = self._main_screen
        if screen is None:
            return
        try:
            await screen.mount(self._body(), before=screen.query_one(FirstFrame))
        except (MountError, NoMatches, ScreenStackError):
            return  # (the app is closing under it)
        self._built = True
        if self.screen is screen and self.focused is None:
            # (the screen gave its first focus when it held only the first frame: the table takes it, as it
            # does when the screen is built at once; the footer's keys come with the focus)
            screen.query_one("#ranks").focus()
        self.refresh_bindings()
        self._refresh_header()
        self._refresh_table()
        if self._first_events:
            self._queue(self._first_events)
        self._first_events = []
        self._poll_loop()
        self._first_frame_until = time.monotonic() + FIRST_FRAME_MOST
        self.call_after_refresh(self._drop_first_frame)

    def _drop_first_frame(self) -> None:
        """The first frame goes once the merged log under it shows its lines (the screenful a first render
        writes); the pane is rendered whole after that (``after_first_frame``)."""
        log = self.logs.active_log()
        with self._inbox_lock:
            waiting = bool(self._inbox)
        shown = log is not None and (bool(log.lines) or (not waiting and not self.logs.buffers["merged"].lines))
        if shown or time.monotonic() > self._first_frame_until:
            for ff in self._main_screen.query(FirstFrame) if self._main_screen is not None else ():
                ff.remove()
            self.call_after_refresh(self.logs.after_first_frame)
        else:
            self.set_timer(0.01, self._drop_first_frame)

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

    # -- header and table -----------------------------------------------------

    def _tick(self) -> None:
        # folds of alike lines whose time is up: into the merged pane (not while a replay is still read: its
        # ranks' lines come a slice at a time, and a loaded machine can take longer than a fold's hold between
        # slices; its final state comes once every file is read)
        if not (self._replay and self._replay_unread()) and self.logs.tick():
            self._schedule_flush()
        self._refresh_header()
        if time.monotonic() - self._last_table >= self._table_every:
            self._refresh_table()

    def _replay_unread(self) -> bool:
        """A replay's lines are not all in the panes yet: its end not read, or events of it still in the inbox
        (the first frame's read applies a small run's end to the model before its lines reach the panes)."""
        if not self.model.finished or self._first_events:
            return True
        with self._inbox_lock:
            return bool(self._inbox) or self._posted

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
        except (NoMatches, ScreenStackError):  # (not mounted yet, no screen yet, or gone while quitting)
            return
        except Exception as e:  # noqa: BLE001 - a UI callback must not take the monitor down: said once
            self._ui_error("the alarm box", e)

    def _refresh_gpus(self) -> None:
        try:
            cast("GpuPane", self.query_one("#gpu-pane")).show(self.model, self.current_theme)
        except Exception as e:  # noqa: BLE001 - a UI callback must not take the monitor down: said once
            if not self._gpu_error_shown:
                self._gpu_error_shown = True
                self._add_line(Line(-1, "note", f"could not show GPUs: {e}", "dim"))

    def _header_state(self) -> HeaderState:
        meta = self.session.meta
        return HeaderState(self._run_label(), started=meta.started if meta is not None else None,
                           relaunching=self._relaunching, stopping=self._stopping, filter=self.logs.filter)

    def _refresh_header(self) -> None:
        try:
            ui = self._header_state()
            self.query_one("#header", HeaderBar).show(self.model, ui, time.time())
        except (NoMatches, ScreenStackError):  # (not mounted yet, no screen yet, or gone while quitting)
            return
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
            table = cast("RankTable", self.query_one("#ranks"))
        except (NoMatches, ScreenStackError):  # (not mounted yet, no screen yet, or gone while quitting)
            return
        t0 = self._last_table = time.monotonic()
        self._table_rows = len(self.model.ranks)
        table.show(self.model, self.current_theme, self._ui_error)
        self._refresh_gpus()
        # at 1,024 ranks the table and the GPU grid take tens of ms: refreshed less often, never more than a
        # tenth of the screen's time
        self._table_every = max(TABLE_EVERY, 10 * (time.monotonic() - t0))

    # (handled by name: the tabs and the tables load with the full screen, after the first frame)
    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.logs.render_active()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "ranks":
            self.show_pane(f"r{event.row_key.value}")

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.set_filter(event.value)

    @on(Input.Submitted, "#picker")
    def _picker_submitted(self, event: Input.Submitted) -> None:
        self.pick_submitted(event.value)

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        if not event.value:
            self.action_clear_filter()
            return
        log = self.logs.active_log()
        if log is not None:
            log.focus()

def make_app(session: JobSession, *, theme: str | None = None, poll_interval: float = 0.1,
             first_frame: bool = False) -> DdptopApp:
    """The one factory for the CLI and the tests (``first_frame``: the CLI's, see first_frame.py)."""
    return DdptopApp(session, theme=theme, poll_interval=poll_interval, first_frame=first_frame)
