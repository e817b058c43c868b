"""Pilot tests of the telemetry parts of the UI: GPU pane, rank telemetry, alarms."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

pytest.importorskip("textual")

from textual.widgets import DataTable  # noqa: E402

from ddptop.core.run.run_session import Session  # noqa: E402
from ddptop.ui.app import make_app  # noqa: E402
from ddptop.ui.alarm_box import AlarmBox  # noqa: E402
from ddptop.ui.gpu_pane import GpuPane  # noqa: E402
from conftest import rank_started, write_run
from helpers import wait_until

TEST_TIMEOUT = 30
SIZE = (160, 45)
GIB = 1024**3


def run_async(coro, timeout=TEST_TIMEOUT):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def gpu(t, index, util, **kw):
    d = {"t": t, "kind": "gpu", "index": index, "name": "SIMULATED GPU (util = rank CPU %)",
         "uuid": f"SIM-{index}", "util": util, "mem_util": None if util is None else util * 0.05,
         "mem_used": 2 * GIB, "mem_total": 16 * GIB, "power_w": None if util is None else 60 + 3.4 * util,
         "power_limit_w": 400.0, "temp_c": 40.0, "sm_clock_mhz": None, "pcie_gen": None, "pcie_width": None,
         "pcie_tx_kbs": None, "pcie_rx_kbs": None, "ecc_uncorrected": None, "retired_pages": None,
         "throttle": [], "ranks": [index], "pids": [], "mapping": "sim", "simulated": True, "lost": False,
         "node": "h"}
    d.update(kw)
    return d


def make_run(root: Path, telemetry: list[dict]) -> Path:
    now = time.time()
    events = [{"t": now, "kind": "state", "state": "running"}]
    events += [rank_started(now, r, pid) for r, pid in ((0, 4242), (1, 4343))]
    events += [dict(e, t=now + e.get("t", 0)) for e in telemetry]
    return write_run(root, run_id="tel-run", events=events, logs={r: f"rank{r} step 1\n" for r in (0, 1)},
                     command=["torchrun", "train.py"])


def sim_telemetry() -> list[dict]:
    ev = [{"t": 0.5, "kind": "gpu_status", "backend": "sim", "message": "SIMULATED GPUs", "driver": None,
           "count": 0, "node": "h"}]
    for i, (t, u0, u1) in enumerate(((1.0, 97.0, 3.0), (2.0, 99.0, 0.0))):
        ev.append(gpu(t, 0, u0))
        ev.append(gpu(t, 1, u1))
        for r, cpu in ((0, u0), (1, u1)):
            ev.append({"t": t, "kind": "proc", "rank": r, "pid": 4242 + 101 * r, "cpu": cpu, "rss": 300 * 1024**2,
                       "status": "running" if r == 0 else "sleeping", "threads": 12, "children": 2,
                       "children_cpu": 5.0 if r == 0 else 0.0, "gpu": r, "gpu_mapping": "sim", "node": "h"})
    ev.append({"t": 2.5, "kind": "alarm", "type": "stall", "id": "stall-hang", "ranks": [0, 1], "culprits": [1],
               "message": "rank 1 stopped making progress while rank 0 waits in a collective",
               "suggested_profiles": ["nccl-debug"], "node": "h"})
    ev.append({"t": 2.6, "kind": "note", "level": "warning", "message": "stack dump timed out"})
    return ev


def cells(table: DataTable, key: str) -> list[str]:
    return [str(c) for c in table.get_row(key)]


def test_gpu_pane_ranks_and_alarm(tmp_path):
    run_dir = make_run(tmp_path, sim_telemetry())

    async def go():
        app = make_app(Session.open(run_dir), poll_interval=0.02)
        bells = []
        app.bell = lambda: bells.append(1)
        async with app.run_test(size=SIZE) as pilot:
            gt = app.query_one("#gpus", DataTable)
            rt = app.query_one("#ranks", DataTable)
            await wait_until(pilot, lambda: gt.row_count == 2 and app.model.alarms
                             and "99%" in cells(gt, "h:0") and "running" in cells(rt, "0"),
                             what="GPU rows, proc cells and the alarm")
            g0, g1 = cells(gt, "h:0"), cells(gt, "h:1")
            assert "99%" in g0 and "0%" in g1
            assert all(any("SIMULATED" in c for c in row) for row in (g0, g1))
            assert "r1" in g1 and "2.0/16.0 GiB" in g0
            title = str(app.query_one("#gpu-title").render())
            assert "SIMULATED" in title and "rank CPU %" in title
            r0, r1 = cells(rt, "0"), cells(rt, "1")
            cols = [str(c.label) for c in rt.columns.values()]
            assert r0[cols.index("GPU")] == "0" and r1[cols.index("GPU")] == "1"
            assert r0[cols.index("CPU")] == "99%" and r1[cols.index("CPU")] == "0%"
            assert r0[cols.index("RSS")] == "300 MiB" and r1[cols.index("status")] == "sleeping"
            assert r0[cols.index("workers")] == "2 (5%)"
            assert r0[7] == "1"  # the step column keeps its place
            box = app.query_one("#alarms", AlarmBox)
            assert box.display
            text = str(box.render())
            assert "stall-hang" in text and "culprit: r1" in text and "nccl-debug" in text
            assert "(r relaunches)" in text
            assert "stack dump timed out" in text
            assert bells == [1]
            assert "1 alarm" in str(app.query_one("#header").render())
            # g hides the pane and shows it again
            pane = app.query_one("#gpu-pane", GpuPane)
            assert pane.display
            await pilot.press("g")
            await wait_until(pilot, lambda: not pane.display, what="the GPU pane hidden")
            await pilot.press("g")
            await wait_until(pilot, lambda: pane.display, what="the GPU pane shown again")

    run_async(go())


def test_no_gpu_backend(tmp_path):
    run_dir = make_run(tmp_path, [{"t": 0.5, "kind": "gpu_status", "backend": "none",
                                   "message": "no NVIDIA driver (libnvidia-ml not found)", "node": "h"}])

    async def go():
        app = make_app(Session.open(run_dir), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.model.gpu_status is not None
                             and "no NVIDIA driver" in str(app.query_one("#gpu-title").render()),
                             what="the no-driver message")
            assert app.query_one("#gpu-pane", GpuPane).display
            assert not app.query_one("#gpus", DataTable).display
            assert not app.query_one("#alarms", AlarmBox).display

    run_async(go())


def test_na_lost_and_guess(tmp_path):
    tel = [
        {"t": 0.5, "kind": "gpu_status", "backend": "nvml", "message": "", "driver": "550.54", "count": 2, "node": "h"},
        gpu(1.0, 0, None, name="NVIDIA H100", simulated=False, mapping="guess", ranks=[0]),
        gpu(1.0, 1, None, name="NVIDIA H100", simulated=False, lost=True, mem_used=None),
    ]

    async def go():
        app = make_app(Session.open(make_run(tmp_path, tel)), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            gt = app.query_one("#gpus", DataTable)
            await wait_until(pilot, lambda: gt.row_count == 2, what="GPU rows")
            g0, g1 = cells(gt, "h:0"), cells(gt, "h:1")
            assert g0[1] == "n/a" and "40°C" in g0  # only the missing field says n/a
            assert "r0?" in g0
            assert "LOST" in g1[0] and g1[1] == "LOST"
            assert not any("SIMULATED" in c for c in g0)
            note = str(app.query_one("#gpu-note").render())
            assert "mapping is a guess" in note
            title = str(app.query_one("#gpu-title").render())
            assert "550.54" in title and "SIMULATED" not in title

    run_async(go())


def test_ranks_mapped_by_device_in_a_container_are_no_guess(tmp_path):
    """In a pod NVML's pids are the host's: ranks are mapped to GPUs by device.
    The rank table and the GPU pane show them plainly (no "?"), and the note
    says how they were mapped instead of calling it a guess."""
    tel = [
        {"t": 0.5, "kind": "gpu_status", "backend": "nvml", "message": "", "driver": "550.54", "count": 2, "node": "h"},
        gpu(1.0, 0, 81.0, name="NVIDIA H100", uuid="GPU-6b1f", simulated=False, mapping="device", ranks=[1]),
        gpu(1.0, 1, 12.0, name="NVIDIA H100", uuid="GPU-c04e", simulated=False, mapping="device", ranks=[0]),
    ] + [{"t": 1.0, "kind": "proc", "rank": r, "pid": 4242 + 101 * r, "cpu": 50.0, "rss": 300 * 1024**2,
          "status": "running", "threads": 4, "children": 0, "children_cpu": 0.0, "gpu": 1 - r,
          "gpu_mapping": "device", "node": "h"} for r in (0, 1)]

    async def go():
        app = make_app(Session.open(make_run(tmp_path, tel)), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            gt = app.query_one("#gpus", DataTable)
            await wait_until(pilot, lambda: gt.row_count == 2, what="GPU rows")
            assert "r1" in cells(gt, "h:0") and not any("?" in c for c in cells(gt, "h:0") + cells(gt, "h:1"))
            note = str(app.query_one("#gpu-note").render())
            assert "by device" in note and "guess" not in note

    run_async(go())
    from ddptop.core.model.events import ProcEvent
    from ddptop.core.analysis.job_state import RankInfo
    from ddptop.ui.rank_rows import rank_cells

    sample = ProcEvent(1.0, rank=0, pid=42, gpu=3, gpu_mapping="device")
    assert rank_cells(RankInfo(0, pid=42, alive=True, proc=sample), False, None)["gpu"] == "3"
