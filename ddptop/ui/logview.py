"""Log panes: a bounded ring buffer per pane plus the code that renders it.

The buffer (not the widget) is the source of truth, so a filter can be applied
or removed at any time by re-rendering from the buffer.  Rendering is bounded
per call, so a rank printing 10k lines/s costs the UI a few hundred lines per
tick, never more.
"""

from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import count

from rich.text import Text

from ddptop.core.analysis.line_folds import Fold, Folder

BUFFER_LINES = 20_000  # per pane, kept in memory (everything is in the journal)
FOLD_RATE = 10_000  # lines a second the merged pane folds at most (1,024 ranks x 10 lines/s); a flood beyond is counted
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


_SEQ = count()


@dataclass(slots=True)
class Line:
    rank: int | None  # None: torchrun; -1: ddptop itself
    stream: str
    text: str
    style: str = ""  # extra style for ddptop's own lines
    node: str = ""  # the attached node it came from ("" for a local run)
    label: str = ""  # the ranks of a folded line ("r0-1023"): its prefix, in place of its rank's
    seq: int = field(default_factory=_SEQ.__next__)  # the order lines came in, across panes
    src: tuple[str, int] | None = None  # (its file, relative to the run directory, or absolute; its byte offset)
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
    folder: Folder | None = None  # the merged pane of a large job: alike lines of many ranks folded
    skipped: int = 0  # lines a flood left unfolded (not shown; in the journal and their rank's pane)
    fold_capped: bool = True  # live: fold at most FOLD_RATE lines/s (a finished run's replay folds every line)
    _fold_room: float = 0.0
    _fold_t: float = 0.0
    window: int = RERENDER_LINES  # lines a full re-render writes (widened by "earlier lines")
    # each file the pane got lines of (relative to the run directory, or absolute) -> the end of the last line
    # it got (about: its offset, its length, its newline): where reading back starts when it holds none of them
    sources: dict = field(default_factory=dict)

    @property
    def evicted(self) -> int:
        """Lines this pane got and no longer holds (a rank's pane of a large job keeps its newest; the journal
        keeps them all).  The merged pane's are not counted: its lines are its ranks' panes'."""
        return 0 if self.merged else max(0, self.total - len(self.lines))

    def earlier(self, lines: list[Line]) -> None:
        """Lines read back from the journal, older than every line held: put before them (and held too)."""
        if lines:
            self.lines = deque([*lines, *self.lines], maxlen=(self.lines.maxlen or len(self.lines)) + len(lines))
            self.total += sum(1 for ln in lines if ln.stream == "sep")  # (a separator is no line of the rank's)
            self.total = max(self.total, len(self.lines))
            self.dirty = True

    def add(self, line: Line, now: float | None = None) -> None:
        if self.folder is not None:
            if line.rank is not None and line.rank >= 0 and line.stream != "sep":
                self.folder.add(line.rank, line.stream, line.text, time.monotonic() if now is None else now,
                                line.node, line.seq)
                self.total += 1
                self.live_changed = True  # open folds show under the log, their ranks widening in place
                self.live.pop((line.rank, line.stream), None)
                return
            if self.folder.open:  # a line of torchrun or ddptop: the folds before it first, in order
                self._keep_folds(self.folder.close_all(restart=line.stream == "sep"))
        self._keep(line)
        self.total += 1

    def _keep(self, line: Line) -> None:
        self.lines.append(line)
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
        self.add_batches([(lines, total)])

    def add_batches(self, batches: list[tuple[list[Line], int]]) -> None:
        """``add_many`` of several batches, in order: a merged pane folds the rank lines among them at once
        (their keys made together: ``Folder.add_lines``)."""
        folder = self.folder
        if folder is None:
            for lines, total in batches:
                self._add_unfolded(lines, total)
            return
        now = time.monotonic()
        kept: list[Line] = []  # rank lines to fold, in order, until a line that is not a rank's
        for lines, total in batches:
            if not lines:
                continue
            rank = lines[0].rank  # (one batch: one rank's, or torchrun's, lines)
            if rank is None or rank < 0:
                if kept:
                    self._fold(kept, now)
                    kept = []
                if folder.open:  # torchrun's lines: the folds before them first, in order
                    self._keep_folds(folder.close_all())
                self._add_unfolded(lines, total)
                continue
            # a flood: at most FOLD_RATE lines a second are folded (each costs a few microseconds of
            # the screen's thread); the rest, the oldest of each batch, are counted as not shown
            self._fold_room = min(FOLD_RATE, self._fold_room + (now - self._fold_t) * FOLD_RATE)
            self._fold_t = now
            take = len(lines) if not self.fold_capped else min(len(lines), int(self._fold_room))
            self._fold_room -= take
            self.skipped += total - take
            if take < len(lines):  # the folds open now may lack ranks whose lines were left out
                for f in folder.open:
                    f.partial = True
            if take:
                kept.extend(lines[len(lines) - take:])
            self.total += total
            self.live_changed = True
            self.live.pop((rank, lines[-1].stream), None)
        if kept:
            self._fold(kept, now)

    def _fold(self, lines: list[Line], now: float) -> None:
        assert self.folder is not None
        self.folder.add_lines([ln.rank for ln in lines], [ln.stream for ln in lines],
                              [ln.text for ln in lines], [ln.node for ln in lines], [ln.seq for ln in lines], now)

    def _add_unfolded(self, lines: list[Line], total: int) -> None:
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

    # -- folding alike lines (the merged pane of a large job) ------------------------------------

    def set_folding(self, on: bool) -> None:
        """Fold alike lines of many ranks into one (``line_folds``), or stop
        (the open folds are kept as they are)."""
        if on and self.folder is None:
            self.folder = Folder()
        elif not on and self.folder is not None:
            self._keep_folds(self.folder.close_all())
            self.folder = None
            self.live_changed = True

    def refold(self, rank_panes: list["PaneBuffer"]) -> None:
        """Fold alike lines (on), or show every line (off), in what the pane
        already holds too: folding folds its lines again; unfolding takes each
        rank's lines back from the rank panes (their newest share), in the
        order they came in."""
        if self.folder is not None:
            held = list(self.lines)
            self.lines.clear()
            self.folder = Folder()
            for line in held:
                self.add(line, 0.0)
            self._keep_folds(self.folder.close_all())
        else:
            share = max(1, BUFFER_LINES // max(1, len(rank_panes)))
            lines = [ln for ln in self.lines if ln.rank is None or ln.rank < 0 or ln.stream == "sep"]
            for pane in rank_panes:
                lines.extend(list(pane.lines)[-share:])
            lines.sort(key=lambda ln: ln.seq)
            self.lines = deque(lines, maxlen=self.lines.maxlen)
        self.total = len(self.lines)
        self.pending = []
        self.dirty = True
        self.live_changed = True

    def tick(self, now: float | None = None) -> bool:
        """Keep the folds whose time is up; True when any was."""
        if self.folder is None or not self.folder.open:
            return False
        done = self.folder.due(time.monotonic() if now is None else now)
        self._keep_folds(done)
        if done:
            self.live_changed = True
        return bool(done)

    def _keep_folds(self, folds: list[Fold]) -> None:
        for fold in folds:
            self._keep(fold_line(fold))

    def open_lines(self, most: int) -> list[Line]:
        """The newest ``most`` folds still open, as lines."""
        if self.folder is None:
            return []
        return [fold_line(f) for f in self.folder.open[-most:]]

    def resize(self, most: int) -> None:
        """Keep at most ``most`` lines (the newest)."""
        if self.lines.maxlen != most:
            self.lines = deque(self.lines, maxlen=most)

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
            hidden = max(0, len(lines) - self.window) + self.skipped + (0 if needle else self.evicted)
            self.skipped = 0
            return True, lines[-self.window:], hidden
        lines = self.matching(needle, self.pending)
        self.pending = []
        hidden = max(0, len(lines) - TICK_LINES) + self.skipped
        self.skipped = 0
        return False, lines[-TICK_LINES:], hidden


def fold_line(fold: Fold) -> Line:
    """A fold as the line the merged pane shows: its first copy, prefixed by its ranks."""
    return Line(fold.rank, fold.stream, fold.text, "", fold.node,
                fold.label() if len(fold.ranks) > 1 or fold.partial else "", fold.seq)


def prefix_of(rank: int | None, node: str = "") -> str:
    """The merged pane's prefix; ``node`` names the node of a torchrun line
    when the job spans several (rank numbers are global: no node needed)."""
    if rank is None:
        return f"[{node} torchrun]" if node else "[torchrun]"
    if rank < 0:
        return "[ddptop]"
    return f"[r{rank}]"


def render_lines(lines: list[Line], merged: bool, palette: list[str], hidden: int, full: bool,
                 nodes: bool = False, filtered: bool = False, unheld: int = 0) -> Text | None:
    """Many lines -> one Text (one RichLog.write call).  ``nodes``: the job spans
    several nodes, so torchrun's lines say which node they come from."""
    parts: list[Text] = []
    if hidden or unheld:
        what = ("earlier matching lines" if filtered else "earlier lines") if full else "lines"
        more = "; L shows earlier ones" if full else ""
        said = f"… {hidden:,} {what} not shown (all in the journal{more})"
        if unheld:  # (filtered: the lines the pane no longer holds were not searched)
            said = (f"… {hidden:,} {what} not shown; " if hidden else "… ") + \
                f"{unheld:,} earlier lines not held, not searched (L reads them back from the journal)"
        parts.append(Text(said, style="dim italic", end=""))
    for ln in lines:
        try:
            body = to_text(ln.text)
            if ln.style:
                body.stylize(ln.style)
            if ln.stream == "sep":  # a separator line (relaunch): no prefix
                pass
            elif merged or (ln.rank is not None and ln.rank < 0) or (nodes and ln.rank is None and ln.node):
                pre = f"[{ln.label}]" if ln.label else prefix_of(ln.rank, ln.node if nodes else "")
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
