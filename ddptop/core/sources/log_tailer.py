"""Tail a growing log file by byte offset.

Never holds more than one bounded line in memory, never raises on bad bytes:
invalid UTF-8 is replaced, lines longer than ``max_line`` are cut (the whole
line stays in the file), ``\\r`` progress updates become transient lines.
"""

from __future__ import annotations

import os
from itertools import accumulate, count
from operator import add
from typing import BinaryIO, NamedTuple

MAX_LINE = 64 * 1024
READ_CHUNK = 4 * 1024 * 1024
MIN_SHARE = 64 * 1024  # a file's share of a poll's read budget, at least
READ_AT_LEAST = 4096  # bytes a read asks for, at least (a file grown since its size was looked at is read on)


def read_share(budget: int, files: int) -> int:
    """Bytes each of ``files`` files may give one poll whose read budget is
    ``budget`` (memory stays bounded however many files; at least MIN_SHARE,
    or the whole budget when that is smaller)."""
    return max(min(budget, MIN_SHARE), budget // max(1, files))


class Line(NamedTuple):
    offset: int  # byte offset of the line's first byte in the file
    text: str
    partial: bool = False  # cut: the line was longer than max_line
    transient: bool = False  # unfinished line shown in place (\r update)


class Chunk:
    """The lines of one read, as parallel lists (no object per line).

    ``partial``: indices of lines cut because they were longer than max_line;
    ``transient``: the last line is an unfinished in-place (``\\r``) update.

    A read of whole lines only, each short and without a ``\\r`` (the common
    case: a log read at any pace, a finished run replayed), keeps them as the
    one text it decoded (``body``) and makes the per-line lists (``texts``,
    ``offsets``) the first time they are asked for: a reader that can use the
    text as it is (the headless printer) never pays for a str and an int a line.
    """

    __slots__ = ("_offsets", "_texts", "partial", "transient", "_body", "_raw", "_first", "_start")

    def __init__(self, offsets: list[int], texts: list[str], partial: tuple[int, ...] = (),
                 transient: bool = False) -> None:
        self._offsets: list[int] | None = offsets
        self._texts: list[str] | None = texts
        self.partial = partial
        self.transient = transient
        self._body: str | None = None
        self._raw: bytes | None = None
        self._first = self._start = 0

    @classmethod
    def whole(cls, first: int, start: int, body: str, raw: bytes | None) -> Chunk:
        """Whole lines kept as one text: ``body``, the lines joined by newlines, decoded from ``raw`` (given
        when it is not ASCII: offsets count bytes); the first line begins at byte ``first``, the bytes of
        ``raw`` at ``start`` (later, when an earlier read dropped the overwritten updates of its ``\\r`` line)."""
        c = cls.__new__(cls)
        c._offsets = c._texts = None
        c.partial, c.transient = (), False
        c._body, c._raw, c._first, c._start = body, raw, first, start
        return c

    @property
    def texts(self) -> list[str]:
        if self._texts is None:
            self._split()
        assert self._texts is not None
        return self._texts

    @property
    def offsets(self) -> list[int]:
        if self._offsets is None:
            self._split()
        assert self._offsets is not None
        return self._offsets

    @property
    def body(self) -> str:
        """The texts joined by newlines (the one text itself when the read kept one)."""
        return self._body if self._body is not None else "\n".join(self.texts)

    @property
    def kept_whole(self) -> bool:
        """The lines are kept as one text (``body``), not yet split."""
        return self._texts is None

    def _split(self) -> None:
        body = self._body
        assert body is not None
        texts = body.split("\n")
        if self._raw is None:
            lens = list(map(len, texts))  # (ASCII: a character is a byte)
        else:
            parts = self._raw.split(b"\n")
            lens = list(map(len, parts))
            if len(parts) != len(texts):  # (cannot happen: a replacement never swallows a newline)
                texts = [p.decode("utf-8", "replace") for p in parts]
        offsets = list(map(add, accumulate(lens, initial=self._start), count()))
        offsets.pop()  # (the end of the last line)
        offsets[0] = self._first
        self._texts, self._offsets = texts, offsets

    def __bool__(self) -> bool:
        return self._texts is None or bool(self._texts)

    def __len__(self) -> int:
        return len(self.texts) if self._texts is not None or self._body is None else self._body.count("\n") + 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Chunk):
            return NotImplemented
        return (self.offsets, self.texts, self.partial, self.transient) == \
            (other.offsets, other.texts, other.partial, other.transient)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Chunk(offsets={self.offsets!r}, texts={self.texts!r}, partial={self.partial!r}, " \
               f"transient={self.transient!r})"

    def lines(self) -> list[Line]:
        cut = set(self.partial)
        last = len(self.texts) - 1
        return [Line(o, t, i in cut, self.transient and i == last)
                for i, (o, t) in enumerate(zip(self.offsets, self.texts))]


EMPTY = Chunk([], [])


def _decode(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _cut(b: bytes, limit: int) -> bytes:
    """Cut to at most ``limit`` bytes without splitting a UTF-8 sequence."""
    if len(b) <= limit:
        return b
    end = limit
    # step back over continuation bytes (10xxxxxx) to a character start
    while end > 0 and (b[end] & 0xC0) == 0x80 and limit - end < 4:
        end -= 1
    return b[:end]


def _short_lines(b: bytes, limit: int) -> bool:
    """No line of ``b`` (lines joined by newlines) is longer than ``limit`` bytes: one look per ``limit``
    bytes, not one per line (the last newline within ``limit`` bytes of a line's start ends every line
    that starts before it)."""
    pos, end = 0, len(b)
    while end - pos > limit:
        nl = b.rfind(b"\n", pos, pos + limit + 1)
        if nl < 0:
            return False
        pos = nl + 1
    return True


def _last_cr_segment(b: bytes) -> bytes:
    """What a terminal shows for a line with carriage returns in it."""
    if b"\r" not in b:
        return b
    for seg in reversed(b.split(b"\r")):
        if seg:
            return seg
    return b""


class Tailer:
    def __init__(self, path: str | os.PathLike, offset: int = 0, max_line: int = MAX_LINE):
        self.path = os.fspath(path)
        self.pos = offset  # next byte to read
        self.line_start = offset  # offset of the first byte of the pending line's kept bytes
        # where the pending line really starts (line_start moves past the
        # overwritten segments of a \r progress line; this does not)
        self._origin = offset
        self.max_line = max_line
        self._carry = b""  # bytes of the pending (unterminated) line
        self._skipping = False  # inside an over-long line whose head was emitted
        self._last_transient = b""
        self._f: BinaryIO | None = None
        self._ino: int | None = None
        self._size = 0  # the file's size when the last read began
        if offset > 0:
            # resuming at a byte offset (a reconnecting ``ddptop attach``): the
            # cursor is a line start (after a newline), or inside an over-long
            # line whose head was returned: that one is skipped to its end
            try:
                with open(self.path, "rb") as f:
                    f.seek(offset - 1)
                    self._skipping = f.read(1) != b"\n"
            except OSError:
                pass

    @property
    def cursor(self) -> int:
        """Resume here (``Tailer(path, cursor)``) to get exactly the lines not yet returned."""
        return self._origin

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def _open(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            self._size = 0
            return False
        self._size = st.st_size
        if self._f is not None and (st.st_ino != self._ino or st.st_size < self.pos):
            # replaced or truncated: start over from the beginning of the new file
            self.close()
            self.pos = self.line_start = self._origin = 0
            self._carry = b""
            self._skipping = False
        if self._f is None:
            try:
                self._f = open(self.path, "rb")
            except OSError:
                return False
            self._ino = st.st_ino
        return True

    def left(self) -> bool:
        """Bytes were left unread by the last read (the file was longer, when it
        began, than what it took): read again before waiting for the file to
        change.  No system call (``at_eof`` looks at the file now)."""
        return self._size > self.pos

    def at_eof(self) -> bool:
        try:
            return os.stat(self.path).st_size <= self.pos
        except OSError:
            return True

    def read(self, max_bytes: int = READ_CHUNK) -> list[Line]:
        """Read what was appended since the last call (at most ``max_bytes``)."""
        return self.read_chunk(max_bytes).lines()

    def read_chunk(self, max_bytes: int = READ_CHUNK) -> Chunk:
        """``read`` as one Chunk: the hot path (no object per line)."""
        if not self._open():
            return EMPTY
        f = self._f
        if f is None or self._size <= self.pos:
            return EMPTY  # (nothing appended: no seek, no read)
        f.seek(self.pos)
        # (what the file holds past pos when looked at, if less: no buffer of max_bytes made for a few lines;
        # a file grown since is read on)
        data = f.read(min(max_bytes, max(self._size - self.pos, READ_AT_LEAST)))
        if not data:
            return EMPTY
        self.pos += len(data)
        return self._feed(data)

    def flush(self) -> list[Line]:
        return self.flush_chunk().lines()

    def flush_chunk(self) -> Chunk:
        """Emit a pending unterminated line (at the end of a finished file)."""
        out = EMPTY
        if self._carry and not self._skipping:
            text = _last_cr_segment(self._carry.rstrip(b"\r"))
            out = Chunk([self._origin], [_decode(text)])
            self.line_start += len(self._carry)
        self._origin = self.line_start
        self._carry = b""
        self._skipping = False
        return out

    def _feed(self, data: bytes) -> Chunk:
        offsets: list[int] = []
        texts: list[str] = []
        partial: list[int] = []
        transient = False
        max_line = self.max_line
        if self._skipping:
            nl = data.find(b"\n")
            if nl < 0:
                self.line_start += len(data)
                self._origin = self.line_start
                return EMPTY
            self.line_start += nl + 1
            self._origin = self.line_start
            data = data[nl + 1 :]
            self._skipping = False
        if self._carry:
            data = self._carry + data
            self._carry = b""
        start = self.line_start
        last_nl = data.rfind(b"\n")
        ended = last_nl >= 0
        tail = data[last_nl + 1 :]
        body = data[:last_nl] if ended else b""
        slow: list[bytes] = []
        kept: Chunk | None = None
        if ended and b"\r" not in body and _short_lines(body, max_line):
            # the common case: whole, short lines without \r, kept as the one text they decode to (split
            # into lines when a reader asks for them); no per-line Python code
            plain = body.isascii()
            kept = Chunk.whole(self._origin, start, body.decode("ascii") if plain else _decode(body),
                               None if plain else body)
            start += len(body) + 1  # past the last line's newline
        elif ended:
            slow = body.split(b"\n")
        for raw in slow:
            n = len(raw) + 1
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            if b"\r" in raw:
                raw = _last_cr_segment(raw)
            offsets.append(start)
            if len(raw) > max_line:
                partial.append(len(texts))
                texts.append(_decode(_cut(raw, max_line)))
            else:
                texts.append(raw.decode("utf-8", "replace"))
            start += n
        self.line_start = start
        if offsets and offsets[0] != self._origin:
            offsets[0] = self._origin  # its head was a \r update cut earlier
        if ended:
            self._origin = start  # a new line begins after the last newline
            self._last_transient = b""
        if tail:
            if len(tail) > max_line and b"\r" not in tail[-max_line:]:
                # an endless line: emit its head once, skip the rest until newline
                if kept is not None:
                    offsets, texts, kept = kept.offsets, kept.texts, None
                partial.append(len(texts))
                offsets.append(self._origin)
                texts.append(_decode(_cut(tail, max_line)))
                self.line_start += len(tail)
                self._origin = self.line_start
                self._skipping = True
            else:
                if b"\r" in tail:
                    # progress bar updating in place: keep only the last segment
                    # (keep the last non-empty segment: it is what is shown)
                    cut = tail.rstrip(b"\r").rfind(b"\r")
                    seg = _last_cr_segment(tail)
                    if seg and seg != self._last_transient:
                        if kept is not None:
                            offsets, texts, kept = kept.offsets, kept.texts, None
                        offsets.append(self._origin)
                        texts.append(_decode(_cut(seg, max_line)))
                        transient = True
                        self._last_transient = seg
                    # drop overwritten segments to keep memory bounded
                    if cut > 0:
                        self.line_start += cut
                        tail = tail[cut:]
                self._carry = tail
        if kept is not None:
            return kept
        if not texts:
            return EMPTY
        return Chunk(offsets, texts, tuple(partial), transient)


BACK_STEP = 64 * 1024  # bytes read at a time while looking backwards for line starts
# bytes one read-back looks back at most for its lines' starts: a progress bar drawn with \r only is one line
# of many megabytes, and lines before it must stay reachable (beyond this, the rest of the file is not)
BACK_MOST = 1024 * 1024 * 1024


def read_back(path: str | os.PathLike, end: int, most: int, max_line: int = MAX_LINE) -> Chunk:
    """The last ``most`` lines of ``path`` that end before byte ``end`` (a
    line start: a kept line's offset), read as a ``Tailer`` reads them
    (invalid UTF-8 replaced, over-long lines cut, a ``\\r`` line as its last
    update), with their offsets: lines a viewer no longer holds, read back
    from the journal.  At most ``BACK_MOST`` bytes are read; ``EMPTY`` when
    the file cannot be read or nothing comes before ``end``."""
    if end <= 0 or most <= 0:
        return EMPTY
    start, found, pos = 0, 0, end - 1  # (the newline at end - 1 ends the line before ``end``)
    try:
        with open(path, "rb") as f:
            while pos > 0 and end - pos < BACK_MOST:
                lo = max(0, pos - BACK_STEP)
                f.seek(lo)
                buf = f.read(pos - lo)
                i = len(buf)
                while True:
                    i = buf.rfind(b"\n", 0, i)
                    if i < 0:
                        break
                    found += 1
                    if found == most:
                        start = lo + i + 1
                        break
                if found == most:
                    break
                pos = lo
            else:
                start = 0 if pos <= 0 else pos
    except OSError:
        return EMPTY
    t = Tailer(path, start, max_line)
    offsets: list[int] = []
    texts: list[str] = []
    partial: list[int] = []
    try:
        while t.pos < end:
            c = t.read_chunk(min(READ_CHUNK, end - t.pos))
            if not c.texts and t.pos < end and t.at_eof():
                break
            for i, (o, text) in enumerate(zip(c.offsets, c.texts)):
                if o >= end or (c.transient and i == len(c.texts) - 1):
                    continue
                if i in c.partial:
                    partial.append(len(texts))
                offsets.append(o)
                texts.append(text)
    finally:
        t.close()
    return Chunk(offsets[-most:], texts[-most:], tuple(p - max(0, len(texts) - most) for p in partial
                                                          if p >= len(texts) - most))
