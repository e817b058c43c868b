"""A rank's earlier lines, when its pane no longer holds them (a large job's rank panes share one budget, each
keeping its newest lines): the pane says how many are not shown, and ``L`` brings them back a thousand at a
time, read back from the journal, down to the rank's first line.  The budget is made small here so that two
ranks show what 1,024 would (the mechanism is the same); what is shown, never how fast."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("textual")

from textual.widgets import RichLog  # noqa: E402

from ddptop.core.run.run_session import Session  # noqa: E402
from ddptop.core.sources.log_tailer import Tailer, read_back  # noqa: E402
from ddptop.ui import log_panes  # noqa: E402
from ddptop.ui.app import make_app  # noqa: E402
from conftest import rank_started, write_run  # noqa: E402
from helpers import wait_until  # noqa: E402

LINES = 3_000


def text_of(app, key: str) -> list[str]:
    return [strip.text for strip in app.query_one(f"#log-{key}", RichLog).lines]


def test_earlier_lines_come_back_from_the_journal(tmp_path, monkeypatch):
    monkeypatch.setattr(log_panes, "RANK_LINES_BUDGET", 2_000)  # 1,000 lines a rank pane, of 3,000
    monkeypatch.setattr(log_panes, "RANK_LINES_MIN", 100)
    now = time.time()
    events = [{"t": now, "kind": "state", "state": "running"}] + [rank_started(now, r, 10_000 + r) for r in (0, 1)]
    logs = {r: "".join(f"rank {r} line {i} caf\u00e9\n" for i in range(LINES)) for r in (0, 1)}
    run = write_run(tmp_path, events=events, logs=logs, nproc=2)
    # rank 1's two warnings on stderr, early: its pane holds none of them once its stdout has filled it
    (run / "logs" / "x_abc" / "attempt_0" / "1" / "stderr.log").write_text("warning A\nwarning B\n")

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02)
        async with app.run_test(size=(160, 45)) as pilot:
            await wait_until(pilot, lambda: "r1" in app.logs.tabs, timeout=60, what="rank 1's tab")
            await pilot.press("1")  # rank 1's pane
            await wait_until(pilot, lambda: app.logs.active_key() == "r1", timeout=10, what="rank 1's pane shown")
            await wait_until(pilot, lambda: f"rank 1 line {LINES - 1} café" in text_of(app, "r1"), timeout=60,
                             what="rank 1's last line")
            head = " ".join(s.strip() for s in text_of(app, "r1")[:3])
            assert "… 2,002 earlier" in head and "L shows earlier ones" in head, head  # (2,000 of stdout, 2 of stderr)
            lines = [s for s in text_of(app, "r1") if s.startswith("rank 1 line")]
            assert lines[0] == "rank 1 line 2000 café" and len(lines) == 1_000, lines[:2]
            log = app.query_one("#log-r1", RichLog)
            await pilot.press("L")  # more, read back from the journal: the view goes to them
            await wait_until(pilot, lambda: "read back from the journal" in " ".join(s.strip() for s in text_of(app, "r1")),
                             timeout=10, what="the lines read back")
            await wait_until(pilot, lambda: log.scroll_y == 0, timeout=10, what="the view at the earlier lines")
            for _ in range(6):  # on to the rank's first line
                if "rank 1 line 0 café" in text_of(app, "r1") and "warning A" in text_of(app, "r1"):
                    break
                await pilot.press("L")
                await pilot.pause(0.3)
            shown = text_of(app, "r1")
            lines = [s for s in shown if s.startswith("rank 1 line")]
            assert lines == [f"rank 1 line {i} café" for i in range(LINES)]  # every line once, in order
            assert shown.count("warning A") == 1 and shown.count("warning B") == 1, [s for s in shown if "warn" in s]
            assert shown.index("warning A") < shown.index("warning B")
            assert not any(s.startswith("rank 0") for s in shown)
            assert not any("not shown" in s or "not held" in s for s in shown[:3]), shown[:3]
            await pilot.press("L")  # nothing more: said, nothing changes
            await pilot.pause(0.2)
            assert text_of(app, "r1") == shown

    asyncio.run(asyncio.wait_for(go(), 240))


def test_read_back_is_what_the_tailer_read_before_an_offset(tmp_path):
    """Lines before a held line's offset, as the tailer reads them: invalid UTF-8 replaced, a 10 MB line cut,
    a progress line's last update; the first line of the file and nothing before it."""
    f = tmp_path / "stdout.log"
    f.write_bytes(b"first\n" + b"bad \xff\xfe\n" + b"x" * 10_000_000 + b"\n" + b"bar 1\rbar 2\n" + b"last\n")
    t = Tailer(f)
    whole = t.read_chunk(1 << 30)
    t.close()
    last = whole.offsets[-1]
    for most in (1, 2, 4, 10):
        back = read_back(f, last, most)
        assert back.texts == whole.texts[:-1][-most:] and back.offsets == whole.offsets[:-1][-most:]
    assert read_back(f, last, 10).partial == (2,)  # the long line, cut as the tailer cuts it
    assert read_back(f, 0, 5).texts == [] and read_back(tmp_path / "gone.log", 100, 5).texts == []
