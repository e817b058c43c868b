"""The rank table: one row per rank (pid, state, last output, step and phase,
its GPU, CPU, RSS, process status, threads, data-loader workers, lines).

What each row shows is ``rank_rows.py``; this is the widget that lays the rows
out.  A large job (more than ``NODE_ROWS_ABOVE`` ranks on more than one node) shows
a row per node instead, that opens into its ranks: 1,024 rank rows are 93
screens of an 11-line table, 128 node rows with the odd ones on top are one
glance.  Each rank is judged (culprit, dead, frozen, behind) to order the
nodes; the ranks the newest alarm names stay on top as rank rows, as at any
size, and their nodes open by themselves.

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
from ddptop.ui.rank_rows import (
    COLUMNS,
    NODE_KEY,
    OK,
    SEVERITY,
    node_label,
    node_row,
    rank_row,
    rank_verdicts,
    ras_words,
)

VISIBLE_ONLY_FROM = 64  # more rows than this: a refresh updates the rows on the screen and the odd ones
VIEW_MARGIN = 8  # rows above and below the screen updated too
# More ranks than this, on more than one node: a row per node.  Two 8-GPU nodes' ranks still read as
# rows (the table shows 11 at a time; the log panes keep a tab per rank up to the same count); one node
# of many ranks has nothing to group by.
NODE_ROWS_ABOVE = 16
AUTO_OPEN = 2  # nodes that open by themselves at most: those holding a culprit, else the worst odd one


class RankTable(DataTable):
    """The rank table widget; ``show(model, theme)`` brings it up to date.

    Up to ``NODE_ROWS_ABOVE`` ranks (or on one node) a row per rank.  Above, a
    row per node that opens into its ranks (``enter``, ``right``/``left``); the
    ranks the newest alarm names stay on top as rank rows and their nodes open
    by themselves.  A rank row's key is its rank either way (``enter`` on it
    opens its log, as before); a node row's key is ``NODE_KEY`` + its name, and
    its selection stays in the table."""

    def __init__(self, **kw) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self._cells: dict[tuple[str, str], str] = {}
        self._col_width: dict[str, int] = {}
        self._shown_culprits: set[int] = set()
        self._by_node = False  # rows are nodes (opening into their ranks), not ranks
        self._order: list[str] = []  # the row keys in the order shown (node rows)
        self._node_of: dict[str, str] = {}  # row key -> its node (node rows and the ranks under them)
        self._labelled: dict[str, tuple] = {}  # node row key -> what its first cell was drawn from, off the screen
        self._opened_by_key: set[str] = set()  # nodes opened by a key
        self._closed_by_key: set[str] = set()  # nodes closed by a key (a node newly odd opens again)
        self._open_by_itself: set[str] = set()  # nodes open by themselves
        self._last: tuple | None = None  # show()'s arguments: a key redraws at once

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def show(self, model: JobState, theme, on_error: Callable[[str, Exception], None]) -> None:
        """Update every row from ``model``; a row that cannot be drawn keeps its
        last values and is reported once through ``on_error(where, error)``.
        The odd ones out come first.  In a large job only the rows on the
        screen (and the odd ones) are brought up to date; the others when they
        scroll into view."""
        self._last = (model, theme, on_error)
        by_node = len(model.ranks) > NODE_ROWS_ABOVE and len({i.node for i in model.ranks.values()}) > 1
        if by_node != self._by_node:  # (the job grew past the threshold: its rows start over)
            self._by_node = by_node
            self.clear()
            self._cells.clear()
            self._labelled.clear()
            self._col_width.clear()
            self._order = []
            self._shown_culprits = set()
        if by_node:
            self._show_nodes(model, theme, on_error)
        else:
            self._show_ranks(model, theme, on_error)

    def _show_ranks(self, model: JobState, theme, on_error: Callable[[str, Exception], None]) -> None:
        """A row per rank, the odd ones out first."""
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
                added |= self._put(str(r), row)
            except Exception as e:  # noqa: BLE001 - a UI refresh: this row keeps its last values; said once
                on_error(f"rank {r}'s row", e)
        if added or culprits != self._shown_culprits:
            try:  # the odd ones out first, then by rank
                self.sort("rank", key=lambda r: (int(r) not in culprits, int(r)))
            except Exception as e:  # noqa: BLE001 - a UI refresh must not take the monitor down; said once
                on_error("the rank table's order", e)
        self._to_culprit(culprits, on_error)

    def _show_nodes(self, model: JobState, theme, on_error: Callable[[str, Exception], None]) -> None:
        """The culprits' rows, then a row per node, the odd ones first, an open
        node's ranks under it (its odd ones first).  Every rank is judged (a
        few comparisons each) to order the nodes; only the rows on the screen
        are drawn, and only their changed cells sent."""
        now = time.time()
        finished = model.finished
        culprits = {r for r in culprits_of(model) if r in model.ranks}
        ras = ras_words(model)
        odd = rank_verdicts(model, culprits, ras, now)
        groups: dict[str, list[int]] = {}
        for r in sorted(model.ranks):
            groups.setdefault(model.ranks[r].node or "-", []).append(r)
        worst = {n: min((SEVERITY[odd[r]] for r in rs if r in odd), default=OK) for n, rs in groups.items()}
        nodes = sorted(groups, key=lambda n: (worst[n], groups[n][0]))
        auto = ([n for n in nodes if worst[n] == SEVERITY["culprit"]][:AUTO_OPEN]
                or [n for n in nodes[:1] if worst[n] < OK])
        for n in set(auto) - self._open_by_itself:
            self._closed_by_key.discard(n)  # newly odd: it opens again, even if closed by hand before
        self._open_by_itself = set(auto)
        opened = (self._open_by_itself - self._closed_by_key) | (self._opened_by_key & set(groups))
        keys = [str(r) for r in sorted(culprits)]
        pinned = len(keys)
        node_of: dict[str, str] = {}
        for n in nodes:
            keys.append(NODE_KEY + n)
            node_of[NODE_KEY + n] = n
            if n in opened:
                for r in sorted((r for r in groups[n] if r not in culprits),
                                key=lambda r: (SEVERITY.get(odd.get(r, ""), OK), r)):
                    keys.append(str(r))
                    node_of[str(r)] = n
        self._node_of = node_of

        def row_of(key: str) -> dict[str, object]:
            n = node_of.get(key)
            if key.startswith(NODE_KEY) and n is not None:
                return node_row(n, groups[n], n in opened, model, theme, now, odd, ras)
            r = int(key)
            row = rank_row(r, model.ranks[r], finished, theme, now, ras.get(r, ""), r in culprits)
            if n is not None:  # under its node
                row["rank"] = f"  {r}"
                word = odd.get(r)
                if word in ("frozen", "behind"):  # (a dead one says so itself: exited N, gone)
                    row["state"] = Text(f"{row['state']} · {word}", style=theme.warning or "yellow")
            return row

        cursor = self._cursor_key()
        wanted = set(keys)
        for k in [k.value for k in self.rows if k.value not in wanted]:
            if k is not None:
                self.remove_row(k)
                self._labelled.pop(k, None)
                for col, _ in COLUMNS:
                    self._cells.pop((k, col), None)
        in_view = wanted
        if len(keys) > VISIBLE_ONLY_FROM:
            top = max(0, int(self.scroll_y) - VIEW_MARGIN)
            in_view = set(keys[top:top + self.size.height + 2 * VIEW_MARGIN]) | set(keys[:pinned])
        for k in keys:
            try:
                if k in in_view or k not in self.rows:
                    self._put(k, row_of(k))
                    self._labelled.pop(k, None)
                elif k.startswith(NODE_KEY):  # off the screen: its first cell still (the order rests on it)
                    rs = groups[node_of[k]]
                    if self._labelled.get(k) != (rs[0], rs[-1], len(rs), node_of[k] in opened):
                        self._put(k, {"rank": node_label(rs, node_of[k] in opened)})
                        self._labelled[k] = (rs[0], rs[-1], len(rs), node_of[k] in opened)
            except Exception as e:  # noqa: BLE001 - a UI refresh: this row keeps its last values; said once
                on_error(f"node {node_of[k]}'s row" if k.startswith(NODE_KEY) else f"rank {k}'s row", e)
        shown = [k for k in keys if k in self.rows]
        if shown != self._order:
            try:  # (a DataTable adds rows at its end only: sorted by the first cell, one of a kind per row)
                pos = {self._cells.get((k, "rank"), k): i for i, k in enumerate(shown)}
                self.sort("rank", key=lambda v: pos.get(str(v), len(pos)))
                self._order = shown
                self._keep_cursor(cursor)
            except Exception as e:  # noqa: BLE001 - a UI refresh must not take the monitor down; said once
                on_error("the rank table's order", e)
        self._to_culprit(culprits, on_error)

    def _put(self, key: str, row: dict[str, object]) -> bool:
        """Add row ``key`` (every column in ``row``), or send the cells of it
        that changed; True if added.  A column widens only when a value outgrew it."""
        if key not in self.rows:
            self.add_row(*row.values(), key=key)
            for col, val in row.items():
                self._cells[(key, col)] = str(val)
                self._col_width[col] = max(self._col_width.get(col, 0), len(str(val)))
            return True
        for col, val in row.items():
            sval = str(val)
            if self._cells.get((key, col)) == sval:
                continue
            self._cells[(key, col)] = sval
            wider = len(sval) > self._col_width.get(col, 0)
            if wider:
                self._col_width[col] = len(sval)
            self.update_cell(key, col, val, update_width=wider)
        return False

    def _to_culprit(self, culprits: set[int], on_error: Callable[[str, Exception], None]) -> None:
        if culprits and culprits != self._shown_culprits and str(min(culprits)) in self.rows:
            # a new odd one out: bring its row into view (64 ranks do not fit on the screen)
            try:
                self.move_cursor(row=self.get_row_index(str(min(culprits))), scroll=True)
            except Exception as e:  # noqa: BLE001 - a UI refresh must not take the monitor down; said once
                on_error("the odd rank's row", e)
        self._shown_culprits = culprits

    def _cursor_key(self) -> str | None:
        """The key of the row under the cursor."""
        if not self.row_count or not 0 <= self.cursor_row < self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value

    def _keep_cursor(self, key: str | None) -> None:
        """After rows moved, the cursor stays on its row (a rank of a node just
        closed: on the node), unless it was on the top row, where the odd ones come."""
        if key is None or self.cursor_row == 0:
            return
        if key not in self.rows and self._last is not None and key.isdigit() and int(key) in self._last[0].ranks:
            key = NODE_KEY + (self._last[0].ranks[int(key)].node or "-")
        if key in self.rows and self.get_row_index(key) != self.cursor_row:
            self.move_cursor(row=self.get_row_index(key))

    # -- opening and closing nodes ---------------------------------------------

    def is_open(self, node: str) -> bool:
        """Opened by a key, or open by itself (an odd rank's) and not closed by a key."""
        return node in self._opened_by_key or (node in self._open_by_itself and node not in self._closed_by_key)

    def toggle_node(self, node: str, open_: bool | None = None) -> None:
        """Open ``node``'s row into its ranks, or close it (``open_`` None: the other way)."""
        if open_ is None:
            open_ = not self.is_open(node)
        if open_:
            self._opened_by_key.add(node)
            self._closed_by_key.discard(node)
        else:
            self._opened_by_key.discard(node)
            self._closed_by_key.add(node)
        if self._last is not None:
            self.show(*self._last)

    def action_select_cursor(self) -> None:
        key = self._cursor_key() or ""
        if self._by_node and key.startswith(NODE_KEY):
            self.toggle_node(key[len(NODE_KEY):])
            return
        super().action_select_cursor()  # a rank: its log (the app's RowSelected)

    def action_cursor_right(self) -> None:
        key = self._cursor_key() or ""
        if self._by_node and key.startswith(NODE_KEY) and not self.is_open(key[len(NODE_KEY):]):
            self.toggle_node(key[len(NODE_KEY):], True)
            return
        super().action_cursor_right()

    def action_cursor_left(self) -> None:
        """On an open node or a rank under it: close the node, the cursor on it."""
        node = self._node_of.get(self._cursor_key() or "") if self._by_node else None
        if node is not None and self.is_open(node):
            self.toggle_node(node, False)
            if NODE_KEY + node in self.rows:
                self.move_cursor(row=self.get_row_index(NODE_KEY + node))
            return
        super().action_cursor_left()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """A click on a node row opens or closes it: it is no rank to show."""
        key = event.row_key.value or ""
        if key.startswith(NODE_KEY):
            event.stop()
            self.toggle_node(key[len(NODE_KEY):])
