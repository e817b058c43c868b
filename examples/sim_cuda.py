"""A CUDA runtime stand-in for CPU-only machines (used by ``train_ddp.py --sim-cuda``).

On a GPU, an NCCL collective only enqueues a kernel on a CUDA stream: a rank
whose peers never join does not block in the collective call but runs on to
the next synchronisation point (``loss.item()``, ``torch.cuda.synchronize()``)
and waits there inside libcudart: spinning by default, asleep with blocking
synchronisation.  ``cuda_stub/cudart_stub.c`` is a small ``libcudart.so.12``
with the real entry points whose "device" is one worker thread per stream;
this module builds it (once per user and source version) and wraps it for the
example:

    cudart, why = sim_cuda.load()          # the ctypes library, or (None, why)
    cudart.cudaSetDeviceFlags(sim_cuda.cudaDeviceScheduleBlockingSync)  # optional: waits sleep
    stream = sim_cuda.Stream(cudart)
    stream.collective(dist.all_reduce(t, async_op=True))   # a kernel until the collective completes
    stream.run(0.5)                        # half a second of "GPU work"
    stream.enqueue(opt.step)               # a host function, after them, in stream order
    cudart.cudaStreamSynchronize(stream.handle)   # waits until all three are done

Make the synchronising call directly through the library's function (as
above), not through a Python helper: then the innermost Python frame of a
waiting rank is the caller's own line, as ``loss.item()`` is on a GPU.

The library is a ``ctypes.CDLL``: its calls release the GIL, as a careful C
extension does around a CUDA call.  ``with_gil(cudart)`` is the same library
through ``ctypes.PyDLL``, whose calls keep the GIL, as a C extension's that
does not release it (torch.cuda.Event's destructor, which called
cudaEventDestroy with the GIL held before pytorch#119393).  With a Python host
function running on a stream (it holds the driver's lock, then needs the
GIL), such a call to one of the functions that take the driver's lock
(``cudaEventDestroy``, ``cudaSetDevice``, ``cudaHostUnregister``, ...)
deadlocks: see cudart_stub.c.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "cuda_stub" / "cudart_stub.c"
LIBNAME = "libcudart.so.12"
FLAGS = ["-O1", "-shared", "-fPIC", "-pthread", "-fvisibility=hidden"]

cudaSuccess, cudaErrorNotReady = 0, 600
# cudaSetDeviceFlags
cudaDeviceScheduleAuto, cudaDeviceScheduleSpin, cudaDeviceScheduleYield, cudaDeviceScheduleBlockingSync = 0, 1, 2, 4
cudaDeviceMapHost = 0x08
# cudaEventCreateWithFlags (torch.cuda.Event(blocking=True) is BlockingSync | DisableTiming)
cudaEventDefault, cudaEventBlockingSync, cudaEventDisableTiming, cudaEventInterprocess = 0, 1, 2, 4

_c = ctypes
_SIGNATURES = {  # name: (argtypes, restype), as in the CUDA runtime API
    "cudaGetDeviceCount": ([_c.POINTER(_c.c_int)], _c.c_int),
    "cudaSetDevice": ([_c.c_int], _c.c_int),
    "cudaGetDevice": ([_c.POINTER(_c.c_int)], _c.c_int),
    "cudaSetDeviceFlags": ([_c.c_uint], _c.c_int),
    "cudaGetDeviceFlags": ([_c.POINTER(_c.c_uint)], _c.c_int),
    "cudaStreamCreate": ([_c.POINTER(_c.c_void_p)], _c.c_int),
    "cudaStreamDestroy": ([_c.c_void_p], _c.c_int),
    "cudaLaunchHostFunc": ([_c.c_void_p, _c.c_void_p, _c.c_void_p], _c.c_int),
    "cudaStreamSynchronize": ([_c.c_void_p], _c.c_int),
    "cudaStreamQuery": ([_c.c_void_p], _c.c_int),
    "cudaDeviceSynchronize": ([], _c.c_int),
    "cudaEventCreate": ([_c.POINTER(_c.c_void_p)], _c.c_int),
    "cudaEventCreateWithFlags": ([_c.POINTER(_c.c_void_p), _c.c_uint], _c.c_int),
    "cudaEventRecord": ([_c.c_void_p, _c.c_void_p], _c.c_int),
    "cudaEventQuery": ([_c.c_void_p], _c.c_int),
    "cudaEventSynchronize": ([_c.c_void_p], _c.c_int),
    "cudaEventDestroy": ([_c.c_void_p], _c.c_int),
    "cudaMemcpy": ([_c.c_void_p, _c.c_void_p, _c.c_size_t, _c.c_int], _c.c_int),
    "cudaHostRegister": ([_c.c_void_p, _c.c_size_t, _c.c_uint], _c.c_int),
    "cudaHostUnregister": ([_c.c_void_p], _c.c_int),
    "cudaGetErrorString": ([_c.c_int], _c.c_char_p),
}
QUERIES = {"cudaStreamQuery", "cudaEventQuery"}  # cudaErrorNotReady is an answer, not an error
# the stand-in's own "kernels" (not CUDA API): host functions that keep the device busy, in C
KERNELS = ("simKernelRun", "simKernelWaitFlag")

# void (*cudaHostFn_t)(void *userData)
HostFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class CudaError(RuntimeError):
    pass


def compiler() -> str | None:
    return shutil.which("gcc") or shutil.which("cc")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
    return Path(base) / "ddptop" / "cuda-stub" / digest


def build(verbose: bool = True) -> Path:
    """The library, built on first use (by one process at a time: ranks starting
    together wait for the first one's build rather than all building)."""
    lib = cache_dir() / LIBNAME
    if lib.exists():
        return lib
    cc = compiler()
    if cc is None:
        raise FileNotFoundError("no C compiler (gcc or cc) on PATH")
    lib.parent.mkdir(parents=True, exist_ok=True)
    with open(lib.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.exists():  # built by another process while we waited
            return lib
        if verbose:
            print(f"building the CUDA runtime stand-in {lib} with {os.path.basename(cc)} (first use)",
                  file=sys.stderr, flush=True)
        fd, tmp = tempfile.mkstemp(prefix=LIBNAME + ".", dir=lib.parent)
        os.close(fd)
        try:
            r = subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=120,
                               check=False)
            if r.returncode != 0:
                raise RuntimeError(f"{cc} failed to build {SOURCE.name}: {r.stderr.strip()[-2000:]}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return lib


def _errcheck(result, func, args):
    if result != cudaSuccess and not (func.__name__ in QUERIES and result == cudaErrorNotReady):
        raise CudaError(f"{func.__name__}: error {result}")
    return result


def _typed(lib):
    for name, (argtypes, restype) in _SIGNATURES.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = argtypes, restype
        if restype is ctypes.c_int:
            f.errcheck = _errcheck
    return lib


def load(verbose: bool = True) -> tuple[ctypes.CDLL | None, str | None]:
    """``(library, None)``, or ``(None, why)`` when it cannot be had (no C compiler,
    or the build failed).  Every function has its C signature; a CUDA error raises
    ``CudaError`` (the queries return ``cudaErrorNotReady`` (600) instead).  The
    library is a ``CDLL``: its calls release the GIL, so host functions can run
    while the caller waits."""
    try:
        path = build(verbose)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    return _typed(ctypes.CDLL(str(path))), None


def with_gil(cudart: ctypes.CDLL) -> ctypes.PyDLL:
    """The same library (the same process-wide state: one ``dlopen``), through
    ``ctypes.PyDLL``: its calls keep the GIL while they run, as a C extension's
    CUDA calls do when it does not release the GIL around them."""
    return _typed(ctypes.PyDLL(cudart._name))


def forever() -> None:
    """Block for good (a host function that never returns)."""
    threading.Event().wait()


class Stream:
    """A CUDA stream (``cudaStreamCreate``); ``handle`` is its ``cudaStream_t``."""

    def __init__(self, cudart: ctypes.CDLL):
        self.cudart = cudart
        self.handle = ctypes.c_void_p()
        cudart.cudaStreamCreate(ctypes.byref(self.handle))
        self.errors: list[BaseException] = []  # what failed collectives raised (a GPU would not say)
        # one C callback for all host functions, kept alive with the stream; the
        # host function's userData is a key into _pending
        self._pending: dict[int, object] = {}
        self._keys = itertools.count(1)
        self._trampoline = HostFn(self._run)
        self._kernel = {name: ctypes.cast(getattr(cudart, name), ctypes.c_void_p) for name in KERNELS}
        self._flags: list[ctypes.c_int] = []  # what pending simKernelWaitFlag kernels read
        self._never: list[ctypes.c_int] = []  # ... and those of kernels that never end (kept for good)

    def _run(self, key: int) -> None:
        self._pending.pop(key)()

    def _launch(self, fn, user_data) -> None:
        if self._flags and self.cudart.cudaStreamQuery(self.handle) == cudaSuccess:
            self._flags.clear()  # the stream is idle: no kernel reads these any more
        self.cudart.cudaLaunchHostFunc(self.handle, fn, user_data)

    def enqueue(self, fn) -> None:
        """Run ``fn()`` on the stream's worker thread after everything enqueued before
        it (``cudaLaunchHostFunc``), as a host function written in Python runs (through
        a ctypes callback: it takes the GIL; and the driver's lock is held meanwhile).
        It must not call the CUDA runtime itself."""
        key = next(self._keys)
        self._pending[key] = fn
        self._launch(ctypes.cast(self._trampoline, ctypes.c_void_p), key)

    def run(self, seconds: float) -> None:
        """A kernel that keeps the device busy for ``seconds`` (in C, without the GIL)."""
        self._launch(self._kernel["simKernelRun"], max(0, round(seconds * 1e9)))

    def _wait_flag(self, flag: ctypes.c_int) -> None:
        self._launch(self._kernel["simKernelWaitFlag"], ctypes.addressof(flag))
        self._flags.append(flag)

    def collective(self, work) -> None:
        """A collective kernel: keeps the device busy (as an NCCL kernel spins on the
        GPU) until ``work`` (a torch.distributed async Work) completes.  If it fails (a
        dead peer, a mismatched collective), it never completes, as an NCCL kernel
        whose peer never comes: the stream is stuck, its device busy."""
        flag = ctypes.c_int(0)

        def done(fut) -> None:  # (on the thread that completes the work)
            try:
                fut.value()
            except Exception as e:  # noqa: BLE001 (whatever the failure, the kernel never ends)
                self.errors.append(e)
                self._never.append(flag)
                return
            flag.value = 1

        work.get_future().add_done_callback(done)
        self._wait_flag(flag)

    def hang(self) -> None:
        """A kernel that never ends (the device busy for good): a collective whose
        transport is broken, spinning until NCCL's watchdog (by default 10 minutes)."""
        flag = ctypes.c_int(0)
        self._never.append(flag)
        self._wait_flag(flag)

    def destroy(self) -> None:
        self.cudart.cudaStreamDestroy(self.handle)
