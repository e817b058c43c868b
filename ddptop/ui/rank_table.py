"""The rank table: one row per rank (pid, state, last output, step and phase,
its GPU, CPU, RSS, process status, threads, data-loader workers, lines).

It keeps its own cache of what each cell shows, so a refresh touches only the
cells that changed and widens a column only when a value outgrew it: with 64
ranks a refresh costs a few dictionary lookups, not a redraw.
"""

from __future__ import annotations

import time
from typing import Callable

from rich.text import Text
from textual.widgets import DataTable

from ddptop.core.analysis.job_state import JobState, culprits_of, ras_of
from ddptop.ui.fmt import fmt_age, fmt_bytes, fmt_pct

COLUMNS = (
    ("rank", "rank"), ("local", "local"), ("node", "node"), ("pid", "pid"), ("state", "state"),
    ("attempt", "attempt"), ("since", "last output"), ("step", "step"),
    ("gpu", "GPU"), ("cpu", "CPU"), ("rss", "RSS"), ("status", "status"), ("threads", "thr"),
    ("workers", "workers"), ("lines", "lines"), ("nccl", "NCCL (RAS)"),
)
QUIET_AFTER = 60.0  # seconds without output before "last output" is coloured as a warning
VISIBLE_ONLY_FROM = 64  # more ranks than this: a refresh updates the rows on the screen and the odd ones
VIEW_MARGIN = 8  # rows above and below the screen updated too


def rank_cells(info, finished: bool, theme) -> dict[str, object]:
    """The telemetry columns of one rank-table row."""
    p = info.proc
    if p is None:
        return {"gpu": "-", "cpu": "-", "rss": "-", "status": "-", "threads": "-", "workers": "-"}
    stale = finished or info.alive is False
    dim = "dim" if stale else ""
    gpu = "-" if p.gpu is None else f"{p.gpu}{'?' if p.gpu_mapping == 'guess' else ''}"
    status = p.status or "-"
    sstyle = dim
    if status == "zombie":
        sstyle = getattr(theme, "error", None) or "red"
    elif status == "disk-sleep":
        sstyle = getattr(theme, "warning", None) or "yellow"
    workers = "-" if p.children is None else str(p.children)
    if p.children and p.children_cpu:
        workers += f" ({p.children_cpu:.0f}%)"
    if stale:  # the process is gone: no live figures (RSS stays, dim, as its last size)
        status, sstyle, workers = ("ended" if info.alive is False else "-"), "dim", "-"
    return {
        "gpu": gpu,
        "cpu": Text("-" if stale else fmt_pct(p.cpu), style=dim),
        "rss": Text(fmt_bytes(p.rss), style=dim),
        "status": Text(status, style=sstyle),
        "threads": "-" if p.threads is None else str(p.threads),
        "workers": workers,
    }


def rank_row(r: int, info, finished: bool, theme, now: float, ras: str = "", culprit: bool = False) -> dict[str, object]:
    """Every column of rank ``r``'s row (``ras``: what NCCL's RAS port said of it
    during a stall; ``culprit``: the latest alarm names it the odd one out)."""
    th = theme
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
    if culprit:
        state = Text(f"{state.plain} ◀ odd one out", style=f"bold {th.error or 'red'}")
    if info.last_output_t is None:
        since = Text("-", style="dim")
    elif info.alive and not finished:
        age = now - info.last_output_t
        since = Text(fmt_age(age), style=(th.warning or "") if age > QUIET_AFTER else "")
    else:
        since = Text("-", style="dim")
    return {
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
        "nccl": Text(ras, style=(th.error or "") if ras and ras != "ok" else "dim") if ras else "-",
    }


class RankTable(DataTable):
    """The rank table widget; ``show(model, theme)`` brings it up to date."""

    def __init__(self, **kw) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self._cells: dict[tuple[str, str], str] = {}
        self._col_width: dict[str, int] = {}
        self._shown_culprits: set[int] = set()

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def show(self, model: JobState, theme, on_error: Callable[[str, Exception], None]) -> None:
        """Update every row from ``model``; a row that cannot be drawn keeps its
        last values and is reported once through ``on_error(where, error)``.
        The odd ones out come first.  In a large job only the rows on the
        screen (and the odd ones) are brought up to date; the others when they
        scroll into view."""
        now = time.time()
        finished = model.finished
        added = False
        culprits = set(culprits_of(model))
        ranks = sorted(model.ranks)
        in_view = None
        if len(ranks) > VISIBLE_ONLY_FROM and len(self.rows) == len(ranks):
            top = int(self.scroll_y) - VIEW_MARGIN
            order = sorted(ranks, key=lambda r: (r not in culprits, r))
            in_view = set(order[max(0, top):top + self.size.height + 2 * VIEW_MARGIN]) | culprits
        for r in ranks:
            if in_view is not None and r not in in_view:
                continue
            info = model.ranks[r]
            try:
                row = rank_row(r, info, finished, theme, now, ras_of(model, r), r in culprits)
                key = str(r)
                if key not in self.rows:
                    self.add_row(*row.values(), key=key)
                    added = True
                    for col, val in row.items():
                        self._cells[(key, col)] = str(val)
                        self._col_width[col] = max(self._col_width.get(col, 0), len(str(val)))
                    continue
                for col, val in row.items():
                    sval = str(val)
                    if self._cells.get((key, col)) == sval:
                        continue
                    self._cells[(key, col)] = sval
                    wider = len(sval) > self._col_width.get(col, 0)
                    if wider:
                        self._col_width[col] = len(sval)
                    self.update_cell(key, col, val, update_width=wider)
            except Exception as e:  # noqa: BLE001 - a UI refresh: this row keeps its last values; said once
                on_error(f"rank {r}'s row", e)
        if added or culprits != self._shown_culprits:
            try:  # the odd ones out first, then by rank
                self.sort("rank", key=lambda r: (int(r) not in culprits, int(r)))
            except Exception as e:  # noqa: BLE001 - a UI refresh must not take the monitor down; said once
                on_error("the rank table's order", e)
        if culprits and culprits != self._shown_culprits and str(min(culprits)) in self.rows:
            # a new odd one out: bring its row into view (64 ranks do not fit on the screen)
            try:
                self.move_cursor(row=self.get_row_index(str(min(culprits))), scroll=True)
            except Exception as e:  # noqa: BLE001 - a UI refresh must not take the monitor down; said once
                on_error("the odd rank's row", e)
        self._shown_culprits = culprits
