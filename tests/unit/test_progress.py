import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ddptop.core.analysis.progress import OTHER, TRAIN, parse_progress, parse_step

CASES = [
    # (real-world line, step, total, kind)
    (" 10/1752 [00:29<1:22:01, 2.83s/it]", 10, 1752, TRAIN),
    ("Epoch 0:   6%|▋         | 32040/500150 [1:02:11<15:08:42, 8.59it/s, v_num=3, loss=0.31]", 32040, 500150, TRAIN),
    ("Validation DataLoader 0:  40%|████      | 4/10 [00:01<00:02, 3.10it/s]", 4, 10, OTHER),
    ("{'loss': 0.7001, 'grad_norm': 1.2, 'learning_rate': 4.9e-05, 'epoch': 0.35, 'step': 700}", 700, None, TRAIN),
    ("Epoch [1/10], Step [100/600], Loss: 0.2231", 100, 600, TRAIN),
    ("step: 700  loss: 0.70", 700, None, TRAIN),
    ("2023-01-01 12:00:00,123 DEBUG TRAIN Batch 4/203700 loss 12.345 lr 1.0e-03 rank 0", 203700, None, TRAIN),
    ("2023-01-01 12:00:00,123 DEBUG CV Batch 4/200 loss 12.345", 200, None, OTHER),
    ("2023-06-05 10:10:10,101 INFO [train.py:892] Epoch 0, batch 1, loss[loss=3.1, over 1440 frames], tot_loss[...]", 1, None, TRAIN),
    ("Epoch: [3][ 100/3000]  Time 0.412  Loss 1.2  Acc 0.93", 100, 3000, TRAIN),
    ("[default0]:[rank0]: step 5 loss 0.1", 5, None, TRAIN),
    ("\x1b[32m[default1]:iter 30 lr 1e-4\x1b[0m", 30, None, TRAIN),
    ("Evaluating: 12/100 [00:03<00:20, 4.00it/s]", 12, 100, OTHER),
]


@pytest.mark.parametrize("line,step,total,kind", CASES)
def test_formats(line, step, total, kind):
    p = parse_progress(line)
    assert p is not None, line
    assert (p.step, p.total, p.kind) == (step, total, kind)


def test_checkpoint_lines_are_other_progress():
    p = parse_progress("Saving checkpoint to /ckpt/epoch-3.pt")
    assert p is not None and p.kind == OTHER and p.step is None


@pytest.mark.parametrize("line", ["loading data from /mnt/x", "rank 1 hangs now (injected fault)", "", "NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>"])
def test_non_progress_lines(line):
    assert parse_step(line) is None


def test_eval_progress_is_not_a_training_step():
    assert parse_step("Validation DataLoader 0:  40%|████      | 4/10 [00:01<00:02, 3.10it/s]") is None


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=2000))
def test_no_byte_sequence_crashes_the_parsers(data):
    # the inner functions: the public ones catch everything, so testing them could not fail
    from ddptop.core.analysis import progress
    from ddptop.core.analysis.signatures import SignatureMatcher
    text = data.decode("utf-8", "replace")
    progress._parse(text)
    SignatureMatcher()._feed(text, 0, 1, "")
    SignatureMatcher()._feed(text, None, None, "")


def test_a_line_the_progress_parser_fails_on_is_noted_once_and_later_lines_are_still_parsed(monkeypatch):
    """A parser bug on one line must neither pass silently nor turn progress
    detection off: one warning note (however often the bug strikes), and the
    steps after the bad lines are still counted."""
    from ddptop.core.analysis import progress
    from ddptop.core.analysis.analyzer import Analyzer
    from ddptop.core.model.events import AlarmEvent, NoteEvent
    from helpers import log_line
    from ddptop.core.run.pipeline import Pipeline

    inner = progress._parse

    def parse(text):
        if "BAD" in text:
            raise ValueError(f"cannot parse {text!r}")
        return inner(text)

    monkeypatch.setattr(progress, "_parse", parse)
    an = Analyzer(lambda: 0.0)
    out = []
    for step in range(1, 11):
        out += an.feed([log_line(float(step), rank=1, text=f"step {step} loss 0.5" + (" BAD" if step in (3, 6) else ""),
                                 path="logs/1/stdout.log")])
    notes = [e for e in out if isinstance(e, NoteEvent)]
    assert len(notes) == 1, notes
    assert notes[0].level == "warning" and notes[0].t == 3.0
    assert "progress parser failed on line 3 of rank 1's stdout: ValueError: cannot parse 'step 3 loss 0.5 BAD'" \
        in notes[0].message and "that line was skipped" in notes[0].message
    assert an.notes == notes and not [e for e in out if isinstance(e, AlarmEvent)]
    assert an.last_steps[1] == 10  # the lines after the bad ones still count
    assert an.stall.ranks[1].step == 10

    # the pipeline forwards the note into its owner's stream (and reacts to alarms only)
    reacted = []
    pipe = Pipeline(clock=lambda: 0.0, on_alarm=reacted.append)
    got = pipe.process([log_line(1.0, rank=0, text="step 1 BAD", path="logs/0/stdout.log")], 1.0)
    assert [type(e) for e in got] == [NoteEvent] and "line 1 of rank 0's stdout" in got[0].message
    pipe.react(got)
    assert reacted == []
    # (a transient progress-bar line has no line number)
    got = Pipeline(clock=lambda: 0.0).process([log_line(1.0, rank=0, text=" 5/9 [00:01<00:01] BAD", transient=True)])
    assert "failed on a line of rank 0's stdout" in got[0].message


_PIECES = ["Epoch ", "Epoch:", "epoch", "%|", "##", "|", "Step", "step", "global_step", "iter", "it", "iteration",
           "[", "]", "/", " [", "?", "TRAIN Batch ", "CV Batch ", ", batch ", "{", "}", "'loss': ", "'epoch': ",
           "'step': ", "eval", "Validation", "test", ":", "=", "#", " ", "  ", ",", "0", "1", "12", "345", "0.5", "-1e-3",
           "<", "s/it", "\x1b[31m", "\x1b[0m", "[default0]:", "[rank3]:", "saving", "checkpoint", "é", "²"]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=14))
@example(["12", "/", "?", " [", "0", "0.5", "s/it"])  # tqdm without a total
@example(["eval", ":", " ", "12", "%|", "##", "|", " ", "12", "/", "345", " [", "0", "1", ":", "0"])
@example(["Epoch ", "0", ":", "  ", "12", "%|", "##", "|", " ", "12", "/", "345", " [", "0"])
@example(["Epoch", " [", "1", "/", "12", "]", ",", " ", "Step", " [", "345", "/", "12", "]"])
@example(["Epoch:", " [", "3", "]", "[", " ", "12", "/", "345", "]"])
@example(["TRAIN Batch ", "0", "/", "12"])
@example(["Epoch ", "0", ", batch ", "12"])
@example(["{", "'loss': ", "0.5", ",", " ", "'epoch': ", "0.5", ",", " ", "'step': ", "12", "}"])
@example(["global_step", "=", "12"])
@example(["it", " ", "12"])
def test_the_format_guards_change_no_answer(pieces):
    """Each format's regex runs only on lines holding text it cannot match
    without: on any mix of the formats' own pieces, the answer is the one
    every regex gives when run on every line."""
    from ddptop.core.analysis.progress import _parse

    text = "".join(pieces)
    assert _parse(text) == _parse(text, guarded=False)


@pytest.mark.parametrize("line,step,total,kind", CASES)
def test_the_format_guards_keep_every_known_format(line, step, total, kind):
    from ddptop.core.analysis.progress import _parse

    assert _parse(line) == _parse(line, guarded=False)
