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

from ddptop.core.event_text import waiting_on_work
from ddptop.core.events import StacksEvent


def stacks_markup(ev: StacksEvent | None) -> str:
    if ev is None:
        return ("[b]No stack samples yet.[/b]\n\nddptop samples every rank's stack (py-spy) twice, a second apart, "
                "when it suspects a stall; [b]p[/b] captures one now.")
    when = time.strftime("%H:%M:%S", time.localtime(ev.t))
    working = waiting_on_work(ev)
    verdict = ("[b $warning]the others wait for ranks that work: not a hang unless it lasts[/]" if working else
               {True: "[b $error]hung[/]", False: "[b $success]moving: work, not a hang[/]",
                None: "[b $warning]cannot tell[/]"}[ev.hung])
    lines = [f"[b]Stacks sampled at {when}[/b]  ({ev.samples} sample{'s' if ev.samples != 1 else ''} of "
             f"{len(ev.ranks)} rank{'s' if len(ev.ranks) != 1 else ''} over {ev.span:.1f} s): {verdict}"]
    if ev.culprits:
        who = escape(', '.join(f'rank {r}' for r in ev.culprits))
        lines.append(f"[b $warning]working, the others wait for it: {who}[/]" if working
                     else f"[b $error]culprit: {who}[/]")
    if ev.summary:
        lines.append(escape(ev.summary))
    if ev.error:
        lines.append(f"[$warning]{escape(ev.error)}[/]")
    if ev.dir:
        lines.append(f"[dim]dumps: {escape(ev.dir)}[/]")
    groups = [g for g in ev.groups if isinstance(g, dict)]
    groups.sort(key=lambda g: (not g.get("culprit"), -len(g.get("ranks") or ())))
    majority = max(groups, key=lambda g: len(g.get("ranks") or ()), default=None)
    common = set(majority.get("frames") or ()) if majority is not None and len(groups) > 1 else set()
    for g in groups:
        ranks = ", ".join(str(r) for r in g.get("ranks") or ())
        head = f"ranks {ranks}" if len(g.get("ranks") or ()) > 1 else f"rank {ranks}"
        var = "$error" if g.get("culprit") else "$accent"
        state = g.get("state", "")
        lines.append("")
        lines.append(f"[b {var}]{escape(head)}[/]" + (f" [dim]({escape(state)})[/]" if state else "")
                     + (f": {escape(str(g.get('text', '')))}" if g.get("text") else ""))
        user = set(g.get("user") or ())
        for i, frame in enumerate(g.get("frames") or ()):
            mark = "[b $warning]►[/]" if common and frame not in common and g is not majority else " "
            text = escape(str(frame))
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
