"""The stall detector with a fake clock: it never sleeps."""

import pytest

from ddptop.core.analysis.detector import StallDetector
from ddptop.core.model.evidence import StackEvidence, Where


def StackVerdict(t, hung, culprits=(), summary="", where=None, error="", io=(), node="", waiting=(), mismatch=False):
    """Stack evidence as the verdict gives it (``where`` as it travels in JSON)."""
    wh = {int(k): Where.from_dict(v, int(k)) for k, v in (where or {}).items()}
    return StackEvidence(t, hung, tuple(culprits), tuple(waiting), mismatch, wh, tuple(io), summary, error, node)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def run_steps(d, clock, ranks, n, dt):
    for _ in range(n):
        clock.t += dt
        for r in ranks:
            d.step(r, (d.ranks[r].step or 0) + 1 if r in d.ranks else 1)
        assert d.decide().stall is None


def test_healthy_job_never_alarms_even_with_a_slow_first_step_and_jitter():
    c = Clock()
    d = StallDetector(c)
    c.t += 100  # model load, compile: under the first-step grace
    assert d.decide().stall is None
    import random
    rng = random.Random(0)
    for i in range(2000):
        c.t += 0.5 * rng.uniform(0.5, 2.0)
        for r in (0, 1):
            d.step(r, i + 1)
        assert d.decide().stall is None


def test_hang_alarms_within_15s_of_the_missing_step_and_names_the_rank_behind():
    c = Clock()
    d = StallDetector(c)
    run_steps(d, c, [0, 1, 2, 3], 50, 2.0)
    # rank 2 stops; the others finish one more step and then wait
    c.t += 2.0
    for r in (0, 1, 3):
        d.step(r, 51)
    due = c.t + 2.0  # when rank 2's step should have come
    alarm = None
    while alarm is None and c.t < due + 60:
        c.t += 0.5
        alarm = d.decide().stall
    assert alarm is not None and c.t - due <= 15
    assert alarm.culprits == (2,)
    assert any("rank 2 is at step 50" in e for e in alarm.evidence)
    # once per episode
    c.t += 5
    assert d.decide().stall is None


def test_hot_stall_names_the_idle_gpu():
    c = Clock()
    d = StallDetector(c)
    run_steps(d, c, [0, 1], 20, 1.0)
    d.telemetry(0, util=100.0, cpu=100.0)
    d.telemetry(1, util=0.0, cpu=0.0)
    c.t += 30
    s = d.decide().stall
    assert s.kind == "hot" and s.culprits == (1,)
    assert "p2p-off" in s.suggested_profiles


def test_idle_stall():
    c = Clock()
    d = StallDetector(c)
    run_steps(d, c, [0, 1], 20, 1.0)
    for r in (0, 1):
        d.telemetry(r, util=0.0, cpu=1.0)
    c.t += 30
    assert d.decide().stall.kind == "idle"


def test_cpu_bound_stall_from_data_loader_workers():
    c = Clock()
    d = StallDetector(c)
    run_steps(d, c, [0, 1], 20, 1.0)
    for r in (0, 1):
        d.telemetry(r, util=2.0, cpu=20.0, children_cpu=400.0)
    c.t += 30
    assert d.decide().stall.kind == "cpu-bound"


def test_ranks_spinning_in_a_collective_are_waiting_not_cpu_bound():
    """Without GPU telemetry (gloo, --gpu none), the ranks that wait for a frozen rank may spin a
    core each; the stacks say they wait, so this is a collective hang with the frozen rank the
    culprit, not a CPU-bound stall to be fixed with fewer data-loader workers."""

    c = Clock()
    d = StallDetector(c)
    run_steps(d, c, [0, 1, 2], 20, 1.0)
    d.telemetry(0, util=None, cpu=100.0)
    d.telemetry(1, util=None, cpu=0.5)
    d.telemetry(2, util=None, cpu=99.0)
    c.t += 30
    d.stacks_pending, d.sampled_at = True, c.t
    assert d.decide().stall is None  # waits for the stacks
    d.stacks(StackVerdict(c.t, True, (1,), "hung: rank 1 sleeps in train.py:40; ranks 0, 2 wait in all_reduce",
                          {1: {"rank": 1, "file": "train.py", "line": 40, "function": "step"}}, waiting=(0, 2)))
    d.stacks_pending = False
    s = d.decide().stall
    assert s.kind == "collective" and s.culprits == (1,)
    assert "fewer-workers" not in s.suggested_profiles and "flight-recorder" in s.suggested_profiles
    assert "ranks 0, 2 wait for rank 1" in " ".join(s.evidence)


def test_other_progress_holds_the_alarm_off_and_progress_resumes():
    c = Clock()
    d = StallDetector(c)
    run_steps(d, c, [0, 1], 20, 1.0)
    for _ in range(120):  # a 2-minute eval, its bar moving
        c.t += 1.0
        d.other_progress(0)
        d.other_progress(1)
        assert d.decide().stall is None
    run_steps(d, c, [0, 1], 5, 1.0)


def test_dead_rank_is_the_culprit():
    c = Clock()
    d = StallDetector(c)
    run_steps(d, c, [0, 1, 2], 10, 1.0)
    d.rank_ended(1, -11)
    c.t += 40
    s = d.decide().stall
    assert s is not None and 1 in s.culprits


def test_stall_after_overrides():
    c = Clock()
    d = StallDetector(c, stall_after=3.0)
    run_steps(d, c, [0], 5, 1.0)
    c.t += 3.5
    assert d.decide().stall is not None


def test_no_first_step_ever_alarms_after_the_grace():
    c = Clock()
    d = StallDetector(c, first_step_grace=60)
    d.output(0)
    d.output(1)
    c.t += 59
    assert d.decide().stall is None
    c.t += 2
    assert d.decide().stall is not None


def test_a_long_evaluation_drawing_batches_is_alive_and_a_hang_inside_it_is_caught():
    """The hook's batch counter and phase: an evaluation that makes no optimizer
    step for minutes is life, judged by its own batch rate."""
    c = Clock()
    d = StallDetector(c)
    run_steps(d, c, [0, 1], 100, 0.2)
    n = {0: 0, 1: 0}
    for r in (0, 1):
        d.batch(r, n[r], c.t, "eval")  # model.eval(): the evaluation begins
    for _ in range(240):  # 2 minutes of evaluation, a batch every 0.5 s: no training step at all
        c.t += 0.5
        for r in (0, 1):
            n[r] += 1
            d.batch(r, n[r], c.t, "eval")
        assert d.decide().stall is None
    # rank 1 stops drawing batches inside the evaluation; rank 0 waits for it
    last = c.t
    alarm = None
    while alarm is None and c.t < last + 120:
        c.t += 0.5
        alarm = d.decide().stall
    assert alarm is not None, "a hang inside the evaluation must still be caught"
    assert c.t - last <= 15.0, c.t - last  # by the evaluation's own rate, not a training step's
    # back to training: steps again clear it
    for r in (0, 1):
        d.batch(r, n[r] + 1, c.t, "train")
    run_steps(d, c, [0, 1], 5, 0.2)


def test_a_checkpoint_save_gets_a_patient_threshold():
    c = Clock()
    d = StallDetector(c)
    run_steps(d, c, [0, 1], 100, 0.2)
    for r in (0, 1):
        d.batch(r, 500, c.t, "save")
    c.t += 25.0  # longer than a training step's threshold (10 s), within the save's (30 s)
    assert d.decide().stall is None


def test_stacks_that_say_io_hold_the_alarm_until_the_io_patience_runs_out():
    """Rank 0 writes a checkpoint on slow storage, rank 1 waits in a barrier: the
    stacks say work (I/O).  A write that never ends (a hung NFS mount) still alarms,
    after ``io_patience``, naming the rank in I/O."""

    c = Clock()
    d = StallDetector(c, io_patience=120.0)
    run_steps(d, c, [0, 1], 100, 0.2)
    last = c.t
    c.t += 6.0
    assert d.suspect()
    d.stacks(StackVerdict(c.t, False, (), "no hang: rank 0 is in I/O", {"0": {"function": "save_checkpoint"}},
                          io=(0,)))
    while c.t < last + 119:
        c.t += 1.0
        assert d.decide().stall is None, c.t - last
    alarm = None
    while alarm is None and c.t < last + 200:
        c.t += 1.0
        alarm = d.decide().stall
    assert alarm is not None and alarm.culprits == (0,)
    assert "still in I/O" in alarm.message and alarm.where[0].function == "save_checkpoint"


def test_the_last_rank_still_ending_after_a_peer_ended_cleanly_is_no_hang_and_one_that_never_ends_is():
    """Seen in a loaded CI run of a healthy Trainer job: rank 0 wrote the last checkpoint (stacks: I/O, the
    other waiting), then its process ended; rank 1 was still tearing down, 70 s after the last step, and
    samples of a job half gone could not tell.  A peer's clean end (exit 0, or not known yet) starts the
    survivors' silence: their own end within the threshold is no hang; waiting for it past the threshold
    (uneven inputs: the other ranks wait in a collective for a rank that finished) is one."""
    c = Clock()
    d = StallDetector(c, io_patience=600.0)
    run_steps(d, c, [0, 1], 50, 0.2)
    c.t += 6.0
    d.stacks(StackVerdict(c.t, False, (), "no hang: rank 0 is in I/O", {"0": {"function": "_save"}}, io=(0,)))
    c.t += 64.0
    assert d.decide().stall is None  # the save: I/O, within the patience
    d.rank_ended(0, None, c.t)  # rank 0's process is gone; torchrun tells its exit code later
    end = c.t
    c.t += 2.0
    d.stacks(StackVerdict(c.t, None, (), "cannot tell: no usable stack; rank 0 is dead"))
    while c.t < end + d.min_silence - 0.5:
        c.t += 0.5
        assert d.decide().stall is None, c.t - end  # rank 1 ending: seconds, not a hang
    d.rank_ended(0, 0, c.t)  # its exit code comes: 0; its end stays when it ended
    assert d.ranks[0].ended_at == end
    s = None
    while s is None and c.t < end + 60:
        c.t += 0.5
        s = d.decide().stall
    assert s is not None and s.silent_for < 3 * d.min_silence, s  # still there, silent: it waits for rank 0


def test_a_progress_bar_redrawn_with_the_same_count_is_not_life():
    """tqdm redraws its bar (a new elapsed time, the same count) while the loop is
    stuck: the alarm must neither wait for it nor end and come again."""
    from ddptop.core.analysis.analyzer import Analyzer
    from ddptop.core.model.events import ProgressEvent
    from helpers import log_line

    c = Clock()
    a = Analyzer(c)
    for step in range(1, 101):
        c.t += 0.2
        a.feed([ProgressEvent(c.t, rank=r, step=step, source="hook") for r in (0, 1)]
               + [log_line(c.t, rank=0, text=f" {step // 3}%|#  | {step}/300 [00:{step // 5:02d}<00:40, 5.0it/s]")])
        assert a.check(c.t) == []
    alarms = []
    for i in range(120):  # two minutes stuck at step 100; the bar redraws its clock every second
        c.t += 1.0
        a.feed([log_line(c.t, rank=0, text=f" 33%|#  | 100/300 [00:{20 + i:02d}<00:40, 5.0it/s]")])
        alarms += [x for x in a.check(c.t) if x.type == "stall"]
    assert len(alarms) == 1, [x.message for x in alarms]
    # a bar that moves is life again
    c.t += 1.0
    a.feed([log_line(c.t, rank=0, text=" 34%|#  | 101/300 [00:40<00:40, 5.0it/s]")])
    assert a.check(c.t) == [] and a.stall.active is None


def test_a_hooked_ranks_evaluation_bar_is_life_while_it_moves_and_none_once_it_stops():
    """Hooked ranks (their steps from the hook) in a long evaluation that draws no batch through a DataLoader:
    only their bars, 20 lines a second each, say they live.  The analyzer reads a hooked rank's lines for
    progress only when its last sign of life is a second old (a 1,024-rank viewer spent a quarter of its work
    parsing every line): a moving bar still keeps the job quiet for minutes; a bar redrawn with the same count
    is a stall."""
    from ddptop.core.analysis.analyzer import Analyzer
    from ddptop.core.model.events import ProgressEvent
    from helpers import log_line

    c = Clock()
    a = Analyzer(c)
    for step in range(1, 61):
        c.t += 0.5
        a.feed([ProgressEvent(c.t, rank=r, step=step, source="hook") for r in (0, 1)])
        assert a.check(c.t) == []
    for i in range(1, 20 * 120):  # two minutes of evaluation; a bar line every 50 ms on each rank
        c.t += 0.05
        a.feed([log_line(c.t, rank=r, text=f"Evaluating: {i * 100 // 2400}%|#  | {i}/2400 [00:{i // 20 % 60:02d}<01:00]")
                for r in (0, 1)])
        assert [x for x in a.check(c.t) if x.type == "stall"] == [], c.t
    alarms = []
    for j in range(20 * 60):  # stuck at 2399: the bars redraw their clocks, the count stays
        c.t += 0.05
        a.feed([log_line(c.t, rank=r, text=f"Evaluating: 99%|#  | 2399/2400 [02:{j // 20 % 60:02d}<00:01]")
                for r in (0, 1)])
        alarms += [x for x in a.check(c.t) if x.type == "stall"]
    assert len(alarms) == 1, [x.message for x in alarms]


def test_a_job_being_stopped_raises_no_new_stall():
    """After a stall, --on-stall kill (or the person) stops the job; a rank interrupted by the
    SIGTERM may draw one more batch and wait again: that is no second stall. A relaunch runs again."""
    from ddptop.core.analysis.analyzer import Analyzer
    from ddptop.core.model.events import ProgressEvent, StateEvent

    c = Clock()
    a = Analyzer(c)
    for step in range(1, 41):
        c.t += 0.2
        a.feed([ProgressEvent(c.t, rank=r, step=step, source="hook") for r in (0, 1)])
    alarms = []
    for _ in range(30):
        c.t += 1.0
        alarms += [x for x in a.check(c.t) if x.type == "stall"]
    assert len(alarms) == 1
    a.feed([StateEvent(c.t, state="stopping", message="stop requested")])
    c.t += 0.5
    a.feed([ProgressEvent(c.t, rank=0, step=41, source="hook")])  # interrupted, it stirs once more
    for _ in range(30):
        c.t += 1.0
        assert [x for x in a.check(c.t) if x.type == "stall"] == []
    a.feed([StateEvent(c.t, state="running", message="relaunching")])
    for step in range(1, 41):
        c.t += 0.2
        a.feed([ProgressEvent(c.t, rank=r, step=step, source="hook") for r in (0, 1)])
    for _ in range(30):
        c.t += 1.0
        alarms += [x for x in a.check(c.t) if x.type == "stall"]
    assert len(alarms) == 2


def watch_round(d, c, moving, counts, dt=5.0):
    """One round of the stack watch: each rank sampled; ``moving`` ranks' stacks changed."""
    c.t += dt
    for r in counts:
        counts[r] += 1 if r in moving else 0
        d.watch(r, counts[r], c.t)


def test_a_job_watched_by_its_stacks_alone_is_judged_after_the_watch_patience_not_the_grace():
    """No hook, no log progress (a job ddptop did not launch): moving stacks are
    life, however long; frozen ones are a stall after ``watch_patience``."""

    c = Clock()
    d = StallDetector(c)
    counts = {0: 0, 1: 0}
    for r in counts:
        d.watch(r, 0, c.t)
    for _ in range(60):  # five minutes of stacks that move: no alarm
        watch_round(d, c, {0, 1}, counts)
        assert d.decide().stall is None
    frozen_at = c.t
    alarm = None
    while alarm is None and c.t < frozen_at + 120:
        watch_round(d, c, set(), counts)
        if d.suspect() and d.verdict is None:
            d.stacks(StackVerdict(c.t, True, (1,), "hung: rank 1 is in `f` at train.py:9", {"1": {"line": 9}}))
        alarm = d.decide().stall
    assert alarm is not None and alarm.culprits == (1,) and alarm.where[1].line == 9
    assert c.t - frozen_at <= 40, c.t - frozen_at  # the watch patience (30 s), not the 120 s first-step grace


def test_a_watched_rank_that_moves_while_the_others_are_frozen_is_the_culprit():
    """Rank 1 spins in its own loop (its stack moves), rank 0 waits in a
    collective (frozen): stack samples say hung, and the mover is named."""

    c = Clock()
    d = StallDetector(c)
    counts = {0: 0, 1: 0}
    for r in counts:
        d.watch(r, 0, c.t)
    for _ in range(10):
        watch_round(d, c, {0, 1}, counts)
    quiet = c.t
    alarm = None
    asked = False
    while alarm is None and c.t < quiet + 120:
        watch_round(d, c, {1}, counts)
        if d.suspect() and not asked:
            asked = True
            d.stacks(StackVerdict(c.t, True, (1,), "hung: rank 1 is moving; rank 0 waits in `all_reduce`", {"1": {}}))
        alarm = d.decide().stall
        assert alarm is None or alarm.ranks == (0,)
    assert alarm is not None and alarm.culprits == (1,), "a mover beside a frozen rank must still be alarmed"
    # one alarm for the episode, while it lasts
    for _ in range(20):
        watch_round(d, c, {1}, counts)
        assert d.decide().stall is None
    # stacks that say work (every rank moving) never alarm
    d2 = StallDetector(c)
    for r in counts:
        d2.watch(r, counts[r], c.t)
    for _ in range(40):
        watch_round(d2, c, {1}, counts)
        if d2.suspect():
            d2.stacks(StackVerdict(c.t, False, (), "no hang"))
        assert d2.decide().stall is None


def test_each_nodes_stack_verdict_counts_whichever_arrives_last():
    """A multi-node view gets each node's own samples: one node's ranks hung is
    the job hung, even when another node (whose rank spins) says work after it."""

    for order in ((0, 1), (1, 0)):
        c = Clock()
        d = StallDetector(c)
        run_steps(d, c, [0, 1], 50, 0.2)
        c.t += 6.0
        said = [StackVerdict(c.t, False, (), "no hang: rank 0 is moving", node="node-a"),
                StackVerdict(c.t, True, (1,), "hung: rank 1 is in `f`", {"1": {"line": 3, "file": "/w/t.py", "function": "f", "status": "frozen", "kind": "user code"}}, node="node-b")]
        for i in order:
            d.stacks(said[i])
        alarm = None
        while alarm is None and c.t < 1000 + 60:
            c.t += 0.5
            alarm = d.decide().stall
        assert alarm is not None and alarm.culprits == (1,) and alarm.where[1].line == 3 and alarm.where[1].node == "node-b", order
        assert "rank 1 on node-b is in `f` at t.py:3" in alarm.message, alarm.message


# -- work is not a hang ------------------------------------------------------------------------------

def _hung(t, culprits, status, waiting=()):

    return StackVerdict(t, True, tuple(culprits), "hung: ...",
                        {r: {"rank": r, "status": status, "file": "train.py", "line": 30} for r in culprits},
                        waiting=tuple(waiting))


def test_a_rank_that_visibly_works_while_the_others_wait_is_not_a_hang_until_the_work_patience():
    """Rank 0 evaluates (or archives, uploads) alone for minutes while rank 1 waits in a barrier:
    its stack moves between samples. Not a hang; a hang only if it lasts past the work patience."""
    c = Clock()
    d = StallDetector(c, work_patience=300)
    run_steps(d, c, [0, 1], 20, 1.0)
    began = c.t
    c.t += 30
    d.stacks(_hung(c.t, [0], "moving", waiting=[1]))
    for _ in range(26):
        c.t += 10
        assert d.decide().stall is None, c.t - began
    c.t += 20  # 310 s of silence
    s = d.decide().stall
    assert s is not None and s.culprits == (0,) and "still working after" in s.message


def test_a_rank_frozen_on_a_child_process_that_works_is_working():
    """subprocess.run(["gzip", ...]) on rank 0: its stack is frozen, its child uses a core."""
    c = Clock()
    d = StallDetector(c, work_patience=300)
    run_steps(d, c, [0, 1], 20, 1.0)
    d.telemetry(0, cpu=0.5, children_cpu=99.0)
    d.telemetry(1, cpu=0.5, children_cpu=0.0)
    c.t += 30
    d.stacks(_hung(c.t, [0], "frozen", waiting=[1]))
    assert d.decide().stall is None
    d.telemetry(0, cpu=0.5, children_cpu=0.0)  # the child is done, or gone, and rank 0 still does not come
    s = d.decide().stall
    assert s is not None and s.culprits == (0,)


def test_every_rank_waiting_on_busy_data_loader_workers_is_working():
    c = Clock()
    d = StallDetector(c, work_patience=300)
    run_steps(d, c, [0, 1], 20, 1.0)
    for r in (0, 1):
        d.telemetry(r, cpu=1.0, children_cpu=50.0)
    c.t += 30
    d.stacks(_hung(c.t, [], "frozen"))
    assert d.decide().stall is None


def test_a_frozen_culprit_is_a_hang_at_once():
    c = Clock()
    d = StallDetector(c, work_patience=300)
    run_steps(d, c, [0, 1], 20, 1.0)
    c.t += 30
    d.stacks(_hung(c.t, [1], "frozen", waiting=[0]))
    s = d.decide().stall
    assert s is not None and s.culprits == (1,)


def test_a_job_that_logs_every_hundred_steps_is_judged_by_the_time_between_its_lines():
    """'step 100 ... step 200' every 16 s: 0.16 s per step, but the next line is due in 16 s."""
    c = Clock()
    d = StallDetector(c)
    for i in range(1, 9):
        c.t += 16.0
        for r in (0, 1):
            d.step(r, 100 * i)
        assert d.decide().stall is None
    for _ in range(15):  # the next line is late by less than the slack: no alarm
        c.t += 1.0
        assert d.decide().stall is None
    assert d.ranks[0].expected() == pytest.approx(0.16)
    c.t += 60
    s = d.decide().stall
    assert s is not None and "steps came every 0.16 s" in s.message


def test_a_pause_does_not_stretch_the_usual_interval():
    c = Clock()
    d = StallDetector(c)
    run_steps(d, c, [0, 1], 30, 0.5)
    c.t += 40  # an evaluation (its bar kept the alarm off)
    for r in (0, 1):
        d.other_progress(r)
    run_steps(d, c, [0, 1], 10, 0.5)
    assert d.ranks[0].expected() == pytest.approx(0.5)
    assert d.ranks[0].arrival_gap() == pytest.approx(0.5)


def test_output_is_life_when_no_progress_is_recognised_in_it():
    """A log format ddptop does not know ('2025-01-01 | 100 | loss 0.3'), no hook: its lines
    are its only sign of life, judged with the first-step grace from the last one."""
    c = Clock()
    d = StallDetector(c, first_step_grace=120)
    for _ in range(30):  # 6 minutes of a line every 12 s
        c.t += 12
        d.output(0)
        d.output(1)
        assert d.decide().stall is None
    c.t += 121
    assert d.decide().stall is not None


def test_ranks_frozen_in_different_collectives_are_a_mismatch():

    c = Clock()
    d = StallDetector(c)
    run_steps(d, c, [0, 1], 20, 1.0)
    c.t += 30
    where = {r: {"rank": r, "file": "t.py", "line": line, "call": call} for r, line, call in
             ((0, 21, "all_reduce"), (1, 48, "broadcast"))}
    d.stacks(StackVerdict(c.t, True, (), "hung, no single culprit: rank 0 waits in `all_reduce` (torch.distributed) "
                          "from `main` at t.py:21; rank 1 waits in `broadcast` (torch.distributed) from `main` at "
                          "t.py:48", where, waiting=(0, 1), mismatch=True))
    s = d.decide().stall
    assert s.kind == "mismatch" and s.culprits == () and {r: (w.line, w.call) for r, w in s.where.items()} == {0: (21, "all_reduce"), 1: (48, "broadcast")}
    assert "Collective mismatch" in s.message and "t.py:48" in s.message
    assert "flight-recorder" in s.suggested_profiles
    assert not any("t.py:48" in e for e in s.evidence)  # (said once, in the message)


def test_with_no_step_known_stacks_that_show_a_hang_end_the_grace():
    """No progress recognised (a start, or a log ddptop cannot read): the 120 s grace is for a
    slow start; stacks that show a rank frozen while the others wait in a collective are a hang."""
    c = Clock()
    d = StallDetector(c, first_step_grace=120)
    for _ in range(3):
        c.t += 12
        d.output(0)
        d.output(1)
    c.t += 65
    assert d.suspect() and d.decide().stall is None  # (not yet: no stacks)
    d.stacks(_hung(c.t, [1], "frozen", waiting=[0]))
    s = d.decide().stall
    assert s is not None and s.culprits == (1,) and "without new output" in s.message
    # a rank that works is still given the grace
    c2 = Clock()
    d2 = StallDetector(c2, first_step_grace=120)
    c2.t += 65
    d2.stacks(_hung(c2.t, [1], "moving", waiting=[0]))
    assert d2.decide().stall is None


# -- GPU waits (NCCL is asynchronous: waiting ranks spin at a CUDA sync point) ------------------------


def gpu_wait(rank, line, native=True, node=""):
    return {"rank": rank, "status": "frozen", "kind": "gpu-wait", "function": "<module>", "file": "/w/train.py",
            "line": line, "call": "cudart.cudaStreamSynchronize", "gpu": "libcudart" if native else "util",
            "native": "cudaStreamSynchronize (libcudart.so.12)" if native else "", "node": node}


def stuck(rank, line, call="time.sleep"):
    return {"rank": rank, "status": "frozen", "kind": "sleep/wait in user code", "function": "next_batch",
            "file": "/w/train.py", "line": line, "call": call}


def test_complete_stack_evidence_raises_the_alarm_before_the_learned_threshold():
    """Steps every 0.1 s; the samples (taken ~2 s into the silence) show rank 1 frozen in Python and
    ranks 0, 2 waiting on the GPU: the alarm comes with them, not at the 10 s floor."""
    c = Clock()
    d = StallDetector(c, can_sample=True)
    run_steps(d, c, [0, 1, 2], 50, 0.1)
    for r, u in ((0, 100.0), (1, 2.0), (2, 100.0)):
        d.telemetry(r, util=u, cpu=100.0 if u > 50 else 0.0)
    asked_at = None
    while asked_at is None and c.t < 1010:
        c.t += 0.25
        dec = d.decide()
        assert dec.stall is None
        if dec.sample:
            asked_at = c.t
    last = 1000 + 50 * 0.1
    assert asked_at is not None and 1.9 < asked_at - last < 2.6, asked_at - last
    c.t += 1.2  # two samples, a second apart
    d.stacks(StackVerdict(asked_at, True, (1,), "hung: ...", {0: gpu_wait(0, 88), 1: stuck(1, 60), 2: gpu_wait(2, 88)},
                          waiting=(0, 2)))
    s = d.decide().stall
    assert s is not None and s.culprits == (1,) and s.kind == "hot" and s.silent_for < 5, s
    assert "rank 1 is in `next_batch` at train.py:60 (`time.sleep`), its GPU idle (2%)" in s.message, s.message
    assert "Ranks 0,2 wait on the GPU at train.py:88 (`cudaStreamSynchronize`, the CUDA runtime), GPUs at 100%" in s.message
    assert s.where[1].line == 60


def test_ranks_spinning_on_the_gpu_at_different_lines_are_a_mismatch_naming_the_odd_one():
    c = Clock()
    d = StallDetector(c, can_sample=True)
    run_steps(d, c, [0, 1, 2], 50, 0.1)
    c.t += 2.5
    d.stacks(StackVerdict(c.t - 0.1, True, (1,), "hung: ...",
                          {0: gpu_wait(0, 88), 1: gpu_wait(1, 140), 2: gpu_wait(2, 88)}, waiting=(0, 2), mismatch=True))
    s = d.decide().stall
    assert s is not None and s.kind == "mismatch" and s.culprits == (1,)
    assert set(s.where) == {0, 1, 2} and s.where[1].line == 140
    assert s.suggested_profiles[0] == "flight-recorder"


def two_busy_ranks_sampled(where):
    """Two ranks stepping once a second, both GPUs at 100%, then sampled 3.5 s into a silence, both waiting
    (``where``: each rank's place): the clock and the detector."""
    c = Clock()
    d = StallDetector(c, can_sample=True)
    run_steps(d, c, [0, 1], 20, 1.0)
    for r in (0, 1):
        d.telemetry(r, util=100.0, cpu=100.0)
    c.t += 3.5
    d.stacks(StackVerdict(c.t, True, (), "hung, no single culprit: ...", where, waiting=(0, 1)))
    return c, d


def test_every_rank_waiting_at_one_sync_point_waits_for_the_threshold_and_is_not_vetoed():
    """All ranks at the same CUDA sync: a long GPU step looks the same, so no early alarm; but it is no
    'busy, working' veto either: at the learned threshold it is a hot stall with no single culprit."""
    c, d = two_busy_ranks_sampled({0: gpu_wait(0, 88), 1: gpu_wait(1, 88)})
    while c.t < 1020 + 9.5:
        assert d.decide().stall is None, c.t
        c.t += 0.5
    s = None
    while s is None and c.t < 1020 + 20:
        c.t += 0.5
        s = d.decide().stall
    assert s is not None and s.kind == "hot" and s.culprits == () and s.silent_for >= 10
    assert "Ranks 0,1 wait on the GPU at train.py:88" in s.message


def test_all_ranks_in_the_first_collective_alarm_when_the_grace_runs_out_with_p2p_off_first():
    c = Clock()
    d = StallDetector(c, can_sample=True)
    for r in (0, 1):
        d.rank(r)
        d.output(r, c.t)
        d.telemetry(r, util=100.0, cpu=100.0)
    # (the hook runs: no step yet, but no log line to count as progress either)
    d.ranks[0].batches = d.ranks[1].batches = 0
    c.t += 61
    d.stacks(StackVerdict(c.t, True, (), "hung, no single culprit: ...", {0: gpu_wait(0, 40), 1: gpu_wait(1, 40)},
                          waiting=(0, 1)))
    while c.t < 1000 + 119:
        assert d.decide().stall is None, c.t
        c.t += 1
    c.t += 2
    s = d.decide().stall
    assert s is not None and s.culprits == () and s.suggested_profiles[0] == "p2p-off"
    assert "since start-up without a first training step" in s.message


def test_a_healthy_long_gpu_step_stays_silent():
    """Every step sits 2-12 s at the sync point (all ranks wait on the GPU at one line): no alarm."""
    import random

    rnd = random.Random(7)
    c = Clock()
    d = StallDetector(c, can_sample=True)
    for r in (0, 1):
        d.telemetry(r, util=100.0, cpu=100.0)
    step = 0
    for _ in range(40):
        dt = rnd.uniform(2, 12)
        end = c.t + dt
        while c.t < end:
            c.t += 0.5
            dec = d.decide()
            assert dec.stall is None, (step, dt)
            if dec.sample:
                d.stacks(StackVerdict(c.t, True, (), "hung, no single culprit",
                                      {0: gpu_wait(0, 88), 1: gpu_wait(1, 88)}, waiting=(0, 1)))
        step += 1
        for r in (0, 1):
            d.step(r, step)


def test_a_peer_that_died_on_another_node_is_said_at_once_not_after_the_watchdog():
    """Rank 1 (another node: nothing stops rank 0 there) exits with code 1; rank 0 goes on spinning at its
    sync point. Said a few seconds after the death, naming rank 1 and how it ended."""
    c = Clock()
    d = StallDetector(c)
    run_steps(d, c, [0, 1], 30, 0.1)
    c.t += 0.05
    d.rank_ended(1, 1, c.t)
    s = None
    while s is None and c.t < 1010:
        c.t += 0.25
        s = d.decide().stall
    assert s is not None and s.kind == "lost-peer" and s.culprits == (1,)
    assert s.silent_for < 3.5 and "rank 1 exited with code 1" in s.message, s
    assert s.suggested_profiles[0] == "nccl-debug"


def test_ranks_that_torchrun_stops_after_a_peer_died_raise_no_stall():
    c = Clock()
    d = StallDetector(c)
    run_steps(d, c, [0, 1], 30, 0.1)
    d.rank_ended(1, 1, c.t + 0.05)
    d.rank_ended(0, -15, c.t + 0.5)  # torchrun's SIGTERM to the survivor
    c.t += 30
    assert d.decide().stall is None


def test_a_stall_raised_early_is_raised_once_until_progress_resumes():
    """(Raised on complete stack evidence before the threshold: the silence is still under the
    threshold at the next checks, which is no sign of progress.)"""
    c = Clock()
    d = StallDetector(c, can_sample=True)
    run_steps(d, c, [0, 1], 50, 0.1)
    c.t += 2.5
    d.stacks(StackVerdict(c.t - 0.5, True, (1,), "hung: ...", {0: gpu_wait(0, 88), 1: stuck(1, 60)}, waiting=(0,)))
    assert d.decide().stall is not None
    for _ in range(240):
        c.t += 0.5
        assert d.decide().stall is None
    run_steps(d, c, [0, 1], 5, 0.1)  # it moves again: a new hang is a new stall
    c.t += 2.5
    d.stacks(StackVerdict(c.t - 0.5, True, (1,), "hung: ...", {0: gpu_wait(0, 88), 1: stuck(1, 60)}, waiting=(0,)))
    assert d.decide().stall is not None


def test_a_rank_held_inside_a_kernel_launch_is_said_and_eager_loading_comes_first():
    """A rank stopped in cudaLaunchKernel (recorded on an H100: a first launch behind running kernels, under
    lazy module loading) while the other waits at its sync: the alarm says the launch is held by the GPU and
    puts the eager-load profile first; the same ranks at syncs only do not mention it."""
    def launching(rank, line):
        return dict(gpu_wait(rank, line), call="torch.Tensor.add_", native="cudaLaunchKernel (libcudart.so.13)",
                    status="frozen")

    def stall(where):
        c, d = two_busy_ranks_sampled(where)
        s = None
        while s is None and c.t < 1020 + 30:
            c.t += 0.5
            s = d.decide().stall
        assert s is not None
        return s

    s = stall({0: gpu_wait(0, 88), 1: launching(1, 91)})
    assert "Rank 1 waits inside a kernel launch" in s.message, s.message
    assert "CUDA_MODULE_LOADING=EAGER" in s.message
    assert s.suggested_profiles[0] == "eager-load" and len(set(s.suggested_profiles)) == len(s.suggested_profiles)
    plain = stall({0: gpu_wait(0, 88), 1: gpu_wait(1, 88)})
    assert "kernel launch" not in plain.message and "eager-load" not in plain.suggested_profiles
