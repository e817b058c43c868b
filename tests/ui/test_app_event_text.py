"""One event-to-text function for headless mode and the UI: both say the same words.

(The words themselves: tests/unit/test_event_text.py.)"""

import asyncio
import time

from ddptop.core.analysis.event_text import describe
from ddptop.core.model.events import AlarmEvent, NoteEvent, StacksEvent, StateEvent


def test_the_ui_writes_the_same_words_into_its_merged_log(tmp_path):
    """An alarm, a note, a state change and stacks reach the UI's merged log in
    the words headless mode prints (without its == decoration)."""
    from ddptop.core.run.run_session import Session
    from ddptop.ui.app import make_app
    from helpers import wait_until
    from test_app import log_text, make_run

    run_dir = make_run(tmp_path)
    t = time.time()
    events = [AlarmEvent(t, type="stall", id="stall-hot", message="Hot stall. Odd rank out: rank 1.", culprits=(1,)),
              NoteEvent(t, "warning", "py-spy is missing"),
              StacksEvent(t, ranks=(0, 1), samples=2, span=1.0, hung=True, summary="hung: rank 1 is in main"),
              StateEvent(t, state="failed", exit_code=1, message="rank 1 died")]

    async def go():
        app = make_app(Session.open(run_dir), poll_interval=0.02)
        async with app.run_test(size=(200, 40)) as pilot:
            app.ingest(events)
            await wait_until(pilot, lambda: "job failed" in log_text(app, "merged"), what="the state line")
            text = log_text(app, "merged").replace("\n", "")  # (long lines wrap)
            for ev in events:
                assert describe(ev).line() in text, describe(ev).line()

    asyncio.run(go())
