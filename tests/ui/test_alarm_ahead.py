"""An alarm goes ahead of the lines the interface has not shown yet (issue 35:
at 1,024 ranks the TUI ran seconds behind the lines, and the hang's alarm,
queued behind them, showed 19-21 s after the missed step)."""

from __future__ import annotations

import pytest

pytest.importorskip("textual")

from ddptop.core.model.events import AlarmEvent, GpuEvent, LogBatch, RankEvent  # noqa: E402
from ddptop.core.run.run_session import Session  # noqa: E402
from ddptop.ui.alarm_box import AlarmBox  # noqa: E402
from ddptop.ui.app import make_app  # noqa: E402
from ddptop.ui.event_feed import INGEST_SLICE, queue_events  # noqa: E402
from helpers import wait_until  # noqa: E402
from test_app import SIZE, SpySession, make_run, run_async  # noqa: E402


def test_the_inbox_puts_an_alarm_ahead_of_the_readings_queued_but_never_of_a_rank_or_state():
    rank = RankEvent(1.0, rank=3, alive=True)
    lines = [LogBatch(1.0, rank=r, texts=(f"step {r}",)) for r in range(3)]
    gpu = GpuEvent(1.0, index=0, util=100.0)
    alarm = AlarmEvent(2.0, type="stall", id="stall-hot", culprits=(3,))
    inbox: list = []
    queue_events(inbox, [lines[0], rank, lines[1], gpu])
    queue_events(inbox, [lines[2], alarm, LogBatch(2.0, rank=0, texts=("after",))])
    assert inbox[:3] == [lines[0], rank, alarm]
    assert inbox[3:6] == [lines[1], gpu, lines[2]] and inbox[6].texts == ("after",)


class Flood(SpySession):
    """The run's own events, then 3 slices' worth of lines and an alarm, in one poll."""

    def __init__(self, session, n: int):
        super().__init__(session)
        self.n, self.sent = n, False

    def poll(self):
        evs = self._s.poll()
        if not self.sent and any(isinstance(e, RankEvent) for e in evs):
            self.sent = True
            evs = evs + [LogBatch(5.0, rank=i % 2, path=f"x{i % 2}", texts=tuple(f"line {i}.{k}" for k in range(100)))
                         for i in range(self.n // 100)]
            evs.append(AlarmEvent(6.0, type="stall", id="stall-hot", culprits=(1,), ranks=(0, 1),
                                  message="Hot stall: rank 1 stopped stepping."))
        return evs


def test_an_alarm_behind_a_flood_of_lines_is_shown_before_them(tmp_path):
    run_dir = make_run(tmp_path)
    n = 3 * INGEST_SLICE
    session = Flood(Session.open(run_dir), n)

    async def go():
        app = make_app(session, poll_interval=0.02)
        ingested: list[tuple[int, bool]] = []  # (lines ingested before this batch, an alarm in it)
        real = app.ingest

        lines_before = [0]

        def counting(events):
            has_alarm = any(isinstance(e, AlarmEvent) for e in events)
            ingested.append((lines_before[0], has_alarm))
            lines_before[0] += sum(len(e) for e in events if isinstance(e, LogBatch))
            return real(events)

        app.ingest = counting
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.query_one("#alarms", AlarmBox).has_class("-on"), what="the alarm")
            await wait_until(pilot, lambda: lines_before[0] >= n, what="every line")
        at = next(before for before, has in ingested if has)
        assert at < INGEST_SLICE, (at, n)  # with the first slice, not after the 60,000 lines queued before it
        assert app.model.alarms and app.model.alarms[-1].culprits == (1,)

    run_async(go())
