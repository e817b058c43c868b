"""The doctor pane (D) and the P2P benchmark pane (B).

Both run off the event loop (a worker thread): doctor takes a second, the
benchmark starts one process per test and can take minutes.  The benchmark
shares the GPUs with the job being watched, so it only starts on Enter.
"""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, Static

from ddptop.core.tools.doctor import run_checks, summary
from ddptop.core.tools.p2p_bench import run, size_text

STATUS_STYLE = {"ok": "green", "warn": "bold yellow", "fail": "bold red", "skipped": "dim",
                "hang": "bold white on red", "error": "bold red"}


def heat_style(pct: float | None, gbs: float | None, best: float | None) -> str:
    """Colour of one matrix cell: by % of the link's rate when known, else
    relative to the best pair (a slow pair stands out either way)."""
    frac = pct / 100 if pct is not None else (gbs / best if gbs is not None and best else None)
    if frac is None:
        return "dim"
    if frac >= 0.8:
        return "black on green"
    if frac >= 0.5:
        return "black on yellow"
    return "white on red"


def pair_matrix(rows, test: str = "copy p2p") -> tuple[list[int], dict[tuple[int, int], object]]:
    """GPU indices and {(i, j): row} for one pairwise test."""
    cells = {}
    for r in rows:
        if r.test != test or "->" not in r.where:
            continue
        a, b = r.where.split("->")
        try:
            cells[(int(a), int(b))] = r
        except ValueError:
            continue
    gpus = sorted({i for pair in cells for i in pair})
    return gpus, cells


def matrix_text(rows, test: str = "copy p2p") -> Text | None:
    """The pairwise matrix as a heat map (GB/s; HANG in red), or None without pairs."""
    gpus, cells = pair_matrix(rows, test)
    if not gpus:
        return None
    best = max((c.gbs for c in cells.values() if c.gbs is not None), default=None)
    t = Text()
    t.append(f"{test} GB/s (row -> column){' ' * 4}", style="bold")
    t.append("\n      " + "".join(f"{j:>9}" for j in gpus) + "\n")
    for i in gpus:
        t.append(f"  {i:>3} ")
        for j in gpus:
            c = cells.get((i, j))
            if i == j:
                t.append(f"{'-':>9}", style="dim")
            elif c is None:
                t.append(f"{'':>9}")
            elif c.status == "hang":
                t.append(f"{'HANG':>8} ", style=STATUS_STYLE["hang"])
            elif c.status != "ok":
                t.append(f"{c.status[:7]:>8} ", style=STATUS_STYLE.get(c.status, "dim"))
            else:
                t.append(f"{c.gbs:>8.1f} ", style=heat_style(c.pct, c.gbs, best))
        t.append("\n")
    return t


class DoctorScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    DoctorScreen { align: center middle; }
    DoctorScreen > Vertical {
        width: 90%; height: 90%; padding: 0 1; background: $panel; border: thick $primary;
    }
    DoctorScreen DataTable { height: 1fr; }
    DoctorScreen #detail { height: auto; max-height: 12; padding: 0 1; border-top: solid $primary 40%; }
    """
    BINDINGS = [Binding("escape,q", "dismiss(None)", "Close", show=False),
                Binding("R", "rerun", "Run again", show=False)]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("[b]ddptop doctor[/b]  [dim]checking this machine…[/dim]", id="title")
            yield DataTable(id="rows", cursor_type="row", zebra_stripes=True)
            with VerticalScroll(id="detail"):
                yield Static("", id="evidence")
            yield Label("[dim]↑↓ a row's evidence and advice · R runs again · esc closes[/dim]")

    def on_mount(self) -> None:
        t = self.query_one("#rows", DataTable)
        for label, key in (("status", "status"), ("check", "check"), ("summary", "summary")):
            t.add_column(label, key=key)
        self.rows = []
        self._run()

    def action_rerun(self) -> None:
        self.query_one("#title", Label).update("[b]ddptop doctor[/b]  [dim]checking this machine…[/dim]")
        self._run()

    @work(thread=True, exclusive=True, group="doctor", exit_on_error=False)
    def _run(self) -> None:

        try:
            rows = run_checks()
            err = None
        except Exception as e:  # noqa: BLE001 - the doctor worker thread: a broken check must not take the monitor down; shown
            rows, err = [], f"{type(e).__name__}: {e}"
        self.app.call_from_thread(self._show, rows, summary(rows) if rows else None, err)

    def _show(self, rows, summ, err) -> None:
        self.rows = rows
        t = self.query_one("#rows", DataTable)
        t.clear()
        for i, r in enumerate(rows):
            t.add_row(Text(r.status, style=STATUS_STYLE.get(r.status, "")), r.name, r.summary, key=str(i))
        title = self.query_one("#title", Label)
        if err:
            title.update(f"[b]ddptop doctor[/b]  [b $error]failed: {escape(err)}[/]")
        else:
            title.update(f"[b]ddptop doctor[/b]  {summ['ok']} ok, [b $warning]{summ['warn']} warn[/], "
                         f"[b $error]{summ['fail']} fail[/], {summ['skipped']} skipped")
        if rows:
            self._detail(0)

    def on_data_table_row_highlighted(self, ev: DataTable.RowHighlighted) -> None:
        try:
            self._detail(int(ev.row_key.value))
        except (TypeError, ValueError):
            pass

    def _detail(self, i: int) -> None:
        if not 0 <= i < len(self.rows):
            return
        r = self.rows[i]
        t = Text()
        t.append(f"{r.name}: ", style="bold")
        t.append(r.status, style=STATUS_STYLE.get(r.status, ""))
        t.append(f"  {r.summary}\n")
        for e in r.evidence:
            t.append(f"  {e}\n", style="dim")
        if r.advice:
            t.append(f"→ {r.advice}\n", style="bold")
        self.query_one("#evidence", Static).update(t)


class BenchScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    BenchScreen { align: center middle; }
    BenchScreen > Vertical {
        width: 90%; height: 90%; padding: 0 1; background: $panel; border: thick $primary;
    }
    BenchScreen #matrix { height: auto; padding: 0 1; }
    BenchScreen #links { height: auto; padding: 0 1; color: $text-muted; }
    BenchScreen DataTable { height: 1fr; }
    """
    BINDINGS = [Binding("escape,q", "dismiss(None)", "Close", show=False),
                Binding("enter", "start", "Start", show=False, priority=True)]  # before the table's own enter

    def __init__(self, timeout: float = 60.0, sizes: list[int] | None = None) -> None:
        super().__init__()
        self.timeout = timeout
        self.sizes = sizes
        self.running = False
        self.rows: list = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("[b]ddptop bench p2p[/b]  [b $warning]runs on the GPUs the job uses: the job and the "
                        "figures both suffer while it runs.[/]  [b]enter[/b] starts · esc closes", id="title")
            yield Static("", id="links")
            yield Static("", id="matrix")
            yield DataTable(id="rows", zebra_stripes=True)

    def on_mount(self) -> None:
        t = self.query_one("#rows", DataTable)
        for label, key in (("test", "test"), ("where", "where"), ("size", "size"), ("GB/s", "gbs"),
                           ("of link", "pct"), ("latency", "lat"), ("note", "note")):
            t.add_column(label, key=key)

    def action_start(self) -> None:
        if self.running:
            return
        self.running = True
        self.rows = []
        self.query_one("#rows", DataTable).clear()
        self.query_one("#title", Label).update(
            f"[b]ddptop bench p2p[/b]  [dim]running: each test in its own process, {self.timeout:g} s timeout each…[/dim]")
        self._run()

    @work(thread=True, exclusive=True, group="bench", exit_on_error=False)
    def _run(self) -> None:

        try:
            rep = run(self.sizes, self.timeout, progress=lambda row: self.app.call_from_thread(self._add, row))
            self.app.call_from_thread(self._done, rep.device, None, rep.links)
        except Exception as e:  # noqa: BLE001 - the bench worker thread's boundary: the error is shown
            self.app.call_from_thread(self._done, "", f"{type(e).__name__}: {e}")

    def _add(self, r) -> None:

        self.rows.append(r)
        note = r.message if r.status != "ok" else (f"algbw {r.algbw:.3g} GB/s" if r.algbw is not None else "")
        status = "" if r.status == "ok" else f"{r.status.upper()}: "
        self.query_one("#rows", DataTable).add_row(
            r.test, r.where, size_text(r.size), f"{r.gbs:.3g}" if r.gbs is not None else "",
            f"{r.pct:.0f}%" if r.pct is not None else "",
            f"{r.latency_us:.1f} us" if r.latency_us is not None else "",
            Text(status + note, style=STATUS_STYLE.get(r.status, "") if r.status != "ok" else "dim"))
        m = matrix_text(self.rows)
        if m is not None:
            self.query_one("#matrix", Static).update(m)

    def _done(self, device: str, err: str | None, links: list[str] = ()) -> None:
        self.running = False
        self.query_one("#links", Static).update(Text("\n".join(links)))  # each GPU's links, what "of link" is of
        hangs = [r for r in self.rows if r.status == "hang"]
        title = self.query_one("#title", Label)
        if err:
            title.update(f"[b]ddptop bench p2p[/b]  [b $error]failed: {escape(err)}[/]  enter runs again · esc closes")
            return
        what = f"[b $error]{len(hangs)} test(s) HUNG[/]" if hangs else "done"
        title.update(f"[b]ddptop bench p2p[/b] on {escape(device)}: {what}  [dim]enter runs again · esc closes[/dim]")
        if matrix_text(self.rows) is None:
            self.query_one("#matrix", Static).update(Text("no GPU pairs here: the pairwise heat map needs 2 GPUs",
                                                         style="dim"))
