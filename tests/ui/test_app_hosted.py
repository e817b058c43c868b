"""The TUI fed by a session read in a process of its own (what `ddptop attach` gives it): the job shows as it
does read in process, lines written live reach the panes, and a reading process that dies is said."""

from __future__ import annotations

import asyncio
import functools
import os
import signal

import pytest

pytest.importorskip("textual")

from textual.widgets import DataTable  # noqa: E402

from ddptop.core.sessions.factory import open_local  # noqa: E402
from ddptop.core.sessions.hosted import HostedSession  # noqa: E402
from ddptop.ui.alarm_box import AlarmBox  # noqa: E402
from ddptop.ui.app import make_app  # noqa: E402
from helpers import wait_until as _wait_until
from made_runs import hung_run, live_run, rank_log
from test_app_relaunch import header_text, log_text  # noqa: E402

SIZE = (140, 45)
wait_until = functools.partial(_wait_until, timeout=60.0)


def flat(text: str) -> str:
    """The log's text with its wrapped lines joined."""
    return " ".join(text.split())


def run_async(coro, timeout=180):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_a_stopped_run_read_in_its_own_process_shows_its_alarm_and_ranks(tmp_path):
    run, _ = hung_run(tmp_path)
    session = HostedSession.start(functools.partial(open_local, str(run))).session

    async def go():
        app = make_app(session, poll_interval=0.05)
        async with app.run_test(size=SIZE) as pilot:
            box = app.query_one("#alarms", AlarmBox)
            table = app.query_one("#ranks", DataTable)
            await wait_until(pilot, lambda: box.has_class("-on") and table.row_count == 2 and app.model.finished
                             and "STOPPED" in header_text(app), what="the alarm, both ranks and the end")
            assert "culprit: r1" in str(box.render())
            assert "stopped by ddptop: the job stalled" in log_text(app, "merged")

    try:
        run_async(go())
    finally:
        session.close()


def test_lines_written_live_reach_the_view_and_a_dead_reader_is_said(tmp_path, ui_errors):
    run = live_run(tmp_path)
    session = HostedSession.start(functools.partial(open_local, str(run))).session

    async def go():
        app = make_app(session, poll_interval=0.05)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "[r1] step 1 loss 0.6" in log_text(app, "merged"), what="the first lines")
            with open(rank_log(run, 1), "a") as f:
                f.write("step 2 loss 0.4\n")
            await wait_until(pilot, lambda: "[r1] step 2 loss 0.4" in log_text(app, "merged"), what="the new line")
            os.kill(session.pid, signal.SIGKILL)
            await wait_until(pilot, lambda: "reading the job failed: HostedError" in flat(log_text(app, "merged"))
                             and "(exit code -9)" in flat(log_text(app, "merged")),
                             what="the reading process's death, said")

    try:
        run_async(go())
    finally:
        session.close()
