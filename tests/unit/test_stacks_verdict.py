"""ddptop.core.analysis.stack_verdict on real py-spy dumps (recorded by tests/data/stacks/record.py).

Each ``<scenario>.r<rank>.<n>.txt`` is the n-th ``py-spy dump`` (taken >= 1 s
apart) of rank ``rank`` of a small real program; see record.py for the programs.
"""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest

from ddptop.core.analysis.stack_verdict import Frame, classify_frame, parse_dump, rank_state, verdict

DATA = Path(__file__).resolve().parents[1] / "data" / "stacks"


def dumps(scenario: str, rank: int = 0) -> list[str]:
    files = sorted(DATA.glob(f"{scenario}.r{rank}.*.*"))
    assert len(files) >= 2, scenario
    return [f.read_text() for f in files]


def job(scenario: str, ranks: int = 1) -> dict[int, list[str]]:
    return {r: dumps(scenario, r) for r in range(ranks)}


def sources(scenario: str):
    """source_line(file, line) for the recorded program (as the caller would read the file)."""
    spec = importlib.util.spec_from_file_location("record_stacks", DATA / "record.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lines = (mod.PRELUDE + textwrap.dedent(mod.PROGRAMS[scenario])).splitlines()
    return lambda file, line: lines[line - 1] if file.endswith("train.py") and 0 < line <= len(lines) else None


# --------------------------------------------------------------------------- parsing


def test_parse_queue_get():
    (t,) = parse_dump(dumps("queue_get")[0])
    assert t.name == "MainThread" and t.state == "idle" and t.pid == t.id
    assert [f.function for f in t.frames] == ["Condition.wait", "Queue.get", "wait_for_batch", "<module>"]
    assert t.frames[2] == Frame("wait_for_batch", "train.py", 9)


def test_parse_locals_and_unnamed_thread():
    (t,) = parse_dump(dumps("sleep_callback")[0])  # recorded with --locals
    assert t.name == "" and t.state == "idle"
    assert [f.function for f in t.frames] == ["HangAt.on_train_batch_start", "Trainer._call_callbacks", "Trainer.fit", "<module>"]
    assert [f.line for f in t.frames] == [16, 22, 25, 26]


def test_parse_two_threads_active_gil_and_json():
    ts = parse_dump(dumps("lock_acquire")[0])
    assert [t.name for t in ts] == ["MainThread", "holder"]
    (busy,) = parse_dump(dumps("busy_loop")[0])
    assert busy.state == "active" and busy.gil
    (j,) = parse_dump(dumps("queue_get_json")[0])  # py-spy dump --json
    assert j.name == "MainThread" and j.state == "idle"
    assert [f.function for f in j.frames] == ["Condition.wait", "Queue.get", "wait_for_batch", "<module>"]


def test_parse_not_a_dump():
    assert parse_dump("") == []
    assert parse_dump("Error: Failed to find python version from target process\n") == []
    assert parse_dump("[not json") == []


# --------------------------------------------------------------------------- classification


def test_classify_real_frames():
    cats = lambda s, r=0: [classify_frame(f) for f in parse_dump(dumps(s, r)[0])[0].frames]
    assert cats("gloo_allreduce") == ["collective", "collective", "user"]
    assert cats("gloo_barrier") == ["collective", "collective", "user"]  # --full-filenames: site-packages paths
    assert cats("ddp_backward") == ["autograd", "autograd", "autograd", "user", "user"]
    assert cats("queue_get") == ["stdlib", "stdlib", "user", "user"]
    fsdp = cats("fsdp_allgather")
    assert fsdp[:4] == ["collective"] * 4 and fsdp[-2:] == ["user", "user"]
    assert "framework" in fsdp  # torch.nn Module._call_impl, torch._dynamo
    holder = parse_dump(dumps("lock_acquire")[0])[1]
    assert [classify_frame(f) for f in holder.frames] == ["user", "stdlib", "stdlib", "stdlib"]


@pytest.mark.parametrize("file,func,cat", [
    ("/usr/lib/python3.11/threading.py", "Thread.join", "stdlib"),
    ("/root/.pyenv/versions/3.11.7/lib/python3.11/multiprocessing/queues.py", "Queue.get", "stdlib"),
    ("selectors.py", "EpollSelector.select", "stdlib"),
    ("<frozen runpy>", "_run_code", "stdlib"),
    ("/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", "_next_data", "data"),
    ("torch/utils/data/_utils/fetch.py", "fetch", "data"),
    ("torch/serialization.py", "save", "io"),
    ("torch/distributed/checkpoint/filesystem.py", "write_data", "io"),
    ("/usr/local/lib/python3.10/dist-packages/torch/nn/parallel/distributed.py", "DistributedDataParallel.forward", "collective"),
    ("torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "foreach_all_gather", "collective"),
    ("torch/distributed/elastic/multiprocessing/errors/__init__.py", "wrapper", "framework"),
    ("torch/_tensor.py", "Tensor.backward", "autograd"),
    ("torch/_tensor.py", "Tensor.__repr__", "framework"),
    ("lightning/pytorch/trainer/call.py", "_call_callback_hooks", "framework"),
    ("/home/u/.local/lib/python3.11/site-packages/transformers/trainer.py", "Trainer.train", "framework"),
    ("/home/u/proj/train.py", "main", "user"),
    ("myproj/models/net.py", "Net.forward", "user"),
])
def test_classify_by_path(file, func, cat):
    assert classify_frame(Frame(func, file, 1)) == cat


# --------------------------------------------------------------------------- one process


def test_queue_get_is_frozen_culprit():
    v = verdict(job("queue_get"))
    assert v.hung is True and v.culprits == (0,)
    w = v.where[0]
    assert (w.function, w.file, w.line) == ("wait_for_batch", "train.py", 9)
    assert w.call == "Queue.get" and w.innermost == "Condition.wait"
    assert w.kind == "sleep/wait in user code"
    assert "`wait_for_batch` at train.py:9 (`Queue.get`)" in v.summary


def test_lock_acquire_uses_main_thread_not_holder():
    v = verdict(job("lock_acquire"))
    assert v.hung is True and v.culprits == (0,)
    assert (v.where[0].function, v.where[0].line) == ("update_shared_state", 13)
    st = rank_state(parse_dump(dumps("lock_acquire")[0]))
    assert st.thread == "MainThread" and st.kind == "sleep/wait in user code"


def test_busy_loop_same_line_is_busy_not_hung():
    # a tight loop: both samples show crunch at train.py:17, but on CPU holding the GIL
    a, b = (rank_state(parse_dump(d)) for d in dumps("busy_loop"))
    assert a.exact == b.exact and a.kind == "user code"
    v = verdict(job("busy_loop"))
    assert v.status == {0: "busy"} and v.hung is False and v.culprits == ()


def test_busy_steps_moving_is_not_hung():
    a, b = (rank_state(parse_dump(d)) for d in dumps("busy_steps"))
    assert a.exact != b.exact  # epoch_loop:16 then score:7 <- normalise <- epoch_loop
    v = verdict(job("busy_steps"))
    assert v.status == {0: "moving"} and v.hung is False and v.culprits == ()


def test_sleep_in_callback():
    v = verdict(job("sleep_callback"))
    assert v.hung is True and v.culprits == (0,)
    w = v.where[0]
    assert (w.function, w.file, w.line) == ("HangAt.on_train_batch_start", "train.py", 16)
    # py-spy cannot show time.sleep (a C function): the caller's source reader names it
    v = verdict(job("sleep_callback"), source_line=sources("sleep_callback"))
    assert v.where[0].call == "time.sleep" and v.where[0].code == "time.sleep(3600)"
    assert v.summary == "hung: rank 0 is in `HangAt.on_train_batch_start` at train.py:16 (`time.sleep`)"


# --------------------------------------------------------------------------- 2 gloo ranks


def test_gloo_all_reduce_waits_for_sleeping_rank():
    v = verdict(job("gloo_allreduce", 2), source_line=sources("gloo_allreduce"))
    assert v.hung is True and v.culprits == (1,)
    w = v.where[1]
    assert (w.function, w.file, w.line, w.call) == ("slow_step", "train.py", 11, "time.sleep")
    assert v.summary.startswith("hung: rank 1 is in `slow_step` at train.py:11 (`time.sleep`); rank 0 waits in `all_reduce`")
    (g0,) = [g for g in v.groups if g.ranks == (0,)]
    assert g0.status == "frozen" and g0.kind == "collective"


def test_gloo_barrier_full_filenames():
    v = verdict(job("gloo_barrier", 2))
    assert v.hung is True and v.culprits == (1,)
    w = v.where[1]
    assert w.function == "save_checkpoint_rank1" and w.line == 11
    assert w.file.startswith("/tmp/") and w.file.endswith("/train.py")
    assert "rank 0 waits in `barrier` (torch.distributed) from `<module>` at train.py:15" in v.summary


def test_recv_deadlock_all_frozen_in_same_collective_no_invented_culprit():
    v = verdict(job("gloo_recv_deadlock", 2))
    assert v.hung is True and v.culprits == () and v.shown() == {} and v.waiting == (0, 1) and not v.mismatch
    (g,) = v.groups
    assert g.ranks == (0, 1) and g.kind == "collective" and "`recv`" in g.text
    assert v.summary.startswith("hung, no single culprit: ranks 0,1 wait in `recv`")


def test_ddp_rank_waits_in_backward():
    v = verdict(job("ddp_backward", 2))  # recorded with --nonblocking
    assert v.hung is True and v.culprits == (1,)
    assert (v.where[1].function, v.where[1].line) == ("on_step", 16)
    assert "rank 0 waits in backward (DDP all-reduce) at train.py:25" in v.summary
    st0 = rank_state(parse_dump(dumps("ddp_backward", 0)[-1]))
    assert st0.kind == "backward" and st0.user.function == "train" and st0.innermost.function == "_engine_run_backward"


def test_ddp_healthy_training_is_not_hung():
    # rank 1 happened to be in backward (waiting for the all-reduce) in both
    # samples, but rank 0 moved from forward into backward: training goes on
    v = verdict(job("ddp_healthy", 2))
    assert v.status == {0: "moving", 1: "frozen"}
    assert v.hung is False and v.culprits == ()


def test_fsdp_all_gather_waits_for_data_loading_rank():
    v = verdict(job("fsdp_allgather", 2))
    assert v.hung is True and v.culprits == (1,)
    assert (v.where[1].function, v.where[1].line) == ("load_next_batch", 20)
    st0 = rank_state(parse_dump(dumps("fsdp_allgather", 0)[-1]))
    assert st0.kind == "collective" and st0.call == "all_gather_single" and "FSDP" in st0.text
    assert (st0.user.function, st0.user.line) == ("train", 27)


# --------------------------------------------------------------------------- more ranks (real dumps, reassembled)


def test_a_mover_the_others_wait_for_in_a_collective_is_named_but_is_no_hang_yet():
    """(the detector gives a rank that visibly works its patience: rank 0 evaluating alone)"""
    samples = {r: dumps("gloo_allreduce", 0) for r in range(3)}
    samples[3] = dumps("busy_steps")
    v = verdict(samples)
    assert v.hung is False and v.culprits == () and v.workers == (3,) and v.waiting == (0, 1, 2)
    assert v.waits_on_work() == (3,) and 3 in v.shown()
    assert v.status[3] == "moving" and v.where[3].function in ("epoch_loop", "score")
    assert "ranks 0-2 wait in `all_reduce`" in v.summary


def test_majority_described_once_minority_is_culprit():
    samples = {r: dumps("gloo_allreduce", 0) for r in range(8)}
    samples[5] = dumps("gloo_allreduce", 1)
    v = verdict(samples)
    assert v.hung is True and v.culprits == (5,)
    assert [g.ranks for g in v.groups] == [(0, 1, 2, 3, 4, 6, 7), (5,)]
    assert v.summary.count("all_reduce") == 1 and "ranks 0-4,6,7 wait in `all_reduce`" in v.summary


def test_mismatched_collectives_minority_is_odd_one_out():
    samples = {r: dumps("gloo_recv_deadlock", 0) for r in range(3)}
    samples[3] = dumps("gloo_barrier", 0)
    v = verdict(samples)
    assert v.hung is True and v.culprits == (3,) and v.where[3].call == "barrier"


def test_one_sample_cannot_tell_a_hang_and_names_nobody_without_a_contrast():
    assert verdict({}).hung is None
    v = verdict({0: dumps("queue_get")[:1], 1: ["Error: no such process"] * 2})
    assert v.hung is None and v.culprits == () and v.status == {0: "seen", 1: "unknown"}
    assert "one sample per rank: frozen and moving cannot be told apart" in v.summary


def test_evidence_travels_as_json_in_a_stacks_event_and_comes_back_typed():
    from ddptop.core.model.evidence import StackEvidence
    from ddptop.core.model.events import StacksEvent, from_json

    v = verdict(job("ddp_backward", 2))
    ev = StacksEvent(5.0, ranks=(0, 1), samples=2, **{**v.to_event_fields(), "node": "n1"})
    d = json.loads(ev.to_json())
    assert d["hung"] is True and d["culprits"] == [1] and d["waiting"] == [0]
    assert d["where"]["1"]["function"] == "on_step" and d["where"]["1"]["kind"] == "sleep/wait in user code"
    back = StackEvidence.from_event(from_json(ev.to_json()))
    assert back.culprits == (1,) and back.waiting == (0,) and back.where[1].line == v.where[1].line
    assert back.where[1].node == "n1" and back.where[0].waiting and not back.where[1].waiting
    assert [g.ranks for g in back.groups] == [g.ranks for g in v.groups]
    st = rank_state(parse_dump(dumps("ddp_backward")[0]))
    assert json.loads(json.dumps(st.to_dict()))["kind"] == "backward"


def test_a_rank_writing_a_checkpoint_is_work_while_the_others_wait_for_it():
    """Rank 0 blocked in a write on slow storage, inside torch.save (its innermost
    frame is the user's own file wrapper); rank 1 waits in a barrier.  That is a
    checkpoint being written, not a hang: no culprit, the I/O rank reported."""
    v = verdict(job("slow_checkpoint", 2))
    assert v.hung is False and v.culprits == () and v.io == (0,)
    assert v.where[0].kind == "io" and v.where[0].function == "save_checkpoint"
    assert "rank 0 is in I/O" in v.summary and "rank 1 waits" in v.summary
    st = rank_state(parse_dump(dumps("slow_checkpoint", 0)[0]))
    assert st.kind == "io" and st.call == "save"


def test_a_rank_in_io_beside_one_stuck_in_its_own_code_is_not_the_culprit():
    samples = {0: dumps("slow_checkpoint", 0), 1: dumps("gloo_barrier", 1), 2: dumps("gloo_barrier", 0)}
    v = verdict(samples)
    # rank 1 sleeps in its own code outside the barrier rank 2 waits in: the culprit; rank 0 writes
    assert v.hung is True and v.culprits == (1,), v.summary


def test_main_frames_for_the_pane():
    from ddptop.core.analysis.stack_verdict import main_frames

    frames, user = main_frames(dumps("slow_checkpoint", 0)[0])
    assert frames[0].startswith("SlowDisk.write (") and "torch/serialization.py:" in frames[1]
    assert user == [0, 3, 4]


def test_a_rank_spinning_on_one_line_beside_a_frozen_one_is_a_hang_and_the_frozen_one_the_culprit():
    """Rank 0 polls on one line (busy, its stack never changes), rank 1 sleeps in
    its own code: nobody moves, so it is a hang, and the frozen rank is named."""
    v = verdict({0: dumps("busy_loop"), 1: dumps("gloo_barrier", 1)})
    assert v.hung is True and v.culprits == (1,), v.summary
    assert "rank 0 spins on one line" in v.summary
    # every rank busy on one line (a long computation) is still work
    assert verdict({0: dumps("busy_loop"), 1: dumps("busy_loop")}).hung is False


def test_a_loop_seen_on_the_same_line_twice_moved_when_its_variables_changed():
    """The stack watch (attach --pid) compares one rank's samples some seconds
    apart: a healthy loop sits on its sleep (or GPU sync) line in both, but its
    step counter and tensors are new (py-spy --locals); a hung rank's are not."""
    from ddptop.core.analysis.stack_verdict import moved

    a, b = dumps("loop_locals")
    assert rank_state(parse_dump(a)).exact == rank_state(parse_dump(b)).exact  # the same line
    assert moved(a, b) is True
    assert moved(a, a) is False
    hung1, hung2 = dumps("gloo_barrier", 1)  # rank 1 sleeping in its own code, twice
    assert moved(hung1, hung2) is False
    assert moved(a, "Error: no such process") is None
    # on the CPU on one line with the same variables: not movement by itself (a rank spinning at a CUDA sync)
    busy = dumps("busy_loop")[0]
    assert rank_state(parse_dump(busy)).state == "active" and moved(busy, busy) is False


def test_every_rank_spinning_on_one_line_is_work_unless_their_gpus_are_busy():
    """Without native frames, ranks spinning on one unchanged line are a loop (work) when nothing says
    otherwise, and ranks waiting on the GPU (a CUDA sync behind an NCCL collective) when their GPUs are
    busy with no step: then it is a hang with no single culprit, not a veto."""
    job_ = {0: dumps("busy_loop"), 1: dumps("busy_loop")}
    assert verdict(job_).hung is False
    v = verdict(job_, gpu_busy={0, 1})
    assert v.hung is True and v.culprits == () and v.waiting == (0, 1) and not v.mismatch and not v.confirmed
    assert v.where[0].kind == "gpu-wait" and v.where[0].gpu == "util" and v.where[0].waiting


# --------------------------------------------------------------------------- GPU waits (native frames)

# py-spy dump --native --full-filenames, as it prints a rank spinning in the CUDA runtime (the layout seen on
# a real process calling a libcudart.so.12 through ctypes: native frames innermost, without line numbers for
# libraries without debug info, then the Python frames)
NATIVE_SYNC = """\
Process 4242: /venv/bin/python -u /w/train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (active): "MainThread"
    0x7f0a3c1b2f7a (/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15)
    cudaStreamSynchronize (/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12)
    ffi_call (/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2)
    _ctypes_callproc (/tmp/python-build/Python-3.11.7/Modules/_ctypes/callproc.c:1262)
    train_step (/w/train.py:{line})
    <module> (/w/train.py:200)
    0x7f83fd84524a (/usr/lib/x86_64-linux-gnu/libc.so.6)
"""
PYTHON_SYNC = """\
Process 4242: /venv/bin/python -u /w/train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (active): "MainThread"
    train_step (/w/train.py:{line})
    <module> (/w/train.py:200)
"""
SLEEPING = """\
Process 4243: /venv/bin/python -u /w/train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4243 (idle): "MainThread"
    next_batch (/w/train.py:60)
    train_step (/w/train.py:70)
    <module> (/w/train.py:200)
"""


def test_native_frames_from_the_cuda_runtime_mean_a_rank_waits_on_the_gpu():
    st = rank_state(parse_dump(NATIVE_SYNC.format(line=88)))
    assert st.kind == "gpu-wait" and st.gpu == "cuda-runtime" and st.library == "the CUDA runtime"
    assert st.user.line == 88
    assert st.native == "cudaStreamSynchronize (libcudart.so.12)" and "waits on the GPU" in st.text
    # native frames are not Python frames: the same line seen without them is the same stack
    assert st.exact == rank_state(parse_dump(PYTHON_SYNC.format(line=88))).exact
    # the driver's nameless frames alone say it too (classified by their library file)
    only_driver = "\n".join(x for x in NATIVE_SYNC.format(line=88).splitlines() if "libcudart" not in x)
    st = rank_state(parse_dump(only_driver))
    assert st.gpu == "cuda-driver" and st.native == "in the CUDA driver" and "0x7f" not in st.text


def test_a_rank_stuck_in_python_while_the_others_spin_at_a_cuda_sync_is_the_culprit():
    spin = [PYTHON_SYNC.format(line=88), NATIVE_SYNC.format(line=88)]  # a Python-only sample, then a native one
    v = verdict({0: spin, 1: [SLEEPING, SLEEPING], 2: spin})
    assert v.hung is True and v.culprits == (1,) and v.waiting == (0, 2) and v.confirmed, v.summary
    assert v.where[1].call == "" and v.where[1].line == 60 and v.where[0].kind == "gpu-wait"
    assert "ranks 0,2 wait on the GPU (`cudaStreamSynchronize`, the CUDA runtime) at `train_step` at train.py:88" \
        in v.summary
    # (rank 1's dumps have no native frames and its line cannot be read: it may wait at a GPU sync, but not
    # where the others wait, so it is the odd one out either way, and the summary says why)
    assert "rank 1 has no native frames" in v.summary


def test_ranks_spinning_at_different_cuda_syncs_are_a_mismatch_whose_minority_is_the_culprit():
    at = lambda line: [PYTHON_SYNC.format(line=line), NATIVE_SYNC.format(line=line)]  # noqa: E731
    v = verdict({0: at(88), 1: at(140), 2: at(88)})
    assert v.hung is True and v.mismatch and v.culprits == (1,) and v.waiting == (0, 2) and v.confirmed
    assert set(v.shown()) == {0, 1, 2} and v.where[1].line == 140
    # two and two: a mismatch with no odd one out
    v = verdict({0: at(88), 1: at(140), 2: at(88), 3: at(140)})
    assert v.hung is True and v.mismatch and v.culprits == () and v.confirmed
    # all at one: every rank waits in the same collective (the start-up hang, or a long GPU step)
    v = verdict({0: at(88), 1: at(88)})
    assert v.hung is True and not v.mismatch and v.culprits == () and not v.confirmed


def test_a_line_that_syncs_only_a_gpu_tensor_is_no_gpu_wait_in_a_process_without_a_gpu_runtime():
    """Seen in a loaded test run: rank 0 evaluating alone on the CPU, `acc += float(torch.randn(64, 64).sum())`
    in both Python-only samples (its native dumps given up under load), with simulated telemetry (no
    utilisation): the line reads as a GPU sync (a tensor's __float__), so rank 0 was taken as spinning on the
    GPU and the job as a stall.  A process with no GPU runtime mapped (the sampler reads /proc/PID/maps) waits
    on no GPU: it is a rank working while rank 1 waits for it."""
    line = "        acc += float(torch.randn(64, 64).sum())"
    src = lambda file, n: line if file.endswith("train.py") and n == 88 else None  # noqa: E731
    evaluating = [PYTHON_SYNC.format(line=88)] * 2
    waiting = dumps("gloo_barrier", 0)  # (a real rank waiting in dist.barrier)
    v = verdict({0: evaluating, 1: waiting}, src, gpu_util={0: None, 1: None})
    # (what a GPU process's line would be: a sync; and rank 1 in a barrier: waits in different places)
    assert v.where[0].kind == "gpu-wait" and v.hung and v.mismatch, v.summary
    v = verdict({0: evaluating, 1: waiting}, src, gpu_util={0: None, 1: None}, no_gpu={0, 1})
    assert v.where[0].kind != "gpu-wait" and v.hung is False and v.workers == (0,), v.summary
    assert "rank 1 waits for rank 0, which works" in v.summary


def test_the_gpu_runtime_is_read_from_the_process_address_space(tmp_path):
    """gpu_runtime_mapped(pid): a process that has mapped a file named as the CUDA runtime has one; a plain
    Python process has none (not this test's own: the CUDA stand-in's tests load the stand-in into their
    worker); a pid that is not there cannot be read."""
    import subprocess
    import sys

    from ddptop.core.sources.proc_tree import gpu_runtime_mapped

    lib = tmp_path / "libcudart.so.12"
    lib.write_bytes(b"\0" * 4096)
    code = ("import mmap, sys; f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); "
            "print('mapped', flush=True); sys.stdin.read()")
    p = subprocess.Popen([sys.executable, "-c", code, str(lib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    plain = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "mapped"
        assert gpu_runtime_mapped(p.pid) is True
        assert plain.stdout.readline().strip() == "up"
        assert gpu_runtime_mapped(plain.pid) is False
    finally:
        for q in (p, plain):
            q.stdin.close()
            q.wait(timeout=30)
    assert gpu_runtime_mapped(p.pid) is None  # gone


def test_diagnose_judges_a_sampling_again_with_the_ranks_that_had_no_gpu_runtime(tmp_path):
    """The sampler writes which ranks had no GPU runtime beside their dumps; `ddptop diagnose` of the run
    reads it and says what the live verdict said (a post-mortem never contradicts the live view)."""
    from ddptop.core.sources.stack_files import GPU_RUNTIME_FILE
    from ddptop.core.tools.diagnose import stacks_report

    script = tmp_path / "train.py"
    script.write_text("\n" * 87 + "        acc += float(torch.randn(64, 64).sum())\n")
    d = tmp_path / "stacks" / "20261127-100000-samples"
    d.mkdir(parents=True)
    for i in range(2):
        (d / f"rank0.{i}.txt").write_text(PYTHON_SYNC.format(line=88).replace("/w/train.py", str(script)))
        (d / f"rank1.{i}.txt").write_text(dumps("gloo_barrier", 0)[i])
    assert stacks_report([str(tmp_path)]).evidence.where[0].kind == "gpu-wait"
    (d / GPU_RUNTIME_FILE).write_text('{"without": [0, 1]}\n')
    ev = stacks_report([str(tmp_path)]).evidence
    assert ev.where[0].kind != "gpu-wait" and ev.hung is False and ev.workers == (0,), ev.summary
    (d / GPU_RUNTIME_FILE).write_text("{damaged\n")  # unreadable: nothing concluded
    assert stacks_report([str(tmp_path)]).evidence.where[0].kind == "gpu-wait"


def test_a_lock_order_deadlock_with_the_gil_in_a_destructor_is_named_with_both_halves():
    """Recorded in this repository's CI (tests/data/stacks/recorded/gloo-teardown-gil-deadlock): rank 1's main
    thread frees the DDP Reducer holding the GIL and blocks on a lock in ProcessGroupGloo's destructor; the gloo
    worker waits to take the GIL.  The verdict names the lock, that the GIL is held and the thread that waits
    for it, not just "idle in <module>"."""
    d = DATA / "recorded" / "gloo-teardown-gil-deadlock"
    samples = [(d / f"rank1.{i}.txt").read_text() for i in range(2)]
    st = rank_state(parse_dump(samples[1]))
    assert "blocked on a lock in `c10d::ProcessGroupGloo::~ProcessGroupGloo` (libtorch_cpu.so)" in st.text, st.text
    assert "while holding the GIL" in st.text and "a lock-order deadlock with the GIL" in st.text
    assert st.others and "thread 315 waits to take the GIL" in st.others[0]
    v = verdict({1: samples})
    assert v.hung is True and v.culprits == (1,) and "lock-order deadlock with the GIL" in v.summary
    # a main thread on a lock with no thread waiting for the GIL is only blocked (no deadlock claimed)
    alone = "\n".join(ln for ln in samples[1].splitlines() if "gil_scoped_acquire" not in ln)
    assert "deadlock" not in rank_state(parse_dump(alone)).text
