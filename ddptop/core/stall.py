"""The stall detector: pure code fed progress and telemetry, with an injected clock.

Per rank it learns the expected step interval online (median of recent
intervals).  A rank is stalled after no progress for::

    max(min_silence, min(k * expected, expected + slack))

(so a hang alarms within ``slack`` seconds of the step that should have come),
or ``first_step_grace`` before the first step (model load, compilation), or
``stall_after`` when the person set it.  Other progress (an eval bar, a
checkpoint line) counts as life and holds the alarm off.  The job is stalled
when every rank that reports progress is stalled; then the stall is classified
with telemetry (hot: GPUs busy with no progress, the NCCL hang signature;
idle; CPU-bound) and the odd rank out is named, with the evidence.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

HOT_UTIL = 40.0  # % GPU utilisation that counts as "busy" (an NCCL spin reads ~100, idle ~0)
IDLE_UTIL = 15.0
BUSY_CPU = 85.0
CHILDREN_WORK_CPU = 20.0  # % CPU a rank's child processes use that counts as work (gzip, data-loader workers)


@dataclass
class RankState:
    rank: int
    step: int | None = None
    steps_seen: int = 0
    last_progress: float | None = None  # clock time of the last training step
    last_other: float | None = None  # last eval/checkpoint progress
    last_output: float | None = None
    intervals: deque = field(default_factory=lambda: deque(maxlen=64))  # (t, steps_seen)
    # times at which new training progress arrived (one per read that brought any): a job that prints
    # "step 100" every 16 s has 0.16 s steps but must be judged by its 16 s between lines
    arrivals: deque = field(default_factory=lambda: deque(maxlen=64))
    phase: str = ""  # train | eval | save, from the hook (empty: not known)
    batches: int | None = None  # batches drawn from data loaders (the hook)
    last_batch: float | None = None
    batch_intervals: dict = field(default_factory=dict)  # phase -> deque of (t, batches)
    watched: int | None = None  # stack movements seen by the stack watch (jobs ddptop did not launch)
    util: float | None = None  # its GPU's utilisation
    cpu: float | None = None
    children_cpu: float | None = None
    status: str = ""
    alive: bool = True
    exit_code: int | None = None

    def expected(self) -> float | None:
        """Seconds per step, over the recent window (what the alarm says).

        From (time, steps) pairs rather than single intervals, so lines that
        arrive in batches (one read, one timestamp) still give the true rate;
        the median step of the arrivals, so a pause (an evaluation) in the
        window does not stretch it.
        """
        if len(self.intervals) < 2:
            return None
        (t0, n0), (t1, n1) = self.intervals[0], self.intervals[-1]
        if n1 - n0 < 3 or t1 <= t0:
            return None
        per: list[float] = []
        prev = self.intervals[0]
        for cur in list(self.intervals)[1:]:
            if cur[0] > prev[0] and cur[1] > prev[1]:
                per.append((cur[0] - prev[0]) / (cur[1] - prev[1]))
                prev = cur
        return statistics.median(per) if len(per) >= 3 else (t1 - t0) / (n1 - n0)

    def arrival_gap(self) -> float | None:
        """The usual seconds between two arrivals of training progress (the
        median: a pause, an evaluation, does not stretch it), or None while
        too few have come."""
        if len(self.arrivals) < 4:
            return None
        a = list(self.arrivals)
        return statistics.median(b - x for x, b in zip(a, a[1:]))


    def batch_expected(self, phase: str) -> float | None:
        """Seconds per batch drawn in ``phase``, over the recent window."""
        win = self.batch_intervals.get(phase)
        if not win or len(win) < 2:
            return None
        (t0, n0), (t1, n1) = win[0], win[-1]
        if n1 - n0 < 3 or t1 <= t0:
            return None
        return (t1 - t0) / (n1 - n0)


@dataclass(frozen=True)
class Stall:
    kind: str  # mismatch | hot | collective | idle | cpu-bound | unknown
    ranks: tuple[int, ...]
    culprits: tuple[int, ...]
    silent_for: float  # seconds since the job's last progress
    expected: float | None  # the job's learned step interval
    evidence: tuple[str, ...]
    message: str
    suggested_profiles: tuple[str, ...]
    where: dict = field(default_factory=dict)  # culprit rank (str) -> where its stack is stuck


@dataclass(frozen=True)
class StackVerdict:
    """What stack samples taken at ``t`` said (see ``StacksEvent``)."""

    t: float
    hung: bool | None
    culprits: tuple[int, ...] = ()
    summary: str = ""
    where: dict = field(default_factory=dict)
    error: str = ""
    io: tuple[int, ...] = ()  # ranks in I/O in every sample (hung False): work, for ``io_patience``
    node: str = ""  # whose ranks were sampled (each node of a multi-node job samples its own)
    # ranks frozen in a collective or backward in every sample, or spinning on one line while the
    # culprits are frozen (polling for them): their CPU use is waiting, not work of their own
    waiting: tuple[int, ...] = ()
    # every rank frozen waiting in a collective, in two or more different ones (or call sites)
    mismatch: bool = False


def _ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]} waits" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} wait"


def _said(v: StackVerdict) -> str:
    text = v.summary.split(": ", 1)[1] if v.summary.startswith("hung") and ": " in v.summary else v.summary
    return f"{text} (on {v.node})" if v.node else text


def combine(verdicts: list[StackVerdict]) -> StackVerdict | None:
    """One verdict from the latest of each node: any node's ranks hung means the
    job hangs (their culprits named); work only when every node says work."""
    if not verdicts:
        return None
    if len(verdicts) == 1:
        return verdicts[0]
    t = max(v.t for v in verdicts)
    hung = [v for v in verdicts if v.hung is True]
    if hung:
        where: dict = {}
        for v in hung:
            where.update(v.where)
        return StackVerdict(t, True, tuple(sorted({r for v in hung for r in v.culprits})),
                            "hung: " + "; ".join(_said(v) for v in hung if v.summary),
                            where, "; ".join(v.error for v in verdicts if v.error),
                            waiting=tuple(sorted({r for v in verdicts for r in v.waiting})),
                            mismatch=any(v.mismatch for v in hung) and not any(v.culprits for v in hung))
    unknown = [v for v in verdicts if v.hung is None]
    if unknown and len(unknown) == len(verdicts):
        return StackVerdict(t, None, (), "", {}, "; ".join(v.error for v in unknown if v.error))
    work = [v for v in verdicts if v.hung is False]
    return StackVerdict(t, False, (), "; ".join(v.summary for v in work if v.summary), {},
                        "; ".join(v.error for v in verdicts if v.error), tuple(sorted({r for v in work for r in v.io})))


class StallDetector:
    def __init__(self, clock, *, min_silence: float = 10.0, k: float = 3.0, slack: float = 12.0,
                 first_step_grace: float = 120.0, stall_after: float | None = None, start: float | None = None,
                 io_patience: float = 600.0, watch_patience: float = 30.0, work_patience: float = 300.0):
        self.clock = clock
        self.min_silence = min_silence
        self.k = k
        self.slack = slack
        self.first_step_grace = first_step_grace
        self.stall_after = stall_after
        self.started = clock() if start is None else start
        self.ranks: dict[int, RankState] = {}
        self.active: Stall | None = None  # the stall being reported, until progress resumes
        self.telemetry_real = False  # util values come from a real or asked-for source
        self.verdict: StackVerdict | None = None  # the latest stack samples' verdict (every node's, combined)
        self._verdicts: dict[str, StackVerdict] = {}  # node -> its latest
        self.stacks_pending = False  # stack samples were asked for and have not arrived yet
        # what NCCL's RAS port said last: (t, culprits, text); NCCL's own view of who is behind
        self.ras: tuple[float, tuple[int, ...], str] | None = None
        self.suspect_at = 0.5  # of the threshold: when to ask for stack samples
        self.io_patience = io_patience  # how long ranks seen in I/O (a checkpoint write) count as work
        # how long ranks that visibly work while the others wait for them (their stacks move, their
        # children use the CPU) count as work, not as the culprits of a hang
        self.work_patience = work_patience
        # a rank with no step seen yet but watched by stack samples: frozen this long is a suspect
        # (instead of the first-step grace, which is for a job starting up unseen)
        self.watch_patience = watch_patience

    def rank(self, r: int) -> RankState:
        st = self.ranks.get(r)
        if st is None:
            st = self.ranks[r] = RankState(r)
        return st

    # -- feeding --------------------------------------------------------------

    def step(self, rank: int, step: int | None, t: float | None = None) -> None:
        """A training step (``step`` None: progress without a number)."""
        t = self.clock() if t is None else t
        st = self.rank(rank)
        if step is not None and st.step is not None and step <= st.step and step != 0:
            # the same step printed again (several log lines per step): not progress
            if step == st.step:
                return
        st.last_progress = t
        # several steps may arrive at once (a hook file read once per poll)
        jump = step - st.step if step is not None and st.step is not None and step > st.step else 1
        st.steps_seen += min(jump, 1_000_000)
        st.intervals.append((t, st.steps_seen))
        if not st.arrivals or t > st.arrivals[-1]:
            st.arrivals.append(t)
        if step is not None:
            st.step = step

    def batch(self, rank: int, count: int, t: float, phase: str = "") -> None:
        """``count`` batches drawn so far (any data loader) and the model's phase:
        a rank drawing batches, evaluating or saving is alive."""
        st = self.rank(rank)
        if st.batches is not None and count < st.batches:
            st.batch_intervals.clear()  # a restarted process counts from 0 again
        moved = st.batches is None or count != st.batches
        if phase and phase != st.phase:
            st.phase = phase
            moved = True  # a phase change is life too
        st.batches = count
        if moved:
            st.last_batch = t
            st.last_other = t if st.last_other is None else max(st.last_other, t)
            win = st.batch_intervals.setdefault(st.phase, deque(maxlen=64))
            win.append((t, count))

    def watch(self, rank: int, moves: int, t: float) -> None:
        """A stack sample of a rank (no hook): ``moves`` counts the samples that
        differed from the one before; a count that grew is life."""
        st = self.rank(rank)
        if st.watched is not None and moves > st.watched:
            st.last_other = t if st.last_other is None else max(st.last_other, t)
        st.watched = moves

    def other_progress(self, rank: int, t: float | None = None) -> None:
        self.rank(rank).last_other = self.clock() if t is None else t

    def output(self, rank: int, t: float | None = None) -> None:
        self.rank(rank).last_output = self.clock() if t is None else t

    def telemetry(self, rank: int, *, util=None, cpu=None, children_cpu=None, status=None) -> None:
        st = self.rank(rank)
        if util is not None:
            st.util = util
        if cpu is not None:
            st.cpu = cpu
        if children_cpu is not None:
            st.children_cpu = children_cpu
        if status is not None:
            st.status = status

    def stacks(self, verdict: StackVerdict) -> None:
        """Stack samples of every rank and what they say (fed as an event, on the caller's clock)."""
        self._verdicts[verdict.node] = verdict
        began = self.silence_began()
        self.verdict = combine([v for v in self._verdicts.values() if v.t >= began] or [verdict])
        self.stacks_pending = False

    def ras_said(self, t: float, culprits: tuple[int, ...], text: str) -> None:
        """What NCCL's RAS port said at ``t`` (see ``RasEvent``)."""
        self.ras = (t, tuple(culprits), text)

    def rank_ended(self, rank: int, exit_code: int | None = None) -> None:
        st = self.rank(rank)
        st.alive = False
        st.exit_code = exit_code

    # -- judging --------------------------------------------------------------

    def threshold(self, st: RankState) -> float:
        if self.stall_after is not None:
            return self.stall_after
        if st.phase in ("eval", "save") and st.last_batch is not None and (
                st.last_progress is None or st.last_batch >= st.last_progress):
            # evaluating (or saving) since the last training step: judged by its own rate
            e = st.batch_expected(st.phase)
            if st.phase == "save" or e is None:
                return max(self.min_silence, 3 * self.min_silence, self.threshold_train(st))
            return max(self.min_silence, min(self.k * e, e + self.slack))
        return self.threshold_train(st)

    def threshold_train(self, st: RankState) -> float:
        if st.last_progress is None:
            return self.watch_patience if st.watched is not None else self.first_step_grace
        # (judged by the time between arrivals of progress, which a job that logs every N steps
        # stretches, never by the time per step)
        e = st.arrival_gap()
        if e is None:
            return max(self.min_silence, 3 * self.min_silence)  # learning: be patient
        return max(self.min_silence, min(self.k * e, e + self.slack))

    def _last_sign(self, st: RankState) -> float:
        last = max(x for x in (st.last_progress, st.last_other, self.started) if x is not None)
        if st.last_progress is None and st.last_output is not None and st.batches is None and st.watched is None:
            # no progress recognised in its output, no hook, no stack watch: its output is its only sign of life
            last = max(last, st.last_output)
        return last

    def _silent(self, st: RankState, now: float) -> float:
        return now - self._last_sign(st)

    def _silent_pool(self, pool: list[RankState], now: float) -> float:
        return min(self._silent(st, now) for st in pool)

    def _pool(self) -> list[RankState]:
        judged = [st for st in self.ranks.values() if st.alive and (st.steps_seen or st.last_progress is None)]
        with_progress = [st for st in judged if st.steps_seen]
        return with_progress or judged

    def suspect(self, now: float | None = None) -> bool:
        """Every rank has been silent for more than ``suspect_at`` of its threshold
        (and no stall is being reported): the time to sample stacks."""
        now = self.clock() if now is None else now
        pool = self._pool()
        if not pool or self.active is not None:
            return False
        late = [self._silent(st, now) > self.suspect_at * self.threshold(st) for st in pool]
        # (ranks watched by their stacks: one going quiet while others move is worth a look)
        return all(late) or any(x and st.watched is not None for x, st in zip(late, pool))

    def silence_began(self) -> float:
        """When the current silence began: the latest sign of life of any judged rank."""
        pool = self._pool()
        if not pool:
            return self.started
        return max(self._last_sign(st) for st in pool)

    def check(self, now: float | None = None) -> Stall | None:
        """A new stall, once per episode; None otherwise (and while it lasts).

        Stacks confirm: samples taken during this silence in which every rank
        moves mean work (no alarm, however long); samples still on their way
        hold the alarm until they come (the caller bounds that wait)."""
        now = self.clock() if now is None else now
        pool = self._pool()
        if not pool:
            return None
        stalled = [st for st in pool if self._silent(st, now) > self.threshold(st)]
        v_now = self.verdict if self.verdict is not None and self.verdict.t >= self.silence_began() else None
        if (len(stalled) < len(pool) and v_now is not None and v_now.hung and v_now.culprits and v_now.waiting
                and all(st.last_progress is None and st.watched is None for st in pool)
                and not self._working(v_now, pool)):
            # no step known yet (starting up, or a log whose progress ddptop cannot read): the long grace
            # is for a start that takes time; stacks that show ranks waiting in a collective for frozen
            # ones, taken this far into the silence, are a hang now
            stalled = list(pool)
        if self.active is not None:
            if any(self._silent(self.ranks[r], now) < self.threshold(self.ranks[r]) for r in self.active.ranks
                   if r in self.ranks):
                self.active = None  # progress resumed
            return None
        if len(stalled) < len(pool):
            partial = self._partial(pool, stalled, now)
            if partial is not None:
                self.active = partial
            return partial
        v = v_now
        if v is not None and v.hung is False:
            if not (v.io and self._silent_pool(pool, now) > max(self.io_patience, *(self.threshold(st) for st in pool))):
                return None  # every rank's stack moves (or writes): work (a long evaluation, a save), not a hang
            # in I/O for too long: a file system that hangs (NFS) is a hang too; those ranks are the culprits
            v = StackVerdict(v.t, True, v.io, f"{v.summary}; still in I/O after {self._silent_pool(pool, now):.0f} s",
                             v.where, v.error, v.io)
        if v is not None and v.hung:
            working = self._working(v, pool)
            if working:
                silent = self._silent_pool(pool, now)
                if silent <= max(self.work_patience, *(self.threshold(st) for st in pool)):
                    return None  # the others wait for ranks that visibly work (an evaluation, a save on rank 0)
                v = StackVerdict(v.t, True, v.culprits, f"{v.summary}; {working} still working after {silent:.0f} s "
                                 "(a loop in its own code, or work longer than ddptop's patience)",
                                 v.where, v.error, v.io, v.node, v.waiting)
        if v is None and self.stacks_pending:
            return None
        self.active = self._describe(pool, now, v)
        return self.active

    def _working(self, v: StackVerdict, pool: list[RankState]) -> str:
        """Who, in a hung verdict, is visibly working rather than stuck ("" if
        nobody): culprits whose stacks move or spin outside any collective (rank
        0 evaluating, archiving, uploading while the others wait in a barrier),
        or frozen on a child process that works (``subprocess.run(["gzip",
        ...])``); with no culprit, every rank waiting on children that work
        (data-loader workers starting up)."""
        def status(r: int) -> str:
            w = v.where.get(r) or v.where.get(str(r)) or {}
            return str(w.get("status", "")) if isinstance(w, dict) else ""

        def children_busy(r: int) -> bool:
            st = self.ranks.get(r)
            return st is not None and (st.children_cpu or 0) >= CHILDREN_WORK_CPU

        if v.culprits:
            if all(status(r) in ("moving", "busy") or children_busy(r) for r in v.culprits):
                rs = sorted(v.culprits)
                return f"rank {rs[0]} is" if len(rs) == 1 else f"ranks {', '.join(map(str, rs))} are"
            return ""
        if pool and all(children_busy(st.rank) for st in pool):
            return "their child processes (data-loader workers?) are"
        return ""

    def _partial(self, pool: list[RankState], stalled: list[RankState], now: float) -> Stall | None:
        """Some ranks frozen, the others' only sign of life their moving stacks
        (a job ddptop did not launch): a hang when stack samples taken since
        the frozen ranks went quiet say so (frozen in a collective while the
        others move: the movers are the culprits)."""
        if not stalled or any(st.watched is None for st in pool if st not in stalled):
            return None
        began = max(self._last_sign(st) for st in stalled)
        v = self.verdict
        if v is None or v.t < began or v.hung is not True:
            return None
        return self._describe(stalled, now, v)

    def _describe(self, pool: list[RankState], now: float, v: StackVerdict | None = None) -> Stall:
        everyone = sorted(self.ranks.values(), key=lambda s: s.rank)
        silent = min(self._silent(st, now) for st in pool)
        exp = [st.expected() for st in pool if st.expected() is not None]
        expected = statistics.median(exp) if exp else None
        evidence: list[str] = []
        culprits: list[int] = []
        # 1. a dead, zombie or disk-waiting rank
        for st in everyone:
            if not st.alive or st.status in ("zombie", "dead"):
                culprits.append(st.rank)
                evidence.append(f"rank {st.rank} is {'dead' if not st.alive else st.status}")
            elif st.status == "disk-sleep":
                culprits.append(st.rank)
                evidence.append(f"rank {st.rank} is in disk wait (D state)")
        # 2. a rank whose step count is behind the others
        steps = {st.rank: st.step for st in everyone if st.step is not None}
        if not culprits and len(steps) >= 2 and len(set(steps.values())) > 1:
            top = max(steps.values())
            behind = [r for r, s in steps.items() if s < top]
            if len(behind) < len(steps) / 2 or len(behind) == 1:
                culprits += behind
                evidence += [f"rank {r} is at step {steps[r]}, the others at {top}" for r in behind]
        # 3. a rank whose GPU is idle while the others are hot
        utils = {st.rank: st.util for st in everyone if st.util is not None and st.alive}
        hot = [r for r, u in utils.items() if u >= HOT_UTIL]
        idle = [r for r, u in utils.items() if u <= IDLE_UTIL]
        if not culprits and hot and idle and len(idle) < len(utils):
            culprits += idle
            others = (f"rank {hot[0]} is" if len(hot) == 1 else f"ranks {', '.join(map(str, hot))} are")
            evidence += [f"rank {r}'s GPU is idle ({utils[r]:.0f}%) while {others} busy "
                         f"({min(utils[h] for h in hot):.0f}%)" for r in idle]
        # 4. the stacks: the rank(s) outside the collective the others wait in, or moving while they are frozen
        where: dict = {}
        if v is not None and v.hung and v.culprits:
            culprits = list(v.culprits)
            where = dict(v.where)
        elif v is not None and v.hung and v.mismatch:
            where = dict(v.where)  # (where each rank waits, in its own collective)
        if v is not None and v.summary and not v.hung:
            # (a hung verdict is said in the message itself)
            evidence.insert(0, f"stacks (unclear): {v.summary}")
        elif v is not None and v.error:
            evidence.append(f"no stacks: {v.error}")
        # 5. NCCL's own view (RAS): who launched fewer collectives, who is missing or dead
        ras = self.ras if self.ras is not None and self.ras[0] >= self.silence_began() and self.ras[2] else None
        if ras is not None:
            if ras[1]:
                if set(ras[1]) != set(culprits):
                    where = {r: w for r, w in where.items() if r in ras[1]}
                culprits = list(ras[1])
            # (what RAS said is in the message itself)
        # classification
        # (a rank waiting in a collective may spin a core polling for its peers: that is not CPU-bound work)
        waiting = set(v.waiting) if v is not None and v.hung else set()
        cpu_bound = [st.rank for st in everyone if (st.cpu or 0) + (st.children_cpu or 0) >= BUSY_CPU
                     and (st.util is None or st.util <= IDLE_UTIL) and st.rank not in waiting]
        in_collective = bool(v is not None and v.hung and v.culprits and waiting - set(v.culprits))
        if v is not None and v.hung and v.mismatch and not culprits:
            kind = "mismatch"
        elif utils and len(hot) >= max(1, len(utils) - len(culprits)) and hot:
            kind = "hot"
            evidence.append(f"GPU utilisation {', '.join(f'r{r} {utils[r]:.0f}%' for r in sorted(utils))} with no step progress")
        elif in_collective:
            kind = "collective"
            who = sorted(set(culprits))
            evidence.append(f"{_ranks_text(sorted(waiting - set(culprits)))} for "
                            f"{'rank' if len(who) == 1 else 'ranks'} {', '.join(map(str, who))} (stacks)")
        elif utils and len(idle) == len(utils) and not cpu_bound:
            kind = "idle"
            evidence.append("GPUs and CPUs idle: a deadlock, a dead data loader, or waiting on I/O")
        elif cpu_bound:
            kind = "cpu-bound"
            evidence.append(f"ranks {', '.join(map(str, cpu_bound))} (or their workers) peg the CPU")
        else:
            kind = "unknown"
        if all(st.last_progress is None for st in pool):
            seen = any(st.last_output is not None for st in pool)
            last = (f"{silent:.0f} s without new output (ddptop recognises no training step in this job's log)"
                    if seen else f"{silent:.0f} s without a first training step")
        else:
            last = f"{silent:.0f} s without a training step"
        if expected:
            last += f" (steps came every {expected:.2g} s: {silent / expected:.0f}x the usual interval)"
        what = {"mismatch": "Collective mismatch: the ranks wait in different collectives, so none can finish: "
                            "one rank took another code path (a branch on the rank, its data or a condition), or "
                            "the order of collectives differs between ranks",
                "hot": "Hot stall: GPUs busy but no step progress, the signature of ranks spinning in a "
                       "collective that one rank never joined (an NCCL hang)",
                "collective": "Collective hang: the other ranks wait for the odd rank out in a collective it never joined",
                "idle": "Idle stall: no progress and nothing busy",
                "cpu-bound": "CPU-bound stall: no progress while the CPU is pegged (data loading?)",
                "unknown": "Stall: no step progress"}[kind]
        msg = f"{what}. {last}."
        if culprits:
            msg += f" Odd rank out: {', '.join(f'rank {r}' for r in sorted(set(culprits)))}."
        if ras is not None:
            msg += f" {ras[2][:1].upper()}{ras[2][1:]}."
        if v is not None and v.hung and v.summary:
            said = v.summary.split(": ", 1)[1] if v.summary.startswith("hung") and ": " in v.summary else v.summary
            msg += f" {said[:1].upper()}{said[1:]}."
        profiles = {"mismatch": ("flight-recorder", "nccl-debug"),
                    "hot": ("p2p-off", "nccl-debug", "flight-recorder", "gloo"),
                    "collective": ("flight-recorder", "nccl-debug", "p2p-off"),
                    "idle": ("nccl-debug", "flight-recorder", "fewer-workers"),
                    "cpu-bound": ("fewer-workers",),
                    "unknown": ("p2p-off", "nccl-debug", "flight-recorder")}[kind]
        return Stall(kind, tuple(st.rank for st in pool), tuple(sorted(set(culprits))), silent, expected,
                     tuple(evidence), msg, profiles, where)
