"""The CUDA runtime stand-in (examples/cuda_stub, examples/sim_cuda.py): a
libcudart.so.12 whose synchronising calls spin like CUDA's by default and sleep
with blocking synchronisation (cudaDeviceScheduleBlockingSync, or an event made
with cudaEventBlockingSync), whose driver lock blocks the calls that change the
driver's state while a host function runs (and deadlocks a caller that keeps
the GIL against a host function written in Python), and the example's
--sim-cuda mode, in which a rank waiting for a hung peer spins at its sync line
under real torchrun, as a rank of an NCCL job does on a GPU.

(What needs no compiler: tests/unit/test_cuda_stub.py.)"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EXAMPLE = EXAMPLES / "train_ddp.py"
_spec = importlib.util.spec_from_file_location("sim_cuda", EXAMPLES / "sim_cuda.py")
sim_cuda = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim_cuda)

TIMEOUT = 60  # seconds, for any one wait or subprocess here


def py_spy() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    assert found, "py-spy is not installed"
    return found


def dump(pid: int, native: bool = False) -> str:
    r = subprocess.run([py_spy(), "dump", "--full-filenames", *(["--native"] if native else []), "--pid", str(pid)],
                       capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


def main_thread(text: str) -> list[str]:
    """The MainThread block of a py-spy dump: its header, then its frames, innermost first."""
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("Thread ") and '"MainThread"' in l)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("Thread ")), len(lines))
    return [l.strip() for l in lines[start:end] if l.strip()]


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def busy_seconds(proc: psutil.Process) -> float:
    """Seconds its threads were runnable: on a CPU, or waiting in a run queue for one
    (/proc/PID/task/*/schedstat). A spinning thread is runnable all the time, however few
    cycles a loaded machine gives it (its CPU time there is its share of the cores)."""
    from ddptop.core.sources.telemetry import runnable_ns

    ns = runnable_ns(proc.pid)
    return sum(ns.values()) / 1e9 if ns else cpu_seconds(proc)


def kill_tree(p: subprocess.Popen) -> None:
    """SIGKILL a process started in its own session and all its descendants
    (torchrun starts each rank in a session of its own)."""
    try:
        kids = psutil.Process(p.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    for k in kids:
        try:
            k.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=TIMEOUT)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache directory with the library built in it (XDG_CACHE_HOME for subprocesses)."""
    if sim_cuda.compiler() is None:
        pytest.skip("no C compiler (gcc or cc)")
    d = tmp_path_factory.mktemp("xdg-cache")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(d)
    try:
        lib, why = sim_cuda.load(verbose=False)
        assert lib is not None, why
    finally:
        if old is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = old
    return d


@pytest.fixture
def cudart(cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    lib, why = sim_cuda.load(verbose=False)
    assert lib is not None, why
    return lib


def test_builds_once_per_source_into_the_per_user_cache(cache, monkeypatch, capfd):
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    lib = sim_cuda.cache_dir() / "libcudart.so.12"
    assert lib.is_file() and lib.parent.parent == cache / "ddptop" / "cuda-stub"
    before = lib.stat().st_mtime_ns
    cudart, why = sim_cuda.load()
    assert why is None and lib.stat().st_mtime_ns == before  # cached: not built again
    assert "building" not in capfd.readouterr().err
    exported = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                              timeout=TIMEOUT, check=True).stdout if shutil.which("nm") else ""
    for name in [*sim_cuda._SIGNATURES, *sim_cuda.KERNELS]:
        assert getattr(cudart, name)  # (raises AttributeError when missing)
        assert not exported or f" T {name}\n" in exported


def test_first_use_builds_and_says_so_once(tmp_path, monkeypatch, capfd):
    if sim_cuda.compiler() is None:
        pytest.skip("no C compiler (gcc or cc)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cudart, why = sim_cuda.load()
    assert cudart is not None, why
    err = capfd.readouterr().err
    assert err.count("building the CUDA runtime stand-in") == 1 and "(first use)" in err
    assert list((tmp_path / "ddptop" / "cuda-stub").glob("*/libcudart.so.12"))
    assert not [p for p in (tmp_path / "ddptop" / "cuda-stub").glob("*/libcudart.so.12.*")]  # no temp file left


def test_ranks_starting_together_build_it_once(tmp_path):
    if sim_cuda.compiler() is None:
        pytest.skip("no C compiler (gcc or cc)")
    code = f"import sys; sys.path.insert(0, {str(EXAMPLES)!r}); import sim_cuda; lib, why = sim_cuda.load(); assert lib, why"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    try:
        errs = [p.communicate(timeout=TIMEOUT)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0], errs
    assert sum(e.count("building the CUDA runtime stand-in") for e in errs) == 1, errs


def test_stream_order_queries_events_and_memcpy(cudart):
    stream = sim_cuda.Stream(cudart)
    gate, ran = threading.Event(), []
    stream.enqueue(lambda: gate.wait(TIMEOUT))
    for i in range(5):
        stream.enqueue(lambda i=i: ran.append((i, threading.get_ident())))
    ev = ctypes.c_void_p()
    cudart.cudaEventCreate(ctypes.byref(ev))
    assert cudart.cudaEventQuery(ev) == 0  # never recorded: complete
    cudart.cudaEventRecord(ev, stream.handle)
    assert cudart.cudaStreamQuery(stream.handle) == 600 and cudart.cudaEventQuery(ev) == 600  # cudaErrorNotReady
    src, dst = ctypes.create_string_buffer(b"payload"), ctypes.create_string_buffer(8)
    threading.Timer(0.3, gate.set).start()  # the "kernel" ends a moment later
    cudart.cudaMemcpy(dst, src, 8, 4)  # cudaMemcpyDefault: waits for all streams, then copies
    assert gate.is_set() and dst.value == b"payload"
    assert [i for i, _ in ran] == list(range(5))  # in stream order
    assert len({t for _, t in ran}) == 1 and ran[0][1] != threading.get_ident()  # on the stream's thread
    assert cudart.cudaStreamQuery(stream.handle) == 0 and cudart.cudaEventQuery(ev) == 0
    # an event captures only the work enqueued before it was recorded
    gate.clear()
    stream.enqueue(lambda: gate.wait(TIMEOUT))
    cudart.cudaEventSynchronize(ev)
    assert cudart.cudaStreamQuery(stream.handle) == 600
    gate.set()
    cudart.cudaDeviceSynchronize()
    assert cudart.cudaStreamQuery(stream.handle) == 0
    cudart.cudaEventDestroy(ev)
    stream.destroy()
    with pytest.raises(sim_cuda.CudaError):
        cudart.cudaStreamCreate(None)  # cudaErrorInvalidValue


def test_a_failed_collective_never_completes_the_stream(cudart):
    """NCCL semantics: a collective whose peer is gone does not complete with an
    error; its kernel never ends, nor does anything after it on the stream."""
    import torch

    fut = torch.futures.Future()

    class Work:  # what dist.all_reduce(..., async_op=True) returns, as far as the stream cares
        def get_future(self):
            return fut

    stream = sim_cuda.Stream(cudart)
    after = threading.Event()
    stream.collective(Work())
    stream.enqueue(after.set)
    try:
        fut.set_exception(RuntimeError("Connection closed by peer"))
        wait_for(lambda: stream.errors, timeout=TIMEOUT, what="the collective to fail")
        assert "Connection closed" in str(stream.errors[0])
        assert not after.wait(0.5) and cudart.cudaStreamQuery(stream.handle) == 600
    finally:
        # (not NCCL: end the stuck kernel, so that it does not keep a core of this process for good)
        for flag in stream._never:
            flag.value = 1
    assert after.wait(TIMEOUT)


def test_a_collective_kernel_keeps_the_device_busy_until_the_collective_completes(cudart):
    """The device (the stream's thread) is busy while a collective kernel waits for its
    peers, as an NCCL kernel spins on the GPU: runnable about all the time (ddptop --gpu sim
    reads that as the GPU's utilisation), then idle once it has completed."""
    import torch

    fut = torch.futures.Future()

    class Work:
        def get_future(self):
            return fut

    me = psutil.Process()
    stream = sim_cuda.Stream(cudart)
    stream.collective(Work())
    try:
        c0, t0 = busy_seconds(me), time.monotonic()
        wait_for(lambda: time.monotonic() - t0 >= 1.0, timeout=TIMEOUT, interval=0.05)
        busy = (busy_seconds(me) - c0) / (time.monotonic() - t0)
        assert busy > 0.5, f"{busy:.2f} s runnable per second: the device is not busy"
        assert cudart.cudaStreamQuery(stream.handle) == 600
    finally:
        fut.set_result([None])  # the peers came
    wait_for(lambda: cudart.cudaStreamQuery(stream.handle) == 0, timeout=TIMEOUT, what="the kernel to end")
    c0, t0 = busy_seconds(me), time.monotonic()
    wait_for(lambda: time.monotonic() - t0 >= 1.0, timeout=TIMEOUT, interval=0.05)
    assert (busy_seconds(me) - c0) / (time.monotonic() - t0) < 0.5  # (the test's own thread, polling)


def test_a_timed_kernel_runs_for_its_time_in_stream_order(cudart):
    stream = sim_cuda.Stream(cudart)
    order = []
    stream.enqueue(lambda: order.append(("before", time.monotonic())))
    stream.run(0.3)
    stream.enqueue(lambda: order.append(("after", time.monotonic())))
    cudart.cudaStreamSynchronize(stream.handle)
    assert [k for k, _ in order] == ["before", "after"] and order[1][1] - order[0][1] >= 0.3


def test_device_flags_events_flags_and_registration_follow_the_api(cudart):
    """Flag values, validation and error codes as in the CUDA runtime API."""
    count, device, flags = ctypes.c_int(), ctypes.c_int(), ctypes.c_uint()
    cudart.cudaGetDeviceCount(ctypes.byref(count))
    assert count.value >= 2
    try:
        cudart.cudaSetDevice(1)
        cudart.cudaGetDevice(ctypes.byref(device))
        assert device.value == 1
        with pytest.raises(sim_cuda.CudaError, match="error 101"):  # cudaErrorInvalidDevice
            cudart.cudaSetDevice(count.value)
        cudart.cudaGetDeviceFlags(ctypes.byref(flags))
        assert flags.value == sim_cuda.cudaDeviceMapHost  # cudaDeviceScheduleAuto, and MapHost is implicit
        cudart.cudaSetDeviceFlags(sim_cuda.cudaDeviceScheduleBlockingSync)
        cudart.cudaGetDeviceFlags(ctypes.byref(flags))
        assert flags.value == sim_cuda.cudaDeviceScheduleBlockingSync | sim_cuda.cudaDeviceMapHost
        for bad in (3, 0x05, 0x100):  # two schedules at once; outside cudaDeviceMask
            with pytest.raises(sim_cuda.CudaError, match="error 1$"):  # cudaErrorInvalidValue
                cudart.cudaSetDeviceFlags(bad)
        # the flags are the device's: device 0's are still the default
        cudart.cudaSetDevice(0)
        cudart.cudaGetDeviceFlags(ctypes.byref(flags))
        assert flags.value == sim_cuda.cudaDeviceMapHost
    finally:
        cudart.cudaSetDevice(1)
        cudart.cudaSetDeviceFlags(sim_cuda.cudaDeviceScheduleAuto)
        cudart.cudaSetDevice(0)
    ev = ctypes.c_void_p()
    for ok in (0, sim_cuda.cudaEventBlockingSync | sim_cuda.cudaEventDisableTiming,
               sim_cuda.cudaEventInterprocess | sim_cuda.cudaEventDisableTiming):
        cudart.cudaEventCreateWithFlags(ctypes.byref(ev), ok)
        cudart.cudaEventDestroy(ev)
    for bad in (sim_cuda.cudaEventInterprocess, 0x08):  # interprocess needs DisableTiming; no such flag
        with pytest.raises(sim_cuda.CudaError, match="error 1$"):
            cudart.cudaEventCreateWithFlags(ctypes.byref(ev), bad)
    buf = ctypes.create_string_buffer(4096)
    cudart.cudaHostRegister(buf, 4096, 0)
    with pytest.raises(sim_cuda.CudaError, match="error 712"):  # cudaErrorHostMemoryAlreadyRegistered
        cudart.cudaHostRegister(ctypes.byref(buf, 100), 10, 0)
    with pytest.raises(sim_cuda.CudaError, match="error 713"):  # cudaErrorHostMemoryNotRegistered
        cudart.cudaHostUnregister(ctypes.byref(buf, 100))  # not the base address
    cudart.cudaHostUnregister(buf)
    with pytest.raises(sim_cuda.CudaError, match="error 713"):
        cudart.cudaHostUnregister(buf)


def test_host_functions_of_two_streams_run_side_by_side(cudart):
    """The driver's lock is held shared by the stream threads: a host function on one
    stream does not keep another stream's from running."""
    a, b = sim_cuda.Stream(cudart), sim_cuda.Stream(cudart)
    b_ran, a_done = threading.Event(), threading.Event()
    a.enqueue(lambda: b_ran.wait(TIMEOUT) and a_done.set())
    b.enqueue(b_ran.set)
    cudart.cudaStreamSynchronize(a.handle)
    assert a_done.is_set()


SPINNER = """\
import sys
sys.path.insert(0, {examples!r})
import sim_cuda
cudart, why = sim_cuda.load()
stream = sim_cuda.Stream(cudart)
stream.enqueue(sys.stdin.readline)  # a "kernel" that ends when the parent says so
print("syncing", flush=True)
cudart.cudaStreamSynchronize(stream.handle)  # SYNC LINE
print("returned", flush=True)
"""


def test_stream_synchronize_spins_in_libcudart_until_the_host_function_completes(cache, tmp_path):
    script = tmp_path / "spinner.py"
    script.write_text(SPINNER.format(examples=str(EXAMPLES)))
    sync_line = 1 + next(i for i, l in enumerate(SPINNER.splitlines()) if l.endswith("# SYNC LINE"))
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    p = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    try:
        assert p.stdout.readline() == "syncing\n"
        proc = psutil.Process(p.pid)
        # it spins: it wants about a core per second of waiting (runnable, not asleep)
        c0, t0 = busy_seconds(proc), time.monotonic()
        wait_for(lambda: time.monotonic() - t0 >= 1.5, timeout=TIMEOUT, interval=0.05)
        busy = (busy_seconds(proc) - c0) / (time.monotonic() - t0)
        assert busy > 0.5, f"{busy:.2f} s runnable per second: not spinning"
        assert p.poll() is None
        # native: the CUDA entry point is the innermost frame, above the calling line
        frames = main_thread(dump(p.pid, native=True))
        assert "(active" in frames[0], frames
        assert re.fullmatch(r"cudaStreamSynchronize \(/\S+/libcudart\.so\.12\)", frames[1]), frames
        calling = f"<module> ({script}:{sync_line})"
        assert calling in frames and frames.index(calling) > 1, frames
        # without --native: the calling line is the innermost Python frame, and the thread is active
        frames = main_thread(dump(p.pid))
        assert "(active" in frames[0] and frames[1] == calling, frames
        # the "kernel" ends: the synchronisation returns
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline() == "returned\n"
        assert p.wait(timeout=TIMEOUT) == 0
    finally:
        kill_tree(p)


# A child that makes one CUDA call (THE CALL) while a host function on its stream waits
# for a line from the parent: the call waits for the stream (a synchronisation) or for
# the driver's lock (held while a host function runs) until the parent writes a line.
CHILD = """\
import ctypes, sys, threading
sys.path.insert(0, {examples!r})
import sim_cuda
cudart, why = sim_cuda.load()
{setup}
stream = sim_cuda.Stream(cudart)
started = threading.Event()


def host_function():  # on the stream's thread, with the driver's lock held; Python: it needs the GIL
    started.set()
    sys.stdin.readline()  # HOST LINE: until the parent says so (without the GIL meanwhile)


stream.enqueue(host_function)
started.wait()
{before}
print("calling", flush=True)
{call}  # THE CALL
print("returned", flush=True)
"""


class Child:
    """CHILD with its setup and call, in a session of its own, its output read by a thread."""

    def __init__(self, tmp_path: Path, cache: Path, call: str, setup: str = "", before: str = ""):
        text = CHILD.format(examples=str(EXAMPLES), setup=setup, before=before, call=call)
        self.script = tmp_path / "child.py"
        self.script.write_text(text)
        self.call_line = 1 + next(i for i, l in enumerate(text.splitlines()) if l.endswith("# THE CALL"))
        self.host_line = 1 + next(i for i, l in enumerate(text.splitlines()) if "# HOST LINE" in l)
        self.p = subprocess.Popen([sys.executable, str(self.script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=dict(os.environ, XDG_CACHE_HOME=str(cache)),
                                  start_new_session=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(l.rstrip("\n") for l in self.p.stdout), daemon=True).start()

    @property
    def calling(self) -> str:
        return f"<module> ({self.script}:{self.call_line})"

    def wait_for_line(self, line: str) -> None:
        wait_for(lambda: line in self.lines, timeout=TIMEOUT, what=f"{line!r} from the child",
                 fail_if=lambda: self.p.poll() is not None and line not in self.lines
                 and f"it exited ({self.p.returncode}): {self.lines[-20:]}")

    def release(self) -> None:
        """The host function ends (it reads its line)."""
        self.p.stdin.write("go\n")
        self.p.stdin.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        kill_tree(self.p)


def thread_block(text: str, frame: str) -> list[str]:
    """The block of the thread (header, frames innermost first) one of whose frames starts with ``frame``."""
    blocks, cur = [], None
    for l in text.splitlines():
        if l.startswith("Thread "):
            cur = [l.strip()]
            blocks.append(cur)
        elif cur is not None and l.strip():
            cur.append(l.strip())
    return next((b for b in blocks if any(f.startswith(frame) for f in b[1:])), [])


def in_cuda(frames: list[str], name: str) -> list[str]:
    """The frames inside the CUDA entry point ``name`` (innermost first), after checking
    that it is the stand-in library's only frame there."""
    at = next((i for i, f in enumerate(frames) if re.fullmatch(rf"{name} \(/\S+/libcudart\.so\.12\)", f)), None)
    assert at is not None, frames
    assert not any("libcudart" in f for f in frames[1:at]), frames  # the entry point is the library's only frame
    return frames[1:at]


def libc(frame: str) -> str:
    """A native frame's function when it is libc's ("0x7f..." when it has no symbol), else ""."""
    m = re.fullmatch(r"(\S+) \((?:\S*/)?libc\.so\.6\)", frame)
    return m.group(1) if m else ""


BLOCKING = "cudart.cudaSetDeviceFlags(sim_cuda.cudaDeviceScheduleBlockingSync)"
BLOCKING_EVENT = ("ev = ctypes.c_void_p()\n"
                  "cudart.cudaEventCreateWithFlags(ctypes.byref(ev), sim_cuda.cudaEventBlockingSync"
                  " | sim_cuda.cudaEventDisableTiming)\n"
                  "cudart.cudaEventRecord(ev, stream.handle)")
MEMCPY = "src, dst = ctypes.create_string_buffer(b'x'), ctypes.create_string_buffer(1)"


@pytest.mark.parametrize("name, setup, before, call", [
    ("cudaStreamSynchronize", BLOCKING, "", "cudart.cudaStreamSynchronize(stream.handle)"),
    ("cudaDeviceSynchronize", BLOCKING, "", "cudart.cudaDeviceSynchronize()"),
    ("cudaMemcpy", BLOCKING, MEMCPY, "cudart.cudaMemcpy(dst, src, 1, 4)"),
    # on a device that spins (the default), an event made with cudaEventBlockingSync blocks
    ("cudaEventSynchronize", "", BLOCKING_EVENT, "cudart.cudaEventSynchronize(ev)"),
], ids=["stream", "device", "memcpy", "blocking-event"])
def test_with_blocking_sync_the_waiting_thread_sleeps_in_libcudart(cache, tmp_path, name, setup, before, call):
    """cudaDeviceScheduleBlockingSync: "block the CPU thread on a synchronization primitive
    when waiting for the device": the waiting thread sleeps (its runnable time barely
    grows), idle to py-spy, in libc's pthread_cond_wait inside the CUDA call, on the calling
    line; when the work completes, the call returns."""
    with Child(tmp_path, cache, call, setup, before) as child:
        child.wait_for_line("calling")
        frames = wait_for(lambda: (f := main_thread(dump(child.p.pid, native=True)))
                          and any(re.match(rf"{name} \(", l) for l in f) and "(idle" in f[0] and f,
                          timeout=TIMEOUT, what=lambda: f"the child asleep in {name}: {dump(child.p.pid, native=True)}")
        proc = psutil.Process(child.p.pid)
        c0, t0 = busy_seconds(proc), time.monotonic()
        wait_for(lambda: time.monotonic() - t0 >= 1.5, timeout=TIMEOUT, interval=0.05)
        busy = (busy_seconds(proc) - c0) / (time.monotonic() - t0)
        assert busy < 0.1, f"{busy:.2f} s runnable per second: not asleep"
        # native: libc's condition-variable wait inside the CUDA call, inside the calling line
        inside = in_cuda(frames, name)
        assert inside and all(libc(f) for f in inside), frames
        assert "pthread_cond_wait" in [libc(f) for f in inside], frames
        assert child.calling in frames, frames
        # Python only: idle, on the calling line
        frames = main_thread(dump(child.p.pid))
        assert "(idle" in frames[0] and frames[1] == child.calling, frames
        assert "returned" not in child.lines
        child.release()
        child.wait_for_line("returned")
        assert child.p.wait(timeout=TIMEOUT) == 0


def test_with_yield_the_waiting_thread_stays_runnable(cache, tmp_path):
    """cudaDeviceScheduleYield: "yield its thread when waiting": it loops on sched_yield,
    runnable all the time (active), like a spinning wait."""
    setup = "cudart.cudaSetDeviceFlags(sim_cuda.cudaDeviceScheduleYield)"
    with Child(tmp_path, cache, "cudart.cudaStreamSynchronize(stream.handle)", setup) as child:
        child.wait_for_line("calling")
        frames = wait_for(lambda: (f := main_thread(dump(child.p.pid, native=True)))
                          and any(l.startswith("cudaStreamSynchronize (") for l in f) and f,
                          timeout=TIMEOUT, what="the child in cudaStreamSynchronize")
        assert all(libc(f) for f in in_cuda(frames, "cudaStreamSynchronize")), frames  # sched_yield, or nothing
        proc = psutil.Process(child.p.pid)
        c0, t0 = busy_seconds(proc), time.monotonic()
        wait_for(lambda: time.monotonic() - t0 >= 1.5, timeout=TIMEOUT, interval=0.05)
        busy = (busy_seconds(proc) - c0) / (time.monotonic() - t0)
        assert busy > 0.5, f"{busy:.2f} s runnable per second: not yielding in a loop"
        child.release()
        child.wait_for_line("returned")


@pytest.mark.parametrize("name, before, call", [
    ("cudaEventDestroy", "ev = ctypes.c_void_p()\ncudart.cudaEventCreate(ctypes.byref(ev))", "cudart.cudaEventDestroy(ev)"),
    ("cudaSetDevice", "", "cudart.cudaSetDevice(1)"),
    ("cudaHostUnregister", "buf = ctypes.create_string_buffer(4096)\ncudart.cudaHostRegister(buf, 4096, 0)",
     "cudart.cudaHostUnregister(buf)"),
])
def test_a_call_that_takes_the_driver_lock_blocks_while_a_host_function_runs(cache, tmp_path, name, before, call):
    """The calls that change the driver's state take its lock, which the stream's thread
    holds while it runs a host function: the call blocks, idle, in pthread_rwlock_wrlock
    inside the CUDA entry point, until the host function ends."""
    if "cudaHostRegister" in before:  # (registered before the host function started: the lock was free then)
        setup, before = before, ""
    else:
        setup = ""
    with Child(tmp_path, cache, call, setup, before) as child:
        child.wait_for_line("calling")
        frames = wait_for(lambda: (f := main_thread(dump(child.p.pid, native=True)))
                          and any(l.startswith(f"{name} (") for l in f) and "(idle" in f[0] and f,
                          timeout=TIMEOUT, what=lambda: f"the child blocked in {name}: {dump(child.p.pid, native=True)}")
        inside = in_cuda(frames, name)
        assert inside and all(libc(f) for f in inside), frames
        assert libc(inside[-1]) == "pthread_rwlock_wrlock", frames  # called by the CUDA entry point itself
        assert child.calling in frames, frames
        assert "returned" not in child.lines
        child.release()
        child.wait_for_line("returned")
        assert child.p.wait(timeout=TIMEOUT) == 0


@pytest.mark.parametrize("gil", [True, False], ids=["keeps-the-gil", "releases-the-gil"])
def test_a_call_that_keeps_the_gil_deadlocks_against_a_python_host_function(cache, tmp_path, gil):
    """The lock-order deadlock: the stream's thread holds the driver's lock and runs a host
    function written in Python; the main thread calls cudaEventDestroy through a library
    whose calls keep the GIL (ctypes.PyDLL, as a C extension that does not release it) and
    waits for the driver's lock, the GIL held.  Once the host function's wait ends it needs
    the GIL back: neither thread can go on.  The same call releasing the GIL (ctypes.CDLL)
    returns once the host function ends."""
    lib = "sim_cuda.with_gil(cudart)" if gil else "cudart"
    before = "ev = ctypes.c_void_p()\ncudart.cudaEventCreate(ctypes.byref(ev))"
    with Child(tmp_path, cache, f"{lib}.cudaEventDestroy(ev)", before=before) as child:
        child.wait_for_line("calling")
        wait_for(lambda: (f := main_thread(dump(child.p.pid, native=True)))
                 and any(l.startswith("cudaEventDestroy (") for l in f) and "(idle" in f[0],
                 timeout=TIMEOUT, what="the child blocked in cudaEventDestroy")
        child.release()
        if not gil:
            child.wait_for_line("returned")
            assert child.p.wait(timeout=TIMEOUT) == 0
            return
        host = f"host_function ({child.script}:{child.host_line})"
        # the host function's read returns: its thread then waits for the GIL, at the same line
        text = wait_for(lambda: (t := dump(child.p.pid, native=True))
                        and not any(f.startswith("read (") for f in thread_block(t, host)) and t,
                        timeout=TIMEOUT, what="the host function to have read its line")
        for _ in range(2):  # and both stay there
            main, worker = main_thread(text), thread_block(text, host)
            assert "(idle" in main[0] and libc(in_cuda(main, "cudaEventDestroy")[-1]) == "pthread_rwlock_wrlock", text
            assert child.calling in main, text
            # (the worker waits for the GIL in take_gil's timed wait, which wakes every 5 ms to ask for it: py-spy
            # calls the thread idle or active depending on the moment; where it waits is what holds)
            assert host in worker and libc(worker[worker.index(host) - 1]) in ("pthread_cond_timedwait",
                                                                                "pthread_cond_wait"), text
            assert any(f.startswith("worker (") and "libcudart.so.12" in f for f in worker), text  # the stream's thread
            text = dump(child.p.pid, native=True)
        assert "returned" not in child.lines and child.p.poll() is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_under_torchrun_the_rank_waiting_for_a_hung_peer_spins_at_its_sync_line(cache, tmp_path):
    """--sim-cuda on --fault hang: rank 1 is stuck in data loading before its
    all-reduce; rank 0's all-reduce is queued on its stream, and rank 0 spins
    at the line that synchronises with the stream (loss.item() on a GPU)."""
    source = EXAMPLE.read_text().splitlines()
    sync_line = 1 + next(i for i, l in enumerate(source) if "cudart.cudaStreamSynchronize(stream.handle)" in l)
    out = tmp_path / "torchrun.log"
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           str(EXAMPLE), "--sim-cuda", "on", "--steps", "100000", "--step-time", "0.05",
           "--fault", "hang", "--fault-rank", "1", "--fault-step", "3"]
    with open(out, "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True)
    try:
        def pids():
            found = dict(re.findall(r"rank (\d)/2 up on cpu \(backend gloo, simulated CUDA stream, pid (\d+)\)", out.read_text()))
            return {int(r): int(pid) for r, pid in found.items()} if len(found) == 2 else None

        ended = lambda: p.poll() is not None and f"torchrun exited {p.returncode}: {out.read_text()[-3000:]}"
        pid = wait_for(pids, timeout=TIMEOUT, fail_if=ended, what="both ranks to start")
        wait_for(lambda: "rank 1 hangs now" in out.read_text(), timeout=TIMEOUT, fail_if=ended, what="rank 1 to hang")
        spinning = f"train_sim_cuda ({EXAMPLE}:{sync_line})"

        def at_sync_line():
            frames = main_thread(dump(pid[0]))
            return "(active" in frames[0] and frames[1] == spinning and frames

        wait_for(at_sync_line, timeout=TIMEOUT, fail_if=ended,
                          what=lambda: f"rank 0 to spin at {spinning}: {main_thread(dump(pid[0]))}")
        assert "loss.item() on a GPU" in source[sync_line - 1]
        # it burns a core there (it wants one: runnable, not asleep), and stays there: the step never completes
        proc = psutil.Process(pid[0])
        c0, t0 = busy_seconds(proc), time.monotonic()
        wait_for(lambda: time.monotonic() - t0 >= 1.5, timeout=TIMEOUT, interval=0.05)
        assert (busy_seconds(proc) - c0) / (time.monotonic() - t0) > 0.4
        assert main_thread(dump(pid[0]))[1] == spinning
        text = out.read_text()
        assert "step 2 loss" in text and "step 3 loss" not in text
        # the culprit sleeps in Python, in data loading
        culprit = main_thread(dump(pid[1]))
        assert "(idle" in culprit[0] and culprit[1].startswith(f"next_batch ({EXAMPLE}:"), culprit
    finally:
        kill_tree(p)
