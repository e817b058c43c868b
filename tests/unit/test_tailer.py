import os

from hypothesis import given, settings
from hypothesis import strategies as st

from ddptop.core.sources.log_tailer import MAX_LINE, Tailer


def write(p, b, mode="ab"):
    with open(p, mode) as f:
        f.write(b)


def texts(lines):
    return [l.text for l in lines if not l.transient]


def test_lines_arrive_as_the_file_grows(tmp_path):
    p = tmp_path / "log"
    write(p, b"one\ntw")
    t = Tailer(p)
    assert texts(t.read()) == ["one"]
    assert t.read() == []
    write(p, b"o\nthree\n")
    assert texts(t.read()) == ["two", "three"]


def test_missing_file_is_not_an_error(tmp_path):
    t = Tailer(tmp_path / "not-yet")
    assert t.read() == []
    write(tmp_path / "not-yet", b"late\n")
    assert texts(t.read()) == ["late"]


def test_invalid_utf8_is_replaced_not_fatal(tmp_path):
    p = tmp_path / "log"
    write(p, b"ok \xff\xfe\xc3 bytes\nnext\n")
    got = texts(Tailer(p).read())
    assert got[0].startswith("ok ") and "\ufffd" in got[0] and got[0].endswith(" bytes")
    assert got[1] == "next"


def test_multibyte_char_split_across_writes(tmp_path):
    p = tmp_path / "log"
    data = "héllo wörld ✓\n".encode()
    write(p, data[:2])
    t = Tailer(p)
    assert t.read() == []
    write(p, data[2:])
    assert texts(t.read()) == ["héllo wörld ✓"]


def test_ten_megabyte_line_is_cut_and_the_next_line_is_intact(tmp_path):
    p = tmp_path / "log"
    big = b"x" * (10 * 1024 * 1024)
    t = Tailer(p)
    # written in pieces, as a process would, without a newline for a while
    for i in range(0, len(big), 1024 * 1024):
        write(p, big[i : i + 1024 * 1024])
        for line in t.read():
            assert len(line.text) <= MAX_LINE
    write(p, b"\nafter\n")
    lines = []
    for _ in range(5):
        lines += t.read()
    assert texts(lines)[-1] == "after"
    assert lines[-1].offset == len(big) + 1
    # the whole line is still in the file: nothing lost
    assert os.path.getsize(p) == len(big) + len(b"\nafter\n")


def test_long_complete_line_is_marked_partial(tmp_path):
    p = tmp_path / "log"
    write(p, b"y" * (MAX_LINE + 10) + b"\nz\n")
    lines = Tailer(p).read()
    assert lines[0].partial and len(lines[0].text) == MAX_LINE
    assert lines[1].text == "z" and not lines[1].partial


def test_carriage_return_progress_updates_in_place(tmp_path):
    p = tmp_path / "log"
    write(p, b" 10%|#  | 1/10\r 20%|## | 2/10\r")
    t = Tailer(p)
    first = t.read()
    assert [(l.text, l.transient) for l in first] == [(" 20%|## | 2/10", True)]
    write(p, b"100%|###| 10/10\n")
    assert [(l.text, l.transient) for l in t.read()] == [("100%|###| 10/10", False)]


def test_crlf_line_endings(tmp_path):
    p = tmp_path / "log"
    write(p, b"a\r\nb\r\n")
    assert texts(Tailer(p).read()) == ["a", "b"]


def test_resume_from_offset_gives_the_same_lines(tmp_path):
    p = tmp_path / "log"
    write(p, b"".join(b"line %d\n" % i for i in range(100)))
    lines = Tailer(p).read()
    cut = lines[40]
    resumed = Tailer(p, offset=cut.offset).read()
    assert texts(resumed) == texts(lines[40:])


def test_flush_emits_a_last_unterminated_line(tmp_path):
    p = tmp_path / "log"
    write(p, b"a\nno newline at end")
    t = Tailer(p)
    assert texts(t.read()) == ["a"]
    assert texts(t.flush()) == ["no newline at end"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=20))
def test_any_bytes_in_any_chunks_never_crash_and_lose_no_short_line(tmp_path_factory, chunks):
    p = tmp_path_factory.mktemp("prop") / "log"
    write(p, b"", "wb")
    t = Tailer(p, max_line=10_000)
    got = []
    for c in chunks:
        write(p, c)
        got += t.read()
    got += t.flush()
    data = b"".join(chunks)
    expected = data.split(b"\n")
    if expected[-1] == b"":
        expected.pop()
    def shown(b):
        b = b.rstrip(b"\r") if b.endswith(b"\r") else b
        segs = [s for s in b.split(b"\r") if s]
        return (segs[-1] if segs else b"").decode("utf-8", "replace")
    assert texts(got) == [shown(b) for b in expected]


def test_a_read_of_whole_short_lines_keeps_one_text_split_only_when_asked(tmp_path):
    """The common read (whole lines, none long, no \\r) keeps the text it decoded as one (a printer uses it as
    it is); asked for, its lines and their byte offsets are those of the file, invalid UTF-8 replaced."""
    p = tmp_path / "log"
    raw = b"step 1 ok\n" + "caf\u00e9 \u2192 2\n".encode() + b"bad \xff\xfe end\n" + b"\n" + b"last\n"
    write(p, raw + b"unended")
    c = Tailer(p).read_chunk()
    assert c.kept_whole and len(c) == 5
    assert c.body == raw[:-1].decode("utf-8", "replace")
    assert c.texts == raw.decode("utf-8", "replace").split("\n")[:-1] and not c.kept_whole
    assert [raw[o:].split(b"\n", 1)[0].decode("utf-8", "replace") for o in c.offsets] == c.texts
    assert c.partial == () and not c.transient


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from([b"a", b"\xc3\xa9", b"\xff", b" "]), max_size=9).map(b"".join), max_size=12),
       st.lists(st.integers(1, 40), min_size=1, max_size=6))
def test_every_line_keeps_its_offset_and_a_long_one_is_cut_at_any_read_size(tmp_path_factory, lines, sizes):
    """Lines around max_line (6 bytes) read in reads of any size: each line once, at its byte offset, cut and
    marked partial exactly when longer than max_line, whether its read kept one text or made lines."""
    p = tmp_path_factory.mktemp("prop") / "log"
    data = b"".join(ln + b"\n" for ln in lines)
    write(p, data, "wb")
    t = Tailer(p, max_line=6)
    got = []
    i = 0
    while True:
        c = t.read_chunk(sizes[i % len(sizes)])
        i += 1
        if not c and t.at_eof():
            break
        got += c.lines()
    want, off = [], 0
    for ln in lines:
        want.append((off, len(ln) > 6))
        off += len(ln) + 1
    assert [(ln.offset, ln.partial) for ln in got] == want
    for ln, raw in zip(got, lines):
        if not ln.partial:
            assert ln.text == raw.decode("utf-8", "replace")
        else:  # (cut to 6 bytes, or up to 3 fewer: never inside a UTF-8 sequence)
            assert ln.text in {raw[:k].decode("utf-8", "replace") for k in range(3, 7)}
