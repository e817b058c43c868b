"""Lines to findings: :class:`SignatureMatcher` is fed lines (with the rank
they came from) and returns :class:`Finding` objects, from the catalogue
(``signature_catalog``) and from what no catalogue lists: a rank's exit code
or signal, torchrun's failure report, a Python exception and where it was
raised, any other error line.  Which finding is the cause is
``failure_ranking``'s question.

One module, though over 500 lines: it is one matcher, fed one line at a time,
whose parts (a launcher's failure report, tracebacks, NCCL warnings held for
the error they explain, error lines no signature knows) share its per-rank
state; the catalogue and the ranking live apart.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Callable

from ddptop.core.analysis.prefixes import RankMapping, split
from ddptop.core.analysis.progress import clean
from ddptop.core.analysis.signature_catalog import (
    ALWAYS,
    BENIGN_IB_EVENT,
    CATALOG,
    CAUSE,
    CONSEQUENCE,
    ENDED,
    EXPLAINED_BY_WARNINGS,
    GENERIC,
    HINTS,
    INFO,
    NCCL_REASONS,
    TIMEOUT,
)
from ddptop.core.analysis.stack_dumps import FH_FRAME, FH_THREAD
from ddptop.core.analysis.timestamps import line_time

_SIGNAL = re.compile(r"Signal (?P<num>\d+) \((?P<name>SIG\w+)\) received by PID (?P<pid>\d+)")
# UCX's (and Open MPI's) handler, on the process's own fatal signal: "Caught signal 7 (Bus error: nonexistent ...)"
_UCX_SIGNAL = re.compile(r"Caught signal (?P<num>\d+) \((?:Bus error|Segmentation fault|Aborted|Floating point|"
                         r"Illegal instruction)|"
                         # (Open MPI's own handler: "[host:00334] *** Process received signal ***", then this)
                         r"\bSignal: (?:Bus error|Segmentation fault|Aborted|Floating point exception|"
                         r"Illegal instruction) \((?P<ompi>\d+)\)")
# the process's own last words on a fatal signal: faulthandler's, or the shell's
_FATAL_NAMES = r"Segmentation fault|Aborted|Bus error|Floating point exception|Illegal instruction"
_FATAL = re.compile(rf"Fatal Python error: (?P<what>{_FATAL_NAMES})|^\S+: line \d+: +\d+ (?P<shell>{_FATAL_NAMES})\b|"
                    rf"^(?P<dumped>{_FATAL_NAMES})(?: \(core dumped\))?$|"
                    # (SLURM's srun on a task a signal ended: the task is the rank)
                    rf"^srun: error: \S+: task (?P<task>\d+): (?P<srun>{_FATAL_NAMES})\b")
_FATAL_SIGNALS = {"Segmentation fault": (11, "SIGSEGV"), "Aborted": (6, "SIGABRT"), "Bus error": (7, "SIGBUS"),
                  "Floating point exception": (8, "SIGFPE"), "Illegal instruction": (4, "SIGILL")}
# DeepSpeed's launcher on the first rank process that failed (then it stops the others):
# "[...sigkill_handler] ['python', '-u', 'train.py', '--local_rank=2', ...] exits with return code = -9"
_LAUNCHER_EXIT = re.compile(r"exits with return code = (?P<code>-?\d+)")
_LOCAL_RANK_ARG = re.compile(r"--local[_-]rank[= ']+(?P<rank>\d+)")
# Open MPI's mpirun on the first rank that failed: "mpirun noticed that process rank 3 with PID 4711 on node gpu-2
# exited on signal 9 (Killed)."; or, on an exit code, "The first process to do so was:" then
# "Process name: [[61379,1],2]" and "Exit code: 1"
_MPI_SIGNAL = re.compile(r"noticed that process rank (?P<rank>\d+) with PID (?P<pid>\d+) on node (?P<node>\S+) "
                         r"exited on signal (?P<num>\d+)")
_MPI_PROCESS = re.compile(r"^\s*Process name: \[\[\d+,\d+\],(?P<rank>\d+)\]")
_MPI_EXIT = re.compile(r"^\s*Exit code:\s+(?P<code>-?\d+)")
# exceptions that say a wait ran out (a timeout: another rank did not come), or that the process was
# stopped from outside (a consequence)
_TIMEOUT_EXC = re.compile(r"[Tt]ime[dD]?[ _-]?[Oo]ut|timed out|TimeoutError|DistStoreError")
_STOPPED_EXC = re.compile(r"^(?:[\w.]*\.)?(?:KeyboardInterrupt|SignalException|BrokenPipeError)\b")
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): (?P<msg>.*)$")
_ROOT_BLOCK = re.compile(r"Root Cause \(first observed failure\)")
# a Python traceback's frame line, and an exception named without a message at a traceback's end
_BY_ID = {sig.id: sig for sig in CATALOG}
# the writers of /dev/shm a traceback's innermost frame may be in: a semaphore, shared memory, a shared tensor
_SHM_WRITERS = re.compile(r"(?:synchronize|shared_memory|heap|reductions)\.py:")
_TB_FRAME = re.compile(r'^File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')
_BARE_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception))$")
_LIBRARY_PATH = re.compile(r"[/\\](?:site|dist)-packages[/\\]|[/\\]lib(?:64)?[/\\]python\d|^<frozen ")
# PyTorch's flight recorder at a watchdog timeout (torch 2.5+, on by default since 2.6): the failed collective's
# Python stack as it was enqueued, one frame a line, innermost first, the lines after the first without a record's
# head (ProcessGroupNCCL.cpp's printTraceback, FlightRecorder.cpp's getTraceback):
#   [rank3]:[E710 18:00:32.427312432 ProcessGroupNCCL.cpp:801] Stack trace of the failed collective:
#   #0 all_reduce from /usr/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py:3174
#   #2 train_step from /home/me/train.py:88
_FR_STACK = re.compile(r"Stack trace of the failed collective:\s*$")
_FR_FRAME = re.compile(r"^#\d+ (?P<fn>\S+) from (?P<file>.+):(?P<line>\d+)$")
_TORCH_DISTRIBUTED = re.compile(r"[/\\]torch[/\\]distributed[/\\]")
# an error line no signature knows: error words, and none of a warning's, an INFO line's or a healthy run's
_ERROR_WORDS = re.compile(r"\b(?:error|ERROR|Error|FATAL|Fatal|fatal|CRITICAL|failed|Failed|FAILED|failure|Failure|"
                          r"cannot|Cannot|can't|Can't|could not|Could not|unable to|Unable to|"
                          r"No such file or directory|Permission denied|core dumped|refused|denied|exceeded|"
                          r"Assertion .* failed)\b|what\(\):|^\[?E\d{3,4} \d\d:")
_NOT_ERROR = re.compile(r"\b(?:WARN|WARNING|\w*Warning|warning|INFO|DEBUG|[Dd]eprecat\w*|retry\w*|[Rr]etrying|[Ii]f you|"
                        r"[Yy]ou (?:can|may|might|should)|[Cc]onsider|[Hh]int|ignor\w*|[Nn]o errors?|without errors?|"
                        r"0 errors?|errors?[:=] ?0\b|error[_ ]?(?:rate|count|file)|[Tt]raceback|[Tt]o enable|"
                        r"[Cc]orrected error|severity=Corrected)\b|"
                        r"^\[?[WI]\d{3,4} |^\[[WI] |above exception|handling of the|^=+$|^-+$|^\S+ FAILED$|"
                        # (a heading whose error is on the next line; PyTorch's C++ backtrace lines)
                        r"^Last error:?$|^frame #\d+:|^Exception raised from ")
_NCCL_PEER_WARN = re.compile(r"\bpeer\b|\bremote\b|[Cc]onnection (?:closed|reset|refused)|truncated|[Bb]roken pipe|"
                             r"\b[Cc]losed\b|[Aa]bort|[Ss]ocket (?:recv|send|poll)|Failed to execute operation|"
                             r"retcode \d")
_MAX_UNKNOWN = 200
_SUPERSEDE_LINES = 60  # an exception this many lines after an unknown error line on its rank says what it was  # unclassified error lines kept per matcher (a log full of one error says it already)


# substrings one of which every match of _ERROR_WORDS contains (a cheap look first: most lines have none)
_ERROR_HINTS = ("rror", "RROR", "atal", "ATAL", "RITICAL", "ail", "AIL", "annot", "an't", "ould not", "nable to",
                "No such", "denied", "refused", "exceeded", "core dumped", "what():", "ssertion")


def _looks_like_error(s: str) -> bool:
    if "NCCL WARN " in s:
        # (WARN is NCCL's error level: NCCL_DEBUG=WARN, its default, prints only its errors; those that say a peer
        # went away are what a lost peer looks like, the reasons of the errors they explain, never a root)
        return _NCCL_PEER_WARN.search(s) is None
    if len(s) <= 3 or not (any(h in s for h in _ERROR_HINTS) or (s[:1] in "E[" and s[1:2].isdigit() or
                                                                 s[:2] == "[E")):
        return False
    if s.rstrip().endswith(("{", "[")):
        return False  # (the head of a structured report, an error handler's JSON: its fields say the error)
    return _ERROR_WORDS.search(s) is not None and _NOT_ERROR.search(s) is None


# a C++ log record's head, as glog and torch's c10 logging write it ("[E1127 18:34:27.692293475 ProcessGroupNCCL.cpp:2495]",
# "E1127 18:39:17.521000 942 torch/distributed/elastic/multiprocessing/api.py:986]"): its source file (its time:
# ``timestamps.line_time``).  A known error is often followed by more records from the same source within the
# second (NCCL's watchdog: the desync report, the failed collective's stack, the dump it starts): the rest of that
# report, not errors of their own.
_LOG_RECORD = re.compile(r"\[?[EWF]\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)? +(?:\d+ +)?"
                         r"(?P<src>[\w./-]+\.(?:cpp|cc|cu|h|hpp|c|py)):\d+\]")
_REPORT_SECONDS = 10  # how long after a known error a record from the same source is still its report


def _where(path: str, line: str, fn: str) -> str:
    """A frame as a finding says where: ``train.py:88 in train_step`` (the file's name, not its directory)."""
    return f"{path.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line} in {fn}"


def _record(s: str) -> tuple[str, float] | None:
    """A log record's (source file, second of the day), or None for a line that is not one."""
    g = _LOG_RECORD.search(s[:200]) if "]" in s[:200] else None
    stamp = line_time(s) if g is not None else None
    return (g.group("src"), stamp.seconds) if g is not None and stamp is not None else None


def _same_report(known: tuple[str, float] | None, record: tuple[str, float]) -> bool:
    if known is None or known[0] != record[0]:
        return False
    return 0 <= (record[1] - known[1]) % 86400 <= _REPORT_SECONDS  # (across midnight too)


# torch.multiprocessing.spawn's report of the first process that failed
_SPAWN = re.compile(r"[Pp]rocess (?P<rank>\d+) terminated with (?:signal (?P<sig>SIG[A-Z]+)|exit code (?P<code>-?\d+)|"
                    r"(?P<error>the following error))")
# torch elastic's agent, on the first worker it saw fail (before its summary):
# "failed (exitcode: -9) local_rank: 0 (pid: 4711) of binary: /usr/bin/python3"
_AGENT_EXIT = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)")
# a stop from outside the job, as torch elastic's agent says it ("Received Signals.SIGHUP death signal, shutting
# down workers"; "Received 15 death signal"), or as it raises it ("SignalException: Process 4711 got signal: 1")
_OUTSIDE_STOP = re.compile(r"Received (?:Signals\.)?(?P<name>SIG[A-Z]+|\d+) death signal|"
                           r"SignalException: Process (?P<pid>\d+) got signal: (?P<num>\d+)")
# NCCL's own warnings (NCCL_DEBUG=WARN, the default, prints them): "host:pid:tid [gpu] ... NCCL WARN <what>"
_NCCL_WARN = re.compile(r"NCCL WARN (?P<what>.+)")
_WARN_WINDOW = 60  # lines: how far back an NCCL warning still explains an NCCL error on the same rank
_FAILURES_BLOCK = re.compile(r"^\s*Failures:\s*$")
_BLOCK_RANK = re.compile(r"^\s*rank\s*:\s*(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)")
_BLOCK_EXIT = re.compile(r"^\s*exitcode\s*:\s*(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?")
# "[Rank 3] Watchdog caught ...", "[PG ID 0 PG GUID 0(default_pg) Rank 1] Timeout at NCCL work ..."
_RANK_IN_MESSAGE = re.compile(r"\[(?:PG [^\]]*?)?\b[Rr]ank (?P<rank>\d+)\]")
_SIGNAMES = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
_CONSEQUENTIAL_SIGNALS = {"SIGTERM", "SIGKILL", "SIGINT", "SIGHUP"}
# exceptions raised by the collective machinery itself after a timeout: the timeout is the finding
# (and NCCL's own result names, on the line after its error: "ncclSystemError: System call ... failed")
_CASCADE_EXC = re.compile(r"^(?:torch\.distributed\.)?(?:DistBackendError|DistStoreError):|^nccl[A-Z]\w*Error:")

RANK_SIGNAL_PROFILES = ("gloo", "single-gpu", "nccl-debug")


@dataclass(frozen=True)
class Explained:
    """An NCCL warning that came just before an NCCL error on its rank: it says why."""

    line: int | None
    text: str


@dataclass(eq=False)
class Detail:
    """What a finding knows beyond its words, typed.  ``matched``: the named
    groups of its signature's pattern, as the line said them (``seq``, ``op``,
    ``rank_a``, ...).  Mutable in three places only: the matcher marks an
    unknown error line ``superseded_by`` the exception that explains it and
    gives a rank's watchdog timeouts the ``where`` of the failed collective's
    stack that follows them, and the analyzer marks a finding ``recovered``
    when its rank trains on."""

    exit_code: int | None = None
    signal: str = ""  # SIGSEGV, SIGKILL, ...
    signum: int | None = None
    pid: int | None = None
    root: bool = False  # the launcher's report calls it the first failure
    summary: bool = True  # False: the launcher's agent's own line, not its failure summary
    derived: bool = False  # said by several ranks' lines together (failure_ranking.across_ranks)
    odd: tuple[int, ...] = ()  # derived: the odd ranks out
    collectives: dict[int, str] = field(default_factory=dict)  # derived: each rank's collective
    # python-exception: the innermost frame of the user's own code, else the innermost; nccl-watchdog-timeout:
    # where the failed collective was called from (its stack, as PyTorch's flight recorder printed it)
    where: str = ""
    type: str = ""  # python-exception: the exception's type
    unknown: bool = False  # an error line no signature knows
    explained_by: tuple[Explained, ...] = ()
    reason: str = ""  # what the NCCL warnings say went wrong (NCCL_REASONS' id)
    op_damaged: str = ""  # a watchdog timeout's operation name, cut or garbled by a paste: unknown
    recovered: bool = False
    superseded_by: int | None = None
    matched: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The fields that say something, as JSON (``diagnose --json``)."""
        out: dict = dict(self.matched)
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "matched" or v == (f.default_factory() if f.default_factory is not MISSING else f.default):
                continue
            if f.name == "explained_by":
                v = [{"line": e.line, "text": e.text} for e in v]
            elif f.name == "collectives":
                v = {str(r): c for r, c in sorted(v.items())}
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out


@dataclass(frozen=True)
class Finding:
    signature: str
    rank: int | None
    line: int | None  # 1-based line number in its source, when known
    text: str
    explanation: str
    suggested_profiles: tuple[str, ...]
    level: int
    source: str = ""
    detail: Detail = field(default_factory=Detail, compare=False, hash=False)

    def to_dict(self) -> dict:
        return {
            "signature": self.signature, "rank": self.rank, "line": self.line, "text": self.text,
            "explanation": self.explanation, "suggested_profiles": list(self.suggested_profiles),
            "source": self.source, **({"detail": d} if (d := self.detail.to_dict()) else {}),
        }


class SignatureMatcher:
    """Feed lines one by one; stateful only for torchrun's failure summary."""

    def __init__(self):
        self._block: str | None = None  # "root" | "failures" | None
        self._block_rank: int | None = None
        self._in_traceback: dict[int | None, bool] = {}
        self._warns: dict[int | None, list[tuple[int, int | None, str]]] = {}  # rank -> (seen at, line, text)
        self._seen = 0  # lines fed
        self.mapping = RankMapping()
        self._mpi_rank: int | None = None  # the rank of mpirun's "Process name:" line, for its "Exit code:" line
        self._spawn_rank: int | None = None  # the process torch.multiprocessing.spawn's error report is about
        self._frame: dict[int | None, tuple[str, str]] = {}  # per rank, the traceback's innermost frame and user frame
        self._what: dict[int | None, bool] = {}  # per rank, a C++ exception ("terminate called") waiting for its what()
        self._echo: dict[int | None, bool] = {}  # per rank, the next line echoes a traceback frame's source
        # per rank, a fatal signal's finding whose faulthandler report follows, and the state of reading it: the
        # crashing thread ("Current thread", else the first) and its innermost frame and user frame so far
        self._crash: dict[int | None, dict] = {}
        self._unknown = 0  # unclassified errors found (at most _MAX_UNKNOWN)
        self._recent_unknown: dict[int | None, list[Finding]] = {}  # per rank, its last unknown error lines
        self._report: dict[int | None, tuple[str, float]] = {}  # per rank, the source and second of its last known error
        # per rank, its watchdog timeouts whose failed collective's stack (the flight recorder's) may follow, and
        # where that stack was called from once read; the rank whose stack is being read, and whether the place
        # found is in the person's own code
        self._timeouts: dict[int | None, list[Finding]] = {}
        self._callsite: dict[int | None, str] = {}
        self._fr_rank: tuple[int | None, bool] | None = None

    def feed(self, text: str, rank: int | None, line: int | None = None, source: str = "",
             on_error: Callable[[Exception], None] | None = None, node: str = "") -> list[Finding]:
        """The findings in one line (``node``: the host or pod it came from,
        when known).  An exception inside the matcher (a bug: it must never
        take the monitor down) skips this line only, and is passed to
        ``on_error`` when given."""
        try:
            return self._feed(text, rank, line, source, node)
        except Exception as e:  # noqa: BLE001 (a matcher bug skips this line only, and is reported through on_error)
            if on_error is not None:
                on_error(e)
            return []

    def _fr_frame(self, t: str, rank: int | None) -> bool:
        """A frame of the failed collective's stack that the flight recorder is printing (the rank's own line,
        or one without a rank: the record's next lines have no prefix): where the collective was called from
        goes to the rank's watchdog timeouts, the innermost frame of the person's own code, else the innermost
        outside torch.distributed.  False: the stack has ended."""
        assert self._fr_rank is not None
        who, own = self._fr_rank
        fm = _FR_FRAME.match(t.strip()) if rank is None or rank == who else None
        if fm is None:
            return False
        path = fm.group("file")
        if own or _TORCH_DISTRIBUTED.search(path):
            return True
        mine = not _LIBRARY_PATH.search(path)
        if mine or who not in self._callsite:
            where = _where(path, fm.group("line"), fm.group("fn"))
            self._callsite[who] = where
            for f in self._timeouts.get(who, ()):
                f.detail.where = where
            self._fr_rank = (who, mine)
        return True

    def _feed(self, text, rank, line, source, node=""):
        self._seen += 1
        if rank is None:
            said = split(text).rank
            if said is not None:
                rank = said
            else:
                m = _RANK_IN_MESSAGE.search(text)
                if m:
                    rank = int(m.group("rank"))
        if rank is None and self._spawn_rank is not None:
            rank = self._spawn_rank  # (the traceback torch.multiprocessing.spawn prints for a failed process)
        t = clean(text)[:8192]
        out: list[Finding] = []
        if self._fr_rank is not None:
            if self._fr_frame(t, rank):
                return out
            self._fr_rank = None
        if "Stack trace of the failed collective" in t:
            # (the flight recorder's report of the failed collective, or that it has none: no error of its own)
            if _FR_STACK.search(t):
                self._fr_rank = (rank, False)
            return out
        if "_ranks=" in t or "global_rank_mapping=" in t:
            self.mapping.learn(t, node)  # (which local rank is which global one, as the launcher says)
        if "NCCL WARN" in t:
            w = _NCCL_WARN.search(t)
            if w:
                self._warns.setdefault(rank, []).append((self._seen, line, w.group("what").strip()))
                del self._warns[rank][:-8]
        # torchrun's failure summary: "Root Cause (first observed failure): rank : N ... exitcode : -11"
        if _ROOT_BLOCK.search(t):
            self._block, self._block_rank = "root", None
            return out
        if _FAILURES_BLOCK.match(t):
            self._block, self._block_rank = "failures", None
            return out
        if self._block:
            m = _BLOCK_RANK.match(t)
            if m:
                self._block_rank = int(m.group("rank"))
                return out
            m = _BLOCK_EXIT.match(t)
            if m:
                code = int(m.group("code"))
                r = self._block_rank
                pid = int(m.group("pid")) if m.group("pid") else None
                if code < 0:
                    # (another rank's end in the Failures block: torchrun stopping it, unless by a signal no
                    # launcher sends, such as SIGBUS or SIGSEGV: the same failure on that rank too)
                    stopped = _SIGNAMES.get(-code, "") in _CONSEQUENTIAL_SIGNALS | {"SIGABRT"}
                    out.append(_signal_finding(-code, r, line, t.strip(), source, self._block == "root",
                                               consequence=self._block == "failures" and stopped, who="torchrun",
                                               pid=pid))
                elif code != 0 and self._block == "root":
                    out.append(Finding("rank-exit", r, line, t.strip(),
                                       f"Rank {r} exited with code {code} (the first failure torchrun observed); "
                                       "its own log says why.", (), ENDED, source,
                                       Detail(exit_code=code, root=True, pid=pid or None)))
                elif code != 0 and pid:
                    out.append(Finding("rank-exit", r, line, t.strip(), f"Rank {r} exited with code {code}.", (),
                                       CONSEQUENCE, source, Detail(exit_code=code, pid=pid)))
                return out
            if t.startswith("====="):
                self._block = None
            elif rank is None and self._block_rank is not None:
                rank = self._block_rank  # (a traceback the summary holds: its rank's, from @record's error file)
        m = _AGENT_EXIT.search(t) if "(exitcode: " in t else None
        if m and int(m.group("code")) != 0:
            code, local, pid = int(m.group("code")), int(m.group("local")), int(m.group("pid"))
            g = self.mapping.global_rank(local, node)
            local = g if g is not None else local
            if code < 0:
                out.append(_signal_finding(-code, local, line, t.strip(), source, True, who="torchrun's agent",
                                           pid=pid, summary=False))
            else:
                out.append(Finding("rank-exit", local, line, t.strip(),
                                   f"Local rank {local} exited with code {code} (the first failure torchrun's agent "
                                   "saw); its own log says why.", (), ENDED, source,
                                   Detail(exit_code=code, root=True, pid=pid)))
            return out
        m = _MPI_SIGNAL.search(t) if "noticed that process rank" in t else None
        if m:
            out.append(_signal_finding(int(m.group("num")), int(m.group("rank")), line, t.strip(), source, True,
                                       who="mpirun", pid=int(m.group("pid")) or None))
            return out
        if "Process name: [[" in t:
            m = _MPI_PROCESS.match(t)
            self._mpi_rank = int(m.group("rank")) if m else None
            return out
        if self._mpi_rank is not None and "Exit code:" in t:
            m = _MPI_EXIT.match(t)
            if m and int(m.group("code")) != 0:
                r, code = self._mpi_rank, int(m.group("code"))
                out.append(Finding("rank-exit", r, line, t.strip(),
                                   f"Rank {r} exited with code {code} (the first failure mpirun saw); its own log says "
                                   "why.", (), ENDED, source, Detail(exit_code=code, root=True)))
            self._mpi_rank = None
            return out
        m = _SPAWN.search(t) if "terminated with" in t else None
        if m:
            # torch.multiprocessing.spawn on the first process that failed: its index is its (local) rank
            r = int(m.group("rank"))
            if m.group("sig"):
                num = next((n for n, name in _SIGNAMES.items() if name == m.group("sig")), 0)
                out.append(_signal_finding(num, r, line, t.strip(), source, True, who="torch.multiprocessing.spawn"))
            elif m.group("code") and int(m.group("code")) != 0:
                out.append(Finding("rank-exit", r, line, t.strip(),
                                   f"Process {r} exited with code {m.group('code')} (the first failure "
                                   "torch.multiprocessing.spawn saw); its own traceback says why.", (), ENDED, source,
                                   Detail(exit_code=int(m.group("code")), root=True)))
            elif m.group("error"):
                self._spawn_rank = r  # (the traceback spawn prints next is that process's)
            return out
        m = _OUTSIDE_STOP.search(t) if (" death signal" in t or "got signal: " in t) else None
        if m:
            out.append(_outside_stop(m, rank, line, t.strip(), source))
            return out
        m = _SIGNAL.search(t) or (_UCX_SIGNAL.search(t) if "Caught signal" in t or "Signal: " in t else None)
        if m and not self._block:
            num = int(m.group("num") or m.group("ompi"))
            name = m.group("name") if "name" in m.groupdict() and m.group("name") else _SIGNAMES.get(num, f"signal {num}")
            level = CONSEQUENCE if name in _CONSEQUENTIAL_SIGNALS else CAUSE
            out.append(Finding("rank-signal", rank, line, t.strip(), f"A rank was killed by {name}." + _signal_words(name),
                               _signal_profiles(name) if level == CAUSE else (), level, source,
                               Detail(signal=name, signum=num)))
        m = _FATAL.search(t.strip()) if ("Fatal Python" in t or "core dumped" in t or ": line " in t or
                                         "srun: error" in t or t.strip() in _FATAL_SIGNALS) else None
        if m:
            num, name = _FATAL_SIGNALS[m.group("what") or m.group("shell") or m.group("dumped") or m.group("srun")]
            if m.group("task") and rank is None:
                rank = int(m.group("task"))
            f = Finding("rank-signal", rank, line, t.strip(),
                        f"{'Rank ' + str(rank) if rank is not None else 'A process'} died of {name} "
                        f"({'SLURM said so' if m.group('srun') else 'its own last words: faulthandler or the shell'})."
                        + _signal_words(name),
                        _signal_profiles(name), CAUSE, source, Detail(signal=name, signum=num))
            out.append(f)
            if m.group("what"):  # (faulthandler's threads follow: where it crashed)
                self._crash[rank] = {"f": f, "block": 0, "current": False, "first": ("", ""), "cur": ("", "")}
        elif rank in self._crash and self._crash_frame(rank, t.strip()):
            return out
        m = _LAUNCHER_EXIT.search(t) if "exits with return code" in t else None
        if m and int(m.group("code")) != 0:
            lr = _LOCAL_RANK_ARG.search(t)
            r = int(lr.group("rank")) if lr else rank
            if lr:
                g = self.mapping.global_rank(r, node)
                r = g if g is not None else r
            code = int(m.group("code"))
            if code < 0:
                out.append(_signal_finding(-code, r, line, t.strip(), source, True, who="the launcher"))
            else:
                out.append(Finding("rank-exit", r, line, t.strip(),
                                   f"Rank {r} exited with code {code} (the first failure the launcher saw); its own "
                                   "log says why.", (), ENDED, source, Detail(exit_code=code, root=True)))
        for i in sorted(ALWAYS | {i for h, i in HINTS if h in t}):  # in catalogue order
            sig = CATALOG[i]
            m = sig.search(t)
            if m:
                matched = {k: v for k, v in m.groupdict().items() if v is not None}
                level = sig.level
                for k in ("seq_w", "seq_x"):
                    if k in matched:
                        matched["seq"] = matched.pop(k)  # (the watchdog's timeout, said by its counters alone)
                damaged = ""
                if "op" in matched and sig.id == "nccl-watchdog-timeout" and not matched.pop("op_end", None):
                    # (an operation name a terminal or a paste cut or garbled, "_ALLGATHER_BA[451/1919]": unknown,
                    # never a different collective)
                    damaged = matched.pop("op")
                if sig.id == "scheduler-stopped" and not matched.get("why"):
                    level = ENDED  # (a stop that gives no reason says how the job ended; a reason beside it is the cause)
                if sig.id == "nccl-ib-async-event" and BENIGN_IB_EVENT.search(matched.get("event", "")):
                    level = INFO  # (a port coming back)
                pid = matched.pop("pid", None)
                detail = Detail(signal=matched.pop("signal", ""), pid=int(pid) if pid and pid.isdigit() else None,
                                op_damaged=damaged, matched=matched)
                if sig.id == "disk-full" and rank in self._frame:
                    # (a full device under a traceback: where it was written says which, and is its where)
                    anyf, userf = self._frame[rank]
                    if _SHM_WRITERS.match(anyf):
                        sig = _BY_ID["shm-exhausted"]  # (a semaphore, a shared tensor: /dev/shm)
                    detail.where = userf or anyf
                f = Finding(sig.id, rank, line, t.strip(), sig.explanation, sig.profiles, level, source, detail)
                if sig.id in EXPLAINED_BY_WARNINGS:
                    f = self._explained(f, t, m.start())
                if sig.id == "nccl-watchdog-timeout":
                    f.detail.where = self._callsite.get(rank, "")  # (its stack, read with an earlier timeout line)
                    self._timeouts.setdefault(rank, []).append(f)
                    del self._timeouts[rank][:-8]
                out.append(f)
        s = t.strip()
        fm = _TB_FRAME.match(s)
        if fm:
            # a traceback's frame: the innermost one (and the innermost of the user's own code) so far
            path, n, fn = fm.group("file"), fm.group("line"), fm.group("fn")
            where = _where(path, n, fn)
            anyf, userf = self._frame.get(rank, ("", ""))
            self._frame[rank] = (where, where if not _LIBRARY_PATH.search(path) else userf)
            self._echo[rank] = True  # (the next line is the frame's source, echoed: not an error of its own)
            return out
        echo = self._echo.pop(rank, False)
        m = _EXCEPTION.match(s) or (_BARE_EXCEPTION.match(s) if rank in self._frame else None)
        if m and not out and not _CASCADE_EXC.match(s):
            # (an exception whose message a signature already reads, a lost peer included, is that finding)
            # one that says a wait ran out is a timeout (another rank did not come); a stop from outside is
            # a consequence
            level = (CONSEQUENCE if _STOPPED_EXC.match(s) else
                     TIMEOUT if _TIMEOUT_EXC.search(s[:300]) else GENERIC)
            who = f"Rank {rank}" if rank is not None else "A process (rank unknown)"
            msg = m.groupdict().get("msg") or ""
            anyf, userf = self._frame.pop(rank, ("", ""))
            detail = Detail(type=m.group("type"), where=userf or anyf)
            for u in self._recent_unknown.pop(rank, []):
                if line is None or u.line is None or line - u.line <= _SUPERSEDE_LINES:
                    u.detail.superseded_by = line  # (the traceback's own words say what the error line did not)
            out.append(Finding("python-exception", rank, line, s,
                               f"{who} raised {m.group('type')}" + (f": {msg[:200]}" if msg else "") +
                               (f", at {detail.where}" if detail.where else ""),
                               (), level, source, detail))
        elif m:
            self._frame.pop(rank, None)
        if "terminate called after throwing" in s and "what():" not in s:
            self._what[rank] = True  # (its what(), on the next line, is the error's text)
            return out
        record = _record(s)
        if record is not None:
            if out and any(f.level < INFO for f in out):
                self._report[rank] = record
            elif not out and _same_report(self._report.get(rank), record):
                return out  # (the rest of a known error's report, in records of its own: said by that finding)
        if not out and not m and not echo and not self._block and _looks_like_error(s):
            # an error no signature knows: its own words are the finding (the root when nothing known came first)
            what = self._what.pop(rank, False) or s.lstrip().startswith("what():")
            if self._unknown < _MAX_UNKNOWN:
                self._unknown += 1
                u = Finding("unclassified-error", rank, line, s,
                            "An error no signature of ddptop's knows" + (" (a C++ exception's what())" if what
                                                                        else "") + ": its own words say what failed.",
                            (), GENERIC, source, Detail(unknown=True))
                out.append(u)
                self._recent_unknown.setdefault(rank, []).append(u)
                del self._recent_unknown[rank][:-8]
        return out


    def _crash_frame(self, rank: int | None, s: str) -> bool:
        """A line of the faulthandler report after a fatal signal on ``rank``: the crashing thread's frames (its
        current thread's, else the first thread's) give the finding its ``where``: the innermost frame, and the
        user's own innermost when it is another.  True for a line of the report (read here); the report ends at
        any other non-blank line."""
        st = self._crash[rank]
        head = FH_THREAD.match(s)
        if head:
            st["block"] += 1
            st["current"] = head.group("kind") == "Current thread"
            return True
        fm = FH_FRAME.match(s)
        if fm:
            key = "cur" if st["current"] else "first" if st["block"] == 1 else ""
            if key:
                where = _where(fm.group("file"), fm.group("line"), fm.group("fn"))
                inner, user = st[key]
                st[key] = (inner or where, user or ("" if _LIBRARY_PATH.search(fm.group("file")) else where))
                inner, user = st["cur"] if st["cur"][0] else st["first"]
                st["f"].detail.where = inner + (f", called from {user}" if user and user != inner else "")
            return True
        if not s or s in ("...", "<no Python frame>"):
            return True
        del self._crash[rank]
        return False

    def _explained(self, f: Finding, t: str, at: int) -> Finding:
        """``f`` (an NCCL error) with the NCCL warnings that came just before it
        on its rank (or on its own line, in a flattened paste; ``at``: where the
        error's text starts in ``t``): they say why, and choose the profile to
        try first."""
        # its rank's own warnings, and those no rank is known for (NCCL's "host:pid:tid [gpu]" lines outside a
        # rank's file): the ones just before it
        mine = self._warns.get(f.rank, []) + (self._warns.get(None, []) if f.rank is not None else [])
        own = _NCCL_WARN.search(t)
        if own is not None and at >= own.start():
            return f  # (the finding is an NCCL warning itself, such as an IB completion error: its own reason)
        recent = [(n, txt) for seen, n, txt in sorted(mine) if self._seen - seen <= _WARN_WINDOW]
        if own:
            recent.append((f.line, own.group("what").strip()))  # (a flattened paste: the warning on its line)
        if not recent:
            return f
        reason = next((r for _n, txt in reversed(recent) for r in NCCL_REASONS if r.pattern.search(txt)), None)
        why = tuple(Explained(n, txt[:300]) for n, txt in recent[-3:])
        explanation = f.explanation
        profiles = f.suggested_profiles
        if reason is not None:
            explanation = f"{reason.words} {explanation}"
            profiles = (reason.profile,) + tuple(p for p in profiles if p != reason.profile)
        return Finding(f.signature, f.rank, f.line, f.text, explanation, profiles, f.level, f.source,
                       replace(f.detail, explained_by=why, reason=reason.id if reason else ""))


def _outside_stop(m: re.Match, rank: int | None, line: int | None, text: str, source: str) -> Finding:
    """torchrun's agent (or a process) stopped by a signal from outside the job."""
    if m.group("name"):
        n = m.group("name")
        name = n if n.startswith("SIG") else _SIGNAMES.get(int(n), f"signal {n}")
    else:
        name = _SIGNAMES.get(int(m.group("num")), f"signal {m.group('num')}")
    why = {
        "SIGHUP": "the terminal or ssh session it ran in closed (a dropped connection, a closed laptop). Run the "
                  "job under nohup, tmux or screen, or as a scheduler job, so that it outlives the session",
        "SIGINT": "Ctrl-C (or a SIGINT from a script)",
        "SIGTERM": "a scheduler (its time limit, preemption, scancel), Kubernetes (an evicted or deleted pod), a "
                   "container runtime, or a person's kill; the scheduler's own log says which",
    }.get(name, "a person or another program")
    return Finding("outside-stop", rank, line, text,
                   f"The job was stopped from outside: torchrun's agent received {name}, which means {why}. No rank "
                   "failed on its own: the ranks' errors after this line are the stop's consequences.",
                   (), CAUSE, source, Detail(signal=name))


# what a fatal signal most often means for a training rank, in words, and the profiles to try
_SIGNAL_WORDS = {
    "SIGBUS": (" A bus error: in a container this is most often shared memory (/dev/shm, 64 MB by default in "
               "Docker) running out under the data loader's workers or NCCL's shared-memory transport: give the "
               "container more (--shm-size, a memory-backed emptyDir on Kubernetes) or use fewer workers. Else a "
               "memory-mapped file that shrank or became unreachable under the reader (an LMDB or numpy memmap "
               "dataset, a checkpoint on a network file system): the frames under the signal name the reader.",
               ("shm-off", "fewer-workers")),
    "SIGSEGV": (" A segmentation fault in native code: a CUDA, NCCL or C extension library, or a driver. If it runs "
                "on one GPU or on gloo, the multi-GPU path (NCCL, P2P) is the suspect.", RANK_SIGNAL_PROFILES),
}


def _signal_words(name: str) -> str:
    return _SIGNAL_WORDS.get(name, ("", ()))[0]


def _signal_profiles(name: str) -> tuple[str, ...]:
    return _SIGNAL_WORDS.get(name, ("", RANK_SIGNAL_PROFILES))[1] or RANK_SIGNAL_PROFILES


def _signal_finding(num: int, rank: int | None, line: int | None, text: str, source: str, root: bool, *,
                    consequence: bool = False, who: str = "torchrun", pid: int | None = None,
                    summary: bool = True) -> Finding:
    """A rank ended by signal ``num``, as its launcher reports it.  The first failure the launcher saw
    (``root``) is a cause, unless it is a stop from outside (SIGTERM, SIGINT); a SIGKILL there is most
    often the kernel's OOM killer.  Later failures are the launcher stopping the rest."""
    name = _SIGNAMES.get(num, f"signal {num}")
    if consequence or (name in _CONSEQUENTIAL_SIGNALS and not (root and name == "SIGKILL")):
        level = CONSEQUENCE
    elif name == "SIGKILL":
        level = ENDED
    else:
        level = CAUSE
    said = f"Rank {rank} was killed by {name}" + (f" (the first failure {who} observed)" if root else "")
    if name == "SIGKILL" and level != CONSEQUENCE:
        said += ("; with nothing in its own log, that is most often the kernel's OOM killer (host memory, not GPU "
                 "memory), else the scheduler or a person. To confirm: the kernel log on its node (`dmesg -T | grep -i "
                 "'killed process'` or `journalctl -k`), the job's memory (`sacct -j JOB -o MaxRSS` on SLURM, a "
                 "container's OOMKilled status); the usual fix is fewer data-loader workers or a smaller "
                 "prefetch_factor")
    if level == CAUSE:
        said += "." + _signal_words(name)
    return Finding("rank-signal", rank, line, text, said if said.endswith(".") else said + ".",
                   _signal_profiles(name) if level == CAUSE else ("fewer-workers",) if name == "SIGKILL" else (),
                   level, source, Detail(signal=name, signum=num, root=root, pid=pid or None, summary=summary))


def failure_summary(lines) -> dict[int, int]:
    """Global rank -> exit code, from torchrun's failure summary ("Root Cause
    (first observed failure)" and "Failures" blocks: ``rank : N (local_rank: L)``
    then ``exitcode : C (pid: P)``).  Ranks it does not name are not in it."""
    codes: dict[int, int] = {}
    block, rank = False, None
    for raw in lines:
        t = clean(raw)
        if _ROOT_BLOCK.search(t) or _FAILURES_BLOCK.match(t):
            block, rank = True, None
            continue
        if not block:
            continue
        if t.startswith("====="):
            block = False
            continue
        m = _BLOCK_RANK.match(t)
        if m:
            rank = int(m.group("rank"))
            continue
        m = _BLOCK_EXIT.match(t)
        if m and rank is not None:
            codes.setdefault(rank, int(m.group("code")))
            rank = None
    return codes
