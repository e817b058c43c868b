"""The full screen: the header, the alarms, the rank table, the GPU pane, the
log tabs, the two inputs and the footer's keys, in one container.

Its own module so that these widgets (Textual's DataTable, tabs, RichLog and
footer, and ddptop's table and GPU pane built on them) load only when the
screen is built: after the first frame is painted (``first_frame.py``), or at
once where the app has no first frame (the tests).  The app handles their
messages by name (``on_data_table_row_selected``, ...), so it need not load them.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Footer, Static, TabbedContent, TabPane

from ddptop.ui.alarm_box import AlarmBox
from ddptop.ui.commands import FilterInput, PickInput
from ddptop.ui.gpu_pane import GpuPane
from ddptop.ui.header import HeaderBar
from ddptop.ui.rank_table import RankTable


class ScreenBody(Vertical):
    """The full screen's widgets, for ``app`` (a ``DdptopApp``: its session and log panes)."""

    def compose(self) -> ComposeResult:
        app = self.app
        yield HeaderBar(id="header")
        yield Static("", id="envpanel")
        alarms = AlarmBox(id="alarms")
        alarms.can_relaunch = not app.session.control().refused  # type: ignore[attr-defined] # a job ddptop did not start: no r
        yield alarms
        yield RankTable(id="ranks")
        yield GpuPane(id="gpu-pane")
        with TabbedContent(id="panes", initial="pane-merged"):
            with TabPane("merged", id="pane-merged"):
                yield from app.logs.make_view("merged")  # type: ignore[attr-defined]
        yield FilterInput(placeholder="filter: lines containing… (esc clears, enter keeps)", id="filter")
        yield PickInput(placeholder="open the log of rank… (a number, or a node's name: its odd rank out first)",
                        id="picker")
        yield Footer()
