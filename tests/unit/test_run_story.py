"""A run's own story (ddptop.core.tools.run_story): the journal replayed through the live analysis on its own clock.

The journals here are written as the supervisor writes them (steps from the hook, a stack sampling at a
suspected stall, the alarm it raised, the stop it made), without torchrun; the end-to-end hang tests diagnose
real runs the same way (conftest.diagnose_agrees).

(What runs processes: tests/integration/test_run_story_e2e.py.)"""

from __future__ import annotations

from made_runs import hung_run, log_stepped_run

from ddptop.core.tools.run_story import story


def test_the_replay_raises_the_runs_hang_with_the_same_culprit_and_says_who_ended_it(tmp_path):
    run, alarm_t = hung_run(tmp_path)
    s = story(run)
    assert [a.culprits for a in s.stalls] == [(1,)] and s.stalls[0].id == "stall-collective"
    assert abs(s.stalls[0].t - alarm_t) < 1.5  # when the live analysis had the samples
    assert s.stalls[0].where[1].line == 60 and s.differences == ()
    # a journal of an earlier release (no ended_by): read from the supervisor's words
    assert s.ended_by.by == "ddptop-on-stall" and s.ended_by.exit_code == 124


def test_where_the_replay_and_the_recorded_alarm_differ_both_are_said(tmp_path):
    run, _t = hung_run(tmp_path, recorded_culprits=(0,))
    s = story(run)
    assert s.stalls[0].culprits == (1,) and s.recorded[0].culprits == (0,)
    assert len(s.differences) == 1 and "culprits [1]" in s.differences[0] and "culprits [0]" in s.differences[0]


def test_steps_known_from_the_logs_alone_are_replayed_at_the_times_they_were_read(tmp_path):
    """A job with no hook (or a loop with no optimizer): the live analysis knew its steps from its log lines.
    A finished run's logs are read all at once; the journal's marks give each line its time, and the replay
    raises the hang the run raised, seconds after the last step."""
    run, last, alarm_t = log_stepped_run(tmp_path)
    s = story(run)
    assert [a.id for a in s.stalls] == ["stall-hot"] and s.differences == (), (s.stalls, s.differences)
    assert last < s.stalls[0].t <= alarm_t + 1.0


def test_a_journal_without_marks_says_why_its_replay_differs(tmp_path):
    """(A journal of an earlier release: its log lines cannot be timed, so steps that came only from them are
    unknown to the replay; the difference is said with its reason, never hidden.)"""
    run, _last, _alarm_t = log_stepped_run(tmp_path, marks=False)
    s = story(run)
    assert s.stalls == () and len(s.differences) == 1, s.differences
    assert "the replay raised no stall" in s.differences[0] and "log lines" in s.differences[0], s.differences


def test_a_run_directory_moved_elsewhere_still_reads_its_logs(tmp_path):
    run, _last, _alarm_t = log_stepped_run(tmp_path / "there")
    moved = tmp_path / "here" / "run"
    moved.parent.mkdir()
    run.rename(moved)
    s = story(moved)
    assert [a.id for a in s.stalls] == ["stall-hot"] and s.differences == ()
