"""What the rank table shows, row by row: a rank's cells (pid, state, last output, step and phase, its GPU,
CPU, RSS, process status, threads, data-loader workers, lines, NCCL's RAS word) and, for a large job, a node's
row (its ranks' range, the worst of their states, its step range and slowest rank, its telemetry summed).
Each rank is judged here (culprit, dead, frozen, behind) so that the odd ones come first.  Pure functions of
the ``JobState`` (rich ``Text`` for styled cells); the widget that lays them out is ``rank_table.py``.
"""

from __future__ import annotations

from collections import Counter

from rich.text import Text

from ddptop.core.analysis.job_state import JobState, RankInfo, ras_of
from ddptop.core.analysis.line_folds import range_text
from ddptop.ui.fmt import fmt_age, fmt_bytes, fmt_pct

COLUMNS = (
    ("rank", "rank"), ("local", "local"), ("node", "node"), ("pid", "pid"), ("state", "state"),
    ("attempt", "attempt"), ("since", "last output"), ("step", "step"),
    ("gpu", "GPU"), ("cpu", "CPU"), ("rss", "RSS"), ("status", "status"), ("threads", "thr"),
    ("workers", "workers"), ("lines", "lines"), ("nccl", "NCCL (RAS)"),
)
QUIET_AFTER = 60.0  # seconds without output before "last output" is coloured as a warning
NODE_KEY = "node:"  # a node row's key: the node's name after it (a rank row's key is its rank)
FROZEN_AFTER = QUIET_AFTER  # no step for this long (s) while another rank stepped: frozen
BEHIND_AFTER = 10.0  # another rank has been at a later step for this long (s): behind
ODD = ("culprit", "dead", "frozen", "behind")  # a rank's verdict, worst first
SEVERITY = {w: i for i, w in enumerate(ODD)}
OK = len(ODD)
STOPPED = (-15, 143)  # SIGTERM: stopped (by torchrun after another rank failed, or by ddptop), not dead


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


def state_word(info, finished: bool) -> str:
    """What a rank's process is: waiting, alive, exited N, exited, gone."""
    if info.alive is None:
        return "waiting"
    if info.alive and not finished:
        return "alive"
    rc = info.exit_code
    if rc is None:
        return "exited" if not info.alive else "gone"
    return f"exited {rc}"


def rank_state(info, finished: bool, theme) -> Text:
    """``state_word`` in its colour."""
    word = state_word(info, finished)
    if word == "alive":
        return Text(word, style=theme.success or "")
    rc = info.exit_code
    if rc is None or not word.startswith("exited "):
        return Text(word, style="dim")
    return Text(word, style=(theme.success if rc == 0 else theme.error) or "")


def rank_row(r: int, info, finished: bool, theme, now: float, ras: str = "", culprit: bool = False) -> dict[str, object]:
    """Every column of rank ``r``'s row (``ras``: what NCCL's RAS port said of it
    during a stall; ``culprit``: the latest alarm names it the odd one out)."""
    th = theme
    state = rank_state(info, finished, th)
    if culprit:
        state = Text(f"{state.plain} ◀ odd one out", style=f"bold {th.error or 'red'}")
    if info.last_output_t is None:
        since = Text("-", style="dim")
    elif info.alive and not finished:
        age = now - info.last_output_t
        since = Text(fmt_age(age), style=(th.warning or "") if age > QUIET_AFTER else "")
    else:
        since = Text("-", style="dim")
    return {
        "rank": r,
        "local": "-" if info.local_rank is None else info.local_rank,
        "node": info.node or "-",
        "pid": "-" if info.pid is None else info.pid,
        "state": state,
        "attempt": info.attempt,
        "since": since,
        "step": ("-" if info.last_step is None else str(info.last_step))
                + (f" ({info.phase})" if info.phase in ("eval", "save") else ""),
        **rank_cells(info, finished, th),
        "lines": info.lines,
        "nccl": Text(ras, style=(th.error or "") if ras and ras != "ok" else "dim") if ras else "-",
    }


def ras_words(model: JobState) -> dict[int, str]:
    """``ras_of`` for every rank at once (it looks at every rank each call)."""
    ev = model.ras
    if ev is None or not ev.behind or not ras_of(model, next(iter(ev.behind))):
        return {}
    return {r: ev.behind.get(r, "ok") for r in model.ranks}


def rank_verdicts(model: JobState, culprits: set[int], ras: dict[int, str], now: float) -> dict[int, str]:
    """The odd ranks and what is odd about each (``ODD``); the others are left out.

    culprit: the newest alarm names it; dead: exited non-zero (not by SIGTERM),
    gone while the job runs, or dead to NCCL's RAS; frozen: no step for
    ``FROZEN_AFTER`` s while another rank stepped; behind: another rank has been
    at a later step for ``BEHIND_AFTER`` s (or RAS says it lags).  Steps are
    judged only where a rank reports them (a rank that never prints is no
    judge's)."""
    finished = model.finished
    reached: dict[int, float] = {}  # step -> when a rank first showed it (its earliest last_step_t)
    lead_t = None
    for info in model.ranks.values():
        s, t = info.last_step, info.last_step_t
        if s is None or t is None:
            continue
        if s not in reached or t < reached[s]:
            reached[s] = t
        lead_t = t if lead_t is None or t > lead_t else lead_t
    later: dict[int, float] = {}  # step -> the earliest time a later step was shown
    best = None
    for s in sorted(reached, reverse=True):
        if best is not None:
            later[s] = best
        best = reached[s] if best is None else min(best, reached[s])
    out: dict[int, str] = {}
    for r, info in model.ranks.items():
        if r in culprits:
            out[r] = "culprit"
            continue
        word = ras.get(r, "")
        rc = info.exit_code
        if (rc is not None and rc != 0 and rc not in STOPPED) or word == "dead" or (
                not finished and info.alive is False and rc is None):
            out[r] = "dead"
            continue
        if finished or not info.alive or info.last_step is None or info.last_step_t is None:
            if word and word != "ok" and not finished:
                out[r] = "behind"
            continue
        if lead_t is not None and lead_t - info.last_step_t > FROZEN_AFTER:
            out[r] = "frozen"
        elif (word and word != "ok") or now - later.get(info.last_step, now) > BEHIND_AFTER:
            out[r] = "behind"
    return out


def node_label(ranks: list[int], is_open: bool) -> str:
    """A node row's first cell: ``▸ r8-15`` (``▾`` when open)."""
    return f"{'▾' if is_open else '▸'} {range_text(ranks)}"


def node_state(ranks: list[int], infos: dict[int, RankInfo], odd: dict[int, str], finished: bool, theme) -> Text:
    """The worst of its ranks: ``culprit r777``, ``dead r8-15``, ``frozen r9``,
    ``behind r10``; else what its ranks are (``alive``; ``6 alive, 2 waiting``)."""
    th = theme
    for word in ODD:
        those = [r for r in ranks if odd.get(r) == word]
        if those:
            style = f"bold {th.error or 'red'}" if word == "culprit" else (
                (th.error or "red") if word == "dead" else (th.warning or "yellow"))
            return Text(f"{word} {range_text(those)}", style=style)
    words = Counter(state_word(infos[r], finished) for r in ranks)
    if len(words) == 1:
        return rank_state(infos[ranks[0]], finished, th)
    return Text(", ".join(f"{n} {w}" for w, n in words.most_common()))


def node_row(node: str, ranks: list[int], is_open: bool, model: JobState, theme, now: float,
             odd: dict[int, str], ras: dict[int, str]) -> dict[str, object]:
    """Every column of a node's row: its ranks (``▸ r8-15``), the worst of
    their states, the stalest last output, their step range and the slowest of
    them (``120-121 (r9)``), their GPUs, CPU range, RSS and lines summed, a status or RAS word
    worth a look, with the rank it is about."""
    th = theme
    finished = model.finished
    infos = [model.ranks[r] for r in ranks]
    live = [i for i in infos if i.alive and not finished]
    ages = [now - i.last_output_t for i in live if i.last_output_t is not None]
    since = Text("-", style="dim")
    if ages:
        since = Text(fmt_age(max(ages)), style=(th.warning or "") if max(ages) > QUIET_AFTER else "")
    stepped = [i for i in infos if i.last_step is not None]
    step = "-"
    if stepped:
        lo, hi = min(i.last_step for i in stepped), max(i.last_step for i in stepped)  # type: ignore[type-var]
        step = str(lo)
        if hi != lo:  # and the slowest: the lowest step, the longest there (short: 1,024 ranks fill 160 columns)
            slow = min(stepped, key=lambda i: (i.last_step, i.last_step_t or 0.0))
            step = f"{lo}-{hi} (r{slow.rank})"
    procs = [i.proc for i in infos if i.proc is not None]
    gpus = range_text(p.gpu for p in procs if p.gpu is not None).removeprefix("r") or "-"
    cpus = [p.cpu for i in live if (p := i.proc) is not None and p.cpu is not None]
    cpu = "-" if not cpus else (fmt_pct(min(cpus)) if min(cpus) == max(cpus)
                                else f"{min(cpus):.0f}-{fmt_pct(max(cpus))}")
    rss = [p.rss for p in procs if p.rss is not None]
    stale = finished or not live
    status: object = "-" if stale or not procs else ""
    for word, colour in (("zombie", th.error or "red"), ("disk-sleep", th.warning or "yellow")):
        hit = [i.rank for i in live if i.proc is not None and i.proc.status == word]
        if hit:
            status = Text(f"{word} {range_text(hit)}", style=colour)
            break
    kids = [p.children for i in live if (p := i.proc) is not None and p.children is not None]
    said = [(r, ras[r]) for r in ranks if ras.get(r)]
    bad = [(r, w) for r, w in said if w != "ok"]
    nccl: object = "-"
    if bad:
        nccl = Text(f"r{bad[0][0]} {bad[0][1]}" + (f" (+{len(bad) - 1})" if len(bad) > 1 else ""), style=th.error or "")
    elif said:
        nccl = Text("ok", style="dim")
    return {
        "rank": node_label(ranks, is_open),
        "local": "",
        "node": Text(node, style="bold"),
        "pid": "",
        "state": node_state(ranks, model.ranks, odd, finished, th),
        "attempt": max(i.attempt for i in infos),
        "since": since,
        "step": step,
        "gpu": gpus,
        "cpu": Text(cpu, style="dim" if stale else ""),
        "rss": Text(fmt_bytes(sum(rss)), style="dim" if stale else "") if rss else "-",
        "status": status,
        "threads": "",
        "workers": str(sum(kids)) if kids else "-",
        "lines": sum(i.lines for i in infos),
        "nccl": nccl,
    }
