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


# PyTorch's flight recorder at a watchdog timeout, in the form torch 2.5+ prints it (ProcessGroupNCCL.cpp's
# printTraceback: "Stack trace of the failed collective: " then FlightRecorder.cpp's getTraceback, one
# "#N function from file:line" a line, innermost first, without the record's head or the rank's prefix), laid out
# as in a posted 8-rank server log (a timed-out all_reduce on rank 3); the paths are this test's own
WATCHDOG_WITH_STACK = """\
[rank3]:[E710 18:00:32.426182607 ProcessGroupNCCL.cpp:757] [Rank 3] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=59958, OpType=ALLREDUCE, NumelIn=8388608, NumelOut=8388608, Timeout(ms)=1800000) ran for 1800077 \
milliseconds before timing out.
[rank3]:[E710 18:00:32.426302794 ProcessGroupNCCL.cpp:2395] [PG ID 0 PG GUID 0(default_pg) Rank 3]  failure detected \
by watchdog at work sequence id: 59958 PG status: last enqueued work: 59998, last completed work: 59957
[rank3]:[E710 18:00:32.427312432 ProcessGroupNCCL.cpp:801] Stack trace of the failed collective: 
#0 all_reduce from /usr/local/lib/python3.12/dist-packages/torch/distributed/distributed_c10d.py:3174
#1 wrapper from /usr/local/lib/python3.12/dist-packages/torch/distributed/c10d_logger.py:83
#2 backward from /usr/local/lib/python3.12/dist-packages/lightning/pytorch/strategies/ddp.py:301
#3 train_step from /work/proj/train.py:88
#4 main from /work/proj/train.py:140
#5 _run_code from <frozen runpy>:88

[rank3]:[F710 18:08:32.707469047 ProcessGroupNCCL.cpp:1725] [PG ID 0 PG GUID 0(default_pg) Rank 3] Terminating the \
process after attempting to dump debug info, due to collective timeout or exception.
"""


def test_a_watchdog_timeout_says_where_its_failed_collective_was_called_from(tmp_path, capsys):
    """The flight recorder's stack of the failed collective, printed after the watchdog's timeout: the post-mortem
    says where it was called from, the innermost frame of the person's own code (past torch.distributed and the
    libraries); a stack of library frames only gives the innermost outside torch.distributed; a recorder that was
    off (its "not found" line) gives nothing and is no error of its own."""
    import json

    from ddptop.core.tools import diagnose as dg

    def root(text):
        log = tmp_path / "console.txt"
        log.write_text(text)
        dg.main([str(log)], json_mode=True)
        rep = json.loads(capsys.readouterr().out)
        return rep["root_cause"], rep["findings"]

    rc, _ = root(WATCHDOG_WITH_STACK)
    assert rc["signature"] == "nccl-watchdog-timeout" and rc["rank"] == 3
    assert rc["detail"]["where"] == "train.py:88 in train_step", rc
    log = tmp_path / "console.txt"
    dg.main([str(log)], json_mode=False)
    assert "called from: train.py:88 in train_step (the failed collective's stack" in capsys.readouterr().out
    libraries = "\n".join(ln for ln in WATCHDOG_WITH_STACK.splitlines() if "/work/proj/" not in ln)
    assert root(libraries)[0]["detail"]["where"] == "ddp.py:301 in backward"
    # another rank's line ends the stack: a frame-like line after it is not this rank's call site
    other = WATCHDOG_WITH_STACK.replace("#2 backward", "[rank1]:[E710 18:00:32 x.cpp:1] Some other record\n#2 backward")
    assert "where" not in root(other)[0]["detail"]
    off = WATCHDOG_WITH_STACK.split("[rank3]:[E710 18:00:32.427312432")[0] + (
        "[rank3]:[E710 18:00:32.427312432 ProcessGroupNCCL.cpp:670] Stack trace of the failed collective not found, "
        "potentially because FlightRecorder is disabled. You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to "
        "a non-zero value.\n")
    rc, findings = root(off)
    assert rc["signature"] == "nccl-watchdog-timeout" and "where" not in rc["detail"]
    assert not any(f["signature"] == "unclassified-error" for f in findings), findings


# a console without rank prefixes (torchrun before 2.3, or its output captured by a scheduler): one traceback, then
# torchrun's failure report, in its documented form (torch.distributed.elastic's ChildFailedError summary)
UNPREFIXED = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 12, in <module>
    from flash_attn import flash_attn_func
ImportError: /usr/lib/python3/dist-packages/flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi
ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 2 (pid: 311) of binary: /usr/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-01-10_12:00:01
  host      : box
  rank      : 2 (local_rank: 2)
  exitcode  : 1 (pid: 311)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_an_error_whose_lines_name_no_rank_is_the_rank_the_launcher_saw_fail_first(tmp_path, capsys):
    """The one rank torchrun's report says failed first is the rank of an error whose own lines name none (said so);
    without such a report the rank stays unknown."""
    import json

    from ddptop.core.tools import diagnose as dg

    log = tmp_path / "console.txt"
    log.write_text(UNPREFIXED)
    dg.main([str(log)], json_mode=True)
    rc = json.loads(capsys.readouterr().out)["root_cause"]
    assert rc["signature"] == "python-exception" and "undefined symbol" in rc["text"] and rc["rank"] == 2, rc
    assert "the launcher's report says rank 2 failed first" in rc["explanation"]
    log.write_text(UNPREFIXED.split("ERROR:torch")[0])
    dg.main([str(log)], json_mode=True)
    rc = json.loads(capsys.readouterr().out)["root_cause"]
    assert rc["signature"] == "python-exception" and rc["rank"] is None, rc
