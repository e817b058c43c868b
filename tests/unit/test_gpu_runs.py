"""Real failures of a one-GPU NCCL job, recorded on lent NVIDIA machines (tests/data/gpu_runs/README.md): the
runs ddptop launched and journaled there, its live events, and the rank's stacks taken after its alarm.

What they showed, and what these tests hold ddptop to:

* the rank waits on the GPU three ways: spinning at ``loss.item()`` behind a collective that cannot finish,
  asleep there (a CUDA context made with blocking sync), and held inside a kernel *launch* in
  ``dist.barrier()`` (c10d zeroes its barrier tensor with a kernel not yet loaded: lazy loading waits for
  the running kernels); each read as a wait on the GPU at the script's line;
* the post-mortem of a run ddptop saw hang tells the same hang as its live alarm (the journal's marks time
  the log lines; an earlier release's journal, without them, says why its replay differs);
* NCCL's watchdog writes its report in several records (the desync report, the failed collective's stack,
  the dump it starts): one finding, not an unknown error per record; a device-side assert is named by the
  kernel's own assertion line; the Xid that followed it (43) is the application's fault, not the GPU's;
* the flight recorder keeps NCCL's collectives apart from the others: the dump ddptop asks for holds both.
"""

from __future__ import annotations

import ast
import json
import pickle
import re
from pathlib import Path

import pytest

from ddptop.core.analysis.stack_verdict import parse_dump, rank_state
from ddptop.core.analysis.wording import xid_words
from ddptop.core.sources import flight_recorder as flight
from ddptop.core.tools import diagnose

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu_runs"
MACHINES = ["h100", "h200"]  # h100: before the journal timed its log lines (no marks); h200: after
HANGS = {  # case: (the line's marker in job.py, the CUDA call it waits in, the thread's state)
    "collective-timeout": ("# WAIT item", "cudaStreamSynchronize (libcudart.so.13)", "active"),
    "sleep-sync": ("# WAIT item", "cudaStreamSynchronize (libcudart.so.13)", "idle"),
    "barrier": ("# WAIT barrier", "cudaLaunchKernel (libcudart.so.13)", "active"),
}


def line_of(case: Path, marker: str) -> int:
    lines = (case / "job.py").read_text().splitlines()
    return 1 + next(i for i, text in enumerate(lines) if text.rstrip().endswith(marker))


def diagnosed(run: Path, capsys) -> dict:
    diagnose.main([str(run)], json_mode=True)
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("case", list(HANGS))
def test_the_ranks_own_native_stack_reads_as_a_gpu_wait_at_its_line(machine, case):
    d = DATA / machine / case
    marker, native, state = HANGS[case]
    st = rank_state(parse_dump((d / "native.txt").read_text()))
    assert st.kind == "gpu-wait" and st.gpu == "cuda-runtime", st
    assert st.native.startswith(native), st.native
    assert st.state == state, st  # (asleep in the driver with blocking sync: idle, and still a GPU wait)
    assert st.user is not None and (Path(st.user.file).name, st.user.line) == ("job.py", line_of(d, marker))


@pytest.mark.parametrize("case", list(HANGS))
def test_the_post_mortem_of_a_hang_ddptop_saw_tells_the_same_hang(case, capsys):
    d = DATA / "h200" / case
    marker, native, _state = HANGS[case]
    rep = diagnosed(d / "run", capsys)
    rc = rep["root_cause"]
    live = [json.loads(x) for x in (d / "events.jsonl").read_text().splitlines() if x.startswith("{")]
    (stall,) = [e for e in live if e["kind"] == "alarm" and e["type"] == "stall"]
    assert rc["signature"] == stall["id"] == "stall-hot" and rc["replayed"] is True, rc
    assert rep["stalls"]["differences"] == [], rep["stalls"]
    call = native.split(" ")[0]
    assert f"Rank 0 waits on the GPU at job.py:{line_of(d, marker)} `" in rc["text"] and call in rc["text"], rc
    # the profiles the run was launched with are not suggested again
    applied = json.loads((d / "run" / "meta.json").read_text())["profiles"] or []
    assert not set(applied) & set(rc["suggested_profiles"]), (applied, rc["suggested_profiles"])
    assert ("eager-load" in rc["suggested_profiles"]) == (case == "barrier"), rc["suggested_profiles"]
    # a job of one rank: no peer-to-peer between its GPUs to turn off, no fewer processes to run it on
    assert not {"p2p-off", "shm-off", "single-gpu"} & set(rc["suggested_profiles"]), rc["suggested_profiles"]
    found = [f["signature"] for f in rep["findings"]]
    assert "unclassified-error" not in found, found
    assert ("nccl-watchdog-timeout" in found) == (case != "barrier"), found  # (barrier: no collective under way)


@pytest.mark.parametrize("case", list(HANGS))
def test_a_journal_that_does_not_time_its_log_lines_says_why_its_replay_differs(case, capsys):
    """The same hangs, journaled by the release before marks (on the H100): the live alarm stays the root cause
    and the difference is said with its reason; the watchdog's report is still one finding."""
    rep = diagnosed(DATA / "h100" / case / "run", capsys)
    rc = rep["root_cause"]
    assert rc["signature"] == "stall-hot" and rc["replayed"] is False, rc
    (why,) = rep["stalls"]["differences"]
    assert "the replay raised no stall" in why and "when the log lines were read" in why, why
    assert "unclassified-error" not in [f["signature"] for f in rep["findings"]]


@pytest.mark.parametrize("machine", MACHINES)
def test_a_device_side_assert_is_named_by_the_kernels_own_assertion_line(machine, capsys):
    rep = diagnosed(DATA / machine / "device-assert" / "run", capsys)
    rc = rep["root_cause"]
    assert rc["signature"] == "cuda-device-assert" and rc["rank"] == 0, rc
    assert re.search(r"IndexKernel\.cu:\d+: .*Assertion `.*` failed", rc["text"]), rc["text"]
    assert rc["suggested_profiles"] == ["cuda-sync"]
    assert "unclassified-error" not in [f["signature"] for f in rep["findings"]]


def test_the_xid_that_followed_the_assert_is_said_as_the_applications_fault():
    live = [json.loads(x) for x in (DATA / "h200" / "device-assert" / "events.jsonl").read_text().splitlines()
            if x.startswith("{")]
    (xid,) = [e for e in live if e["kind"] == "alarm" and e["id"] == "xid"]
    n, gpu = map(int, re.match(r"Xid (\d+) critical error on GPU (\d+)", xid["message"]).groups())
    words = xid_words(n, gpu)
    assert n == 43 and "application's own fault" in words and "hardware" not in words, words
    assert "hardware fault" in xid_words(79, 0) and "hardware fault" in xid_words(48, 0)
    assert "Xid catalogue" in xid_words(999, 0)


@pytest.mark.parametrize("machine", MACHINES)
def test_out_of_gpu_memory_is_the_root_cause(machine, capsys):
    rc = diagnosed(DATA / machine / "oom" / "run", capsys)["root_cause"]
    assert rc["signature"] == "cuda-oom" and rc["rank"] == 0 and "Tried to allocate 16384.00 GiB" in rc["text"]
    assert "single-gpu" not in rc["suggested_profiles"], rc["suggested_profiles"]  # (it ran on one already)


def merged_dump():
    """ddptop's in-rank merge of the recorders' dumps (``ddptop/_inject/sitecustomize.py``: the rank's own
    process has no ddptop to import, so the function is taken from the file as it is)."""
    src = (Path(diagnose.__file__).resolve().parents[2] / "_inject" / "sitecustomize.py").read_text()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "_ddptop_merged_dump")
    ns: dict = {}
    exec(compile(ast.Module([fn], []), "sitecustomize.py", "exec"), ns)
    return ns["_ddptop_merged_dump"]


def test_the_flight_recorder_dump_holds_ncclS_collectives_and_the_others(tmp_path):
    d = DATA / "h200" / "collective-timeout"
    generic = (d / "flight-at-alarm" / "rank_0").read_bytes()  # torch's generic recorder, asked at the alarm
    nccl = (d / "run" / "flight" / "rank_0").read_bytes()  # NCCL's own, dumped by its watchdog at the timeout
    alone = flight.analyse({0: pickle.loads(generic)}).summary()
    assert "nccl:" not in alone and "gloo:all_gather" in alone  # (DETAIL's helper group only: the job's missing)
    (tmp_path / "rank_0").write_bytes(merged_dump()([nccl, generic]))
    dumps, problems = flight.load_dir(tmp_path)
    assert not problems
    text = flight.analyse(dumps).summary()
    assert "process group 0 at #9 (nccl:all_reduce, scheduled)" in text, text
    assert "process group (unnamed, id 0) at #36 (gloo:all_gather" in text, text
    assert merged_dump()([nccl]) == nccl


def test_the_dump_a_rank_made_at_the_alarm_on_an_h200_holds_the_jobs_nccl_collective():
    """(Made by the rank's own thread, after the fix, on the H200: the merge above, run for real.)"""
    dumps, problems = flight.load_dir(DATA / "h200" / "collective-timeout" / "flight-merged-at-alarm")
    assert not problems and sorted(dumps) == [0]
    assert "process group 0 at #9 (nccl:all_reduce, scheduled)" in flight.analyse(dumps).summary()


def watchdog_line() -> str:
    (log,) = (DATA / "h200" / "collective-timeout" / "run" / "logs").glob("*/attempt_0/0/stderr.log")
    return next(x for x in log.read_text().splitlines() if "Watchdog caught collective operation timeout" in x)


@pytest.mark.parametrize("ends", [False, True])
def test_a_rank_still_running_after_ncclS_watchdog_timed_it_out_is_said_once(ends):
    """On the H100 the rank was alive a minute after its watchdog's timeout (its abort waited behind the kernel
    that never ended): said once, LINGER seconds after the watchdog's line; nothing said of a rank that ended."""
    from ddptop.core.analysis.analyzer import LINGER, Analyzer
    from ddptop.core.model.events import LogBatch, RankEvent

    t0 = 1_800_000_000.0
    an = Analyzer(clock=lambda: t0)
    an.feed([RankEvent(t0, rank=0, local_rank=0, pid=10, alive=True)])
    an.feed([LogBatch.fast(t0 + 1, 0, "stderr", 0, "logs/x/attempt_0/0/stderr.log", [0], [watchdog_line()])])
    assert "nccl-watchdog-timeout" in [f.signature for f in an.findings]
    if ends:
        an.feed([RankEvent(t0 + 5, rank=0, local_rank=0, pid=10, alive=False, exit_code=-6)])
    said = []
    for dt in (LINGER - 1, LINGER + 1.5, LINGER + 30):
        an.decide(t0 + 1 + dt)
        said += [n.message for n in an.feed([]) if n.kind == "note"]
    if ends:
        assert said == []
    else:
        assert len(said) == 1 and said[0].startswith("Rank 0 is still running 16 s after NCCL's watchdog"), said
        assert "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC" in said[0]
