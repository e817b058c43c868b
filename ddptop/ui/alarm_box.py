"""The alarm box above the rank table: the latest alarms (type, id, culprit,
node, the profiles to try), failed links and warning notes; hidden while
there are none.  ``alarm_markup`` is pure (tested directly).
"""

from __future__ import annotations

import time

from textual.content import Content
from textual.markup import escape
from textual.widgets import Static

from ddptop.core.analysis.job_state import JobState
from ddptop.core.model.events import AlarmEvent


def alarm_markup(model: JobState, max_alarms: int = 3, max_notes: int = 2,
                 can_relaunch: bool = True) -> tuple[str, str]:
    """(markup, level) for the alarm box; level is "" (hide), "error" or "warning".
    ``can_relaunch`` is False for a job ddptop did not start (r is refused there)."""
    lines = []
    failed = [(node, ln) for node, ln in model.links.items() if ln.state == "failed"]
    for node, ln in failed[:2]:
        lines.append(f"[b $error]✗ LINK {escape(node)} failed[/]  {escape(ln.message or 'gave up reconnecting')}")
    if len(failed) > 2:
        lines.append(f"[dim]… {len(failed) - 2} more failed links (all are in the merged log)[/]")
    alarms = model.alarms[-max_alarms:][::-1]
    for a in alarms:
        var = "$error" if a.type in ("crash", "gpu", "stall", "signature") else "$warning"
        head = f"[b {var}]⚠ {escape(a.type.upper())}[/] [b]{escape(a.id)}[/]"
        if a.culprits:
            head += f"  [b $error]culprit: {escape(','.join(_culprit(a, r) for r in a.culprits))}[/]"
        elif a.ranks:
            head += f"  ranks: {escape(','.join(f'r{r}' for r in a.ranks))}"
        if a.node:
            head += f"  [dim]{'' if a.node == 'all nodes' else 'node '}{escape(a.node)}[/]"
        if a.suggested_profiles:
            head += f"  [$accent]try: {escape(' '.join('--profile ' + p for p in a.suggested_profiles))}[/] " + (
                "[dim](r relaunches)[/]" if can_relaunch else "[dim](ddptop did not start this job: relaunch it under ddptop)[/]")
        if a.type == "stall" and model.stacks is not None:
            head += "  [dim](s: stacks)[/]"
        lines.append(head + f"  {escape(a.message)}")
    more = len(model.alarms) - len(alarms)
    if more > 0:
        lines.append(f"[dim]… {more} earlier alarm{'s' if more != 1 else ''} (all are in the merged log)[/]")
    said = [ln.message for _node, ln in failed if ln.message]
    notes = [n for n in model.notes if n.level in ("warning", "error")
             and not any(m in n.message for m in said)][-max_notes:][::-1]
    for n in notes:
        lines.append(f"[dim $warning]{escape(n.level)}:[/] [dim]{escape(n.message)}[/]")
    if not lines:
        return "", ""
    return "\n".join(lines), ("error" if alarms or failed else "warning")


def _culprit(a: AlarmEvent, r: int) -> str:
    """``r1``, or ``r1@node-b`` when the alarm's ``where`` puts the culprit on
    another node than the alarm's own (culprits spread over several nodes)."""
    w = a.where.get(r)
    node = w.node if w is not None else ""
    return f"r{r}@{node}" if node and node != a.node else f"r{r}"


class AlarmBox(Static):
    """The latest alarms (and warning notes); hidden while there are none."""

    DEFAULT_CSS = """
    AlarmBox {
        display: none; height: auto; max-height: 8; padding: 0 1;
        border: round $error; border-title-color: $error; border-title-style: bold;
        background: $error 8%;
    }
    AlarmBox.-warning { border: round $warning; border-title-color: $warning; background: $warning 5%; }
    AlarmBox.-on { display: block; }
    """

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self._markup = None
        self.can_relaunch = True  # False for a job ddptop did not start

    def show(self, model: JobState) -> None:
        markup, level = alarm_markup(model, can_relaunch=self.can_relaunch)
        if (markup, level) == self._markup:
            return
        self._markup = (markup, level)
        self.update(Content.from_markup(markup) if markup else "")
        n = len(model.alarms)
        k = sum(1 for ln in model.links.values() if ln.state == "failed")
        title = [f"{n} alarm{'s' if n != 1 else ''}"] if n else []
        if k:
            title.append(f"{k} link{'s' if k != 1 else ''} failed")
        self.border_title = ", ".join(title) or "warnings"
        self.set_class(bool(markup), "-on")
        self.set_class(level == "warning", "-warning")


def is_recent(t: float, within: float = 120.0) -> bool:
    return time.time() - t <= within
