"""The log panes: the merged log, one pane per rank and torchrun's own output,
as tabs, each a bounded buffer (``logview.PaneBuffer``) and a ``RichLog``
with a line for progress bars under it.

``LogPanes`` owns the buffers and their widgets, the filter and the wrap
setting.  Only the visible pane is written; a hidden one re-renders when it
is shown, and its widgets are made then, the first time it is shown (the
first frame holds the shown pane's log only, however many tabs).  The app
decides *when* to write (``flush``: at most every ``FLUSH_EVERY`` seconds
while output floods in).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import widgets  # (RichLog and the tabs looked up when used: they load after the first frame)
from textual.app import App, ScreenStackError
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.widget import Widget
from textual.widgets import Input, Static

if TYPE_CHECKING:
    from textual.widgets import RichLog

from ddptop.ui import logview
from ddptop.ui.logview import BUFFER_LINES, Line, PaneBuffer

FLUSH_EVERY = 0.2  # seconds between writes to the widgets while output floods in
FIRST_LINES = 60  # lines a pane shows in the app's first frame (the rest right after it)
FOLD_FROM = 8  # more ranks than this: the merged pane folds alike lines (z toggles it)
TAB_RANKS = 16  # up to this many ranks, one tab each; beyond, one tab shows the rank picked (o, 0-9, enter)
OPEN_FOLDS_SHOWN = 4  # folds still open, shown under the merged log as they widen
# the rank panes' lines, for the whole job: each rank keeps its share (its newest lines; the journal
# keeps them all), never fewer than RANK_LINES_MIN nor more than BUFFER_LINES
RANK_LINES_BUDGET = 1_000_000
RANK_LINES_MIN = 500


def rank_lines(ranks: int) -> int:
    """Lines each of ``ranks`` rank panes keeps (the share of the next power of
    two at or above ``ranks``: the panes are resized a few times as a large
    job's ranks come, not once per rank)."""
    return max(RANK_LINES_MIN, min(BUFFER_LINES, RANK_LINES_BUDGET // (1 << max(0, ranks - 1).bit_length())))


class LogPanes:
    def __init__(self, app: App) -> None:
        self.app = app
        self.buffers: dict[str, PaneBuffer] = {"merged": PaneBuffer("merged", merged=True)}
        self.views: dict[str, tuple[RichLog, Static]] = {}  # the panes whose widgets are made (shown once)
        self.tabs: set[str] = {"merged"}  # the panes with a tab
        self.filter = ""
        self.wrap = True
        self.palette: list[str] = []  # rank prefix colours, from the theme
        self.multi_node = False  # several nodes: torchrun lines and prefixes name theirs
        # until the first frame is on the screen, a full render writes only the last
        # FIRST_LINES lines (a screenful); the pane is rendered whole right after it
        self.first_frame_done = False
        self.fold_auto = True  # fold alike lines once the job has more than FOLD_FROM ranks (until z is pressed)
        self._rank_lines = BUFFER_LINES
        self._rank_panes = 0  # rank panes made (the "r<N>" buffers)
        # more than TAB_RANKS ranks: no tab per rank, one "pick" tab shows the rank picked
        self.picking = False
        self.picked: str | None = None
        self._sync_due = False

    # -- widgets ---------------------------------------------------------------

    def make_view(self, key: str) -> list[Widget]:
        """The widgets of pane ``key``: its log and its progress-bar line."""
        log = widgets.RichLog(max_lines=logview.LOG_MAX_LINES, wrap=self.wrap, markup=False, highlight=False, id=f"log-{key}")
        live = Static("", classes="live", id=f"live-{key}")
        self.views[key] = (log, live)
        return [Vertical(log, live, classes="logview")]

    def _open_view(self, key: str) -> tuple[RichLog, Static] | None:
        """Pane ``key``'s widgets, made and mounted in its tab the first time it is shown; None when it has no
        tab."""
        view = self.view_of(key)
        if view is not None or key not in self.tabs or (self.picking and key.startswith("r")):
            return view
        try:
            tab = self.app.query_one(f"#pane-{key}", widgets.TabPane)
        except (NoMatches, ScreenStackError):
            return None
        tab.mount(*self.make_view(key))
        return self.views[key]

    @staticmethod
    def key_of(rank: int | None) -> str:
        return "torchrun" if rank is None else f"r{rank}"

    def order(self) -> list[str]:
        ranks = sorted(int(k[1:]) for k in self.buffers if k.startswith("r"))
        order = ["merged"] + [f"r{r}" for r in ranks]
        if "torchrun" in self.buffers:
            order.append("torchrun")
        return order

    def ensure(self, key: str) -> PaneBuffer:
        """The pane ``key``'s buffer; a new pane gets its tab, in rank order.
        A rank's tab comes once the batch that brought it is in (``_sync_tabs``):
        a job of more than TAB_RANKS ranks gets none, the pick tab shows them."""
        pane = self.buffers.get(key)
        if pane is not None:
            return pane
        pane = self.buffers[key] = PaneBuffer(key)
        if key.startswith("r"):
            self._ranks_changed(key)
            if not self.picking and not self._sync_due:
                self._sync_due = True
                self.app.call_later(self._sync_tabs)
            return pane
        self._add_tab(key)
        return pane

    def _add_tab(self, key: str) -> None:
        """A tab for pane ``key`` (its widgets come when it is first shown: ``_open_view``)."""
        title = "torchrun" if key == "torchrun" else f"rank {key[1:]}"
        tp = widgets.TabPane(title, id=f"pane-{key}")
        self.tabs.add(key)
        order = self.order()
        tabs = self.app.query_one("#panes", widgets.TabbedContent)
        after = order[order.index(key) + 1:]
        before = next((f"pane-{k}" for k in after if k in self.tabs and k != key and self.mounted(k)), None)
        if before is not None:
            tabs.add_pane(tp, before=before)
        else:
            tabs.add_pane(tp)

    def _sync_tabs(self) -> None:
        """A tab for each rank that has none, or, past TAB_RANKS ranks, the pick tab instead."""
        self._sync_due = False
        if self.picking:
            return
        ranks = sorted((k for k in self.buffers if k.startswith("r")), key=lambda k: int(k[1:]))
        if len(ranks) > TAB_RANKS:
            self._start_picking()
            return
        for key in ranks:
            if key not in self.tabs:
                self._add_tab(key)

    def _start_picking(self) -> None:
        """Too many ranks for a tab each: their tabs go, one tab shows the rank picked."""
        self.picking = True
        tabs = self.app.query_one("#panes", widgets.TabbedContent)
        for key in [k for k in self.tabs if k.startswith("r")]:
            tabs.remove_pane(f"pane-{key}")
            self.tabs.discard(key)
            self.views.pop(key, None)
        self.picked = min((k for k in self.buffers if k.startswith("r")), key=lambda k: int(k[1:]))
        tp = widgets.TabPane(self.title_of(self.picked), *self.make_view("pick"), id="pane-pick")
        if "torchrun" in self.tabs and self.mounted("torchrun"):
            tabs.add_pane(tp, before="pane-torchrun")
        else:
            tabs.add_pane(tp)

    @staticmethod
    def title_of(key: str) -> str:
        return f"rank {key[1:]} (o: pick)"

    def ensure_rank(self, rank: int) -> bool:
        """Make rank ``rank``'s pane; True when it is new."""
        if f"r{rank}" in self.buffers:
            return False
        self.ensure(f"r{rank}")
        return True

    def _ranks_changed(self, key: str) -> None:
        """A rank's pane came (``key``): fold from FOLD_FROM ranks on, and share the lines budget (every
        pane resized only when the share changes: counted, not listed, so that 1,024 ranks cost 1,024 steps)."""
        self._rank_panes += 1
        if self.fold_auto and self._rank_panes > FOLD_FROM and self.buffers["merged"].folder is None:
            self.buffers["merged"].set_folding(True)
        most = rank_lines(self._rank_panes)
        if most != self._rank_lines:
            self._rank_lines = most
            for k in self.buffers:
                if k.startswith("r"):
                    self.buffers[k].resize(most)
        else:
            self.buffers[key].resize(most)

    def toggle_folding(self) -> bool:
        """Fold alike lines in the merged pane, or show every line; True: folding now."""
        self.fold_auto = False
        merged = self.buffers["merged"]
        merged.set_folding(merged.folder is None)
        merged.refold([b for k, b in self.buffers.items() if k.startswith("r")])
        self.render("merged")
        return merged.folder is not None

    def tick(self) -> bool:
        """Folds whose time is up go into the merged pane; True when any did."""
        return self.buffers["merged"].tick()

    def mounted(self, key: str) -> bool:
        if self.picking and key.startswith("r"):
            key = "pick"
        try:
            self.app.query_one(f"#pane-{key}", widgets.TabPane)
            return True
        except (NoMatches, ScreenStackError):
            return False

    def active_key(self) -> str:
        try:
            active = self.app.query_one("#panes", widgets.TabbedContent).active or "pane-merged"
        except (NoMatches, ScreenStackError):
            return "merged"
        key = active.removeprefix("pane-")
        return (self.picked or "merged") if key == "pick" else key

    def view_of(self, key: str) -> tuple[RichLog, Static] | None:
        if self.picking and key.startswith("r"):
            return self.views.get("pick") if key == self.picked else None
        return self.views.get(key)

    def active_log(self) -> RichLog | None:
        view = self.view_of(self.active_key())
        return view[0] if view is not None else None

    # -- lines -------------------------------------------------------------------

    def add_line(self, line: Line) -> None:
        """A line for the merged pane and, for a rank's or torchrun's, its own."""
        self.buffers["merged"].add(line)
        if line.rank is None or line.rank >= 0:
            key = self.key_of(line.rank)
            (self.buffers.get(key) or self.ensure(key)).add(line)

    def add_batch(self, rank: int | None, stream: str, texts, node: str = "", path: str = "",
                  offsets=()) -> None:
        """The ended lines of one batch (a LogBatch's ``done``), for the merged
        pane and their rank's (or torchrun's): one Line object for each line a
        pane can keep, not for each line of the batch.  ``path`` and
        ``offsets``: where each line is in the journal (read back from there
        once its pane no longer holds it)."""
        merged: list[tuple[list[Line], int]] = []
        self.add_batch_later(merged, rank, stream, texts, node, path, offsets)
        self.add_later(merged)

    def add_batch_later(self, merged: list, rank: int | None, stream: str, texts, node: str = "", path: str = "",
                        offsets=()) -> None:
        """``add_batch``, its lines for the merged pane put in ``merged`` (for ``add_later``: a live view of
        many ranks folds the lines of all its batches of a moment at once)."""
        n = len(texts)
        if not n:
            return
        lines = [Line(rank, stream, t, "", node) for t in texts[-BUFFER_LINES:]]
        key = self.key_of(rank)
        own = self.buffers.get(key) or self.ensure(key)
        if path and len(offsets) >= n:
            for ln, off in zip(lines, offsets[n - len(lines):n]):
                ln.src = (path, off)
            own.sources[path] = offsets[n - 1] + len(texts[n - 1].encode("utf-8", "replace")) + 1
        merged.append((lines, n))
        own.add_many(lines, n)

    def add_later(self, merged: list) -> None:
        """The merged pane's lines that ``add_batch_later`` put aside, in order; ``merged`` is emptied."""
        if merged:
            self.buffers["merged"].add_batches(merged)
            merged.clear()

    def set_live(self, rank: int | None, stream: str, text: str) -> None:
        """A progress bar's latest redraw (shown under the log, not kept)."""
        self.buffers["merged"].set_live(rank, stream, text)
        key = self.key_of(rank)
        (self.buffers.get(key) or self.ensure(key)).set_live(rank, stream, text)

    def separator(self, line: Line) -> None:
        """A line in the merged pane and every rank's (a relaunch)."""
        for key, pane in self.buffers.items():
            if key == "merged" or key.startswith("r"):
                pane.add(line)

    def mark_dirty(self) -> None:
        """Every pane re-renders whole when next shown (theme, wrap, filter, nodes)."""
        for pane in self.buffers.values():
            pane.dirty = True

    def set_multi_node(self, multi: bool) -> None:
        if multi != self.multi_node:
            self.multi_node = multi
            self.mark_dirty()

    # -- rendering ---------------------------------------------------------------

    def flush(self) -> None:
        """Write what is new to the visible pane; hidden panes re-render on show."""
        self.tick()
        active = self.active_key()
        for key, pane in self.buffers.items():
            if key == active:
                self.render(key)
            elif pane.pending:
                pane.pending = []
                pane.dirty = True

    def after_first_frame(self) -> None:
        """The first frame is on the screen: render the visible pane whole."""
        if self.first_frame_done:
            return
        self.first_frame_done = True
        self.render_active()

    def render_active(self, top: bool = False) -> None:
        """Write the pane shown; ``top``: then show its first line (the earlier lines just brought in)."""
        self.render(self.active_key(), top)

    def render(self, key: str, top: bool = False) -> None:
        pane = self.buffers.get(key)
        view = self._open_view(key)
        if pane is None or view is None:
            return
        log, live = view
        try:
            full, lines, hidden = pane.take_render(self.filter)
            if full and not self.first_frame_done and len(lines) > FIRST_LINES:
                hidden, lines = hidden + len(lines) - FIRST_LINES, lines[-FIRST_LINES:]
                pane.dirty = True  # whole, once the first frame is painted (after_first_frame)
            if full:
                log.clear()
            text = logview.render_lines(lines, pane.merged, self.palette, hidden, full, self.multi_node,
                                        bool(self.filter), pane.evicted if full and self.filter else 0)
            if text is not None:
                log.write(text, scroll_end=False if top else None)
            if top:
                log.call_after_refresh(log.scroll_home, animate=False)
            if pane.live_changed or full:
                pane.live_changed = False
                self._render_live(pane, live)
        except Exception as e:  # noqa: BLE001 - a pane's render: one bad frame must not take the monitor down; said in the pane
            said = f"could not render lines: {type(e).__name__}: {e}"
            try:
                log.write(Text(f"<{said}>", style="dim"))
            except Exception:  # noqa: BLE001 - the pane itself is broken: said in a notification instead
                self.app.notify(said, severity="error")

    def _render_live(self, pane: PaneBuffer, live: Static) -> None:
        needle = self.filter.lower()
        parts = [ln for ln in pane.open_lines(OPEN_FOLDS_SHOWN) if not needle or needle in ln.low()]
        for (rank, stream), raw in list(pane.live.items())[-4:]:
            if needle and needle not in logview.plain(raw).lower():
                continue
            parts.append(Line(rank, stream, raw))
        text = logview.render_lines(parts, pane.merged, self.palette, 0, False, self.multi_node) if parts else None
        live.update(text if text is not None else "")
        live.set_class(text is not None, "-on")

    # -- what the keys do ---------------------------------------------------------

    def show(self, key: str) -> bool:
        """Bring pane ``key`` to the front (False: there is no such pane yet)."""
        if key not in self.buffers or not self.mounted(key):
            return False
        tabs = self.app.query_one("#panes", widgets.TabbedContent)
        if self.picking and key.startswith("r"):
            if key != self.picked:
                self.picked = key
                self.buffers[key].dirty = True
                tabs.get_tab("pane-pick").label = self.title_of(key)
            tabs.active = "pane-pick"
        else:
            tabs.active = f"pane-{key}"
        self.render(key)
        view = self.view_of(key)
        if view is not None and not isinstance(self.app.focused, Input):
            view[0].focus()
        return True

    def cycle(self, step: int) -> None:
        order = [k for k in self.order() if self.mounted(k)]
        if self.picking:  # merged, the picked rank, torchrun (o picks another rank)
            order = [k for k in order if not k.startswith("r") or k == self.picked]
        if not order:
            return
        cur = self.active_key()
        i = order.index(cur) if cur in order else 0
        self.show(order[(i + step) % len(order)])

    def set_filter(self, text: str) -> bool:
        """Show only lines containing ``text`` (case-insensitive); True if it changed."""
        if text == self.filter:
            return False
        self.filter = text
        self.mark_dirty()
        self.render_active()
        return True

    def toggle_wrap(self) -> bool:
        self.wrap = not self.wrap
        for log, _live in self.views.values():
            log.wrap = self.wrap
        self.mark_dirty()
        self.render_active()
        return self.wrap
