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

import json
import re
import sys
from dataclasses import dataclass
from typing import Callable, Iterable

from ddptop.core.analysis.evidence import KINDS, WAITING_KINDS, StackEvidence, StackGroup, Where, ranks_text

__all__ = [
    "Frame", "Thread", "RankStack",
    "parse_dump", "classify_frame", "gpu_library", "rank_state", "verdict", "main_active", "main_frames", "moved",
    "CATEGORIES", "KINDS", "WAITING_KINDS",
]

# categories of a frame (classify_frame)
CATEGORIES = ("collective", "autograd", "data", "io", "stdlib", "framework", "user", "native")

# a callable giving the source text of (file, line), or None; supplied by the
# caller (which may read files) so that this module stays pure
SourceLine = Callable[[str, int], "str | None"]


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Frame:
    function: str
    file: str  # as py-spy printed it: full path, or shortened ("torch/distributed/...", "train.py")
    line: int  # 0 when py-spy printed none (native frames)

    @property
    def short_file(self) -> str:
        return _short(self.file)

    @property
    def base(self) -> str:
        return self.file.replace("\\", "/").rsplit("/", 1)[-1]

    @property
    def native(self) -> bool:
        """A C/C++ frame (py-spy --native): its file is a shared library or a
        C source, not Python source."""
        f = self.file
        return not (f.endswith((".py", ".pyw", ".pyx")) or f.startswith("<") or not f)

    def to_dict(self) -> dict:
        return {"function": self.function, "file": self.file, "line": self.line}


@dataclass(frozen=True)
class Thread:
    name: str  # "" when py-spy printed none
    id: int
    state: str  # "active" or "idle"
    frames: tuple[Frame, ...]  # innermost first, as py-spy prints them
    gil: bool = False
    pid: int | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "id": self.id, "state": self.state, "gil": self.gil, "pid": self.pid,
                "frames": [f.to_dict() for f in self.frames]}


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
    gpu: str = ""  # the GPU library its native frames come from (kind "gpu-wait"), or ""
    native: str = ""  # that frame: "cudaStreamSynchronize (libcudart.so.12)"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "text": self.text,
                "user": self.user.to_dict() if self.user else None,
                "innermost": self.innermost.to_dict() if self.innermost else None,
                "call": self.call, "state": self.state, "thread": self.thread,
                "signature": list(self.signature), "code": self.code, "gpu": self.gpu, "native": self.native}


# --------------------------------------------------------------------------- parsing

_PROCESS = re.compile(r"^Process (\d+):")
_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?::\s*"(.*)")?\s*$')
_FRAME = re.compile(r"^    (\S.*?) \((.*?)(?::(\d+))?\)\s*$")


def parse_dump(text: str) -> list[Thread]:
    """Threads of a ``py-spy dump`` output (text, with or without --locals, or --json).

    Anything that is not a dump (an error message, an empty string) gives [].
    """
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            return _parse_json(json.loads(stripped))
        except (ValueError, TypeError, KeyError, AttributeError):
            return []
    threads: list[Thread] = []
    pid: int | None = None
    cur: dict | None = None

    def close() -> None:
        if cur is not None:
            threads.append(Thread(cur["name"], cur["id"], cur["state"], tuple(cur["frames"]), cur["gil"], pid))

    for raw in text.splitlines():
        line = raw.rstrip("\r\n")
        m = _PROCESS.match(line)
        if m:
            close()
            cur = None
            pid = int(m.group(1))
            continue
        m = _THREAD.match(line)
        if m:
            close()
            tid = m.group(1)
            st = m.group(2)
            cur = {"name": m.group(3) or "", "id": int(tid, 16) if tid.lower().startswith("0x") else int(tid),
                   "state": "idle" if "idle" in st else "active", "gil": "gil" in st, "frames": []}
            continue
        if cur is None:
            continue
        m = _FRAME.match(line)  # exactly 4 spaces: Arguments:/Locals: and their values are deeper
        if m:
            cur["frames"].append(Frame(m.group(1), m.group(2), int(m.group(3) or 0)))
    close()
    return threads


def _parse_json(data) -> list[Thread]:
    out = []
    for t in data:
        frames = tuple(Frame(str(f.get("name", "")), str(f.get("short_filename") or f.get("filename") or ""),
                             int(f.get("line") or 0)) for f in t.get("frames") or ())
        tid = t.get("os_thread_id") or t.get("thread_id") or 0
        out.append(Thread(str(t.get("thread_name") or ""), int(tid), "active" if t.get("active") else "idle",
                          frames, bool(t.get("owns_gil")), t.get("pid")))
    return out


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


# native libraries whose frames on the main thread mean "waits on the GPU": the CUDA runtime
# (libcudart), the driver (libcuda: its frames often have no symbol name), NCCL (libnccl)
_GPU_LIB = re.compile(r"^(libcudart|libcuda|libnccl)(?:[._-]|$)")


def gpu_library(frame: Frame) -> str:
    """"libcudart", "libcuda" or "libnccl" for a native frame from one of
    them (by its library file), else ""."""
    if not frame.native:
        return ""
    m = _GPU_LIB.match(frame.base)
    return m.group(1) if m else ""


def classify_frame(frame: Frame) -> str:
    """One of CATEGORIES, from the file the frame comes from."""
    if frame.native:
        return "native"
    origin, rel = _where_from(frame.file)
    if origin == "stdlib":
        return "stdlib"
    if origin == "user":
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
    return "framework"


# --------------------------------------------------------------------------- one rank


def _main_thread(threads: Iterable[Thread]) -> Thread | None:
    threads = list(threads)
    for t in threads:
        if t.name == "MainThread":
            return t
    return threads[0] if threads else None


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


def rank_state(threads: Iterable[Thread], source_line: SourceLine | None = None) -> RankStack:
    """What the main thread (named MainThread, else the first) is doing.

    ``source_line(file, line)``, when given, returns the source text of a line
    (the caller may read files); it names the call a user frame is blocked in
    (``time.sleep``), which py-spy cannot show for C functions.
    """
    t = _main_thread(threads)
    frames = tuple(f for f in t.frames if not f.native) if t is not None else ()
    if t is None or not frames:
        return RankStack("unknown", "no Python stack", None, None, "", t.state if t else "",
                         t.name if t else "", (), ())
    # the native frames inside the innermost Python one: where that call is, in C
    inner_native = []
    for f in t.frames:
        if not f.native:
            break
        inner_native.append(f)
    gpu_i = next((i for i, f in enumerate(inner_native) if gpu_library(f)), None)
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

    if gpu_i is not None:
        # spinning (or blocked) at a CUDA synchronisation point: the outermost GPU-library frame is the
        # call the Python code made (cudaStreamSynchronize), the driver's frames inside it may be nameless
        outer = max(i for i, f in enumerate(inner_native) if gpu_library(f))
        g = inner_native[outer]
        lib = gpu_library(g)
        named = next((f for f in reversed(inner_native[:outer + 1]) if gpu_library(f) and not f.function.startswith("0x")), g)
        native = f"{named.function} ({named.base})"
        where = f" called from {ufn}{loc}" if user else f" in `{frames[0].function}` ({_short(frames[0].file)})"
        text = f"waits on the GPU (`{named.function}`, {lib}){where}"
        return RankStack("gpu-wait", text, user, frames[0], call or named.function, t.state, t.name, signature, exact,
                         code, lib, native)
    io_i = next((i for i, c in enumerate(cats) if c == "io"), None)
    if lib_i is not None and cats[lib_i] not in ("collective", "autograd") and io_i is not None:
        # inside checkpoint or serialization code (torch.save, safetensors, a CheckpointIO),
        # whatever the innermost frames are (the user's file wrapper, the stdlib's write): I/O
        ou_i = next((i for i in range(io_i + 1, len(frames)) if cats[i] == "user"), len(frames))
        outer_user = frames[ou_i] if ou_i < len(frames) else None
        f = frames[max(i for i in range(io_i, ou_i) if cats[i] == "io")]  # the call the user made: torch.save
        ou = f" called from `{outer_user.function}` at {_at(outer_user)}" if outer_user else ""
        return RankStack("io", f"in I/O (`{f.function}`, {_short(f.file)}){ou}", outer_user or user, frames[0],
                         f.function, t.state, t.name, signature, exact, code)
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
            if t.state == "idle":
                kind = "sleep/wait in user code"
                how = f" (`{shown}`)" if shown else " (idle: sleeping or blocked in a C call)"
            else:
                kind = "user code"
                how = f" (`{shown}`)" if shown else " (running)"
            text = f"in {ufn}{loc}{how}"
            call = shown
        else:  # other library code (torch internals, lightning, ...)
            kind = "framework"
            f = frames[lib_i]
            text = f"in `{f.function}` ({_short(f.file)})" + (f" called from {ufn}{loc}" if user else "")
    return RankStack(kind, text, user, frames[0], call, t.state, t.name, signature, exact, code)


def main_active(text: str) -> bool:
    """The main thread of one dump is on the CPU (py-spy says "active")."""
    t = _main_thread(parse_dump(text))
    return t is not None and t.state == "active"


def main_frames(text: str) -> tuple[list[str], list[int]]:
    """The main thread's frames of one dump, innermost first, as
    ``function (file:line)`` lines, and the indices of the user's own frames
    (for the stacks pane)."""
    t = _main_thread(parse_dump(text))
    if t is None:
        return [], []
    lines = [f"{f.function} ({_short(f.file)}{f':{f.line}' if f.line else ''})" for f in t.frames]
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
            inside = bool(m) and (int(tid, 16) if tid.lower().startswith("0x") else int(tid)) == t.id
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

def _describe(st: RankStack, status: str) -> str:
    if status == "frozen" and st.kind == "backward":
        return "waits in backward (DDP all-reduce)" + (f" at {_at(st.user)}" if st.user else "")
    if status == "frozen" and st.kind == "collective":
        return st.text.replace(" called from ", " from ", 1)
    if st.kind == "gpu-wait":
        return st.text.replace(" called from ", " at ", 1)
    if status == "frozen":
        return st.text if st.text.startswith("waits ") else "is " + st.text
    if status == "busy":
        return "is busy " + st.text.replace(" (running)", "") + " (on CPU, same line in every sample)"
    if status == "moving":
        return "is moving (stack changes between samples), last " + st.text
    return "has no usable stack"


def _spinning_on_gpu(st: RankStack) -> RankStack:
    """A rank on one unchanged line on the CPU while its GPU is busy and no step
    comes: how a CUDA synchronisation point looks without native frames."""
    loc = f" at {_at(st.user)}" if st.user else f" in `{st.innermost.function}`" if st.innermost else ""
    what = f" (`{st.call}`)" if st.call else ""
    return RankStack("gpu-wait", f"waits on the GPU{loc}{what} (spins on one line, its GPU busy)", st.user,
                     st.innermost, st.call, st.state, st.thread, st.signature, st.exact, st.code, "util", "")


def verdict(samples: dict[int, list[str]], source_line: SourceLine | None = None,
            gpu_busy: Iterable[int] = ()) -> StackEvidence:
    """Hang verdict from >= 2 py-spy dumps per rank, oldest first, taken >= 1 s apart.

    Per rank: *frozen* (same main-thread stack in every sample, or the same
    stack while idle, or at a GPU sync), *busy* (same stack on the CPU in
    every sample, not at a GPU sync: a tight loop, counted as moving),
    *moving* (stack changes) or *unknown*.  A rank waits (``waiting``) when
    it is frozen in a collective, in backward or at a GPU sync (its native
    frames, or busy on one line while in ``gpu_busy``).

    Rules: every rank frozen => hung; ranks waiting while others move =>
    hung and the movers are the culprits (unless a mover itself passed
    through a wait between samples: then the job progresses); a frozen rank
    outside the wait the others are in is a culprit; ranks waiting at
    different places (collectives, sync lines) are a mismatch whose minority
    is the culprit when there is a majority; all moving => no hang.
    """
    busy_gpu = set(gpu_busy)
    states: dict[int, list[RankStack]] = {}
    status: dict[int, str] = {}
    lasts: dict[int, str] = {}
    for rank, dumps in sorted(samples.items()):
        pairs = [(d, rank_state(parse_dump(d), source_line)) for d in dumps or ()]
        pairs = [(d, s) for d, s in pairs if s.kind != "unknown" or s.exact]
        sts = [s for _d, s in pairs]
        if pairs:
            lasts[rank] = pairs[-1][0]
        if len(sts) < 2:
            status[rank] = "unknown"
        elif len({s.exact for s in sts}) > 1 or len({_main_block(d) for d, _s in pairs}) > 1:
            # (the same frames with other local variables, in dumps taken with --locals: a loop's counter moved)
            status[rank] = "moving"
        else:
            gpu = next((s for s in reversed(sts) if s.kind == "gpu-wait"), None)
            if gpu is not None:
                sts[-1] = gpu  # (a Python-only sample and a native one of the same line)
            elif rank in busy_gpu and all(s.state == "active" for s in sts) and sts[-1].kind not in WAITING_KINDS:
                sts[-1] = _spinning_on_gpu(sts[-1])
            if all(s.state == "active" for s in sts) and sts[-1].kind not in WAITING_KINDS:
                status[rank] = "busy"
            else:
                status[rank] = "frozen"
        states[rank] = sts

    known = [r for r, s in status.items() if s != "unknown"]
    if not known:
        return StackEvidence(hung=None, where={r: Where(r) for r in status},
                             groups=_groups(states, status, lasts),
                             summary="cannot tell: fewer than 2 usable py-spy samples per rank")

    last = {r: states[r][-1] for r in known}
    # a rank in I/O in every sample (writing a checkpoint) works, even when its
    # stack does not change: it counts with the movers, and may be waited for
    io = [r for r in known if status[r] in ("frozen", "busy") and all(s.kind == "io" for s in states[r])]
    frozen = [r for r in known if status[r] == "frozen" and r not in io]
    movers = [r for r in known if status[r] in ("moving", "busy") or r in io]
    waiting = [r for r in frozen if last[r].kind in WAITING_KINDS]
    outside = [r for r in frozen if r not in waiting]
    notes: list[str] = []
    mismatch = False

    if not movers:
        hung = True
        if waiting and outside:
            culprits = outside
        elif waiting:
            # everyone waits: at one place (the same collective: no odd one out), or at several (a mismatch:
            # the minority took another path, when there is a majority)
            sigs = {r: last[r].signature for r in waiting}
            mismatch = len(set(sigs.values())) > 1
            culprits = _minority(sigs)
        else:
            culprits = _minority({r: last[r].signature for r in frozen})
            if not culprits and len(frozen) == 1:
                culprits = list(frozen)  # a single rank stuck outside any collective
    elif waiting:
        passed = [r for r in movers if any(s.kind in WAITING_KINDS for s in states[r])]
        if passed:
            hung = False
            culprits = []
            notes.append(f"{ranks_text(passed)} went through a collective/backward between samples, so "
                         f"{ranks_text(waiting)}, seen waiting there in every sample, most likely just waits"
                         f" for the others at each step")
        elif io and not outside and all(r in io for r in movers):
            hung = False
            culprits = []
            notes.append(f"{ranks_text(io)} {'is' if len(io) == 1 else 'are'} in I/O (a checkpoint write?) and "
                         f"{ranks_text(waiting)} {'waits' if len(waiting) == 1 else 'wait'} for it: work, unless it lasts")
        else:
            hung = True
            culprits = [r for r in movers if r not in io] + outside or list(io)
    elif outside and all(status[r] == "busy" and r not in io for r in movers):
        # nobody's stack changes: some ranks frozen in their own code, the others
        # spinning on one line (polling for the frozen ones, as a collective's
        # wait does): the frozen ones are the culprits, the spinners wait
        hung = True
        culprits = outside
        waiting = list(movers)
        notes.append(f"{ranks_text(movers)} {'spins' if len(movers) == 1 else 'spin'} on one line (polling) while "
                     f"{ranks_text(outside)} {'is' if len(outside) == 1 else 'are'} frozen")
    else:
        hung = False
        culprits = []
        waiting = []

    culprits = sorted(set(culprits))
    waiting = sorted(set(waiting) - set(culprits))
    where = {r: _where(r, states[r][-1] if states[r] else None, status[r]) for r in sorted(status)}
    workers: list[int] = []
    if hung and culprits and waiting and all(where[r].working for r in culprits):
        # the others wait for ranks that visibly work (rank 0 evaluating alone): not a hang, unless it lasts
        hung, workers, culprits = False, culprits, []
        notes.append(f"{ranks_text(waiting)} {'waits' if len(waiting) == 1 else 'wait'} for {ranks_text(workers)}, "
                     f"which {'works' if len(workers) == 1 else 'work'}: not a hang unless it lasts")
    groups = _groups(states, status, lasts, culprits)
    summary = _summary(hung, culprits, groups, last, status, notes, mismatch)
    return StackEvidence(hung=hung, culprits=tuple(culprits), waiting=tuple(waiting), mismatch=mismatch,
                         where=where, io=tuple(io), summary=summary, groups=groups, workers=tuple(workers))


def _minority(sigs: dict[int, tuple[str, ...]]) -> list[int]:
    by: dict[tuple[str, ...], list[int]] = {}
    for r, s in sigs.items():
        by.setdefault(s, []).append(r)
    if len(by) < 2:
        return []
    sizes = sorted(len(v) for v in by.values())
    if sizes[-1] == sizes[-2]:
        return []  # no majority: nobody is the odd one out
    return [r for v in by.values() if len(v) < sizes[-1] for r in v]


def _groups(states: dict[int, list[RankStack]], status: dict[int, str], lasts: dict[int, str],
            culprits: Iterable[int] = ()) -> tuple[StackGroup, ...]:
    odd = set(culprits)
    by: dict[tuple, list[int]] = {}
    for r, st in status.items():
        key = (st, states[r][-1].signature) if st in ("frozen", "busy") else (st,)
        by.setdefault(key, []).append(r)
    out = []
    for key, rs in by.items():
        st = key[0]
        last = states[rs[0]][-1] if states[rs[0]] else None
        kind = last.kind if last and st in ("frozen", "busy") else ("unknown" if st == "unknown" else "moving")
        desc = _describe(last, st) if last and st in ("frozen", "busy") else (
            "stack changes between samples (working)" if st == "moving" else "no usable py-spy samples")
        frames, user = main_frames(lasts[rs[0]]) if rs[0] in lasts else ([], [])
        out.append(StackGroup(tuple(sorted(rs)), st, kind, _plural(desc, len(rs)), any(r in odd for r in rs),
                              tuple(frames), tuple(user)))
    return tuple(sorted(out, key=lambda g: (-len(g.ranks), g.ranks)))


def _plural(desc: str, n: int) -> str:
    if n < 2:
        return desc
    verb, _, rest = desc.partition(" ")
    return {"waits": "wait", "is": "are"}.get(verb, verb) + " " + rest


def _where(rank: int, st: RankStack | None, status: str) -> Where:
    if st is None:
        return Where(rank, status)
    u = st.user
    inner = st.innermost
    return Where(rank, status, st.kind, u.function if u else (inner.function if inner else ""),
                 u.file if u else (inner.file if inner else ""), u.line if u else (inner.line if inner else 0),
                 st.call, inner.function if inner else "", _short(inner.file) if inner else "", st.code, st.text,
                 gpu=st.gpu, native=st.native)


def _summary(hung, culprits, groups, last, status, notes, mismatch) -> str:
    parts = []
    for r in culprits:
        parts.append(f"rank {r} {_describe(last[r], status[r])}")
    for g in groups:
        rs = [r for r in g.ranks if r not in culprits]
        if not rs:
            continue
        if g.status in ("frozen", "busy"):
            parts.append(f"{ranks_text(rs)} {_plural(_describe(last[rs[0]], g.status), len(rs))}")
        elif g.status == "moving":
            parts.append(f"{ranks_text(rs)} {'is' if len(rs) == 1 else 'are'} moving")
        else:
            parts.append(f"{ranks_text(rs)}: no usable samples")
    head = {True: "hung: ", False: "no hang: ", None: ""}[hung]
    if hung and mismatch:
        head = "hung, ranks wait in different places: " if culprits else "hung, no single culprit: "
    elif hung and not culprits:
        head = "hung, no single culprit: "
    return head + "; ".join(parts + notes)
