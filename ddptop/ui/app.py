"""The Textual UI: a live view of one job (any ``JobSession``).

``make_app(session)`` builds it; after ``app.run()`` the return value is
``"detach"`` (the job keeps running), ``"stop"`` (``session.stop()`` was
called; the caller waits for the end) or ``"finished"`` (the job had ended).

Data flow: a thread worker calls ``session.poll()`` and hands events over in a
list; at most one ``EventsReady`` message is in flight at a time, and the UI
takes the whole accumulated batch per message.  Each log pane writes a bounded
number of lines per batch, in one call.
"""

from __future__ import annotations

import threading
import time
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.markup import escape
from textual.message import Message
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets.option_list import Option
from textual.widgets import (
    Button,
    DataTable,
    Footer,
    Input,
    Label,
    OptionList,
    RichLog,
    Static,
    TabbedContent,
    TabPane,
)

from ddptop.core.events import (FINAL_STATES, AlarmEvent, LaunchEvent, LinkEvent, LogEvent, NoteEvent, RankEvent,
                                StateEvent)
from ddptop.core.jobs import JobSession, Nodes, RemoteRun
from ddptop.core.job_state import JobState
from ddptop.ui import logview
from ddptop.ui.logview import Line, PaneBuffer
from ddptop.ui.telemetry_view import AlarmBox, GpuPane, is_recent, rank_cells
from ddptop.ui.themes import DEFAULT_THEME, FALLBACK_THEME, load_themes

FLUSH_EVERY = 0.2  # seconds between writes to the widgets while output floods in
TABLE_EVERY = 0.5  # seconds between rank-table updates
BACKLOG_EVENTS = 200_000  # the poller waits while this many events wait for the UI

STATE_VAR = {
    "starting": "$accent",
    "running": "$primary",
    "stopping": "$warning",
    "succeeded": "$success",
    "failed": "$error",
    "stopped": "$warning",
    "lost": "$error",
    "ended": "$warning",  # a job ddptop did not start: exit code unknown
}

HELP_TEXT = """\
[b]ddptop keys[/b]

  [b]m[/b]              merged log (every rank, prefixed \\[r0] \\[r1] …)
  [b]0[/b]-[b]9[/b]            log of rank N
  [b]t[/b]              torchrun's own output
  [b]tab[/b] / [b]shift+tab[/b]  next / previous log pane
  [b]enter[/b] on a rank  open that rank's log
  [b]/[/b]              filter log lines (case-insensitive); [b]esc[/b] clears
  [b]end[/b] / [b]home[/b]     follow the log / go to its top
  [b]w[/b]              wrap long lines on/off
  [b]g[/b]              show / hide the GPU pane
  [b]r[/b]              relaunch with a profile (alarm suggestions first);
                 the current profiles are kept, the chosen one is added
  [b]e[/b]              show / hide the launch's profiles and env diff
  [b]p[/b]              capture every rank's Python stack now (py-spy);
                 also done by itself at a stall
  [b]s[/b]              the stacks pane: the last samples grouped by stack,
                 the culprit first, where the groups part marked
  [b]D[/b]              ddptop doctor: this machine's preflight checks
  [b]B[/b]              GPU P2P / all-reduce benchmark (starts on enter)
  [b]F[/b]              stop the job and run ddptop fix (a profile search)
  [b]ctrl+p[/b]         command palette (themes: "Change theme")
  [b]?[/b]              this help
  [b]q[/b] / [b]ctrl+c[/b]     quit: detach (job keeps running) or stop the job

Rank table: GPU ("?" = mapping guessed), CPU % of one core, RSS,
  process status, threads, workers (child processes and their CPU %).
GPU pane: utilisation and its history, memory, power and its history,
  temperature, ranks on it ("r0?" = guessed), memory-bandwidth use,
  SM clock, PCIe link, throttle reasons, ECC errors / retired pages.
Alarms (stalls, crashes, error signatures, GPU faults) show in a box
  above the rank table and ring the terminal bell once each.
A relaunch (r) stops every rank, then starts the job again; the header
  shows "launch #N" and the profiles, the logs a "relaunch #N" line.

The journal keeps every line; the panes keep the last 20,000 lines each.
"""


def _fmt_duration(s: float) -> str:
    s = max(0, int(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def _fmt_age(s: float) -> str:
    if s < 10:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s)}s"
    return _fmt_duration(s)


LINK_LIST_MAX = 4  # attached nodes listed one by one in the header; more are counted


def _link_one(node: str, ev: LinkEvent, now: float) -> str:
    n = escape(node)
    if ev.state == "up":
        return f"{n} [$success]● up[/]"
    if ev.state == "down":
        retry = ""
        if ev.retry_in is not None:
            left = ev.t + ev.retry_in - now
            retry = f", retry in {max(1, int(left + 0.999))}s" if left > 0 else ", retrying…"
        return f"{n} [b $warning]○ down{retry}[/]"
    if ev.state == "failed":
        return f"{n} [b $error]✗ failed[/]"
    if ev.state == "closed":
        return f"{n} [dim]■ closed[/]"
    return f"{n} [$accent]◌ {escape(ev.state)}[/]"


def link_markup(links: dict[str, LinkEvent], now: float) -> str:
    """The header's line about the attached nodes' links ("" for a local job)."""
    if not links:
        return ""
    if len(links) <= LINK_LIST_MAX:
        return "attached  " + "   ".join(_link_one(n, ev, now) for n, ev in links.items())
    counts: dict[str, int] = {}
    for ev in links.values():
        counts[ev.state] = counts.get(ev.state, 0) + 1
    parts = [f"attached  {len(links)} nodes: " + ", ".join(f"{c} {escape(st)}" for st, c in counts.items())]
    odd = [(n, ev) for n, ev in links.items() if ev.state not in ("up", "closed")]
    parts += [_link_one(n, ev, now) for n, ev in odd[:LINK_LIST_MAX]]
    if len(odd) > LINK_LIST_MAX:
        parts.append(f"[dim]+{len(odd) - LINK_LIST_MAX} more[/]")
    return "   ".join(parts)


class EventsReady(Message):
    """Events are waiting in the app's inbox (one message per batch)."""


class PollFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


# -- modals ------------------------------------------------------------------


class QuitScreen(ModalScreen[str | None]):
    DEFAULT_CSS = """
    QuitScreen { align: center middle; }
    QuitScreen > Vertical {
        width: 52; height: auto; padding: 1 2;
        background: $panel; border: thick $primary;
    }
    QuitScreen Label { width: 100%; content-align: center middle; margin-bottom: 1; }
    QuitScreen Button { width: 100%; margin-bottom: 1; }
    """
    BINDINGS = [
        Binding("d", "choose('detach')", "Detach", show=False),
        Binding("s", "choose('stop')", "Stop", show=False),
        Binding("escape,c,n", "choose(None)", "Cancel", show=False),
    ]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Quit ddptop — the job is still running.")
            yield Button("Detach (job keeps running)  \\[d]", id="detach", variant="primary")
            yield Button("Stop the job  \\[s]", id="stop", variant="error")
            yield Button("Cancel  \\[esc]", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#detach", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None if event.button.id == "cancel" else event.button.id)

    def action_choose(self, what: str | None) -> None:
        self.dismiss(what)


class FixScreen(ModalScreen[bool]):
    """Confirm: stop the job and let `ddptop fix` search for a profile that works."""

    DEFAULT_CSS = """
    FixScreen { align: center middle; }
    FixScreen > Vertical { width: 64; height: auto; padding: 1 2; background: $panel; border: thick $primary; }
    """
    BINDINGS = [Binding("y,enter", "dismiss(True)", "Yes", show=False),
                Binding("n,escape", "dismiss(False)", "No", show=False)]

    def __init__(self, running: bool) -> None:
        super().__init__()
        self.running = running

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(("Stop this job, then " if self.running else "")
                         + "run [b]ddptop fix[/b]: short smoke runs of the same command under the candidate "
                           "profiles (the diagnosis's first) and fewer ranks, until one makes progress; it prints "
                           "the table and the command to use from now on.")
            yield Label("[b]y[/b] / enter: go · [b]n[/b] / esc: cancel")


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: 76; height: auto; max-height: 90%; padding: 1 2;
        background: $panel; border: thick $primary;
    }
    """
    BINDINGS = [Binding("escape,q,question_mark,enter", "dismiss(None)", "Close", show=False)]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(HELP_TEXT)
            yield Label("[dim]esc / ? / q closes[/dim]")


DEFAULT_CHOICE = "\x00default"  # option id of "default (no profile)"


def picker_choices(model: JobState, profiles: dict) -> list[tuple[str, str, str]]:
    """(option id, label, reason) for the profile picker: the profiles the alarms
    suggest (latest alarm first, each once), then every other profile, then
    "default (no profile)"."""
    out: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    active = set(model.profiles)
    for a in reversed(model.alarms):
        for name in a.suggested_profiles:
            if name in seen:
                continue
            seen.add(name)
            who = f" (culprit {','.join(f'r{r}' for r in a.culprits)})" if a.culprits else ""
            why = f"suggested by {a.id or a.type}{who}"
            mark = " [active]" if name in active else ""
            out.append((name, f"{name} — {why}{mark}", why))
    for name, p in profiles.items():
        if name in seen or name == "default":
            continue
        seen.add(name)
        mark = " [active]" if name in active else ""
        out.append((name, f"{name} — {p.description}{mark}", "picked in ddptop"))
    out.append((DEFAULT_CHOICE, "default (no profile) — relaunch exactly as first given", "picked in ddptop: no profile"))
    return out


class ProfilePicker(ModalScreen[tuple[str, str] | None]):
    """Pick one profile; dismisses with (option id, reason) or None."""

    DEFAULT_CSS = """
    ProfilePicker { align: center middle; }
    ProfilePicker > Vertical {
        width: 90%; max-width: 120; height: auto; max-height: 90%; padding: 1 2;
        background: $panel; border: thick $primary;
    }
    ProfilePicker Label { width: 100%; margin-bottom: 1; }
    ProfilePicker OptionList { height: auto; max-height: 24; }
    """
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", show=False)]

    def __init__(self, choices: list[tuple[str, str, str]], title: str) -> None:
        super().__init__()
        self.choices = choices
        self.title_text = title
        self._reasons = {cid: reason for cid, _label, reason in choices}

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text)
            options: list = []
            for cid, label, _reason in self.choices:
                if cid == DEFAULT_CHOICE and options:
                    options.append(None)
                options.append(Option(Text(label), id=cid))
            yield OptionList(*options, id="profile-options")
            yield Label("[dim]enter relaunches with the current profiles + this one · esc cancels[/dim]")

    def on_mount(self) -> None:
        ol = self.query_one(OptionList)
        ol.highlighted = 0
        ol.focus()

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        cid = event.option.id or ""
        self.dismiss((cid, self._reasons.get(cid, "picked in ddptop")))


def env_markup(model: JobState) -> str:
    """The env-diff panel: the launch, its profiles, env vs the first launch."""
    profs = ", ".join(model.profiles) or "none"
    lines = [f"[b]launch #{model.generation}[/b]   profiles: [b]{escape(profs)}[/b]"]
    if not model.env_diff:
        lines.append("[dim]environment: the same as the first launch[/dim]")
    else:
        lines.append("environment vs the first launch:")
        for k, v in sorted(model.env_diff.items()):
            if v is None:
                lines.append(f"  [b]{escape(k)}[/b] [$warning]unset[/]")
            else:
                lines.append(f"  [b]{escape(k)}[/b]={escape(str(v))}")
    lines.append("[dim]e hides this · r relaunches with a profile[/dim]")
    return "\n".join(lines)


class HeaderBar(Widget):
    """One line of status; repaints without asking for a new layout."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._content: Content = Content("")

    def set_markup(self, markup: str) -> None:
        content = Content.from_markup(markup)
        if content != self._content:
            self._content = content
            self.refresh()

    def render(self) -> Content:
        return self._content


class FilterInput(Input):
    BINDINGS = [Binding("escape", "app.clear_filter", "Clear filter", show=False)]


# -- the app -----------------------------------------------------------------


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
        self._inbox_lock = threading.Lock()
        self._posted = False
        self._panes: dict[str, PaneBuffer] = {"merged": PaneBuffer("merged", merged=True)}
        self._views: dict[str, tuple[RichLog, Static]] = {}
        self._filter = ""
        self._wrap = True
        self._stopping = False
        self._flush_timer: Timer | None = None
        self._last_flush = 0.0
        self._last_table = 0.0
        self._table_rows = 0
        self._cells: dict[tuple[str, str], str] = {}
        self._col_width: dict[str, int] = {}
        self._palette: list[str] = []
        self._poll_error: str | None = None
        self._alarm_list: list | None = None
        self._alarms_seen = 0
        self._gpus_hidden = False
        self._generation = 0  # the launch whose separator the panes have shown
        self._relaunching: str | None = None  # profiles asked for, until the new launch shows
        self._multi_node = False  # the job spans several nodes: torchrun lines name theirs
        self._link_logged: dict[str, str] = {}  # node -> link state last written to the log
        self._gpu_error_shown = False
        loc = session.location
        self._remote = isinstance(loc, (RemoteRun, Nodes))  # named by its target until the node says the run
        meta = session.meta
        self.run_id = meta.run_id if meta is not None else str(loc)
        self.attach_hint = loc.attach_hint if self._remote else ""
        self._remote_run_id = ""
        self.sub_title = self.attach_hint or self.run_id

    # -- layout ---------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        yield Static("", id="envpanel")
        alarms = AlarmBox(id="alarms")
        alarms.can_relaunch = not self.session.control().refused  # a job ddptop did not start: no r
        yield alarms
        table: DataTable = DataTable(id="ranks", cursor_type="row", zebra_stripes=True)
        yield table
        yield GpuPane(id="gpu-pane")
        with TabbedContent(id="panes", initial="pane-merged"):
            with TabPane("merged", id="pane-merged"):
                yield from self._make_view("merged")
        yield FilterInput(placeholder="filter: lines containing… (esc clears, enter keeps)", id="filter")
        yield Footer()

    def _make_view(self, key: str):
        log = RichLog(max_lines=logview.LOG_MAX_LINES, wrap=self._wrap, markup=False, highlight=False, id=f"log-{key}")
        live = Static("", classes="live", id=f"live-{key}")
        self._views[key] = (log, live)
        box = Vertical(log, live, classes="logview")
        return [box]

    def on_mount(self) -> None:
        self._setup_themes()
        table = self.query_one("#ranks", DataTable)
        for key, label in (
            ("rank", "rank"), ("local", "local"), ("node", "node"), ("pid", "pid"), ("state", "state"),
            ("attempt", "attempt"), ("since", "last output"), ("step", "step"),
            ("gpu", "GPU"), ("cpu", "CPU"), ("rss", "RSS"), ("status", "status"), ("threads", "thr"),
            ("workers", "workers"), ("lines", "lines"),
        ):
            table.add_column(label, key=key)
        self._refresh_header()
        self.set_interval(1.0, self._tick)
        self._poll_loop()

    def _setup_themes(self) -> None:
        try:
            for th in load_themes():
                self.register_theme(th)
        except Exception:
            pass
        wanted = self._requested_theme or DEFAULT_THEME
        if wanted in self.available_themes:
            self.theme = wanted
        elif self._requested_theme:
            self.theme = FALLBACK_THEME
            self.notify(f"unknown theme {self._requested_theme!r}; using {FALLBACK_THEME}", severity="warning")
        else:
            self.theme = FALLBACK_THEME if DEFAULT_THEME not in self.available_themes else DEFAULT_THEME
        self._update_palette()

    def watch_theme(self, theme: str) -> None:
        self._update_palette()
        for pane in self._panes.values():
            pane.dirty = True
        try:
            self._render_active()
            self._refresh_table()
        except Exception:
            pass

    def _update_palette(self) -> None:
        try:
            th = self.current_theme
            self._palette = [c for c in (th.primary, th.accent, th.success, th.secondary, th.warning) if c]
        except Exception:
            self._palette = []

    # -- polling (thread) -----------------------------------------------------

    @work(thread=True, exclusive=True, group="poll", exit_on_error=False)
    def _poll_loop(self) -> None:
        from textual.worker import get_current_worker

        worker = get_current_worker()
        session = self.session
        while not worker.is_cancelled:
            try:
                events = session.poll()
            except Exception as e:  # keep the UI alive; say what happened
                self.post_message(PollFailed(f"{type(e).__name__}: {e}"))
                time.sleep(max(self.poll_interval, 1.0))
                continue
            if events:
                with self._inbox_lock:
                    self._inbox.extend(events)
                    backlog = len(self._inbox)
                    post = not self._posted
                    self._posted = True
                if post:
                    self.post_message(EventsReady())
                if backlog > BACKLOG_EVENTS:
                    time.sleep(self.poll_interval)
            if session.finished:
                break
            if not events:
                time.sleep(self.poll_interval)

    def on_poll_failed(self, msg: PollFailed) -> None:
        if msg.error != self._poll_error:
            self._poll_error = msg.error
            self._add_line(Line(-1, "note", f"reading the journal failed: {msg.error}", "bold"))
            self._flush_views()

    def on_events_ready(self, _msg: EventsReady) -> None:
        with self._inbox_lock:
            events, self._inbox = self._inbox, []
            self._posted = False
        if events:
            self.ingest(events)

    # -- events -> model, buffers, widgets ------------------------------------

    def ingest(self, events: list) -> None:
        """Apply one batch of events (also usable directly from tests)."""
        try:
            self.model.apply(events)
        except Exception as e:
            self._add_line(Line(-1, "note", f"could not apply events: {e}", "bold"))
        new_ranks = False
        for ev in events:
            try:
                if isinstance(ev, LogEvent):
                    if ev.rank is not None and self._ensure_rank(ev.rank):
                        new_ranks = True
                    if ev.transient:
                        self._set_live(ev.rank, ev.stream, ev.text)
                    else:
                        self._add_line(Line(ev.rank, ev.stream, ev.text, node=ev.node))
                elif isinstance(ev, RankEvent):
                    if self._ensure_rank(ev.rank):
                        new_ranks = True
                elif isinstance(ev, StateEvent):
                    msg = f"job {ev.state}"
                    if ev.exit_code is not None:
                        msg += f" (exit code {ev.exit_code})"
                    if ev.message:
                        msg += f": {ev.message}"
                    self._add_line(Line(-1, "note", msg, "bold"))
                    if ev.state in FINAL_STATES:
                        self._relaunching = None
                elif isinstance(ev, LaunchEvent):
                    self._on_launch(ev)
                elif isinstance(ev, AlarmEvent):
                    who = f" culprit: {','.join(f'r{r}' for r in ev.culprits)}" if ev.culprits else ""
                    where = f" ({ev.node})" if ev.node and self.model.links else ""
                    self._add_line(Line(-1, "note", f"ALARM {ev.type} {ev.id}{where}{who}: {ev.message}", "bold"))
                elif isinstance(ev, LinkEvent):
                    self._on_link(ev)
                elif isinstance(ev, NoteEvent):
                    style = "bold" if ev.level in ("warning", "error") else "dim"
                    self._add_line(Line(-1, "note", f"{ev.level}: {ev.message}", style))
            except Exception as e:  # one bad event must not take the monitor down
                self._add_line(Line(-1, "note", f"could not show an event: {e}", "dim"))
        if any(isinstance(ev, LogEvent) and ev.rank is None for ev in events):
            self._ensure_pane("torchrun")
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
        if ev.state == "up":
            text, style = f"{ev.node}: link up" + (f" ({ev.message})" if ev.message else ""), "dim"
        elif ev.state == "down":
            text, style = f"{ev.node}: link down" + (f" ({ev.message})" if ev.message else "") + ", reconnecting", "bold"
        else:
            text, style = f"{ev.node}: link failed: {ev.message}", "bold"
        self._add_line(Line(-1, "note", text, style, node=ev.node))

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
        if multi != self._multi_node:
            self._multi_node = multi
            for pane in self._panes.values():
                pane.dirty = True

    def _on_launch(self, ev: LaunchEvent) -> None:
        """A new launch: a separator line in every pane, so the new attempt stands out."""
        if ev.generation > self._generation:
            self._generation = ev.generation
            self._relaunching = None
            profs = ", ".join(ev.profiles) or "no profile"
            text = f"──── relaunch #{ev.generation} with profiles {profs} ────"
            if ev.reason:
                reason = ev.reason if len(ev.reason) <= 60 else ev.reason[:59] + "…"
                text += f"  ({reason})"
            sep = Line(-1, "sep", text, "bold")
            for key, pane in self._panes.items():
                if key == "merged" or key.startswith("r"):
                    pane.add(sep)
            self.notify(f"relaunch #{ev.generation} started with profiles: {profs}", timeout=4)
        self._refresh_env()
        self._refresh_header()

    def _pane_key(self, rank: int | None) -> str:
        return "torchrun" if rank is None else f"r{rank}"

    def _add_line(self, line: Line) -> None:
        self._panes["merged"].add(line)
        if line.rank is None or line.rank >= 0:
            pane = self._panes.get(self._pane_key(line.rank))
            if pane is None:
                pane = self._ensure_pane(self._pane_key(line.rank))
            pane.add(line)

    def _set_live(self, rank: int | None, stream: str, text: str) -> None:
        self._panes["merged"].set_live(rank, stream, text)
        key = self._pane_key(rank)
        pane = self._panes.get(key) or self._ensure_pane(key)
        pane.set_live(rank, stream, text)

    def _ensure_rank(self, rank: int) -> bool:
        if f"r{rank}" in self._panes:
            return False
        self._ensure_pane(f"r{rank}")
        return True

    def _pane_order(self) -> list[str]:
        ranks = sorted(int(k[1:]) for k in self._panes if k.startswith("r"))
        order = ["merged"] + [f"r{r}" for r in ranks]
        if "torchrun" in self._panes:
            order.append("torchrun")
        return order

    def _ensure_pane(self, key: str) -> PaneBuffer:
        pane = self._panes.get(key)
        if pane is not None:
            return pane
        pane = self._panes[key] = PaneBuffer(key)
        title = "torchrun" if key == "torchrun" else f"rank {key[1:]}"
        tp = TabPane(title, *self._make_view(key), id=f"pane-{key}")
        order = self._pane_order()
        tabs = self.query_one("#panes", TabbedContent)
        after = order[order.index(key) + 1:]
        before = next((f"pane-{k}" for k in after if k in self._views and k != key and self._mounted_pane(k)), None)
        if before is not None:
            tabs.add_pane(tp, before=before)
        else:
            tabs.add_pane(tp)
        return pane

    def _mounted_pane(self, key: str) -> bool:
        try:
            self.query_one(f"#pane-{key}", TabPane)
            return True
        except Exception:
            return False

    def _active_key(self) -> str:
        try:
            active = self.query_one("#panes", TabbedContent).active or "pane-merged"
        except Exception:
            return "merged"
        return active.removeprefix("pane-")

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
        self._flush_views()
        now = time.monotonic()
        if now - self._last_table >= TABLE_EVERY or len(self.model.ranks) != self._table_rows:
            self._refresh_table()
            self._refresh_header()

    def _flush_views(self) -> None:
        """Write what is new to the visible pane; hidden panes re-render on show."""
        active = self._active_key()
        for key, pane in self._panes.items():
            if key == active:
                self._render_pane(key)
            elif pane.pending:
                pane.pending = []
                pane.dirty = True

    def _render_active(self) -> None:
        self._render_pane(self._active_key())

    def _render_pane(self, key: str) -> None:
        pane = self._panes.get(key)
        view = self._views.get(key)
        if pane is None or view is None:
            return
        log, live = view
        try:
            full, lines, hidden = pane.take_render(self._filter)
            if full:
                log.clear()
            text = logview.render_lines(lines, pane.merged, self._palette, hidden, full, self._multi_node)
            if text is not None:
                log.write(text, scroll_end=None)
            if pane.live_changed or full:
                pane.live_changed = False
                self._render_live(pane, live)
        except Exception as e:
            try:
                log.write(Text(f"<could not render lines: {e}>", style="dim"))
            except Exception:
                pass

    def _render_live(self, pane: PaneBuffer, live: Static) -> None:
        needle = self._filter.lower()
        parts = []
        for (rank, _stream), raw in list(pane.live.items())[-4:]:
            if needle and needle not in logview.plain(raw).lower():
                continue
            parts.append(Line(rank, _stream, raw))
        text = logview.render_lines(parts, pane.merged, self._palette, 0, False, self._multi_node) if parts else None
        live.update(text if text is not None else "")
        live.set_class(text is not None, "-on")

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
        except Exception:
            pass

    def _refresh_gpus(self) -> None:
        try:
            self.query_one("#gpu-pane", GpuPane).show(self.model, self.current_theme)
        except Exception as e:
            if not self._gpu_error_shown:
                self._gpu_error_shown = True
                self._add_line(Line(-1, "note", f"could not show GPUs: {e}", "dim"))

    def _refresh_header(self) -> None:
        try:
            m = self.model
            now = time.time()
            meta = self.session.meta
            started = m.started or (meta.started if meta is not None else None)
            end = m.ended if m.ended is not None else now
            elapsed = _fmt_duration(end - started) if started else "--:--"
            var = STATE_VAR.get(m.state, "$foreground")
            parts = [
                f"[b]ddptop[/b] {escape(self._run_label())}",
                f"[b {var}]{escape(m.state.upper())}[/]",
                f"⏱ {elapsed}",
                f"ranks {len(self.model.ranks)}",
                f"restarts {m.attempt}",
            ]
            if m.generation > 0 or m.profiles:
                parts.append(f"[b $accent]launch #{m.generation}[/]")
                parts.append(f"profiles: [b]{escape(', '.join(m.profiles) or 'none')}[/b]")
            if self._relaunching is not None:
                parts.append(f"[$warning]relaunching ({escape(self._relaunching)})…[/]")
            if m.state in FINAL_STATES:
                code = "-" if m.exit_code is None else str(m.exit_code)
                cvar = "$success" if m.exit_code == 0 else "$error"
                parts.append(f"exit [b {cvar}]{code}[/]")
            elif self._stopping:
                parts.append("[$warning]stop requested…[/]")
            if m.alarms:
                n = len(m.alarms)
                parts.append(f"[b $error]⚠ {n} alarm{'s' if n != 1 else ''}[/]")
            if self._filter:
                parts.append(f"filter [b $accent]{escape(self._filter)}[/]")
            markup = "  │  ".join(parts)
            links = link_markup(m.links, now)
            header = self.query_one("#header", HeaderBar)
            header.set_class(bool(links), "-links")
            header.set_markup(markup + "\n" + links if links else markup)
        except Exception as e:  # the header keeps its last text; say why, once
            self._ui_error("the header", e)

    def _ui_error(self, where: str, e: Exception) -> None:
        """A part of the screen that could not be drawn: one note in the log per
        place and error (a viewer never writes the journal)."""
        key = (where, type(e).__name__, str(e)[:200])
        seen = self.__dict__.setdefault("_ui_errors", set())
        if key in seen:
            return
        seen.add(key)
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
            table = self.query_one("#ranks", DataTable)
        except Exception:
            return
        now = time.time()
        self._last_table = time.monotonic()
        self._table_rows = len(self.model.ranks)
        th = self.current_theme
        finished = self.model.finished
        added = False
        for r, info in sorted(self.model.ranks.items()):
            try:
                if info.alive is None:
                    state = Text("waiting", style="dim")
                elif info.alive and not finished:
                    state = Text("alive", style=th.success or "")
                else:
                    rc = info.exit_code
                    if rc is None:
                        state = Text("exited" if not info.alive else "gone", style="dim")
                    else:
                        state = Text(f"exited {rc}", style=(th.success if rc == 0 else th.error) or "")
                if info.last_output_t is None:
                    since = Text("-", style="dim")
                elif info.alive and not finished:
                    age = now - info.last_output_t
                    style = (th.warning or "") if age > 60 else ""
                    since = Text(_fmt_age(age), style=style)
                else:
                    since = Text("-", style="dim")
                row = {
                    "rank": r,
                    "local": "-" if info.local_rank is None else info.local_rank,
                    "node": info.node or "-",
                    "pid": "-" if info.pid is None else info.pid,
                    "state": state,
                    "attempt": info.attempt,
                    "since": since,
                    "step": ("-" if info.last_step is None else str(info.last_step))
                            + (f" ({info.phase})" if info.phase in ("eval", "save") else ""),
                    **rank_cells(info, finished, th),
                    "lines": info.lines,
                }
                key = str(r)
                if key not in table.rows:
                    table.add_row(*row.values(), key=key)
                    added = True
                    for col, val in row.items():
                        self._cells[(key, col)] = str(val)
                        self._col_width[col] = max(self._col_width.get(col, 0), len(str(val)))
                else:
                    for col, val in row.items():
                        sval = str(val)
                        if self._cells.get((key, col)) == sval:
                            continue
                        self._cells[(key, col)] = sval
                        wider = len(sval) > self._col_width.get(col, 0)
                        if wider:
                            self._col_width[col] = len(sval)
                        table.update_cell(key, col, val, update_width=wider)
            except Exception as e:  # this row keeps its last values; say why, once
                self._ui_error(f"rank {r}'s row", e)
                continue
        if added:
            try:
                table.sort("rank")
            except Exception:
                pass
        self._refresh_gpus()

    # -- actions --------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in self.MAIN_ACTIONS and len(self.screen_stack) > 1:
            return False
        if action == "rank" and parameters and f"r{parameters[0]}" not in self._panes:
            return None if len(self.screen_stack) <= 1 else False
        return True

    def show_pane(self, key: str) -> bool:
        if key not in self._panes or not self._mounted_pane(key):
            return False
        tabs = self.query_one("#panes", TabbedContent)
        tabs.active = f"pane-{key}"
        self._render_pane(key)
        log = self._views[key][0]
        if not isinstance(self.focused, Input):
            log.focus()
        return True

    def action_pane(self, key: str) -> None:
        if not self.show_pane(key):
            self.notify(f"no {key} output yet", timeout=2)

    def action_rank(self, n: int) -> None:
        if not self.show_pane(f"r{n}"):
            self.notify(f"no rank {n} yet", timeout=2)

    def action_cycle(self, step: int) -> None:
        order = [k for k in self._pane_order() if self._mounted_pane(k)]
        if not order:
            return
        cur = self._active_key()
        i = order.index(cur) if cur in order else 0
        self.show_pane(order[(i + step) % len(order)])

    def action_follow(self) -> None:
        log = self._views.get(self._active_key(), (None, None))[0]
        if log is not None:
            log.auto_scroll = True
            log.scroll_end(animate=False)

    def action_toggle_wrap(self) -> None:
        self._wrap = not self._wrap
        for log, _live in self._views.values():
            log.wrap = self._wrap
        for pane in self._panes.values():
            pane.dirty = True
        self._render_active()
        self.notify("long lines wrap" if self._wrap else "long lines are cut at the edge", timeout=2)

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
        except Exception:
            pass

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
            from ddptop.core.profiles import load_all

            profiles = load_all()
        except Exception as e:
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
        except Exception:
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
        from ddptop.ui.stacks_view import StacksScreen

        self.push_screen(StacksScreen(self.model.stacks))

    def action_doctor(self) -> None:
        from ddptop.ui.tool_screens import DoctorScreen

        self.push_screen(DoctorScreen())

    def action_bench(self) -> None:
        from ddptop.ui.tool_screens import BenchScreen

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
        except Exception as e:
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
        except Exception as e:
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
        log = self._views.get(self._active_key(), (None, None))[0]
        if log is not None:
            log.scroll_home(animate=False)

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self._render_active()

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
        self._views[self._active_key()][0].focus()

    def set_filter(self, text: str) -> None:
        if text == self._filter:
            return
        self._filter = text
        for pane in self._panes.values():
            pane.dirty = True
        self._render_active()
        self._refresh_header()

    def action_clear_filter(self) -> None:
        inp = self.query_one("#filter", FilterInput)
        inp.value = ""
        inp.remove_class("-on")
        self.set_filter("")
        view = self._views.get(self._active_key())
        if view is not None:
            view[0].focus()

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
