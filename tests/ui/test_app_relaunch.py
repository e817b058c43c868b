"""The TUI's relaunch: the profile picker (r), the env panel (e), the header and
the relaunch separators; once on a hand-made run, once with real torchrun."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

pytest.importorskip("textual")

from textual.widgets import OptionList, RichLog, Static  # noqa: E402

from ddptop.core.model.events import LaunchEvent  # noqa: E402
from ddptop.core.run.run_session import Session  # noqa: E402
from ddptop.ui.app import make_app  # noqa: E402
from ddptop.ui.dialogs import ProfilePicker  # noqa: E402
from ddptop.ui.header import HeaderBar  # noqa: E402
from conftest import rank_started, write_run
from helpers import wait_for, wait_until

ROOT = Path(__file__).resolve().parents[2]
SIZE = (140, 45)


def run_async(coro, timeout=30):
    return asyncio.run(asyncio.wait_for(coro, timeout))



def header_text(app) -> str:
    return app.query_one("#header", HeaderBar)._content.plain


def log_text(app, key: str) -> str:
    return "\n".join(strip.text for strip in app.query_one(f"#log-{key}", RichLog).lines)


def option_labels(app) -> list[str]:
    ol = app.screen.query_one(OptionList)
    return [str(ol.get_option_at_index(i).prompt) for i in range(ol.option_count)]


def make_run(root: Path, *, finished: bool = False) -> Path:
    now = time.time()
    events = [{"t": now, "kind": "state", "state": "running"},
              {"t": now, "kind": "launch", "generation": 0, "profiles": [],
               "command": ["torchrun", "--nproc-per-node", "2", "train.py"], "env_diff": {}, "reason": ""}]
    events += [rank_started(now, r, pid) for r, pid in ((0, 4242), (1, 4343))]
    events.append({"t": now, "kind": "alarm", "type": "stall", "id": "stall-hot", "ranks": [0, 1], "culprits": [1],
                   "message": "no progress for 20 s at 100% GPU", "suggested_profiles": ["p2p-off", "nccl-debug"],
                   "node": "h"})
    exit = None
    if finished:
        events.append({"t": now + 2, "kind": "state", "state": "failed", "exit_code": 1})
        exit = {"state": "failed", "exit_code": 1, "t": now + 2}
    return write_run(root, run_id="rl-run", events=events, logs={r: f"rank{r} step 1\n" for r in (0, 1)}, exit=exit)


class SpySession:
    """A real Session, with relaunch() recorded instead of signalling anything."""

    def __init__(self, session):
        self._s = session
        self.relaunches: list[tuple[list[str], str]] = []

    def relaunch(self, profiles, reason="asked for"):
        self.relaunches.append((list(profiles), reason))
        return True

    def __getattr__(self, name):
        return getattr(self._s, name)


def test_picker_lists_suggestions_first_and_enter_relaunches(tmp_path):
    spy = SpySession(Session.open(make_run(tmp_path)))

    async def go():
        app = make_app(spy, poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: len(app.model.alarms) == 1 and len(app.model.ranks) == 2, what="the alarm")
            await pilot.press("r")
            await wait_until(pilot, lambda: isinstance(app.screen, ProfilePicker), what="the picker")
            labels = option_labels(app)
            assert labels[0].startswith("p2p-off") and "suggested by stall-hot (culprit r1)" in labels[0]
            assert labels[1].startswith("nccl-debug") and "suggested" in labels[1]
            assert sum(1 for l in labels if l.startswith("p2p-off")) == 1  # not listed twice
            assert any(l.startswith("gloo —") for l in labels)  # the other profiles, with descriptions
            assert labels[-1].startswith("default (no profile)")
            # esc cancels
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, ProfilePicker), what="picker closed")
            assert spy.relaunches == []
            await pilot.press("r")
            await wait_until(pilot, lambda: isinstance(app.screen, ProfilePicker), what="the picker again")
            await pilot.press("enter")
            await wait_until(pilot, lambda: spy.relaunches, what="relaunch called")
            assert spy.relaunches[0][0] == ["p2p-off"] and "stall-hot" in spy.relaunches[0][1]
            assert not isinstance(app.screen, ProfilePicker)
            # the new launch arrives: header, separator in the merged and rank panes, env panel
            app.ingest([LaunchEvent(time.time(), generation=1, profiles=("p2p-off",), command=("torchrun",),
                                    env_diff={"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": None}, reason="test")])
            await wait_until(pilot, lambda: "launch #1" in header_text(app) and "profiles: p2p-off" in header_text(app),
                             what="the header")
            await wait_until(pilot, lambda: "──── relaunch #1 with profiles p2p-off ────" in log_text(app, "merged"),
                             what="separator in merged")
            await pilot.press("1")
            await wait_until(pilot, lambda: "relaunch #1 with profiles p2p-off" in log_text(app, "r1")
                             and "rank1 step 1" in log_text(app, "r1"), what="separator in rank 1")
            await pilot.press("e")
            panel = app.query_one("#envpanel", Static)
            await wait_until(pilot, lambda: panel.display and "NCCL_P2P_DISABLE=1" in str(panel.render()), what="env panel")
            assert "NCCL_DEBUG unset" in str(panel.render()) and "p2p-off" in str(panel.render())
            await pilot.press("e")
            await wait_until(pilot, lambda: not panel.display, what="env panel hidden")
            # the current profiles are kept, the chosen one appended
            await pilot.press("r")
            await wait_until(pilot, lambda: isinstance(app.screen, ProfilePicker), what="the picker, gen 1")
            ol = app.screen.query_one(OptionList)
            idx = next(i for i, l in enumerate(option_labels(app)) if l.startswith("gloo"))
            ol.highlighted = idx
            await pilot.press("enter")
            await wait_until(pilot, lambda: len(spy.relaunches) == 2, what="second relaunch")
            assert spy.relaunches[1][0] == ["p2p-off", "gloo"]

    run_async(go())


def test_picker_on_an_ended_job_says_how_to_rerun(tmp_path):
    spy = SpySession(Session.open(make_run(tmp_path, finished=True)))

    async def go():
        app = make_app(spy, poll_interval=0.02)
        notes = []
        app.notify = lambda message, **kw: notes.append(message)  # type: ignore[method-assign]
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.model.finished, what="the end")
            await pilot.press("r")
            await wait_until(pilot, lambda: isinstance(app.screen, ProfilePicker), what="the picker")
            await pilot.press("enter")
            await wait_until(pilot, lambda: any("re-run" in n for n in notes), what="the hint")
            hint = next(n for n in notes if "re-run" in n)
            assert "the job has ended" in hint and "ddptop --profile p2p-off torchrun --nproc-per-node 2 train.py" in hint
            assert spy.relaunches == []

    run_async(go())



def test_a_nodes_restart_by_its_cluster_is_shown_as_its_next_attempt(tmp_path):
    """A pod restarted by its cluster (attach --k8s): the header and the separator say whose attempt it is,
    not a relaunch ddptop made."""
    session = Session.open(make_run(tmp_path))

    async def go():
        app = make_app(session, poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: len(app.model.ranks) == 2, what="the ranks")
            app.ingest([LaunchEvent(time.time(), generation=1, node_restart=1, node="worker-1",
                                    reason="run R2 in pod bert-worker-1's container pytorch")])
            await wait_until(pilot, lambda: "worker-1: attempt 1, restarted by the cluster" in header_text(app),
                             what="the header")
            assert "launch #" not in header_text(app)
            await wait_until(pilot, lambda: "──── worker-1: attempt 1, restarted by the cluster ────"
                             in log_text(app, "merged"), what="the separator")
            assert "relaunch #" not in log_text(app, "merged")
            # a relaunch by ddptop after it is a launch again
            app.ingest([LaunchEvent(time.time(), generation=2, profiles=("p2p-off",), reason="asked for")])
            await wait_until(pilot, lambda: "launch #2" in header_text(app), what="the header after a relaunch")

    run_async(go())


def _rank_pids_gen0(run_dir: Path) -> set[int]:
    pids, launches = set(), 0
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["kind"] == "launch":
            launches += 1
            if launches >= 2:
                break
        elif e["kind"] == "rank" and e.get("pid"):
            pids.add(e["pid"])
    return pids


def test_relaunch_from_the_tui_with_real_torchrun(tmp_path):
    import psutil

    run_dir = tmp_path / "run"
    session = Session.launch(
        ["torchrun", "--nproc-per-node", "2", str(ROOT / "examples/train_ddp.py"), "--steps", "40", "--step-time", "0.05",
         "--fault", "p2p-hang", "--fault-step", "10"], run_dir=run_dir, gpu="sim")

    async def go():
        app = make_app(session)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: any(a.type == "stall" for a in app.model.alarms), timeout=120, step=0.5,
                             what="a stall alarm",
                             fail_if=lambda: app.model.finished and f"the job ended first: {app.model.state}")
            await pilot.press("r")
            await wait_until(pilot, lambda: isinstance(app.screen, ProfilePicker), what="the picker")
            first = option_labels(app)[0]
            assert first.startswith("p2p-off") and "suggested" in first, first
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.model.generation == 1 and app.model.state == "succeeded", timeout=150,
                             step=0.5, what=lambda: f"the relaunch to succeed (gen {app.model.generation}, "
                                                    f"state {app.model.state})",
                             fail_if=lambda: app.model.finished and app.model.state != "succeeded" and app.model.state)
            await wait_until(pilot, lambda: "launch #1" in header_text(app), what="the header")
            head = header_text(app)
            assert "launch #1" in head and "p2p-off" in head, head
            assert app.model.profiles == ("p2p-off",) and app.model.env_diff == {"NCCL_P2P_DISABLE": "1"}
            await wait_until(pilot, lambda: "relaunch #1 with profiles p2p-off" in log_text(app, "merged"),
                             what="the separator")
            old = _rank_pids_gen0(run_dir)
            assert len(old) == 2, old
            alive = [p for p in old if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
            assert not alive, f"generation-0 ranks still running: {alive}"
            await pilot.press("q")
            await wait_until(pilot, lambda: not app.is_running, what="the app to quit")
        assert app.return_value == "finished"

    try:
        asyncio.run(asyncio.wait_for(go(), 300))
    finally:
        if session.is_live:
            session.stop()
            wait_for(lambda: (run_dir / "exit.json").exists(), timeout=60, what="the job to stop")
