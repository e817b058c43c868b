"""Live analysis: one pipeline for every job ddptop watches.

Sources (a run's journal, a job watched by pid, the nodes of a multi-node
job) feed events in; the pipeline returns alarms and runs the reactions to
them.  The supervisor of a launched job, ``ForeignSession`` (attach by pid)
and ``MultiSession`` (the cross-node view) each hold one; only what they
plug in differs:

* the analyzer (progress, signatures, the stall detector), started afresh
  for each relaunch;
* reactions: a stack capture on a stall, the notify command, and whatever
  the owner adds (the supervisor: flight-recorder dumps,
  ``--on-stall kill|relaunch``);
* the probes it asks at a suspected stall (stack samples, NCCL's RAS port),
  which live in ``ddptop.core.sources`` (``stack_probe``, ``ras_probe``) with the rest of the background
  probes (a stack capture, the stack watch, telemetry).

Also here, written once: ``run_notify`` (the ``--notify-cmd`` reaction).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from typing import Callable, Collection, Sequence

from ddptop.core.analysis.analyzer import Analyzer
from ddptop.core.model.events import AlarmEvent, Event, LaunchEvent, NoteEvent
from ddptop.core.model.run_meta import Thresholds
from ddptop.core.model.settings import thresholds as settings_thresholds
from ddptop.core.model.version_numbers import version_tuple
from ddptop.core.sources.ras_probe import RasProbe

CHECK_EVERY = 0.5  # seconds between stall checks
CRASH_SIGNATURES = frozenset({"child-failed", "rank-exit", "rank-signal"})
# NCCL 2.26 to 2.29.1: asked at most this often (seconds) during a stall; queries, repeated, have
# crashed those versions' RAS thread (NVIDIA/nccl#1669, #1718)
FRAGILE_RAS_GAP = 120.0


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
                 sampler: Callable[[dict[int, float | None]], bool] | None = None,
                 resample_every: float = 20.0, stacks_wait: float = 10.0,
                 ras: RasProbe | None = None, ras_always: bool | Callable[[], bool] = False,
                 thresholds: Thresholds | None = None,
                 in_effect: Callable[[], Collection[str]] | None = None):
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
        behind.  ``thresholds``: the detector's (None: the person's settings;
        a launched run's are those in its meta.json).  ``in_effect``: the
        profiles the job already runs with (its environment has their values):
        never suggested by an alarm."""
        self.node = node
        self.thresholds = thresholds if thresholds is not None else settings_thresholds()
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
        self.in_effect = in_effect
        self._ras_unknown_said = False
        self._last_check = -1e18
        self.analyzer = self._new_analyzer()

    def _new_analyzer(self):
        s = self.thresholds
        return Analyzer(self.clock, stall_after=self.stall_after, node=self.node, match_signatures=not self.stall_only,
                        can_sample=self.sampler is not None or self.ras is not None,
                        resample_every=self.resample_every, stacks_wait=self.stacks_wait,
                        first_step_grace=s.first_step_grace, min_silence=s.min_silence,
                        watch_patience=s.watch_patience)

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
        if self.ras is not None and not self.ras.monitoring and self._monitor_wanted():
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
        if self.in_effect is not None and any(a.suggested_profiles for a in alarms):
            have = set(self.in_effect())
            alarms = [dataclasses.replace(a, suggested_profiles=tuple(p for p in a.suggested_profiles if p not in have))
                      for a in alarms]
        if not self.crash_seen and (any(a.type == "crash" for a in alarms)
                                    or any(f.signature in CRASH_SIGNATURES for f in an.findings)):
            self.crash_seen = True
        return [*notes, *alarms]

    def _take_samples(self) -> None:
        """The detector asked for stack samples (a suspected stall): take them,
        and ask NCCL's RAS; say so to the detector if no samples come."""
        self.ask_ras()
        an = self.analyzer
        if self.sampler is None or not self.sampler(an.gpu_utils()):
            an.samples_refused()

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
