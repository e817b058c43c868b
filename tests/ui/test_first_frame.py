"""The first frame the command line's UI paints (``make_app(..., first_frame=True)``, as ``ddptop attach`` and a
launch open it): the header, the rank table's rows and the merged log's last lines from the job's first read,
then the full screen in its place with every line exactly once.  Under Pilot: what is shown, never how fast
(the time is ``tests/bench/bench.py frame-tmux``)."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("textual")

from textual.widgets import DataTable, RichLog, Static, TabbedContent  # noqa: E402

from ddptop.core.run.run_session import Session  # noqa: E402
from ddptop.ui.app import DdptopApp, make_app  # noqa: E402
from ddptop.ui.first_frame import FirstFrame  # noqa: E402
from conftest import rank_started, write_run  # noqa: E402
from helpers import wait_until  # noqa: E402

SIZE = (160, 45)
TEST_TIMEOUT = 240


def run_async(coro):
    return asyncio.run(asyncio.wait_for(coro, TEST_TIMEOUT))


def finished_run(tmp_path, nranks: int, lines: int, *, nodes: int = 1, odd: int | None = None):
    now = time.time()
    events = [{"t": now, "kind": "state", "state": "running"}]
    per_node = max(1, nranks // nodes)
    events += [{**rank_started(now, r, 20_000 + r), "node": f"node-{r // per_node}"} for r in range(nranks)]
    logs = {r: "".join(f"rank{r} step {s} loss {r / (s + 1):.4f}\n" for s in range(lines)) for r in range(nranks)}
    if odd is not None:
        logs[odd] += "RuntimeError: the odd rank's last words\n"
    for r in range(nranks):
        events.append({"t": now + 1, "kind": "rank", "rank": r, "local_rank": r, "node": f"node-{r // per_node}",
                       "pid": 20_000 + r, "attempt": 0, "alive": False, "exit_code": 1 if r == odd else 0})
    state = "failed" if odd is not None else "succeeded"
    events.append({"t": now + 2, "kind": "state", "state": state, "exit_code": 1 if odd is not None else 0})
    return write_run(tmp_path, events=events, logs=logs, nproc=nranks,
                     exit={"state": state, "exit_code": 1 if odd is not None else 0, "t": now + 2})


def shown(widget: Static) -> str:
    return str(widget.render())


def merged_text(app) -> str:
    return "\n".join(strip.text for strip in app.query_one("#log-merged", RichLog).lines)


def hold_the_build(monkeypatch) -> list:
    """Keep the full screen from being built until the test lets it (to look at the first frame alone)."""
    gate: list = []
    real = DdptopApp._build

    async def held(self):
        if not gate:  # (asked again shortly; the app goes on answering messages and keys meanwhile)
            self.set_timer(0.02, self._build)
            return
        await real(self)

    monkeypatch.setattr(DdptopApp, "_build", held)
    return gate


def test_the_first_frame_shows_the_table_and_the_last_lines_and_the_full_screen_gets_each_line_once(
        tmp_path, monkeypatch):
    run = finished_run(tmp_path, 3, 40, odd=2)
    gate = hold_the_build(monkeypatch)

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02, first_frame=True)
        async with app.run_test(size=SIZE) as pilot:
            ff = await wait_until(pilot, lambda: app.query_one(FirstFrame), what="the first frame")
            await wait_until(pilot, lambda: "FAILED" in shown(ff.query_one("#ff-header")), what="the header")
            table = shown(ff.query_one("#ff-table", Static)).splitlines()
            assert "last output" in table[0] and "rank" in table[0]
            rows = [ln.split() for ln in table[1:]]
            assert [r[0] for r in rows] == ["0", "1", "2"] and [r[3] for r in rows] == ["20000", "20001", "20002"]
            log = shown(ff.query_one("#ff-log", Static)).splitlines()
            # the merged log's last lines as the full screen writes them: the rank's prefix, then the job's end
            assert "[r2] RuntimeError: the odd rank's last words" in log
            assert "[r2] rank2 step 39 loss" in "\n".join(log) and log[-1].startswith("[ddptop] job failed")
            assert "Quit" in shown(ff.query_one("#ff-keys", Static))
            assert not app.query(DataTable)  # (nothing of the full screen yet)
            await pilot.press("2")  # a key for the full screen is refused until it is there, and breaks nothing
            gate.append(True)
            # (the full screen writes a screenful first, then the whole pane: wait for its first line)
            await wait_until(pilot, lambda: not app.query(FirstFrame) and "[r0] rank0 step 0 loss" in merged_text(app),
                             what=lambda: f"the full screen in the first frame's place: {merged_text(app)[:300]!r}")
            merged = merged_text(app)
            for r in range(3):  # every line once: the first read reached the panes, and the model, once
                assert merged.count(f"[r{r}] rank{r} step 7 loss") == 1
                assert app.model.ranks[r].lines == 40 + (r == 2)
            assert merged.count("job failed") == 1
            table_widget = app.query_one("#ranks", DataTable)
            assert table_widget.row_count == 3
            await pilot.press("2")
            await wait_until(pilot, lambda: app.query_one("#panes", TabbedContent).active == "pane-r2",
                             what="rank 2's pane on its key")

    run_async(go())


def test_a_launch_with_nothing_read_yet_gets_the_full_screen(tmp_path):
    """A job that has written nothing (a launch's first moment): the first frame is the header and an empty
    table, and the full screen replaces it without waiting for lines."""
    now = time.time()
    run = write_run(tmp_path, events=[{"t": now, "kind": "state", "state": "running"}], logs={}, nproc=2)

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02, first_frame=True)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: not app.query(FirstFrame) and app.query_one("#ranks", DataTable),
                             what="the full screen")
            assert "RUNNING" in str(app.query_one("#header").render())

    run_async(go())


def test_1024_ranks_on_128_nodes_first_frame_then_every_line_folded_once(tmp_path, monkeypatch):
    """At 1,024 ranks the first frame shows the table's first screenful (10 rows) and the last lines; the full screen then
    folds every rank's lines as a replay does (each line names all 1,024 ranks, once)."""
    run = finished_run(tmp_path, 1024, 10, nodes=128)
    gate = hold_the_build(monkeypatch)

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02, first_frame=True)
        async with app.run_test(size=SIZE) as pilot:
            ff = await wait_until(pilot, lambda: app.query_one(FirstFrame), what="the first frame")
            await wait_until(pilot, lambda: "rank" in shown(ff.query_one("#ff-table", Static)), what="the table")
            assert len(shown(ff.query_one("#ff-table", Static)).splitlines()) == 11  # its header and 10 rows
            assert "1024" in shown(ff.query_one("#ff-header"))
            gate.append(True)
            await wait_until(pilot, lambda: not app.query(FirstFrame), what="the full screen")
            await wait_until(pilot, lambda: " step 9 loss" in merged_text(app), timeout=120,
                             what=lambda: f"the last step; merged: {merged_text(app)[-400:]!r}")
            await pilot.pause(0.5)
            steps = [ln.split(" loss")[0] for ln in merged_text(app).splitlines() if "] rank" in ln]
            # (the alike lines of all ranks: "rank7 step 3 loss ..." masks to one shape per step)
            assert steps and all(ln.startswith("[r0-1023] rank") for ln in steps), steps[:5]
            assert len(steps) == len(set(steps)) <= 10

    run_async(go())


def test_the_full_screen_takes_the_focus_and_shows_its_keys(tmp_path):
    """The screen's first focus went when it held only the first frame: the rank table takes it once the full
    screen is there (as when the screen is built at once), so the arrows and enter work, and the footer shows
    its keys, also for a job with no rank yet."""
    for run in (finished_run(tmp_path / "a", 3, 5),
                write_run(tmp_path / "b", events=[{"t": time.time(), "kind": "state", "state": "running"}], logs={})):
        async def go():
            app = make_app(Session.open(run), poll_interval=0.02, first_frame=True)
            async with app.run_test(size=SIZE) as pilot:
                await wait_until(pilot, lambda: not app.query(FirstFrame) and app.focused is not None,
                                 what=lambda: f"the focus (now {app.focused!r})")
                assert app.focused is app.query_one("#ranks", DataTable)
                await wait_until(pilot, lambda: "Quit" in " ".join(str(k.render()) for k in app.query("FooterKey")),
                                 what="the footer's keys")

        run_async(go())


def test_quitting_a_finished_run_while_its_first_read_is_taken_quits_cleanly(tmp_path):
    """q typed while the first read is taken (the terminal's thread posts it meanwhile): a finished run's app ends
    at once, and the full screen is not built into the closing screen (no traceback, its own return value)."""
    from textual import events

    session = Session.open(finished_run(tmp_path, 3, 40))
    app = make_app(session, poll_interval=0.02, first_frame=True)
    real_poll, polls = session.poll, []

    def poll(*a, **k):
        polls.append(1)
        if len(polls) == 1:
            app.post_message(events.Key("q", "q"))  # (typed while the run is read)
        return real_poll(*a, **k)

    session.poll = poll  # type: ignore[method-assign]

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.return_value is not None, what="the app's end")
            await pilot.pause(0.3)

    run_async(go())
    assert app.return_value == "finished" and app.return_code == 0


def test_a_replay_read_slowly_folds_every_rank_into_each_line_with_the_first_frame(tmp_path, monkeypatch):
    """The first frame's read applies a small run's end to the model before its lines reach the panes: the folds
    must still wait for the last slice (a loaded machine: slices 1.5 s apart, more than a fold's hold)."""
    from ddptop.core.model.events import LogBatch
    from ddptop.ui.event_feed import EventFeed, EventsReady

    def slow_slices(self, _msg):  # (the app's own intake, in slices of 200 lines 1.5 s apart)
        with self._inbox_lock:
            events, taken = [], 0
            for ev in self._inbox:
                k = len(ev) if isinstance(ev, LogBatch) else 1
                if events and taken + k > 200:
                    break
                events.append(ev)
                taken += k
            self._inbox = self._inbox[len(events):]
            self._posted = more = bool(self._inbox)
        if more:
            self.set_timer(1.5, lambda: self.post_message(EventsReady()))
        if events:
            self.ingest(events)

    monkeypatch.setattr(EventFeed, "on_events_ready", slow_slices)
    run = finished_run(tmp_path, 16, 40, nodes=2)

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02, first_frame=True)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: " step 39 loss" in merged_text(app) and not app._inbox, timeout=120,
                             what="the last slice")
            await pilot.pause(1.5)
            steps = [ln.split(" loss")[0] for ln in merged_text(app).splitlines() if "] rank" in ln]
            assert steps and all(ln.startswith("[r0-15] rank") for ln in steps), steps[:6]
            assert len(steps) == 40

    run_async(go())
