"""The modal dialogs: quit (detach or stop), confirm `ddptop fix`, the help
screen with every key, and the profile picker of a relaunch (the alarm's
suggestions first).  The stacks pane is in ``stacks_screen.py``, the doctor
and bench screens in ``tool_screens.py``.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, OptionList, Static
from textual.widgets.option_list import Option

from ddptop.core.analysis.job_state import JobState

HELP_TEXT = """\
[b]ddptop keys[/b]

  [b]m[/b]              merged log (every rank, prefixed \\[r0] \\[r1] …)
  [b]0[/b]-[b]9[/b]            log of rank N
  [b]o[/b]              open a rank's log: type its number, or a node's name
                 (its odd rank out first); above 16 ranks one tab shows
                 the rank picked, in place of a tab per rank
  [b]t[/b]              torchrun's own output
  [b]tab[/b] / [b]shift+tab[/b]  next / previous log pane
  [b]enter[/b] on a rank  open that rank's log
  [b]enter[/b] on a node  open it into its ranks / close it ([b]→[/b] / [b]←[/b] too)
  [b]/[/b]              filter log lines (case-insensitive); [b]esc[/b] clears
  [b]end[/b] / [b]home[/b]     follow the log / go to its top
  [b]L[/b]              a thousand earlier lines (a large job's rank
                 pane keeps its newest: the rest comes from the
                 journal)
  [b]w[/b]              wrap long lines on/off
  [b]z[/b]              merged log: fold alike lines of many ranks into one
                 (\\[r0-1023] epoch 3 …; on by itself above 8 ranks)
  [b]g[/b]              show / hide the GPU pane
  [b]r[/b]              relaunch with a profile (alarm suggestions first);
                 the current profiles are kept, the chosen one is added
  [b]e[/b]              show / hide the launch's profiles and env diff
  [b]p[/b]              capture every rank's Python stack now (py-spy);
                 also done by itself at a stall
  [b]s[/b]              the stacks pane: the last samples grouped by
                 stack, the culprit first, where the groups part
                 marked; every node's samples judged together; in
                 it, [b]n[/b] opens the groups of more than 8 ranks
                 into their ranks by node
  [b]D[/b]              ddptop doctor: this machine's preflight checks
  [b]B[/b]              GPU P2P / all-reduce benchmark (starts on enter)
  [b]F[/b]              stop the job and run ddptop fix (a profile search)
  [b]ctrl+p[/b]         command palette (themes: "Change theme")
  [b]?[/b]              this help
  [b]q[/b] / [b]ctrl+c[/b]     quit: detach (job keeps running) or stop the job

Rank table: GPU ("?" = mapping guessed; in a container, ranks map to
  GPUs by device: CUDA_VISIBLE_DEVICES / LOCAL_RANK), CPU % of one core, RSS,
  process status, threads, workers (child processes and their CPU %).
  Above 16 ranks on more than one node: a row per node (▸ r8-15, ▾ open),
  the worst state of its ranks (culprit, dead, frozen, behind), its step
  range and slowest rank (120-121 (r9)), the odd nodes first; the alarm's
  culprit stays on top, its node open beneath it.
GPU pane: utilisation and its history, memory, power and its history,
  temperature, ranks on it ("r0?" = guessed), memory-bandwidth use,
  SM clock, PCIe link, throttle reasons, ECC errors / retired pages.
Alarms (stalls, crashes, error signatures, GPU faults) show in a box
  above the rank table and ring the terminal bell once each.
A relaunch (r) stops every rank, then starts the job again; the header
  shows "launch #N" and the profiles, the logs a "relaunch #N" line.

The journal keeps every line; the merged pane keeps its last 20,000, each
  rank's pane its share of 1,000,000 for the job (20,000 up to 32 ranks,
  976 at 1,024).  In a folded merged log a line many ranks print
  alike (equal once numbers are masked) shows once, at its first copy, with
  the ranks that printed it; its rank range widens under the log until no
  rank has joined it for 1 s.  A rank's own pane keeps every line whole.
"""



class QuitScreen(ModalScreen[str | None]):
    DEFAULT_CSS = """
    QuitScreen { align: center middle; }
    QuitScreen > Vertical {
        width: 52; height: auto; padding: 1 2;
        background: $panel; border: thick $primary;
    }
    QuitScreen Label { width: 100%; content-align: center middle; margin-bottom: 1; }
    QuitScreen Button { width: 100%; margin-bottom: 1; }
    """
    BINDINGS = [
        Binding("d", "choose('detach')", "Detach", show=False),
        Binding("s", "choose('stop')", "Stop", show=False),
        Binding("escape,c,n", "choose(None)", "Cancel", show=False),
    ]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Quit ddptop — the job is still running.")
            yield Button("Detach (job keeps running)  \\[d]", id="detach", variant="primary")
            yield Button("Stop the job  \\[s]", id="stop", variant="error")
            yield Button("Cancel  \\[esc]", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#detach", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None if event.button.id == "cancel" else event.button.id)

    def action_choose(self, what: str | None) -> None:
        self.dismiss(what)


class FixScreen(ModalScreen[bool]):
    """Confirm: stop the job and let `ddptop fix` search for a profile that works."""

    DEFAULT_CSS = """
    FixScreen { align: center middle; }
    FixScreen > Vertical { width: 64; height: auto; padding: 1 2; background: $panel; border: thick $primary; }
    """
    BINDINGS = [Binding("y,enter", "dismiss(True)", "Yes", show=False),
                Binding("n,escape", "dismiss(False)", "No", show=False)]

    def __init__(self, running: bool) -> None:
        super().__init__()
        self.running = running

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(("Stop this job, then " if self.running else "")
                         + "run [b]ddptop fix[/b]: short smoke runs of the same command under the candidate "
                           "profiles (the diagnosis's first) and fewer ranks, until one makes progress; it prints "
                           "the table and the command to use from now on.")
            yield Label("[b]y[/b] / enter: go · [b]n[/b] / esc: cancel")


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: 76; height: auto; max-height: 90%; padding: 1 2;
        background: $panel; border: thick $primary;
    }
    """
    BINDINGS = [Binding("escape,q,question_mark,enter", "dismiss(None)", "Close", show=False)]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(HELP_TEXT)
            yield Label("[dim]esc / ? / q closes[/dim]")


DEFAULT_CHOICE = "\x00default"  # option id of "default (no profile)"


def picker_choices(model: JobState, profiles: dict) -> list[tuple[str, str, str]]:
    """(option id, label, reason) for the profile picker: the profiles the alarms
    suggest (latest alarm first, each once), then every other profile, then
    "default (no profile)"."""
    out: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    active = set(model.profiles)
    for a in reversed(model.alarms):
        for name in a.suggested_profiles:
            if name in seen:
                continue
            seen.add(name)
            who = f" (culprit {','.join(f'r{r}' for r in a.culprits)})" if a.culprits else ""
            why = f"suggested by {a.id or a.type}{who}"
            mark = " [active]" if name in active else ""
            out.append((name, f"{name} — {why}{mark}", why))
    for name, p in profiles.items():
        if name in seen or name == "default":
            continue
        seen.add(name)
        mark = " [active]" if name in active else ""
        out.append((name, f"{name} — {p.description}{mark}", "picked in ddptop"))
    out.append((DEFAULT_CHOICE, "default (no profile) — relaunch exactly as first given", "picked in ddptop: no profile"))
    return out


class ProfilePicker(ModalScreen[tuple[str, str] | None]):
    """Pick one profile; dismisses with (option id, reason) or None."""

    DEFAULT_CSS = """
    ProfilePicker { align: center middle; }
    ProfilePicker > Vertical {
        width: 90%; max-width: 120; height: auto; max-height: 90%; padding: 1 2;
        background: $panel; border: thick $primary;
    }
    ProfilePicker Label { width: 100%; margin-bottom: 1; }
    ProfilePicker OptionList { height: auto; max-height: 24; }
    """
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", show=False)]

    def __init__(self, choices: list[tuple[str, str, str]], title: str) -> None:
        super().__init__()
        self.choices = choices
        self.title_text = title
        self._reasons = {cid: reason for cid, _label, reason in choices}

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text)
            options: list = []
            for cid, label, _reason in self.choices:
                if cid == DEFAULT_CHOICE and options:
                    options.append(None)
                options.append(Option(Text(label), id=cid))
            yield OptionList(*options, id="profile-options")
            yield Label("[dim]enter relaunches with the current profiles + this one · esc cancels[/dim]")

    def on_mount(self) -> None:
        ol = self.query_one(OptionList)
        ol.highlighted = 0
        ol.focus()

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        cid = event.option.id or ""
        self.dismiss((cid, self._reasons.get(cid, "picked in ddptop")))
