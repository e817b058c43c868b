"""The ranks' Python stacks (py-spy), three ways:

* ``StackCapture``: every rank's stack once, on request (the p key, a
  stall, ``--on-stall``), kept under ``dest/stacks/<time>/``;
* ``StackSampler``: at a suspected stall, a few samples of every rank and
  what they say (``analysis.stack_verdict.verdict``), one ``StacksEvent`` that the
  pipeline feeds to the stall detector;
* ``StackWatch``: life from stacks for a job ddptop did not launch (no hook
  in the ranks), one rank at a time within a CPU budget.

Also ``source_line``, how the verdict reads a rank's source line.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Callable, Mapping

from ddptop.core.analysis.stack_verdict import moved, verdict
from ddptop.core.model.command_result import CommandResult
from ddptop.core.model.events import Event, NoteEvent, ProgressEvent, StacksEvent
from ddptop.core.model.evidence import HOT_UTIL, ranks_text
from ddptop.core.model.run_dirs import make_private_dir
from ddptop.core.model.settings import settings
from ddptop.core.sources.probe_base import Emit, Job, Loop, unique_path
from ddptop.core.sources.proc_tree import gpu_runtime_mapped
from ddptop.core.sources.stack_files import GPU_RUNTIME_FILE
from ddptop.core.sources.stack_pyspy import (
    PTRACE_FIX,
    PTRACE_REFUSED,
    dump_stacks,
    missing_words,
    py_spy,
    python_dump,
    summarise,
)


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


class StackCapture(Job):
    """Every rank's Python stack (py-spy), one capture at a time, in a thread
    of its own; the files go under ``dest/stacks/<time>/``, the summary and
    any error arrive through ``emit`` as notes."""

    thread_name = "ddptop-stacks"

    def __init__(self, dest: Path, rank_pids: Callable[[], dict[int, int]], emit: Emit,
                 clock: Callable[[], float] = time.time):
        super().__init__(emit)
        self.dest = Path(dest)
        self.rank_pids = rank_pids
        self.clock = clock

    def request(self, why: str = "") -> CommandResult:
        pids = self.rank_pids()
        if not pids:
            return CommandResult(False, "no rank is running")
        if not self._claim():
            return CommandResult(True, "a stack capture is already under way")
        if why:
            self.emit([NoteEvent(self.clock(), "info", f"capturing every rank's Python stack ({why})")])
        self._launch(pids)
        return CommandResult(True, "capturing every rank's Python stack")

    def _run(self, pids: dict[int, int]) -> None:

        raw, groups, err = dump_stacks(pids)
        out: list[Event] = []
        if raw:
            d = make_private_dir(unique_path(self.dest / "stacks", _stamp()))
            for rank, text in raw.items():
                (d / f"rank{rank}.txt").write_text(text)
            out.append(NoteEvent(self.clock(), "info", f"stacks captured in {d}: {summarise(groups)}"))
        if err:
            out.append(NoteEvent(self.clock(), "warning", f"stack capture: {err}"))
        self.emit(out)

    def _failed(self, error: Exception, *args: object) -> list[Event]:
        return [NoteEvent(self.clock(), "warning", f"stack capture failed: {error!r}")]


def source_line(file: str, line: int, *, limit: int = 4 << 20) -> str | None:
    """One line of a rank's source file, for naming the C call a frame is
    blocked in (``time.sleep``); None for anything that is not a readable
    regular file of sane size.  Read only, never executed."""
    try:
        p = Path(file)
        if line < 1 or not p.is_absolute() or not p.is_file() or p.stat().st_size > limit:
            return None
        with p.open("rb") as f:
            for i, raw in enumerate(f, 1):
                if i == line:
                    return raw[:1000].decode("utf-8", "replace").rstrip("\r\n")
    except OSError:
        return None
    return None


class StackSampler(Job):
    """At a suspected stall: every rank's stack (py-spy), ``samples`` times
    ``gap`` seconds apart, and what they say (``analysis.stack_verdict.verdict``),
    emitted as one ``StacksEvent`` that the pipeline feeds to the stall
    detector.  The first sample is Python-only and non-blocking; the later
    ones read native frames (``--native``, which pauses the rank while py-spy
    unwinds it) of every rank, idle ones included: a rank spinning at a CUDA
    synchronisation shows the CUDA runtime, driver or NCCL frames it spins in,
    and one *sleeping* there (blocking sync) the same frames under a futex;
    read without them, a sleeping waiter would look like a rank stuck in its
    own code.  A native dump is given up after ``native_timeout`` seconds (for a
    Python-only one, said per rank in the event's error and ``given_up``), so
    it never holds the verdict longer; ``native=False`` keeps every sample
    non-blocking.
    ``request(gpu_util)`` gives each rank's GPU utilisation (None: unknown or
    simulated; a set: the ranks whose GPU is busy): the verdict reads a rank on
    one line with no native frames as waiting on the GPU when its GPU is busy,
    and as "cannot tell" at a possible sync line when nothing is known.  The dumps are kept under ``dest/stacks/<time>-samples/``.  One
    sampling at a time, in a thread of its own; never blocks the analysis."""

    thread_name = "ddptop-stack-samples"

    def __init__(self, dest: Path, rank_pids: Callable[[], dict[int, int]], emit: Emit, *, node: str = "",
                 samples: int = 2, gap: float = 1.0, clock: Callable[[], float] = time.time,
                 native: bool = True, native_timeout: float | None = None):
        super().__init__(emit)
        self.dest = Path(dest)
        self.rank_pids = rank_pids
        self.node = node
        self.samples = samples
        self.gap = gap
        self.clock = clock
        self.native = native
        self.native_timeout = native_timeout
        self._gpu_util: dict[int, float | None] = {}
        self._ptrace_said = False
        self._native_said: set[int] = set()

    def request(self, gpu_util: Mapping[int, float | None] | set[int] | None = None) -> bool:
        """Start a sampling (False: one is under way, or no rank runs).
        ``gpu_util``: each rank's GPU utilisation with no step progress (None:
        unknown), or the set of ranks whose GPU is busy."""

        pids = self.rank_pids()
        if not pids or not self._claim():
            return False
        if isinstance(gpu_util, (set, frozenset)):
            self._gpu_util = {r: HOT_UTIL for r in gpu_util}
        else:
            self._gpu_util = dict(gpu_util or {})
        self._launch(pids)
        return True

    def _run(self, pids: dict[int, int]) -> None:
        from dataclasses import replace


        t0 = self.clock()
        # (the ranks with no GPU runtime mapped: none of their lines waits on a GPU, without native frames too)
        no_gpu = {r for r, pid in pids.items() if gpu_runtime_mapped(pid) is False}
        dumps: dict[int, list[str]] = {r: [] for r in pids}
        errors: list[str] = []
        native: set[int] = set()
        paused: dict[int, float] = {}
        given_up: set[int] = set()
        limit = self.native_timeout if self.native_timeout is not None else settings().native_timeout
        for i in range(self.samples):
            if i:
                time.sleep(self.gap)
            # --locals: a healthy loop often sits on the same line in both samples (a sleep, a GPU
            # sync); its variables (the step counter, new tensors) still change
            raw, _groups, err = dump_stacks(pids, with_locals=True, native=native - given_up, took=paused,
                                            native_timeout=limit, given_up=given_up)
            for r, text in raw.items():
                dumps[r].append(text)
            if err:
                errors.append(err)
                if not raw:
                    break  # py-spy missing or denied everywhere: no use trying again
            if i == 0 and self.native:
                # the next samples read native frames of every rank that answered, idle ones included: a
                # rank sleeping at a GPU sync (blocking sync) shows its CUDA frames only so
                native = set(raw)
        span = self.clock() - t0
        got = {r: d for r, d in dumps.items() if d}
        error = self._native_once(self._ptrace_once("; ".join(dict.fromkeys(errors))))
        if not got:
            self.emit([StacksEvent(t0, ranks=tuple(sorted(pids)), error=error or "no stack could be read",
                                   node=self.node)])
            return
        ev = replace(verdict(got, source_line, gpu_util=self._gpu_util, no_gpu=no_gpu), t=t0, node=self.node)
        d = self._save(got, no_gpu & set(got))
        fields = ev.to_event_fields()
        fields["error"] = error
        self.emit([StacksEvent(t0, ranks=tuple(sorted(got)), samples=min(len(x) for x in got.values()),
                               span=round(span, 3), dir=str(d), native=bool(paused),
                               pause=round(max(paused.values(), default=0.0), 4), given_up=tuple(sorted(given_up)),
                               **fields)])

    def _failed(self, error: Exception, *args: object) -> list[Event]:
        return [StacksEvent(self.clock(), error=f"stack sampling failed: {error!r}", node=self.node)]

    def _ptrace_once(self, error: str) -> str:
        """A refused ptrace (a missing capability) is said once per run, with
        the fix, in a note; the samples' own error then only names the ranks."""
        import re


        mark = re.compile(r"rank (\d+): " + re.escape(PTRACE_REFUSED))
        refused = sorted({int(m.group(1)) for m in mark.finditer(error)})
        if not refused:
            return error
        if not self._ptrace_said:
            self._ptrace_said = True
            self.emit([NoteEvent(self.clock(), "warning", f"no stack samples: {PTRACE_REFUSED} ({PTRACE_FIX}); "
                                 "without them the hang detector works from progress and telemetry alone",
                                 node=self.node)])
        rest = [p for p in error.split("; ") if p and not mark.fullmatch(p)]
        return "; ".join([f"{PTRACE_REFUSED} for {ranks_text(refused)} (see the note)", *rest])

    def _native_once(self, error: str) -> str:
        """Why a rank's native frames could not be read (its unwinding failed,
        or was given up as too slow) is said once per rank in a note, with the
        reason; the verdict then reads that rank from its Python frames and
        the GPU's telemetry ("cannot tell" where they do not tell)."""
        import re

        mark = re.compile(r"rank (\d+): (no native frames \(.*\)|native frames given up .*)")
        parts = [p for p in error.split("; ") if p]
        new = []
        for p in parts:
            m = mark.fullmatch(p)
            if m and int(m.group(1)) not in self._native_said:
                self._native_said.add(int(m.group(1)))
                new.append(p)
        if new:
            self.emit([NoteEvent(self.clock(), "warning", "native stack frames: " + "; ".join(new) +
                                 ": those ranks are read from their Python frames and their GPU's use",
                                 node=self.node)])
        return "; ".join(p for p in parts if not mark.fullmatch(p))

    def _save(self, dumps: dict[int, list[str]], no_gpu: set[int]) -> Path:

        d = make_private_dir(unique_path(self.dest / "stacks", _stamp() + "-samples"))
        for rank, texts in dumps.items():
            for i, text in enumerate(texts):
                (d / f"rank{rank}.{i}.txt").write_text(text)
        if no_gpu:  # (read back by `ddptop diagnose`, which judges these dumps again)
            (d / GPU_RUNTIME_FILE).write_text(json.dumps({"without": sorted(no_gpu)}) + "\n")
        return d


class StackWatch(Loop):
    """Life from stacks, for jobs ddptop did not launch (no hook in the ranks).

    One rank's stack at a time (py-spy, non-blocking), the ranks taken in turn
    so that each is seen about every ``period`` seconds, never more often than
    keeps py-spy within ``budget`` of one core on average.  Each sample is
    compared with that rank's previous one: a changed stack (or a loop running
    on the CPU) is movement.  Emits ``ProgressEvent(source="stack")`` whose
    ``step`` counts the movements seen: the stall detector takes a count that
    grows as life, and a rank watched this way is judged after
    ``watch_patience`` instead of the first-step grace."""

    thread_name = "ddptop-stack-watch"

    def __init__(self, rank_pids: Callable[[], dict[int, int]], emit: Emit, *, node: str = "",
                 period: float = 5.0, budget: float = 0.02, clock: Callable[[], float] = time.time):
        super().__init__(emit)
        self.rank_pids = rank_pids
        self.node = node
        self.period = period
        self.budget = budget
        self.clock = clock
        self.cpu_seconds = 0.0  # py-spy's own CPU time so far
        self.wall_seconds = 0.0
        self.samples = 0

    def _failed(self, error: Exception) -> list[Event]:
        return [NoteEvent(self.clock(), "warning", f"stack watch failed: {error!r}", node=self.node)]

    def _loop(self) -> None:
        import resource


        exe = py_spy()
        if exe is None:

            self.emit([NoteEvent(self.clock(), "warning",
                                 "ddptop did not launch this job, so no hook counts its steps, and its stacks cannot "
                                 f"be sampled ({missing_words()}): the hang detector has only the ranks' logs",
                                 node=self.node)])
            return
        prev: dict[int, str] = {}
        moves: dict[int, int] = {}
        failed: set[int] = set()
        started = time.monotonic()
        i = 0
        while not self._stopped.is_set():
            pids = self.rank_pids()
            if not pids:
                self._stopped.wait(1.0)
                continue
            order = sorted(pids)
            rank = order[i % len(order)]
            i += 1
            t0 = time.monotonic()
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            try:
                # --locals: a healthy loop often sits on the same line in both samples (a sleep, a
                # GPU sync); its variables (the step counter, new tensors) still change
                r = python_dump(exe, pids[rank], timeout=10, with_locals=True)
                text = r.stdout if r.returncode == 0 else ""
                err = "" if r.returncode == 0 else (r.stderr or r.stdout).strip()[-300:]
            except (OSError, subprocess.SubprocessError) as e:
                text, err = "", str(e)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            took = time.monotonic() - t0
            cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
            self.cpu_seconds += cpu
            self.samples += 1
            self.wall_seconds = time.monotonic() - started
            if text:
                m = moved(prev[rank], text) if rank in prev else None
                prev[rank] = text
                moves[rank] = moves.get(rank, 0) + (1 if m else 0)
                self.emit([ProgressEvent(self.clock(), rank=rank, step=moves[rank], source="stack", node=self.node)])
            elif rank not in failed:
                failed.add(rank)
                self.emit([NoteEvent(self.clock(), "warning", f"rank {rank}: py-spy cannot read its stack, so "
                                     f"only its logs show its progress: {err or 'no output'}", node=self.node)])
            # the next rank: spread over the period, and within the CPU budget
            self._stopped.wait(max(self.period / len(order), (cpu or took) / self.budget - took))
