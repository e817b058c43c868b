"""Log batches: one event per read of one file, and the per-line form --json keeps."""

import json

import pytest

from ddptop.core.model.events import BadEvent, LogBatch, LogEvent, from_dict, from_json
from ddptop.headless import format_text
from ddptop.core.sources.log_tailer import Tailer

TEXTS = ['step 1 loss 0.5', 'quote " and \\ backslash', "héllo wörld ✓", "\udcff lone surrogate", "", "tab\there"]


def batch(**kw):
    fields = dict(t=1712.25, rank=3, stream="stdout", attempt=1, path="logs/x/attempt_1/3/stdout.log", node="",
                  offsets=tuple(range(0, 60, 10)), texts=tuple(TEXTS), partial=(), transient=False)
    fields.update(kw)
    return LogBatch(**fields)


@pytest.mark.parametrize("partial,transient,rank,node", [((), False, 3, ""), ((1, 5), True, None, "node-b"),
                                                          ((5,), False, 0, ""), ((), True, 2, "n")])
def test_json_lines_are_todays_log_objects(partial, transient, rank, node):
    """--json prints one `log` object per line with the fields it always had."""
    b = batch(partial=partial, transient=transient, rank=rank, node=node)
    printed = b.json_lines().split("\n")
    assert len(printed) == len(TEXTS)
    for i, (line, text) in enumerate(zip(printed, TEXTS)):
        ev = LogEvent(b.t, rank, "stdout", text, 1, b.path, i * 10, i in partial,
                      transient and i == len(TEXTS) - 1, node)
        assert line == ev.to_json()
        if "\udcff" not in text:  # (json.dumps cannot encode a lone surrogate to UTF-8 either)
            assert json.loads(line) == {"t": b.t, "kind": "log", **ev.__dict__}
    assert [e.to_json() for e in b.lines()] == printed


def test_a_batch_round_trips_through_json():
    b = batch(partial=(2,), transient=True)
    again = from_json(b.to_json())
    assert again == b and isinstance(again, LogBatch)
    assert again.done == tuple(TEXTS[:-1]) and again.live == TEXTS[-1]


@pytest.mark.parametrize("change,why", [
    ({"offsets": [0, 1]}, "different number of offsets and texts"),
    ({"partial": [7]}, "index out of range"),
    ({"texts": ["a", 2, "c", "d", "e", "f"]}, "field 'texts'"),
    ({"offsets": "0123456"}, "field 'offsets'"),
    ({"transient": "yes"}, "field 'transient'"),
])
def test_a_damaged_batch_is_refused_naming_the_field(change, why):
    d = {**batch().to_dict(), **change}
    with pytest.raises(BadEvent, match=why):
        from_dict(d)


def test_headless_text_of_a_batch():
    b = LogBatch(1.0, 1, "stderr", 0, "p", "", (0, 4, 8), ("a", "b", "50%|##"), (), True)
    assert format_text(b) == "[r1!] a\n[r1!] b"  # the bar's redraw is left out
    assert format_text(LogBatch(1.0, None, "torchrun", 0, "t", "", (0,), ("x",))) == "[torchrun] x"
    assert format_text(LogBatch(1.0, 0, "stdout", 0, "p", "", (0,), ("10%",), (), True)) is None


def test_tailer_chunks_carry_every_line_with_its_offset(tmp_path):
    """Lines read in chunks of any size: the texts, and offsets that point at each line's first byte."""
    f = tmp_path / "x.log"
    raw = "".join(f"{t} {i}\n" for i, t in enumerate(TEXTS * 50)).encode("utf-8", "surrogateescape") + b"\xff bad\n"
    f.write_bytes(raw)
    for size in (1, 7, 64, 1 << 20):
        t = Tailer(f)
        texts, offsets = [], []
        while True:
            c = t.read_chunk(size)
            if not c.texts and t.at_eof():
                break
            texts += c.texts
            offsets += c.offsets
        want = raw.decode("utf-8", "replace").split("\n")[:-1]
        assert texts == want
        assert [raw[o:].split(b"\n", 1)[0].decode("utf-8", "replace") for o in offsets] == want


# -- typed evidence in events: read once from JSON, written back as the same JSON ---------------------------

OLD_ALARM = ('{"t": 5.0, "kind": "alarm", "type": "stall", "id": "stall-collective", "ranks": [0, 1], "culprits": [1],'
             ' "message": "Collective hang", "node": "all nodes",'
             ' "where": {"1": {"rank": 1, "function": "next_batch", "file": "train.py", "line": 60,'
             ' "kind": "sleep/wait in user code", "status": "frozen", "node": "node-b", "gpu": "libcudart"}},'
             ' "folded": [{"t": 4.0, "node": "node-b", "id": "stall-idle", "culprits": [1], "message": "m"}]}')


def test_an_alarm_an_earlier_release_wrote_reads_typed_and_writes_back_the_same():
    from ddptop.core.model.events import AlarmEvent, from_json
    from ddptop.core.model.evidence import FoldedAlarm, Where

    a = from_json(OLD_ALARM)
    assert isinstance(a, AlarmEvent) and set(a.where) == {1}
    w = a.where[1]
    assert isinstance(w, Where) and (w.rank, w.line, w.node) == (1, 60, "node-b")
    assert w.gpu == "cuda-runtime"  # (an earlier release's library name, read as today's key)
    assert a.folded == (FoldedAlarm(4.0, "node-b", "stall-idle", (1,), "m"),)
    again = json.loads(a.to_json())
    assert again["where"]["1"]["line"] == 60 and again["where"]["1"]["node"] == "node-b"
    assert again["folded"] == [{"t": 4.0, "node": "node-b", "id": "stall-idle", "culprits": [1], "message": "m"}]
    assert from_json(a.to_json()) == a


def test_stacks_and_ras_events_carry_typed_groups_and_rank_keys():
    from ddptop.core.model.events import RasEvent, StacksEvent, from_dict
    from ddptop.core.model.evidence import StackGroup, StackEvidence

    s = from_dict({"t": 1.0, "kind": "stacks", "ranks": [0, 1], "hung": True, "culprits": [1], "waiting": [0],
                   "where": {"0": {"status": "frozen", "kind": "collective"}, "1": {"status": "frozen"}},
                   "groups": [{"ranks": [0], "state": "frozen", "kind": "collective", "text": "all_reduce"}]})
    assert isinstance(s, StacksEvent) and s.groups == (StackGroup((0,), "frozen", "collective", "all_reduce"),)
    assert s.where[0].rank == 0 and s.where[0].waiting and s.where[1].rank == 1
    v = StackEvidence.from_event(s)
    assert v.waiting == (0,) and v.where[0].kind == "collective"
    r = from_dict({"t": 1.0, "kind": "ras", "ok": True, "behind": {"3": "AllReduce #11 (others #12)"}})
    assert isinstance(r, RasEvent) and r.behind == {3: "AllReduce #11 (others #12)"}
    assert json.loads(r.to_json())["behind"] == {"3": "AllReduce #11 (others #12)"}


@pytest.mark.parametrize("bad,why", [
    ({"where": {"x": {}}}, "expected a rank"),
    ({"where": {"1": "frozen"}}, "expected an object"),
    ({"groups": ["a"]}, "expected an object"),
])
def test_a_damaged_typed_field_is_refused_naming_it(bad, why):
    from ddptop.core.model.events import BadEvent, from_dict

    with pytest.raises(BadEvent, match=why):
        from_dict({"t": 1.0, "kind": "stacks", **bad})


@pytest.mark.parametrize("change,why", [
    ({"util": "hot"}, "field 'util'"),
    ({"index": True}, "field 'index'"),  # a bool is no GPU index (JSON true is not 1)
    ({"index": 1.5}, "field 'index'"),
    ({"name": 7}, "field 'name'"),
    ({"simulated": 1}, "field 'simulated'"),
])
def test_a_reading_of_the_wrong_type_is_refused_naming_the_field(change, why):
    """Readings of exactly their type are taken as they are (thousands a second at 128 nodes); any other
    type still meets the field's checker."""
    from ddptop.core.model.events import GpuEvent

    d = {**GpuEvent(1.0, index=0, util=50.0).to_dict(), **change}
    with pytest.raises(BadEvent, match=why):
        from_dict(d)
    ok = from_dict({**GpuEvent(1.0, index=0).to_dict(), "util": 99, "mem_used": None})
    assert isinstance(ok, GpuEvent) and ok.util == 99 and ok.mem_used is None


def test_every_kind_read_back_is_the_event_its_constructor_makes():
    """from_dict builds an event's fields without the dataclass's __init__ (27 one-by-one sets for a GPU
    reading): what it makes must be what the constructor makes, field for field and in the same order (the
    JSON written back keeps it), with each kind's defaults where a field is missing and a fresh object for
    fields made by a factory."""
    import dataclasses

    from ddptop.core.model.events import _KINDS, GpuEvent, RasEvent

    for cls in _KINDS.values():
        made = cls(1.5)
        back = from_dict({"kind": cls.kind, "t": 1.5})
        assert type(back) is cls and back == made and list(vars(back)) == list(vars(made)), cls.__name__
        assert back.to_json() == made.to_json() and from_dict(made.to_dict()) == made
        for f in dataclasses.fields(cls):
            if f.default_factory is not dataclasses.MISSING:  # (not shared between events)
                assert getattr(back, f.name) is not getattr(from_dict({"kind": cls.kind, "t": 2.0}), f.name)
    g = GpuEvent(3.0, index=2, util=97.0, ranks=(4, 5), pids=(10, 11), node="n7")
    back = from_dict(json.loads(g.to_json()))
    assert back == g and back.ranks == (4, 5) and hash(back) == hash(g) and repr(back) == repr(g)
    r = from_dict({"kind": "ras", "t": 1.0, "behind": {"3": "x"}})
    assert isinstance(r, RasEvent) and r.behind == {3: "x"}
    with pytest.raises(BadEvent, match="without a time"):
        from_dict({"kind": "gpu", "index": 1})


def test_a_batch_of_one_kept_text_reads_as_its_lines_everywhere(tmp_path):
    """A batch made from a read that kept its lines as one text (never split by the headless printer) gives the
    same lines, offsets, dict, --json, pickle and printed text as one made from the lines themselves."""
    import pickle

    from ddptop.core.sources.log_tailer import Chunk

    f = tmp_path / "x.log"
    f.write_bytes(b"a 1\ncaf\xc3\xa9 \xff\nlast\n")
    c = Tailer(f).read_chunk()
    assert c.kept_whole
    lazy = LogBatch.of_chunk(5.0, 1, "stdout", 0, "logs/x.log", c, node="n1")
    text = lazy.done_text()
    assert c.kept_whole and text == "a 1\ncaf\u00e9 \ufffd\nlast"  # (given without splitting)
    assert format_text(lazy) == "[r1] a 1\n[r1] caf\u00e9 \ufffd\n[r1] last"
    back = pickle.loads(pickle.dumps(lazy))  # (what a reading process sends the TUI)
    eager = LogBatch.of_chunk(5.0, 1, "stdout", 0, "logs/x.log", Chunk(c.offsets, c.texts), node="n1")
    for b in (back, lazy, eager):
        assert b.texts == ["a 1", "caf\u00e9 \ufffd", "last"] and b.offsets == [0, 4, 12] and len(b) == 3
        assert b.to_dict() == eager.to_dict() and b.json_lines() == eager.json_lines()
        assert [ln.text for ln in b.lines()] == b.texts and b.done_text() == text and format_text(b) == format_text(eager)
    assert "_chunk" not in vars(lazy)  # (split once read: a pickled batch carries its lines in one form)
    assert LogBatch.of_chunk(5.0, 1, "stdout", 0, "p", Chunk([0], ["10%"], (), True)).done_text() is None
    with pytest.raises(AttributeError):
        lazy.nothing  # noqa: B018 - (only its lines are made on first read)
