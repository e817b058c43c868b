"""Log panes: a bounded ring buffer per pane plus the code that renders it.

The buffer (not the widget) is the source of truth, so a filter can be applied
or removed at any time by re-rendering from the buffer.  Rendering is bounded
per call, so a rank printing 10k lines/s costs the UI a few hundred lines per
tick, never more.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from rich.text import Text

BUFFER_LINES = 20_000  # per pane, kept in memory (everything is in the journal)
LOG_MAX_LINES = 5_000  # lines a RichLog widget keeps
TICK_LINES = 150  # most lines written to a pane per tick
RERENDER_LINES = 1_000  # most lines written when a pane is re-rendered (filter, tab switch)
CLIP_CHARS = 2_000  # display clip of one line (the journal keeps it whole)

_ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# C0 controls (but tab and ESC) and DEL -> visible control pictures
_CONTROLS = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x1B)}
_CONTROLS[0x7F] = 0x2421
# what reading a line can raise: rich on escape sequences it does not expect (none found by fuzzing today, but
# its decoder parses numbers and indexes tables), or a line that is not text
_BAD_LINE = (ValueError, TypeError, IndexError, KeyError)


def plain(text: str) -> str:
    """The text without ANSI escape sequences."""
    return _ANSI_RE.sub("", text) if "\x1b" in text else text


def to_text(raw: str, clip: int = CLIP_CHARS) -> Text:
    """One log line (maybe with ANSI colour) -> rich Text.  Never raises."""
    try:
        if len(raw) > clip:
            raw = raw[:clip] + "\x1b[0m…"
        raw = raw.translate(_CONTROLS)
        if "\x1b" in raw:
            t = Text.from_ansi(raw, end="")
            if "\n" in t.plain:  # from_ansi splits on odd separators; keep one line
                t = Text(t.plain.replace("\n", " "))
        else:
            t = Text(raw, end="")
        if "\t" in t.plain:
            t.expand_tabs(8)
        return t
    except _BAD_LINE:  # escape sequences rich cannot read: the line without them
        return Text(plain(str(raw)).translate(_CONTROLS)[:clip], end="")


@dataclass(slots=True)
class Line:
    rank: int | None  # None: torchrun; -1: ddptop itself
    stream: str
    text: str
    style: str = ""  # extra style for ddptop's own lines
    node: str = ""  # the attached node it came from ("" for a local run)
    _low: str | None = None

    def low(self) -> str:
        if self._low is None:
            self._low = plain(self.text).lower()
        return self._low


@dataclass
class PaneBuffer:
    """Everything one pane shows.  ``key`` is 'merged', 'torchrun' or 'r<N>'."""

    key: str
    merged: bool = False
    lines: deque = field(default_factory=lambda: deque(maxlen=BUFFER_LINES))
    pending: list = field(default_factory=list)  # appended since last render
    live: dict = field(default_factory=dict)  # (rank, stream) -> current transient text
    live_changed: bool = False
    dirty: bool = True  # the widget must be re-rendered from the buffer
    total: int = 0  # lines ever added

    def add(self, line: Line) -> None:
        self.lines.append(line)
        self.total += 1
        if not self.dirty:
            self.pending.append(line)
            if len(self.pending) > BUFFER_LINES:
                self.pending.clear()
                self.dirty = True
        if self.live.pop((line.rank, line.stream), None) is not None:
            self.live_changed = True

    def add_many(self, lines: list[Line], total: int) -> None:
        """The last lines of a batch of ``total`` lines of one rank's stream
        (only the last BUFFER_LINES of a batch can be kept anyway)."""
        if not lines:
            return
        self.lines.extend(lines)
        self.total += total
        if not self.dirty:
            if len(self.pending) + len(lines) > BUFFER_LINES or total > len(lines):
                self.pending.clear()
                self.dirty = True
            else:
                self.pending.extend(lines)
        if self.live.pop((lines[-1].rank, lines[-1].stream), None) is not None:
            self.live_changed = True

    def set_live(self, rank: int | None, stream: str, text: str) -> None:
        self.live[(rank, stream)] = text
        self.live_changed = True

    def matching(self, needle: str, lines) -> list[Line]:
        if not needle:
            return list(lines)
        return [ln for ln in lines if needle in ln.low()]

    def take_render(self, needle: str) -> tuple[bool, list[Line], int]:
        """(full re-render?, lines to write, lines left out)."""
        needle = needle.lower()
        if self.dirty:
            self.dirty = False
            self.pending = []
            lines = self.matching(needle, self.lines)
            hidden = max(0, len(lines) - RERENDER_LINES)
            return True, lines[-RERENDER_LINES:], hidden
        lines = self.matching(needle, self.pending)
        self.pending = []
        hidden = max(0, len(lines) - TICK_LINES)
        return False, lines[-TICK_LINES:], hidden


def prefix_of(rank: int | None, node: str = "") -> str:
    """The merged pane's prefix; ``node`` names the node of a torchrun line
    when the job spans several (rank numbers are global: no node needed)."""
    if rank is None:
        return f"[{node} torchrun]" if node else "[torchrun]"
    if rank < 0:
        return "[ddptop]"
    return f"[r{rank}]"


def render_lines(lines: list[Line], merged: bool, palette: list[str], hidden: int, full: bool,
                 nodes: bool = False) -> Text | None:
    """Many lines -> one Text (one RichLog.write call).  ``nodes``: the job spans
    several nodes, so torchrun's lines say which node they come from."""
    parts: list[Text] = []
    if hidden:
        what = "earlier matching lines" if full else "lines"
        parts.append(Text(f"… {hidden} {what} not shown (all in the journal)", style="dim italic", end=""))
    for ln in lines:
        try:
            body = to_text(ln.text)
            if ln.style:
                body.stylize(ln.style)
            if ln.stream == "sep":  # a separator line (relaunch): no prefix
                pass
            elif merged or (ln.rank is not None and ln.rank < 0) or (nodes and ln.rank is None and ln.node):
                pre = prefix_of(ln.rank, ln.node if nodes else "")
                if not merged and ln.rank is None:
                    pre = f"[{ln.node}]"  # the torchrun pane: the node is all it needs
                style = "bold"
                if ln.rank is not None and ln.rank >= 0 and palette:
                    style = f"bold {palette[ln.rank % len(palette)]}"
                elif palette:
                    style = "bold dim"
                t = Text(pre + " ", style=style, end="")
                t.append_text(body)
                body = t
            parts.append(body)
        except _BAD_LINE:
            parts.append(Text("<unprintable line>", style="dim", end=""))
    if not parts:
        return None
    return Text("\n", end="").join(parts)
