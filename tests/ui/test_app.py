"""Pilot tests of the Textual UI, on hand-made run directories (no torchrun)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

pytest.importorskip("textual")

from textual.widgets import DataTable, RichLog, TabbedContent  # noqa: E402

from ddptop.core.model.events import AlarmEvent, ProgressEvent, RankEvent, StateEvent  # noqa: E402
from ddptop.core.model.session_protocol import CommandResult  # noqa: E402
from ddptop.core.run.run_session import Session  # noqa: E402
from ddptop.ui import logview  # noqa: E402
from ddptop.ui.app import make_app  # noqa: E402
from ddptop.ui.dialogs import QuitScreen  # noqa: E402
from ddptop.ui.theme_files import load_themes  # noqa: E402
from conftest import rank_started, write_run
from helpers import logs, wait_until

TEST_TIMEOUT = 120  # seconds per test: a guard against a hung app (a loaded 2-core machine under -n 4 took over 30 s)
SIZE = (120, 40)


def run_async(coro, timeout=TEST_TIMEOUT):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def make_run(root: Path, *, finished: bool = False, lines: int = 3) -> Path:
    """A run directory as the supervisor would leave it: meta, events, rank logs."""
    now = time.time()
    events = [{"t": now, "kind": "state", "state": "running"}]
    events += [rank_started(now, r, pid) for r, pid in ((0, 4242), (1, 4343))]
    logs = {r: "".join(f"rank{r} step {i} loss 0.{i}\n" for i in range(lines)) for r in (0, 1)}
    logs[1] += "\x1b[31mred warning from one\x1b[0m\n"
    exit = None
    if finished:
        for r in (0, 1):
            events.append({"t": now + 1, "kind": "rank", "rank": r, "local_rank": r, "node": "h",
                           "pid": 4242 + 101 * r, "attempt": 0, "alive": False, "exit_code": 0})
        events.append({"t": now + 2, "kind": "state", "state": "succeeded", "exit_code": 0})
        exit = {"state": "succeeded", "exit_code": 0, "t": now + 2}
    return write_run(root, run_id="test-run-1", events=events, logs=logs, env_set={"PYTHONUNBUFFERED": "1"},
                     torchrun_log="torchrun says hello\n", exit=exit)


class SpySession:
    """A real Session, with stop() recorded instead of signalling anything."""

    def __init__(self, session):
        self._s = session
        self.stop_calls = 0

    def stop(self):
        self.stop_calls += 1
        return CommandResult(True)

    def __getattr__(self, name):
        return getattr(self._s, name)


def log_text(app, key: str) -> str:
    log = app.query_one(f"#log-{key}", RichLog)
    return "\n".join(strip.text for strip in log.lines)


def active_pane(app) -> str:
    return app.query_one("#panes", TabbedContent).active


def test_table_and_merged_pane(tmp_path):
    run_dir = make_run(tmp_path)

    async def go():
        app = make_app(Session.open(run_dir), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one("#ranks", DataTable)
            await wait_until(pilot, lambda: table.row_count == 2 and "rank1 step 2" in log_text(app, "merged"),
                             what="two ranks and their lines")
            rows = [[str(c) for c in table.get_row(k)] for k in ("0", "1")]
            assert rows[0][0] == "0" and "4242" in rows[0]
            assert rows[1][0] == "1" and "4343" in rows[1]
            assert any("alive" in c for c in rows[0])
            assert rows[0][7] == "2"  # last step parsed from "step 2"
            merged = log_text(app, "merged")
            assert "[r0] rank0 step 0 loss 0.0" in merged
            assert "[r1] rank1 step 1 loss 0.1" in merged
            assert "[torchrun] torchrun says hello" in merged
            # ANSI colour is rendered, not shown as escape codes
            assert "[r1] red warning from one" in merged
            assert "\x1b" not in merged and "[31m" not in merged
            header = str(app.query_one("#header").render())
            assert "test-run-1" in header and "RUNNING" in header

    run_async(go())


def test_rank_pane_and_filter(tmp_path):
    run_dir = make_run(tmp_path, lines=5)

    async def go():
        app = make_app(Session.open(run_dir), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "rank1 step 4" in log_text(app, "merged"), what="lines")
            await pilot.press("1")
            await wait_until(pilot, lambda: active_pane(app) == "pane-r1", what="rank 1's pane")
            await wait_until(pilot, lambda: "rank1 step 4" in log_text(app, "r1"), what="rank 1's lines in its pane")
            r1 = log_text(app, "r1")
            assert "rank1 step 0" in r1 and "rank1 step 4" in r1
            assert "rank0" not in r1 and "[r1]" not in r1
            # tab goes on to the next pane (torchrun), shift+tab back
            await pilot.press("tab")
            await wait_until(pilot, lambda: active_pane(app) == "pane-torchrun", what="the torchrun pane")
            await pilot.press("shift+tab", "shift+tab")
            await wait_until(pilot, lambda: active_pane(app) == "pane-r0", what="rank 0's pane")
            await pilot.press("m")
            await wait_until(pilot, lambda: active_pane(app) == "pane-merged", what="the merged pane")

            # filter: case-insensitive, applied to merged and rank panes (what was shown
            # before the filter is gone once it is applied: waiting for that is waiting for the filter)
            await pilot.press("slash")
            await pilot.press(*"STEP 3")
            await wait_until(pilot, lambda: "step 2" not in log_text(app, "merged")
                             and "[r0] rank0 step 3" in log_text(app, "merged"), what="the filter applied")
            merged = log_text(app, "merged")
            assert "[r0] rank0 step 3" in merged and "[r1] rank1 step 3" in merged
            assert "step 2" not in merged and "torchrun says" not in merged
            await pilot.press("enter", "1")  # keep the filter, look at rank 1
            await wait_until(pilot, lambda: active_pane(app) == "pane-r1" and "step 4" not in log_text(app, "r1")
                             and "rank1 step 3" in log_text(app, "r1"), what="rank 1's pane, filtered")
            # esc clears the filter
            await pilot.press("slash", "escape")
            await wait_until(pilot, lambda: "rank1 step 0" in log_text(app, "r1")
                             and "rank1 step 4" in log_text(app, "r1"), what="rank 1's pane, the filter cleared")

    run_async(go())


def test_live_tailing_and_transient(tmp_path):
    run_dir = make_run(tmp_path)
    out0 = run_dir / "logs" / "x_abc" / "attempt_0" / "0" / "stdout.log"

    async def go():
        app = make_app(Session.open(run_dir), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "rank0 step 2" in log_text(app, "merged"), what="first lines")
            with open(out0, "a") as f:
                f.write("appended while running step 77\n")
            await wait_until(pilot, lambda: "[r0] appended while running step 77" in log_text(app, "merged"),
                             what="appended line")
            table = app.query_one("#ranks", DataTable)
            await wait_until(pilot, lambda: str(table.get_row("0")[7]) == "77", what="step 77 in table")
            # an in-place progress bar: shown as the live line, not appended
            with open(out0, "a") as f:
                f.write("progress 10%\rprogress 50%")
            live = app.query_one("#live-merged")
            await wait_until(pilot, lambda: "progress 50%" in str(live.render()), what="transient line")
            assert "progress" not in log_text(app, "merged")
            with open(out0, "a") as f:
                f.write("\rprogress 100%\n")
            await wait_until(pilot, lambda: "[r0] progress 100%" in log_text(app, "merged"), what="completed line")
            await wait_until(pilot, lambda: "progress" not in str(live.render()), what="live line cleared")

    run_async(go())


def test_the_odd_rank_out_is_marked_and_brought_into_view(tmp_path):
    """40 ranks do not fit in the rank table: the rank a stall alarm names is
    marked, listed first and its row in view; once every rank steps again,
    unmarked and back in rank order."""
    now = time.time()
    events = [{"t": now, "kind": "state", "state": "running"}] + [rank_started(now, r, 5000 + r) for r in range(40)]
    run = write_run(tmp_path, run_id="forty", events=events, logs={r: f"rank{r} step 1\n" for r in range(40)}, nproc=40)

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one("#ranks", DataTable)
            await wait_until(pilot, lambda: table.row_count == 40, what="40 rows")
            assert table.cursor_row == 0
            t = time.time()
            app.ingest([AlarmEvent(t, type="stall", id="stall", ranks=tuple(range(40)), culprits=(33,),
                                   message="rank 33 is stuck")])
            app._refresh_table()
            await wait_until(pilot, lambda: "odd one out" in str(table.get_cell("33", "state")),
                             what="rank 33 marked")
            assert table.cursor_row == table.get_row_index("33") == 0  # the odd one out first
            assert [table.get_row_at(i)[0] for i in (1, 2)] == [0, 1]  # then the others, by rank
            assert not any("odd one out" in str(table.get_cell(str(r), "state")) for r in range(40) if r != 33)
            shown = lambda: table.scrollable_content_region.height  # noqa: E731
            at = table.get_row_index("33")
            await wait_until(pilot, lambda: table.scroll_y <= at < table.scroll_y + shown(),
                             what=lambda: f"rank 33's row scrolled onto the screen (scroll_y {table.scroll_y}, "
                                          f"{shown()} rows shown, cursor {table.cursor_row})")
            app.ingest([ProgressEvent(t + 1, rank=r, step=2, source="hook") for r in range(40)])
            app._refresh_table()
            await wait_until(pilot, lambda: "odd one out" not in str(table.get_cell("33", "state")),
                             what="the mark gone once every rank stepped")
            assert table.get_row_index("33") == 33

    run_async(go())


def test_many_lines_are_bounded(tmp_path):
    run_dir = make_run(tmp_path)

    async def go():
        app = make_app(Session.open(run_dir), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            # the first frame painted: from now on a pane renders what is new (before it, a screenful, then whole);
            # a slow first frame (a loaded machine) would otherwise turn the burst's tick below into a re-render
            await wait_until(pilot, lambda: app.logs.first_frame_done and "rank0 step 2" in log_text(app, "merged"),
                             what="first lines, and the first frame painted")
            now = time.time()
            app.ingest([logs(now, 0, *(f"flood {i}" for i in range(50_000))),
                        logs(now, 0, "bad \x00\x07 control \x1b[999;;m chars " + "x" * 100_000)])
            # widgets are written at most every FLUSH_EVERY: wait for the batch's last line
            await wait_until(pilot, lambda: "flood 49999" in log_text(app, "merged"), what="the flood's last line")
            merged = log_text(app, "merged")
            assert "lines not shown" in merged
            assert len(app.query_one("#log-merged", RichLog).lines) <= logview.RERENDER_LINES + 60
            assert len(app.logs.buffers["r0"].lines) <= 20_000
            # an ordinary big batch: at most TICK_LINES written, plus one notice
            log = app.query_one("#log-merged", RichLog)
            before = len(log.lines)
            app.ingest([logs(now, 1, *(f"burst {i}" for i in range(3000)))])
            await wait_until(pilot, lambda: "burst 2999" in log_text(app, "merged"), what="the burst's last line")
            assert f"{3000 - logview.TICK_LINES:,} lines not shown" in log_text(app, "merged")
            assert len(log.lines) - before <= logview.TICK_LINES + 1 or len(log.lines) == logview.LOG_MAX_LINES

    run_async(go())


def test_quit_detach_does_not_stop(tmp_path):
    run_dir = make_run(tmp_path)
    spy = SpySession(Session.open(run_dir))

    async def go():
        app = make_app(spy, poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "rank0 step 2" in log_text(app, "merged"), what="lines")
            await pilot.press("q")
            await wait_until(pilot, lambda: isinstance(app.screen, QuitScreen), what="the quit dialog")
            await pilot.press("escape")  # cancel
            await wait_until(pilot, lambda: not isinstance(app.screen, QuitScreen), what="the quit dialog closed")
            assert app.return_value is None
            await pilot.press("q")
            await wait_until(pilot, lambda: isinstance(app.screen, QuitScreen), what="the quit dialog again")
            await pilot.click("#detach")
            await wait_until(pilot, lambda: app.return_value is not None, what="the app to exit")
        return app.return_value

    assert run_async(go()) == "detach"
    assert spy.stop_calls == 0


def test_quit_stop_calls_stop(tmp_path):
    run_dir = make_run(tmp_path)
    spy = SpySession(Session.open(run_dir))

    async def go():
        app = make_app(spy, poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "rank0 step 2" in log_text(app, "merged"), what="lines")
            await pilot.press("ctrl+c")
            await wait_until(pilot, lambda: isinstance(app.screen, QuitScreen), what="the quit dialog")
            await pilot.click("#stop")
            await wait_until(pilot, lambda: app.return_value is not None, what="exit")
        return app.return_value

    assert run_async(go()) == "stop"
    assert spy.stop_calls == 1


def test_quit_finished_run(tmp_path):
    run_dir = make_run(tmp_path, finished=True)
    spy = SpySession(Session.open(run_dir))

    async def go():
        app = make_app(spy, poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.model.finished, what="final state")
            header = str(app.query_one("#header").render())
            assert "SUCCEEDED" in header and "exit 0" in header
            row = [str(c) for c in app.query_one("#ranks", DataTable).get_row("1")]
            assert "exited 0" in row
            await pilot.press("q")
            await wait_until(pilot, lambda: app.return_value is not None, what="the app to exit")
        return app.return_value

    assert run_async(go()) == "finished"
    assert spy.stop_calls == 0


def test_help_and_themes(tmp_path):
    run_dir = make_run(tmp_path, finished=True)
    names = {t.name for t in load_themes()}
    assert {"ddptop-dark", "ddptop-light"} <= names

    async def go():
        app = make_app(Session.open(run_dir), theme="ddptop-light", poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            assert app.theme == "ddptop-light"
            assert "ddptop-dark" in app.available_themes
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: type(app.screen).__name__ == "HelpScreen", what="the help screen")
            await pilot.press("escape")
            await wait_until(pilot, lambda: type(app.screen).__name__ != "HelpScreen", what="the help screen closed")
            app.theme = "ddptop-dark"
            await pilot.pause()
        app2 = make_app(Session.open(run_dir), theme="no-such-theme", poll_interval=0.02)
        async with app2.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert app2.theme == "textual-dark"  # (chosen when the app starts: nothing to wait for)

    run_async(go())


def test_default_theme_is_ddptop_dark(tmp_path):
    run_dir = make_run(tmp_path, finished=True)

    async def go():
        app = make_app(Session.open(run_dir))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            return app.theme

    assert run_async(go()) == "ddptop-dark"


def test_bad_events_do_not_crash(tmp_path):
    run_dir = make_run(tmp_path)

    async def go():
        app = make_app(Session.open(run_dir), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "rank0 step 2" in log_text(app, "merged"), what="the run's lines")
            now = time.time()
            app.ingest([
                logs(now, 7, "\udcff surrogate \ufffd"),
                logs(now, None, "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ \x1b[1mbold", stream="torchrun"),
                RankEvent(now, rank=3, local_rank=1, node="other", pid=None, attempt=1, alive=True),
                StateEvent(now, state="running"),
            ])
            await wait_until(pilot, lambda: "r7" in app.logs.buffers and "r3" in app.logs.buffers, what="panes for ranks 7 and 3")
            assert app.model.attempt == 1
            await wait_until(pilot, lambda: "surrogate" in log_text(app, "merged")
                             and "link bold" in log_text(app, "merged"), what="the odd lines, drawn")
            await pilot.press("7")
            await wait_until(pilot, lambda: active_pane(app) == "pane-r7", what="rank 7's pane")

    run_async(go())


def test_a_row_that_cannot_be_drawn_says_so_once_and_the_others_go_on(tmp_path, monkeypatch, ui_errors):
    """A failure while drawing one rank's row (or the header) is a note in the
    log, once, not a row frozen in silence; the other rows keep updating."""
    import ddptop.ui.rank_rows as table_mod

    real = table_mod.rank_cells

    def broken_for_rank_1(info, finished, th):
        if info.pid == 4343:
            raise ValueError("a cell for rank 1 went wrong")
        return real(info, finished, th)

    monkeypatch.setattr(table_mod, "rank_cells", broken_for_rank_1)
    run_dir = make_run(tmp_path)

    async def go():
        app = make_app(Session.open(run_dir), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one("#ranks", DataTable)
            await wait_until(pilot, lambda: "could not draw rank 1's row" in log_text(app, "merged"),
                             what="the note about rank 1's row")
            await wait_until(pilot, lambda: table.row_count >= 1 and str(table.get_row("0")[7]) == "2",
                             what="rank 0's row, up to date")
            app.ingest([logs(time.time(), 0, "step 9 loss 0.1")])
            await wait_until(pilot, lambda: str(table.get_row("0")[7]) == "9", what="rank 0's row moving on")
            merged = log_text(app, "merged")
            assert merged.count("could not draw rank 1's row: ValueError: a cell for rank 1") == 1

    run_async(go())
    assert {where for where, _ in ui_errors} == {"rank 1's row"}  # (said on purpose: ui_errors is checked here)
