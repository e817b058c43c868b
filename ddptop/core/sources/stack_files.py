"""Saved stack dumps, found among the paths given to ``ddptop diagnose``.

What a user may hand over, each recognised by its content (a dump is a dump
whatever its file is called; a training log is never read as one):

* a ddptop run, or its ``stacks/`` folder: the latest sampling
  (``stacks/<time>-samples/rank3.0.txt``, ``rank3.1.txt``: several samples a
  rank), else the latest capture (``stacks/<time>/rank3.txt``), said which;
* a folder of dumps named by rank (``rank3.txt``, ``rank3.0.txt``,
  ``rank3.gdb.txt``, ``rank_3.log``);
* a file holding one dump, or a paste of one dump after another, split at
  each process (``Process 4242:``): the rank taken from a line before each
  that names it (``rank 3``, ``[rank3]``), else labelled by its pid;
* several of these (one per node): judged together, as one job.

``load(paths)`` gives a ``DumpSet``: samples per key (the rank, or the pid
where no rank is known), labels, where each came from and notes.  I/O only;
the verdict is ``analysis.stack_verdict.verdict``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ddptop.core.analysis.stack_dumps import format_of, split_processes, with_native

__all__ = ["DumpSet", "load", "MAX_BYTES", "GPU_RUNTIME_FILE"]

# beside a sampling's dumps: the ranks whose process had no GPU runtime mapped ({"without": [ranks]})
GPU_RUNTIME_FILE = "gpu-runtime.json"

MAX_BYTES = 16 << 20  # a dump file larger than this is not read (a log, most likely)
_CRASH = re.compile(r"^(?:\S+: )?Fatal Python error: ", re.MULTILINE)  # faulthandler on a fatal signal
_RANK_FILE = re.compile(r"(?:^|[^a-z])(?:rank|proc|worker|process)[_-]?(\d+)(?:[._-](\d+))?(?:\.[A-Za-z]\w*)*$",
                        re.IGNORECASE)
_SAMPLING = re.compile(r"^\d{8}-\d{6}(?:-\d+)?-samples(?:-\d+)?$")
_CAPTURE = re.compile(r"^\d{8}-\d{6}(?:-\d+)?$")


@dataclass
class DumpSet:
    samples: dict[int, list[str]] = field(default_factory=dict)  # key (rank, or pid) -> dumps, oldest first
    by_pid: set[int] = field(default_factory=set)  # keys that are pids (no rank was known)
    sources: list[str] = field(default_factory=list)  # where the dumps came from (files, folders)
    formats: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    no_gpu: set[int] = field(default_factory=set)  # keys whose process had no GPU runtime mapped (GPU_RUNTIME_FILE)

    def label(self, key: int) -> str:
        return f"pid {key}" if key in self.by_pid else f"rank {key}"

    def add(self, key: int, text: str, where: str, pid: bool = False) -> None:
        if pid:
            self.by_pid.add(key)
        self.samples.setdefault(key, []).append(text)
        if where not in self.sources:
            self.sources.append(where)


def _read(f: Path) -> str | None:
    try:
        if f.stat().st_size > MAX_BYTES:
            return None
        return f.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _latest_sampling(stacks: Path) -> tuple[Path | None, str]:
    """The newest sampling under a run's ``stacks/``, else its newest capture."""
    try:
        subs = sorted(d for d in stacks.iterdir() if d.is_dir())
    except OSError:
        return None, ""
    samplings = [d for d in subs if _SAMPLING.match(d.name)]
    if samplings:
        return samplings[-1], "the latest stack sampling"
    captures = [d for d in subs if _CAPTURE.match(d.name)]
    if captures:
        return captures[-1], "the latest stack capture"
    return None, ""


# a frame as py-spy prints it, pasted on its own (no thread header): "name (libfoo.so.1)", "f (train.py:88)"
_BARE_FRAME = re.compile(r"^\s*(\S.*?) \(([^()]*?)(?::(\d+))?\)\s*$")
_LIBRARY = re.compile(r"\.so(?:\.\d+)*$|\.dylib$|\.dll$|\.py$")


def _bare_frames(text: str) -> str:
    """Frames pasted without their thread's header (every line a frame, at
    least one of them naming a library or a Python file): as a py-spy dump
    of one thread in an unknown state; "" for anything else."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or len(lines) > 500:
        return ""
    frames = [_BARE_FRAME.match(ln) for ln in lines]
    if not all(frames) or not any(_LIBRARY.search(m.group(2)) for m in frames if m):
        return ""
    return "Thread 0 (unknown)\n" + "\n".join(f"    {ln.strip()}" for ln in lines) + "\n"


def _from_file(ds: DumpSet, f: Path, text: str, rank: int | None) -> bool:
    """Add one file's dumps; False when it holds none."""
    fmt = format_of(text)
    if fmt == "faulthandler" and _CRASH.search(text):
        # (a rank's report of its own fatal signal: where it crashed, which diagnose says with the crash; no
        # sample of a hang)
        ds.notes.append(f"{f}: a crash's stack (faulthandler on a fatal signal), said with the crash, not judged "
                        "as a hang")
        return False
    merged = with_native(text) if fmt == "py-spy" else text
    if merged is not text:
        ds.notes.append(f"{f}: a Python-only py-spy dump and a gdb backtrace of the same process, read as one "
                        "(the backtrace's native frames under the main thread's Python ones)")
        ds.formats.add("gdb")
        text = merged
    if not fmt:
        bare = _bare_frames(text)
        if not bare:
            return False
        ds.notes.append(f"{f}: frames without a thread header, read as one thread in an unknown state")
        text, fmt = bare, "frames"
    ds.formats.add(fmt)
    procs = split_processes(text)
    if len(procs) <= 1:
        p = procs[0] if procs else None
        key = rank if rank is not None else (p.rank if p and p.rank is not None else None)
        if key is None and p is not None and p.pid is not None:
            ds.add(p.pid, text, str(f), pid=True)
        elif key is None:
            ds.add(len(ds.samples), text, str(f))
            ds.notes.append(f"{f}: no rank or pid says whose dump it is: numbered {len(ds.samples) - 1} "
                            "by its order")
        else:
            ds.add(key, text, str(f))
        return True
    unnamed = [p for p in procs if p.rank is None]
    for p in procs:
        if p.rank is not None:
            ds.add(p.rank, p.text, str(f))
        elif p.pid is not None:
            ds.add(p.pid, p.text, str(f), pid=True)
        else:
            ds.add(len(ds.samples), p.text, str(f))
    if unnamed:
        ds.notes.append(f"{f}: {len(unnamed)} of its {len(procs)} dumps name no rank: labelled by their pid")
    return True


def _rank_of_name(name: str) -> tuple[int | None, int | None]:
    m = _RANK_FILE.search(name)
    if not m:
        return None, None
    return int(m.group(1)), (int(m.group(2)) if m.group(2) is not None else None)


def _from_dir(ds: DumpSet, d: Path) -> bool:
    files = sorted((f for f in d.iterdir() if f.is_file()), key=lambda f: _sort_key(f.name))
    found = False
    for f in files:
        if f.name == GPU_RUNTIME_FILE:
            ds.no_gpu |= _without_gpu(f)
            continue
        text = _read(f)
        if text is None:
            continue
        rank, _index = _rank_of_name(f.name)
        found = _from_file(ds, f, text, rank) or found
    return found


def _without_gpu(f: Path) -> set[int]:
    """The ranks a ``GPU_RUNTIME_FILE`` names (none when it cannot be read: then nothing is concluded)."""
    try:
        d = json.loads(f.read_text())
    except (OSError, ValueError):
        return set()
    ranks = d.get("without") if isinstance(d, dict) else None
    return {r for r in ranks if type(r) is int} if isinstance(ranks, list) else set()


def _sort_key(name: str) -> tuple:
    rank, index = _rank_of_name(name)
    return (rank if rank is not None else 1 << 30, index if index is not None else -1, name)


def _load_one(p: Path) -> DumpSet:
    ds = DumpSet()
    if p.is_dir():
        stacks = p / "stacks" if (p / "stacks").is_dir() else p if p.name == "stacks" else None
        if stacks is not None:
            d, what = _latest_sampling(stacks)
            if d is not None and _from_dir(ds, d):
                ds.notes.append(f"{d}: {what} under {stacks}")
            return ds
        if not _from_dir(ds, p):
            for sub in sorted(x for x in p.iterdir() if x.is_dir()):
                _from_dir(ds, sub)
    elif p.is_file():
        text = _read(p)
        if text is not None:
            rank, _index = _rank_of_name(p.name)
            _from_file(ds, p, text, rank)
    return ds


def load(paths: list[str]) -> DumpSet | None:
    """The stack dumps among ``paths`` (see the module), or None when there
    are none.  Several paths (one per node) make one set; a rank found under
    two of them is said, and the later one numbered after the others."""
    out = DumpSet()
    for p in map(Path, paths):
        one = _load_one(p)
        out.formats |= one.formats
        out.notes += one.notes
        for key, texts in one.samples.items():
            new = key
            if key in out.samples:
                new = max(out.samples) + 1
                out.notes.append(f"{one.label(key)} of {p} is also in an earlier path: numbered {new} here")
            if key in one.no_gpu:
                out.no_gpu.add(new)
            for t in texts:
                out.add(new, t, "", pid=key in one.by_pid)
        out.sources += [s for s in one.sources if s not in out.sources]
    if "" in out.sources:
        out.sources.remove("")
    return out if out.samples else None
