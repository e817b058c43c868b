"""Telemetry widgets for the TUI: the GPU pane, the alarm box, rank-table cells.

Pure formatting helpers come first (tested directly); widgets only turn the
``JobState`` into cells and markup.  Nothing here does I/O.
"""

from __future__ import annotations

import time
from typing import Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.markup import escape
from textual.widgets import DataTable, Static

from ddptop.core.job_state import JobState

BLOCKS = "▁▂▃▄▅▆▇█"
UTIL_SPARK = 24  # samples shown in the utilisation sparkline
POWER_SPARK = 12
GIB = 1024**3
MIB = 1024**2
NA = "n/a"
GUESS_NOTE = "rank↔GPU mapping is a guess: NVML pids do not match (container?)"
SIM_TITLE = "GPUs — SIMULATED (utilisation = rank CPU %)"

GPU_COLUMNS = (  # most important first: narrow terminals cut the right-hand side
    ("gpu", "gpu"), ("util", "util"), ("hist", "util history"), ("ranks", "ranks"),
    ("mem", "mem used/total"), ("power", "power"), ("temp", "temp"), ("bw", "mem-bw"),
    ("phist", "power hist"), ("sm", "SM"), ("pcie", "PCIe"), ("throttle", "throttle"),
    ("ecc", "ECC/retired"), ("name", "name"),
)
FIXED_WIDTH = {"hist": UTIL_SPARK, "phist": POWER_SPARK}


# -- formatting ----------------------------------------------------------------


def sparkline(values: Iterable[float | None], width: int, top: float | None = 100.0) -> str:
    """The last ``width`` values as unicode blocks, right-aligned; None is a gap."""
    vals = list(values)[-width:]
    if top is None or top <= 0:
        nums = [v for v in vals if v is not None]
        top = max(nums) if nums else 0.0
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        elif top <= 0:
            out.append(BLOCKS[0])
        else:
            i = int(round(max(0.0, min(1.0, v / top)) * (len(BLOCKS) - 1)))
            out.append(BLOCKS[i])
    return " " * (width - len(out)) + "".join(out)


def fmt_pct(v: float | None) -> str:
    return NA if v is None else f"{v:.0f}%"


def fmt_gib(v: int | None) -> str:
    return NA if v is None else f"{v / GIB:.1f}"


def fmt_bytes(v: int | None) -> str:
    if v is None:
        return NA
    if v >= GIB:
        return f"{v / GIB:.1f} GiB"
    return f"{v / MIB:.0f} MiB"


def fmt_mem(used: int | None, total: int | None) -> str:
    if used is None and total is None:
        return NA
    return f"{fmt_gib(used)}/{fmt_gib(total)} GiB"


def fmt_power(p: float | None, limit: float | None) -> str:
    if p is None and limit is None:
        return NA
    a = NA if p is None else f"{p:.0f}"
    b = NA if limit is None else f"{limit:.0f}"
    return f"{a}/{b} W"


def fmt_pcie(g) -> str:
    if g.pcie_gen is None and g.pcie_width is None:
        link = NA
    else:
        link = f"{'?' if g.pcie_gen is None else g.pcie_gen}x{'?' if g.pcie_width is None else g.pcie_width}"
    if g.pcie_tx_kbs is not None or g.pcie_rx_kbs is not None:
        tx = NA if g.pcie_tx_kbs is None else f"{g.pcie_tx_kbs / 1024:.0f}"
        rx = NA if g.pcie_rx_kbs is None else f"{g.pcie_rx_kbs / 1024:.0f}"
        link += f" tx{tx}/rx{rx} MB/s"
    return link


def fmt_ecc(g) -> str:
    parts = []
    if g.ecc_uncorrected:
        parts.append(f"ecc {g.ecc_uncorrected}")
    if g.retired_pages:
        parts.append(f"retired {g.retired_pages}")
    return " ".join(parts)


def fmt_ranks(g) -> str:
    if not g.ranks:
        return "-"
    q = "?" if g.mapping == "guess" else ""
    return ",".join(f"r{r}{q}" for r in g.ranks)


def gpu_label(node: str, index: int, multi_node: bool) -> str:
    return f"{node}/{index}" if multi_node else str(index)


def gpu_rows(model: JobState, theme) -> dict[str, dict[str, object]]:
    """key -> column -> cell (str or rich Text), one row per GPU, in order."""
    err = getattr(theme, "error", None) or "red"
    warn = getattr(theme, "warning", None) or "yellow"
    prim = getattr(theme, "primary", None) or ""
    acc = getattr(theme, "accent", None) or prim
    nodes = {node for node, _ in model.gpus}
    multi = len(nodes) > 1 or len(model.nodes) > 1  # rows sort by (node, index): grouped by node
    rows: dict[str, dict[str, object]] = {}
    for (node, index), g in sorted(model.gpus.items()):
        hist = model.gpu_history.get((node, index), ())
        label = gpu_label(node, index, multi)
        if g.lost:
            gpu_cell = Text(f"{label} LOST", style=f"bold {err}")
            util_cell: object = Text("LOST", style=f"bold {err}")
        else:
            if g.simulated:
                gpu_cell = Text(f"{label} SIMULATED", style=f"bold {warn}")
            else:
                gpu_cell = Text(label, style="bold")
            util_cell = Text(fmt_pct(g.util), style=("dim" if g.util is None else "bold"))
        plimit = g.power_limit_w or None
        name = g.name or "-"
        if g.simulated and name.upper().startswith("SIMULATED GPU"):
            name = "SIMULATED GPU"
        rows[f"{node}:{index}"] = {
            "gpu": gpu_cell,
            "util": util_cell,
            "hist": Text(sparkline((h[1] for h in hist), UTIL_SPARK, 100.0), style=prim),
            "mem": fmt_mem(g.mem_used, g.mem_total),
            "bw": fmt_pct(g.mem_util),
            "power": fmt_power(g.power_w, g.power_limit_w),
            "phist": Text(sparkline((h[2] for h in hist), POWER_SPARK, plimit), style=acc),
            "temp": NA if g.temp_c is None else f"{g.temp_c:.0f}°C",
            "ranks": fmt_ranks(g),
            "sm": NA if g.sm_clock_mhz is None else f"{g.sm_clock_mhz} MHz",
            "pcie": fmt_pcie(g),
            "throttle": Text(",".join(g.throttle), style=warn) if g.throttle else "",
            "ecc": Text(fmt_ecc(g), style=err) if fmt_ecc(g) else "",
            "name": name[:32],
        }
    return rows


def rank_cells(info, finished: bool, theme) -> dict[str, object]:
    """The telemetry columns of one rank-table row."""
    p = info.proc
    if p is None:
        return {"gpu": "-", "cpu": "-", "rss": "-", "status": "-", "threads": "-", "workers": "-"}
    stale = finished or info.alive is False
    dim = "dim" if stale else ""
    gpu = "-" if p.gpu is None else f"{p.gpu}{'?' if p.gpu_mapping == 'guess' else ''}"
    status = p.status or "-"
    sstyle = dim
    if status == "zombie":
        sstyle = getattr(theme, "error", None) or "red"
    elif status == "disk-sleep":
        sstyle = getattr(theme, "warning", None) or "yellow"
    workers = "-" if p.children is None else str(p.children)
    if p.children and p.children_cpu:
        workers += f" ({p.children_cpu:.0f}%)"
    if stale:  # the process is gone: no live figures (RSS stays, dim, as its last size)
        status, sstyle, workers = ("ended" if info.alive is False else "-"), "dim", "-"
    return {
        "gpu": gpu,
        "cpu": Text("-" if stale else fmt_pct(p.cpu), style=dim),
        "rss": Text(fmt_bytes(p.rss), style=dim),
        "status": Text(status, style=sstyle),
        "threads": "-" if p.threads is None else str(p.threads),
        "workers": workers,
    }


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
            head += f"  [b $error]culprit: {escape(','.join(f'r{r}' for r in a.culprits))}[/]"
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


# -- widgets -------------------------------------------------------------------


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


class GpuPane(Vertical):
    """Title line, one DataTable row per GPU, and a footnote line."""

    DEFAULT_CSS = """
    GpuPane { height: auto; display: none; border-bottom: solid $primary 40%; }
    GpuPane.-on { display: block; }
    GpuPane.-on.-hidden { display: none; }
    GpuPane #gpu-title { height: 1; padding: 0 1; color: $text-muted; text-style: bold; }
    GpuPane #gpu-title.-sim { color: $warning; }
    GpuPane #gpus { height: auto; max-height: 10; }
    GpuPane #gpus.-off { display: none; }
    GpuPane #gpu-note { height: auto; padding: 0 1; color: $text-muted; display: none; }
    GpuPane #gpu-note.-on { display: block; }
    GpuPane #gpu-note.-fault { color: $error; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._cells: dict[tuple[str, str], str] = {}
        self._widths: dict[str, int] = {}
        self._keys: list[str] = []
        self._title = None
        self._note = None

    def compose(self) -> ComposeResult:
        yield Static("GPUs", id="gpu-title")
        table: DataTable = DataTable(id="gpus", cursor_type="none", zebra_stripes=True)
        table.can_focus = False
        yield table
        yield Static("", id="gpu-note")

    def on_mount(self) -> None:
        table = self.query_one("#gpus", DataTable)
        for key, label in GPU_COLUMNS:
            table.add_column(label, key=key, width=FIXED_WIDTH.get(key))

    def show(self, model: JobState, theme) -> None:
        status = model.gpu_status
        if status is None and not model.gpus:
            self.remove_class("-on")
            return
        self.add_class("-on")
        simulated = any(g.simulated for g in model.gpus.values()) or (status is not None and status.backend == "sim")
        table = self.query_one("#gpus", DataTable)
        if simulated:
            title = SIM_TITLE
        else:
            bits = ["GPUs"]
            if status is not None and status.backend == "nvml":
                bits.append("NVML" + (f", driver {status.driver}" if status.driver else ""))
            if not model.gpus and status is not None:
                bits.append(status.message or "no GPU")
            title = " — ".join(bits)
        if title != self._title:
            self._title = title
            t = self.query_one("#gpu-title", Static)
            t.update(Text(title))
            t.set_class(simulated, "-sim")
        guess = any(g.mapping == "guess" for g in model.gpus.values()) or any(
            i.proc is not None and i.proc.gpu_mapping == "guess" for i in model.ranks.values())
        fault = status.fault if status is not None and not model.gpus else ""
        note = f"✗ {fault}" if fault else f"* {GUESS_NOTE}" if guess else ""
        if note != self._note:
            self._note = note
            n = self.query_one("#gpu-note", Static)
            n.update(Text(note))
            n.set_class(bool(note), "-on")
            n.set_class(bool(fault), "-fault")
        table.set_class(not model.gpus, "-off")
        if model.gpus:
            self._sync(table, gpu_rows(model, theme))

    def _sync(self, table: DataTable, rows: dict[str, dict[str, object]]) -> None:
        keys = list(rows)
        if keys != self._keys:
            table.clear()
            self._cells.clear()
            self._keys = keys
            for key, row in rows.items():
                table.add_row(*(row[c] for c, _ in GPU_COLUMNS), key=key)
                for col, val in row.items():
                    self._cells[(key, col)] = str(val)
                    self._widths[col] = max(self._widths.get(col, 0), len(str(val)))
            return
        for key, row in rows.items():
            for col, val in row.items():
                sval = str(val)
                if self._cells.get((key, col)) == sval:
                    continue
                self._cells[(key, col)] = sval
                wider = col not in FIXED_WIDTH and len(sval) > self._widths.get(col, 0)
                if wider:
                    self._widths[col] = len(sval)
                table.update_cell(key, col, val, update_width=wider)


def is_recent(t: float, within: float = 120.0) -> bool:
    return time.time() - t <= within
