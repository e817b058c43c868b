"""The detector's three thresholds are the person's settings, read by every live analysis."""

from ddptop.core.model.events import ProgressEvent, RankEvent
from ddptop.core.run.pipeline import Pipeline


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_defaults_are_120_s_to_the_first_step_10_s_of_silence_and_30_s_of_frozen_stacks(monkeypatch):
    for name in ("DDPTOP_FIRST_STEP_GRACE", "DDPTOP_MIN_SILENCE", "DDPTOP_WATCH_PATIENCE"):
        monkeypatch.delenv(name, raising=False)
    d = Pipeline(clock=Clock()).analyzer.stall
    assert (d.first_step_grace, d.min_silence, d.watch_patience) == (120.0, 10.0, 30.0)


def test_a_shorter_first_step_grace_raises_the_start_hang_sooner(monkeypatch):
    monkeypatch.setenv("DDPTOP_FIRST_STEP_GRACE", "20")
    monkeypatch.setenv("DDPTOP_MIN_SILENCE", "4")
    clock = Clock()
    pipe = Pipeline(clock=clock)
    assert (pipe.analyzer.stall.first_step_grace, pipe.analyzer.stall.min_silence) == (20.0, 4.0)
    pipe.process([RankEvent(clock.t, rank=r, pid=100 + r) for r in (0, 1)])
    clock.t += 19
    assert not [a for a in pipe.process([], check=True) if a.type == "stall"]
    clock.t += 2
    assert [a for a in pipe.process([], check=True) if a.type == "stall"]


def test_after_steps_the_floor_is_the_min_silence(monkeypatch):
    monkeypatch.setenv("DDPTOP_MIN_SILENCE", "4")
    clock = Clock()
    pipe = Pipeline(clock=clock)
    pipe.process([RankEvent(clock.t, rank=r, pid=100 + r) for r in (0, 1)])
    for step in range(1, 30):
        clock.t += 0.1
        assert not pipe.process([ProgressEvent(clock.t, rank=r, step=step) for r in (0, 1)], check=True)
    clock.t += 3.5
    assert not [a for a in pipe.process([], check=True) if a.type == "stall"]
    clock.t += 1.0
    assert [a for a in pipe.process([], check=True) if a.type == "stall"]
