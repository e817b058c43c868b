"""Attach to a torchrun job that ddptop did not launch, on this machine.

``ForeignSession(pid)`` offers what the front ends use from ``Session``
(``poll``, ``finished``, ``exit_code``, ``final_state``, ``meta``, ``stop``,
``relaunch``, ...), built only from what can be seen from outside the job:

* torchrun's command line (``--log-dir``, ``--redirects``, ``--tee``,
  ``--nproc-per-node``, ``--nnodes``, ``--node-rank``, or their ``PET_*``
  environment variables);
* its workers, the ranks: its children that are rank processes
  (:func:`ddptop.core.sources.proc_torchrun.is_rank`: ``RANK`` and ``LOCAL_RANK`` in their
  environment), which also gives ``WORLD_SIZE``, ``GROUP_RANK`` and
  ``CUDA_VISIBLE_DEVICES``;
* the files their stdout and stderr go to: torchrun's per-rank log files
  (``LOG_DIR/<run id>_<random>/attempt_N/<local rank>/{stdout,stderr}.log``)
  read from their start, or any other regular file a rank or torchrun writes
  to, read from its last 64 KiB.  A terminal, a pipe or a socket cannot be
  read from outside: ddptop says so once per rank and stream, with the remedy.

The live-analysis pipeline (stall and log-signature alarms, a stack capture
on a stall) runs on what ``poll()`` reads, as the supervisor runs it for a
launched job; telemetry is sampled in a thread of its own.

Two things it never does, by design: stop or relaunch the job (ddptop did
not start it, so it sends it no signal at all), and report an exit code
(only torchrun's parent can know it).  The job's final state is ``ended``.

Finding the job (which torchrun a pid belongs to) and what a process's
output file is are ``pid_target``'s; torchrun's processes and options are
:mod:`ddptop.core.sources.proc_torchrun`'s.

One module, though over 500 lines: it is one session implementation (the
``JobSession`` protocol for a job seen from outside), and what is left in it
(the job's ranks as they come and go, the files their output goes to, the
reading of each) exists only to feed its ``poll()`` and shares its state.
"""

from __future__ import annotations

import os
import queue
import stat
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from ddptop import __version__
from ddptop.core.model.events import (
    ENDED,
    RUNNING,
    AlarmEvent,
    Event,
    GpuEvent,
    LogBatch,
    NoteEvent,
    ProcEvent,
    RankEvent,
    StateEvent,
)
from ddptop.core.model.run_meta import Meta, RankMap
from ddptop.core.model.session_protocol import (
    AttachedPid,
    CommandResult,
    Control,
    ExitStatus,
)
from ddptop.core.run import journal
from ddptop.core.run.pipeline import Pipeline
from ddptop.core.run.profiles import ProfileError, in_effect, load_all
from ddptop.core.sessions.pid_target import (
    ForeignError,
    Target,
    fd_target,
    int_or_none,
    log_file_key,
    resolve_pid,
    start_offset,
)
from ddptop.core.sources import proc_tree as procs
from ddptop.core.sources.log_tailer import Tailer, read_share
from ddptop.core.sources.proc_torchrun import (
    local_rank,
    parse_torchrun_options,
    rank_env,
    torchrun_args,
    virtual_local_rank,
)
from ddptop.core.sources.ras_probe import RasProbe
from ddptop.core.sources.stack_probe import StackCapture, StackSampler, StackWatch
from ddptop.core.sources.telemetry import RankProc
from ddptop.core.sources.telemetry_probe import TelemetryLoop

SCAN_EVERY = 0.5  # seconds between looks for new ranks, ended ranks and new log files
CHECK_EVERY = 0.5  # seconds between stall checks
POLL_EVERY = 0.1  # seconds between looks at the job's files
HISTORY = 64 * 1024  # bytes of history read from a file that is not a torchrun log file
LOG_HISTORY = 8 * 1024 * 1024  # at most this much of each torchrun per-rank log file
END_GRACE = 5.0  # seconds to wait for ranks that outlive torchrun

RANK_REMEDY = "Relaunch under ddptop, or give torchrun --log-dir DIR --redirects 3 (or --tee 3)"
TORCHRUN_REMEDY = "Redirect torchrun's output to a file (torchrun ... > torchrun.log 2>&1), or launch under ddptop"


@dataclass
class _Rank:
    proc: psutil.Process
    rank: int
    local_rank: int
    attempt: int
    env: dict
    ended: bool = False


@dataclass
class _Source:
    tailer: Tailer
    writers: set = field(default_factory=set)  # {(rank or None for torchrun, stream)}
    attempt: int = 0
    mixed_noted: bool = False

    def label(self) -> tuple[int | None, str]:
        ranks = {r for r, _ in self.writers}
        if len(ranks) == 1 and None not in ranks:
            streams = {s for _, s in self.writers}
            return next(iter(ranks)), (next(iter(streams)) if len(streams) == 1 else "stdout")
        return None, "torchrun"


class ForeignSession:
    """A torchrun job ddptop did not launch, watched from outside: the ``Session`` interface."""

    def __init__(self, target: int | Target, *, gpu: str = "auto", stall_after: float | None = None,
                 sample_interval: float = 1.0, clock=time.time, resume: dict[str, int] | None = None):
        """``resume``: a ``cursor()`` from an earlier session on this job (a
        reconnecting ``ddptop attach HOST --pid``): files are read on from there."""
        self._resume = {k: v for k, v in (resume or {}).items() if isinstance(v, int)}
        self.target = target if isinstance(target, Target) else resolve_pid(int(target))
        self.clock = clock
        self.gpu = gpu
        self.sample_interval = sample_interval
        self.torchrun = self.target.torchrun
        root = self.target.root
        self.pid = root.pid
        self.host = journal.hostname()
        try:
            cmdline = root.cmdline()
            self.started = root.create_time()
        except psutil.NoSuchProcess:
            raise ForeignError(f"pid {self.pid} has ended") from None
        except psutil.AccessDenied:
            raise ForeignError(f"pid {self.pid} belongs to another user: ddptop cannot look at it") from None
        try:
            cwd = root.cwd()
        except psutil.Error:
            cwd = ""
        try:
            root_env = root.environ() if self.torchrun is not None else {}
        except (psutil.Error, OSError):
            root_env = {}
        args = torchrun_args(cmdline) if self.torchrun is not None else None
        self.options = parse_torchrun_options(args or [], root_env)
        # torchrun's --virtual-local-rank: every worker's LOCAL_RANK is 0 (torchrun.local_rank says the real one)
        self._virtual_local_rank = virtual_local_rank(args or [])
        o = self.options
        self.log_dir = o.log_dir
        self.run_log_dir: Path | None = None  # LOG_DIR/<run id>_<random> of this job, once known
        self.meta = Meta(
            run_id=f"pid-{self.pid}",
            command=list(cmdline),
            user_command=["torchrun", *(args or [])] if self.torchrun is not None else list(cmdline),
            env_set={}, cwd=cwd, host=self.host, started=self.started, log_dir=o.log_dir or "",
            nproc_per_node=int_or_none(o.nproc_per_node), node_rank=int_or_none(o.node_rank), ddptop_version=__version__,
            gpu=gpu, sample_interval=sample_interval, stall_after=stall_after, inject=False)
        self.refused = (f"ddptop did not start this job and will not stop or relaunch it; "
                        f"use kill -INT {self.pid} yourself to stop it")
        self.error: str | None = None
        self.finished = False
        self._final: StateEvent | None = None
        self._async: queue.SimpleQueue = queue.SimpleQueue()  # from the stack-capture and telemetry threads
        self._ranks: dict[int, _Rank] = {}  # pid -> rank
        self._rank_map = RankMap(int_or_none(o.node_rank), int_or_none(o.nproc_per_node))
        self._sources: dict[tuple[int, int], _Source] = {}  # (st_dev, st_ino) -> source
        self._warned: set = set()  # warnings given once
        self._last_scan = -1e18
        self._gone_since: float | None = None
        self._started_sent = False
        self._torchrun_fds_seen = False
        self.stacks = StackCapture(journal.attached_dir(f"pid-{self.pid}"), self._rank_pids, self._put)
        self.samples = StackSampler(journal.attached_dir(f"pid-{self.pid}"), self._rank_pids, self._put,
                                    node=self.host)

        # NCCL's RAS port, from a rank's environment; on the default port (which another job of
        # this user may share) an answer counts only if it names this job's processes
        self.ras = RasProbe(self._ras_addr, journal.attached_dir(f"pid-{self.pid}"), self._rank_pids, self._put,
                            node=self.host, clock=clock, job_pids=True)
        self._root_env = root_env
        self.pipeline = Pipeline(node=self.host, stall_after=stall_after, clock=clock,
                                 on_stall=self._stacks_on_stall, sampler=self.samples.request, ras=self.ras,
                                 ras_always=self._nccl_in_use, in_effect=self._in_effect)
        self._telemetry = TelemetryLoop(gpu, self.host, sample_interval, self._rank_procs, self._put)
        # no hook in a job ddptop did not launch: its ranks' stacks, sampled in turn, are the life signal
        self.watch = StackWatch(self._rank_pids, self._put, node=self.host)

    def _in_effect(self) -> set[str]:
        """The profiles that would change nothing in this job (``profiles.in_effect``: torchrun's environment,
        its shape from its command line): an alarm does not suggest them."""
        if self.torchrun is None:
            return set()
        try:
            return in_effect(load_all(), self._root_env, None, self.options)
        except (ProfileError, OSError):  # (a broken profile file: every suggestion stays)
            return set()

    def _stacks_on_stall(self, alarm: AlarmEvent) -> None:
        self.stacks.request()

    def _nccl_in_use(self) -> bool:
        """Whether to ask NCCL's RAS port (no hook here to say which backend the
        job uses): a rank's environment names the port (the user set it), or a
        rank has NCCL loaded."""
        for pid in list(self._rank_pids().values())[:1]:
            try:
                if "NCCL_RAS_ADDR" in psutil.Process(pid).environ():
                    return True
                with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                    return any("libnccl" in line or "librccl" in line for line in f)
            except (OSError, psutil.Error):
                return False
        return False

    def _ras_addr(self) -> str | None:
        """NCCL_RAS_ADDR as a rank sees it (its environment), None when RAS is off."""
        for pid in list(self._rank_pids().values())[:1]:
            try:
                env = psutil.Process(pid).environ()
            except psutil.Error:
                return None
            if env.get("NCCL_RAS_ENABLE") == "0":
                return None
            return env.get("NCCL_RAS_ADDR") or "localhost:28028"
        return None

    def _put(self, events: list[Event]) -> None:
        for ev in events:
            self._async.put(ev)

    def _rank_pids(self) -> dict[int, int]:
        return {r.rank: pid for pid, r in list(self._ranks.items()) if not r.ended}

    def _rank_procs(self) -> list:

        return [RankProc(r.rank, r.local_rank, pid) for pid, r in list(self._ranks.items()) if not r.ended]

    # -- the JobSession protocol -------------------------------------------------

    @property
    def location(self) -> AttachedPid:
        return AttachedPid(self.pid, self.host, str(self.run_log_dir) if self.run_log_dir is not None else "")

    @property
    def is_live(self) -> bool:
        return not self.finished and self._final is None and procs.alive(self.target.root)

    @property
    def final_state(self) -> StateEvent | None:
        return self._final

    @property
    def crash_seen(self) -> bool:
        """A rank crash (or torchrun's failure report) was seen in the job's output."""
        return self.pipeline.crash_seen

    def exit_status(self) -> ExitStatus:
        """Never the job's own code (only torchrun's parent can wait for it):
        ddptop exits 1 when it saw a crash in the output, else 3."""
        if self._final is None:
            return ExitStatus.unknown("the job has not ended")
        return ExitStatus.unknown("ddptop did not start this job: its exit code cannot be known",
                                  crash_seen=self.crash_seen)

    def control(self) -> Control:
        return Control(stop=False, relaunch=False, stacks=not self.finished, refused=self.refused,
                       fix_refused=self.refused)

    def stop(self) -> CommandResult:
        """Refused: ddptop never signals a job it did not start."""
        return CommandResult(False, self.refused, refused=True)

    def relaunch(self, profiles: list[str], reason: str = "asked for") -> CommandResult:
        """Refused, as ``stop``: relaunching means stopping first."""
        return CommandResult(False, self.refused, refused=True)

    def cursor(self) -> dict[str, int]:
        """Byte offsets (by file path) just after every line returned so far."""
        return {src.tailer.path: src.tailer.cursor for src in list(self._sources.values())}

    def dump_stacks(self) -> CommandResult:
        """Every rank's Python stack, now (py-spy reads the ranks without
        stopping them); the result arrives as a note."""
        if self.finished:
            return CommandResult(False, "the job has ended")
        self.pipeline.ask_ras()  # and what NCCL sees, where it is asked (see Pipeline.ask_ras)
        return self.stacks.request()

    def close(self) -> None:
        for src in self._sources.values():
            src.tailer.close()
        self._telemetry.stop()
        self.watch.stop()

    # -- reading -----------------------------------------------------------------

    def wake(self) -> None:
        """(Its waits are short: nothing to end.)"""

    def wait(self, timeout: float) -> None:
        """A job ddptop did not launch writes where it likes: its files are
        looked at every POLL_EVERY seconds (its telemetry and stack watch keep
        their own times)."""
        if not self.finished:
            time.sleep(min(max(0.0, timeout), POLL_EVERY))

    def poll(self, max_bytes: int = 4 * 1024 * 1024) -> list[Event]:
        """Everything new since the last call.  Never blocks on the job."""
        if self.finished:
            return []
        now = self.clock()
        out: list[Event] = []
        if not self._started_sent:
            self._started_sent = True
            out.append(StateEvent(self.started, RUNNING, message=self._intro()))
            self._telemetry.start()
            self.watch.start()
        while not self._async.empty():
            out.append(self._async.get_nowait())
        ending = False
        if now - self._last_scan >= SCAN_EVERY:
            self._last_scan = now
            ending = self._scan(now, out)
        out += self._read(now, max_bytes, drain=ending)
        alarms = self.pipeline.process(self._for_analyzer(out), now, check=ending)
        out += alarms
        self.pipeline.react(alarms)
        if ending:
            self._final = StateEvent(now, ENDED, None, "exit code unknown: ddptop did not start this job")
            self.pipeline.process([self._final], now)
            out.append(self._final)
            self.finished = True
            self.close()
        return out

    def _intro(self) -> str:
        o = self.options
        if self.torchrun is None:
            return (f"attached to pid {self.pid}, a lone rank not started by torchrun nor by ddptop "
                    f"(watched as a one-rank job; ddptop will not stop it)")
        bits = [f"attached to torchrun pid {self.pid} (not launched by ddptop; it will not be stopped by ddptop)"]
        opts = []
        for name, v in (("--nnodes", o.nnodes), ("--nproc-per-node", o.nproc_per_node), ("--node-rank", o.node_rank),
                        ("--log-dir", o.log_dir), ("--redirects", o.redirects), ("--tee", o.tee)):
            if v is not None:
                opts.append(f"{name} {v}")
        if opts:
            bits.append("torchrun " + " ".join(opts))
        return "; ".join(bits)

    def _scan(self, now: float, out: list[Event]) -> bool:
        """Find new and ended ranks and new output files.  True once the job has ended."""
        root = self.target.root
        root_alive = procs.alive(root)
        if self.torchrun is not None and not self._torchrun_fds_seen:
            self._torchrun_fds_seen = True
            for fd, stream in ((1, "stdout"), (2, "stderr")):
                self._watch_fd(out, self.torchrun.pid, fd, None, stream, 0)
        # ranks
        if self.torchrun is not None and root_alive:
            try:
                children = procs.children(self.torchrun, known=self._ranks)
            except psutil.Error:
                children = []
            for c in children:
                self._new_rank(out, c, now)
        elif self.torchrun is None and root.pid not in self._ranks and root_alive:
            self._new_rank(out, root, now)
        for pid, r in self._ranks.items():
            if not r.ended and not procs.alive(r.proc):
                self._rank_ended(out, pid, r, now)
        self._scan_log_dir(out)
        if self._ranks and not self._readable() and not self._warned_about("nothing-readable"):
            out.append(NoteEvent(now, "warning", "no rank's own output can be read (see above): ddptop shows the "
                                                 "ranks' processes and telemetry, reads no step from their output, "
                                                 "and judges a hang by their stacks alone"))
        if root_alive:
            return False
        # the job is over once torchrun has gone and its ranks with it (or after a grace period)
        if self._gone_since is None:
            self._gone_since = now
        left = [(pid, r) for pid, r in self._ranks.items() if not r.ended]
        if left and now - self._gone_since < END_GRACE:
            return False
        for pid, r in left:
            out.append(NoteEvent(now, "warning", f"rank {r.rank} (pid {pid}) is still running after torchrun "
                                                 f"ended; ddptop stops watching it"))
            self._rank_ended(out, pid, r, now)
        return True

    def _warned_about(self, key) -> bool:
        if key in self._warned:
            return True
        self._warned.add(key)
        return False

    def _new_rank(self, out: list[Event], proc: psutil.Process, now: float) -> None:
        env = rank_env(proc, under_torchrun=self.torchrun is not None)
        if env is None:
            return  # not a worker (or its environment cannot be read)
        rank = int_or_none(env.get("RANK"))
        if rank is None:
            return
        local = local_rank(env, virtual=self._virtual_local_rank)
        local = rank if local is None else local
        attempt = int_or_none(env.get("TORCHELASTIC_RESTART_COUNT")) or 0
        self._ranks[proc.pid] = _Rank(proc, rank, local, attempt, env)
        rm = self._rank_map
        rm.record(attempt, local, rank)
        group, local_world = int_or_none(env.get("GROUP_RANK")), int_or_none(env.get("LOCAL_WORLD_SIZE"))
        if group is not None:
            rm.node_rank = group
        if local_world is not None:
            rm.nproc_per_node = local_world
        if self.meta.nproc_per_node is None and rm.nproc_per_node is not None:
            self.meta = replace(self.meta, nproc_per_node=rm.nproc_per_node)
        if self.meta.node_rank is None and rm.node_rank is not None:
            self.meta = replace(self.meta, node_rank=rm.node_rank)
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            self._watch_fd(out, proc.pid, fd, rank, stream, attempt)
        out.append(RankEvent(now, rank=rank, local_rank=local, node=self.host, pid=proc.pid, attempt=attempt,
                             alive=True))
        if not self._warned_about(("env", attempt)):
            facts = [f"{k}={env[k]}" for k in ("WORLD_SIZE", "GROUP_RANK", "CUDA_VISIBLE_DEVICES") if k in env]
            if facts:
                out.append(NoteEvent(now, "info", f"attempt {attempt}: ranks see " + ", ".join(facts)))

    def _rank_ended(self, out: list[Event], pid: int, r: _Rank, now: float) -> None:
        r.ended = True
        # exit code unknown: torchrun, not ddptop, waits for its workers
        out.append(RankEvent(now, rank=r.rank, local_rank=r.local_rank, node=self.host, pid=pid,
                             attempt=r.attempt, alive=False, exit_code=None))

    def _watch_fd(self, out: list[Event], pid: int, fd: int, rank: int | None, stream: str, attempt: int) -> None:
        """Read what ``pid`` writes to ``fd`` if it is a regular file; else say why not (once)."""
        now = self.clock()
        who = "torchrun" if rank is None else f"rank {rank}"
        target, st, err = fd_target(pid, fd)
        remedy = TORCHRUN_REMEDY if rank is None else RANK_REMEDY
        if err is not None:
            if err != "closed" and not self._warned_about((rank, stream, "err")):
                out.append(NoteEvent(now, "warning", f"{who} {stream}: cannot look at it ({err}): "
                                                     f"ddptop cannot read it. {remedy}"))
            return
        if st is not None and stat.S_ISREG(st.st_mode) and not target.endswith(" (deleted)"):
            self._add_file(out, target, st, rank, stream, attempt, history=True)
            return
        if target == os.devnull:
            what = f"is discarded ({target})"
        elif target.startswith("pipe:"):
            what = f"is a pipe ({target})"
        elif target.startswith("socket:"):
            what = f"is a socket ({target})"
        elif target.endswith(" (deleted)"):
            what = f"goes to a deleted file ({target})"
        elif st is not None and stat.S_ISCHR(st.st_mode) and (target.startswith(("/dev/pts/", "/dev/tty"))
                                                                or target == "/dev/console"):
            what = f"is a terminal ({target})"
        else:
            what = f"is not a regular file ({target})"
        if not self._warned_about((rank, stream)):
            out.append(NoteEvent(now, "warning", f"{who} {stream} {what}: ddptop cannot read it. {remedy}"))

    def _add_file(self, out: list[Event], path: str, st: os.stat_result, rank: int | None, stream: str,
                  attempt: int, history: bool) -> None:
        key = (st.st_dev, st.st_ino)
        src = self._sources.get(key)
        who = "torchrun" if rank is None else f"rank {rank}"
        if src is None:
            log = log_file_key(path)
            if path in self._resume:  # a reconnect: exactly where the last connection stopped
                if log is not None and self.run_log_dir is None:
                    self.run_log_dir = log[0]
                offset, note = self._resume[path], None
            elif log is not None:
                if self.run_log_dir is None:
                    self.run_log_dir = log[0]
                offset = start_offset(path, LOG_HISTORY)
                note = None if offset == 0 else (
                    f"{who} {stream}: {path} is large; reading its last {LOG_HISTORY // 1024 // 1024} MiB")
            else:
                offset = start_offset(path, HISTORY) if history else 0
                note = (f"{who} {stream} goes to {path}: reading it from "
                        + ("its start" if offset == 0 else f"its last {HISTORY // 1024} KiB (earlier output is in the file)"))
            src = self._sources[key] = _Source(Tailer(path, offset), attempt=attempt)
            if note:
                out.append(NoteEvent(self.clock(), "info", note))
        src.writers.add((rank, stream))
        if len({r for r, _ in src.writers}) > 1 and not src.mixed_noted:
            src.mixed_noted = True
            who = "torchrun and its ranks" if None in {r for r, _ in src.writers} else "several ranks"
            out.append(NoteEvent(self.clock(), "warning",
                                 f"{who} write to the same file {path}: its lines are shown as torchrun's "
                                 f"output, since ddptop cannot tell whose they are. {RANK_REMEDY}"))

    def _rank_for(self, attempt: int, local_rank: int) -> int:
        return self._rank_map.rank(attempt, local_rank)

    def _scan_log_dir(self, out: list[Event]) -> None:
        """Per-rank log files of this job, also those of ranks that have ended (a crash's traceback)."""
        d = self.run_log_dir
        if d is None and self.log_dir and self.torchrun is not None:
            d = self._guess_run_log_dir()
            if d is not None:
                self.run_log_dir = d
        if d is None:
            return
        for path in d.glob("attempt_*/*/std*.log"):
            key = log_file_key(str(path))
            if key is None:
                continue
            _, attempt, local_rank, stream = key
            try:
                st = os.stat(path)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in self._sources:
                self._add_file(out, str(path), st, self._rank_for(attempt, local_rank), stream, attempt, history=False)

    def _guess_run_log_dir(self) -> Path | None:
        """The newest ``LOG_DIR/<run id>_*`` made since torchrun started (when no live rank says which)."""
        if not self.log_dir:
            return None
        try:
            cands = [p for p in Path(self.log_dir).iterdir() if p.is_dir()
                     and p.stat().st_mtime >= self.started - 1 and any(p.glob("attempt_*"))]
        except OSError:
            return None
        rid = next((r.env.get("TORCHELASTIC_RUN_ID") for r in self._ranks.values()), None) or self.options.rdzv_id
        named = [p for p in cands if rid and p.name.startswith(rid + "_")]
        cands = named or cands
        return max(cands, key=lambda p: p.stat().st_mtime) if cands else None

    def _read(self, now: float, max_bytes: int, drain: bool) -> list[Event]:
        out: list[Event] = []
        batch = LogBatch.of_chunk
        per_file = read_share(max_bytes, len(self._sources))
        for src in self._sources.values():
            rank, stream = src.label()
            t = src.tailer
            while True:
                before = t.pos
                c = t.read_chunk(per_file)
                if c:
                    out.append(batch(now, rank, stream, src.attempt, t.path, c))
                # draining (the job ended): on to the end of the file, through reads that give no
                # line (the rest of an over-long one being skipped)
                if not drain or t.pos == before or t.at_eof():
                    break
            if drain:
                c = t.flush_chunk()
                if c:
                    out.append(batch(now, rank, stream, src.attempt, t.path, c))
        return out

    def _readable(self) -> set[int]:
        """Ranks whose own output ddptop reads (a file only they write to)."""
        return {r for r, _ in (src.label() for src in self._sources.values()) if r is not None}

    def _for_analyzer(self, events: list[Event]) -> list[Event]:
        """Leave out the ranks whose output cannot be read: silence from them is not a stall."""
        ok = self._readable()
        out = []
        for ev in events:
            if isinstance(ev, AlarmEvent):
                continue
            if isinstance(ev, (RankEvent, ProcEvent)) and ev.rank not in ok:
                continue
            if isinstance(ev, GpuEvent) and ev.ranks and not set(ev.ranks) <= ok:
                ev = replace(ev, ranks=tuple(r for r in ev.ranks if r in ok))
            out.append(ev)
        return out
