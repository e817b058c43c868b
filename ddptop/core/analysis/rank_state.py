"""What the live analysis knows of one rank: its progress, its phase, its telemetry, its end.

The stall detector keeps one ``RankState`` per rank and updates it from the
event stream; the culprit rules (``culprits``) and the alarm's words
(``wording``) read it.  It lives apart from the detector so that those two
read it without importing the detector (no import cycle).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

__all__ = ["RankState"]


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
    util_simulated: bool = False  # ... simulated (--gpu sim: the rank's CPU use, so it says nothing of a GPU wait)
    cpu: float | None = None
    children_cpu: float | None = None
    status: str = ""
    source: str = ""  # where its steps come from: "hook", "log" ("" before the first)
    alive: bool = True
    exit_code: int | None = None
    ended_at: float | None = None
    node: str = ""  # the node it runs on, as its events say (the merged view of several nodes)

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
