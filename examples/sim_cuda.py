"""A CUDA runtime stand-in for CPU-only machines (used by ``train_ddp.py --sim-cuda``).

On a GPU, an NCCL collective only enqueues a kernel on a CUDA stream: a rank
whose peers never join does not block in the collective call but runs on to
the next synchronisation point (``loss.item()``, ``torch.cuda.synchronize()``)
and spin-waits there inside libcudart.  ``cuda_stub/cudart_stub.c`` is a small
``libcudart.so.12`` with the real entry points whose "device" is one worker
thread per stream; this module builds it (once per user and source version)
and wraps it for the example:

    cudart, why = sim_cuda.load()          # the ctypes library, or (None, why)
    stream = sim_cuda.Stream(cudart)
    stream.collective(dist.all_reduce(t, async_op=True))
    stream.enqueue(opt.step)               # after it, in stream order
    cudart.cudaStreamSynchronize(stream.handle)   # spins until both are done

Make the synchronising call directly through the library's function (as
above), not through a Python helper: then the innermost Python frame of a
waiting rank is the caller's own line, as ``loss.item()`` is on a GPU.
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

_c = ctypes
_SIGNATURES = {  # name: (argtypes, restype), as in the CUDA runtime API
    "cudaStreamCreate": ([_c.POINTER(_c.c_void_p)], _c.c_int),
    "cudaStreamDestroy": ([_c.c_void_p], _c.c_int),
    "cudaLaunchHostFunc": ([_c.c_void_p, _c.c_void_p, _c.c_void_p], _c.c_int),
    "cudaStreamSynchronize": ([_c.c_void_p], _c.c_int),
    "cudaStreamQuery": ([_c.c_void_p], _c.c_int),
    "cudaDeviceSynchronize": ([], _c.c_int),
    "cudaEventCreate": ([_c.POINTER(_c.c_void_p)], _c.c_int),
    "cudaEventRecord": ([_c.c_void_p, _c.c_void_p], _c.c_int),
    "cudaEventQuery": ([_c.c_void_p], _c.c_int),
    "cudaEventSynchronize": ([_c.c_void_p], _c.c_int),
    "cudaEventDestroy": ([_c.c_void_p], _c.c_int),
    "cudaMemcpy": ([_c.c_void_p, _c.c_void_p, _c.c_size_t, _c.c_int], _c.c_int),
    "cudaGetErrorString": ([_c.c_int], _c.c_char_p),
}
QUERIES = {"cudaStreamQuery", "cudaEventQuery"}  # cudaErrorNotReady is an answer, not an error

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
    lib = ctypes.CDLL(str(path))
    for name, (argtypes, restype) in _SIGNATURES.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = argtypes, restype
        if restype is ctypes.c_int:
            f.errcheck = _errcheck
    return lib, None


def forever() -> None:
    """Block for good: a kernel that waits for a peer that never comes (NCCL spins
    until its watchdog times out, by default after 10 minutes)."""
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

    def _run(self, key: int) -> None:
        self._pending.pop(key)()

    def enqueue(self, fn) -> None:
        """Run ``fn()`` on the stream's worker thread after everything enqueued before
        it (``cudaLaunchHostFunc``).  It must not call the CUDA runtime itself."""
        key = next(self._keys)
        self._pending[key] = fn
        self.cudart.cudaLaunchHostFunc(self.handle, ctypes.cast(self._trampoline, ctypes.c_void_p), key)

    def collective(self, work) -> None:
        """A collective "kernel": completes when ``work`` (a torch.distributed async
        Work) does.  If it fails (a dead peer, a mismatched collective), it never
        completes, as an NCCL kernel whose peer never comes: the stream is stuck."""
        def kernel():
            try:
                work.wait()
            except Exception as e:  # noqa: BLE001 (whatever the failure, the kernel never ends)
                self.errors.append(e)
                forever()
        self.enqueue(kernel)

    def destroy(self) -> None:
        self.cudart.cudaStreamDestroy(self.handle)
