"""The stacks pane of a 1,024-rank job under Pilot: 128 nodes' stack samples (one rank stuck on node-97) are
shown as one set of groups, by count and ranges, the culprit first with its node, and ``n`` opens the large
group into its ranks by node.  What is shown, never how fast."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

pytest.importorskip("textual")

from textual.containers import VerticalScroll  # noqa: E402
from textual.widgets import Static  # noqa: E402

from ddptop.core.analysis.stack_judge import judge  # noqa: E402
from ddptop.core.analysis.stack_verdict import verdict  # noqa: E402
from ddptop.core.model.events import StacksEvent  # noqa: E402
from ddptop.core.run.run_session import Session  # noqa: E402
from ddptop.ui.app import make_app  # noqa: E402
from ddptop.ui.stacks_screen import StacksScreen  # noqa: E402
from conftest import rank_started, write_run  # noqa: E402
from helpers import wait_until  # noqa: E402

SIZE = (160, 45)
TEST_TIMEOUT = 240
NODES, PER_NODE, ODD = 128, 8, 777

# py-spy dump --native of a rank spinning at a CUDA sync (as tests/unit/test_stacks_verdict.py records it), and
# a rank asleep in its data loader
SPIN = """\
Process 4242: /venv/bin/python -u /w/train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (active): "MainThread"
    0x7f0a3c1b2f7a (/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15)
    cudaStreamSynchronize (/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12)
    ffi_call (/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2)
    train_step (/w/train.py:88)
    <module> (/w/train.py:200)
"""
STUCK = """\
Process 4243: /venv/bin/python -u /w/train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4243 (idle): "MainThread"
    next_batch (/w/loader.py:40)
    train_step (/w/train.py:70)
    <module> (/w/train.py:200)
"""


def stacks_events(now: float) -> list[dict]:
    """Each node's own samples of its 8 ranks, as its agent sends them (one node's verdict judged again per
    node: the nodes differ only by their ranks)."""
    v = verdict({0: [SPIN, SPIN], 1: [STUCK, STUCK]})
    frames = {g.ranks[0]: (g.frames, g.user) for g in v.groups}
    out = []
    for n in range(NODES):
        rs = range(n * PER_NODE, (n + 1) * PER_NODE)
        where = {r: replace(v.where[1 if r == ODD else 0], rank=r) for r in rs}
        fields = judge(where, (), {r: frames[1 if r == ODD else 0] for r in rs}, t=now).to_event_fields()
        fields["node"] = f"node-{n}"
        out.append(StacksEvent(now + n * 0.003, ranks=tuple(rs), samples=2, span=1.2,
                               dir=f"/runs/r/stacks/n{n}-samples", **fields).to_dict())
    return out


def run_of(tmp_path):
    now = time.time()
    nranks = NODES * PER_NODE
    events = [{"t": now, "kind": "state", "state": "running"}]
    events += [{**rank_started(now, r, 10_000 + r), "node": f"node-{r // PER_NODE}"} for r in range(nranks)]
    events += stacks_events(now + 5)
    logs = {r: "epoch 3 step 120\n" for r in range(nranks)}
    return write_run(tmp_path, events=events, logs=logs, nproc=nranks)


def test_1024_ranks_stacks_show_as_groups_the_culprit_first_and_open_by_node(tmp_path):
    run = run_of(tmp_path)

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.model.stacks is not None and len(app.model.stacks.ranks) == 1024,
                             timeout=120, what=lambda: f"every node's stacks: {len(app.model.stacks_by_node)}")
            await pilot.press("s")
            await wait_until(pilot, lambda: isinstance(app.screen, StacksScreen), what="the stacks pane")

            def shown() -> str:
                return str(app.screen.query_one("#stacks-text", Static).render())

            text = shown()
            lines = text.splitlines()
            assert "2 samples of 1,024 ranks on 128 nodes over 1.2 s): hung" in lines[0], lines[0]
            assert lines[1] == "culprit: rank 777 on node-97", text[:600]
            culprit = lines.index(next(ln for ln in lines if ln.startswith("rank 777 on node-97 waits for data")))
            waiting = lines.index(next(ln for ln in lines if ln.startswith(
                "1,023 ranks (0-776,778-1023) on 128 nodes wait on the GPU")))
            assert culprit < waiting and "train.py:88" in lines[waiting]
            assert "next_batch (loader.py:40)" in lines[culprit + 1]
            assert "(n: its ranks by node)" in lines[waiting + 1]
            assert "node-3:" not in text
            box = app.screen.query_one(VerticalScroll)
            assert "n: the large groups' ranks by node" in str(box.border_title)
            # n opens the 1,023 into their nodes, the node short of a rank saying which; n again closes them
            await pilot.press("n")
            await wait_until(pilot, lambda: "node-3: 24-31" in shown(), what="the ranks by node")
            opened = shown()
            assert "node-97: 776,778-783 (777 in another group)" in opened
            assert "node-0: 0-7" in opened and "node-127: 1016-1023" in opened
            await pilot.press("n")
            await wait_until(pilot, lambda: "node-3:" not in shown(), what="closed again")
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, StacksScreen), what="the pane closed")

    asyncio.run(asyncio.wait_for(go(), TEST_TIMEOUT))
