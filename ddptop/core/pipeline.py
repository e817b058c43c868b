"""Live analysis: one pipeline for every job ddptop watches.

Sources (a run's journal, a job watched by pid, the nodes of a multi-node
job) feed events in; the pipeline returns alarms and runs the reactions to
them.  The supervisor of a launched job, ``ForeignSession`` (attach by pid)
and ``MultiSession`` (the cross-node view) each hold one; only what they
plug in differs:

* the analyzer (progress, signatures, the stall detector), started afresh
  for each relaunch;
* reactions: a stack capture on a stall (``StackCapture``), the notify
  command, and whatever the owner adds (the supervisor: flight-recorder
  dumps, ``--on-stall kill|relaunch``);
* telemetry (``TelemetryLoop``): NVML/psutil samples off the caller's thread.

Also here, written once: ``RankMap`` (which global rank a local rank of an
attempt is) and ``run_notify`` (the ``--notify-cmd`` reaction).
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from ddptop.core.events import AlarmEvent, Event, LaunchEvent, NoteEvent
from ddptop.core.command_result import CommandResult
from ddptop.core.versions import version_tuple

CHECK_EVERY = 0.5  # seconds between stall checks
CRASH_SIGNATURES = frozenset({"child-failed", "rank-exit", "rank-signal"})
# NCCL 2.26 to 2.29.1: asked at most this often (seconds) during a stall; queries, repeated, have
# crashed those versions' RAS thread (NVIDIA/nccl#1669, #1718)
FRAGILE_RAS_GAP = 120.0

Emit = Callable[[list[Event]], None]


class RankMap:
    """Global rank of (attempt, local rank): as the ranks said, else node_rank * nproc + local."""

    def __init__(self, node_rank: int | None = None, nproc_per_node: int | None = None):
        self.node_rank = node_rank
        self.nproc_per_node = nproc_per_node
        self._seen: dict[tuple[int, int], int] = {}

    def record(self, attempt: int, local_rank: int, rank: int) -> None:
        self._seen[(attempt, local_rank)] = rank

    def rank(self, attempt: int, local_rank: int) -> int:
        r = self._seen.get((attempt, local_rank))
        if r is not None:
            return r
        if self.node_rank is not None and self.nproc_per_node is not None:
            return self.node_rank * self.nproc_per_node + local_rank
        return local_rank


class StackCapture:
    """Every rank's Python stack (py-spy), one capture at a time, in a thread
    of its own; the files go under ``dest/stacks/<time>/``, the summary and
    any error arrive through ``emit`` as notes."""

    def __init__(self, dest: Path, rank_pids: Callable[[], dict[int, int]], emit: Emit,
                 clock: Callable[[], float] = time.time):
        self.dest = Path(dest)
        self.rank_pids = rank_pids
        self.emit = emit
        self.clock = clock
        self._busy = threading.Lock()
        self._thread: threading.Thread | None = None

    def request(self, why: str = "") -> CommandResult:
        pids = self.rank_pids()
        if not pids:
            return CommandResult(False, "no rank is running")
        if not self._busy.acquire(blocking=False):
            return CommandResult(True, "a stack capture is already under way")
        if why:
            self.emit([NoteEvent(self.clock(), "info", f"capturing every rank's Python stack ({why})")])
        self._thread = threading.Thread(target=self._run, args=(pids,), daemon=True, name="ddptop-stacks")
        self._thread.start()
        return CommandResult(True, "capturing every rank's Python stack")

    def wait(self, timeout: float | None = None) -> None:
        t = self._thread
        if t is not None:
            t.join(timeout)

    def _run(self, pids: dict[int, int]) -> None:
        from ddptop.core.stacks import dump_stacks, summarise

        try:
            raw, groups, err = dump_stacks(pids)
            out: list[Event] = []
            if raw:
                d = self.dest / "stacks" / time.strftime("%Y%m%d-%H%M%S")
                n = 1
                while d.exists():  # two captures in one second
                    n += 1
                    d = d.with_name(f"{d.name.split('.')[0]}.{n}")
                from ddptop.core.journal import make_private_dir

                make_private_dir(d)
                for rank, text in raw.items():
                    (d / f"rank{rank}.txt").write_text(text)
                out.append(NoteEvent(self.clock(), "info", f"stacks captured in {d}: {summarise(groups)}"))
            if err:
                out.append(NoteEvent(self.clock(), "warning", f"stack capture: {err}"))
            self.emit(out)
        except Exception as e:  # never let a capture take the watching down
            self.emit([NoteEvent(self.clock(), "warning", f"stack capture failed: {e!r}")])
        finally:
            self._busy.release()


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


class StackSampler:
    """At a suspected stall: every rank's stack (py-spy), ``samples`` times
    ``gap`` seconds apart, and what they say (``analysis.stacks.verdict``),
    emitted as one ``StacksEvent`` that the pipeline feeds to the stall
    detector.  The first sample is Python-only and non-blocking; the later
    ones read native frames (``--native``, which pauses the rank while py-spy
    unwinds it) of the ranks that were on the CPU in the first, so that a
    rank spinning at a CUDA synchronisation shows the CUDA runtime, driver or
    NCCL frames it spins in; ``native=False`` keeps every sample non-blocking.
    ``request(gpu_busy)`` names the ranks whose GPU is busy without step
    progress (the verdict reads such a rank, spinning on one line, as
    waiting on the GPU).  The dumps are kept under ``dest/stacks/<time>-samples/``.  One
    sampling at a time, in a thread of its own; never blocks the analysis."""

    def __init__(self, dest: Path, rank_pids: Callable[[], dict[int, int]], emit: Emit, *, node: str = "",
                 samples: int = 2, gap: float = 1.0, clock: Callable[[], float] = time.time,
                 native: bool = True):
        self.dest = Path(dest)
        self.rank_pids = rank_pids
        self.emit = emit
        self.node = node
        self.samples = samples
        self.gap = gap
        self.clock = clock
        self.native = native
        self._gpu_busy: set[int] = set()
        self._ptrace_said = False
        self._busy = threading.Lock()
        self._thread: threading.Thread | None = None

    def request(self, gpu_busy: set[int] | None = None) -> bool:
        """Start a sampling (False: one is under way, or no rank runs).
        ``gpu_busy``: the ranks whose GPU is busy with no step progress."""
        pids = self.rank_pids()
        if not pids or not self._busy.acquire(blocking=False):
            return False
        self._gpu_busy = set(gpu_busy or ())
        self._thread = threading.Thread(target=self._run, args=(pids,), daemon=True, name="ddptop-stack-samples")
        self._thread.start()
        return True

    def wait(self, timeout: float | None = None) -> None:
        t = self._thread
        if t is not None:
            t.join(timeout)

    def _run(self, pids: dict[int, int]) -> None:
        from dataclasses import replace

        from ddptop.core.analysis.stacks import main_active, verdict
        from ddptop.core.events import StacksEvent
        from ddptop.core.stacks import dump_stacks

        try:
            t0 = self.clock()
            dumps: dict[int, list[str]] = {r: [] for r in pids}
            errors: list[str] = []
            native: set[int] = set()
            paused: dict[int, float] = {}
            for i in range(self.samples):
                if i:
                    time.sleep(self.gap)
                # --locals: a healthy loop often sits on the same line in both samples (a sleep, a GPU
                # sync); its variables (the step counter, new tensors) still change
                raw, _groups, err = dump_stacks(pids, with_locals=True, native=native, took=paused)
                for r, text in raw.items():
                    dumps[r].append(text)
                if err:
                    errors.append(err)
                    if not raw:
                        break  # py-spy missing or denied everywhere: no use trying again
                if i == 0 and self.native:
                    # the next samples read native frames of the ranks on the CPU (spinning at a sync?)
                    native = {r for r, text in raw.items() if main_active(text)}
            span = self.clock() - t0
            got = {r: d for r, d in dumps.items() if d}
            error = self._ptrace_once("; ".join(dict.fromkeys(errors)))
            if not got:
                self.emit([StacksEvent(t0, ranks=tuple(sorted(pids)), error=error or "no stack could be read",
                                       node=self.node)])
                return
            ev = replace(verdict(got, source_line, self._gpu_busy), t=t0, node=self.node)
            d = self._save(got)
            fields = ev.to_event_fields()
            fields["error"] = error
            self.emit([StacksEvent(t0, ranks=tuple(sorted(got)), samples=min(len(x) for x in got.values()),
                                   span=round(span, 3), dir=str(d), native=bool(paused),
                                   pause=round(max(paused.values(), default=0.0), 4), **fields)])
        except Exception as e:  # never let sampling take the watching down
            from ddptop.core.events import StacksEvent

            self.emit([StacksEvent(self.clock(), error=f"stack sampling failed: {e!r}", node=self.node)])
        finally:
            self._busy.release()

    def _ptrace_once(self, error: str) -> str:
        """A refused ptrace (a missing capability) is said once per run, with
        the fix, in a note; the samples' own error then only names the ranks."""
        import re

        from ddptop.core.analysis.evidence import ranks_text
        from ddptop.core.stacks import PTRACE_FIX, PTRACE_REFUSED

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

    def _save(self, dumps: dict[int, list[str]]) -> Path:
        from ddptop.core.journal import make_private_dir

        d = self.dest / "stacks" / (time.strftime("%Y%m%d-%H%M%S") + "-samples")
        n = 1
        while d.exists():
            n += 1
            d = d.with_name(f"{d.name.split('.')[0]}.{n}")
        make_private_dir(d)
        for rank, texts in dumps.items():
            for i, text in enumerate(texts):
                (d / f"rank{rank}.{i}.txt").write_text(text)
        return d


class StackWatch:
    """Life from stacks, for jobs ddptop did not launch (no hook in the ranks).

    One rank's stack at a time (py-spy, non-blocking), the ranks taken in turn
    so that each is seen about every ``period`` seconds, never more often than
    keeps py-spy within ``budget`` of one core on average.  Each sample is
    compared with that rank's previous one: a changed stack (or a loop running
    on the CPU) is movement.  Emits ``ProgressEvent(source="stack")`` whose
    ``step`` counts the movements seen: the stall detector takes a count that
    grows as life, and a rank watched this way is judged after
    ``watch_patience`` instead of the first-step grace."""

    def __init__(self, rank_pids: Callable[[], dict[int, int]], emit: Emit, *, node: str = "",
                 period: float = 5.0, budget: float = 0.02, clock: Callable[[], float] = time.time):
        self.rank_pids = rank_pids
        self.emit = emit
        self.node = node
        self.period = period
        self.budget = budget
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu_seconds = 0.0  # py-spy's own CPU time so far
        self.wall_seconds = 0.0
        self.samples = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="ddptop-stack-watch")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import resource

        from ddptop.core.events import ProgressEvent
        from ddptop.core.analysis.stacks import moved
        from ddptop.core.stacks import py_spy

        exe = py_spy()
        if exe is None:
            from ddptop.core.stacks import _missing

            self.emit([NoteEvent(self.clock(), "warning",
                                 "ddptop did not launch this job, so no hook counts its steps, and its stacks cannot "
                                 f"be sampled ({_missing()}): the hang detector has only the ranks' logs",
                                 node=self.node)])
            return
        prev: dict[int, str] = {}
        moves: dict[int, int] = {}
        failed: set[int] = set()
        started = time.monotonic()
        i = 0
        while not self._stop.is_set():
            pids = self.rank_pids()
            if not pids:
                self._stop.wait(1.0)
                continue
            order = sorted(pids)
            rank = order[i % len(order)]
            i += 1
            t0 = time.monotonic()
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            try:
                # --locals: a healthy loop often sits on the same line in both samples (a sleep, a
                # GPU sync); its variables (the step counter, new tensors) still change
                r = subprocess.run([exe, "dump", "--nonblocking", "--full-filenames", "--locals", "--pid",
                                    str(pids[rank])],
                                   capture_output=True, text=True, errors="replace", timeout=10)
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
            self._stop.wait(max(self.period / len(order), (cpu or took) / self.budget - took))


def run_notify(cmd: list[str], alarm: AlarmEvent, run_dir: str) -> NoteEvent | None:
    """--notify-cmd: the person's command with the alarm as JSON on stdin (never a shell)."""
    env = dict(os.environ, DDPTOP_ALARM_TYPE=alarm.type, DDPTOP_ALARM_ID=alarm.id,
               DDPTOP_ALARM_MESSAGE=alarm.message, DDPTOP_RUN_DIR=run_dir)
    try:
        subprocess.run(cmd, input=(alarm.to_json() + "\n").encode(), env=env, timeout=30,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return NoteEvent(time.time(), "warning", f"--notify-cmd failed: {e}")
    return None


class Pipeline:
    """Events in, alarms out, reactions run.  The analysis itself is pure
    (``Analyzer``, injected clock); the reactions are what the owner plugs in."""

    def __init__(self, *, node: str = "", stall_after: float | None = None,
                 clock: Callable[[], float] = time.time, check_every: float = CHECK_EVERY,
                 stall_only: bool = False,
                 on_stall: Callable[[AlarmEvent], None] | None = None,
                 on_alarm: Callable[[AlarmEvent], None] | None = None,
                 sampler: Callable[[set[int]], bool] | None = None,
                 resample_every: float = 20.0, stacks_wait: float = 10.0,
                 ras: "RasProbe | None" = None, ras_always: bool | Callable[[], bool] = False):
        """``stall_only``: the sources' own signature alarms are already in their
        streams (the nodes of a multi-node job): only stalls are judged here.
        ``on_stall``: run once per stall alarm batch, with its first stall;
        ``on_alarm``: run for every alarm (the notify command).  ``sampler``:
        asks for stack samples of every rank (a ``StackSampler.request``) when
        the detector suspects a stall, again every ``resample_every`` seconds
        while the silence lasts; their ``StacksEvent`` confirms the stall (or
        says it is work) and names the culprit.  The alarm waits for them at
        most ``stacks_wait`` seconds.  ``ras``: asked with the stack samples
        when the job uses NCCL (a line or the step hook said its version) or
        ``ras_always`` (the user set NCCL_RAS_ADDR; or a function that says
        whether the ranks loaded NCCL): its ``RasEvent`` names who NCCL sees
        behind."""
        self.node = node
        self.stall_after = stall_after
        self.clock = clock
        self.check_every = check_every
        self.stall_only = stall_only
        self.on_stall = on_stall
        self.on_alarm = on_alarm
        self.generation = 0
        self.crash_seen = False  # a rank crash (or torchrun's failure report) was seen
        self.sampler = sampler
        self.resample_every = resample_every
        self.stacks_wait = stacks_wait
        self.ras = ras
        self.ras_always = ras_always
        self._ras_unknown_said = False
        self._last_check = -1e18
        self.analyzer = self._new_analyzer()

    def _new_analyzer(self):
        from ddptop.core.analysis.analyzer import Analyzer

        return Analyzer(self.clock, stall_after=self.stall_after, node=self.node,
                        can_sample=self.sampler is not None or self.ras is not None,
                        resample_every=self.resample_every, stacks_wait=self.stacks_wait)

    def process(self, events: list[Event], now: float | None = None, *,
                check: bool = False) -> list[AlarmEvent | NoteEvent]:
        """Feed ``events``; stall-check when due (or ``check``); return the new
        alarms, and the analyzer's notes (a parser that failed on a line).  The
        owner puts them in its stream, then calls ``react``."""
        now = self.clock() if now is None else now
        for i in range(len(events) - 1, -1, -1):
            ev = events[i]
            if isinstance(ev, LaunchEvent) and ev.generation > self.generation:
                # a relaunch: judge the new attempt afresh
                self.generation = ev.generation
                self.analyzer = self._new_analyzer()
                self._last_check = -1e18
                events = events[i + 1:]
                break
        an = self.analyzer
        if self.ras is not None and self.ras._monitor is None and self._monitor_wanted():
            self.ras.start_monitor()
        alarms: list[AlarmEvent] = []
        notes: list[NoteEvent] = []
        for e in an.feed([e for e in events if not isinstance(e, AlarmEvent)]):
            if isinstance(e, AlarmEvent):
                alarms.append(e)
            else:
                notes.append(e)
        if self.stall_only:
            # (each node's own analyzer has made its notes, and its signature alarms)
            alarms = [a for a in alarms if a.type == "stall"]
            notes = []
        if check or now - self._last_check >= self.check_every:
            self._last_check = now
            sample, stalls = an.decide(now)
            if sample:
                self._take_samples()
            alarms += stalls
        if not self.crash_seen and (any(a.type == "crash" for a in alarms)
                                    or any(f.signature in CRASH_SIGNATURES for f in an.findings)):
            self.crash_seen = True
        return [*notes, *alarms]

    def _take_samples(self) -> None:
        """The detector asked for stack samples (a suspected stall): take them,
        and ask NCCL's RAS; say so to the detector if no samples come."""
        self.ask_ras()
        st = self.analyzer.stall
        if self.sampler is None or not self.sampler(st.gpu_busy()):
            st.samples_refused()

    def _monitor_wanted(self) -> bool:
        """Follow NCCL's pushed events: the job uses NCCL 2.29+ (or an unknown
        version behind a RAS address the user set)."""
        always = self.ras_always() if callable(self.ras_always) else self.ras_always
        v = self.analyzer.nccl_version
        return bool(always) if not v else version_tuple(v) >= (2, 29)

    def ask_ras(self) -> bool:
        """Ask NCCL's RAS port now (a suspected stall, a stall, a stack capture),
        if the job uses NCCL or the user pointed NCCL_RAS_ADDR somewhere."""
        if self.ras is None:
            return False
        always = self.ras_always() if callable(self.ras_always) else self.ras_always
        if not (always or self.analyzer.nccl_version):
            return False
        v = self.analyzer.nccl_version
        if v and not always and version_tuple(v) < (2, 24):
            if not self._ras_unknown_said:
                self._ras_unknown_said = True
                self.ras.emit([NoteEvent(self.clock(), "info", f"NCCL {v} has no RAS port (it came in 2.24): the "
                                         "culprit comes from stacks and telemetry only", node=self.node)])
            return False
        if v and (2, 26) <= version_tuple(v) < (2, 29, 2) and time.monotonic() - self.ras.last_asked < FRAGILE_RAS_GAP:
            return False  # (queries have crashed these versions' RAS: NVIDIA/nccl#1669, #1718)
        return self.ras.request()

    def react(self, events: Sequence[Event]) -> None:
        """Run the reactions to alarms that are now in the stream (``events``:
        what ``process`` returned; what is not an alarm has none)."""
        alarms = [a for a in events if isinstance(a, AlarmEvent)]
        if self.on_alarm is not None:
            for a in alarms:
                self.on_alarm(a)
        stalls = [a for a in alarms if a.type == "stall"]
        if stalls and self.on_stall is not None:
            self.on_stall(stalls[0])


class TelemetryLoop(threading.Thread):
    """GPU and process samples once per interval, off the caller's thread.

    Poll, then reschedule: a slow tick (a hung NVML call) delays the next one
    and never overlaps it.  ``ranks()`` says which processes to sample."""

    def __init__(self, mode: str, node: str, interval: float, ranks: Callable[[], list], emit: Emit):
        super().__init__(name="ddptop-sampler", daemon=True)
        self.mode, self.node, self.interval = mode, node, interval
        self.ranks, self.emit = ranks, emit
        self.done = threading.Event()

    def stop(self) -> None:
        self.done.set()

    def run(self) -> None:
        from ddptop.core.telemetry import Telemetry, make_backend

        try:
            tel = Telemetry(make_backend(self.mode, self.node), self.node)
        except Exception as e:  # never let telemetry take the watching down
            self.emit([NoteEvent(time.time(), "warning", f"telemetry disabled: {e!r}")])
            return
        try:
            while not self.done.is_set():
                t0 = time.monotonic()
                try:
                    self.emit(tel.tick(self.ranks()))
                except Exception as e:
                    self.emit([NoteEvent(time.time(), "warning", f"telemetry tick failed: {e!r}")])
                self.done.wait(max(0.05, self.interval - (time.monotonic() - t0)))
        finally:
            try:
                tel.backend.shutdown()
            except Exception as e:
                self.emit([NoteEvent(time.time(), "warning", f"telemetry shutdown failed: {e!r}")])


class RasProbe:
    """Asks NCCL's RAS port what NCCL sees (``core/ras.py``), off the caller's
    thread, one query at a time, and emits a ``RasEvent``: who launched which
    collective, who is missing or dead, as global ranks.  The raw answer is
    kept beside the stall's stack samples (``dest/stacks/<time>-ras.json``).

    ``addr()`` gives the address of the current attempt (None: RAS is off);
    ``rank_pids()`` the job's ranks on this node, to map RAS's (host, pid) to
    global ranks.  A query is asked for at a suspected stall, during a stall
    and with a stack capture; the caller decides whether NCCL is in use."""

    def __init__(self, addr: Callable[[], str | None], dest: Path, rank_pids: Callable[[], dict[int, int]],
                 emit: Emit, *, node: str = "", timeout: float = 9.0, clock: Callable[[], float] = time.time,
                 job_pids: bool = False):
        """``job_pids``: use an answer only if it names this job's pids (a
        default port another job may share)."""
        self.addr, self.dest, self.rank_pids, self.emit = addr, Path(dest), rank_pids, emit
        self.node, self.timeout, self.clock, self.job_pids = node, timeout, clock, job_pids
        self._busy = threading.Lock()
        self.asked = 0
        self.last_asked = float("-inf")  # time.monotonic() of the last query
        self._monitor: threading.Thread | None = None
        self._stopped = threading.Event()

    def request(self) -> bool:
        addr = self.addr()
        if not addr or not self._busy.acquire(blocking=False):
            return False
        self.asked += 1
        self.last_asked = time.monotonic()
        threading.Thread(target=self._run, args=(addr,), name="ddptop-ras", daemon=True).start()
        return True

    def start_monitor(self) -> None:
        """Follow NCCL's pushed events (MONITOR, 2.29+) in a thread until
        ``stop``: a dead peer becomes a ``RasEvent`` with ``event`` PEER_DEAD
        at once.  Reconnects while the port is not up yet (NCCL starts it at
        its first communicator) and after a relaunch; a server without
        MONITOR is said once, and not asked again."""
        if self._monitor is None:
            self._monitor = threading.Thread(target=self._follow, name="ddptop-ras-monitor", daemon=True)
            self._monitor.start()

    def stop(self) -> None:
        self._stopped.set()

    def _follow(self) -> None:
        from ddptop.core import ras
        from ddptop.core.events import RasEvent

        def on_event(pe: "ras.PeerEvent") -> None:
            if pe.event != "PEER_DEAD":
                return
            rank = self._local_ranks().get(pe.pid) if pe.pid >= 0 else None
            who = (f"process {pe.pid} on {pe.host}" if pe.pid >= 0 else f"peer {pe.details or pe.line.strip()}")
            who += f" (rank {rank})" if rank is not None else ""
            self.emit([RasEvent(self.clock(), addr=addr or "", ok=True, event="PEER_DEAD",
                                culprits=(rank,) if rank is not None else (), text=f"{who} is dead (PEER_DEAD)",
                                node=self.node)])

        while not self._stopped.is_set():
            addr = self.addr()
            if not addr:
                self._stopped.wait(5)
                continue
            try:
                ras.monitor(addr, on_event, self._stopped.is_set)
                self._stopped.wait(1)  # the connection closed: the job ended, or is relaunched
            except ras.MonitorUnsupported as e:
                self.emit([NoteEvent(self.clock(), "info", f"NCCL RAS: {e}; dead peers are seen at the next "
                                     "stall instead", node=self.node)])
                return
            except (ras.RasError, ValueError):
                self._stopped.wait(5)  # no port yet (NCCL not started), or refused: ask again later
            except Exception as e:  # never let it take the watching down
                self.emit([NoteEvent(self.clock(), "warning", f"NCCL RAS monitor failed: {e!r}", node=self.node)])
                return

    def wait(self, timeout: float | None = None) -> bool:
        if self._busy.acquire(timeout=-1 if timeout is None else timeout):
            self._busy.release()
            return True
        return False

    def _local_ranks(self) -> dict[int, int]:
        return {pid: rank for rank, pid in self.rank_pids().items()}

    def _run(self, addr: str) -> None:
        from ddptop.core import ras
        from ddptop.core.analysis.ras import verdict as ras_verdict
        from ddptop.core.events import RasEvent

        t0 = self.clock()
        try:
            try:
                st = ras.query(addr, timeout=self.timeout)
            except (ras.RasError, ValueError) as e:
                why = str(e)
                if "refused" in why.lower():
                    why += (" (no RAS port there: NCCL older than 2.24, RAS turned off with NCCL_RAS_ENABLE=0, "
                            "NCCL not started yet, or another user's job holds the port)")
                self.emit([RasEvent(t0, addr=addr, error=why, node=self.node)])
                return
            by_pid = self._local_ranks()
            if self.job_pids and not (ras.job_pids(st) & set(by_pid)):
                self.emit([RasEvent(t0, addr=addr, error="the answer is about another job's processes "
                                    "(a shared default port): ignored", node=self.node)])
                return
            local = _local_addresses()

            def rank_of(host: str, pid: int) -> int | None:
                return by_pid.get(pid) if (not host or host in local or len(local) == 0) else None

            v = ras_verdict(st, rank_of)
            file = ""
            try:
                from ddptop.core.journal import make_private_dir

                d = make_private_dir(self.dest / "stacks")
                f = d / (time.strftime("%Y%m%d-%H%M%S") + f"-ras.{'json' if st.format == 'json' else 'txt'}")
                f.write_text(st.raw)
                file = str(f)
            except Exception:
                pass
            self.emit([RasEvent(t0, addr=addr, ok=True, version=st.version, format=st.format,
                                culprits=tuple(v.culprits), text=v.text, behind={str(k): s for k, s in v.behind.items()},
                                took=st.took, file=file, node=self.node)])
        except Exception as e:  # never let a query take the watching down
            self.emit([RasEvent(t0, addr=addr, error=f"RAS query failed: {e!r}", node=self.node)])
        finally:
            self._busy.release()


def _local_addresses() -> set[str]:
    """This machine's addresses (RAS names hosts by IP); empty when unknown."""
    try:
        import psutil

        return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
                if a.family in (socket.AF_INET, socket.AF_INET6)}
    except Exception:
        return set()
