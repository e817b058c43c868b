"""NCCL RAS in the UI: the rank table shows what RAS says while a stall lasts (the answers from
``tests/support/ras_server.py``, a stand-in that speaks NCCL's protocol)."""

from __future__ import annotations

import random


def test_the_rank_table_shows_what_ras_says_while_the_stall_lasts(tmp_path):
    """A RAS answer fills the rank table's NCCL column (the culprit's count,
    "ok" for the others) until a step comes again; the merged log says it."""
    import asyncio
    import time

    from textual.widgets import DataTable

    from ddptop.core.model.events import ProgressEvent, RasEvent
    from ddptop.core.run.run_session import Session
    from ddptop.ui.app import make_app
    from helpers import wait_until
    from test_app import log_text, make_run

    run_dir = make_run(tmp_path)
    held = random.randrange(2)

    async def go():
        app = make_app(Session.open(run_dir), poll_interval=0.02)
        async with app.run_test(size=(200, 40)) as pilot:
            table = app.query_one("#ranks", DataTable)
            await wait_until(pilot, lambda: table.row_count == 2 and all(
                info.last_step is not None for info in app.model.ranks.values()), what="both ranks and their steps")
            t = time.time()  # (after the steps the logs gave)
            app.ingest([RasEvent(t, addr="127.0.0.1:1", ok=True, version="2.29.2", format="json", culprits=(held,),
                                 text=f"rank {1 - held} launched AllReduce #12; rank {held} stopped at #11 (NCCL RAS)",
                                 behind={held: "AllReduce #11 (others #12)"}, took=0.01)])
            col = [str(c.label) for c in table.columns.values()].index("NCCL (RAS)")
            await wait_until(pilot, lambda: str(table.get_row(str(held))[col]) == "AllReduce #11 (others #12)",
                             what="the culprit's RAS count")
            assert str(table.get_row(str(1 - held))[col]) == "ok"
            await wait_until(pilot, lambda: f"rank {held} stopped at #11 (NCCL RAS)" in log_text(app, "merged")
                             .replace("\n", ""), what="the RAS line in the log")
            app.ingest([ProgressEvent(t + 1, rank=0, step=13, source="hook")])  # progress: the stall is over
            await wait_until(pilot, lambda: str(table.get_row(str(held))[col]) == "-", what="the column cleared")

    asyncio.run(asyncio.wait_for(go(), 30))
