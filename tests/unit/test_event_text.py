"""One event-to-text function for headless mode and the UI: both say the same words.

(In the UI's merged log: tests/ui/test_app_event_text.py.)"""

import time

from ddptop.core.analysis.event_text import describe
from ddptop.core.model.events import AlarmEvent, LinkEvent, NoteEvent, RankEvent, StacksEvent, StateEvent
from ddptop.core.model.evidence import Where
from ddptop.headless import format_text


def test_each_kind_in_words_and_headless_decorates_them():
    t = time.time()
    alarm = AlarmEvent(t, type="stall", id="stall-hot", message="Hot stall. Odd rank out: rank 1.", culprits=(1,),
                       node="node-b")
    assert format_text(alarm) == "!! ddptop ALARM [stall/stall-hot] Hot stall. Odd rank out: rank 1."
    assert describe(alarm, nodes=True).text == "ALARM [stall/stall-hot] (node-b) Hot stall. Odd rank out: rank 1."
    assert format_text(StateEvent(t, state="failed", exit_code=1, message="rank 1 died")) == (
        "== ddptop: job failed, exit code 1 (rank 1 died) ==")
    assert format_text(RankEvent(t, rank=1, local_rank=1, pid=42, alive=False, exit_code=-11, attempt=0)) == (
        "== ddptop: rank 1 (local 1, pid 42, attempt 0) exited with code -11 (SIGSEGV) ==")
    assert format_text(NoteEvent(t, "warning", "py-spy is missing")) == "== ddptop warning: py-spy is missing =="
    assert format_text(LinkEvent(t, node="n1", state="down", message="ssh exited 255", retry_in=2)) == (
        "== ddptop: link to n1 down: ssh exited 255 (retrying in 2 s, then less often, in silence) ==")
    # the same node still down: retried in silence, said again when it is back
    assert describe(LinkEvent(t, node="n1", state="down", message="ssh exited 255", retry_in=8, tries=4)) is None
    assert describe(LinkEvent(t, node="n1", state="connecting", message="ssh (try 5)", tries=4)) is None
    assert format_text(LinkEvent(t, node="n1", state="up", message="h, ddptop 0.1.0, run r", tries=4)) == (
        "== ddptop: link to n1 up: h, ddptop 0.1.0, run r (back after 4 tries) ==")
    st = StacksEvent(t, ranks=(0, 1), samples=2, span=1.0, hung=True, summary="hung: rank 1 is in main")
    assert format_text(st) == "== ddptop: stacks of 2 ranks, 2 samples over 1.0 s: frozen; hung: rank 1 is in main =="


def test_stacks_where_the_others_wait_for_a_working_rank_are_not_said_to_be_hung():
    """Rank 0 evaluates alone (its stack moves) while rank 1 waits in a barrier: the samples name
    rank 0 as the one waited for, and say it works; a frozen culprit is still 'frozen'."""
    from ddptop.ui.stacks_screen import stacks_markup

    t = time.time()
    working = StacksEvent(t, ranks=(0, 1), samples=2, span=1.0, hung=True, culprits=(0,),
                          summary="hung: rank 0 is moving (stack changes between samples), last in `evaluate`",
                          where={0: Where(0, "moving")})
    assert "the others wait for ranks that work" in format_text(working) and "frozen" not in format_text(working)
    markup = stacks_markup(working)
    assert "working, the others wait for it: rank 0" in markup and "culprit" not in markup
    frozen = StacksEvent(t, ranks=(0, 1), samples=2, span=1.0, hung=True, culprits=(1,), summary="hung: ...",
                         where={1: Where(1, "frozen")})
    assert ": frozen;" in format_text(frozen) and "culprit: rank 1" in stacks_markup(frozen)
