"""Turn ``py-spy dump`` samples of every rank into a hang verdict (pure: no I/O).

A hung distributed job is usually a few ranks waiting in a collective (or in
``loss.backward()``, where DDP all-reduces the gradients) for one rank that is
somewhere else: sleeping in a callback, loading data, writing a checkpoint, or
spinning in user code.  With two or more dumps per rank, taken >= 1 s apart,
this module tells which ranks are *frozen* (same main-thread stack in every
sample) and which *move*, and from that which ranks are the culprits.

    parse_dump(text) -> list[Thread]           py-spy text (or --json) output
    classify_frame(frame) -> str               where a frame's file comes from
    rank_state(threads) -> RankStack           what the main thread is doing
    verdict({rank: [dump, dump, ...]}, gpu_busy=...) -> StackEvidence

Frames are classified by the file they come from (stdlib / site-packages
package / the user's own code, and for native frames the shared library:
the CUDA runtime, the driver, NCCL), never by one function name.

On a GPU, NCCL collectives are asynchronous: a rank whose peers never come
does not block inside the collective but runs on to the next CUDA
synchronisation (``loss.item()``, ``torch.cuda.synchronize()``) and spins
there.  Its Python stack then shows one unchanged line, on the CPU ("busy"),
which alone reads like a rank working in a loop.  It is read as waiting on
the GPU when its native frames (``py-spy --native``) come from the CUDA
runtime, the driver or NCCL, or, without native frames, when its GPU is busy
(``gpu_busy``: the caller's telemetry) while it sits on that line.

One module, though over 500 lines: it is one pure function of py-spy's output,
``verdict``; the parser, the frame classification and the per-rank state are its
steps, and their shapes (``Frame``, ``Thread``, ``RankStack``) change together.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping

from ddptop.core.analysis.native_frames import (
    GPU_KEYS,
    GpuWait,
    frame_words,
    gpu_wait,
    library_of,
    primitive,
)
from ddptop.core.analysis.stack_dumps import FRAME_LINE as _FRAME
from ddptop.core.analysis.stack_dumps import PROCESS_LINE as _PROCESS
from ddptop.core.analysis.stack_dumps import THREAD_LINE as _THREAD
from ddptop.core.analysis.stack_dumps import Frame, Thread, parse_dump, thread_id
from ddptop.core.analysis.stack_judge import judge
from ddptop.core.model.evidence import (
    HOT_UTIL,
    KINDS,
    WAITING_KINDS,
    StackEvidence,
    Where,
)

__all__ = [
    "Frame", "Thread", "RankStack",
    "parse_dump", "classify_frame", "gpu_library", "rank_state", "verdict", "main_frames", "moved",
    "CATEGORIES", "KINDS", "WAITING_KINDS",
]

# categories of a frame (classify_frame)
CATEGORIES = ("collective", "autograd", "data", "io", "stdlib", "framework", "user", "native")

# a callable giving the source text of (file, line), or None; supplied by the
# caller (which may read files) so that this module stays pure
SourceLine = Callable[[str, int], "str | None"]


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class RankStack:
    """What the main thread of one rank was doing in one dump."""

    kind: str  # one of KINDS
    text: str  # short human description
    user: Frame | None  # innermost frame of the user's own code
    innermost: Frame | None  # innermost frame overall
    call: str  # the call the user frame is in ("Queue.get", "all_reduce", "time.sleep" when the source is known), or ""
    state: str  # thread state: "active" / "idle" / "" (no thread)
    thread: str  # thread name
    signature: tuple[str, ...]  # for grouping ranks: func@file (+ :line for user frames)
    exact: tuple[str, ...]  # for comparing samples of one rank: func@file:line for every Python frame
    code: str = ""  # source line of the user frame, when the caller gave a way to read it
    gpu: str = ""  # kinds gpu-wait/gpu-lock/nccl: the key of the GPU library ("cuda-runtime"), or "util"
    native: str = ""  # the GPU call in words: "cudaStreamSynchronize (libcudart.so.12)", "in the CUDA driver"
    library: str = ""  # that library in words: "the CUDA runtime"
    native_read: bool = False  # the dump has native frames of this thread (py-spy --native, gdb, pystack)
    # without native frames: "yes" when its line is a synchronisation (`.item()` on the source line, torch's
    # synchronize, a tensor's __float__), "maybe" when it makes a C call nothing names (a GPU job's line whose
    # source cannot be read), else ""
    sync: str = ""
    others: tuple[str, ...] = ()  # other threads worth naming (in GPU code, or holding the GIL)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "text": self.text,
                "user": self.user.to_dict() if self.user else None,
                "innermost": self.innermost.to_dict() if self.innermost else None,
                "call": self.call, "state": self.state, "thread": self.thread,
                "signature": list(self.signature), "code": self.code, "gpu": self.gpu, "native": self.native,
                "library": self.library, "others": list(self.others)}


# --------------------------------------------------------------------------- classification

_STDLIB_DIR = re.compile(r"[/\\]lib(?:64)?[/\\]python\d+(?:\.\d+)?t?[/\\]", re.IGNORECASE)
_WIN_STDLIB = re.compile(r"[/\\]Lib[/\\]")
_PKG_DIR = re.compile(r"[/\\](?:site|dist)-packages[/\\]")
_STDLIB_NAMES = frozenset(getattr(sys, "stdlib_module_names", ())) | {
    "threading", "queue", "time", "selectors", "socket", "subprocess", "multiprocessing", "concurrent", "asyncio",
    "shutil", "os", "io", "_pyio", "pathlib", "tempfile", "pickle", "json", "zipfile", "tarfile", "gzip",
    "contextlib", "functools", "runpy", "importlib", "signal", "ssl", "http", "urllib", "logging", "sched",
}
# top-level packages that are never the user's own code (py-spy's short names drop site-packages/)
_THIRD_PARTY = frozenset({
    "torch", "lightning", "pytorch_lightning", "lightning_fabric", "lightning_utilities", "transformers",
    "accelerate", "deepspeed", "megatron", "apex", "numpy", "scipy", "pandas", "datasets", "huggingface_hub",
    "safetensors", "tokenizers", "tqdm", "torchvision", "torchaudio", "torchtext", "torchdata", "timm", "hydra",
    "omegaconf", "wandb", "tensorboard", "tensorboardX", "mlflow", "fsspec", "triton", "functorch", "peft", "trl",
    "composer", "colossalai", "fairscale", "xformers", "flash_attn", "bitsandbytes", "ray", "jax", "jaxlib",
    "sklearn", "PIL", "cv2", "webdataset", "mosaicml", "streaming", "einops", "packaging", "typing_extensions",
    "ddptop", "py_spy", "psutil", "setuptools", "pkg_resources", "_pytest", "pytest", "pluggy",
})
# stdlib modules whose frames mean the code is reading/writing files or streams
_IO_STDLIB = frozenset({"shutil", "io", "_pyio", "pathlib", "tempfile", "pickle", "json", "zipfile", "tarfile",
                        "gzip", "bz2", "lzma", "csv", "shelve", "dbm", "sqlite3", "fileinput", "codecs"})


# ddptop's own files (its injected hook wraps torch.save and the optimizer's step) are
# a library, wherever ddptop is installed (an editable checkout is outside site-packages)
_OWN_DIR = __file__.replace("\\", "/").rsplit("/", 3)[0] + "/"


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def _where_from(path: str) -> tuple[str, str]:
    """(origin, package-relative path): origin is "stdlib", "package" or "user"."""
    p = _norm(path)
    if p.startswith("<frozen ") or p in ("<builtin>", "<built-in>"):
        return "stdlib", p
    m = _PKG_DIR.search(p)
    if m:
        return "package", p[m.end():]
    m = _STDLIB_DIR.search(p) or (_WIN_STDLIB.search(p) if ":" in p[:3] else None)
    if m:
        return "stdlib", p[m.end():]
    if p.startswith(_OWN_DIR):
        return "package", "ddptop/" + p[len(_OWN_DIR):]
    if p.startswith("/") or re.match(r"^[A-Za-z]:/", p) or p.startswith("<"):
        return "user", p  # an absolute path outside the interpreter's lib dirs, or <string>/<stdin>
    # a path as py-spy shortens it: relative to the first folder without an __init__.py
    top = p.split("/", 1)[0]
    mod = top[:-3] if top.endswith(".py") else top
    if mod in _THIRD_PARTY:
        return "package", p
    if mod in _STDLIB_NAMES:
        return "stdlib", p
    return "user", p


def _short(path: str) -> str:
    origin, rel = _where_from(path)
    return rel if origin != "user" else _norm(path).rsplit("/", 1)[-1]


def gpu_library(frame: Frame) -> str:
    """The key of the GPU library a native frame comes from ("cuda-runtime",
    "cuda-driver", "nccl", "hip", ...: ``native.LIBRARIES``), else ""."""
    lib = library_of(frame)
    return lib.key if lib is not None and lib.key in GPU_KEYS else ""


def classify_frame(frame: Frame) -> str:
    """One of CATEGORIES, from the file the frame comes from."""
    if frame.native:
        return "native"
    origin, rel = _where_from(frame.file)
    if origin == "stdlib":
        return "stdlib"
    if origin == "user":
        # data-loading code of the user's project: a file so named, or (a path py-spy shortened, relative to the
        # project's package) a data folder; never the folder of an absolute path (a /data/ mount holds scripts)
        p = _norm(frame.file)
        if _DATA_FILE.search(p) or (not p.startswith("/") and "/" in p and _DATA_PATH.search(p)):
            return "data"
        return "user"
    if rel.startswith("torch/"):
        if rel.startswith("torch/distributed/checkpoint/"):
            return "io"
        if rel.startswith("torch/distributed/elastic/") or rel.startswith("torch/distributed/launcher/") \
                or rel == "torch/distributed/run.py":
            return "framework"  # the launcher / @record wrapper around the whole main()
        if rel.startswith("torch/distributed/") or rel == "torch/nn/parallel/distributed.py" or "c10d" in rel:
            return "collective"
        if rel.startswith("torch/autograd/"):
            return "autograd"
        if rel == "torch/_tensor.py" and frame.function.rsplit(".", 1)[-1] == "backward":
            return "autograd"
        if rel.startswith("torch/utils/data/"):
            return "data"
        if rel in ("torch/serialization.py", "torch/storage.py") or rel.startswith("torch/_weights_only"):
            return "io"
        return "framework"
    if rel.startswith("deepspeed/comm/") or "c10d" in rel:
        return "collective"
    if rel.startswith(("datasets/", "webdataset/", "streaming/", "torchdata/")) \
            or rel.endswith(("loops/fetchers.py", "utilities/combined_loader.py")):
        return "data"
    if rel.startswith(("safetensors/", "fsspec/")) or "/checkpoint_io" in rel or "/plugins/io/" in rel:
        return "io"
    if _DATA_PATH.search(rel):
        return "data"
    if _COLLECTIVE_NAME.search(frame.function):
        # a framework's own collective (DeepSpeed ZeRO's all_gather_coalesced, Megatron's reduce_scatter
        # wrappers): named by the operation, as torch.distributed names it
        return "collective"
    return "framework"


# a library's data-loading code, by the folder or file it is in (fairseq/data/iterators.py, a dataloader.py)
_DATA_FILE = re.compile(r"(?:^|/)(?:iterators?|dataloader|data_loader|datasets?|loader|data_utils)\.py$")
_DATA_PATH = re.compile(r"(?:^|/)(?:data|dataloaders?|data_loaders?|datasets?|loaders?)/|" + _DATA_FILE.pattern)

# the collective operations, as torch.distributed and NCCL name them (a framework's wrapper of one)
_COLLECTIVE_NAME = re.compile(r"(?:^|[._])(?:all_?gather|all_?reduce|reduce_?scatter|all_?to_?all|broadcast|"
                              r"barrier)(?:_\w+)?$", re.IGNORECASE)


# --------------------------------------------------------------------------- one rank


_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_KEYWORDS = frozenset({"if", "elif", "while", "for", "return", "with", "assert", "not", "and", "or", "in", "yield",
                       "await", "print", "lambda", "del", "raise", "except"})


def _call_in(code: str) -> str:
    """The (first) call of a source line: "time.sleep" in ``time.sleep(3600)``."""
    for m in _CALL.finditer(code):
        if m.group(1) not in _KEYWORDS:
            return m.group(1)
    return ""


def _at(f: Frame) -> str:
    return f"{f.base}:{f.line}" if f.line else f.base


def _fmt(f: Frame) -> str:
    return f"{f.function}@{_short(f.file)}"


# a source line that synchronises with the GPU (a device-to-host read or an explicit sync)
_SYNC_CODE = re.compile(r"\.item\(\s*\)|\.tolist\(\s*\)|\.cpu\(|\.numpy\(|\bfloat\(|\bint\(|\bbool\(|"
                        r"synchronize\(|\.to\(\s*['\"]cpu|\.to\(\s*device\s*=\s*['\"]cpu|_local_scalar_dense")
# a framework's Python frames that synchronise: torch.cuda.synchronize, Event/Stream.synchronize, a tensor
# printed, an array read into a Python number (jax's Array.__float__), whichever library they are in
_SYNC_TORCH = re.compile(r"^torch/(?:cuda/|_tensor_str\.py)")
_SYNC_FUNC = re.compile(r"(?:^|\.)(?:__float__|__int__|__bool__|__index__|__array__|__format__|item|tolist|numpy|"
                        r"synchronize|block_until_ready|_local_scalar_dense)$")


def _main_thread(threads: Iterable[Thread]) -> Thread | None:
    """The main thread: named MainThread, else the one whose id is the
    process's, else the first with Python frames, else the first."""
    threads = list(threads)
    for t in threads:
        if t.name == "MainThread":
            return t
    for t in threads:
        if t.pid is not None and t.id == t.pid:
            return t
    return next((t for t in threads if any(not f.native for f in t.frames)), threads[0] if threads else None)


def _inner_native(t: Thread) -> list[Frame]:
    """The native frames inside the innermost Python frame (all of them when there is none)."""
    out = []
    for f in t.frames:
        if not f.native:
            break
        out.append(f)
    return out


# a thread blocked taking the GIL (CPython's own frames, pybind11's, a C extension's)
_TAKE_GIL = re.compile(r"\btake_gil\b|PyEval_AcquireThread|PyEval_RestoreThread|PyGILState_Ensure|"
                       r"gil_scoped_acquire|PyEval_AcquireLock")


def _other_threads(threads: list[Thread], main: Thread) -> tuple[str, ...]:
    """The other threads worth naming beside a main thread that waits on the
    GPU or a lock: those in GPU or NCCL code (below their innermost Python
    frame), those running Python called back from a GPU library (a host
    function run by the CUDA runtime's worker: the other half of a lock-order
    deadlock), and the one holding the GIL."""
    out = []
    for t in threads:
        if t is main:
            continue
        inner = _inner_native(t)
        g = gpu_wait(inner, t.state == "idle") if inner else None
        who = f"thread {t.name!r} ({t.id})" if t.name else f"thread {t.id}"
        gil = " holds the GIL and" if t.gil else ""
        py_at = next((i for i, f in enumerate(t.frames) if not f.native), None)
        caller = None
        if py_at is not None:
            # a GPU library's frame *outside* the Python frames: Python called back from it
            caller = next((f for f in t.frames[py_at:] if f.native and gpu_library(f)), None)
        taking = next((f for f in t.frames[:py_at] if f.named and _TAKE_GIL.search(f.function)), None)
        if taking is not None:
            # blocked taking the GIL: with a main thread on a lock, the other half of a lock-order deadlock
            # (one thread holds the lock and wants the GIL, the other holds the GIL and wants the lock)
            out.append(f"{who} waits to take the GIL (`{taking.function.split('(')[0]}`)"
                       + (f", for `{t.frames[py_at].function}` ({_short(t.frames[py_at].file)}:{t.frames[py_at].line})"
                          if py_at is not None else ""))
        elif g is not None:
            out.append(f"{who}{gil} {g.text}")
        elif caller is not None and py_at is not None:
            py = t.frames[py_at]
            lib = library_of(caller)
            by = f"`{caller.function}`, {lib.words}" if lib is not None and caller.named else \
                (lib.words if lib is not None else caller.base)
            out.append(f"{who}{gil} runs Python called back from the GPU library ({by}): in `{py.function}` "
                       f"({_short(py.file)}:{py.line})" + (", idle" if t.state == "idle" else ""))
        elif t.gil:
            held = next((f for f in t.frames if not f.native), None)
            out.append(f"{who} holds the GIL" + (f", in `{held.function}` ({_short(held.file)}:{held.line})"
                                                 if held else ""))
    return tuple(out[:6])


def rank_state(threads: Iterable[Thread], source_line: SourceLine | None = None,
               gpu_job: bool = False, gpu: bool = True) -> RankStack:
    """What the main thread (named MainThread, else the first) is doing.

    ``source_line(file, line)``, when given, returns the source text of a line
    (the caller may read files); it names the call a user frame is blocked in
    (``time.sleep``), which py-spy cannot show for C functions.  ``gpu_job``:
    the job runs on GPUs (another dump shows GPU libraries): a line whose
    source cannot be read may then be a GPU synchronisation.  ``gpu``: False
    when the process has no GPU runtime mapped: no line of it is a GPU
    synchronisation (``float(t)`` of a CPU tensor).
    """
    threads = list(threads)
    t = _main_thread(threads)
    frames = tuple(f for f in t.frames if not f.native) if t is not None else ()
    native_read = t is not None and any(f.native for f in t.frames)
    inner_native = _inner_native(t) if t is not None else []
    g = gpu_wait(inner_native, t.state == "idle") if t is not None and inner_native else None
    if t is not None and not frames and g is None and any(f.named for f in inner_native):
        return _native_only(t, threads, inner_native)
    if t is None or (not frames and g is None):
        return RankStack("unknown", "no Python stack", None, None, "", t.state if t else "",
                         t.name if t else "", (), (), native_read=native_read)
    others = _other_threads(threads, t) if g is not None else ()
    if not frames:
        # native frames only (a gdb dump without Python frames): where in the GPU libraries it is
        assert g is not None
        sig = (f"{g.kind}:{g.call or g.key}",)
        # (where it is: the GPU call's frame, else the outermost frame of a GPU library; never libc's)
        at = next((f for f in reversed(inner_native) if f.function.split("@", 1)[0] == g.call), None) or next(
            (f for f in reversed(inner_native) if gpu_library(f)), inner_native[0])
        text = g.text + ("; another thread waits to take the GIL: a lock-order deadlock with the GIL"
                         if g.kind == "gpu-lock" and any("waits to take the GIL" in o for o in others) else "")
        return RankStack(g.kind, text, None, at, g.call, t.state, t.name, sig, sig, "", g.key,
                         _native_words(g, inner_native), g.library, native_read, "", others)
    cats = [classify_frame(f) for f in frames]
    user_i = next((i for i, c in enumerate(cats) if c == "user"), None)
    user = frames[user_i] if user_i is not None else None
    lib_i = next((i for i, c in enumerate(cats) if c != "stdlib"), None)  # innermost non-stdlib frame
    signature = tuple(_fmt(f) + (f":{f.line}" if c == "user" else "") for f, c in zip(frames, cats))
    exact = tuple(f"{_fmt(f)}:{f.line}" for f in frames)
    code = ""
    if user is not None and source_line is not None:
        try:
            code = (source_line(user.file, user.line) or "").strip()
        except (OSError, ValueError):  # the caller's reader failed (unreadable, undecodable): just no source
            code = ""
    # the call made from the user frame: the frame just inside it, else the call on its source line
    call = frames[user_i - 1].function if user_i else (_call_in(code) if user_i == 0 else "")
    loc = f" at {_at(user)}" if user else ""
    ufn = f"`{user.function}`" if user else ""

    if g is not None:
        # at a CUDA/HIP synchronisation, a lock in the driver, or in NCCL's host code: read from the shape of
        # the native frames (the outermost GPU API call, the innermost primitive), said in words, never addresses
        where = f" called from {ufn}{loc}" if user else f" in `{frames[0].function}` ({_short(frames[0].file)})"
        if g.kind == "gpu-lock" and any("waits to take the GIL" in o for o in others):
            where += "; another thread waits to take the GIL: a lock-order deadlock with the GIL"
        return RankStack(g.kind, g.text + where, user, frames[0], call or g.call, t.state, t.name, signature, exact,
                         code, g.key, _native_words(g, inner_native), g.library, native_read, "", others)
    sync = ""
    if not native_read and gpu:
        # no native frames: the line may be a GPU synchronisation (the wait happens in C, out of py-spy's
        # sight without --native): a sync call on the source line or a framework's syncing frame ("yes"), or a
        # C call from the innermost frame that no source line names, in a job known to run on GPUs ("maybe")
        inner_rel = _where_from(frames[0].file)[1]
        if cats[0] != "user":
            inner_code = ""
            if source_line is not None and cats[0] == "framework":
                try:
                    inner_code = (source_line(frames[0].file, frames[0].line) or "").strip()
                except (OSError, ValueError):
                    inner_code = ""
        else:
            inner_code = code
        # (the library frames between the innermost one and the user's: jax's Array._value under __float__)
        lib_frames = [f for f, c in zip(frames[:user_i], cats[:user_i]) if c != "stdlib"] if cats[0] != "user" else []
        if _SYNC_TORCH.match(inner_rel) or any(_SYNC_FUNC.search(f.function) for f in lib_frames[:4]) \
                or _SYNC_CODE.search(inner_code):
            sync = "yes"
        elif gpu_job and not inner_code and cats[0] in ("user", "framework"):
            sync = "maybe"
    io_i = next((i for i, c in enumerate(cats) if c == "io"), None)
    if lib_i is not None and cats[lib_i] not in ("collective", "autograd") and io_i is not None:
        # inside checkpoint or serialization code (torch.save, safetensors, a CheckpointIO),
        # whatever the innermost frames are (the user's file wrapper, the stdlib's write): I/O
        ou_i = next((i for i in range(io_i + 1, len(frames)) if cats[i] == "user"), len(frames))
        outer_user = frames[ou_i] if ou_i < len(frames) else None
        f = frames[max(i for i in range(io_i, ou_i) if cats[i] == "io")]  # the call the user made: torch.save
        ou = f" called from `{outer_user.function}` at {_at(outer_user)}" if outer_user else ""
        return RankStack("io", f"in I/O (`{f.function}`, {_short(f.file)}){ou}", outer_user or user, frames[0],
                         f.function, t.state, t.name, signature, exact, code, native_read=native_read)
    if lib_i is None:  # only stdlib frames: a thread of the interpreter itself
        kind = "unknown"
        text = f"in `{frames[0].function}` ({_short(frames[0].file)})"
    else:
        c = cats[lib_i]
        inner_stdlib = {_short(f.file).split("/", 1)[0].removesuffix(".py") for f in frames[:lib_i]}
        if c == "collective":
            kind = "collective"
            ci = next(i for i, x in enumerate(cats) if x == "collective")
            extra = []
            rels = [_short(f.file) for f in frames[: user_i if user_i is not None else len(frames)]]
            if any(r.startswith("torch/distributed/fsdp/") for r in rels):
                extra.append("FSDP")
            if "torch/nn/parallel/distributed.py" in rels:
                extra.append("DDP")
            pkg = "torch.distributed" if _short(frames[ci].file).startswith("torch/") else _short(frames[ci].file)
            text = f"waits in `{frames[ci].function}` ({', '.join([pkg] + extra)})" + (f" called from {ufn}{loc}" if user else "")
            call = frames[ci].function
        elif c == "autograd":
            kind = "backward"
            text = "in backward" + (f" called from {ufn}{loc}" if user else "")
            call = call or "backward"
        elif c == "data":
            kind = "data"
            text = f"waits for data (`{frames[lib_i].function}`, {_short(frames[lib_i].file)})" + (f" called from {ufn}{loc}" if user else "")
        elif c == "io" or inner_stdlib & _IO_STDLIB:
            kind = "io"
            f = frames[lib_i] if c == "io" else frames[lib_i - 1]
            text = f"in I/O (`{f.function}`, {_short(f.file)})" + (f" called from {ufn}{loc}" if user else "")
        elif c == "user":
            shown = call or (_call_in(code) if code else "")
            # (a dump that does not say whether the thread ran, gdb's: its innermost native frames do)
            if t.state == "idle" or (t.state == "" and primitive(inner_native) in ("wait", "lock")):
                kind = "sleep/wait in user code"
                how = f" (`{shown}`)" if shown else " (idle: sleeping or blocked in a C call)"
                if primitive(inner_native) == "lock":
                    around = _other_threads(threads, t)
                    deadlock = _gil_deadlock(around, inner_native)
                    if deadlock:
                        how, others = f" ({deadlock})", around
            else:
                kind = "user code"
                how = f" (`{shown}`)" if shown else " (running)"
            text = f"in {ufn}{loc}{how}"
            call = shown
        else:  # other library code (torch internals, lightning, ...)
            kind = "framework"
            f = frames[lib_i]
            text = f"in `{f.function}` ({_short(f.file)})" + (f" called from {ufn}{loc}" if user else "")
    return RankStack(kind, text, user, frames[0], call, t.state, t.name, signature, exact, code,
                     native_read=native_read,
                     sync=sync if kind in ("user code", "sleep/wait in user code", "framework") else "",
                     others=others)


def _gil_deadlock(others: tuple[str, ...], inner_native: list[Frame]) -> str:
    """The words for a main thread blocked on a lock in C (``inner_native``: its frames below its innermost
    Python frame) while another thread waits to take the GIL (``others``, as ``_other_threads`` says them):
    the two halves of a lock-order deadlock with the GIL (the main thread holds the GIL and wants the lock;
    the other holds the lock, or is what the lock waits for, and wants the GIL: a C++ destructor run from
    Python without releasing the GIL, pytorch/pytorch#56297); "" otherwise."""
    takers = [o for o in others if "waits to take the GIL" in o]
    if not takers:
        return ""
    # the call that took the lock: the first named frame outside the C library's own (libc, libpthread)
    holder = next((f for f in inner_native if f.named and not re.match(r"lib(?:c|pthread)[.-]", f.base)), None)
    where = f" in `{holder.function.split('(')[0]}` ({holder.base})" if holder is not None else ""
    return (f"blocked on a lock{where} while holding the GIL; {takers[0]}: a lock-order deadlock with the GIL")




# a collective's host code in a native backtrace: gloo's (in libtorch_cpu), c10d's process groups, MPI's,
# Horovod's controllers; the operation by its name
_NATIVE_COLLECTIVE = re.compile(r"^(?:gloo|c10d|horovod|ompi|mca_coll|P?MPI)\b|^P?MPI_", re.IGNORECASE)
_COLLECTIVE_OP = re.compile(r"all_?gather|all_?reduce|reduce_?scatter|broadcast|barrier|all_?to_?all|gather|"
                            r"scatter|reduce|send|recv|wait", re.IGNORECASE)
# the runtime's own frames, never what a thread is doing: libc, the C++ library's locks, CPython's
_PLUMBING = re.compile(r"^(?:std::|__gthread|__?pthread|pthread_|__lll_|__futex|futex|syscall|clone|start_thread|"
                       r"_?Py|PyEval|take_gil|drop_gil|_?_?libc_|__GI_|ioctl|poll|epoll|select|read|write|recv|"
                       r"send|accept|nanosleep|usleep|sleep|sem_)")


def _short_symbol(f: Frame) -> str:
    """A native frame's function without its C++ arguments and template parameters."""
    fn = f.function.split("@", 1)[0]
    depth, out = 0, []
    for ch in fn:
        if ch in "(<":
            depth += 1
        elif ch in ")>":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip() or fn


def _native_only(t: Thread, threads: list[Thread], inner: list[Frame]) -> RankStack:
    """A thread with native frames only, none in a GPU library (a gdb backtrace of a CPU-side wait): a
    collective's host code (gloo, c10d, MPI, Horovod) is a collective; else what its outermost named frame
    does, and how it waits there (a lock, a wait, the GIL), in a framework's code."""
    named = [f for f in inner if f.named]
    prim = primitive(inner)
    gil = next((f for f in named if _TAKE_GIL.search(f.function)), None)
    coll = [f for f in named if _NATIVE_COLLECTIVE.search(_short_symbol(f)) and
            _COLLECTIVE_OP.search(_short_symbol(f).rsplit("::", 1)[-1])]
    sig = tuple(f"{_short_symbol(f)}@{f.base}" for f in named if not _PLUMBING.search(_short_symbol(f)))
    if coll:
        op = coll[-1]  # (the outermost: the operation the program asked for; the innermost is its transport)
        text = f"waits in `{_short_symbol(op)}` ({op.base or 'native code'}), a collective's host code"
        # (grouped by the operation and what called it: inside it, a ring's ranks wait in send or in receive)
        outer = tuple(f"{_short_symbol(f)}@{f.base}" for f in named[named.index(op):]
                      if not _PLUMBING.search(_short_symbol(f)))
        return RankStack("collective", text, None, op, _short_symbol(op), t.state, t.name, outer, outer,
                         native_read=True, others=_other_threads(threads, t))
    own = [f for f in named if not _PLUMBING.search(_short_symbol(f))]
    at = own[-1] if own else named[-1]
    where = f"`{_short_symbol(at)}` ({at.base or 'native code'})"
    text = (f"waits to take the GIL in {where}" if gil is not None else f"in {where}, blocked on a lock"
            if prim == "lock" else f"waits in {where}" if prim == "wait" else f"in {where}")
    return RankStack("framework", text, None, at, _short_symbol(at), t.state, t.name, sig or (text,), sig,
                     native_read=True, others=_other_threads(threads, t))


def _native_words(g: GpuWait, inner: list[Frame]) -> str:
    """The GPU call in words: "cudaStreamSynchronize (libcudart.so.12)", or
    where the thread is when no call is named ("in the CUDA driver")."""
    if g.call:
        f = next((f for f in reversed(inner) if f.function.split("@", 1)[0] == g.call), None)
        return f"{g.call} ({f.base}{f':{f.line}' if f.line else ''})" if f is not None and f.file else g.call
    return f"in {g.library}"


def main_frames(text: str) -> tuple[list[str], list[int]]:
    """The main thread's frames of one dump, innermost first, as
    ``function (file:line)`` lines, and the indices of the user's own frames
    (for the stacks pane)."""
    t = _main_thread(parse_dump(text))
    if t is None:
        return [], []
    lines = [((f"{frame_words(f)} ({f.base})" if library_of(f) is not None else frame_words(f))
              if f.native and not f.named else
              f"{f.function} ({_short(f.file)}{f':{f.line}' if f.line else ''})") for f in t.frames]
    user = [i for i, f in enumerate(t.frames) if classify_frame(f) == "user"]
    return lines, user


def _main_block(text: str) -> str:
    """The main thread's part of a dump, its Python frames and (with --locals)
    their variables, without the thread's header (whose state flickers) and
    without native frames (a native sample is compared with a Python-only one)."""
    t = _main_thread(parse_dump(text))
    if t is None:
        return ""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m or _PROCESS.match(line):
            if inside:
                break
            tid = m.group(1) if m else ""
            inside = bool(m) and thread_id(tid) == t.id
            continue
        if inside:
            f = _FRAME.match(line)
            if f and Frame(f.group(1), f.group(2), int(f.group(3) or 0)).native:
                continue
            out.append(line.rstrip())
    return "\n".join(out)


def moved(before: str, now: str) -> bool | None:
    """Did a rank's main thread move between two dumps (taken some seconds
    apart)?  A changed stack, or the same stack with changed local variables
    (dumps taken with ``--locals``: a loop's counter, new tensors, on the line
    where a healthy loop spends its time) is movement.  The same stack and
    variables on the CPU is not, by itself: a rank spinning at a CUDA
    synchronisation behind a hung NCCL collective looks exactly so (the full
    samples then judge it, with native frames and GPU use).  None when either
    dump has no stack."""
    a, b = rank_state(parse_dump(before)), rank_state(parse_dump(now))
    if not a.exact or not b.exact:
        return None
    return a.exact != b.exact or _main_block(before) != _main_block(now)


# --------------------------------------------------------------------------- verdict

def _spinning_on_gpu(st: RankStack, busy: bool = True) -> RankStack:
    """A rank on one unchanged line while its GPU is busy and no step comes:
    how a CUDA synchronisation point looks without native frames (spinning
    on the CPU, or sleeping with blocking sync)."""
    loc = f" at {_at(st.user)}" if st.user else f" in `{st.innermost.function}`" if st.innermost else ""
    what = f" (`{st.call}`)" if st.call else ""
    how = "sleeps" if st.state == "idle" else "spins"
    why = "its GPU busy" if busy else "a synchronisation, no native frames"
    return replace(st, kind="gpu-wait", text=f"waits on the GPU{loc}{what} ({how} on one line, {why})",
                   gpu="util" if busy else "sync", native="")


# the kinds read from native frames (a GPU call, the driver's lock, NCCL's host code)
_NATIVE_KINDS = ("gpu-wait", "gpu-lock", "nccl")


def verdict(samples: dict[int, list[str]], source_line: SourceLine | None = None,
            gpu_busy: Iterable[int] = (), gpu_util: Mapping[int, float | None] | None = None,
            gpu_job: bool = False, no_gpu: Iterable[int] = ()) -> StackEvidence:
    """Hang verdict from py-spy dumps (or gdb / pystack ones) of every rank, oldest first.

    With >= 2 dumps per rank, taken >= 1 s apart, per rank: *frozen* (same
    main-thread stack in every sample, or the same stack while idle, or at a
    GPU sync), *busy* (same stack on the CPU in every sample, not at a GPU
    sync: a tight loop, counted as moving), *moving* (stack changes),
    *unclear* (one unchanged line that may be a GPU synchronisation, with no
    native frames and no GPU telemetry to tell: neither culprit nor waiter)
    or *unknown*.  With one dump, *seen*: frozen and moving cannot be told
    apart, so ``hung`` is None, but the odd rank out is still named by where
    each rank is.

    A rank waits (``waiting``) when it is frozen in a collective, in
    backward, at a GPU sync (its native frames, spinning or sleeping, or one
    unchanged line while its GPU is busy: ``gpu_busy`` / ``gpu_util``) or in
    NCCL's host code; a rank blocked on a lock in the CUDA driver (kind
    ``gpu-lock``) does not wait for its peers, it is stuck.

    Rules: every rank frozen => hung; ranks waiting while others move =>
    hung and the movers are the culprits (unless a mover itself passed
    through a wait between samples: then the job progresses); a frozen rank
    outside the wait the others are in is a culprit; ranks waiting at
    different places (collectives, sync lines) are a mismatch whose minority
    is the culprit when there is a majority; every rank on the driver's lock
    is a deadlock in the driver with no odd rank out; all moving => no hang.

    ``no_gpu``: ranks whose process has no GPU runtime mapped (read by the
    sampler from ``/proc/PID/maps``): none of their lines waits on a GPU,
    whatever the telemetry mapped to them says.
    """
    no_gpu = set(no_gpu)
    utils: dict[int, float | None] = dict(gpu_util or {})
    for r in gpu_busy:
        utils[r] = max(utils.get(r) or 0.0, HOT_UTIL)
    states: dict[int, list[RankStack]] = {}
    status: dict[int, str] = {}
    lasts: dict[int, str] = {}
    parsed = {r: [(d, parse_dump(d)) for d in dumps or ()] for r, dumps in samples.items()}
    # a GPU job: a caller that knows, or any rank's native frames in a GPU library
    gpu_job = gpu_job or any(u is not None for u in utils.values()) or any(
        gpu_library(f) for ds in parsed.values() for _d, ts in ds for t in ts for f in t.frames if f.native)
    for rank, dumps in sorted(parsed.items()):
        gpu_ok = rank not in no_gpu
        pairs = [(d, rank_state(ts, source_line, gpu_job and gpu_ok, gpu_ok)) for d, ts in dumps]
        pairs = [(d, s) for d, s in pairs if s.kind != "unknown" or s.exact]
        sts = [s for _d, s in pairs]
        if pairs:
            lasts[rank] = pairs[-1][0]
        states[rank] = sts
        if not sts:
            status[rank] = "unknown"
            continue
        if len(sts) >= 2 and (len({s.exact for s in sts}) > 1 or len({_main_block(d) for d, _s in pairs}) > 1):
            # (the same frames with other local variables, in dumps taken with --locals: a loop's counter moved)
            status[rank] = "moving"
            continue
        util = utils.get(rank) if gpu_ok else None
        busy_gpu = util is not None and util >= HOT_UTIL
        native_read = any(s.native_read for s in sts)
        gpu = next((s for s in reversed(sts) if s.kind in _NATIVE_KINDS), None)
        unclear = False
        if gpu is not None:
            sts[-1] = gpu  # (a Python-only sample and a native one of the same line)
        elif not native_read and sts[-1].kind not in WAITING_KINDS and (
                sts[-1].sync or (busy_gpu and all(s.state == "active" for s in sts))):
            # no native frames: a line that is (or may be) a GPU sync, read with the GPU's telemetry: a busy GPU
            # says it waits; a known sync waits unless its GPU is idle; a C call nothing names cannot be told
            if busy_gpu or (sts[-1].sync == "yes" and util is None):
                sts[-1] = _spinning_on_gpu(sts[-1], busy_gpu)
            elif util is None:
                unclear = True
        if unclear:
            status[rank] = "unclear"
        elif len(sts) < 2:
            status[rank] = "seen"
        elif all(s.state == "active" for s in sts) and sts[-1].kind not in WAITING_KINDS + ("gpu-lock",):
            status[rank] = "busy"
        else:
            status[rank] = "frozen"

    io = [r for r, sts in states.items() if status[r] in ("frozen", "busy") and sts
          and all(x.kind == "io" for x in sts)]
    where = {}
    for r in sorted(status):
        last = states[r][-1] if states[r] else None
        w = _where(r, last, status[r])
        where[r] = replace(w, signature=last.signature if last else (), samples=len(states[r]),
                           passed=any(x.kind in WAITING_KINDS for x in states[r]))
    frames = {r: tuple(tuple(x) for x in main_frames(lasts[r])) for r in lasts}
    return judge(where, io, frames)  # type: ignore[arg-type]


def _where(rank: int, st: RankStack | None, status: str) -> Where:
    if st is None:
        return Where(rank, status)
    u = st.user
    inner = st.innermost
    # (an unnamed native frame is said by its library, never by its address)
    inner_fn = (inner.function if not inner.function.startswith("0x") else "") if inner else ""
    return Where(rank, status, st.kind, u.function if u else inner_fn,
                 u.file if u else (inner.file if inner else ""), u.line if u else (inner.line if inner else 0),
                 st.call, inner_fn, _short(inner.file) if inner else "", st.code, st.text,
                 gpu=st.gpu, native=st.native, library=st.library, others=st.others,
                 native_read=st.native_read)


