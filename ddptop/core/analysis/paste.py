"""Pasted logs back into lines: flattened pastes split, wrapped pastes joined.

People paste what their terminal, chat or issue tracker left of a log: several
log lines run together on one line (a paste that lost its newlines), or long
lines cut at the terminal's width (a hard wrap) or at a word (a soft wrap).
``ddptop diagnose`` reads such a file through :func:`lines`, which gives the
logical lines with the number of the physical line each starts on, so a
finding still points at the place in the file.

The splitting is by shapes that only begin log lines (a rank prefix, a
timestamp, glog's ``E1126 02:00:25.168``, NCCL's ``host:pid:tid [gpu] NCCL``,
``Traceback (most recent call last):``); the joining only where the file shows
a wrap width (several lines exactly as long as its longest, or many within a
word of it) and the next line does not begin like a log line.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable

from ddptop.core.analysis.prefixes import split

# where a log line begins, inside a line that holds several (always after a space)
_STARTS = (
    r"\[(?:rank|default)\d+\]:"  # torch / torchrun --tee
    r"|\[\d+,\d+\]<std(?:out|err|diag)>:"  # Open MPI --tag-output
    r"|\[pod/[a-z0-9][a-z0-9.-]*/[a-z0-9-]+\]"  # kubectl logs --prefix
    r"|\((?:[A-Za-z_]\w* )?pid=\d+(?:, ip=[0-9a-fA-F.:]+)?\)"  # Ray
    r"|[EWIF]\d{3,4} \d\d:\d\d:\d\d\.\d+ +\d+ "  # glog (torch's C++ logs; c10's month is not zero-padded)
    r"|\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]\d+"  # a logger's timestamp (a message's dates have no fraction)
    r"|[\w.-]+:\d+:\d+ \[\d+\] NCCL (?:INFO|WARN)"  # NCCL_DEBUG lines
    r"|Traceback \(most recent call last\):"
    r"|(?:ERROR|WARNING|INFO):torch\.distributed"  # torch elastic's logging
)
_INNER_START = re.compile(r"(?<=\s)(?=" + _STARTS + ")")
_LINE_START = re.compile(r"\s*(?:" + _STARTS + r"|File \"|[\w.]+(?:Error|Exception|Warning)\b|\S+: line \d+"
                         r"|(?:INFO|WARN|WARNING|ERROR|DEBUG|CRITICAL|FATAL)\b|(?:srun|slurmstepd|sbatch|salloc|mpirun): )")
# a logger's level before its time stamp ("[ERROR] 2021-09-13 22:18:26,678 error_handler: ..."): the line's start
_LEVEL_ONLY = re.compile(r"\s*\[?(?:INFO|WARN|WARNING|ERROR|DEBUG|CRITICAL|FATAL)\]?:?\s*$")
# a rule (torchrun's "=====" and "-----" around its failure report): a line of its own, never a wrap's piece, and no
# evidence of a wrap width (a report of short lines between 60-character rules is no paste wrapped at 60)
_RULE = re.compile(r"\s*([=\-_*#~])\1{9,}\s*$")
_MIN_WRAP = 60  # no one wraps narrower
_MAX_WRAP = 400


def unflatten(text: str) -> list[str]:
    """``text`` cut where another log line begins inside it."""
    if len(text) < 40:
        return [text]
    cuts = [m.start() for m in _INNER_START.finditer(text, 1)]
    if not cuts:
        return [text]
    out, last = [], 0
    for c in cuts:
        piece = text[last:c].rstrip()
        if not split(piece + " ", label=True, pdsh=True).text.strip() or _LEVEL_ONLY.match(piece):
            continue  # (only prefixes, or a logger's level, so far: what follows is this line's own start)
        out.append(piece)
        last = c
    out.append(text[last:])
    return out


def wrap_width(texts: list[str]) -> tuple[int, bool] | None:
    """(the width a paste was wrapped at, whether at any character) or None:
    a hard wrap cuts several lines at exactly the longest length; a soft one
    leaves many lines within a word of it."""
    lengths = [len(t) for t in texts if t.strip() and not _RULE.match(t)]
    if len(lengths) < 4:
        return None
    width = max(lengths)
    if not _MIN_WRAP <= width <= _MAX_WRAP:
        return None
    at = Counter(lengths)[width]
    near = sum(1 for n in lengths if n >= width - 15)
    # (a hard wrap cuts at the width itself; a soft one, at a space a little before it)
    # (in a hard wrap every cut piece is exactly the width; only a line's last piece may fall just short of it)
    if at >= 2 and at * 20 >= len(lengths) and (near - at) * 3 <= at:
        return width, True
    if near >= 3 and near * 5 >= len(lengths):
        return width, False
    return None


_DIGITS = re.compile(r"\d+")


def _lead(text: str) -> str:
    """A line's first word, its numbers blurred: lines of one template share it ("3:", "[rank#]:step")."""
    return _DIGITS.sub("#", text.lstrip()[:24].split(" ", 1)[0])


def _begins_line(text: str, common: frozenset[str] = frozenset()) -> bool:
    return bool(_LINE_START.match(text)) or bool(split(text).forms) or _lead(text) in common


def lines(texts: Iterable[str], numbers: Iterable[int] | None = None) -> list[tuple[int, str]]:
    """(physical line number, logical line) of a pasted log: wrapped lines
    joined, flattened ones split.  ``numbers``: each text's own line number
    (default 1, 2, ...)."""
    texts = list(texts)
    nums = list(numbers) if numbers is not None else list(range(1, len(texts) + 1))
    wrap = wrap_width(texts)
    common: frozenset[str] = frozenset()
    if wrap is not None:
        # how this file's own lines begin (a wrap's continuation begins anywhere; a line of the log's
        # templates, like its neighbours)
        width, hard = wrap
        after_short = [t for prev, t in zip([""] + texts, texts)
                       if t.strip() and (len(prev) != width if hard else len(prev) < width - 15)]
        leads = Counter(_lead(t) for t in after_short)
        common = frozenset(k for k, n in leads.items() if n >= 2 and len(k) >= 2)
    joined: list[tuple[int, str]] = []
    i = 0
    while i < len(texts):
        n, t = nums[i], texts[i]
        if wrap is not None:
            width, hard = wrap
            last = t
            while i + 1 < len(texts) and _wrapped(last, texts[i + 1], width, hard, common):
                last = texts[i + 1]
                t = t + ("" if hard else " ") + last
                i += 1
        joined.append((n, t))
        i += 1
    return [(n, piece) for n, t in joined for piece in unflatten(t)]


def _wrapped(line: str, following: str, width: int, hard: bool, common: frozenset[str]) -> bool:
    """``following`` continues ``line`` (cut at ``width``)."""
    if not following.strip() or not line.strip() or _begins_line(following, common):
        return False
    if _RULE.match(line) or _RULE.match(following):
        return False
    if hard:
        return len(line) == width
    # a soft wrap breaks a line where its next word would not have fitted
    return len(line.rstrip()) + 1 + len(following.lstrip().split(" ", 1)[0]) > width
