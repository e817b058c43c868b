"""The header line: run, state, elapsed time, ranks, restarts, launch and
profiles, exit code, alarms, filter; a second line with the attached nodes'
links.  Also the launch/env panel (`e`).  The markup functions are pure
(tested directly); ``HeaderBar`` only paints what it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.content import Content
from textual.markup import escape
from textual.widget import Widget

from ddptop.core.analysis.job_state import JobState
from ddptop.core.model.events import FINAL_STATES, LinkEvent
from ddptop.ui.fmt import fmt_duration

STATE_VAR = {
    "starting": "$accent",
    "running": "$primary",
    "stopping": "$warning",
    "succeeded": "$success",
    "failed": "$error",
    "stopped": "$warning",
    "lost": "$error",
    "ended": "$warning",  # a job ddptop did not start: exit code unknown
}



@dataclass
class HeaderState:
    """What the header shows beyond the job's state: the UI's own situation."""

    run_label: str
    started: float | None = None  # the job's start when the events have not said it (meta.json)
    relaunching: str | None = None  # profiles asked for, until the new launch shows
    stopping: bool = False
    filter: str = ""


def header_markup(m: JobState, ui: HeaderState, now: float) -> str:
    """The header's first line."""
    started = m.started or ui.started
    end = m.ended if m.ended is not None else now
    elapsed = fmt_duration(end - started) if started else "--:--"
    var = STATE_VAR.get(m.state, "$foreground")
    parts = [
        f"[b]ddptop[/b] {escape(ui.run_label)}",
        f"[b {var}]{escape(m.state.upper())}[/]",
        f"⏱ {elapsed}",
        f"ranks {len(m.ranks)}",
        f"restarts {m.attempt}",
    ]
    if m.node_restart is not None:
        node, n = m.node_restart
        parts.append(f"[b $accent]{escape(node)}: attempt {n}, restarted by the cluster[/]")
    elif m.generation > 0 or m.profiles:
        parts.append(f"[b $accent]launch #{m.generation}[/]")
        parts.append(f"profiles: [b]{escape(', '.join(m.profiles) or 'none')}[/b]")
    if ui.relaunching is not None:
        parts.append(f"[$warning]relaunching ({escape(ui.relaunching)})…[/]")
    if m.state in FINAL_STATES:
        code = "-" if m.exit_code is None else str(m.exit_code)
        cvar = "$success" if m.exit_code == 0 else "$error"
        parts.append(f"exit [b {cvar}]{code}[/]")
    elif ui.stopping:
        parts.append("[$warning]stop requested…[/]")
    if m.alarms:
        n = len(m.alarms)
        parts.append(f"[b $error]⚠ {n} alarm{'s' if n != 1 else ''}[/]")
    if ui.filter:
        parts.append(f"filter [b $accent]{escape(ui.filter)}[/]")
    return "  │  ".join(parts)


LINK_LIST_MAX = 4  # attached nodes listed one by one in the header; more are counted


def link_one(node: str, ev: LinkEvent, now: float) -> str:
    n = escape(node)
    if ev.state == "up":
        return f"{n} [$success]● up[/]"
    if ev.state == "down":
        retry = ""
        if ev.retry_in is not None:
            left = ev.t + ev.retry_in - now
            retry = f", retry in {max(1, int(left + 0.999))}s" if left > 0 else ", retrying…"
        return f"{n} [b $warning]○ down{retry}[/]"
    if ev.state == "failed":
        return f"{n} [b $error]✗ failed[/]"
    if ev.state == "closed":
        return f"{n} [dim]■ closed[/]"
    return f"{n} [$accent]◌ {escape(ev.state)}[/]"


def link_markup(links: dict[str, LinkEvent], now: float) -> str:
    """The header's line about the attached nodes' links ("" for a local job)."""
    if not links:
        return ""
    if len(links) <= LINK_LIST_MAX:
        return "attached  " + "   ".join(link_one(n, ev, now) for n, ev in links.items())
    counts: dict[str, int] = {}
    for ev in links.values():
        counts[ev.state] = counts.get(ev.state, 0) + 1
    parts = [f"attached  {len(links)} nodes: " + ", ".join(f"{c} {escape(st)}" for st, c in counts.items())]
    odd = [(n, ev) for n, ev in links.items() if ev.state not in ("up", "closed")]
    parts += [link_one(n, ev, now) for n, ev in odd[:LINK_LIST_MAX]]
    if len(odd) > LINK_LIST_MAX:
        parts.append(f"[dim]+{len(odd) - LINK_LIST_MAX} more[/]")
    return "   ".join(parts)


def env_markup(model: JobState) -> str:
    """The env-diff panel: the launch, its profiles, env vs the first launch."""
    profs = ", ".join(model.profiles) or "none"
    lines = [f"[b]launch #{model.generation}[/b]   profiles: [b]{escape(profs)}[/b]"]
    if not model.env_diff:
        lines.append("[dim]environment: the same as the first launch[/dim]")
    else:
        lines.append("environment vs the first launch:")
        for k, v in sorted(model.env_diff.items()):
            if v is None:
                lines.append(f"  [b]{escape(k)}[/b] [$warning]unset[/]")
            else:
                lines.append(f"  [b]{escape(k)}[/b]={escape(str(v))}")
    lines.append("[dim]e hides this · r relaunches with a profile[/dim]")
    return "\n".join(lines)


class HeaderBar(Widget):
    """One line of status; repaints without asking for a new layout."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._content: Content = Content("")

    def set_markup(self, markup: str) -> None:
        content = Content.from_markup(markup)
        if content != self._content:
            self._content = content
            self.refresh()

    def render(self) -> Content:
        return self._content

    def show(self, model: JobState, ui: HeaderState, now: float) -> None:
        """Paint the header for ``model``: one line, two with attached nodes."""
        markup = header_markup(model, ui, now)
        links = link_markup(model.links, now)
        self.set_class(bool(links), "-links")
        self.set_markup(markup + "\n" + links if links else markup)
