"""The first frame: what the job's first read shows, painted before the full screen is built.

A person who opens ddptop waits for the job's state and its last lines, not for
the widgets that will let them move around it.  Building the full screen (the
rank table, a tab per rank, the log panes, the footer's keys, the hidden
inputs) costs Textual about as long again as importing it, so the app first
paints this: the header, the rank table's rows, the tab line and the merged
log's last lines, drawn by the same functions the full screen draws them with
(``header_markup``, ``rank_row``, ``render_lines``) from the job's first read,
as a few plain widgets on a layer of their own.  The full screen is built under
it right after that paint and takes its place once its merged log shows its
lines (``DdptopApp._build``).  Keys that need the full screen are refused until
it is there (the app's ``check_action``, a fraction of a second); quitting is not.

Nothing here is kept: the events read for it go on to the app's inbox, so
every line reaches the panes exactly once.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.containers import Vertical
from textual.widgets import Static

from ddptop.core.analysis.job_state import JobState, culprits_of, ras_of
from ddptop.core.model.events import LogBatch
from ddptop.ui.event_feed import event_line
from ddptop.ui.header import HeaderBar, HeaderState
from ddptop.ui.logview import Line, render_lines
from ddptop.ui.rank_rows import COLUMNS, rank_row

TABLE_ROWS = 10  # the rank table's rows on the screen (its max-height 12, less its header row and its border)


def table_text(model: JobState, theme, now: float, rows: int = TABLE_ROWS) -> Text:
    """The rank table's header and first ``rows`` rows (the odd ones out first, then by rank), laid out as
    the table lays them out: each column as wide as its widest cell, one space either side."""
    culprits = set(culprits_of(model))
    order = sorted(model.ranks, key=lambda r: (r not in culprits, r))[:rows]
    cells: list[list[Text]] = [[Text(label, style="bold") for _key, label in COLUMNS]]
    for r in order:
        values = rank_row(r, model.ranks[r], model.finished, theme, now, ras_of(model, r), r in culprits)
        cells.append([c if isinstance(c, Text) else Text(str(c)) for c in (values[key] for key, _ in COLUMNS)])
    widths = [max(len(line[i].plain) for line in cells) for i in range(len(COLUMNS))]
    out = Text(no_wrap=True, overflow="crop", end="")
    for n, line in enumerate(cells):
        if n:
            out.append("\n")
        for cell, width in zip(line, widths):
            out.append(" ")
            out.append_text(cell)
            out.append(" " * (width - len(cell.plain) + 1))
    return out


def tail_lines(events: list, most: int) -> list[Line]:
    """The last ``most`` lines the merged log gets from ``events``: the ranks' lines (each with its rank and
    node) and what the other events say (``event_line``, as the full screen says it)."""
    out: list[Line] = []
    for ev in reversed(events):
        if len(out) >= most:
            break
        if isinstance(ev, LogBatch):
            texts = ev.done[-(most - len(out)):] if len(ev) else []
            out.extend(Line(ev.rank, ev.stream, t, "", ev.node) for t in reversed(texts))
        else:
            line = event_line(ev, False)
            if line is not None:
                out.append(line)
    out.reverse()
    return out


class FirstFrame(Vertical):
    """The first frame's widgets (see the module's text); ``show`` fills them."""

    DEFAULT_CSS = """
    FirstFrame { layer: first-frame; height: 100%; background: $surface; }
    FirstFrame #ff-table { height: auto; max-height: 12; border-bottom: solid $primary 40%; background: $surface; }
    FirstFrame #ff-tabs { height: 2; background: $surface; }
    FirstFrame #ff-log { height: 1fr; background: $surface; text-wrap: nowrap; text-overflow: clip; }
    FirstFrame #ff-keys { height: 1; background: $panel; }
    """

    def compose(self):
        yield HeaderBar(id="ff-header", classes="header")
        yield Static("", id="ff-table")
        yield Static("", id="ff-tabs")
        yield Static("", id="ff-log")
        yield Static("", id="ff-keys")

    def show(self, model: JobState, ui: HeaderState, events: list, *, theme, palette: list[str], keys: Text) -> None:
        now = time.time()
        self.query_one("#ff-header", HeaderBar).show(model, ui, now)
        table = table_text(model, theme, now)
        self.query_one("#ff-table", Static).update(table)
        rule = Text("━" * max(1, self.app.size.width), style=theme.primary or "")
        tabs = Text(" merged ", style="bold")
        tabs.append("\n")
        tabs.append_text(rule)
        self.query_one("#ff-tabs", Static).update(tabs)
        # (the lines the log has room for: the screen, less the header, the table and its border, the tabs
        # and the keys)
        room = self.app.size.height - 1 - (table.plain.count("\n") + 2) - 2 - 1
        multi = len({i.node for i in model.ranks.values() if i.node}) > 1
        lines = tail_lines(events, max(1, room))
        text = render_lines(lines, True, palette, 0, False, multi)
        log = self.query_one("#ff-log", Static)
        log.update(text if text is not None else "")
        self.query_one("#ff-keys", Static).update(keys)
