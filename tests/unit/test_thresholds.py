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


def _quiet_run(tmp_path, thresholds=None):
    """A journal: two ranks step for 5 s, then stay silent for 40 s (no stack samples), then stop."""
    from conftest import write_run
    t0 = 1000.0
    ev = [{"kind": "state", "t": t0, "state": "running", "message": "torchrun pid 10"}]
    ev += [{"kind": "rank", "t": t0 + 0.1, "rank": r, "local_rank": r, "pid": 100 + r, "attempt": 0, "alive": True}
           for r in (0, 1)]
    for i in range(1, 51):
        ev += [{"kind": "progress", "t": t0 + 1 + i * 0.1, "rank": r, "step": i, "source": "hook"} for r in (0, 1)]
    ev.append({"kind": "state", "t": t0 + 46, "state": "stopped", "exit_code": 124, "message": "stopped"})
    run = write_run(tmp_path, events=ev, logs={0: "step 1\n", 1: "step 1\n"})
    if thresholds is not None:
        import json
        meta = json.loads((run / "meta.json").read_text())
        (run / "meta.json").write_text(json.dumps({**meta, "thresholds": thresholds}))
    return run, t0 + 6


def test_diagnose_replays_a_run_under_the_thresholds_it_ran_under_not_the_shells(tmp_path, monkeypatch):
    from ddptop.core.tools.run_story import story

    monkeypatch.setenv("DDPTOP_MIN_SILENCE", "4")  # (the shell diagnose runs in: not what the run ran under)
    run, last = _quiet_run(tmp_path / "a", {"min_silence": 30, "first_step_grace": 120, "watch_patience": 30})
    (stall,) = story(run).stalls
    assert stall.t - last >= 30, stall
    # an earlier release's journal says nothing: the defaults it ran under (10 s, and the samples' wait)
    run, last = _quiet_run(tmp_path / "b")
    (stall,) = story(run).stalls
    assert 10 <= stall.t - last < 30, stall
