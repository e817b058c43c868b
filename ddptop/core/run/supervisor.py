"""The supervisor: the process that owns a launched job.

Started by ddptop in its own session, it runs torchrun, records every rank's
pid in the journal, and writes the final exit status.  Killing ddptop (even
with SIGKILL) does not touch it, so the job and its journal carry on.
SIGTERM or SIGINT to the supervisor stops the job: SIGTERM to torchrun and to
every rank's process group (torchrun starts each rank in its own session),
then SIGKILL after a grace period, and never a process it did not start.

One module, though over 500 lines: it is one process, the job's owner; its threads
(the watcher, the flight-recorder capture) and its signal handlers share that
process's state (the ranks it found, the stop and relaunch requests), and the
analysis it runs lives in ``ddptop.core.analysis``.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from ddptop.core.analysis.signatures import failure_summary
from ddptop.core.model import run_dirs
from ddptop.core.model.events import (
    FAILED,
    RUNNING,
    STOPPED,
    STOPPING,
    SUCCEEDED,
    MARK_EVERY,
    MARKS_PER_FILE,
    Event,
    LaunchEvent,
    LogBatch,
    LogMarks,
    NoteEvent,
    RankEvent,
    StateEvent,
)
from ddptop.core.model.run_meta import Thresholds
from ddptop.core.model.settings import FR_DIR, settings
from ddptop.core.run import journal
from ddptop.core.run.launcher import LaunchError, launch_options, plan_launch
from ddptop.core.run.pipeline import Pipeline, run_notify
from ddptop.core.run.profiles import (
    MASK,
    ProfileError,
    in_effect,
    load_all,
    mask_argv,
    mask_env,
    resolve,
)
from ddptop.core.run.run_session import Session
from ddptop.core.sources import flight_recorder as flight
from ddptop.core.sources import proc_tree as procs
from ddptop.core.sources.proc_torchrun import local_rank, rank_env, virtual_local_rank
from ddptop.core.sources.ras_probe import RasProbe
from ddptop.core.sources.stack_probe import StackCapture, StackSampler
from ddptop.core.sources.telemetry import RankProc
from ddptop.core.sources.telemetry_probe import TelemetryLoop

POLL = 0.5  # main loop: rank discovery and stop handling
GRACE = settings().stop_grace


class EventWriter:
    """Append events to events.jsonl, one write per batch, no buffering."""

    def __init__(self, path: Path):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._lock = threading.Lock()

    def write(self, ev: Event) -> None:
        self.write_many([ev])

    def write_many(self, evs: list[Event]) -> None:
        if not evs:
            return
        data = "".join(ev.to_json() + "\n" for ev in evs).encode("utf-8")
        with self._lock:
            os.write(self._fd, data)


STALL_EXIT = 124
CAPTURE_BEFORE_STOP = 20.0  # --on-stall kill|relaunch: seconds the stall's stack capture may take before the stop
ANALYSIS_GAP = 0.05  # seconds between two analysis passes, at least (a chatty job's lines come in batches)
FINAL_READ = 4.0  # seconds the analysis may take, once torchrun has ended, to read the rest of the logs


class _Marks:
    """When the watcher read each log file, for the journal (``LogMarks``): the reads since the last mark,
    written at most every MARK_EVERY seconds, MARKS_PER_FILE reads a file at most (past that, the last read
    is moved on: its lines are timed later, by less than MARK_EVERY)."""

    def __init__(self) -> None:
        self._reads: dict[str, list[list]] = {}
        self._last = 0.0

    def note(self, events: list[Event]) -> None:
        for ev in events:
            if isinstance(ev, LogBatch) and ev.offsets:
                reads = self._reads.setdefault(ev.path, [])
                read = [ev.offsets[-1], round(ev.t, 3)]
                if len(reads) < MARKS_PER_FILE:
                    reads.append(read)
                else:
                    reads[-1] = read

    def take(self, now: float, final: bool = False) -> LogMarks | None:
        if not self._reads or (now - self._last < MARK_EVERY and not final):
            return None
        self._last = now
        reads, self._reads = self._reads, {}
        return LogMarks(now, reads)


class Watcher(threading.Thread):
    """Reads the job's own journal, runs the live-analysis pipeline on it and
    writes its alarms into the journal (whoever is watching, or nobody)."""

    def __init__(self, sup: "Supervisor", interval: float = 0.5):
        super().__init__(name="ddptop-watcher", daemon=True)
        self.sup, self.interval = sup, interval
        self.done = threading.Event()
        self._session = None
        self._final_deadline = 0.0

    def finish(self) -> None:
        """torchrun has ended: read the last lines now (end a wait under way)."""
        self.done.set()
        session = self._session
        if session is not None:
            session.wake()

    def run(self) -> None:

        sup = self.sup
        try:
            session = self._session = Session(sup.run_dir, min_gap=ANALYSIS_GAP)
            pipe = Pipeline(node=sup.meta.host, stall_after=sup.meta.stall_after,
                            thresholds=Thresholds.from_dict(sup.meta.thresholds),
                            on_alarm=sup.notify, on_stall=sup.on_stall, sampler=sup.samples.request,
                            ras=sup.ras, ras_always="NCCL_RAS_ADDR" in os.environ, in_effect=sup.profiles_in_effect)
        except Exception as e:  # noqa: BLE001 - the detection thread's start: said, and the job runs on unwatched
            sup.emit(NoteEvent(time.time(), "warning", f"detection disabled: {e!r}"))
            return
        marks = _Marks()
        while True:
            last = self.done.is_set()  # torchrun has ended: one more pass reads its last lines
            if last and not self._final_deadline:
                self._final_deadline = time.monotonic() + FINAL_READ
            if sup.stacks_request:  # asked for (the TUI's p key, or through an attachment)
                sup.stacks_request = False
                sup.stacks.request("asked for")
                pipe.ask_ras()
            try:
                events = session.poll()
                marks.note(events)
                alarms = pipe.process(events)
            except Exception as e:  # noqa: BLE001 - the detection thread's tick: said, and the next one comes
                sup.emit(NoteEvent(time.time(), "warning", f"detection tick failed: {e!r}"))
                alarms = []
            done = last and (not session.backlog or time.monotonic() > self._final_deadline)
            mark = marks.take(time.time(), final=done)
            if mark is not None:
                sup.events.write(mark)  # (before the alarms the lines it marks led to)
            if alarms:
                sup.events.write_many(alarms)
                pipe.react(alarms)
            if done:
                break  # (the last pass reads every file to its end, within FINAL_READ seconds)
            if not self.done.is_set():
                session.wait(self.interval)  # a line, a step or a deadline (stall checks) wakes it
        session.close()


class _Proc:
    """A process we started (or torchrun started for us), pinned by create time."""

    def __init__(self, p: psutil.Process):
        self.p = p
        self.pid = p.pid
        self.create_time = p.create_time()

    def is_ours(self) -> bool:
        try:
            return self.p.is_running() and self.p.create_time() == self.create_time
        except psutil.Error:
            return False

    def signal_group(self, sig: int) -> None:
        """Signal the process's own group if it leads one, else the process."""
        if not self.is_ours():
            return
        try:
            if os.getpgid(self.pid) == self.pid:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _signame(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


class Supervisor:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.meta = journal.load_meta(run_dir)
        # torchrun's --virtual-local-rank: every worker's LOCAL_RANK is 0 (torchrun.local_rank says the real one)
        self._virtual_local_rank = virtual_local_rank(list(self.meta.command[1:]))
        self.events = EventWriter(run_dir / run_dirs.EVENTS)
        self.ranks: dict[int, tuple[_Proc, dict]] = {}  # pid -> (proc, info)
        self.family: dict[int, _Proc] = {}  # every descendant seen, for the final sweep
        self.stop_requested = False
        self.stop_signal: int | None = None  # the signal that asked for the stop
        # a signal (stop, relaunch, stacks) wakes the main loop at once instead of after its nap
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.stall_kill = False
        self.stopping_since: float | None = None
        self.relaunch_request: list[str] | None = None
        self.stacks_request = False  # SIGUSR2: capture every rank's stack now
        self.env_set: dict = {}
        self.job_env: dict[str, str] = {}  # the current attempt's whole environment
        self.job_command: list[str] = []  # the current attempt's torchrun command
        self._flight_busy = threading.Lock()
        self.relaunch_reason = ""
        self.generation = 0
        self.profiles: list[str] = list(self.meta.profiles or [])
        self.tried: set[tuple[str, ...]] = {tuple(self.profiles)}
        self.relaunches = 0

        self.stacks = StackCapture(run_dir, self._rank_pids, self.events.write_many)
        self.samples = StackSampler(run_dir, self._rank_pids, self.events.write_many, node=self.meta.host)

        self.ras = RasProbe(self._ras_addr, run_dir, self._rank_pids, self.events.write_many, node=self.meta.host)

    def profiles_in_effect(self) -> set[str]:
        """The profiles that would change nothing in the current attempt (by its environment and its
        shape): an alarm does not suggest them (a job started with CUDA_MODULE_LOADING=EAGER is not told to
        try eager-load, nor a one-rank job p2p-off)."""
        try:
            return in_effect(load_all(), self.job_env, self.run_dir, launch_options(self.job_command, self.job_env))
        except (ProfileError, OSError):  # (a profile file broken since the launch: every suggestion stays)
            return set()

    def _ras_addr(self) -> str | None:
        """NCCL's RAS address for the current attempt (None: RAS turned off)."""
        env = {**os.environ, **self.env_set}
        if env.get("NCCL_RAS_ENABLE") == "0":
            return None
        addr = env.get("NCCL_RAS_ADDR")
        return None if addr == MASK else (addr or "localhost:28028")

    def _rank_pids(self) -> dict[int, int]:
        return {i["rank"]: pid for pid, (p, i) in list(self.ranks.items()) if not i.get("ended")}

    def emit(self, ev: Event) -> None:
        self.events.write(ev)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"!")
        except OSError:  # full: a wake-up is pending anyway
            pass

    def _nap(self, seconds: float) -> None:
        """Sleep up to ``seconds``; a signal handler's _wake() ends it at once."""
        try:
            ready, _, _ = select.select([self._wake_r], [], [], seconds)
            if ready:
                os.read(self._wake_r, 4096)
        except (OSError, ValueError):
            time.sleep(seconds)

    def _on_signal(self, signum, frame) -> None:
        self.stop_signal = signum
        self.stop_requested = True
        self._wake()

    def _on_stacks(self, signum, frame) -> None:
        self.stacks_request = True
        self._wake()

    def _on_relaunch(self, signum, frame) -> None:
        """SIGUSR1: relaunch with the profiles named in RUN/relaunch.json."""
        req = journal.read_json(self.run_dir / run_dirs.RELAUNCH)
        if isinstance(req, dict) and isinstance(req.get("profiles"), list):
            self.relaunch_request = [str(p) for p in req["profiles"]]
            self.relaunch_reason = str(req.get("reason", "asked for"))
            self._wake()

    def auto_relaunch(self, alarm) -> None:
        """--on-stall relaunch: the first suggested profile not tried yet."""
        limit = self.meta.max_relaunches if self.meta.max_relaunches is not None else 3
        if self.relaunches >= limit:
            self.emit(NoteEvent(time.time(), "warning", f"stalled again, but --max-relaunches {limit} reached"))
            return

        known = load_all()
        for name in alarm.suggested_profiles:
            combo = tuple(self.profiles + [name]) if name not in self.profiles else None
            if combo and combo not in self.tried and name in known:
                self.relaunch_request = list(combo)
                self.relaunch_reason = f"{alarm.id}: trying profile {name}"
                return
        self.emit(NoteEvent(time.time(), "warning", "stalled, and every suggested profile was tried already"))

    def discover(self, torchrun: psutil.Process) -> None:
        try:
            children = procs.children(torchrun, known=self.ranks)  # (no scan of every process)
        except psutil.Error:
            children = []
        for c in children:
            env = rank_env(c)
            if env is None:
                continue
            try:
                proc = _Proc(c)
            except psutil.Error:
                continue
            info = dict(
                rank=int(env["RANK"]),
                local_rank=local_rank(env, virtual=self._virtual_local_rank) or 0,
                node=self.meta.host,
                attempt=int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
            )
            self.ranks[c.pid] = (proc, info)
            self.emit(RankEvent(time.time(), pid=c.pid, alive=True, **info))
        for pid, (proc, info) in list(self.ranks.items()):
            if not info.get("ended") and (not proc.is_ours() or proc.p.status() == psutil.STATUS_ZOMBIE):
                self._ended(pid, info)

    def _ended(self, pid: int, info: dict) -> None:
        info["ended"] = True
        self.emit(RankEvent(time.time(), pid=pid, alive=False, **{k: v for k, v in info.items() if k != "ended"}))

    def remember_family(self, torchrun: psutil.Process | None = None) -> None:
        """Pin every descendant of torchrun and of each rank, for the final SIGKILL sweep."""
        roots = [torchrun] if torchrun is not None else []
        roots += [proc.p for proc, _ in self.ranks.values() if proc.is_ours()]
        for root in roots:
            try:
                for p in procs.descendants(root):
                    if p.pid not in self.family:
                        self.family[p.pid] = _Proc(p)
            except psutil.Error:
                pass

    def signal_all(self, torchrun: _Proc | None, sig: int) -> None:
        if torchrun is not None and torchrun.is_ours():
            try:
                os.kill(torchrun.pid, sig)
            except ProcessLookupError:
                pass
        for proc, _ in self.ranks.values():
            proc.signal_group(sig)
        if sig == signal.SIGKILL:
            for proc in self.family.values():
                if proc.is_ours():
                    try:
                        os.kill(proc.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass

    def run(self) -> int:
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, self._on_signal)
        signal.signal(signal.SIGUSR1, self._on_relaunch)
        signal.signal(signal.SIGUSR2, self._on_stacks)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        me = psutil.Process()
        journal.write_json(
            self.run_dir / run_dirs.SUPERVISOR,
            {"pid": me.pid, "create_time": me.create_time()},
        )
        sampler = None
        if (self.meta.gpu or "auto") != "off":

            def ranks() -> list:
                return [RankProc(i["rank"], i["local_rank"], pid)
                        for pid, (p, i) in list(self.ranks.items()) if not i.get("ended")]

            sampler = TelemetryLoop(self.meta.gpu or "auto", self.meta.host, float(self.meta.sample_interval or 1.0),
                                    ranks, self.events.write_many)
            sampler.start()
        watcher = Watcher(self)
        watcher.start()
        command, self.user_command = journal.real_argv(self.run_dir, self.meta)  # meta.json may show them masked
        env_set, env_unset = dict(self.meta.env_set), list(self.meta.env_unset or [])
        first_env = dict(env_set)
        reason = "launch"
        while True:
            self.env_set = env_set  # the current attempt's (the flight-recorder profile's dump directory)

            diff = {k: v for k, v in env_set.items() if first_env.get(k) != v}
            diff.update({k: None for k in env_unset})
            self.emit(LaunchEvent(time.time(), generation=self.generation, profiles=tuple(self.profiles),
                                  command=tuple(mask_argv(command)), env_diff=mask_env({k: v for k, v in diff.items() if v is not None})
                                  | {k: None for k, v in diff.items() if v is None}, reason=reason))
            env = dict(os.environ)
            env.update({k: v for k, v in env_set.items() if v != MASK})  # masked: already in os.environ
            for k in env_unset:
                env.pop(k, None)
            self.job_env, self.job_command = env, command
            rc = self.run_generation(command, env)
            if rc is None:
                break
            if self.relaunch_request is None or self.stop_requested:
                break
            # relaunch: the old attempt is completely gone (run_generation made sure)
            names, reason = self.relaunch_request, self.relaunch_reason
            self.relaunch_request = None
            try:

                plan = plan_launch(self.user_command, self.run_dir, cwd=self.meta.cwd,
                                   inject=self.meta.inject, profiles=resolve(names),
                                   ras_addr=first_env.get("NCCL_RAS_ADDR"))
            except (LaunchError, ProfileError, OSError) as e:  # an unknown profile, a command it cannot apply to
                self.emit(NoteEvent(time.time(), "error", f"relaunch with {names} impossible: {e}"))
                break
            command, env_set, env_unset = plan.command, plan.env_set, plan.env_unset
            self.profiles = list(names)
            self.tried.add(tuple(names))
            self.generation += 1
            self.relaunches += 1
            self.ranks = {}
            self.family = {}
            self.stopping_since = None
            self.emit(StateEvent(time.time(), state=RUNNING, message=f"relaunching ({reason}) with profiles {', '.join(names) or 'default'}"))
        if sampler is not None:
            sampler.stop()
        self.ras.stop()
        watcher.finish()
        watcher.join(timeout=5)  # its last alarms land before the final state
        self.stacks.wait(timeout=30)  # and a stack capture under way
        self.samples.wait(timeout=30)
        if rc is None:
            return self.finish(FAILED, 127, "could not start torchrun", "job")
        self.discover_end()
        code = _exit_code(rc)
        if self.stall_kill:
            return self.finish(STOPPED, STALL_EXIT, "stopped by ddptop: the job stalled (--on-stall kill)",
                               "ddptop-on-stall")
        if self.stop_requested:
            how = f" ({_signame(self.stop_signal)} to ddptop's supervisor)" if self.stop_signal else ""
            return self.finish(STOPPED, code, f"stopped on request{how}", "ddptop-stop")
        if rc < 0:
            return self.finish(FAILED, code, f"torchrun was killed by {_signame(-rc)}, which ddptop did not send",
                               "outside")
        return self.finish(SUCCEEDED if code == 0 else FAILED, code, f"torchrun exited with {code}", "job")

    def notify(self, alarm) -> None:
        """--notify-cmd: run the person's command with the alarm as JSON on stdin."""
        if self.meta.notify_cmd:

            note = run_notify(list(self.meta.notify_cmd), alarm, str(self.run_dir))
            if note is not None:
                self.emit(note)

    def on_stall(self, alarm) -> None:
        """The reactions to a stall of a job ddptop owns: flight-recorder dumps
        (that profile), every rank's stack, then --on-stall kill|relaunch."""
        if self.env_set.get(FR_DIR):
            threading.Thread(target=self.capture_flight, daemon=True, name="ddptop-flight").start()
        self.stacks.request()
        if self.meta.on_stall not in ("relaunch", "kill"):
            return

        def then() -> None:
            # the stacks are read before the ranks are stopped (a rank that is going away has none)
            self.stacks.wait(timeout=CAPTURE_BEFORE_STOP)
            if self.meta.on_stall == "relaunch":
                self.auto_relaunch(alarm)
            else:
                self.emit(NoteEvent(time.time(), "warning", "stall detected and --on-stall kill: stopping the job"))
                self.stall_kill = True
                self.stop_requested = True
            self._wake()

        threading.Thread(target=then, daemon=True, name="ddptop-on-stall").start()

    def capture_flight(self, wait: float = 10.0) -> None:
        """flight-recorder profile, at a stall: ask every rank for its flight
        recorder (the hook dumps it into RUN/flight/rank_N), then say which rank
        diverged, and run torch's torchfrtrace on the dumps."""

        # one capture at a time; a stall that comes while an earlier one's capture
        # still waits for dumps (a start-up stall, say) gets its own after it
        if not self._flight_busy.acquire(timeout=2 * (wait + flight.TORCHFRTRACE_TIMEOUT)):
            self.emit(NoteEvent(time.time(), "warning", "flight recorder: an earlier capture is still running; "
                                                        "this stall's dumps were not asked for"))
            return
        try:
            d = Path(self.env_set[FR_DIR])
            ranks = self._rank_pids()
            d.mkdir(parents=True, exist_ok=True)
            t0 = time.time()
            (d / "dump.request").write_text(f"{t0}\n")
            deadline = time.monotonic() + wait

            def fresh(r):
                try:
                    return os.stat(d / f"{flight.PREFIX}{r}").st_mtime >= t0 - 0.01
                except OSError:
                    return False

            while time.monotonic() < deadline and not all(fresh(r) for r in ranks):
                time.sleep(0.2)
            dumps, problems = flight.load_dir(d)
            dumps = {r: v for r, v in dumps.items() if fresh(r)}  # this stall's, not an older attempt's
            rep = flight.analyse(dumps, expected=sorted(ranks))
            for p in problems:
                self.emit(NoteEvent(time.time(), "warning", f"flight recorder: {p}"))
            self.emit(NoteEvent(time.time(), "warning" if rep.culprits else "info",
                                f"flight recorder ({len(dumps)} of {len(ranks)} ranks dumped, in {d}): {rep.summary()}"))
            if dumps:
                out, said = flight.run_torchfrtrace(d)
                self.emit(NoteEvent(time.time(), "info", said + (f" (full output: {out})" if out else "")))
        except Exception as e:  # noqa: BLE001 - the ddptop-flight thread's boundary: said, and the job goes on
            self.emit(NoteEvent(time.time(), "warning", f"flight recorder capture failed: {e!r}"))
        finally:
            self._flight_busy.release()

    def run_generation(self, command: list[str], env: dict) -> int | None:
        """Run torchrun once, to its end; stop it on request.  Returns its exit status."""
        with open(self.run_dir / run_dirs.TORCHRUN_LOG, "ab", buffering=0) as out:
            log_from = out.tell()  # this attempt's part of torchrun.log (for its failure summary)
            try:
                popen = subprocess.Popen(command, cwd=self.meta.cwd, env=env, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT)
            except OSError as e:
                out.write(f"could not start torchrun: {e}\n".encode())
                return None
        self.emit(StateEvent(time.time(), state=RUNNING, message=f"torchrun pid {popen.pid}"))
        try:
            tr = psutil.Process(popen.pid)
            torchrun = _Proc(tr)
        except psutil.Error:
            tr, torchrun = None, None
        while True:
            rc = popen.poll()
            ending = self.stop_requested or self.relaunch_request is not None
            if tr is not None:
                self.discover(tr)
                if ending:
                    self.remember_family(tr)
            if rc is not None:
                break
            if ending and self.stopping_since is None:
                self.stopping_since = time.monotonic()
                what = "stop requested" if self.stop_requested else f"relaunch requested ({self.relaunch_reason})"
                self.emit(StateEvent(time.time(), state=STOPPING, message=what))
                self.signal_all(torchrun, signal.SIGTERM)
            elif self.stopping_since is not None and time.monotonic() - self.stopping_since > GRACE:
                self.emit(NoteEvent(time.time(), "warning", f"job still running {GRACE:g}s after SIGTERM: sending SIGKILL"))
                self.signal_all(torchrun, signal.SIGKILL)
                self.stopping_since = float("inf")
            # stopping: look often, so the next attempt starts as soon as the old one is gone
            self._nap(POLL if self.stopping_since is None else 0.05)
        # torchrun is gone; sweep any rank or worker it left behind
        if tr is not None:
            self.discover(tr)
        leftovers = [p for p, _ in self.ranks.values() if p.is_ours()]
        if leftovers:
            self.remember_family()
            self.emit(NoteEvent(time.time(), "warning", "torchrun exited leaving ranks " + ", ".join(str(p.pid) for p in leftovers) + ": stopping them"))
            self.signal_all(None, signal.SIGTERM)
            deadline = time.monotonic() + min(GRACE, 5)
            while time.monotonic() < deadline and self._ranks_running():
                time.sleep(0.1)
            self.signal_all(None, signal.SIGKILL)
            while self._ranks_running():
                time.sleep(0.05)
        self.discover_end()
        self.rank_exit_codes(rc, log_from)
        return rc

    def rank_exit_codes(self, rc: int | None, log_from: int) -> None:
        """Each rank's exit code, where it can be known.  Ranks are torchrun's
        children, so ddptop cannot wait() for them; but torchrun exits 0 only
        when every rank of its last attempt did, and otherwise names each
        failed rank and its exit code in its failure summary."""
        if rc is None or self.stop_requested or self.relaunch_request is not None or not self.ranks:
            return  # stopped by us: torchrun prints no summary, and the codes would be ours
        try:
            last = max(info["attempt"] for _, info in self.ranks.values())
            current = {info["rank"]: (pid, info) for pid, (_, info) in self.ranks.items() if info["attempt"] == last}
            if rc == 0:
                codes = {r: 0 for r in current}
            else:

                with open(self.run_dir / run_dirs.TORCHRUN_LOG, "rb") as f:
                    f.seek(max(log_from, os.fstat(f.fileno()).st_size - (1 << 20)))
                    codes = failure_summary(f.read().decode("utf-8", "replace").splitlines())
            for r, code in sorted(codes.items()):
                if r in current:
                    pid, info = current[r]
                    self.emit(RankEvent(time.time(), pid=pid, alive=False, exit_code=code,
                                        **{k: v for k, v in info.items() if k != "ended"}))
        except OSError as e:  # torchrun's log is unreadable: the job's end is recorded all the same
            self.emit(NoteEvent(time.time(), "warning", f"could not read the ranks' exit codes: {e!r}"))

    def _ranks_running(self) -> bool:
        def running(p: _Proc) -> bool:
            try:
                return p.is_ours() and p.p.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                return False
        return any(running(p) for p, _ in self.ranks.values())

    def discover_end(self) -> None:
        for pid, (proc, info) in self.ranks.items():
            if not info.get("ended"):
                self._ended(pid, info)

    def finish(self, state: str, code: int, message: str, ended_by: str = "") -> int:
        now = time.time()
        journal.write_json(self.run_dir / run_dirs.EXIT, {"state": state, "exit_code": code, "t": now, "message": message,
                                                         "ended_by": ended_by})
        self.emit(StateEvent(now, state=state, exit_code=code, message=message, ended_by=ended_by))
        return code


def main(run_dir: str) -> int:
    return Supervisor(Path(run_dir)).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
