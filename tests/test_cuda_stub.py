"""The CUDA runtime stand-in (examples/cuda_stub, examples/sim_cuda.py): a
libcudart.so.12 whose synchronising calls spin like CUDA's, and the example's
--sim-cuda mode, in which a rank waiting for a hung peer spins at its sync line
under real torchrun, as a rank of an NCCL job does on a GPU."""

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

ROOT = Path(__file__).resolve().parents[1]
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
    from ddptop.core.telemetry import runnable_ns

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
    for name in sim_cuda._SIGNATURES:
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


def test_no_compiler_is_a_reason_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(sim_cuda, "compiler", lambda: None)
    cudart, why = sim_cuda.load()
    assert cudart is None and "no C compiler" in why


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
    class Broken:
        def wait(self):
            raise RuntimeError("Connection closed by peer")

    stream = sim_cuda.Stream(cudart)
    after = threading.Event()
    stream.collective(Broken())
    stream.enqueue(after.set)
    wait_for(lambda: stream.errors, timeout=TIMEOUT, what="the collective to fail")
    assert "Connection closed" in str(stream.errors[0])
    assert not after.wait(0.5) and cudart.cudaStreamQuery(stream.handle) == 600


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
