"""`ddptop diagnose`, in process: a line it failed to read is said in the post-mortem.

(The real `ddptop diagnose` on logs ddptop did not write: tests/integration/test_diagnose_e2e.py.)"""

from __future__ import annotations


def test_a_line_ddptop_failed_to_read_is_said_in_the_post_mortem(tmp_path, monkeypatch, capsys):
    """A parser bug skips a line; diagnose says so instead of being silently less sure."""
    from ddptop.core.tools import diagnose as dg
    from helpers import matcher_fails_on

    matcher_fails_on(monkeypatch)
    log = tmp_path / "rank_1.log"
    log.write_text("step 1\nBAD line\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    assert dg.main([str(log)], json_mode=False) == 1
    out = capsys.readouterr().out
    assert "Root cause: cuda-oom (rank 1)" in out
    assert "Note: signature matcher failed on line 2 of rank 1's stdout: KeyError: 'boom'" in out


def test_steps_that_reached_a_tee_console_after_the_error_are_not_a_rank_going_on(capsys):
    """A real --tee console this repo's CI recorded (tests/data/logs/recorded/tee-console-steps-after-the-error):
    rank 1's five steps, printed before its loader thread died, reached the console after its traceback.
    The cause is still rank 1's exception, not rank 0's timeout that torchrun saw first."""
    import json

    from conftest import ROOT
    from ddptop.core.tools import diagnose as dg

    console = ROOT / "tests" / "data" / "logs" / "recorded" / "tee-console-steps-after-the-error" / "console.txt"
    assert dg.main([str(console)], json_mode=True) == 1
    rep = json.loads(capsys.readouterr().out)
    rc = rep["root_cause"]
    assert rc["signature"] == "python-exception" and rc["rank"] == 1 and "FileNotFoundError" in rc["text"], rc
    assert rep["culprits"] == [1]
    assert any(f["signature"] == "gloo-timeout" and f["rank"] == 0 for f in rep["findings"])
