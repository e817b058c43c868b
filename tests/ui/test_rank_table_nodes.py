"""The rank table of a large job under Pilot: at 1,024 ranks (128 nodes x 8) a row per node, the odd rank
on top and its node open beneath it, ``enter`` (and ``right``/``left``) opening a node into its ranks and
closing it; at 8 ranks (and at 16 on two nodes) a row per rank, as before.  What is shown, never how fast."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("textual")

from textual.widgets import DataTable, TabbedContent  # noqa: E402

from ddptop.core.model.events import AlarmEvent, ProgressEvent, RankEvent  # noqa: E402
from ddptop.core.run.run_session import Session  # noqa: E402
from ddptop.ui.app import make_app  # noqa: E402
from ddptop.ui.rank_table import NODE_KEY  # noqa: E402
from conftest import rank_started, write_run  # noqa: E402
from helpers import wait_until  # noqa: E402

SIZE = (160, 45)
TEST_TIMEOUT = 240


def run_of(tmp_path, nranks: int, per_node: int = 8, stopped: int | None = None):
    """``nranks`` ranks, ``per_node`` on each of node-0, node-1, ...; rank ``stopped`` printed one step less."""
    now = time.time()
    events = [{"t": now, "kind": "state", "state": "running"}]
    events += [{**rank_started(now, r, 10_000 + r), "node": f"node-{r // per_node}"} for r in range(nranks)]
    logs = {r: "epoch 3 step 120 loss 0.5\n" + ("" if r == stopped else "epoch 3 step 121 loss 0.4\n")
            for r in range(nranks)}
    return write_run(tmp_path, events=events, logs=logs, nproc=nranks)


def run_async(coro):
    return asyncio.run(asyncio.wait_for(coro, TEST_TIMEOUT))


def keys(table: DataTable) -> list[str]:
    return [str(row.key.value) for row in table.ordered_rows]


def cell(table: DataTable, key: str, col: str) -> str:
    return str(table.get_cell(key, col))


@pytest.mark.parametrize("nranks,per_node", [(8, 8), (16, 8)])
def test_at_or_below_16_ranks_every_rank_is_a_row(tmp_path, nranks, per_node):
    run = run_of(tmp_path, nranks, per_node)

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one("#ranks", DataTable)
            await wait_until(pilot, lambda: table.row_count == nranks
                             and cell(table, str(nranks - 1), "step") == "121", what="every rank's row")
            assert keys(table) == [str(r) for r in range(nranks)]
            assert [cell(table, str(r), "rank") for r in range(nranks)] == [str(r) for r in range(nranks)]
            assert cell(table, "9" if nranks > 8 else "1", "node") == ("node-1" if nranks > 8 else "node-0")
            assert "alive" in cell(table, "0", "state")

    run_async(go())


def test_1024_ranks_show_a_row_per_node_the_odd_one_on_top_and_enter_opens_a_node(tmp_path):
    run = run_of(tmp_path, 1024, stopped=777)

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one("#ranks", DataTable)
            await wait_until(pilot, lambda: len(app.model.ranks) == 1024 and table.row_count == 128
                             and app.model.ranks[1023].last_step == 121, timeout=120, what="128 node rows")
            app._refresh_table()
            assert keys(table) == [f"{NODE_KEY}node-{n}" for n in range(128)]  # nothing odd yet: node order
            assert cell(table, "node:node-0", "rank") == "▸ r0-7"
            assert cell(table, "node:node-0", "node") == "node-0"
            assert cell(table, "node:node-0", "state") == "alive"
            assert cell(table, "node:node-0", "step") == "121"
            assert cell(table, "node:node-0", "lines") == "16"
            assert cell(table, "node:node-97", "step") == "120-121 (r777)"

            # the stall alarm names rank 777: its row on top, marked, the cursor on it; its node next, open
            app.ingest([AlarmEvent(time.time(), type="stall", id="stall", ranks=tuple(range(1024)), culprits=(777,),
                                   message="rank 777 is stuck")])
            app._refresh_table()
            await pilot.pause(0.1)
            shown = keys(table)
            assert shown[:9] == ["777", "node:node-97", "776", "778", "779", "780", "781", "782", "783"]
            assert len([k for k in shown if k.startswith(NODE_KEY)]) == 128
            assert "odd one out" in cell(table, "777", "state") and table.cursor_row == 0
            assert cell(table, "node:node-97", "rank") == "▾ r776-783"
            assert cell(table, "node:node-97", "state") == "culprit r777"
            assert cell(table, "776", "rank") == "  776" and cell(table, "776", "node") == "node-97"
            assert shown[9] == "node:node-0"

            # enter on a node opens it into its 8 ranks, and again closes it; right / left the same
            table.focus()
            table.move_cursor(row=table.get_row_index("node:node-0"))
            await pilot.pause()
            await pilot.press("enter")
            await wait_until(pilot, lambda: "0" in keys(table), what="node-0 open")
            shown = keys(table)
            at = shown.index("node:node-0")
            assert shown[at + 1:at + 9] == [str(r) for r in range(8)]
            assert cell(table, "node:node-0", "rank") == "▾ r0-7"
            assert [cell(table, str(r), "rank") for r in range(8)] == [f"  {r}" for r in range(8)]
            assert table.cursor_row == at  # still on the node
            await pilot.press("enter")
            await wait_until(pilot, lambda: "0" not in keys(table), what="node-0 closed")
            shown = keys(table)
            assert shown[shown.index("node:node-0") + 1] == "node:node-1"
            assert cell(table, "node:node-0", "rank") == "▸ r0-7"
            await pilot.press("right")
            await wait_until(pilot, lambda: keys(table)[table.cursor_row + 1] == "0", what="node-0 open by right")
            await pilot.press("down", "down", "left")  # (on rank 1, under node-0: the node closes, the cursor on it)
            await wait_until(pilot, lambda: "1" not in keys(table), what="node-0 closed by left")
            assert keys(table)[table.cursor_row] == "node:node-0"
            # the culprit's node closed by hand stays closed
            table.move_cursor(row=table.get_row_index("node:node-97"))
            await pilot.pause()
            await pilot.press("enter")
            await wait_until(pilot, lambda: "776" not in keys(table), what="node-97 closed")
            assert keys(table)[:3] == ["777", "node:node-97", "node:node-0"]
            app._refresh_table()
            assert keys(table)[:3] == ["777", "node:node-97", "node:node-0"]

            # enter on a rank row still opens its log
            table.move_cursor(row=table.get_row_index("777"))
            await pilot.pause()
            await pilot.press("enter")
            tabs = app.query_one("#panes", TabbedContent)
            await wait_until(pilot, lambda: tabs.active == "pane-pick"
                             and "rank 777" in str(tabs.get_tab("pane-pick").label), what="rank 777's log")

    run_async(go())


def test_1024_ranks_without_an_alarm_the_odd_node_comes_first_and_opens(tmp_path):
    """No alarm yet: a rank behind (its hook's steps) and a dead one on other nodes; the dead one's node
    first (the worse), open, the behind one's second, closed, each saying which rank."""
    run = run_of(tmp_path, 1024)

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one("#ranks", DataTable)
            await wait_until(pilot, lambda: len(app.model.ranks) == 1024 and table.row_count == 128,
                             timeout=120, what="128 node rows")
            now = time.time()
            steps = [ProgressEvent(now - 30, rank=r, step=500, source="hook") for r in range(1024) if r != 300]
            app.ingest([*steps, ProgressEvent(now - 40, rank=300, step=499, source="hook"),
                        RankEvent(now, rank=901, local_rank=5, node="node-112", pid=10_901, alive=False, exit_code=1)])
            app._refresh_table()
            await pilot.pause(0.1)
            shown = keys(table)
            assert shown[:4] == ["node:node-112", "901", "896", "897"]
            assert cell(table, "node:node-112", "state") == "dead r901"
            assert cell(table, "901", "state") == "exited 1"
            assert shown[9] == "node:node-37" and shown[10] == "node:node-0"
            assert cell(table, "node:node-37", "state") == "behind r300"
            assert cell(table, "node:node-37", "step") == "499-500 (r300)"
            assert cell(table, "node:node-37", "rank") == "▸ r296-303"

    run_async(go())
