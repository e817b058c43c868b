"""Stack dumps as text, read into threads and frames (pure: text in, ``Thread`` out).

One module, though over 500 lines: one idea, the dump formats people hand over
read into one shape (``Thread``, ``Frame``); each format's parser is a function
of its own here, and they share the frame and thread types and the sniffing.

    parse_dump(text) -> list[Thread]              one process's dump, in any format below
    format_of(text) -> str                        which format a text is a dump in ("" for none)
    split_processes(text) -> list[ProcessDump]    a paste of several processes' dumps, one item each

Formats read, recognised by their content (``format_of`` names them):

``"py-spy"``: ``py-spy dump`` text, with or without ``--native`` and ``--locals``::

    Process 4242: /venv/bin/python -u train.py
    Thread 4242 (active+gil): "MainThread"
        cudaStreamSynchronize (libcudart.so.12)
        train_step (/w/train.py:88)

  A frame's function may hold ``" ("`` itself (C++ templates:
  ``DispatchStub<void (*)(at::TensorIterator&, bool), …>::operator() (libtorch_cpu.so)``):
  the location is the *last* parenthesised group of the line.

``"py-spy-json"``: ``py-spy dump --json`` (a list of threads, newest first; each frame has
  ``name``, ``filename``, ``short_filename``, ``line``, ``module``, ``locals``, ``is_entry``,
  ``is_shim_entry``).  A native frame (``--native``) is the one with a ``module``: its file is
  that shared library (its ``filename`` is the C source where the library has debug
  information), its line 0.

``"gdb"``: gdb's ``thread apply all bt`` (or one ``bt``), with or without CPython's gdb extension::

    Thread 3 (Thread 0x7f6b2d7fe700 (LWP 12345) "python"):
    #0  0x00007f6b3c1b2f7a in ?? () from /lib/x86_64-linux-gnu/libcuda.so.1
    #1  0x00007f6b3d8e0a12 in cudaStreamSynchronize () from /usr/local/cuda/lib64/libcudart.so.12
    #2  ncclGroupEndInternal () at group.cc:406

  A frame's file is the library after ``from``, else the source after ``at`` (with its line);
  an unnamed frame (``?? ()``) has its address as function.  gdb does not say whether a thread
  is on the CPU (state "").  The extension's ``py-bt`` (``Traceback (most recent call first):``
  then ``  File "train.py", line 88, in train``), ``py-bt-full`` (``#4 Frame 0x…, for file
  train.py, line 88, in train ()``) and an evaluation frame's ``f=Frame 0x…, for file …``
  argument give the Python frames, placed where the interpreter runs them.

``"pystack"``: ``pystack remote PID [--native]`` / ``pystack core``::

    Traceback for thread 1234 (python) [Has the GIL] (most recent call last):
        (Python) File "/w/train.py", line 88, in train
            loss.item()
        (C) File "???", line 0, in cudaStreamSynchronize (/usr/local/cuda/lib64/libcudart.so.12)

  printed most recent call LAST (read in reverse), threads newest first (read in reverse: the
  main thread first).  A native frame's file is its library (the last parenthesised group),
  its line 0; an unnamed one (``in ???``) has function "0x?".  ``[Has the GIL]`` reads as state "active"
  (and ``gil``), ``[Waiting for the GIL]`` as "idle", anything else as "".

``"faulthandler"``: Python's ``faulthandler`` (a fatal signal's report, ``dump_traceback``,
``dump_traceback_later``; what a rank prints when it segfaults under ``-X faulthandler``)::

    Fatal Python error: Segmentation fault

    Thread 0x00007fea3155a6c0 (most recent call first):
      File "/usr/lib/python3.11/threading.py", line 320 in wait
      File "/w/loader.py", line 40 in next_batch

    Current thread 0x00007fea323cfb80 (most recent call first):
      File "/w/train.py", line 88 in train_step

  Python frames only, innermost first; threads newest first (the main thread, the one whose
  outermost frame is ``<module>``, is put first; else the last printed).  It says nothing of a
  thread's state ("").

Threads come main thread first, frames innermost first, in every format.  Anything that is
not a dump (an error message, an empty string, a training log) gives [].
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

__all__ = ["with_native", 
    "Frame", "Thread", "ProcessDump", "parse_dump", "format_of", "split_processes", "FORMATS",
    "THREAD_LINE", "PROCESS_LINE", "FRAME_LINE", "FH_THREAD", "FH_FRAME", "thread_id",
]

FORMATS = ("py-spy", "py-spy-json", "gdb", "pystack", "faulthandler")
PY_SUFFIXES = (".py", ".pyw", ".pyx")


@dataclass(frozen=True)
class Frame:
    function: str  # an unnamed native frame's is its address ("0x7f3a…"), or "0x?" where the dump printed none
    file: str  # as the dump printed it: full path, shortened ("torch/distributed/..."), a library, a C source
    line: int  # 0 when the dump printed none (most native frames)
    # "native" or "python" where the dump says which (gdb, pystack, py-spy --json); "" reads it from the file
    lang: str = field(default="", compare=False)

    @property
    def base(self) -> str:
        return self.file.replace("\\", "/").rsplit("/", 1)[-1]

    @property
    def native(self) -> bool:
        """A C/C++ frame (py-spy --native, gdb, pystack --native): its file is a shared library
        or a C/C++ source, not Python source; a frame with no file is native when it is
        an address (gdb's ``?? ()``)."""
        if self.lang:
            return self.lang == "native"
        f = self.file
        if not f:
            return self.function.startswith("0x")
        return not (f.endswith(PY_SUFFIXES) or f.startswith("<"))

    @property
    def named(self) -> bool:
        """False for a frame the dump could give no function name for (its address, "??")."""
        fn = self.function.strip()
        return bool(fn) and not fn.startswith("0x") and fn not in ("??", "???", "<unknown>", "[unknown]")

    def to_dict(self) -> dict:
        return {"function": self.function, "file": self.file, "line": self.line}


@dataclass(frozen=True)
class Thread:
    name: str  # "" when the dump printed none
    id: int
    state: str  # "active" (on the CPU), "idle" (sleeping or blocked), "" (the dump does not say)
    frames: tuple[Frame, ...]  # innermost first
    gil: bool = False
    pid: int | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "id": self.id, "state": self.state, "gil": self.gil, "pid": self.pid,
                "frames": [f.to_dict() for f in self.frames]}


@dataclass(frozen=True)
class ProcessDump:
    """One process's dump out of a paste of several (``split_processes``)."""

    label: str  # "rank 3", else "pid 4242", else "dump 2" (its place in the paste, from 1)
    rank: int | None  # from a line before the dump that names it ("=== rank 3 ===", "rank3.txt")
    pid: int | None  # as the dump (or that line) gives it
    text: str  # the dump, for parse_dump

    def threads(self) -> list[Thread]:
        return parse_dump(self.text)


# --------------------------------------------------------------------------- line shapes

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# py-spy
PROCESS_LINE = re.compile(r"^Process (\d+):")
THREAD_LINE = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?::\s*"(.*)")?\s*$')
# exactly 4 spaces (Arguments:/Locals: and their values are deeper); the location is the last "(...)"
FRAME_LINE = re.compile(r"^    (\S.*?) \(([^()]*?)(?::(\d+))?\)\s*$")
_PYSPY_THREAD = re.compile(r'^Thread (?:0x[0-9A-Fa-f]+|\d+) \((?:idle|active(?:\+gil)?)\)(?::\s*".*")?\s*$')

# gdb: "Thread 3 (Thread 0x7f… (LWP 12345) "python"):", "Thread 2 (LWP 805052):", "Thread 1 (process 4242):"
_GDB_THREAD = re.compile(r"^Thread (\d+(?:\.\d+)?) \(((?:Thread 0x[0-9A-Fa-f]+|LWP \d+|process \d+)\b.*)\):\s*$")
_GDB_FRAME = re.compile(r"^#(\d+)\s+(\S.*?)\s*$")
_GDB_TID = re.compile(r"\bLWP (\d+)|\bprocess (\d+)")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_GDB_CURRENT = re.compile(r"^\[(?:Current thread is|Switching to thread) \S+ \((.*)\)\]")
_GDB_PID = re.compile(r"^(?:Attaching to process (\d+)|Attaching to program: .*, process (\d+)"
                      r"|\[Inferior \d+ \(process (\d+)\) detached\])")
_GDB_BT_PROMPT = re.compile(r"^\((?:cuda-)?gdb\) +(?:bt|backtrace|where)\b")
_GDB_PAGER = re.compile(r"^-{2,3}Type <(?:RET|return)>.*?(?:paging|quit)-{2,3}")
_GDB_WHERE = re.compile(r"\)\s+(at|from)\s+(\S+)$")
_PYBT_HEAD = re.compile(r"^Traceback \(most recent call first\):\s*$")
_PYBT_FILE = re.compile(r'^\s+File "(.+)", line (\d+), in (\S+)')
_BUILTIN = re.compile(r"^\s*<built-in (?:method|function) ([^\s>]+)")
_PY_FRAME_OBJ = re.compile(r"Frame 0x[0-9A-Fa-f]+, for file (.+?), line (\d+), in ([^\s(]+)")

# pystack
_PYSTACK_THREAD = re.compile(r"^\s*Traceback for thread (\d+)(?: \((.*)\))? \[([^\]]*)\] \(most recent call last\):\s*$")
_PYSTACK_EMPTY = re.compile(r"^\s*The frame stack for thread (\d+) is empty")
_PYSTACK_FRAME = re.compile(r'^\s+\((Python|C)\) File "(.*)", line (\d+), in (.*?)\s*$')
_PYSTACK_PID = re.compile(r"^\s*pid: (\d+) ppid: \d+")
_PYSTACK_CORE = re.compile(r"^\s*(?:Using executable found in the core file:|Core file information:)")

# faulthandler's thread heads and frames (a frame's line "N in f", no comma: never a Python traceback's)
FH_THREAD = re.compile(r"^(?P<kind>Current thread|Thread) (?P<id>0x[0-9A-Fa-f]+) \(most recent call first\):\s*$")
FH_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+|\?+) in (?P<fn>.+?)\s*$')
_FH_EMPTY = re.compile(r"^\s+(?:<no Python frame>|\.\.\.)\s*$")
_FH_FATAL = re.compile(r"^Fatal Python error: ")
_JSON_START = re.compile(r"^\[\s*$|^\[\s*\{", re.MULTILINE)
_JSON_OPEN = re.compile(r"^\[\s*$")
_JSON_FRAMES = re.compile(r'^\s*"frames": \[')


def thread_id(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def _lines(text: str) -> list[str]:
    return _ANSI.sub("", text).splitlines()


# --------------------------------------------------------------------------- recognising


def _next_nonblank(lines: list[str], i: int) -> str:
    for j in range(i + 1, len(lines)):
        if lines[j].strip():
            return lines[j]
    return ""


def _gdb_frame_line(line: str) -> bool:
    """A gdb backtrace line: "#0  0x… in f (…) from lib", "#2  f (…) at file.c:12", "#5  ?? ()"."""
    m = _GDB_FRAME.match(line)
    if not m:
        return False
    rest = m.group(2)
    if re.search(r"\sfrom \S+:\d+$", rest):
        return False  # PyTorch's "C++ CapturedTraceback:" lines ("#5 c10::Error::Error(...) from ??:0")
    return bool(re.match(r"0x[0-9A-Fa-f]+ in \S", rest) or rest.endswith(")") or _GDB_WHERE.search(rest)
                or rest.startswith(("<signal handler", "Frame 0x", "<built-in")))


def _json_value(text: str):
    """The first JSON value in text where a line starts one with "[", or None."""
    m = _JSON_START.search(text)
    if not m:
        return None
    try:
        return json.JSONDecoder().raw_decode(text, m.start())[0]
    except ValueError:
        return None


def _is_py_spy_json(data) -> bool:
    return (isinstance(data, list) and bool(data)
            and all(isinstance(t, dict) and isinstance(t.get("frames"), list)
                    and ("thread_id" in t or "os_thread_id" in t) for t in data))


_GDB_ADDR_FRAME = re.compile(r"^#\d+\s+0x[0-9A-Fa-f]+ in \S")


def _sniff(text: str) -> tuple[str, int]:
    """(format, the line it starts at) of the earliest dump in text, or ("", -1)."""
    lines = _lines(text)
    run: list = []  # a run of gdb frame lines without "#0" (a paste cut above): [first line, last #N, any "0x… in"]
    for i, line in enumerate(lines):
        if not line or line[0] not in "CT#[ \t":
            run = [] if line else run
            continue
        gm = _GDB_FRAME.match(line) if line[0] == "#" else None
        if gm and _gdb_frame_line(line):
            n, addr = int(gm.group(1)), bool(_GDB_ADDR_FRAME.match(line))
            if run and n == run[1] + 1 and (run[2] or addr):
                return "gdb", run[0]
            run = [i, n, addr] if not run or n != run[1] + 1 else [run[0], n, run[2] or addr]
        elif not line[0].isspace():
            run = []  # (a line gdb wrapped, "   from /lib/…", keeps the run going)
        if _PYSPY_THREAD.match(line) and FRAME_LINE.match(_next_nonblank(lines, i)):
            return "py-spy", i
        if _GDB_THREAD.match(line):
            nxt = _next_nonblank(lines, i)
            if _gdb_frame_line(nxt) or _PYBT_HEAD.match(nxt):
                return "gdb", i
        if line.startswith("#0 ") and _gdb_frame_line(line):
            return "gdb", i
        if _PYSTACK_THREAD.match(line):
            return "pystack", i
        if FH_THREAD.match(line):
            nxt = _next_nonblank(lines, i)
            if FH_FRAME.match(nxt) or _FH_EMPTY.match(nxt):
                return "faulthandler", i
        if _JSON_START.match(line) and _is_py_spy_json(_json_value("\n".join(lines[i:]))):
            return "py-spy-json", i
    return "", -1


def format_of(text: str) -> str:
    """"py-spy", "py-spy-json", "gdb", "pystack" or "faulthandler": the format of the (first) stack dump in
    text, by its content; "" for a text that holds none.

    Strict enough for telling dumps among log files: a py-spy dump needs a ``Thread N (idle)``
    / ``(active…)`` line followed by a 4-space frame line, gdb a ``#N`` frame line after a
    ``Thread N (Thread 0x… (LWP N)…):`` header, a ``#0`` frame line, or (a backtrace pasted
    from its middle) two frame lines numbered one after the other, one of them with its
    address (``#8  0x00007f… in cuMemcpyDtoHAsync_v2 () from …``), pystack its ``Traceback
    for thread N … (most recent call last):`` header, py-spy's JSON a list of threads with
    frames, faulthandler its ``Thread 0x… (most recent call first):`` header followed by a
    ``  File "…", line N in f`` line.  A Python traceback (``Traceback (most recent call last):``), PyTorch's C++ traces
    (``frame #0: …``, ``#4 … from file:0``) and NCCL's logs are none of these."""
    return _sniff(text)[0]


# --------------------------------------------------------------------------- parsing


def parse_dump(text: str) -> list[Thread]:
    """Threads of one process's stack dump (see the module's formats), main thread first.

    Anything that is not a dump (an error message, an empty string) gives [].
    """
    fmt, _ = _sniff(text)
    if fmt == "py-spy-json" or (not fmt and text.lstrip().startswith("[")):
        try:
            return _parse_json(_json_value(_ANSI.sub("", text)))
        except (ValueError, TypeError, KeyError, AttributeError):
            return []
    if fmt == "gdb":
        return _parse_gdb(text)
    if fmt == "pystack":
        return _parse_pystack(text)
    if fmt == "faulthandler":
        return _parse_faulthandler(text)
    return _parse_py_spy(text)


def _parse_py_spy(text: str) -> list[Thread]:
    threads: list[Thread] = []
    pid: int | None = None
    cur: dict | None = None

    def close() -> None:
        if cur is not None:
            threads.append(Thread(cur["name"], cur["id"], cur["state"], tuple(cur["frames"]), cur["gil"], pid))

    for line in _lines(text):
        m = PROCESS_LINE.match(line)
        if m:
            close()
            cur = None
            pid = int(m.group(1))
            continue
        m = THREAD_LINE.match(line)
        if m:
            close()
            st = m.group(2)
            cur = {"name": m.group(3) or "", "id": thread_id(m.group(1)),
                   "state": "idle" if "idle" in st else "active" if "active" in st else "", "gil": "gil" in st,
                   "frames": []}
            continue
        if cur is None:
            continue
        m = FRAME_LINE.match(line)
        if m:
            cur["frames"].append(Frame(m.group(1), m.group(2), int(m.group(3) or 0)))
    close()
    return threads


def _parse_json(data) -> list[Thread]:
    if not isinstance(data, list):
        raise TypeError("not a list of threads")
    out = []
    for t in data:
        frames = []
        for f in t.get("frames") or ():
            name = str(f.get("name", ""))
            module = f.get("module")
            file = str(f.get("short_filename") or f.get("filename") or "")
            if module and not file.endswith(PY_SUFFIXES):
                # a native frame (--native): its shared library; its filename is the C source
                # where the library has debug information
                frames.append(Frame(name, str(module), 0, "native"))
            else:
                frames.append(Frame(name, file, int(f.get("line") or 0)))
        tid = t.get("os_thread_id") or t.get("thread_id") or 0
        out.append(Thread(str(t.get("thread_name") or ""), int(tid), "active" if t.get("active") else "idle",
                          tuple(frames), bool(t.get("owns_gil")), t.get("pid") or None))
    # listed as the interpreter keeps them, newest first (py-spy's text prints them reversed: main first)
    out.reverse()
    return out


def _split_call(s: str) -> tuple[str, str]:
    """("f", "a=1, b=(2)") from "f (a=1, b=(2))": the last balanced parenthesised group is the
    argument list (a C++ name before it may hold "(" itself: ``foo<void (*)(int)>``)."""
    s = s.rstrip()
    if s.endswith(")"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            if s[i] == ")":
                depth += 1
            elif s[i] == "(":
                depth -= 1
                if depth == 0:
                    return s[:i].rstrip(), s[i + 1:-1]
    i = s.find(" (")
    return (s[:i], s[i + 2:]) if i > 0 else (s, "")


def _gdb_frames(rest: str) -> list[tuple[Frame, str]]:
    """The frames of one gdb backtrace line (after "#N  "), each with its kind: "c" (a native
    frame), "arg" (a Python frame from an evaluation frame's ``f=Frame …`` argument, placed
    before it) or "py" (a py-bt-full line)."""
    m = _PY_FRAME_OBJ.match(rest)
    if m:
        return [(Frame(m.group(3), m.group(1), int(m.group(2)), "python"), "py")]
    m = _BUILTIN.match(rest)
    if m:
        return [(Frame(m.group(1), "<built-in>", 0), "py")]
    if rest.startswith(("Waiting for the GIL", "Garbage-collecting", "(unable to read")):
        return []
    addr = ""
    m = re.match(r"(0x[0-9A-Fa-f]+) in (.*)$", rest)
    if m:
        addr, rest = m.group(1), m.group(2)
    file, line = "", 0
    m = _GDB_WHERE.search(rest)
    if m:
        where = m.group(2)
        if m.group(1) == "at":
            src = re.match(r"(.*):(\d+)$", where)
            file, line = (src.group(1), int(src.group(2))) if src else (where, 0)
        else:
            file = where
        rest = rest[:m.start() + 1]
    func, args = _split_call(rest)
    if func in ("??", ""):
        func = addr or "0x?"
    out = []
    m = _PY_FRAME_OBJ.search(args)
    if m and "EvalFrame" in func:
        out.append((Frame(m.group(3), m.group(1), int(m.group(2)), "python"), "arg"))
    out.append((Frame(func, file, line, "native"), "c"))
    return out


def _gdb_tid(target: str) -> int:
    m = _GDB_TID.search(target)
    return int(m.group(1) or m.group(2)) if m else 0


def _parse_gdb(text: str) -> list[Thread]:
    pid: int | None = None
    current = 0  # the LWP of gdb's current thread, for a bare "bt" without a thread header
    records: list[dict] = []
    by_num: dict[str, dict] = {}
    rec: dict | None = None
    pending: str | None = None  # a frame line, joined with its continuation lines
    in_pybt = False

    def new(num: str | None, tid: int, name: str) -> dict:
        r: dict = {"num": num, "id": tid, "name": name, "c": [], "c_done": False, "py": [], "py_src": "",
             "py_done": False, "nums": set()}
        records.append(r)
        if num is not None:
            by_num[num] = r
        return r

    def ensure() -> dict:
        nonlocal rec
        if rec is None:
            rec = new(None, current, "")
        return rec

    def add_py(r: dict, frame: Frame, src: str) -> None:
        if r["py_done"] or (r["py"] and r["py_src"] != src):
            return  # a second Python backtrace of this thread (py-bt, then py-bt-full): the first one stands
        r["py_src"] = src
        r["py"].append(frame)

    def flush() -> None:
        nonlocal pending
        if pending is None:
            return
        m = _GDB_FRAME.match(pending)
        pending = None
        if not m:
            return
        r = ensure()
        if m.group(1) in r["nums"] and m.group(1) != "0":
            return  # the same frame printed again (gdb's up/down/frame between two backtraces)
        r["nums"].add(m.group(1))
        for frame, kind in _gdb_frames(m.group(2)):
            if kind == "py":
                add_py(r, frame, "full")
                continue
            if m.group(1) == "0" and r["c"]:
                r["c_done"] = True  # a second backtrace of this thread: the first one stands
            if not r["c_done"]:
                r["c"].append((frame, kind))

    for raw in _lines(text):
        line = _GDB_PAGER.sub("", raw.rstrip())
        if pending is not None and line[:1].isspace() and not _PYBT_FILE.match(line):
            cont = line.strip()
            if cont.startswith(("at ", "from ")) or pending.count("(") > pending.count(")"):
                pending += " " + cont  # a frame line gdb wrapped
                continue
        m = _GDB_FRAME.match(line)
        if m:
            flush()
            in_pybt = False
            pending = line
            continue
        flush()
        if _GDB_BT_PROMPT.match(line) and rec is not None and rec["num"] is None and rec["c"]:
            if rec["id"] == current and rec["nums"] == {"0"} and not rec["py"]:
                # the one frame `thread N` (or `frame`) printed for the thread now current: its backtrace
                # has it, whole
                rec["c"], rec["nums"], rec["c_done"] = [], set(), False
                continue
            # a new `bt` at the prompt, after frames no thread header named (printed by up/down/frame, or
            # another bare backtrace): the backtrace of the thread now current, which may be another
            rec = new(None, current, "")
            continue
        m = _GDB_THREAD.match(line)
        if m:
            in_pybt = False
            num, target = m.group(1), m.group(2)
            q = _QUOTED.search(target)
            rec = by_num.get(num) or new(num, _gdb_tid(target), q.group(1) if q else "")
            continue
        m = _GDB_PID.match(line)
        if m:
            pid = int(next(g for g in m.groups() if g))
            continue
        m = _GDB_CURRENT.match(line)
        if m:
            current = _gdb_tid(m.group(1))
            continue
        if _PYBT_HEAD.match(line):
            r = ensure()
            if r["py"]:
                r["py_done"] = True
            in_pybt = True
            continue
        if in_pybt and rec is not None:
            m = _PYBT_FILE.match(line)
            if m:
                add_py(rec, Frame(m.group(3), m.group(1), int(m.group(2)), "python"), "bt")
                continue
            m = _BUILTIN.match(line)
            if m:
                add_py(rec, Frame(m.group(1), "<built-in>", 0), "bt")
    flush()

    def frames_of(r: dict) -> tuple[Frame, ...]:
        if not r["py"]:
            return tuple(f for f, _ in r["c"])
        # the Python backtrace goes where the interpreter runs it: before the first evaluation frame
        native = [f for f, kind in r["c"] if kind != "arg"]
        i = next((j for j, f in enumerate(native) if "EvalFrame" in f.function), len(native))
        return tuple(native[:i] + r["py"] + native[i:])

    def order(r: dict) -> tuple:
        num = r["num"]
        return (r["id"] != pid if pid else False,
                tuple(int(x) for x in num.split(".")) if num else ())

    return [Thread(r["name"], r["id"], "", frames_of(r), False, pid)
            for r in sorted(records, key=order) if r["c"] or r["py"] or r["num"] is not None]


def _parse_pystack(text: str) -> list[Thread]:
    pid: int | None = None
    threads: list[Thread] = []
    cur: dict | None = None

    def close() -> None:
        nonlocal cur
        if cur is not None:
            threads.append(Thread(cur["name"], cur["id"], cur["state"], tuple(reversed(cur["frames"])),
                                  cur["gil"], None))
        cur = None

    for line in _lines(text):
        m = _PYSTACK_THREAD.match(line)
        if m:
            close()
            status = {s.strip() for s in m.group(3).split(",")}
            gil = "Has the GIL" in status
            cur = {"id": int(m.group(1)), "name": m.group(2) or "", "gil": gil, "frames": [],
                   "state": "active" if gil else "idle" if "Waiting for the GIL" in status else ""}
            continue
        m = _PYSTACK_EMPTY.match(line)
        if m:
            close()
            threads.append(Thread("", int(m.group(1)), "", (), False, None))
            continue
        m = _PYSTACK_PID.match(line)
        if m and pid is None:
            pid = int(m.group(1))
            continue
        m = _PYSTACK_FRAME.match(line)
        if m and cur is not None:
            kind, path, lineno, func = m.group(1), m.group(2), int(m.group(3)), m.group(4)
            if kind == "Python":
                cur["frames"].append(Frame(func, path, lineno, "python"))
                continue
            lib = ""
            lm = re.match(r"^(.*?)\s*\(([^()]*)\)$", func)
            if lm:
                func, lib = lm.group(1), lm.group(2)
            func = func.removesuffix(" (inlined)")
            if func in ("???", "??", ""):
                func = "0x?"
            if lib and lib != "???":
                cur["frames"].append(Frame(func, lib, 0, "native"))
            else:
                cur["frames"].append(Frame(func, "" if path == "???" else path, lineno, "native"))
    close()
    # pystack lists the newest thread first: the main thread (tid == pid) is last
    threads.reverse()
    if pid is not None:
        threads.sort(key=lambda t: t.id != pid)
    return [Thread(t.name, t.id, t.state, t.frames, t.gil, pid) for t in threads]


def _parse_faulthandler(text: str) -> list[Thread]:
    threads: list[Thread] = []
    cur: dict | None = None

    def close() -> None:
        nonlocal cur
        if cur is not None:
            threads.append(Thread("", cur["id"], "", tuple(cur["frames"]), False, None))
        cur = None

    for line in _lines(text):
        m = FH_THREAD.match(line)
        if m:
            close()
            cur = {"id": thread_id(m.group("id")), "frames": []}
            continue
        m = FH_FRAME.match(line) if cur is not None else None
        if m and cur is not None:
            cur["frames"].append(Frame(m.group("fn"), m.group("file"),
                                       int(m.group("line")) if m.group("line").isdigit() else 0, "python"))
        elif cur is not None and line.strip() and not _FH_EMPTY.match(line):
            close()  # (the report's end: "Extension modules: ...", the next log line)
    close()
    # newest first as printed: the main thread is the one that runs a module's code, else the oldest
    main = next((t for t in threads if t.frames and t.frames[-1].function == "<module>"),
                threads[-1] if threads else None)
    return [t for t in threads if t is main] + [t for t in threads if t is not main]


# --------------------------------------------------------------------------- several processes

# a line that is a label naming a rank: "rank 3", "[rank3]", "Rank 3:", "rank=3", "=== rank 3 ===",
# "rank 0 (pid 4242):"; or one holding a file name with the rank: "==> dumps/rank3.txt <==", "$ cat rank_3.log"
_RANK_LINE = re.compile(r"^[\s=#*>\-\[(]*rank[\s_=:#-]*(\d+)[\])]?"
                        r"(?:\s*[(,][^()]{0,60}\)?)?[\s:=#*<\-]*$", re.IGNORECASE)
_RANK_FILE = re.compile(r"(?:^|[\s/\\'\"=<>:])([\w.-]*?)rank[_-]?(\d+)[\w.-]*?"
                        r"\.(?:txt|log|out|err|dump|json|stacks?|py-?spy|gdb|pystack)\b", re.IGNORECASE)
_LABEL_PID = re.compile(r"(?<![A-Za-z0-9])pid[\s_=:#-]*(\d+)", re.IGNORECASE)


def _label(line: str) -> tuple[int, int | None] | None:
    """(rank, pid or None) of a short line, not indented, that is a label naming a rank (or holds
    a file name naming one), else None.  A log line that mentions a rank ("[rank0]:[E1016 …]"),
    a local or node rank, is none."""
    if not line or line[0].isspace() or len(line) > 160:
        return None
    m = _RANK_LINE.match(line)
    if m:
        rank = int(m.group(1))
    else:
        f = _RANK_FILE.search(line)
        if not f or f.group(1).lower().rstrip("_-").endswith(("local", "node", "group")):
            return None
        rank = int(f.group(2))
    p = _LABEL_PID.search(line)
    return rank, int(p.group(1)) if p else None


def _kind(line: str) -> tuple[str, int | None, int | None]:
    """What one line is to split_processes: a process header (with its pid, or None), dump
    content, a pid stated inside a dump, a label naming a rank, or nothing."""
    m = PROCESS_LINE.match(line)
    if m:
        return "header", int(m.group(1)), None
    m = _GDB_PID.match(line)
    if m:
        p = int(next(g for g in m.groups() if g))
        return ("pid", p, None) if line.startswith("[Inferior") else ("header", p, None)
    if _PYSTACK_CORE.match(line) or _JSON_OPEN.match(line) or _FH_FATAL.match(line):
        return "header", None, None
    if (THREAD_LINE.match(line) or FRAME_LINE.match(line) or _GDB_THREAD.match(line) or _gdb_frame_line(line)
            or _PYSTACK_THREAD.match(line) or _PYSTACK_EMPTY.match(line) or _PYSTACK_FRAME.match(line)
            or _JSON_FRAMES.match(line) or FH_THREAD.match(line) or FH_FRAME.match(line)):
        return "content", None, None
    m = _PYSTACK_PID.match(line)
    if m:
        return "pid", int(m.group(1)), None
    lab = _label(line)
    if lab is not None:
        return "label", lab[0], lab[1]
    return "", None, None


def split_processes(text: str) -> list[ProcessDump]:
    """The dumps of several processes pasted into one text, one ``ProcessDump`` each, in order.

    A dump starts at its process header (py-spy's ``Process N:``, gdb's ``Attaching to process
    N``, pystack's core-file header, the ``[`` of py-spy's JSON), or, for dumps without one
    (pystack remote, a bare gdb backtrace), after a line naming a rank between two dumps.  Its
    rank comes from a line between the previous dump and this one that names it (``rank 3``,
    ``[rank3]``, ``Rank 3:``, ``rank=3``, ``=== rank 3 ===``, a file name like ``rank3.txt``);
    without one, rank None and label "pid N".  A text with one dump gives one item; a text
    without any dump, [].
    """
    if not format_of(text):
        return []
    lines = _ANSI.sub("", text).splitlines(keepends=True)
    out: list[ProcessDump] = []
    cur: dict | None = None
    pend: dict | None = None  # labels after the current dump's content: they name the next one
    pre: dict = {"rank": None, "pid": None}  # labels before the first dump

    def start(i: int, pid, rank, lpid) -> dict:
        return {"start": i, "pid": pid, "rank": rank, "lpid": lpid, "content": False}

    def close(c: dict, end: int) -> None:
        body = "".join(lines[c["start"]:end])
        if not format_of(body):
            return  # lines that looked like a dump's (a thread line, a "#N" line) in a text that holds none
        pid = c["pid"] or c["lpid"]
        if pid is None:
            pid = next((t.pid for t in parse_dump(body) if t.pid), None)
        rank = c["rank"]
        label = f"rank {rank}" if rank is not None else f"pid {pid}" if pid else f"dump {len(out) + 1}"
        out.append(ProcessDump(label, rank, pid, body))

    for i, raw in enumerate(lines):
        kind, val, lpid = _kind(raw.rstrip("\r\n"))
        if kind == "header":
            if cur is not None and cur["content"]:
                close(cur, pend["at"] if pend else i)
                cur = start(i, val, pend["rank"] if pend else None, pend["pid"] if pend else None)
                pend = None
            elif cur is not None:  # a second header line of the same dump (pystack core prints two)
                cur["pid"] = cur["pid"] or val
            else:
                cur = start(i, val, pre["rank"], pre["pid"])
        elif kind == "label":
            rank = val
            if cur is not None and cur["content"]:
                pend = pend or {"at": i, "rank": None, "pid": None}
                pend["rank"], pend["pid"] = rank, lpid or pend["pid"]
            elif cur is not None:
                cur["rank"], cur["lpid"] = rank, lpid or cur["lpid"]
            else:
                pre["rank"], pre["pid"] = rank, lpid or pre["pid"]
        elif kind == "content":
            if cur is None:
                cur = start(0, None, pre["rank"], pre["pid"])
            elif cur["content"] and pend is not None:  # a rank named between two dumps without headers
                close(cur, pend["at"])
                cur = start(pend["at"], None, pend["rank"], pend["pid"])
                pend = None
            cur["content"] = True
        elif kind == "pid" and cur is not None and cur["pid"] is None:
            cur["pid"] = val
    if cur is not None and cur["content"]:
        close(cur, len(lines))
    return out


# --------------------------------------------------------------------------- one process in two formats

# the interpreter's own frames: where a native backtrace (gdb) reaches the Python code
_INTERPRETER = re.compile(r"^_?Py(?:Eval|Object|_|Function|Method|CFunction|Run)|^cfunction_|^method_vectorcall|"
                          r"^_PyEval|EvalFrame|^slot_tp_|^vectorcall")


def _py_spy_frame(f: Frame) -> str:
    where = f"{f.file}:{f.line}" if f.file and f.line else (f.file or "?")
    return f"    {f.function} ({where})"


def with_native(text: str) -> str:
    """One process pasted twice, as people do: a Python-only ``py-spy dump``
    of it, then a gdb backtrace of the same process (its native frames: what
    py-spy without ``--native`` leaves out).  Gives the py-spy dump with the
    backtrace's native frames, up to the interpreter's, put under the main
    thread's innermost Python frame (as ``py-spy --native`` prints them), so
    that the dump reads as one with native frames; ``text`` unchanged for
    anything else (one format, several processes, no main thread in one of
    the two)."""
    lines = _lines(text)
    first_gdb = next((i for i, ln in enumerate(lines) if _gdb_frame_line(ln) or _GDB_THREAD.match(ln)
                      or ln.startswith("(gdb)") or ln.startswith("(cuda-gdb)")), None)
    if first_gdb is None or first_gdb == 0:
        return text
    py_part, gdb_part = "\n".join(lines[:first_gdb]), "\n".join(lines[first_gdb:])
    if _sniff(py_part)[0] != "py-spy" or _sniff(gdb_part)[0] != "gdb":
        return text
    py_threads, gdb_threads = _parse_py_spy(py_part), _parse_gdb(gdb_part)
    if len({t.pid for t in py_threads if t.pid}) > 1 or not py_threads or not gdb_threads:
        return text
    main = next((t for t in py_threads if t.name == "MainThread"), py_threads[0])
    if any(f.native for f in main.frames):
        return text  # (it has native frames of its own)
    # the backtrace's thread: its main (gdb's Thread 1, listed first), or the one a bare `bt` printed
    g = gdb_threads[0]
    native: list[Frame] = []
    for f in g.frames:
        if not f.native or _INTERPRETER.search(f.function) or "libpython" in f.base or f.base.startswith("python"):
            break
        native.append(f)
    if not native:
        return text
    out, inside = [], False
    for ln in py_part.splitlines():
        m = THREAD_LINE.match(ln)
        if m:
            inside = thread_id(m.group(1)) == main.id
            out.append(ln)
            if inside:
                out += [_py_spy_frame(f) for f in native]
            continue
        out.append(ln)
    return "\n".join(out) + "\n"
