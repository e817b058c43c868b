"""Analyzer: events in, alarms out.  Pure (no I/O), injected clock.

Combines the progress parser, the signature matcher and the stall detector.
Runs live inside the supervisor (so alarms land in the journal whoever is
watching) and post-mortem in ``ddptop diagnose``.

A parser that fails on a line (a bug) skips that line only; the failure
comes out as a warning note, once per kind of failure, instead of silence.
"""

from __future__ import annotations

import dataclasses
import re
import time
import traceback

from ddptop.core.analysis.culprits import Evidence, culprits_of
from ddptop.core.analysis.detector import Decision, StallDetector
from ddptop.core.analysis.failure_ranking import (
    ACROSS_RANKS,
    across_ranks,
    cascade_level,
    root_cause,
)
from ddptop.core.analysis.progress import OTHER, TrainingBars, parse_progress
from ddptop.core.analysis.signature_catalog import CAUSE, CONSEQUENCE, TIMEOUT
from ddptop.core.analysis.signatures import Finding, SignatureMatcher
from ddptop.core.analysis.timestamps import Clock
from ddptop.core.analysis.wording import lingering_words, peer_dead_words, signature_words
from ddptop.core.model.events import (
    FINAL_STATES,
    STOPPING,
    AlarmEvent,
    Event,
    GpuEvent,
    LogBatch,
    NoteEvent,
    ProcEvent,
    ProgressEvent,
    RankEvent,
    RasEvent,
    StacksEvent,
    StateEvent,
)
from ddptop.core.model.evidence import StackEvidence

MAX_FAILURE_NOTES = 20  # parser-failure notes per analyzer, at most
# seconds a hooked rank's sign of life (a step, a batch, other progress) stands for the progress its lines would
# show: its lines are not parsed for progress within them (the stall thresholds are 10 s and more)
HOOKED_PARSE_GAP = 1.0
# newer steps of a rank, after a finding in a file mixing its stdout and stderr, that say it went on (``_went_on``)
WENT_ON_STEPS = 3
# NCCL says its version in its INFO lines (NCCL_DEBUG=INFO), the step hook in a note
NCCL_VERSION = re.compile(r"\bNCCL version (\d+\.\d+\.\d+)")


LINGER = 15.0  # seconds a rank may take to end after NCCL's watchdog timed out its collective before it is said


class Analyzer:
    def __init__(self, clock=time.time, *, stall_after: float | None = None, detect_stalls: bool = True,
                 match_signatures: bool = True, node: str = "", **stall_options):
        """``match_signatures`` False: lines count as output and progress only
        (the view across nodes, whose nodes match their own lines: at 128 nodes
        matching every line again was most of its time)."""
        self.clock = clock
        self.match_signatures = match_signatures
        self.node = node
        self.stall = StallDetector(clock, stall_after=stall_after, **stall_options)
        self.detect_stalls = detect_stalls
        self.matchers: dict[str, SignatureMatcher] = {}
        self.findings: list[Finding] = []
        self.read_at: dict[Finding, float] = {}  # when each finding's line was read (the journal's clock)
        self._timed_out: dict[int, float] = {}  # rank -> when its NCCL watchdog's timeout was read (until said)
        # when each finding's line says it was written (its own time stamp, else the one of the line before it
        # in its file), where lines carry stamps; read only when ``read_stamps`` (diagnose: ordering by time)
        self.read_stamps = False
        self.default_year: int | None = None  # for stamps without a year (the files' year)
        self.stamped_at: dict[Finding, float] = {}
        self.node_of: dict[Finding, str] = {}
        self._clocks: dict[str, Clock] = {}
        # each rank's findings since its last training step: a step after them means the rank went on (a warning
        # a healthy run prints, a retry that worked), and they are marked "recovered", never the root
        # rank -> file -> its findings since that file's last step
        self._open: dict[int, dict[str, list[Finding]]] = {}
        self._file_step: dict[tuple, int] = {}  # (rank, file) -> the last training step that file showed
        self._step_before: dict[Finding, int | None] = {}
        self._peers_before: dict[Finding, int | None] = {}  # the furthest step the other ranks had shown then
        self._newer: dict[Finding, set[int]] = {}
        self._alarmed: set[tuple] = set()
        self.line_no: dict[str, int] = {}
        self.finished = False
        self.stopping = False  # the job is being stopped (until it runs again: a relaunch)
        self.last_steps: dict[int, int | None] = {}
        # progress no rank is known for (a single-file paste, a launcher that prefixes nothing): the job's
        self.job_step: int | None = None
        self.hooked: set[int] = set()  # ranks whose steps come from the hook/beat
        self.bars = TrainingBars()  # which bar is the training one, per rank (None: the job)
        self._bar_counts: dict[tuple, int] = {}  # (rank, kind, total, epoch) -> the last count a bar showed
        self.notes: list[NoteEvent] = []  # every note made (``feed`` returns the new ones)
        self._new_notes: list[NoteEvent] = []
        self._failures: set[tuple] = set()  # (parser, exception type, where it was raised): noted once
        self._line: tuple[LogBatch, int, int | None] | None = None  # (batch, index, line number) being parsed, for the notes of parser failures
        self.nccl_version: str | None = None  # the NCCL the ranks use, once a line or the hook says it
        self._progress_failed = lambda e: self._parser_failed("progress parser", e)
        self._signature_failed = lambda e: self._parser_failed("signature matcher", e)

    def feed(self, events: list[Event]) -> list[AlarmEvent | NoteEvent]:
        """Take events in; return the new alarms, and a note for each new kind
        of parser failure (a line a parser failed on is skipped)."""
        alarms: list[AlarmEvent | NoteEvent] = []
        st = self.stall
        for ev in events:
            if isinstance(ev, LogBatch):
                self._logs(ev, alarms)
            elif isinstance(ev, ProgressEvent):
                if ev.source == "batch":
                    # batches drawn (training or evaluation) and the model's phase: life, not steps
                    st.batch(ev.rank, ev.step, ev.t, ev.phase)
                    continue
                if ev.source == "stack":
                    # a job ddptop did not launch: its stack moved (count grew) or not
                    st.watch(ev.rank, ev.step, ev.t)
                    continue
                self.hooked.add(ev.rank)
                st.step(ev.rank, ev.step, ev.t, source="hook")
                self.last_steps[ev.rank] = ev.step
                self._went_on(ev.rank, None, ev.t)
            elif isinstance(ev, GpuEvent):
                if ev.util is not None:
                    for r in ev.ranks:
                        st.telemetry(r, util=ev.util, simulated=ev.simulated)
            elif isinstance(ev, ProcEvent):
                st.telemetry(ev.rank, cpu=ev.cpu, children_cpu=ev.children_cpu, status=ev.status)
            elif isinstance(ev, RankEvent):
                if ev.node:
                    st.rank(ev.rank).node = ev.node
                if ev.alive:
                    st.rank(ev.rank).alive = True
                    if ev.rank not in st.ranks or st.ranks[ev.rank].last_output is None:
                        st.output(ev.rank, ev.t)
                else:
                    st.rank_ended(ev.rank, ev.exit_code, ev.t)
            elif isinstance(ev, StacksEvent):
                st.stacks(StackEvidence.from_event(ev))
            elif isinstance(ev, RasEvent):
                if ev.event == "PEER_DEAD":
                    a = self._peer_dead(ev)
                    if a is not None:
                        alarms.append(a)
                elif ev.ok:
                    st.ras_said(ev.t, ev.culprits, ev.text)
                if ev.version and self.nccl_version is None:
                    self.nccl_version = ev.version
            elif isinstance(ev, NoteEvent) and self.nccl_version is None and "NCCL version" in ev.message:
                m = NCCL_VERSION.search(ev.message)
                if m:
                    self.nccl_version = m.group(1)
            elif isinstance(ev, StateEvent) and ev.state in FINAL_STATES:
                self.finished = True
            elif isinstance(ev, StateEvent):
                # (a job being stopped raises no new stall: its ranks, interrupted, may stir once more)
                self.stopping = ev.state == STOPPING
        self._line = None
        if self._new_notes:
            alarms[:0] = self._new_notes
            self._new_notes = []
        return alarms

    def _logs(self, ev: LogBatch, alarms: list) -> None:
        """The lines of one batch, in order: output seen, progress, signatures."""
        st = self.stall
        rank, t = ev.rank, ev.t
        progress_failed = self._progress_failed
        texts = ev.texts
        done = len(texts) - 1 if ev.transient else len(texts)
        key = ev.path or str(rank)
        first = self.line_no.get(key, 0) + 1
        if done:
            self.line_no[key] = first + done - 1
            if rank is not None:
                st.output(rank, t)
            m = None
            if self.match_signatures:
                m = self.matchers.get(key)
                if m is None:
                    m = self.matchers[key] = SignatureMatcher()
            clock = None
            if self.read_stamps:
                clock = self._clocks.get(key)
                if clock is None:
                    clock = self._clocks[key] = Clock(self.default_year)
            parse = self._parse_progress_of(rank, t)
            for i in range(done):
                text = texts[i]
                stamp = clock.read(text) if clock is not None else None
                self._line = (ev, i, first + i)
                if parse:
                    p = parse_progress(text, progress_failed)
                    if p is not None:
                        self._progress(rank, p, t)
                if self.nccl_version is None and "NCCL version" in text:
                    v = NCCL_VERSION.search(text)
                    if v:
                        self.nccl_version = v.group(1)
                if m is None:
                    continue
                for f in m.feed(text, rank, first + i, ev.path, self._signature_failed, ev.node):
                    if f.signature == "outside-stop" and self.stopping:
                        # (the stop ddptop itself was asked for: no failure)
                        f = dataclasses.replace(f, level=CONSEQUENCE, explanation=(
                            "ddptop stopped the job, as asked: torchrun's agent received its "
                            f"{f.detail.signal or 'signal'}."))
                    self.findings.append(f)
                    self.read_at.setdefault(f, t)
                    if f.signature == "nccl-watchdog-timeout" and f.rank is not None and ("linger", f.rank) \
                            not in self._alarmed:
                        self._timed_out.setdefault(f.rank, t)
                    if stamp is not None:
                        self.stamped_at.setdefault(f, stamp)
                    if ev.node:
                        self.node_of.setdefault(f, ev.node)
                    if f.rank is not None and f.level < CONSEQUENCE:
                        self._open.setdefault(f.rank, {}).setdefault(key, []).append(f)
                        self._step_before[f] = self._file_step.get((f.rank, key))
                        self._peers_before[f] = max((s for (r, _k), s in self._file_step.items() if r != f.rank),
                                                    default=None)
                    new = [f]
                    if f.signature in ACROSS_RANKS:
                        # (what several ranks' lines say together, as it stands now)
                        self.findings = [x for x in self.findings if not x.detail.derived]
                        derived = across_ranks(self.findings)
                        self.findings += derived
                        new += derived
                    for x in new:
                        a = self._alarm_for(x, t)
                        if a is not None:
                            alarms.append(a)
        if ev.transient and texts:
            self._line = (ev, len(texts) - 1, None)
            p = parse_progress(texts[-1], progress_failed)
            if p is not None:
                self._progress(rank, p, t)

    def _parse_progress_of(self, rank: int | None, t: float) -> bool:
        """Whether the lines of ``rank`` read at ``t`` are worth parsing for progress.  A hooked rank's steps
        come from its hook; its lines' progress only says it is alive (an evaluation's bar: ``other_progress``),
        which a sign of life less than ``HOOKED_PARSE_GAP`` old already says.  (Parsing every line was a quarter
        of a 1,024-rank viewer's own work.)"""
        if rank is None or rank not in self.hooked:
            return True
        st = self.stall.ranks.get(rank)
        if st is None:
            return True
        last = max(st.last_progress or 0.0, st.last_other or 0.0)
        return not (last <= t < last + HOOKED_PARSE_GAP)

    def _parser_failed(self, parser: str, e: Exception) -> None:
        """A parser raised on the current line: note it, once per parser, type of
        exception and place it was raised (not once per line: a bug that hits
        every line must not flood the stream)."""
        tb = traceback.extract_tb(e.__traceback__)
        place = (tb[-1].filename, tb[-1].lineno) if tb else None
        key = (parser, type(e).__name__, place)
        if key in self._failures or len(self._failures) >= MAX_FAILURE_NOTES:
            return
        self._failures.add(key)
        if self._line is None:
            ev, who = None, "a line"
        else:
            ev, _i, n = self._line
            whose = f"rank {ev.rank}'s {ev.stream}" if ev.rank is not None else "torchrun's output"
            who = f"line {n} of {whose}" if n else f"a line of {whose}"
        where = f" ({place[0].rsplit('/', 1)[-1]}:{place[1]})" if place else ""
        note = NoteEvent(ev.t if ev is not None else self.clock(), "warning",
                         f"{parser} failed on {who}: {type(e).__name__}: {str(e)[:200]}{where}; that line was skipped "
                         "(later lines failing the same way are skipped without a note). This is a bug in ddptop: "
                         "please report it with that line.", node=self.node)
        self.notes.append(note)
        self._new_notes.append(note)

    def _progress(self, rank: int | None, p, t: float) -> None:
        # one step parser for the live analysis, the view and diagnose: once a rank's (or the job's) bars said they
        # are training ones, a bar that does not say so is other progress (a rollout or eval bar beside the
        # training one, "Train: 62%|...| 5559/9008" next to "0/48")
        p = self.bars.judge(rank, p)
        if rank is None:
            # (the job's, never rank 0's; no stall detection: nobody's steps to compare)
            if p.kind != OTHER and p.step is not None:
                self.job_step = p.step
            return
        if p.step is not None:
            # a progress bar redrawn with the same count (tqdm's refresh of its
            # clock while the loop is stuck) is not progress
            key = (rank, p.kind, p.total, p.epoch)
            if self._bar_counts.get(key) == p.step:
                return
            self._bar_counts[key] = p.step
        if p.kind == OTHER or rank in self.hooked:
            # (a hooked rank's log step numbers are not mixed with its hook count)
            self.stall.other_progress(rank, t)
        else:
            self.stall.step(rank, p.step, t, source="log")
            self.last_steps[rank] = p.step if p.step is not None else self.last_steps.get(rank)
            fkey = (self._line[0].path or str(rank)) if self._line else None
            self._went_on(rank, fkey, t, p.step)
            if fkey is not None and p.step is not None:
                self._file_step[(rank, fkey)] = p.step

    def _went_on(self, rank: int, key: str | None, t: float, step: int | None = None) -> None:
        """A training step of ``rank``: its findings before it did not stop it.  From a file: a file's lines are
        in the order they were written, but a rank's stdout and stderr reach one console through separate pipes,
        so a step counts only when the file had shown the rank's steps before the finding (its stream was
        flowing) and three newer steps came after it (torchrun's --tee console tails a rank's stdout and
        stderr files by separate threads: on a loaded machine the two steps a rank printed just before its
        fatal error reached the console after the error), and they are steps beyond the furthest any other rank
        had shown when the finding was read (in a job whose steps take milliseconds, all five steps a rank
        printed before its loader thread died reached the console after the error, while the other rank's same
        five steps had come before it: no step after a failure that the job had not already made), and not
        more than one behind the furthest they have shown by then (the same, with the other rank's steps after
        the error too; a rank in step with its peers shows their step, the one before or the next).  From the
        hook: the findings read a second or more before it came (live, a line is read as it is written)."""
        files = self._open.get(rank)
        if not files:
            return
        # the furthest step the other ranks have shown by now: a step more than one behind it is one the job had
        # already made, not progress after the finding (a console that brought the other ranks' steps after the
        # error; a rank that prints each step just after its peers is one behind, and in step); asked only when
        # a step would count
        peers_now: list = []

        def behind(step: int) -> bool:
            if not peers_now:
                peers_now.append(max((s for (r, _k), s in self._file_step.items() if r != rank), default=None))
            return peers_now[0] is not None and step < peers_now[0] - 1

        for k in [key] if key is not None else list(files):
            keep = []
            for f in files.get(k, ()):
                if key is None:
                    went_on = self.read_at.get(f, t) < t - 1.0
                else:
                    before = self._step_before.get(f)
                    peers = self._peers_before.get(f)
                    newer = self._newer.setdefault(f, set())
                    if before is not None and step is not None and step > before and (peers is None or step > peers) \
                            and not behind(step):
                        newer.add(step)
                    went_on = len(newer) >= WENT_ON_STEPS
                if went_on:
                    f.detail.recovered = True
                else:
                    keep.append(f)
            if keep:
                files[k] = keep
            else:
                files.pop(k, None)

    def _peer_dead(self, ev: RasEvent) -> AlarmEvent | None:
        """NCCL's RAS says a process of the job is dead: an alarm at once (the
        others will hang in their next collective, or the watchdog kills them
        minutes later)."""
        key = ("nccl-peer-dead", ev.culprits or ev.text)
        if key in self._alarmed:
            return None
        self._alarmed.add(key)
        return AlarmEvent(ev.t, type="crash", id="nccl-peer-dead", ranks=tuple(ev.culprits), culprits=tuple(ev.culprits),
                          message=peer_dead_words(ev.text),
                          suggested_profiles=("nccl-debug", "flight-recorder"), node=self.node)

    def _alarm_for(self, f: Finding, t: float) -> AlarmEvent | None:
        if cascade_level(f, self.findings) >= CONSEQUENCE:
            return None  # (a SIGABRT after a watchdog timeout is the timeout's consequence)
        if f.signature == "python-exception" and any(
                x.rank == f.rank and x.level in (CAUSE, TIMEOUT) and x is not f for x in self.findings):
            return None  # a specific signature already explains this rank
        key = (f.signature, f.rank)
        if key in self._alarmed:
            return None
        self._alarmed.add(key)
        kind = "crash" if f.signature in ("rank-signal", "python-exception", "rank-exit", "cuda-oom") else "signature"
        who = f"rank {f.rank}" if f.rank is not None else "torchrun"
        culprits: tuple[int, ...] = (f.rank,) if f.rank is not None and f.level == CAUSE else ()
        if root_cause(self.findings) is f:
            # the job's failure as it stands: the same culprits as ``ddptop diagnose`` of this run
            seen = set(self.stall.ranks) | {x.rank for x in self.findings if x.rank is not None}
            culprits = culprits_of(Evidence(failure=True, findings=tuple(self.findings), seen=frozenset(seen),
                                            last_steps=self.last_steps, when=self.stamped_at)).culprits or culprits
        return AlarmEvent(t, type=kind, id=f.signature,
                          ranks=(f.rank,) if f.rank is not None else (),
                          culprits=culprits,
                          message=signature_words(f.signature, who, f.explanation, f.text),
                          suggested_profiles=f.suggested_profiles, node=self.node)

    def decide(self, now: float | None = None) -> tuple[bool, list[AlarmEvent]]:
        """(take stack samples now?, the new stall alarms): the detector's
        decision, as alarms.  Nothing while the job ends or is being stopped."""
        if self.finished or self.stopping or not self.detect_stalls:
            return False, []
        self._lingering(self.clock() if now is None else now)
        d: Decision = self.stall.decide(now)
        s = d.stall
        if s is None:
            return d.sample, []
        evidence = "; ".join(s.evidence)
        return d.sample, [AlarmEvent(self.clock() if now is None else now, type="stall", id=f"stall-{s.kind}",
                                     ranks=s.ranks, culprits=s.culprits,
                                     message=s.message + (f" Evidence: {evidence}." if evidence else ""),
                                     suggested_profiles=s.suggested_profiles, node=s.node or self.node,
                                     where=s.where)]

    def _lingering(self, now: float) -> None:
        """A rank still running LINGER seconds after NCCL's watchdog timed out its collective: said once (its
        abort can wait forever behind a kernel that does not end: seen on an H100, where the rank was alive a
        minute later with its GPU busy, and the job would not end by itself)."""
        for rank, at in list(self._timed_out.items()):
            st = self.stall.ranks.get(rank)
            if st is None or not st.alive or now - at < LINGER:
                continue
            del self._timed_out[rank]
            self._alarmed.add(("linger", rank))
            note = NoteEvent(now, "warning", lingering_words(rank, now - at))
            self.notes.append(note)
            self._new_notes.append(note)

    def check(self, now: float | None = None) -> list[AlarmEvent]:
        """The new stall alarms (samples that ``decide`` would ask for are not taken)."""
        sample, alarms = self.decide(now)
        if sample:
            self.stall.samples_refused()
        return alarms

    # -- what the rest of ddptop may ask of the stall detector (never its state itself) -----------------

    def silence_began(self) -> float:
        """When the job's current silence began (its last sign of life)."""
        return self.stall.silence_began()

    def suspects_stall(self, now: float | None = None) -> bool:
        """Every rank silent long enough to look at its stacks (a stall alarm may follow)."""
        return not self.finished and not self.stopping and self.detect_stalls and self.stall.suspect(now)

    def rank_nodes(self) -> dict[int, str]:
        """Each rank's node, as its events said."""
        return self.stall.nodes()

    def gpu_utils(self) -> dict[int, float | None]:
        """Each live rank's GPU utilisation (None: unknown or simulated)."""
        return self.stall.gpu_utils()

    def samples_refused(self) -> None:
        """The stack samples the detector asked for will not come."""
        self.stall.samples_refused()

    def ranks_seen(self) -> set[int]:
        """Every rank the events named."""
        return set(self.stall.ranks)

    def root_cause(self) -> Finding | None:
        return root_cause(self.findings, self.stamped_at)
