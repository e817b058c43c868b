"""What a thread's native frames say (pure): which library, which GPU call, which primitive.

A rank stopped at a hang is read by the *shape* of its native frames, not by
a list of function names:

* **the library** of each frame, from one table (``LIBRARIES``): by its file
  (``libcuda.so.1``, ``libcuda.so.535.104.05``, ``librccl.so.1``), by the C API
  prefix of its symbol (``cudaStreamSynchronize`` is the CUDA runtime wherever
  it is linked, ``libtorch_cuda.so`` included), or by the source file NCCL's
  release build names (``ncclGroupEndInternal (group.cc:406)``).  An unnamed
  frame (``0x7f3a… (libcuda.so.1)``, gdb's ``??``) is said by its library in
  words, never by its address.
* **the GPU call**: the outermost frame (the one nearest the Python code) whose
  symbol has a GPU C API prefix: ``cuda[A-Z]``, ``cu[A-Z]``, ``nccl[A-Z]``,
  ``hip[A-Z]``, ``hsa_``, ``rccl[A-Z]`` (matched as a prefix, never as a
  substring: ``at::cuda::…`` in ``libtorch_cuda.so`` is not an API call).
* **the primitive**: the innermost named frame's nature: a lock acquire
  (``pthread_mutex_lock``, ``pthread_rwlock_wrlock``, ``__lll_lock_wait``),
  a wait (a futex, ``poll``, ``ioctl``, ``sched_yield``, a sleep, a clock
  poll), or nothing named (spinning inside the library).

From those, ``gpu_wait(frames)`` tells one of three kinds (or None when no
frame comes from a GPU library):

* ``gpu-wait``: the call waits for GPU work (a synchronisation, a copy, an
  event, a kernel launch blocked on a full queue), spinning or sleeping; an
  unknown GPU call counts as waiting too (never a culprit on doubt);
* ``gpu-lock``: a lock acquire under a call that does not wait for work
  (``cudaSetDevice``, ``cudaEventDestroy``, ``cudaHostUnregister``, CUPTI):
  the driver's lock, a lock-order deadlock, not GPU work;
* ``nccl``: inside NCCL's (or RCCL's) own host code: communicator setup and
  bootstrap, group end, abort, with where in NCCL said in words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from ddptop.core.analysis.stack_dumps import Frame

__all__ = ["Library", "LIBRARIES", "library_of", "library_words", "api_call", "primitive", "GpuWait", "gpu_wait", "frame_words",
           "GPU_KEYS", "is_launch"]


@dataclass(frozen=True)
class Library:
    key: str  # "cuda-driver", "cuda-runtime", "nccl", ...
    words: str  # "the CUDA driver"
    files: re.Pattern  # its shared-library file names (the base name)
    symbols: re.Pattern | None = None  # the C API prefix of its exported symbols (or its internal ones)
    sources: re.Pattern | None = None  # the source files its frames name when built with debug info
    waits_for_work: bool | None = None  # False: none of its calls waits for GPU work (a profiler)


def _rx(p: str) -> re.Pattern:
    return re.compile(p)


# The one table.  Order matters for symbols: the first whose prefix matches names a frame's library.
LIBRARIES: tuple[Library, ...] = (
    # (a statically linked runtime keeps its API names, and its internal symbols say "libcudart_static")
    Library("cuda-runtime", "the CUDA runtime", _rx(r"^libcudart(?:[._-]|$)"), _rx(r"^cuda[A-Z]|^libcudart_static")),
    Library("cuda-driver", "the CUDA driver", _rx(r"^libcuda(?:\.so|\.dylib|\.dll|$)|^nvcuda"), _rx(r"^cu[A-Z]")),
    # (CUPTI linked into libtorch_cpu.so shows as "_nv001384cupti")
    Library("cupti", "CUPTI (the CUDA profiling interface)", _rx(r"^libcupti"), _rx(r"^cupti[A-Z]|^_nv\d+cupti"),
            waits_for_work=False),
    Library("rccl", "RCCL", _rx(r"^librccl"), _rx(r"^rccl[A-Z]")),
    # (NCCL's profiling-interface names carry a "p": pncclCommInitRankConfig)
    Library("nccl", "NCCL", _rx(r"^libnccl"), _rx(r"^p?nccl[A-Z]"),
            _rx(r"(?:^|/)(?:nccl|rccl)/|(?:^|/)(?:bootstrap|enqueue|group|init|init_nvtx|proxy|transport|channel|"
                r"collectives|register|net|socket|ibvwrap|ibvsymbols|net_ib|net_socket|p2p|shm|coll_net|"
                r"nvls|graph|paths|topo|search|connect|rings|trees|tuning|xml|argcheck|enqueue|debug|"
                r"utils|param|shmutils|strongstream|ipcsocket|cudawrap|gdrwrap|nvmlwrap|alloc|"
                r"profiler|ras|client_support|peer)\.(?:cc|cu|h)$")),
    Library("hip", "HIP (the ROCm runtime API)", _rx(r"^libamdhip64"), _rx(r"^hip[A-Z]")),
    Library("rocm-runtime", "the ROCm runtime (HSA)", _rx(r"^libhsa-runtime|^libhsakmt"),
            _rx(r"^hsa_|^hsaKmt|^rocr::")),
    Library("torch-cuda", "PyTorch's CUDA code", _rx(r"^libtorch_cuda|^libc10_cuda|^libtorch_hip|^libc10_hip"),
            None),
)
_BY_KEY = {lib.key: lib for lib in LIBRARIES}


def library_words(key: str) -> str:
    """A library's key ("cuda-driver") in words ("the CUDA driver"); the key itself when unknown."""
    lib = _BY_KEY.get(key)
    return lib.words if lib is not None else key
# the libraries whose frames mean the thread is in GPU or collective-communication code
GPU_KEYS = frozenset({"cuda-runtime", "cuda-driver", "cupti", "rccl", "nccl", "hip", "rocm-runtime", "torch-cuda"})
# NCCL's sources without a file name to recognise them by
_NCCL_FUNC = re.compile(r"^p?(?:nccl|bootstrap|ncclProxy|ncclTransport)[A-Z]?|^ncclInternal|::ncclComm|^p?rccl[A-Z]")


# symbols that name a library but no call a person would know ("_nv001384cupti", "libcudart_static_4d8b…")
_OPAQUE = re.compile(r"^_nv\d+\w*$|^libcudart_static_\w+$|^__cudart\d+$")


def _symbol(f: Frame) -> str:
    """The bare symbol of a frame: its function without a namespace's C++ arguments or a version tag."""
    fn = f.function.strip()
    fn = fn.split("@", 1)[0]  # pthread_cond_wait@@GLIBC_2.3.2
    return fn


def library_of(f: Frame) -> Library | None:
    """The library a native frame comes from, from the table: by a GPU C
    API prefix of its symbol first (a statically linked CUDA runtime or NCCL
    keeps its names), then its file, then the source file it names."""
    if not f.native:
        return None
    sym = _symbol(f)
    if f.named:
        for lib in LIBRARIES:
            if lib.symbols is not None and lib.symbols.match(sym):
                # (RCCL keeps NCCL's API names: its file says which)
                if lib.key == "nccl" and f.base.startswith("librccl"):
                    return _BY_KEY["rccl"]
                return lib
    base = f.base
    for lib in LIBRARIES:
        if lib.files.search(base):
            return lib
    path = f.file.replace("\\", "/")
    for lib in LIBRARIES:
        if lib.sources is not None and lib.sources.search(path) and (
                _NCCL_FUNC.search(sym) or "/nccl" in path.lower() or "/rccl" in path.lower()
                or not f.named or "::" not in sym):
            return lib
    if f.named and _NCCL_FUNC.match(sym):
        return _BY_KEY["nccl"]
    return None


# the C API prefixes of a GPU call (a prefix, never a substring)
_API = re.compile(r"^(?:cuda[A-Z]|cu[A-Z]|p?nccl[A-Z]|p?rccl[A-Z]|hip[A-Z]|hsa_|cupti[A-Z])\w*")


def api_call(frames: Sequence[Frame]) -> tuple[int, Frame] | None:
    """(index, frame) of the outermost native frame whose symbol is a GPU C
    API call (innermost first: the highest index), or None."""
    found = None
    for i, f in enumerate(frames):
        if f.native and f.named and _API.match(_symbol(f)):
            found = (i, f)
    return found


# a lock acquire, a wait, a sleep: by the words of libc's and the kernel's primitives
_LOCK = re.compile(r"(?:^|_)(?:pthread_)?(?:mutex_(?:timed)?lock|rwlock_(?:timed)?(?:wr|rd)lock\w*|spin_lock|"
                   r"lll_lock_wait\w*|lll_lock|lock_wait|mutex::lock|shared_mutex::lock\w*|"
                   r"rwlock_(?:wr|rd)lock_full\w*)$|^std::(?:__)?(?:mutex|shared_mutex|recursive_mutex)::lock")
_WAIT = re.compile(r"futex|cond_(?:timed)?wait|condition_variable::wait|^(?:__)?(?:poll|ppoll|epoll_wait|"
                   r"epoll_pwait|select|pselect6?|ioctl|sched_yield|nanosleep|clock_nanosleep|usleep|sleep|"
                   r"sem_(?:timed)?wait|clock_gettime|__vdso_clock_gettime|gettimeofday|read|recv\w*|accept4?|"
                   r"syscall)$|_wait$|Wait")


def primitive(frames: Sequence[Frame], upto: int | None = None) -> str:
    """The innermost named primitive below frame ``upto`` (innermost first):
    "lock" (a lock acquire), "wait" (a futex, poll, sleep, a clock poll),
    or "" (nothing named: spinning in a library)."""
    end = len(frames) if upto is None else upto
    for f in frames[:end]:
        if not f.named:
            continue
        sym = _symbol(f).lstrip("_") if not _symbol(f).startswith("std::") else _symbol(f)
        if _LOCK.search(sym) or _LOCK.search(_symbol(f)):
            return "lock"
        if _WAIT.search(sym):
            # a futex under a lock acquire is the lock's: keep looking outwards for the lock
            if "futex" in sym:
                continue
            return "wait"
    # only futexes (or nothing) named: a futex wait is a wait
    if any(f.named and "futex" in _symbol(f) for f in frames[:end]):
        return "wait"
    return ""


# what a GPU call does, by the words of its name: calls that wait for work on the device (a
# synchronisation, a copy, an event, a launch, a free that synchronises, a query in a loop)
_WAITS_FOR_WORK = re.compile(r"synchroni[sz]e|sync(?:_|$|[A-Z])|memcpy|memset|copy|local_scalar|event(?:synchronize|"
                             r"query|record|elapsed)|wait|query|launch|free|signal_wait|groupend|allreduce|"
                             r"broadcast|reduce|gather|scatter|send|recv|alltoall", re.IGNORECASE)


# the GPU calls that *launch* work (or load the code a launch needs): such a call returns at once unless the
# driver holds it, so a rank stopped in one is held by the GPU's queue (lazy module loading's first launch waits
# for the kernels already running; under CUDA_LAUNCH_BLOCKING=1 every launch waits for its kernel)
_LAUNCH = re.compile(r"(?:cu|cuda|hip|hipExt)(?:Module|Library|Graph)?(?:Launch|Load)\w*|hipModuleLaunch\w*"
                     r"|cu(?:ModuleGetFunction|LibraryGetKernel)\w*")


def is_launch(call: str) -> bool:
    """The GPU call (its symbol, or a ``Where.native`` text such as "cudaLaunchKernel (libcudart.so.13)") launches
    a kernel or loads a module."""
    return bool(_LAUNCH.fullmatch(call.split(" ", 1)[0].strip("`")))


@dataclass(frozen=True)
class GpuWait:
    """What a thread's native frames say about the GPU."""

    kind: str  # "gpu-wait", "gpu-lock" or "nccl"
    call: str  # the outermost GPU API call ("cudaStreamSynchronize"), or the outermost named GPU frame
    library: str  # words for the library the thread is in ("the CUDA driver")
    key: str  # that library's key ("cuda-driver")
    primitive: str  # "lock", "wait" or ""
    sleeping: bool  # the thread was idle (a sleeping wait), as the dump says
    innermost: str  # the innermost frame in words: "in the CUDA driver", "pthread_mutex_lock (libc.so.6)"
    nccl_where: str = ""  # kind "nccl": where in NCCL, in words
    outer: str = ""  # the outermost GPU library in words (the API the program called), when it is not ``library``

    @property
    def text(self) -> str:
        how = " (sleeping)" if self.sleeping and self.kind == "gpu-wait" else ""
        if self.kind == "gpu-lock":
            inside = f"inside `{self.call}`" if self.call and not self.call.startswith(("the ", "CUPTI")) else \
                f"under {self.call}" if self.call else "under a call"
            return (f"is blocked on a lock in {self.library} {inside}, a call that does not wait for GPU work "
                    "(a deadlock if it stays there)")
        if self.kind == "nccl":
            return f"is in {self.nccl_where or 'NCCL'} (`{self.call}`, {self.library})"
        if self.call:
            return f"waits on the GPU{how} (`{self.call}`, {self.library})"
        return f"waits on the GPU{how} (in {self.outer}, innermost in {self.library})" if self.outer else \
            f"waits on the GPU{how} (in {self.library})"


def _nccl_where(fns: list[str]) -> str:
    """Where in NCCL a thread is, in words, from its NCCL frames' names (outermost last)."""
    joined = " ".join(fns).lower()
    if re.search(r"comminit|initrank|bootstrap|inittransport|socketaccept|socketconnect|commsplit|"
                 r"ncclcommregister|p2psetup|transportp2psetup|connect", joined):
        return "NCCL communicator setup waiting for a peer"
    if re.search(r"abort|destroy|commfinalize|commfree", joined):
        return "NCCL tearing down a communicator"
    if re.search(r"groupend|enqueue|launch", joined):
        return "NCCL launching a collective"
    if "proxy" in joined:
        return "NCCL's proxy"
    if re.search(r"socket(?:wait|recv|send|progress)|recvall|sendall", joined):
        return "NCCL waiting on a socket to a peer"
    return "NCCL"


def frame_words(f: Frame) -> str:
    """One native frame in words: its name and library file, or for an
    unnamed frame its library ("in the CUDA driver"), never its address."""
    lib = library_of(f)
    if not f.named:
        return f"in {lib.words}" if lib is not None else (f"in {f.base}" if f.file else "in native code")
    where = f.base if f.file and not f.line else (f"{f.base}:{f.line}" if f.file else "")
    return f"{f.function} ({where})" if where else f.function


def gpu_wait(frames: Sequence[Frame], sleeping: bool = False) -> GpuWait | None:
    """What the native frames inside a thread's innermost Python frame (or
    all of a thread's frames, when it has no Python ones) say, innermost
    first; None when none comes from a GPU library."""
    native = list(frames)
    libs = [library_of(f) for f in native]
    gl: dict[int, Library] = {i: lib for i, lib in enumerate(libs) if lib is not None and lib.key in GPU_KEYS}
    gpu_idx = sorted(gl)
    if not gpu_idx:
        return None
    call_at = api_call(native)
    outer_gpu = max(gpu_idx)
    if call_at is not None:
        ci, cf = call_at
        call = _symbol(cf)
        lib: Library = libs[ci] or _BY_KEY["cuda-runtime"]
    else:
        # no API symbol: the outermost named frame of a GPU library (c10::cuda::memcpy_and_sync), else its library
        named = [i for i in gpu_idx if native[i].named and not _OPAQUE.match(_symbol(native[i]))]
        ci = max(named) if named else outer_gpu
        cf = native[ci]
        call = _symbol(cf) if cf.named and not _OPAQUE.match(_symbol(cf)) else ""
        lib = gl.get(ci) or gl[outer_gpu]
    prim = primitive(native, upto=ci if call_at is not None else None)
    inner = next((f for f in native if f.named), native[0])
    innermost = frame_words(native[0]) if not native[0].named else frame_words(inner)
    # the library the thread is *in*: the innermost GPU library's frame (the driver under the runtime)
    in_lib = gl[min(gpu_idx)]
    nccl_fns = [_symbol(native[i]) for i in gpu_idx if gl[i].key in ("nccl", "rccl") and native[i].named]
    calls = [_symbol(f) for f in native if f.native and f.named and _API.match(_symbol(f))]
    waits = any(_WAITS_FOR_WORK.search(c) for c in calls) or bool(call and _WAITS_FOR_WORK.search(call))
    # a library none of whose calls waits for GPU work (a profiler) among the thread's GPU frames
    no_work = any(gl[i].waits_for_work is False for i in gpu_idx)
    # a lock acquire innermost: the thread waits for another thread's lock, not for GPU work, unless the call
    # it is under is one known to wait for work
    if prim == "lock" and not (call and waits and not no_work):
        under = next((gl[i] for i in sorted(gpu_idx, reverse=True) if gl[i].waits_for_work is False), None)
        return GpuWait("gpu-lock", call or (under.words if under else ""), in_lib.words, in_lib.key, prim,
                       sleeping, innermost)
    if nccl_fns and lib.key in ("nccl", "rccl"):
        # inside NCCL's own host code; a CUDA call under it that waits for work (a kernel launch on a full
        # queue, a sync) makes it a GPU wait, said with its NCCL caller
        inner_cuda = [c for c in calls if not c.startswith(("nccl", "rccl", "pnccl", "prccl")) and _WAITS_FOR_WORK.search(c)]
        nlib = lib
        if inner_cuda:
            return GpuWait("gpu-wait", inner_cuda[-1], nlib.words, nlib.key, prim, sleeping, innermost,
                           _nccl_where(list(reversed(nccl_fns))))
        return GpuWait("nccl", call or nccl_fns[-1], nlib.words, nlib.key, prim, sleeping, innermost,
                       _nccl_where(list(reversed(nccl_fns))))
    outer = gl[outer_gpu]
    return GpuWait("gpu-wait", call, lib.words if call else in_lib.words, lib.key if call else in_lib.key, prim,
                   sleeping, innermost, outer=outer.words if not call and outer.key != in_lib.key else "")
