"""The TUI attached to two nodes over ssh (a real sshd on 127.0.0.1, real
`ddptop agent`s on hand-made run directories), and a local run for contrast."""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("textual")

from textual.content import Content  # noqa: E402
from textual.widgets import DataTable  # noqa: E402

from ddptop.core.model.evidence import Where  # noqa: E402
from ddptop.core.sessions.cross_node import MultiSession  # noqa: E402
from ddptop.core.sessions.ssh import RemoteSession  # noqa: E402
from ddptop.core.run.run_session import Session  # noqa: E402
from ddptop.ui.app import make_app  # noqa: E402
from ddptop.ui.header import HeaderBar  # noqa: E402
from ddptop.ui.alarm_box import AlarmBox  # noqa: E402
from conftest import rank_started, write_run
from helpers import wait_until as _wait_until
from sshd import remote_ddptop
from test_app_relaunch import header_text, log_text  # noqa: E402

WAIT = 60.0  # seconds for any one thing to show up
SIZE = (140, 45)

wait_until = functools.partial(_wait_until, timeout=WAIT)


def run_async(coro, timeout=240):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def column(table: DataTable, label: str) -> list[str]:
    labels = [str(c.label) for c in table.columns.values()]
    i = labels.index(label)
    return [str(table.get_row(k)[i]) for k in sorted(table.rows, key=lambda k: int(k.value))]


def node_run(root: Path, node: str, rank: int, supervisor_pid: int | None) -> Path:
    """One node's run (one rank, global number ``rank``), as its supervisor leaves
    it; live while ``supervisor_pid`` runs, or finished when it is None."""
    now = time.time()
    events = [{"t": now, "kind": "state", "state": "running"},
              {**rank_started(now, rank, 5000 + rank), "local_rank": 0},
              {"t": now, "kind": "gpu", "index": 0, "name": "NVIDIA H100", "util": 40.0 + rank, "mem_used": 2 << 30,
               "mem_total": 80 << 30, "ranks": [rank], "mapping": "nvml", "node": "h"}]
    exit = None
    if supervisor_pid is None:
        events += finish_events(now, rank)
        exit = {"state": "succeeded", "exit_code": 0, "t": now + 1}
    run = write_run(root, run_id=f"job-on-{node}", events=events, nproc=1, exit=exit,
                    logs={0: "".join(f"rank{rank} step {i} loss 0.{i}\n" for i in range(3))},
                    torchrun_log=f"torchrun on {node}: rendezvous done\n")
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "node_rank": rank}))  # as `torchrun --node-rank N` records it
    if supervisor_pid is not None:
        (run / "supervisor.json").write_text(json.dumps({"pid": supervisor_pid}))
    return run


def finish_events(t: float, rank: int) -> list[dict]:
    return [{"t": t + 1, "kind": "rank", "rank": rank, "local_rank": 0, "node": "h", "pid": 5000 + rank,
             "attempt": 0, "alive": False, "exit_code": 0},
            {"t": t + 1, "kind": "state", "state": "succeeded", "exit_code": 0}]


def finish_run(run: Path, rank: int) -> None:
    now = time.time()
    with open(run / "events.jsonl", "a") as f:
        f.write("".join(json.dumps(e) + "\n" for e in finish_events(now, rank)))
    (run / "exit.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0, "t": now + 1}))


def test_two_attached_nodes_one_view(tmp_path, sshd):
    """Both links in the header, a node column, GPUs and torchrun lines named by
    node, every line once across a dropped link, then the end of both runs."""
    supervisors = [subprocess.Popen(["sleep", "300"]) for _ in range(2)]  # stand-ins: the runs are live while they run
    roots = [tmp_path / "node-a", tmp_path / "node-b"]
    runs = [node_run(root, node, rank, sup.pid)
            for rank, (root, node, sup) in enumerate(zip(roots, ("node-a", "node-b"), supervisors))]
    # each node's agent finds its run by name under its own runs directory (as on real nodes)
    session = MultiSession([RemoteSession(node, run="run", ssh=sshd.ssh, remote_cmd=remote_ddptop(root), backoff=(1.0,))
                            for node, root in zip(("node-a", "node-b"), roots)])

    async def go():
        app = make_app(session, poll_interval=0.05)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one("#ranks", DataTable)
            await wait_until(pilot, lambda: "node-a ● up" in header_text(app) and "node-b ● up" in header_text(app)
                             and table.row_count == 2 and "rank1 step 2" in log_text(app, "merged")
                             and "rank0 step 2" in log_text(app, "merged")  # each link's lines come after its "up"
                             and "node-a torchrun" in log_text(app, "merged")
                             and "node-b torchrun" in log_text(app, "merged"),
                             what="both links up, both ranks and their lines")
            head = header_text(app)
            first, second = head.split("\n")
            assert "job-on-node-a" in first and "RUNNING" in first and str(tmp_path) not in first
            assert second.startswith("attached")
            assert app.sub_title == "ddptop attach node-a:run node-b:run"
            assert column(table, "node") == ["node-a", "node-b"]
            assert column(table, "rank") == ["0", "1"]
            merged = log_text(app, "merged")
            assert "[r0] rank0 step 0 loss 0.0" in merged and "[r1] rank1 step 2 loss 0.2" in merged
            assert "[node-a torchrun] torchrun on node-a: rendezvous done" in merged
            assert "[node-b torchrun] torchrun on node-b: rendezvous done" in merged
            assert "link to node-a up" in merged
            # GPUs: one row per node's GPU 0, labelled by node, grouped by node
            gpus = app.query_one("#gpus", DataTable)
            await wait_until(pilot, lambda: gpus.row_count == 2
                             and "r1" in [str(c) for c in gpus.get_row("node-b:0")], what="both nodes' GPUs")
            labels = [str(gpus.get_row(k)[0]) for k in ("node-a:0", "node-b:0")]
            assert labels == ["node-a/0", "node-b/0"]
            assert "r1" in [str(c) for c in gpus.get_row("node-b:0")]
            # the torchrun pane names the node of each line
            await pilot.press("t")
            await wait_until(pilot, lambda: "[node-b] torchrun on node-b" in log_text(app, "torchrun"),
                             what="the torchrun pane")
            assert "[node-a] torchrun on node-a: rendezvous done" in log_text(app, "torchrun")
            await pilot.press("m")

            # the links drop: the log says so, both come back, nothing is shown twice
            assert sshd.drop_links() >= 2
            await wait_until(pilot, lambda: "link to node-a down" in log_text(app, "merged")
                             and "link to node-b down" in log_text(app, "merged"), what="the links to drop")
            await wait_until(pilot, lambda: "node-a ● up" in header_text(app) and "node-b ● up" in header_text(app),
                             what="both links to come back")
            with open(runs[1] / "logs" / "x_abc" / "attempt_0" / "0" / "stdout.log", "a") as f:
                f.write("rank1 after the reconnect\n")
            await wait_until(pilot, lambda: "[r1] rank1 after the reconnect" in log_text(app, "merged"),
                             what="a line written after the reconnect")

            # both runs end: the job's final state, both links closed
            for rank, run in enumerate(runs):
                finish_run(run, rank)
            await wait_until(pilot, lambda: "SUCCEEDED" in header_text(app) and header_text(app).count("■ closed") == 2,
                             what="the end of both runs")
            assert "exit 0" in header_text(app)
            await wait_until(pilot, lambda: column(table, "state") == ["exited 0", "exited 0"], what="ranks exited")
            merged = log_text(app, "merged")
            for line in ("[r0] rank0 step 2 loss 0.2", "[r1] rank1 step 0 loss 0.0",
                         "[node-a torchrun] torchrun on node-a: rendezvous done"):
                assert merged.count(line) == 1, line
            assert not app.query_one("#alarms", AlarmBox).has_class("-on"), [
                (n.level, n.message) for n in app.model.notes if n.level != "info"] + app.model.alarms

    try:
        run_async(go())
    finally:
        session.close()
        for p in supervisors:
            p.kill()
            p.wait()


def test_a_node_that_cannot_be_attached_says_why(tmp_path, sshd):
    run_a = node_run(tmp_path / "node-a", "node-a", 0, None)  # a finished run, named by its path
    session = MultiSession([RemoteSession("node-a", run=str(run_a), ssh=sshd.ssh, remote_cmd=remote_ddptop(tmp_path)),
                            RemoteSession("node-b", run="run", ssh=sshd.ssh, remote_cmd="/nonexistent/bin/ddptop")])

    async def go():
        app = make_app(session, poll_interval=0.05)
        async with app.run_test(size=SIZE) as pilot:
            box = app.query_one("#alarms", AlarmBox)
            await wait_until(pilot, lambda: "node-b ✗ failed" in header_text(app) and box.has_class("-on")
                             and app.model.finished, what="node-b's failure and the end")
            assert "node-a ■ closed" in header_text(app)
            text = str(box.render())
            assert "LINK node-b failed" in text and "ddptop is not installed on node-b" in text
            assert box.border_title == "1 link failed"
            # RichLog holds lines written before its first layout until it has a size
            await wait_until(pilot, lambda: "link to node-b failed: ddptop is not installed on node-b"
                             in log_text(app, "merged") and "[r0] rank0 step 2 loss 0.2" in log_text(app, "merged"),
                             what="the link failure and node-a's lines in the merged log")

    try:
        run_async(go())
    finally:
        session.close()


def test_a_local_run_keeps_its_layout(tmp_path):
    """No link line, no node names on GPUs or torchrun lines; the node column
    holds the host as before."""
    now = time.time()
    events = [{"t": now, "kind": "state", "state": "running"}, rank_started(now, 0, 4242), rank_started(now, 1, 4343),
              {"t": now, "kind": "gpu", "index": 0, "util": 10.0, "ranks": [0], "node": "h"}]
    run = write_run(tmp_path, run_id="local-run", events=events, logs={r: f"rank{r} step 1\n" for r in (0, 1)},
                    torchrun_log="torchrun says hello\n")

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one("#ranks", DataTable)
            gpus = app.query_one("#gpus", DataTable)
            await wait_until(pilot, lambda: table.row_count == 2 and gpus.row_count == 1
                             and "torchrun says hello" in log_text(app, "merged"), what="the run")
            head = header_text(app)
            assert "\n" not in head and "attached" not in head and "local-run" in head
            assert not app.query_one("#header", HeaderBar).has_class("-links")
            assert column(table, "node") == ["h", "h"]
            assert str(gpus.get_row("h:0")[0]) == "0"
            assert "[torchrun] torchrun says hello" in log_text(app, "merged")
            assert app.sub_title == "local-run"

    run_async(go())


def test_the_cross_node_alarm_shows_the_culprits_node(tmp_path):
    """Issue 27: the one stall alarm of a hang across nodes names the culprit's node in the alarm box
    (its ``node``), and culprits on several nodes each with theirs."""
    from ddptop.core.model.events import AlarmEvent
    from ddptop.core.analysis.job_state import JobState
    from ddptop.ui.alarm_box import alarm_markup

    now = time.time()
    where = {"1": {"rank": 1, "function": "next_batch", "file": "train.py", "line": 5,
                   "kind": "sleep/wait in user code", "status": "frozen", "node": "node-b"}}
    alarm = {"t": now, "kind": "alarm", "type": "stall", "id": "stall-collective", "ranks": [0, 1], "culprits": [1],
             "message": "Collective hang: the other ranks wait for the odd rank out. Odd rank out: rank 1 on node-b",
             "node": "node-b", "where": where,
             "folded": [{"t": now, "node": "node-a", "id": "stall-hot", "culprits": [], "message": "Hot stall: ..."}]}
    run = write_run(tmp_path, run_id="merged", events=[{"t": now, "kind": "state", "state": "running"},
                                                       rank_started(now, 0, 4242), rank_started(now, 1, 4343), alarm],
                    logs={0: "step 1\n", 1: "step 1\n"})

    async def go():
        app = make_app(Session.open(run), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            box = app.query_one("#alarms", AlarmBox)
            await wait_until(pilot, lambda: box.has_class("-on"), what="the alarm box")
            text = Content.from_markup(box._markup[0]).plain
            assert "STALL stall-collective  culprit: r1  node node-b" in text, text
            assert box.border_title == "1 alarm"

    run_async(go())
    # culprits on two nodes: the alarm is "all nodes", each culprit says its node
    spread = AlarmEvent(now, type="stall", id="stall-mismatch", culprits=(1, 3), node="all nodes",
                        where={1: Where(1, node="node-b"), 3: Where(3, node="node-c")})
    model = JobState()
    model.apply([spread])
    text = Content.from_markup(alarm_markup(model)[0]).plain
    assert "culprit: r1@node-b,r3@node-c  all nodes" in text, text
