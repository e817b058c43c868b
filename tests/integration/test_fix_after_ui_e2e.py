"""What `ddptop ... torchrun` does after the UI's F key: the stopped job drained, then `ddptop fix` run
on its command (a real torchrun job; the key itself, under Pilot: tests/ui/test_app_tools.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("textual")

from ddptop.core.run.run_session import Session  # noqa: E402


def test_fix_after_the_ui_finds_the_profile_for_the_stopped_job(tmp_path, monkeypatch, capsys):
    """What `ddptop ... torchrun` does after F: drain the stopped job, then `ddptop fix` its command."""
    import argparse

    from conftest import EXAMPLE
    from ddptop.cli import _fix_after_ui

    monkeypatch.setenv("DDPTOP_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    s = Session.launch(["torchrun", "--nproc-per-node", "2", EXAMPLE, "--steps", "1000", "--step-time", "0.05",
                        "--fault", "p2p-hang", "--fault-step", "10"], tmp_path / "run", gpu="sim")
    try:
        assert s.stop()  # as the F key does
        args = argparse.Namespace(fix_steps=15, fix_time=180.0, gpu="sim", stall_after=None)
        assert _fix_after_ui(s, args) == 0
    finally:
        s.stop()
    out = capsys.readouterr()
    assert s.finished and s.final_state.state == "stopped"
    assert "ddptop fix torchrun --nproc-per-node 2" in out.err
    assert "p2p-off" in out.out and "NCCL_P2P_DISABLE=1 torchrun" in out.out
