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


class Chunk(NamedTuple):
    """The lines of one read, as parallel lists (no object per line).

    ``partial``: indices of lines cut because they were longer than max_line;
    ``transient``: the last line is an unfinished in-place (``\\r``) update.
    """

    offsets: list[int]
    texts: list[str]
    partial: tuple[int, ...] = ()
    transient: bool = False

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
        if ended and b"\r" not in body:
            # fast path (the common case): decode once, split once, lengths and
            # offsets by C-level maps; no per-line Python code
            if body.isascii():
                texts = body.decode("ascii").split("\n")
                lens = list(map(len, texts))
            else:
                parts = body.split(b"\n")
                lens = list(map(len, parts))
                if max(lens) <= max_line:
                    texts = body.decode("utf-8", "replace").split("\n")
                    if len(texts) != len(parts):  # (cannot happen: \n never comes from a replacement)
                        texts = [p.decode("utf-8", "replace") for p in parts]
                else:
                    slow = parts
            if not slow:
                if max(lens) > max_line:
                    slow = body.split(b"\n")
                    texts = []
                else:
                    offsets = list(map(add, accumulate(lens, initial=start), count()))
                    start = offsets.pop()  # the end of the last line, past its newline
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
                        offsets.append(self._origin)
                        texts.append(_decode(_cut(seg, max_line)))
                        transient = True
                        self._last_transient = seg
                    # drop overwritten segments to keep memory bounded
                    if cut > 0:
                        self.line_start += cut
                        tail = tail[cut:]
                self._carry = tail
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
