"""The stacks pane: the grouped stacks of the last sampling, the culprit first.

Shows the latest ``StacksEvent`` (in a multi-node job, every node's samples of
the latest round judged together: ``JobState.stacks``): what the samples say
(frozen, moving, the culprits and where each is), then each group of ranks
that share a stack, culprits first, then the largest, innermost frame first,
with the frames that the largest group does not have marked (that is where
the groups part).  A group of more ranks than ``COUNT_FROM`` is said by its
count and ranges ("1,023 ranks (0-776,778-1023) on 128 nodes"), and ``n``
opens each such group into its ranks, one line per node ("node-3: 24-31").
"""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Static

from ddptop.core.analysis.wording import COUNT_FROM
from ddptop.core.model.events import StacksEvent
from ddptop.core.model.evidence import StackEvidence, StackGroup, ranks_text

GROUPS_SHOWN = 64  # groups listed with their frames; the rest are counted (every rank on its own line of code)


def _ranges(rs: list[int]) -> str:
    """``0-776,778-1023``."""
    return ranks_text(rs).removeprefix("ranks ").removeprefix("rank ")


def _nodes_of(v: StackEvidence, rs: list[int] | tuple[int, ...]) -> dict[str, list[int]]:
    """The ranks by node, the nodes in the order of their lowest rank."""
    by: dict[str, list[int]] = {}
    for r in sorted(rs):
        w = v.where.get(r)
        by.setdefault(w.node if w is not None else "", []).append(r)
    return by


def who(v: StackEvidence, rs: list[int] | tuple[int, ...], several_nodes: bool) -> str:
    """``rank 777 on node-97``, ``ranks 0, 1, 2`` (at most ``COUNT_FROM``: each rank, as for a small job), or
    ``1,023 ranks (0-776,778-1023) on 128 nodes``."""
    rs = sorted(rs)
    if len(rs) == 1:
        head = f"rank {rs[0]}"
    elif len(rs) <= COUNT_FROM:
        head = "ranks " + ", ".join(map(str, rs))
    else:
        head = f"{len(rs):,} ranks ({_ranges(rs)})"
    if several_nodes:
        nodes = [n for n in _nodes_of(v, rs) if n]
        if len(nodes) == 1:
            head += f" on {nodes[0]}"
        elif nodes:
            head += f" on {len(nodes):,} nodes"
    return head


def _group_line(v: StackEvidence, g: StackGroup, several_nodes: bool) -> str:
    """The group as a sentence: who, then where (its text is said of them: "wait on the GPU at ...")."""
    var = "$error" if g.culprit else "$accent"
    head = f"[b {var}]{escape(who(v, g.ranks, several_nodes))}[/]"
    many = len(g.ranks) > 1
    if g.status == "moving":
        return head + f" {'are' if many else 'is'} moving [dim](the stack changes between samples: working)[/]"
    if g.status == "unknown" or not g.text:
        return head + ": [dim]no usable stack samples[/]"
    return head + f" {escape(g.text)}" + (f" [dim]({escape(g.status)})[/]" if g.status != "unclear" else "")


def _opened(v: StackEvidence, g: StackGroup) -> list[str]:
    """A large group's ranks, one line per node (``node-3: 24-31``), a node's ranks that are in another group
    said beside it (the one rank missing from a node is where to look); on one node, every rank."""
    by = _nodes_of(v, g.ranks)
    if len(by) == 1:
        return ["   " + escape(", ".join(map(str, g.ranks)))]
    mine = set(g.ranks)
    elsewhere = {node: rs for node, rs in _nodes_of(v, [r for r in v.where if r not in mine]).items() if node in by}
    return [f"   [dim]{escape(node or '(no node)')}:[/] {escape(_ranges(rs))}"
            + (f" [dim]({escape(_ranges(elsewhere[node]))} in another group)[/]" if node in elsewhere else "")
            for node, rs in by.items()]


def stacks_markup(ev: StacksEvent | None, by_node: bool = False) -> str:
    """The pane's text; ``by_node``: each group of more than ``COUNT_FROM`` ranks opened into its ranks."""
    if ev is None:
        return ("[b]No stack samples yet.[/b]\n\nddptop samples every rank's stack (py-spy) twice, a second apart, "
                "when it suspects a stall; [b]p[/b] captures one now.")
    v = StackEvidence.from_event(ev)
    nodes = {w.node for w in v.where.values() if w.node}
    several = len(nodes) > 1
    when = time.strftime("%H:%M:%S", time.localtime(ev.t))
    working = bool(v.waits_on_work())
    verdict = ("[b $warning]the others wait for ranks that work: not a hang unless it lasts[/]" if working else
               {True: "[b $error]hung[/]", False: "[b $success]moving: work, not a hang[/]",
                None: "[b $warning]cannot tell[/]"}[v.hung])
    native = f", native frames read (paused up to {ev.pause * 1000:.0f} ms)" if ev.native else ""
    on = f" on {len(nodes):,} nodes" if several else ""
    lines = [f"[b]Stacks sampled at {when}[/b]  ({ev.samples} sample{'s' if ev.samples != 1 else ''} of "
             f"{len(ev.ranks):,} rank{'s' if len(ev.ranks) != 1 else ''}{on} over {ev.span:.1f} s{native}): {verdict}"]
    odd = v.culprits or v.workers
    if odd:
        if len(odd) > COUNT_FROM:
            named = who(v, odd, several)
        else:
            named = ", ".join(who(v, (r,), several) for r in odd)
        lines.append(f"[b $warning]working, the others wait for it: {escape(named)}[/]" if working
                     else f"[b $error]culprit: {escape(named)}[/]")
    if v.summary:
        lines.append(escape(v.summary))
    if v.error:
        lines.append(f"[$warning]{escape(v.error)}[/]")
    if ev.dir:
        lines.append(f"[dim]dumps: {escape(ev.dir)}{' (each node keeps its own)' if several else ''}[/]")
    groups = sorted(v.groups, key=lambda g: (not g.culprit, -len(g.ranks), g.ranks))
    majority = max(groups, key=lambda g: len(g.ranks), default=None)
    common = set(majority.frames) if majority is not None and len(groups) > 1 else set()
    for g in groups[:GROUPS_SHOWN]:
        lines.append("")
        lines.append(_group_line(v, g, several))
        if len(g.ranks) > COUNT_FROM:
            lines += _opened(v, g) if by_node else [f"   [dim](n: its ranks{' by node' if several else ''})[/]"]
        user = set(g.user)
        for i, frame in enumerate(g.frames):
            mark = "[b $warning]►[/]" if common and frame not in common and g is not majority else " "
            text = escape(frame)
            lines.append(f" {mark} {'[b]' + text + '[/b]' if i in user else '[dim]' + text + '[/dim]'}")
    rest = groups[GROUPS_SHOWN:]
    if rest:
        n = sum(len(g.ranks) for g in rest)
        lines += ["", f"[dim]… {len(rest):,} more groups ({n:,} ranks), each its own stack[/]"]
    return "\n".join(lines)


class StacksScreen(ModalScreen[None]):
    """Full-screen view of the latest stack samples; ``n`` opens the large
    groups into their ranks by node; esc/s/q closes it."""

    DEFAULT_CSS = """
    StacksScreen { align: center middle; }
    StacksScreen > VerticalScroll {
        width: 95%; height: 90%; border: round $accent; border-title-color: $accent;
        background: $surface; padding: 0 1;
    }
    """
    BINDINGS = [Binding("escape,s,q", "close", "Close"),
                Binding("n", "by_node", "Ranks by node")]

    def __init__(self, ev: StacksEvent | None) -> None:
        super().__init__()
        self.ev = ev
        self.by_node = False

    def _large(self) -> bool:
        return self.ev is not None and any(len(g.ranks) > COUNT_FROM for g in self.ev.groups)

    def compose(self) -> ComposeResult:
        box = VerticalScroll(Static(stacks_markup(self.ev), id="stacks-text"))
        box.border_title = ("stacks (n: the large groups' ranks by node · s or esc closes)" if self._large()
                            else "stacks (s or esc closes)")
        yield box

    def action_by_node(self) -> None:
        """Open (or close) each group of more than ``COUNT_FROM`` ranks into its ranks."""
        if not self._large():
            return
        self.by_node = not self.by_node
        self.query_one("#stacks-text", Static).update(stacks_markup(self.ev, self.by_node))

    def action_close(self) -> None:
        self.dismiss(None)
