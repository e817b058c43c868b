"""The check that fails a UI test when the app could not draw a part of the screen (tests/conftest.py:
the ``ui_errors`` fixture, ``check_no_ui_errors``, applied to every test in tests/ui): an alarm box that
raises while it is drawn is recorded, and the check names it.  (This test asks for ``ui_errors``, so the
error it provokes on purpose does not fail it; it runs the check itself.)"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("textual")

from conftest import check_no_ui_errors  # noqa: E402
from ddptop.core.model.events import AlarmEvent  # noqa: E402
from ddptop.core.run.run_session import Session  # noqa: E402
from ddptop.ui.alarm_box import AlarmBox  # noqa: E402
from ddptop.ui.app import make_app  # noqa: E402
from helpers import wait_until  # noqa: E402
from test_app import SIZE, log_text, make_run, run_async  # noqa: E402


def test_a_part_that_cannot_be_drawn_is_recorded_and_the_check_names_it(tmp_path, monkeypatch, ui_errors):
    def broken(self, model):
        raise RuntimeError("the alarm box went wrong")

    monkeypatch.setattr(AlarmBox, "show", broken)
    run_dir = make_run(tmp_path)

    async def go():
        app = make_app(Session.open(run_dir), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "rank1 step 2" in log_text(app, "merged"), what="the run's lines")
            app.ingest([AlarmEvent(time.time(), type="stall", id="stall-hang", culprits=(1,), message="no step")])
            await wait_until(pilot, lambda: "could not draw the alarm box" in log_text(app, "merged"),
                             what="the app's note about the alarm box")

    run_async(go())
    assert [where for where, _ in ui_errors] == ["the alarm box"]
    with pytest.raises(AssertionError, match="could not draw the alarm box: RuntimeError: the alarm box went wrong"):
        check_no_ui_errors(ui_errors)
    check_no_ui_errors([])  # nothing the app could not draw: no failure
