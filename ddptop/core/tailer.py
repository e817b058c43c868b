"""Tail a growing log file by byte offset.

Never holds more than one bounded line in memory, never raises on bad bytes:
invalid UTF-8 is replaced, lines longer than ``max_line`` are cut (the whole
line stays in the file), ``\\r`` progress updates become transient lines.
"""

from __future__ import annotations

import os
from itertools import accumulate, repeat
from typing import NamedTuple

MAX_LINE = 64 * 1024
READ_CHUNK = 4 * 1024 * 1024


class Line(NamedTuple):
    offset: int  # byte offset of the line's first byte in the file
    text: str
    partial: bool = False  # cut: the line was longer than max_line
    transient: bool = False  # unfinished line shown in place (\r update)


_make_line = Line._make


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
        self._f = None
        self._ino = None
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
            return False
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

    def at_eof(self) -> bool:
        try:
            return os.stat(self.path).st_size <= self.pos
        except OSError:
            return True

    def read(self, max_bytes: int = READ_CHUNK) -> list[Line]:
        """Read what was appended since the last call (at most ``max_bytes``)."""
        if not self._open():
            return []
        f = self._f
        f.seek(self.pos)
        data = f.read(max_bytes)
        if not data:
            return []
        self.pos += len(data)
        return self._feed(data)

    def flush(self) -> list[Line]:
        """Emit a pending unterminated line (at the end of a finished file)."""
        out = []
        if self._carry and not self._skipping:
            text = _last_cr_segment(self._carry.rstrip(b"\r"))
            out.append(Line(self._origin, _decode(text)))
            self.line_start += len(self._carry)
        self._origin = self.line_start
        self._carry = b""
        self._skipping = False
        return out

    def _feed(self, data: bytes) -> list[Line]:
        out: list[Line] = []
        max_line = self.max_line
        if self._skipping:
            nl = data.find(b"\n")
            if nl < 0:
                self.line_start += len(data)
                self._origin = self.line_start
                return out
            self.line_start += nl + 1
            self._origin = self.line_start
            data = data[nl + 1 :]
            self._skipping = False
        if self._carry:
            data = self._carry + data
            self._carry = b""
        parts = data.split(b"\n")
        tail = parts.pop()
        start = self.line_start
        lens = [len(p) + 1 for p in parts]
        if parts and b"\r" not in data and max(lens) <= max_line + 1:
            # fast path (the common case): decode once, split once, no per-line branches
            body = data[: sum(lens) - 1].decode("utf-8", "replace").split("\n")
            offsets = list(accumulate(lens, initial=start))
            start = offsets.pop()
            out = list(map(_make_line, zip(offsets, body, repeat(False), repeat(False))))
            parts = ()
        append = out.append
        for raw in parts:
            n = len(raw) + 1
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            if b"\r" in raw:
                raw = _last_cr_segment(raw)
            if len(raw) > max_line:
                append(Line(start, _decode(_cut(raw, max_line)), partial=True))
            else:
                append(Line(start, raw.decode("utf-8", "replace")))
            start += n
        self.line_start = start
        if out and out[0].offset != self._origin:
            out[0] = out[0]._replace(offset=self._origin)  # its head was a \r update cut earlier
        if parts or lens:
            self._origin = start  # a new line begins after the last newline
        self._last_transient = b"" if lens else self._last_transient
        if tail:
            if len(tail) > max_line and b"\r" not in tail[-max_line:]:
                # an endless line: emit its head once, skip the rest until newline
                out.append(Line(self._origin, _decode(_cut(tail, max_line)), partial=True))
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
                        out.append(Line(self._origin, _decode(_cut(seg, max_line)), transient=True))
                        self._last_transient = seg
                    # drop overwritten segments to keep memory bounded
                    if cut > 0:
                        self.line_start += cut
                        tail = tail[cut:]
                self._carry = tail
        return out
