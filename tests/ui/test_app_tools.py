"""The doctor (D) and benchmark (B) panes, driven with Pilot against this real machine.

(The heat map alone: tests/unit/test_ui_pieces.py; after F: tests/integration/test_fix_after_ui_e2e.py.)"""

from __future__ import annotations

import pytest

pytest.importorskip("textual")

from textual.widgets import DataTable, Static  # noqa: E402

import fake_nvml  # noqa: E402
from ddptop.core.run.run_session import Session  # noqa: E402
from ddptop.ui.app import make_app  # noqa: E402
from helpers import wait_until  # noqa: E402
from test_app import SIZE, log_text, make_run, run_async  # noqa: E402


def no_nvidia_driver(monkeypatch):
    """This process sees no NVIDIA driver, on any machine: NVML's start fails
    as pynvml's does when libnvidia-ml cannot be found."""
    import pynvml

    from ddptop.core.sources import gpu_nvml as nvml

    monkeypatch.setattr(nvml, "_load", lambda: fake_nvml.make([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))


def test_doctor_pane_shows_every_check_with_its_evidence(tmp_path, monkeypatch):
    no_nvidia_driver(monkeypatch)  # (what a machine with GPUs shows is tested in tests/gpu)
    run_dir = make_run(tmp_path, finished=True)

    async def go():
        app = make_app(Session.open(run_dir), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("D")
            await wait_until(pilot, lambda: type(app.screen).__name__ == "DoctorScreen", what="the doctor pane")
            table = app.screen.query_one("#rows", DataTable)
            await wait_until(pilot, lambda: table.row_count >= 10, timeout=25, what="the checks")
            checks = [str(table.get_row_at(i)[1]) for i in range(table.row_count)]
            assert "GPUs" in checks and "/dev/shm" in checks and "Master port" in checks
            gpus = [str(c) for c in table.get_row_at(checks.index("GPUs"))]
            assert gpus[0] == "skipped" and "no NVIDIA driver" in gpus[2]  # no GPU: said, not crashed
            title = str(app.screen.query_one("#title").render())
            assert " ok, " in title and " skipped" in title
            # moving to a row shows its evidence
            table.move_cursor(row=checks.index("/dev/shm"))
            evidence = app.screen.query_one("#evidence", Static)
            await wait_until(pilot, lambda: "statvfs(/dev/shm)" in str(evidence.render()), what="the row's evidence")
            await pilot.press("escape")
            await wait_until(pilot, lambda: type(app.screen).__name__ != "DoctorScreen", what="the doctor pane closed")

    run_async(go())


def test_bench_pane_runs_on_enter_and_reports_the_cpu_all_reduce(tmp_path):
    # (the benchmark's workers see no CUDA GPU on any machine: conftest.no_cuda_outside_tests_gpu;
    # tests/gpu measures real ones)
    run_dir = make_run(tmp_path, finished=True)

    async def go():
        app = make_app(Session.open(run_dir), poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("B")
            await wait_until(pilot, lambda: type(app.screen).__name__ == "BenchScreen", what="the bench pane")
            scr = app.screen
            scr.sizes = [4096]  # one all-reduce size: the test stays short
            table = scr.query_one("#rows", DataTable)
            await pilot.pause()
            assert table.row_count == 0 and not scr.running  # nothing runs before enter: it would load the job's GPUs
            await pilot.press("enter")
            await wait_until(pilot, lambda: not scr.running and table.row_count >= 2, timeout=240,
                             what="the benchmark to finish")
            rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
            assert rows[0][0] == "copy p2p" and "SKIPPED: no CUDA GPU" in rows[0][6]
            assert rows[1][:3] == ["allreduce", "2 ranks (gloo, CPU)", "4 KiB"] and float(rows[1][3]) > 0
            assert "done" in str(scr.query_one("#title").render())
            assert "needs 2 GPUs" in str(scr.query_one("#matrix", Static).render())

    run_async(go(), timeout=300)


def test_fix_key_stops_the_job_then_hands_over_to_ddptop_fix(tmp_path):
    from test_app import SpySession

    run_dir = make_run(tmp_path / "a", finished=False)

    async def go(answer):
        session = SpySession(Session.open(run_dir))  # (a fresh one each time: it shows the run from its start)
        app = make_app(session, poll_interval=0.02)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "rank0 step 2" in log_text(app, "merged"), what="the job's lines")
            await pilot.press("F")
            await wait_until(pilot, lambda: type(app.screen).__name__ == "FixScreen", what="the fix confirmation")
            await pilot.press(answer)
            if answer == "n":
                await wait_until(pilot, lambda: type(app.screen).__name__ == "Screen", what="the confirmation closed")
                await pilot.pause()  # (the answer has been handled: anything it would do has started by now)
            else:
                await wait_until(pilot, lambda: app.return_value is not None, what="the hand-over")
            return app.return_value, type(app.screen).__name__, session.stop_calls

    # F, then n: nothing happens
    assert run_async(go("n")) == (None, "Screen", 0)
    # F, then y: the job is stopped, and the UI hands over to the fix search
    value, _, stops = run_async(go("y"))
    assert (value, stops) == ("fix", 1)
