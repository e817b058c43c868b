"""Lines that many ranks print alike, folded into one.

At 1,024 ranks, every ``epoch 3 ...`` or ``step 120 loss ...`` comes 1,024
times, a few milliseconds apart, and the merged log would show nothing else.
Two lines are *alike* when they are equal once their numbers (and hex
addresses) are masked.  A :class:`Folder` keeps the folds still open: the n-th
line of a kind that a rank prints joins the fold of the n-th line of that kind
(each rank's step 120 line with the others' step 120 line, however the ranks'
lines interleave: live, or one rank's whole log after another's in a replay),
or opens it.  A fold closes when no rank has joined it for
``hold`` seconds and every fold opened before it has closed, or when more
than ``open_max`` folds are open (the oldest first): closed folds come out in
the order they opened.

The fold keeps its first copy whole (its numbers too) and the ranks that
joined; :func:`range_text` says them as ``r0-1023`` or ``r0-511,513-1023``.
Pure: the caller gives the clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

_HEX = re.compile(rb"0x[0-9a-fA-F]+")
_DIGITS = bytes.maketrans(b"0123456789", b"##########")
_RUN = re.compile(rb"#[#.]*(?:[eE][-+]?#+)?")  # a number, once its digits are '#': 12, 0.431, 3e-4, 1.5E+05
_NANINF = re.compile(rb"\b(?:nan|inf)\b", re.I)

HOLD = 1.0  # seconds a fold stays open after the last rank joined it
OPEN_MAX = 4_096  # folds open at once (the oldest closes first): a replayed rank's whole log can open
COUNT_MAX = 1_000_000  # (rank, kind) counts kept


# runs of whitespace that a key collapses to one space (a lone space stays as it is: most lines have only those)
_SPACES = re.compile(rb"[ \t\r\x0b\x0c]{2,}|[\t\r\x0b\x0c]")
_EDGES = re.compile(rb" ?\n ?")


def alike_keys(texts: Sequence[str], stream: str = "") -> list[bytes]:
    """What alike lines share, for each of ``texts``: the text with its
    numbers masked (hex addresses, nan and inf too), whitespace collapsed and
    stripped (and the stream: stdout and stderr never fold together).  Runs
    for every line of a large job, so on bytes and a whole batch at once: one
    table translation and a few regex passes over the joined lines, not
    several per line (replaying 1,024 ranks' logs folds 200,000 lines)."""
    if not texts:
        return []
    blob = "\n".join(texts).encode("utf-8", "replace")
    if blob.count(b"\n") != len(texts) - 1:  # (a text with a newline in it: that one as a space)
        blob = "\n".join(t.replace("\n", " ") for t in texts).encode("utf-8", "replace")
    if b"0x" in blob:
        blob = _HEX.sub(b"#", blob)
    blob = blob.translate(_DIGITS)
    if b"#" in blob:
        blob = _RUN.sub(b"#", blob)
    low = blob.lower()
    if b"nan" in low or b"inf" in low:  # (any case, as _NANINF matches: Nan, iNf)
        blob = _NANINF.sub(b"#", blob)
    if b"  " in blob or b"\t" in blob or b"\r" in blob or b"\x0b" in blob or b"\x0c" in blob:  # (rare: scans first)
        blob = _SPACES.sub(b" ", blob)
    if b" \n" in blob or b"\n " in blob:
        blob = _EDGES.sub(b"\n", blob)
    prefix = stream.encode() + b"\0"
    return [prefix + k for k in blob.strip(b" ").split(b"\n")]


def alike_key(text: str, stream: str = "") -> bytes:
    """``alike_keys`` of one line."""
    return alike_keys((text,), stream)[0]


def range_text(ranks: Iterable[int]) -> str:
    """``r0-1023``, ``r0-3,5,7-9``: ranks as runs."""
    rs = sorted(set(ranks))
    if not rs:
        return ""
    runs, start, prev = [], rs[0], rs[0]
    for r in rs[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(f"{start}" if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return "r" + ",".join(runs)


@dataclass(slots=True, eq=False)
class Fold:
    key: bytes
    n: int  # the how-many-th line of its kind in each of its ranks
    rank: int  # the first rank that printed it
    stream: str
    text: str  # the first copy, whole
    node: str = ""
    opened: float = 0.0
    joined: float = 0.0  # when the last rank joined
    ranks: set[int] = field(default_factory=set)
    closed: bool = False
    seq: int = 0  # the caller's order of its first copy
    partial: bool = False  # lines were left unfolded while it was open (a flood): more ranks may have printed it

    def label(self) -> str:
        """``r0-1023``; ``r0-245+`` for a partial fold."""
        return range_text(self.ranks) + ("+" if self.partial else "")


class Folder:
    """The open folds of one merged log."""

    def __init__(self, hold: float = HOLD, open_max: int = OPEN_MAX) -> None:
        self.hold = hold
        self.open_max = open_max
        self.open: list[Fold] = []  # in the order they opened
        self._by_key: dict[tuple[bytes, int], Fold] = {}
        self._count: dict[tuple[int, bytes], int] = {}  # (rank, kind) -> lines of that kind the rank printed

    def add(self, rank: int, stream: str, text: str, now: float, node: str = "", seq: int = 0) -> tuple[Fold, bool]:
        """The fold this line went to, and whether the line opened it (``seq``: the
        caller's order of the line, kept for the fold's first copy)."""
        key = alike_key(text, stream)
        if len(self._count) > COUNT_MAX:  # (a job printing ever new kinds of line: start counting afresh)
            self._count.clear()
        n = self._count[(rank, key)] = self._count.get((rank, key), 0) + 1
        fold = self._by_key.get((key, n))
        if fold is not None:
            fold.ranks.add(rank)
            fold.joined = now
            return fold, False
        fold = Fold(key, n, rank, stream, text, node, now, now, {rank}, seq=seq)
        self.open.append(fold)
        self._by_key[(key, n)] = fold
        return fold, True

    def add_many(self, rank: int, stream: str, texts: Sequence[str], now: float, node: str = "",
                 seqs: Sequence[int] = ()) -> None:
        """``add`` for lines of one rank's stream, in order (their keys made at once: ``alike_keys``)."""
        n = len(texts)
        self.add_lines([rank] * n, [stream] * n, texts, [node] * n, seqs or [0] * n, now)

    def add_lines(self, ranks: Sequence[int], streams: Sequence[str], texts: Sequence[str], nodes: Sequence[str],
                  seqs: Sequence[int], now: float) -> None:
        """``add`` for lines of many ranks, in order (a live view's lines of one moment: at 1,024 ranks each
        rank's batch holds a line or two, and their keys are made at once here, not batch by batch)."""
        count, by_key = self._count, self._by_key
        if len(count) > COUNT_MAX:
            count.clear()
        prefixes: dict[str, bytes] = {}
        for i, masked in enumerate(alike_keys(texts)):  # (b"\0" + the masked text: the stream goes before it)
            stream = streams[i]
            prefix = prefixes.get(stream)
            if prefix is None:
                prefix = prefixes[stream] = stream.encode()
            key = prefix + masked
            rank = ranks[i]
            n = count[(rank, key)] = count.get((rank, key), 0) + 1
            fold = by_key.get((key, n))
            if fold is not None:
                fold.ranks.add(rank)
                fold.joined = now
                continue
            fold = Fold(key, n, rank, stream, texts[i], nodes[i], now, now, {rank}, seq=seqs[i])
            self.open.append(fold)
            by_key[(key, n)] = fold

    def due(self, now: float) -> list[Fold]:
        """Close and return the folds whose time is up, in the order they
        opened: the oldest ones that nobody joined for ``hold`` seconds (a fold
        waits for those opened before it, so the log keeps its order), and
        the oldest beyond ``open_max``."""
        n = 0
        while n < len(self.open) and now - self.open[n].joined >= self.hold:
            n += 1
        return self._close(max(n, len(self.open) - self.open_max))

    def close_all(self, restart: bool = False) -> list[Fold]:
        """Close every fold (``restart``: the ranks start again, a relaunch: count afresh)."""
        if restart:
            self._count.clear()
        return self._close(len(self.open))

    def _close(self, n: int) -> list[Fold]:
        if n <= 0:
            return []
        out, self.open = self.open[:n], self.open[n:]
        for fold in out:
            fold.closed = True
            self._by_key.pop((fold.key, fold.n), None)
        return out
