"""The UI attached by pid to a job ddptop did not launch (a one-rank job started by the test, killed at
teardown; the real torchrun jobs are tests/integration/test_attach_pid_e2e.py)."""

from __future__ import annotations

import pytest

from conftest import alive
from foreign_jobs import procs, start_lone_rank  # noqa: F401  (procs: a fixture)
from ddptop.core.sessions.pid import ForeignSession


# -- a one-rank job (no torch): the session object and the UI -----------------------


def test_ui_refuses_to_stop_or_relaunch_a_foreign_job(procs, tmp_path):
    pytest.importorskip("textual")
    import asyncio

    from helpers import wait_until
    from test_app_relaunch import log_text

    from ddptop.ui.app import make_app
    from ddptop.ui.dialogs import QuitScreen

    p, _ = start_lone_rank(procs, tmp_path)
    s = ForeignSession(p.pid, gpu="none")

    def merged(app) -> str:
        return log_text(app, "merged")

    async def until(pilot, pred, what):
        await wait_until(pilot, pred, timeout=20.0, what=what)

    async def go():
        app = make_app(s, poll_interval=0.02)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: "step " in merged(app), "lines")
            await pilot.press("q")
            await until(pilot, lambda: isinstance(app.screen, QuitScreen), "the quit dialog")
            await pilot.press("s")  # stop: refused, the app keeps watching
            await until(pilot, lambda: "will not stop" in merged(app), "the refusal in the log")
            assert app.return_value is None and not app._stopping
            await pilot.press("r")
            await until(pilot, lambda: "relaunch refused" in merged(app), "the relaunch refusal")
            assert "ENDED" not in str(app.query_one("#header").render())
            await pilot.press("q")
            await until(pilot, lambda: isinstance(app.screen, QuitScreen), "the quit dialog again")
            await pilot.click("#detach")
            await until(pilot, lambda: app.return_value is not None, "the app to exit")
        return app.return_value

    try:
        assert asyncio.run(asyncio.wait_for(go(), 60)) == "detach"
        assert alive(p.pid)
    finally:
        s.close()
