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

One module, though over 500 lines: it is one decision, made by one class over one
per-rank state (the learned interval, the silence, the classification of the stall
and the odd rank out all read the same state at the same tick).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Mapping

from ddptop.core.analysis.culprits import Evidence, culprits_of, overdue
from ddptop.core.analysis.native_frames import is_launch
from ddptop.core.analysis.rank_state import RankState
from ddptop.core.analysis.stack_judge import combine
from ddptop.core.analysis.wording import launch_words, stall_message
from ddptop.core.model.evidence import (
    HOT_UTIL,
    IDLE_UTIL,
    StackEvidence,
    Where,
    ranks_text,
)

BUSY_CPU = 85.0
CHILDREN_WORK_CPU = 20.0  # % CPU a rank's child processes use that counts as work (gzip, data-loader workers)


@dataclass(frozen=True)
class Stall:
    kind: str  # lost-peer | mismatch | hot | collective | idle | cpu-bound | unknown
    ranks: tuple[int, ...]
    culprits: tuple[int, ...]
    silent_for: float  # seconds since the job's last progress
    expected: float | None  # the job's learned step interval
    evidence: tuple[str, ...]
    message: str
    suggested_profiles: tuple[str, ...]
    where: Mapping[int, Where] = field(default_factory=dict)  # where each culprit's stack is stuck
    # the culprits' node, when the job spans several nodes and the culprits are all on one ("" otherwise)
    node: str = ""


@dataclass(frozen=True)
class Decision:
    """What the detector wants done now: take stack samples (and ask NCCL's
    RAS), and/or raise this stall.  The pipeline only carries it out."""

    sample: bool = False
    stall: Stall | None = None


class StallDetector:
    """Decides whether the job hangs, from progress, telemetry, stack samples and
    NCCL RAS, on an injected clock.  ``decide(now)`` says what to do; the
    detector owns its sampling state (when samples were asked for, whether
    they are on their way)."""

    def __init__(self, clock, *, min_silence: float = 10.0, k: float = 3.0, slack: float = 12.0,
                 first_step_grace: float = 120.0, stall_after: float | None = None, start: float | None = None,
                 io_patience: float = 600.0, watch_patience: float = 30.0, work_patience: float = 300.0,
                 can_sample: bool = False, resample_every: float = 20.0, stacks_wait: float = 10.0,
                 suspect_floor: float = 2.0):
        self.clock = clock
        self.min_silence = min_silence
        self.k = k
        self.slack = slack
        self.first_step_grace = first_step_grace
        self.stall_after = stall_after
        self.started = clock() if start is None else start
        self.ranks: dict[int, RankState] = {}
        self.active: Stall | None = None  # the stall being reported, until progress resumes
        self.clean_end = -1e18  # when a rank last ended without a failure (exit 0, or its exit unknown)
        self._active_began = 0.0  # when the silence of the stall being reported began
        self.verdict: StackEvidence | None = None  # the latest stack samples' verdict (every node's, combined)
        self._verdicts: dict[str, StackEvidence] = {}  # node -> its latest
        # sampling state: samples are asked for at a suspected stall (``decide`` says so), again every
        # ``resample_every`` s while the silence lasts; a stall waits for samples on their way at most
        # ``stacks_wait`` s
        self.can_sample = can_sample
        self.resample_every = resample_every
        self.stacks_wait = stacks_wait
        self.stacks_pending = False
        self.sampled_at = -1e18
        # what NCCL's RAS port said last: (t, culprits, text); NCCL's own view of who is behind
        self.ras: tuple[float, tuple[int, ...], str] | None = None
        self.suspect_at = 0.5  # of the threshold: when to ask for stack samples at the latest
        # ... and at the earliest: this many seconds, or k usual intervals, into a silence
        self.suspect_floor = suspect_floor
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

    def step(self, rank: int, step: int | None, t: float | None = None, source: str = "log") -> None:
        """A training step (``step`` None: progress without a number); ``source``:
        "hook" (the step hook inside the rank) or "log" (a line of its output)."""
        t = self.clock() if t is None else t
        st = self.rank(rank)
        st.source = source
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

    def telemetry(self, rank: int, *, util=None, cpu=None, children_cpu=None, status=None,
                  simulated: bool = False) -> None:
        st = self.rank(rank)
        if util is not None:
            st.util = util
            st.util_simulated = simulated
        if cpu is not None:
            st.cpu = cpu
        if children_cpu is not None:
            st.children_cpu = children_cpu
        if status is not None:
            st.status = status

    def stacks(self, evidence: StackEvidence) -> None:
        """Stack samples of every rank and what they say (fed as an event, on the caller's clock)."""
        self._verdicts[evidence.node] = evidence
        began = self.silence_began()
        self.verdict = combine([v for v in self._verdicts.values() if v.t >= began] or [evidence])
        self.stacks_pending = False

    def ras_said(self, t: float, culprits: tuple[int, ...], text: str) -> None:
        """What NCCL's RAS port said at ``t`` (see ``RasEvent``)."""
        self.ras = (t, tuple(culprits), text)

    def rank_ended(self, rank: int, exit_code: int | None = None, t: float | None = None) -> None:
        st = self.rank(rank)
        t = self.clock() if t is None else t
        if not st.alive and st.ended_at is not None:
            t = min(t, st.ended_at)  # (its exit code, told after its end: the end is when it ended)
        st.alive = False
        st.exit_code = exit_code
        st.ended_at = t
        if exit_code in (None, 0):
            # a rank that ended without a failure: the job is ending, and the others' silence is judged from
            # here (their own end, a last save, or waiting for it forever: a hang said a threshold later)
            self.clean_end = max(self.clean_end, t)

    def nodes(self) -> dict[int, str]:
        """Each rank's node, as its events said (empty for a job on one node that names none)."""
        return {r: st.node for r, st in self.ranks.items() if st.node}

    def gpu_busy(self) -> set[int]:
        """The live ranks whose GPU is busy (an NCCL kernel spinning, or work):
        a rank spinning on one unchanged line while its GPU is busy and no step
        comes is read as waiting on the GPU by the stack verdict.  Simulated
        GPUs are not counted: their utilisation is the rank's CPU use, which
        any loop on one line makes high (native frames still tell)."""
        return {r for r, u in self.gpu_utils().items() if u is not None and u >= HOT_UTIL}

    def gpu_utils(self) -> dict[int, float | None]:
        """Each live rank's GPU utilisation, None where it is unknown or
        simulated (a simulated GPU's reading is the rank's CPU use: a rank
        sleeping at a GPU sync would read as an idle GPU)."""
        return {r: (st.util if st.util is not None and not st.util_simulated else None)
                for r, st in self.ranks.items() if st.alive}

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

    def suspect_after(self, st: RankState) -> float:
        """Seconds of silence after which ``st`` is worth a look at its stacks:
        ``suspect_floor`` or k usual intervals (so samples of a job stepping
        faster than once a second are taken a few seconds after the step that
        should have come), never later than ``suspect_at`` of its threshold."""
        late = self.suspect_at * self.threshold(st)
        e = st.arrival_gap() if st.last_progress is not None and self.stall_after is None else None
        if e is None:
            return late
        return min(late, max(self.suspect_floor, self.k * e))

    def _last_sign(self, st: RankState) -> float:
        last = max(x for x in (st.last_progress, st.last_other, self.started, self.clean_end) if x is not None)
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
        """Every rank has been silent long enough to look at its stacks (and no
        stall is being reported): the time to sample."""
        now = self.clock() if now is None else now
        pool = self._pool()
        if not pool or self.active is not None:
            return False
        late = [self._silent(st, now) > self.suspect_after(st) for st in pool]
        # (ranks watched by their stacks: one going quiet while others move is worth a look)
        return all(late) or any(x and st.watched is not None for x, st in zip(late, pool))

    def silence_began(self) -> float:
        """When the current silence began: the latest sign of life of any judged rank."""
        pool = self._pool()
        if not pool:
            return self.started
        return max(self._last_sign(st) for st in pool)

    def decide(self, now: float | None = None) -> Decision:
        """What to do now: take stack samples (a suspected stall with none on
        their way, once per ``resample_every`` within one silence, at once in a
        new one) and/or raise a new stall (once per episode)."""
        now = self.clock() if now is None else now
        if self.stacks_pending and now - self.sampled_at > self.stacks_wait:
            self.stacks_pending = False  # they did not come in time: judge without them
        sample = False
        if self.can_sample and not self.stacks_pending and self.suspect(now):
            # (a new silence, after progress came back in between, is sampled at once: an evaluation right
            # after another must not be judged without stacks)
            if self.sampled_at < self.silence_began() or now - self.sampled_at >= self.resample_every:
                sample = True
                self.stacks_pending = True
                self.sampled_at = now
        return Decision(sample, self._check(now))

    def samples_refused(self) -> None:
        """The samples ``decide`` asked for could not be taken (a sampling
        still under way): judge without them."""
        self.stacks_pending = False

    def _fresh(self) -> StackEvidence | None:
        v = self.verdict
        return v if v is not None and v.t >= self.silence_began() else None

    def _children_busy(self) -> set[int]:
        return {r for r, st in self.ranks.items() if (st.children_cpu or 0) >= CHILDREN_WORK_CPU}

    def _check(self, now: float) -> Stall | None:
        """A new stall, once per episode; None otherwise (and while it lasts).

        Stacks confirm: samples taken during this silence in which every rank
        moves mean work (no alarm, however long); samples in which frozen
        culprits hold the others waiting (or ranks wait in different
        collectives) raise the alarm as soon as they come, before the
        threshold; samples still on their way hold the alarm until they come
        (``stacks_wait`` bounds that)."""
        pool = self._pool()
        if not pool:
            return None
        stalled = [st for st in pool if self._silent(st, now) > self.threshold(st)]
        v_now = self._fresh()
        if self.active is not None:
            if any(self._last_sign(self.ranks[r]) > self._active_began for r in self.active.ranks if r in self.ranks):
                self.active = None  # progress resumed: a sign of life of its ranks since the stall was raised
            return None
        confirmed = (v_now is not None and v_now.confirmed and not (set(v_now.culprits) & self._children_busy())
                     and not self._working(v_now, pool))
        lost = self._lost_peers(pool, now)
        if lost and len(stalled) < len(pool):
            # a rank of the job failed and the others, still there, went quiet: they wait for it (on other nodes
            # nothing stops them until NCCL's watchdog, minutes later); said now
            stalled = list(pool)
        if len(stalled) < len(pool) and confirmed:
            # complete evidence: the culprits frozen (not in I/O, not moving) while the others wait for them,
            # or the ranks waiting in different collectives; said now, not at a fixed floor
            stalled = list(pool)
        if len(stalled) < len(pool):
            partial = self._partial(pool, stalled, now)
            if partial is not None:
                self.active, self._active_began = partial, max(self._last_sign(st) for st in stalled)
            return partial
        v = v_now
        note = ""
        if v is not None and v.hung is False and v.workers:
            # the others wait for ranks that visibly work (an evaluation, a save on rank 0): work, until the patience
            silent = self._silent_pool(pool, now)
            if silent <= max(self.work_patience, *(self.threshold(st) for st in pool)):
                return None
            v = overdue(v, v.workers)
            note = (f"{ranks_text(v.workers)} still working after {silent:.0f} s while the others wait (a loop in "
                    "its own code, or work longer than ddptop's patience)")
        elif v is not None and v.hung is False:
            if not (v.io and self._silent_pool(pool, now) > max(self.io_patience, *(self.threshold(st) for st in pool))):
                return None  # every rank's stack moves (or writes): work (a long evaluation, a save), not a hang
            # in I/O for too long: a file system that hangs (NFS) is a hang too; those ranks are the culprits
            v = overdue(v, v.io)
            note = f"{ranks_text(v.io)} still in I/O after {self._silent_pool(pool, now):.0f} s"
        elif v is not None and v.hung:
            working = self._working(v, pool)
            if working:
                silent = self._silent_pool(pool, now)
                if silent <= max(self.work_patience, *(self.threshold(st) for st in pool)):
                    return None  # the others wait for ranks that visibly work (an evaluation, a save on rank 0)
                note = (f"{working} still working after {silent:.0f} s (a loop in its own code, or work longer "
                        "than ddptop's patience)")
        if v is None and self.stacks_pending:
            return None
        self.active, self._active_began = self._describe(pool, now, v, note), self.silence_began()
        return self.active

    def _lost_peers(self, pool: list[RankState], now: float) -> list[int]:
        """Ranks that ended with a failure (a non-zero exit, a signal) while the
        others, still alive, have made no progress since, for longer than a
        look at their stacks would wait (``suspect_after``): the survivors of a
        lost peer.  (A single torchrun stops the survivors itself, sooner.)"""
        began = self.silence_began()
        lost = [r for r, st in self.ranks.items() if not st.alive and st.exit_code not in (None, 0)
                and st.ended_at is not None and st.ended_at >= began - 1.0]
        if not lost or not pool:
            return []
        if all(self._silent(st, now) > self.suspect_after(st) for st in pool):
            return sorted(lost)
        return []

    def _working(self, v: StackEvidence, pool: list[RankState]) -> str:
        """Who, in a hung verdict, is visibly working rather than stuck ("" if
        nobody): culprits that work (``StackEvidence.working``: stacks that
        move, a loop outside any wait, or a child process that works, as
        ``subprocess.run(["gzip", ...])``); with no culprit, every rank
        waiting on children that work (data-loader workers starting up)."""
        busy_children = self._children_busy()
        rs = v.waits_on_work(busy_children)
        if rs:
            return f"rank {rs[0]} is" if len(rs) == 1 else f"ranks {', '.join(map(str, rs))} are"
        if not v.culprits and pool and all(st.rank in busy_children for st in pool):
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

    def _describe(self, pool: list[RankState], now: float, v: StackEvidence | None = None, note: str = "") -> Stall:
        everyone = sorted(self.ranks.values(), key=lambda s: s.rank)
        silent = min(self._silent(st, now) for st in pool)
        exp = [e for e in (st.expected() for st in pool) if e is not None]
        expected = statistics.median(exp) if exp else None
        ras = self.ras if self.ras is not None and self.ras[0] >= self.silence_began() and self.ras[2] else None
        found = culprits_of(Evidence(ranks=tuple(everyone), stacks=v, ras=ras[1] if ras is not None else None))
        culprits, where = list(found.culprits), dict(found.where)
        evidence = list(found.evidence)
        utils = {st.rank: st.util for st in everyone if st.util is not None and st.alive}
        hot = [r for r, u in utils.items() if u >= HOT_UTIL]
        idle = [r for r, u in utils.items() if u <= IDLE_UTIL]
        # classification
        # (a rank waiting in a collective or on the GPU may spin a core: that is not CPU-bound work)
        waiting = set(v.waiting) if v is not None and v.hung else set()
        cpu_bound = [st.rank for st in everyone if (st.cpu or 0) + (st.children_cpu or 0) >= BUSY_CPU
                     and (st.util is None or st.util <= IDLE_UTIL) and st.rank not in waiting]
        in_collective = bool(v is not None and v.hung and v.culprits and waiting - set(v.culprits))
        lost = self._lost_peers(pool, now)
        if lost:
            kind = "lost-peer"
            culprits = lost
        elif v is not None and v.hung and v.mismatch:
            kind = "mismatch"
        elif utils and len(hot) >= max(1, len(utils) - len(culprits)) and hot:
            kind = "hot"
            evidence.append(f"GPU utilisation {', '.join(f'r{r} {utils[r]:.0f}%' for r in sorted(utils))} with no step progress")
        elif in_collective:
            kind = "collective"
            who, others = sorted(set(culprits)), sorted(waiting - set(culprits))
            subject = (f"rank {others[0]} waits" if len(others) == 1 else
                       f"ranks {', '.join(map(str, others))} wait")
            evidence.append(f"{subject} for {'rank' if len(who) == 1 else 'ranks'} {', '.join(map(str, who))} (stacks)")
        elif utils and len(idle) == len(utils) and not cpu_bound:
            kind = "idle"
            evidence.append("GPUs and CPUs idle: a deadlock, a dead data loader, or waiting on I/O")
        elif cpu_bound:
            kind = "cpu-bound"
            evidence.append(f"ranks {', '.join(map(str, cpu_bound))} (or their workers) peg the CPU")
        else:
            kind = "unknown"
        where, node = _with_nodes(everyone, where, culprits)
        launching = sorted(r for r, w in (v.where.items() if v is not None and v.hung else ())
                           if w.kind == "gpu-wait" and is_launch(w.native))
        if launching:
            note = "; ".join(n for n in (note, launch_words(launching)) if n)
        msg = stall_message(kind, pool, everyone, silent, expected, v, culprits, ras[2] if ras else "", note)
        starting = all(st.last_progress is None for st in pool)
        profiles = {"lost-peer": ("nccl-debug", "flight-recorder"),
                    "mismatch": ("flight-recorder", "nccl-debug"),
                    "hot": ("p2p-off", "nccl-debug", "flight-recorder", "gloo"),
                    "collective": ("flight-recorder", "nccl-debug", "p2p-off"),
                    "idle": ("nccl-debug", "flight-recorder", "fewer-workers"),
                    "cpu-bound": ("fewer-workers",),
                    "unknown": ("p2p-off", "nccl-debug", "flight-recorder")}[kind]
        if kind == "collective" and v is not None and any(
                r in v.where and (v.where[r].kind == "gpu-wait" or v.where[r].status == "busy") for r in waiting):
            # the others spin while they wait (at a GPU sync, or polling): the NCCL hang's signature, whatever
            # the GPU readings have caught up with yet
            profiles = ("p2p-off", "nccl-debug", "flight-recorder", "gloo")
        if starting and kind in ("hot", "collective", "unknown") and not culprits:
            # every rank stuck before the first step, none the odd one out: the broken peer-to-peer start-up
            profiles = ("p2p-off", "nccl-debug", "flight-recorder", "gloo")
        if launching:  # a launch the GPU holds: eager module loading first, the usual order after it
            profiles = ("eager-load", *(p for p in profiles if p != "eager-load"))
        return Stall(kind, tuple(st.rank for st in pool), tuple(sorted(set(culprits))), silent, expected,
                     tuple(evidence), msg, profiles, dict(sorted(where.items())), node)


def _with_nodes(everyone: list[RankState], where: dict[int, Where],
                culprits: list[int]) -> tuple[dict[int, Where], str]:
    """Where each culprit is, with its node (from its stacks, else from its
    rank events), and the culprits' one node: "" unless the job spans
    several nodes and every culprit is on the same one."""
    nodes = {st.rank: st.node for st in everyone if st.node}
    where = {r: w if w.node or r not in nodes else replace(w, node=nodes[r]) for r, w in where.items()}
    nodes.update({r: w.node for r, w in where.items() if w.node})
    theirs = {nodes.get(r, "") for r in culprits}
    if len(set(nodes.values())) < 2 or len(theirs) != 1 or "" in theirs:
        return where, ""
    return where, theirs.pop()
