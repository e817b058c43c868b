"""The stacks pane: the grouped stacks of the last sampling, the culprit first.

Shows the latest ``StacksEvent``: what the samples say (frozen, moving, the
culprits and where each is), then each group of ranks that share a stack,
culprits first, innermost frame first, with the frames that the largest group
does not have marked (that is where the groups part).
"""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Static

from ddptop.core.model.events import StacksEvent
from ddptop.core.model.evidence import StackEvidence


def stacks_markup(ev: StacksEvent | None) -> str:
    if ev is None:
        return ("[b]No stack samples yet.[/b]\n\nddptop samples every rank's stack (py-spy) twice, a second apart, "
                "when it suspects a stall; [b]p[/b] captures one now.")
    v = StackEvidence.from_event(ev)
    when = time.strftime("%H:%M:%S", time.localtime(ev.t))
    working = bool(v.waits_on_work())
    verdict = ("[b $warning]the others wait for ranks that work: not a hang unless it lasts[/]" if working else
               {True: "[b $error]hung[/]", False: "[b $success]moving: work, not a hang[/]",
                None: "[b $warning]cannot tell[/]"}[v.hung])
    native = f", native frames read (paused up to {ev.pause * 1000:.0f} ms)" if ev.native else ""
    lines = [f"[b]Stacks sampled at {when}[/b]  ({ev.samples} sample{'s' if ev.samples != 1 else ''} of "
             f"{len(ev.ranks)} rank{'s' if len(ev.ranks) != 1 else ''} over {ev.span:.1f} s{native}): {verdict}"]
    if v.culprits or v.workers:
        who = escape(', '.join(f'rank {r}' for r in v.culprits or v.workers))
        lines.append(f"[b $warning]working, the others wait for it: {who}[/]" if working
                     else f"[b $error]culprit: {who}[/]")
    if v.summary:
        lines.append(escape(v.summary))
    if v.error:
        lines.append(f"[$warning]{escape(v.error)}[/]")
    if ev.dir:
        lines.append(f"[dim]dumps: {escape(ev.dir)}[/]")
    groups = sorted(v.groups, key=lambda g: (not g.culprit, -len(g.ranks)))
    majority = max(groups, key=lambda g: len(g.ranks), default=None)
    common = set(majority.frames) if majority is not None and len(groups) > 1 else set()
    for g in groups:
        ranks = ", ".join(str(r) for r in g.ranks)
        head = f"ranks {ranks}" if len(g.ranks) > 1 else f"rank {ranks}"
        var = "$error" if g.culprit else "$accent"
        lines.append("")
        lines.append(f"[b {var}]{escape(head)}[/]" + (f" [dim]({escape(g.status)})[/]" if g.status else "")
                     + (f": {escape(g.text)}" if g.text else ""))
        user = set(g.user)
        for i, frame in enumerate(g.frames):
            mark = "[b $warning]►[/]" if common and frame not in common and g is not majority else " "
            text = escape(frame)
            lines.append(f" {mark} {'[b]' + text + '[/b]' if i in user else '[dim]' + text + '[/dim]'}")
    return "\n".join(lines)


class StacksScreen(ModalScreen[None]):
    """Full-screen view of the latest stack samples; esc/s/q closes it."""

    DEFAULT_CSS = """
    StacksScreen { align: center middle; }
    StacksScreen > VerticalScroll {
        width: 95%; height: 90%; border: round $accent; border-title-color: $accent;
        background: $surface; padding: 0 1;
    }
    """
    BINDINGS = [Binding("escape,s,q", "close", "Close")]

    def __init__(self, ev: StacksEvent | None) -> None:
        super().__init__()
        self.ev = ev

    def compose(self) -> ComposeResult:
        box = VerticalScroll(Static(stacks_markup(self.ev), id="stacks-text"))
        box.border_title = "stacks (s or esc closes)"
        yield box

    def action_close(self) -> None:
        self.dismiss(None)
