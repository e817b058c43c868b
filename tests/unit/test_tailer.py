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
