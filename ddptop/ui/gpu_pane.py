"""The GPU pane: one row per GPU (utilisation and its history, memory, power,
temperature, the ranks on it, clocks, PCIe, throttling, ECC), its title and
footnote.  The formatting helpers are pure (tested directly); the widget only
turns the ``JobState`` into cells.  Nothing here does I/O.
"""

from __future__ import annotations

import re
import statistics
from typing import Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ddptop.core.analysis.job_state import JobState
from ddptop.ui.fmt import NA, fmt_gib, fmt_pct

BLOCKS = "▁▂▃▄▅▆▇█"
UTIL_SPARK = 24  # samples shown in the utilisation sparkline
POWER_SPARK = 12
GUESS_NOTE = "rank↔GPU mapping is a guess: the ranks' environment leaves their GPU open"
DEVICE_NOTE = "rank↔GPU by device (CUDA_VISIBLE_DEVICES / LOCAL_RANK → GPU UUID): NVML's pids are the host's"
SIM_TITLE = "GPUs — SIMULATED (utilisation = rank CPU %)"

GPU_COLUMNS = (  # most important first: narrow terminals cut the right-hand side
    ("gpu", "gpu"), ("util", "util"), ("hist", "util history"), ("ranks", "ranks"),
    ("mem", "mem used/total"), ("power", "power"), ("temp", "temp"), ("bw", "mem-bw"),
    ("phist", "power hist"), ("sm", "SM"), ("pcie", "PCIe"), ("throttle", "throttle"),
    ("ecc", "ECC/retired"), ("name", "name"),
)
FIXED_WIDTH = {"hist": UTIL_SPARK, "phist": POWER_SPARK}
GRID_FROM = 16  # more GPUs than this: one cell each in a grid (grouped by node), not a row each
OUTLIERS_NAMED = 8  # outliers named under the grid (then "and N more")
_XID_GPU = re.compile(r"\bon GPU (\d+)")



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


# -- the widget ----------------------------------------------------------------


def gpu_grid(model: JobState, theme) -> Text:
    """Every GPU as one cell, grouped by node (a space between nodes): its
    utilisation as the block's height and its colour; a lost GPU ``✖`` and one
    with an Xid ``!`` (a glyph, not colour alone); ``·`` no reading.  Then the
    outliers by name: lost, Xid, idle while most are busy, busy while most
    are idle."""
    err = getattr(theme, "error", None) or "red"
    ok = getattr(theme, "success", None) or "green"
    warn = getattr(theme, "warning", None) or "yellow"
    xid: set[tuple[str, int]] = set()
    for a in model.alarms:
        m = _XID_GPU.search(a.message) if a.id == "xid" else None
        if m:
            xid.add((a.node, int(m.group(1))))
    multi = len({node for node, _ in model.gpus}) > 1
    utils = [g.util for g in model.gpus.values() if g.util is not None and not g.lost]
    typical = statistics.median(utils) if utils else None
    out = Text()
    node_of = None
    lost, xids, idle, busy = [], [], [], []
    for (node, index), g in sorted(model.gpus.items()):
        if node_of is not None and node != node_of:
            out.append(" ")
        node_of = node
        name = gpu_label(node, index, multi) + (f" ({fmt_ranks(g)})" if g.ranks else "")
        if g.lost:
            out.append("✖", style=f"bold {err}")
            lost.append(name)
        elif (node, index) in xid:
            out.append("!", style=f"bold {err}")
            xids.append(name)
        elif g.util is None:
            out.append("·", style="dim")
        else:
            u = max(0.0, min(100.0, g.util))
            out.append(BLOCKS[min(len(BLOCKS) - 1, int(u / 100 * len(BLOCKS)))],
                       style=ok if u >= 90 else warn if u >= 10 else "dim")
            if typical is not None and typical >= 50 and u <= 10:
                idle.append(name)
            elif typical is not None and typical <= 10 and u >= 50:
                busy.append(name)
    said = [("✖ lost: ", lost), ("! Xid: ", xids), ("idle while most are busy: ", idle),
            ("busy while most are idle: ", busy)]
    for head, names in said:
        if names:
            more = f" and {len(names) - OUTLIERS_NAMED} more" if len(names) > OUTLIERS_NAMED else ""
            out.append("\n" + head, style=f"bold {err}" if head[0] in "✖!" else "bold")
            out.append(", ".join(names[:OUTLIERS_NAMED]) + more)
    nodes = len({node for node, _ in model.gpus})
    out.append(f"\n{len(model.gpus)} GPUs on {nodes} node{'s' if nodes != 1 else ''}, one cell each "
               f"(height and colour: utilisation{f', median {typical:.0f}%' if typical is not None else ''}); "
               "✖ lost, ! Xid, · no reading", style="dim")
    return out


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
    GpuPane #gpu-grid { height: auto; max-height: 14; padding: 0 1; display: none; }
    GpuPane #gpu-grid.-on { display: block; }
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
        yield Static("", id="gpu-grid")
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
        hows = {g.mapping for g in model.gpus.values()} | {
            i.proc.gpu_mapping for i in model.ranks.values() if i.proc is not None}
        fault = status.fault if status is not None and not model.gpus else ""
        note = (f"✗ {fault}" if fault else f"* {GUESS_NOTE}" if "guess" in hows
                else DEVICE_NOTE if "device" in hows else "")
        if note != self._note:
            self._note = note
            n = self.query_one("#gpu-note", Static)
            n.update(Text(note))
            n.set_class(bool(note), "-on")
            n.set_class(bool(fault), "-fault")
        grid = len(model.gpus) > GRID_FROM
        table.set_class(not model.gpus or grid, "-off")
        cells = self.query_one("#gpu-grid", Static)
        cells.set_class(grid, "-on")
        if grid:
            cells.update(gpu_grid(model, theme))
        elif model.gpus:
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
