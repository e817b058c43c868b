"""The merged log of a large job under Pilot: alike lines of 1,024 ranks fold into one line that names them
(``[r0-1023] epoch 3 ...``), a rank that said something else keeps its own line, a rank's own pane keeps its
lines whole, and at 8 ranks every rank's line shows (``z`` folds them on demand).  What is shown, never how
fast."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("textual")

from textual.widgets import RichLog, Static, TabbedContent  # noqa: E402

from ddptop.core.run.run_session import Session  # noqa: E402
from ddptop.ui.app import make_app  # noqa: E402
from conftest import rank_started, write_run  # noqa: E402
from helpers import wait_until  # noqa: E402

SIZE = (160, 45)
TEST_TIMEOUT = 240


def run_of(tmp_path, nranks: int, odd: int | None = None):
    now = time.time()
    events = [{"t": now, "kind": "state", "state": "running"}]
    # (one run directory holds every rank's log, by rank: their local rank is their rank here; the node
    # names are what the picker reads)
    events += [{**rank_started(now, r, 10_000 + r), "node": f"node-{r // 8}"} for r in range(nranks)]
    logs = {}
    for r in range(nranks):
        text = f"epoch 3 step 120 loss {r / 1000:.3f}\n"
        if r == odd:
            text += "next_batch: waiting for data-loader worker 3\n"
        logs[r] = text + f"epoch 3 step 121 loss {r / 999:.3f}\n"
    return write_run(tmp_path, events=events, logs=logs, nproc=nranks)


def text_of(app, key: str) -> str:
    return "\n".join(strip.text for strip in app.query_one(f"#log-{key}", RichLog).lines)


def under_the_log(app) -> str:
    return str(app.query_one("#live-merged", Static).render())


def run_async(coro):
    return asyncio.run(asyncio.wait_for(coro, TEST_TIMEOUT))


def test_1024_ranks_alike_lines_fold_into_one_and_the_odd_line_keeps_its_rank(tmp_path):
    run = run_of(tmp_path, 1024, odd=777)

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            # first, under the log, the folds still open; then, no rank joining for 2 s, in the log itself
            await wait_until(pilot, lambda: "[r0-1023] epoch 3 step 121" in text_of(app, "merged"), timeout=120,
                             what=lambda: f"the folded lines; merged: {text_of(app, 'merged')[-500:]!r}, "
                                          f"open: {under_the_log(app)!r}")
            merged = text_of(app, "merged")
            assert "[r0-1023] epoch 3 step 120 loss 0.000" in merged
            assert merged.count("epoch 3 step 12") == 2  # one line each, not 2,048
            assert "[r777] next_batch: waiting for data-loader worker 3" in merged
            assert merged.index("step 120") < merged.index("next_batch")  # (in the order the folds opened)
            # no tab per rank: one tab shows the rank picked (o: a number or a node), its lines whole
            tabs = app.query_one("#panes", TabbedContent)
            assert tabs.tab_count <= 3, tabs.tab_count
            await pilot.press("o", *"777", "enter")
            await wait_until(pilot, lambda: "epoch 3 step 121 loss 0.778" in text_of(app, "pick"), what="rank 777")
            assert tabs.active == "pane-pick" and "rank 777" in str(tabs.get_tab("pane-pick").label)
            assert text_of(app, "pick").splitlines() == ["epoch 3 step 120 loss 0.777",
                                                         "next_batch: waiting for data-loader worker 3",
                                                         "epoch 3 step 121 loss 0.778"]
            await pilot.press("o", *"node-99", "enter")  # node-99: ranks 792-799, the lowest first
            await wait_until(pilot, lambda: "epoch 3 step 120 loss 0.792" in text_of(app, "pick"), what="node-99")
            assert "rank 792" in str(tabs.get_tab("pane-pick").label)
            await pilot.press("o", *"4000", "enter")  # no such rank: said, the picker stays open
            await pilot.pause(0.2)
            assert "rank 792" in str(tabs.get_tab("pane-pick").label)
            await pilot.press("escape")
            # the rank table: the odd one out first, marked, at any size
            from textual.widgets import DataTable

            from ddptop.core.model.events import AlarmEvent

            app.ingest([AlarmEvent(time.time(), type="stall", id="stall", ranks=tuple(range(1024)), culprits=(777,),
                                   message="rank 777 is stuck")])
            app._refresh_table()
            table = app.query_one("#ranks", DataTable)
            await wait_until(pilot, lambda: "odd one out" in str(table.get_cell("777", "state")), what="777 marked")
            assert table.get_row_index("777") == 0 and table.cursor_row == 0

    run_async(go())


def test_a_finished_1024_rank_run_replayed_folds_every_rank_into_every_line(tmp_path):
    """Replaying a finished run (20 lines from each of 1,024 ranks: more than a live flood's cap of folded
    lines a second) folds every rank's lines: each fold names all 1,024 ranks, none is marked partial (a
    replay's final state comes only once every file is read, so the replay is known at open, not by it)."""
    now = time.time()
    events = [{"t": now, "kind": "state", "state": "running"}]
    events += [{**rank_started(now, r, 10_000 + r), "node": f"node-{r // 8}"} for r in range(1024)]
    logs = {r: "".join(f"step {s} loss {r / (s + 1):.4f}\n" for s in range(20)) for r in range(1024)}
    run = write_run(tmp_path, events=events, logs=logs, nproc=1024,
                    exit={"state": "succeeded", "exit_code": 0, "t": now + 30})

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "step 19 loss" in text_of(app, "merged"), timeout=120,
                             what=lambda: f"the last step; merged: {text_of(app, 'merged')[-400:]!r}")
            await pilot.pause(0.5)
            steps = [ln for ln in text_of(app, "merged").splitlines() if "] step " in ln]
            assert steps and all(ln.startswith("[r0-1023] step ") for ln in steps), steps[:5]
            assert len(steps) == len(set(steps)) <= 20

    run_async(go())


def test_8_ranks_show_every_line_until_z_folds_them(tmp_path):
    run = run_of(tmp_path, 8)

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "[r7] epoch 3 step 121" in text_of(app, "merged"), what="every rank")
            merged = text_of(app, "merged")
            assert all(f"[r{r}] epoch 3 step 120 loss 0.00{r}" in merged for r in range(8))
            await pilot.press("z")
            await wait_until(pilot, lambda: "[r0-7] epoch 3 step 120" in text_of(app, "merged"), what="folded")
            await pilot.press("z")
            await wait_until(pilot, lambda: "[r6] epoch 3 step 121" in text_of(app, "merged"), what="unfolded")
            # 8 ranks: a tab each, as before; a rank's log is made when its tab is first shown, with its lines
            assert app.query_one("#panes", TabbedContent).tab_count == 9
            assert len(app.query(RichLog)) == 1
            await pilot.press("3")
            await wait_until(pilot, lambda: "epoch 3 step 121 loss 0.003" in text_of(app, "r3"), what="rank 3's lines")
            assert "[r" not in text_of(app, "r3") and len(app.query(RichLog)) == 2

    run_async(go())


def gpu_events(nodes: int, per_node: int, now: float, lost=(), xid=(), idle=()):
    from ddptop.core.model.events import AlarmEvent, GpuEvent

    evs = []
    for n in range(nodes):
        for i in range(per_node):
            r = n * per_node + i
            evs.append(GpuEvent(now, index=i, name="NVIDIA H100", util=3.0 if (n, i) in idle else 97.0,
                                ranks=(r,), node=f"node-{n}", lost=(n, i) in lost, mem_total=80 << 30))
    for n, i in xid:
        evs.append(AlarmEvent(now, type="gpu", id="xid", ranks=(n * per_node + i,), culprits=(n * per_node + i,),
                              message=f"Xid 79 critical error on GPU {i}", node=f"node-{n}"))
    return evs


def test_1024_gpus_show_as_a_grid_with_the_outliers_named_and_8_as_rows(tmp_path):
    from textual.widgets import DataTable

    run = run_of(tmp_path, 8)

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "[r7]" in text_of(app, "merged"), what="the run")
            app.ingest(gpu_events(1, 8, time.time()))
            app._refresh_gpus()
            table = app.query_one("#gpus", DataTable)
            assert table.row_count == 8 and not app.query_one("#gpu-grid", Static).has_class("-on")
            app.ingest(gpu_events(128, 8, time.time(), lost=[(97, 3)], xid=[(12, 5)], idle=[(40, 0)]))
            app._refresh_gpus()
            await pilot.pause(0.1)
            grid = app.query_one("#gpu-grid", Static)
            assert grid.has_class("-on") and table.has_class("-off")
            shown = str(grid.render())
            cells = shown.splitlines()[0]
            assert cells.count("✖") == 1 and cells.count("!") == 1  # a glyph each, not colour alone
            assert "✖ lost: node-97/3 (r779)" in shown and "! Xid: node-12/5 (r101)" in shown
            assert "idle while most are busy: node-40/0 (r320)" in shown
            assert "1024 GPUs on 128 nodes" in shown

    run_async(go())
