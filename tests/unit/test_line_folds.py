"""Lines that many ranks print alike, folded into one (core/analysis/line_folds.py), and the merged pane's
buffer that folds them (ui/logview.PaneBuffer): at 8 ranks and at 1,024."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddptop.core.analysis.line_folds import Folder, alike_key, alike_keys, range_text
from ddptop.ui.logview import Line, PaneBuffer, render_lines


def test_alike_means_equal_once_numbers_are_masked():
    assert alike_key("epoch 3 step 120 loss 0.4312 lr 3e-4") == alike_key("epoch 3 step 120 loss nan lr 1.5E-05")
    assert alike_key("ptr 0x7f00ab at 12") == alike_key("ptr 0xdead at 9")
    assert alike_key("loss   0.5") == alike_key("loss 0.7")  # spacing
    assert alike_key("epoch 3 train") != alike_key("epoch 3 eval")
    assert alike_key("x 1", "stdout") != alike_key("x 1", "stderr")


def test_ranks_are_said_as_runs():
    assert range_text(range(1024)) == "r0-1023"
    assert range_text([*range(0, 777), *range(778, 1024)]) == "r0-776,778-1023"
    assert range_text([5]) == "r5" and range_text([3, 1, 2, 9]) == "r1-3,9" and range_text([]) == ""


@pytest.mark.parametrize("order", ["live", "replay", "shuffled"])
def test_1024_ranks_each_printing_three_steps_fold_into_three_lines_in_any_arrival_order(order):
    """Live, the ranks' step-N lines interleave; in a replay, one rank's whole log comes before the next's.
    Either way the n-th line of a kind joins the others' n-th."""
    lines = [(r, s) for s in range(3) for r in range(1024)]  # live: step by step
    if order == "replay":
        lines = [(r, s) for r in range(1024) for s in range(3)]
    elif order == "shuffled":  # ranks interleaved at random, each rank's own lines in order
        rng, left = random.Random(7), {r: [0, 1, 2] for r in range(1024)}
        lines = []
        while left:
            r = rng.choice(list(left))
            lines.append((r, left[r].pop(0)))
            if not left[r]:
                del left[r]
    f = Folder(hold=2.0)
    for r, s in lines:
        f.add(r, "stdout", f"step {s} loss {r / 1000:.3f}", now=0.0)
    assert [x.label() for x in f.open] == ["r0-1023"] * 3
    first = {s: r for r, s in reversed(lines)}  # who printed each step first: the fold keeps that copy whole
    assert [x.text for x in f.open] == [f"step {s} loss {first[s] / 1000:.3f}" for s in range(3)]
    assert f.due(1.9) == [] and [x.n for x in f.due(2.0)] == [1, 2, 3] and f.open == []


def test_a_fold_waits_for_the_folds_before_it_and_open_max_closes_the_oldest():
    f = Folder(hold=2.0, open_max=3)
    f.add(0, "stdout", "epoch 1", now=0.0)
    f.add(0, "stdout", "saving checkpoint", now=0.5)
    f.add(1, "stdout", "epoch 1", now=1.5)  # the first fold is joined later than the second
    assert f.due(2.6) == []  # the second is due, but waits for the first (the log keeps its order)
    assert [x.text for x in f.due(3.5)] == ["epoch 1", "saving checkpoint"]
    for i in range(5):
        f.add(0, "stdout", f"line kind {'abcde'[i]}", now=4.0)
    assert [x.text for x in f.due(4.0)] == ["line kind a", "line kind b"]  # beyond open_max: the oldest


def test_after_a_relaunch_the_counting_starts_again():
    f = Folder()
    f.add(0, "stdout", "step 1", now=0.0)
    f.add(1, "stdout", "step 1", now=0.0)
    f.close_all(restart=True)
    f.add(1, "stdout", "step 1", now=5.0)  # rank 1's first line of the new attempt
    f.add(0, "stdout", "step 1", now=5.0)
    assert [x.label() for x in f.open] == ["r0-1"]


def merged_text(pane: PaneBuffer) -> list[str]:
    _, lines, _ = pane.take_render("")
    return render_lines(lines, True, [], 0, True).plain.splitlines() if lines else []


def test_the_merged_pane_folds_1024_ranks_alike_lines_and_keeps_a_rank_that_said_something_else():
    pane = PaneBuffer("merged", merged=True)
    pane.set_folding(True)
    for r in range(1024):
        pane.add(Line(r, "stdout", f"epoch 3 step 120 loss {r / 1000:.3f}"), now=0.0)
        if r == 777:
            pane.add(Line(r, "stdout", "next_batch: waiting for worker 3"), now=0.0)
    # at once, the fold is open: shown under the log, its range as wide as the ranks so far
    assert [ln.label for ln in pane.open_lines(4)] == ["r0-1023", ""]
    assert merged_text(pane) == []
    assert pane.tick(now=2.0)
    assert merged_text(pane) == ["[r0-1023] epoch 3 step 120 loss 0.000", "[r777] next_batch: waiting for worker 3"]
    assert pane.total == 1025 and pane.open_lines(4) == []


def test_a_torchrun_or_ddptop_line_closes_the_folds_before_it_so_the_order_holds():
    pane = PaneBuffer("merged", merged=True)
    pane.set_folding(True)
    for r in range(8):
        pane.add(Line(r, "stdout", "step 1"), now=0.0)
    pane.add(Line(-1, "note", "stall: no step progress"), now=0.1)
    for r in range(8):
        pane.add(Line(r, "stdout", "step 2"), now=0.2)
    pane.tick(now=9.0)
    assert merged_text(pane) == ["[r0-7] step 1", "[ddptop] stall: no step progress", "[r0-7] step 2"]


def test_without_folding_every_rank_line_is_kept_and_turning_it_off_keeps_the_open_folds():
    pane = PaneBuffer("merged", merged=True)
    for r in range(8):
        pane.add(Line(r, "stdout", "step 1"))
    assert merged_text(pane) == [f"[r{r}] step 1" for r in range(8)]
    pane.set_folding(True)
    for r in range(3):
        pane.add(Line(r, "stdout", "step 2"), now=0.0)
    pane.set_folding(False)
    pane.dirty = True
    assert merged_text(pane)[-1] == "[r0-2] step 2" and pane.folder is None


def test_a_rank_pane_shrinks_to_its_share_and_keeps_its_newest_lines():
    pane = PaneBuffer("r5")
    for i in range(3000):
        pane.add(Line(5, "stdout", f"line {i}"))
    pane.resize(1000)
    assert len(pane.lines) == 1000 and pane.lines[0].text == "line 2000" and pane.lines[-1].text == "line 2999"


def test_a_live_flood_beyond_the_fold_rate_is_counted_and_its_folds_say_they_may_lack_ranks_a_replay_folds_all():
    from ddptop.ui.logview import FOLD_RATE

    def flood(capped: bool) -> PaneBuffer:
        pane = PaneBuffer("merged", merged=True)
        pane.set_folding(True)
        pane.fold_capped = capped
        for r in range(1024):  # one batch per rank, at once: far more than a second's FOLD_RATE
            batch = [Line(r, "stdout", f"step {s} loss 0.5") for s in range(3 * FOLD_RATE // 1024 + 1)]
            pane.add_many(batch, len(batch))
        pane.tick(now=1e12)
        return pane

    live = flood(True)
    _, lines, hidden = live.take_render("")
    assert hidden > 0  # said as "… N lines not shown"
    assert lines and all(ln.label.endswith("+") for ln in lines)  # "[r0-345+]": more ranks may have printed it
    _, lines, hidden = flood(False).take_render("")
    assert hidden == 0 and {ln.label for ln in lines} == {"r0-1023"}


@given(st.lists(st.text(alphabet=st.sampled_from(list("ab x0123456789.eE-+\t\r\n nanifNAIF0xAF")), max_size=30),
                min_size=1, max_size=8))
def test_a_batchs_keys_are_each_lines_own_key(texts):
    """Keys made for a whole batch at once (the replay of a large job) equal each line's own: no number, space or
    newline of one line leaks into its neighbour's key."""
    assert alike_keys(texts, "stdout") == [alike_key(t, "stdout") for t in texts]
    # (a nan or inf in any case is masked whatever its neighbours: found by a reviewer's fuzzing)
    assert alike_keys(["\rinF", "9\rnan0n\t"], "s")[0] == alike_key("\rinF", "s") == b"s\0#"
    assert alike_keys(texts, "stdout") == [alike_keys([t], "stdout")[0] for t in texts]


def test_folding_a_batch_is_folding_its_lines_one_by_one():
    one, many = Folder(), Folder()
    for r in range(4):
        texts = [f"epoch {e} step {s}  loss {r / 7:.3f}" for e in range(3) for s in range(5)] + ["done", "", "  x  "]
        for t in texts:
            one.add(r, "stdout", t, now=0.0)
        many.add_many(r, "stdout", texts, now=0.0)
    assert [(f.key, f.n, sorted(f.ranks), f.text) for f in one.open] == \
        [(f.key, f.n, sorted(f.ranks), f.text) for f in many.open]


@given(st.lists(st.tuples(st.integers(0, 7), st.sampled_from(["stdout", "stderr", None]),
                          st.sampled_from(["step {} loss 0.{}", "epoch {} eval {}", "x\ty {}  {}", "nan {} 0x{}f"]),
                          st.integers(0, 3), st.integers(1, 3)), max_size=40))
def test_many_batches_added_at_once_fold_and_order_as_one_by_one(batches):
    """A live view adds the merged pane's batches of a moment at once (their keys made together); what it
    shows is what adding them one line at a time shows: the same folds, ranges and order, a torchrun line
    (rank None) still closing the folds before it."""
    made = []
    for i, (rank, stream, fmt, a, n) in enumerate(batches):
        r = None if stream is None else rank
        made.append([Line(r, stream or "stdout", fmt.format(a + j, i)) for j in range(n)])
    one, many = PaneBuffer("merged", merged=True), PaneBuffer("merged", merged=True)
    for pane in (one, many):
        pane.set_folding(True)
        pane.fold_capped = False
    for lines in made:
        for line in lines:
            one.add(line, now=0.0)
    many.add_batches([(lines, len(lines)) for lines in made])
    shown = [([ln.label for ln in p.open_lines(100)], [ln.text for ln in p.open_lines(100)]) for p in (one, many)]
    assert shown[0] == shown[1]
    one.tick(now=1e9)
    many.tick(now=1e9)
    assert merged_text(one) == merged_text(many) and one.total == many.total
