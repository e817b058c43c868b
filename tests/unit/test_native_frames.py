"""What native frames say (ddptop.core.analysis.native_frames) and how the verdict reads them.

The dumps here follow the shapes real GPU ranks show under ``py-spy dump --native``
(see tests/data/stacks/public for dumps people posted, with their sources): the
driver's frames unnamed (``0x7f… (libcuda.so.1)``, the file sometimes with the
driver's version), the runtime's call outermost, NCCL's frames with source files
when its release build carries debug info, NCCL or the runtime linked into
``libtorch_cuda.so``, ROCm's HIP/HSA/RCCL, and libc's lock and wait primitives
innermost.  Addresses differ from process to process on purpose.
"""

from __future__ import annotations

import itertools

import pytest

from ddptop.core.analysis.native_frames import gpu_wait, library_of, library_words
from ddptop.core.analysis.stack_dumps import Frame, parse_dump
from ddptop.core.analysis.stack_verdict import rank_state, verdict

_addr = itertools.count(0x7F0A3C1B2F7A, 0x1F3)


def dump(native: list[str], python: list[str] = ("train_step (/w/train.py:88)", "<module> (/w/train.py:200)"),
         state: str = "active", pid: int = 4242) -> str:
    """One rank's py-spy --native dump: ``native`` innermost first; "ADDR" becomes a fresh address."""
    lines = [ln.replace("ADDR", hex(next(_addr))) for ln in native]
    body = "\n".join(f"    {ln}" for ln in [*lines, *python])
    return (f"Process {pid}: /venv/bin/python -u /w/train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
            f'Thread {pid} ({state}): "MainThread"\n{body}\n')


SPIN_ITEM = ["ADDR (/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05)",
             "ADDR (/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05)",
             "ADDR (/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05)",
             "cuMemcpyDtoHAsync_v2 (/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05)",
             "ADDR (/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12)",
             "cudaMemcpyAsync (/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12)",
             "c10::cuda::memcpy_and_sync (/venv/lib/python3.11/site-packages/torch/lib/libc10_cuda.so)",
             "at::native::_local_scalar_dense_cuda (/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so)",
             "THPVariable_item (/venv/lib/python3.11/site-packages/torch/lib/libtorch_python.so)"]
SLEEP_SYNC = ["__futex_abstimed_wait_common (/usr/lib/x86_64-linux-gnu/libc.so.6)",
              "pthread_cond_wait@@GLIBC_2.3.2 (/usr/lib/x86_64-linux-gnu/libc.so.6)",
              "ADDR (/usr/lib/x86_64-linux-gnu/libcuda.so.1)", "ADDR (/usr/lib/x86_64-linux-gnu/libcuda.so.1)",
              "cudaStreamSynchronize (/usr/local/cuda/lib64/libcudart.so.12)",
              "at::native::_local_scalar_dense_cuda (/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so)"]
LOCK_SET_DEVICE = ["__futex_abstimed_wait_common (/usr/lib/x86_64-linux-gnu/libc.so.6)",
                   "__pthread_rwlock_wrlock_full64 (/usr/lib/x86_64-linux-gnu/libc.so.6)",
                   "ADDR (/usr/lib/x86_64-linux-gnu/libcuda.so.1)", "ADDR (/usr/lib/x86_64-linux-gnu/libcuda.so.1)",
                   "cudaSetDevice (/usr/local/cuda/lib64/libcudart.so.12)",
                   "c10::cuda::set_device (/venv/lib/python3.11/site-packages/torch/lib/libc10_cuda.so)"]
NCCL_GROUP_END = ["ADDR (/usr/lib/x86_64-linux-gnu/libcuda.so.1)",
                  "ncclLaunchKernel (enqueue.cc:1092)", "ncclGroupEndInternal (group.cc:406)",
                  "ncclGroupEnd (group.cc:110)",
                  "c10d::ProcessGroupNCCL::collective (libtorch_cuda.so)"]
NCCL_BOOTSTRAP = ["accept4 (/usr/lib/x86_64-linux-gnu/libc.so.6)", "ncclSocketAccept (socket.cc:644)",
                  "bootstrapNetAccept (bootstrap.cc:106)", "bootstrapInit (bootstrap.cc:299)",
                  "initTransportsRank (init.cc:812)", "ncclCommInitRankFunc (init.cc:1394)",
                  "ncclCommInitRank (init.cc:1687)"]
ROCM_SYNC = ["ioctl (/usr/lib/x86_64-linux-gnu/libc.so.6)", "ADDR (/opt/rocm/lib/libhsakmt.so.1)",
             "rocr::core::InterruptSignal::WaitRelaxed (/opt/rocm/lib/libhsa-runtime64.so.1)",
             "ADDR (/opt/rocm/lib/libamdhip64.so.6)", "hipStreamSynchronize (/opt/rocm/lib/libamdhip64.so.6)"]


def frames_of(native: list[str]) -> list[Frame]:
    (t,) = parse_dump(dump(native, python=[]))
    return list(t.frames)


def test_a_spinning_item_is_a_gpu_wait_named_by_its_api_call_never_by_an_address():
    g = gpu_wait(frames_of(SPIN_ITEM))
    assert g is not None and g.kind == "gpu-wait" and g.call == "cudaMemcpyAsync"
    assert g.library == "the CUDA runtime" and g.innermost == "in the CUDA driver" and "0x" not in g.text


def test_a_driver_file_with_its_version_suffix_is_the_driver():
    assert library_of(Frame("0x7f01", "/usr/lib/libcuda.so.535.104.05", 0)).key == "cuda-driver"
    assert library_of(Frame("0x7f01", "libcudart-f7fdd8d7.so.9.0", 0)).key == "cuda-runtime"
    assert library_words("cuda-driver") == "the CUDA driver"


def test_api_calls_are_matched_by_their_c_prefix_never_a_substring():
    # libtorch_cuda.so holds at::cuda::… too: not an API call, not a wait by name
    assert library_of(Frame("at::cuda::getCurrentCUDAStream", "libtorch_cuda.so", 0)).key == "torch-cuda"
    # the runtime or NCCL linked into another library keeps its names
    assert library_of(Frame("cudaLaunchKernel", "/usr/lib/libnccl.so.2", 0)).key == "cuda-runtime"
    assert library_of(Frame("ncclGroupEnd", "/venv/torch/lib/libtorch_cuda.so", 0)).key == "nccl"
    assert library_of(Frame("cudaGetDevice_helper", "/usr/lib/libfoo.so", 0)).key == "cuda-runtime"
    assert library_of(Frame("curl_easy_perform", "/usr/lib/libcurl.so.4", 0)) is None  # "cu" + lowercase


def test_a_sleeping_wait_under_a_sync_is_a_gpu_wait_said_as_sleeping():
    g = gpu_wait(frames_of(SLEEP_SYNC), sleeping=True)
    assert g.kind == "gpu-wait" and g.primitive == "wait" and g.call == "cudaStreamSynchronize"
    assert "sleeping" in g.text


def test_a_lock_acquire_in_the_driver_under_a_call_that_does_not_wait_is_gpu_lock():
    g = gpu_wait(frames_of(LOCK_SET_DEVICE))
    assert g.kind == "gpu-lock" and g.call == "cudaSetDevice" and g.library == "the CUDA driver"
    for call in ("cudaEventDestroy", "cudaHostUnregister"):
        assert gpu_wait(frames_of([*LOCK_SET_DEVICE[:4], f"{call} (libcudart.so.12)"])).kind == "gpu-lock"
    # the same lock under a call that waits for work (a sync) is not called a deadlock on its word
    assert gpu_wait(frames_of([*LOCK_SET_DEVICE[:4], "cudaStreamSynchronize (libcudart.so.12)"])).kind == "gpu-wait"
    # a lock with no call named at all (the driver's frames only) is still the lock
    assert gpu_wait(frames_of(LOCK_SET_DEVICE[:4])).kind == "gpu-lock"


def test_nccl_host_code_with_source_files_is_nccl_said_where():
    g = gpu_wait(frames_of(NCCL_BOOTSTRAP))
    assert g.kind == "nccl" and g.nccl_where == "NCCL communicator setup waiting for a peer"
    g = gpu_wait(frames_of(NCCL_GROUP_END))
    assert g.kind == "nccl" and g.nccl_where == "NCCL launching a collective" and g.library == "NCCL"
    # a kernel launch blocked under it (a full queue) is a GPU wait, said with its NCCL caller
    g = gpu_wait(frames_of(["ADDR (libcuda.so.1)", "cudaLaunchKernel (/usr/lib/libnccl.so.2)", *NCCL_GROUP_END[1:]]))
    assert g.kind == "gpu-wait" and g.call == "cudaLaunchKernel" and g.nccl_where == "NCCL launching a collective"


def test_rocm_waits_are_gpu_waits_in_words():
    g = gpu_wait(frames_of(ROCM_SYNC), sleeping=True)
    assert g.kind == "gpu-wait" and g.call == "hipStreamSynchronize" and g.library == "HIP (the ROCm runtime API)"
    assert library_of(Frame("ncclAllReduce", "/opt/rocm/lib/librccl.so.1", 0)).key == "rccl"


def test_an_unknown_gpu_call_counts_as_waiting():
    g = gpu_wait(frames_of(["ADDR (libcuda.so.1)", "cuSomethingNew (libcuda.so.1)"]))
    assert g.kind == "gpu-wait"


def test_cpp_names_with_parentheses_keep_their_library():
    text = dump(["at::native::DispatchStub<void (*)(at::TensorIterator&, bool), at::native::sum_stub>::operator()"
                 "<at::TensorIterator&, bool&> (/venv/torch/lib/libtorch_cpu.so)", *SPIN_ITEM])
    (t,) = parse_dump(text)
    assert t.frames[0].file == "/venv/torch/lib/libtorch_cpu.so"
    assert t.frames[0].function.startswith("at::native::DispatchStub<void (*)(at::TensorIterator&, bool)")


# --------------------------------------------------------------------------- the verdict on them


def test_waiting_ranks_that_sleep_at_their_sync_never_make_a_culprit_the_stuck_rank_does():
    sleeper = lambda pid: [dump(SLEEP_SYNC, state="idle", pid=pid)] * 2  # noqa: E731
    stuck = [dump(["clock_nanosleep (libc.so.6)"], ["next_batch (/w/train.py:60)", "<module> (/w/train.py:200)"],
                  state="idle", pid=7)] * 2
    v = verdict({0: sleeper(1), 1: stuck, 2: sleeper(3)})
    assert v.hung is True and v.culprits == (1,) and v.waiting == (0, 2) and v.confirmed, v.summary
    assert v.where[0].kind == "gpu-wait" and "sleeping" in v.where[0].text
    # two ranks: still the stuck one (the sleeper is never the culprit because it sleeps)
    v = verdict({0: sleeper(1), 1: stuck})
    assert v.culprits == (1,) and v.waiting == (0,)


def test_addresses_never_split_groups_of_ranks():
    v = verdict({r: [dump(SPIN_ITEM, pid=100 + r), dump(SPIN_ITEM, pid=100 + r)] for r in range(4)})
    assert len(v.groups) == 1 and v.groups[0].ranks == (0, 1, 2, 3)
    assert "0x" not in v.summary and "in the CUDA driver" not in v.summary or "0x" not in v.summary


def test_one_rank_on_the_drivers_lock_while_the_others_wait_is_the_culprit():
    lock = [dump(LOCK_SET_DEVICE, state="idle", pid=9)] * 2
    spin = [dump(SPIN_ITEM, pid=8)] * 2
    v = verdict({0: spin, 1: lock, 2: spin})
    assert v.hung is True and v.culprits == (1,) and v.where[1].kind == "gpu-lock" and not v.deadlock
    assert "lock in the CUDA driver" in v.summary and "`cudaSetDevice`" in v.summary


def test_every_rank_on_the_drivers_lock_is_a_deadlock_with_no_odd_rank_out():
    lock = lambda pid: [dump(LOCK_SET_DEVICE, state="idle", pid=pid)] * 2  # noqa: E731
    v = verdict({0: lock(1), 1: lock(2)})
    assert v.hung is True and v.culprits == () and v.deadlock
    assert v.summary.startswith("hung: a deadlock in the CUDA driver"), v.summary


def test_other_threads_in_gpu_code_or_holding_the_gil_are_named_beside_a_lock_wait():
    text = dump(LOCK_SET_DEVICE, state="idle") + (
        'Thread 4250 (active+gil): "pt_autograd_0"\n    ADDR (/usr/lib/x86_64-linux-gnu/libcuda.so.1)\n'
        "    cudaEventDestroy (/usr/local/cuda/lib64/libcudart.so.12)\n"
        "    backward (/venv/lib/python3.11/site-packages/torch/autograd/__init__.py:200)\n").replace(
        "ADDR", "0x7f0000001234")
    st = rank_state(parse_dump(text))
    assert st.kind == "gpu-lock" and len(st.others) == 1
    assert "pt_autograd_0" in st.others[0] and "holds the GIL" in st.others[0]


@pytest.mark.parametrize("line,kind", [("loss.item()", "gpu-wait"), ("time.sleep(86400)", "sleep/wait in user code")])
def test_without_native_frames_a_sync_line_waits_and_a_sleep_does_not(line, kind):
    py = "Process 5: python\n\nThread 5 (idle): \"MainThread\"\n    train (/w/train.py:88)\n"
    v = verdict({0: [py, py]}, source_line=lambda f, n: line)
    assert v.where[0].kind == kind


def test_without_native_frames_or_telemetry_a_line_nothing_names_cannot_be_told():
    """A GPU job (another rank's native frames show CUDA), one rank whose dump has no native frames, on a
    line whose source cannot be read and whose GPU is unknown: neither culprit nor waiter, and said so."""
    spin = [dump(SPIN_ITEM, pid=8)] * 2
    py = "Process 5: python\n\nThread 5 (active): \"MainThread\"\n    train (/w/train.py:91)\n"
    v = verdict({0: spin, 1: [py, py]})
    assert v.where[1].status == "unclear" and 1 not in v.culprits and 1 not in v.waiting
    assert "rank 1 cannot tell" in v.summary
    # with its GPU busy (telemetry), the same rank waits on the GPU; with it idle, it works (a long C call on
    # the CPU, which the others wait for); asleep there with its GPU idle, it is the odd one out
    assert verdict({0: spin, 1: [py, py]}, gpu_util={1: 100.0}).where[1].kind == "gpu-wait"
    v = verdict({0: spin, 1: [py, py]}, gpu_util={0: 100.0, 1: 0.0})
    assert v.culprits == () and v.workers == (1,) and v.hung is False
    asleep = py.replace("(active)", "(idle)")
    assert verdict({0: spin, 1: [asleep, asleep]}, gpu_util={0: 100.0, 1: 0.0}).culprits == (1,)


def test_the_recorded_driver_lock_names_the_thread_running_a_host_function_for_the_runtime():
    """tests/data/stacks/cuda_driver_lock (py-spy --native of the CUDA stand-in's driver-lock deadlock, recorded
    on this machine): the main thread on the lock inside cudaEventDestroy; the runtime's worker thread running
    the Python host function that holds it."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "data" / "stacks" / "cuda_driver_lock.r1.2.txt").read_text()
    st = rank_state(parse_dump(text))
    assert st.kind == "gpu-lock" and st.call == "cudaEventDestroy" or "cudaEventDestroy" in st.text
    assert len(st.others) == 1 and "called back from the GPU library (`worker`, the CUDA runtime)" in st.others[0]
    assert "log_metrics" in st.others[0]


# --------------------------------------------------------------------------- pastes people make

PY_THEN_GDB = """\
Thread 367714 (active): "MainThread"
    ctc_loss (torch/nn/functional.py:3086)
    compute_loss (myproject/models/aed.py:207)
    <module> (train.py:11)

#0  0x000014e37c579940 in clock_gettime@plt () from /lib64/libcuda.so.1
#1  0x000014e37c724994 in ?? () from /lib64/libcuda.so.1
#2  0x000014e37c63fd8c in ?? () from /lib64/libcuda.so.1
#3  0x000014e4468293a5 in ?? ()
   from /venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12
#4  0x000014e44688a7d8 in cudaStreamSynchronize ()
   from /venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12
#5  0x000014e44688a7d9 in at::native::ctc_loss_gpu(at::Tensor const&) () from /venv/lib/libtorch_cuda.so
#6  0x00000000005dc982 in _PyEval_EvalFrameDefault (tstate=0x26c3650) at Python/ceval.c:385
"""


def test_a_python_only_dump_and_a_gdb_backtrace_of_one_process_read_as_one(tmp_path):
    """People paste `py-spy dump` (Python frames only) and then gdb's `bt` of the same process (native frames
    only): read together, the rank waits on the GPU at its Python line."""
    from ddptop.core.sources import stack_files as dump_files

    f = tmp_path / "rank0.txt"
    f.write_text(PY_THEN_GDB)
    ds = dump_files.load([str(f)])
    v = verdict(ds.samples)
    w = v.where[0]
    assert w.kind == "gpu-wait" and w.native.startswith("cudaStreamSynchronize") and w.line == 207, w
    assert any("read as one" in n for n in ds.notes) and ds.formats == {"py-spy", "gdb"}


GDB_SESSION = """\
#1  0x00007f916b0090dd in pthread_mutex_lock () from /lib/x86_64-linux-gnu/libc.so.6
(gdb) up
#2  0x00007f9160c22336 in c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long, CUstream_st*) ()
   from /venv/torch/lib/libc10_cuda.so
(gdb) down
#1  0x00007f916b0090dd in pthread_mutex_lock () from /lib/x86_64-linux-gnu/libc.so.6
(gdb) bt
#0  0x00007f916b002197 in ?? () from /lib/x86_64-linux-gnu/libc.so.6
#1  0x00007f916b004f1b in pthread_cond_timedwait () from /lib/x86_64-linux-gnu/libc.so.6
#2  0x00000000004d2a2b in take_gil (tstate=0x7ffc50f44890) at Python/ceval_gil.h:247
#3  0x00000000005dc982 in PyEval_AcquireThread (tstate=0x26c3650) at Python/ceval.c:385
#4  0x00007f91323e8c65 in pybind11::gil_scoped_acquire::gil_scoped_acquire() () from /venv/torch/lib/libtorch_python.so
"""


def test_a_gdb_session_with_two_backtraces_is_two_threads_and_a_lock_against_the_gil_is_said():
    threads = parse_dump(GDB_SESSION)
    assert len(threads) == 2 and [f.function for f in threads[0].frames][:2] == [
        "pthread_mutex_lock", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, "
        "unsigned long, CUstream_st*)"]  # (the frame up/down printed twice is kept once)
    st = rank_state(threads)
    assert st.kind == "gpu-lock" and "a lock-order deadlock with the GIL" in st.text
    assert any("waits to take the GIL" in o for o in st.others)


@pytest.mark.parametrize("path,kind", [("fairseq/data/iterators.py", "data"), ("/home/me/proj/dataloader.py", "data"),
                                       ("/data/users/me/train.py", "user"), ("myproj/models/net.py", "user")])
def test_data_loading_code_is_told_by_its_file_or_folder_never_by_a_mount_point(path, kind):
    from ddptop.core.analysis.stack_verdict import classify_frame

    assert classify_frame(Frame("__next__", path, 10)) == kind


def test_a_launch_is_told_from_a_sync_by_the_calls_name():
    """The calls that launch work or load the code a launch needs (held by the GPU's queue under lazy loading
    or CUDA_LAUNCH_BLOCKING=1), against those that wait for work to finish."""
    from ddptop.core.analysis.native_frames import is_launch

    for call in ("cudaLaunchKernel (libcudart.so.13)", "cuLaunchKernel", "cuLaunchKernelEx", "cuLibraryLoadData",
                 "cuModuleLoadData", "cudaGraphLaunch", "cuGraphLaunch", "cuModuleGetFunction", "cuLibraryGetKernel",
                 "hipLaunchKernel", "hipModuleLaunchKernel", "hipExtLaunchKernel", "`cudaLaunchCooperativeKernel`"):
        assert is_launch(call), call
    for call in ("cudaStreamSynchronize (libcudart.so.12)", "cuEventSynchronize", "cudaMemcpyAsync", "ncclGroupEnd",
                 "cuGraphInstantiate", "in the CUDA driver", "", "pthread_mutex_lock"):
        assert not is_launch(call), call
