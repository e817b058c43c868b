"""`ddptop diagnose PATH...`: the live analysis, post-mortem.

PATH may be a ddptop run directory, a torchrun --log-dir, or plain log files
(torchrun --tee output with ``[defaultN]:`` prefixes included).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ddptop.core import journal
from ddptop.core.analyzer import Analyzer
from ddptop.core.events import LogBatch
from ddptop.core.tailer import Tailer

_PREFIX_RANK = re.compile(r"^\s*\[(?:default|rank)(\d+)\]:")
_NAME_RANK = re.compile(r"(?:rank|worker)[_-]?(\d+)", re.IGNORECASE)


def _file_events(path: Path, rank: int | None, stream: str, rel: str):
    t = Tailer(path)
    out = []
    while True:
        before = t.pos
        out += t.read()
        if t.pos == before or t.at_eof():  # (a read with no line may be the rest of an over-long one)
            break
    out += t.flush()
    if rank is None and not any(_PREFIX_RANK.match(ln.text) for ln in out):
        # one rank's own log, with no rank prefixes: its name may say which rank (rank_3.log), else rank 0
        m = _NAME_RANK.search(path.name)
        rank = int(m.group(1)) if m else 0
    # consecutive lines of one rank (and up to a progress bar's redraw) make one batch
    run: list = []
    run_rank: int | None = None

    def batch():
        cut = tuple(i for i, ln in enumerate(run) if ln.partial)
        return LogBatch(0.0, rank=run_rank, stream=stream, attempt=0, path=rel, node="",
                        offsets=tuple(ln.offset for ln in run), texts=tuple(ln.text for ln in run),
                        partial=cut, transient=run[-1].transient)

    for ln in out:
        r = rank
        if r is None:
            m = _PREFIX_RANK.match(ln.text)
            if m:
                r = int(m.group(1))
        if run and r != run_rank:
            yield batch()
            run = []
        run_rank = r
        run.append(ln)
        if ln.transient:
            yield batch()
            run = []
    if run:
        yield batch()


def analyze_paths(paths: list[str]) -> Analyzer:
    an = Analyzer(clock=lambda: 0.0, detect_stalls=False)
    for p in map(Path, paths):
        if (p / journal.META).is_file():
            from ddptop.core.session import Session

            s = Session.open(p)
            while not s.finished:
                batch = s.poll()
                if not batch and not s.is_live and not s.backlog:
                    break
                an.feed(batch)
            continue
        if p.is_dir():
            files = journal.rank_log_files(p)
            if not files:
                files = [(0, None, "stdout", f) for f in sorted(p.rglob("*.log"))]
            for attempt, local_rank, stream, f in files:
                an.feed(list(_file_events(f, local_rank, stream, str(f))))
            continue
        if p.is_file():
            an.feed(list(_file_events(p, None, "stdout", str(p))))
            continue
        raise FileNotFoundError(f"{p}: no such file or directory")
    return an


def flight_reports(paths: list[str]) -> list[dict]:
    """Flight-recorder dumps among the paths (a run's flight/ directory, or a
    directory of rank_N dumps), each analysed: which rank diverged."""
    from ddptop.core import flight

    out = []
    for p in map(Path, paths):
        for d in (p / "flight", p):
            if not d.is_dir() or not any(re.fullmatch(flight.PREFIX + r"\d+", n.name) for n in d.iterdir()):
                continue
            dumps, problems = flight.load_dir(d)
            rep = flight.analyse(dumps)
            out.append({"dir": str(d), "ranks": rep.ranks, "culprits": rep.culprits, "findings": rep.findings,
                        "problems": problems})
            break
    return out


def ras_reports(paths: list[str]) -> list[dict]:
    """NCCL RAS answers among the paths (kept by ddptop beside a stall's stacks,
    ``RUN/stacks/*-ras.json|txt``, or an ``ncclras`` output file given
    directly), the latest per run, each read: who NCCL saw behind, in global
    ranks where the run's journal knows the pids."""
    from ddptop.core import ras

    out = []
    for p in map(Path, paths):
        files = sorted(p.glob("stacks/*-ras.*")) if p.is_dir() else [p] if "ras" in p.name.lower() else []
        if not files:
            continue
        f = files[-1]
        try:
            raw = f.read_text(errors="replace")
        except OSError as e:
            out.append({"file": str(f), "error": str(e)})
            continue
        st = ras.parse(raw, "json" if raw.lstrip().startswith("{") else "text")
        by_pid: dict[int, int] = {}
        if p.is_dir():
            try:
                with open(p / journal.EVENTS, encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        if '"kind": "rank"' not in line and '"kind":"rank"' not in line:
                            continue
                        try:
                            d = json.loads(line)
                        except ValueError:
                            continue  # a damaged line: (the live readers say so; here it only costs a mapping)
                        if isinstance(d, dict) and isinstance(d.get("pid"), int) and isinstance(d.get("rank"), int):
                            by_pid[d["pid"]] = d["rank"]
            except OSError:
                pass
        v = ras.verdict(st, lambda _host, pid: by_pid.get(pid))
        out.append({"file": str(f), "version": st.version, "format": st.format, "culprits": v.culprits,
                    "verdict": v.text or "every rank launched the same collectives, none missing "
                               "(NCCL counts collectives only, not send/recv)"})
    return out


def report(an: Analyzer, flights: list[dict] | None = None, ras_answers: list[dict] | None = None) -> dict:
    from ddptop.core.signatures import collective_counters, counter_verdict

    rc = an.root_cause()
    counters = collective_counters(an.findings)
    culprits, said = counter_verdict(counters)
    if rc is not None and rc.rank is not None and rc.level == 0 and not culprits:
        culprits = (rc.rank,)
    for r in ras_answers or []:
        if not culprits and r.get("culprits"):
            culprits = tuple(r["culprits"])  # NCCL's own view
    return {
        "root_cause": rc.to_dict() if rc else None,
        "culprits": list(culprits),
        "collectives": {"per_rank": {str(r): {"last_enqueued": e, "last_completed": c}
                                     for r, (e, c) in sorted(counters.items())}, "verdict": said} if counters else None,
        "findings": [f.to_dict() for f in an.findings],
        "progress": {str(r): {"last_step": s} for r, s in sorted(an.last_steps.items())},
        "flight_recorder": flights or [],
        "nccl_ras": ras_answers or [],
    }


def format_report(rep: dict) -> str:
    out = []
    rc = rep["root_cause"]
    if rc:
        who = f"rank {rc['rank']}" if rc["rank"] is not None else "torchrun"
        out.append(f"Root cause: {rc['signature']} ({who})")
        out.append(f"  {rc['explanation']}")
        out.append(f"  evidence: {rc['source']}:{rc['line']}: {rc['text'][:200]}")
        if rc["suggested_profiles"]:
            out.append(f"  try: {', '.join('--profile ' + p for p in rc['suggested_profiles'])}")
    else:
        out.append("Root cause: none found (no known failure signature in these logs)")
    if rep.get("collectives"):
        out.append(f"  collectives: {rep['collectives']['verdict']}")
    if rep.get("culprits"):
        out.append(f"  culprit: {', '.join(f'rank {r}' for r in rep['culprits'])}")
    seen: dict[tuple, list] = {}
    for f in rep["findings"]:
        seen.setdefault((f["signature"], f["rank"]), []).append(f)
    if seen:
        out.append("")
        out.append("Findings:")
        for (sig, rank), fs in seen.items():
            who = f"rank {rank}" if rank is not None else "-"
            n = f" (x{len(fs)})" if len(fs) > 1 else ""
            out.append(f"  {sig:<24} {who:<8} {fs[0]['source']}:{fs[0]['line']}: {fs[0]['text'][:120]}{n}")
    if rep["progress"]:
        out.append("")
        out.append("Last training step per rank: " + ", ".join(
            f"r{r}={v['last_step'] if v['last_step'] is not None else '?'}" for r, v in rep["progress"].items()))
    for r in rep.get("nccl_ras", []):
        out.append("")
        if r.get("error"):
            out.append(f"NCCL RAS ({r['file']}): unreadable: {r['error']}")
        else:
            out.append(f"NCCL RAS ({r['file']}, NCCL {r['version'] or '?'}, {r['format']}): {r['verdict']}")
    for fr in rep.get("flight_recorder", []):
        out.append("")
        out.append(f"Flight recorder ({fr['dir']}, ranks {', '.join(map(str, fr['ranks'])) or 'none'}):")
        out += [f"  {f}" for f in fr["findings"]] + [f"  unreadable: {p}" for p in fr["problems"]]
    return "\n".join(out)


def main(paths: list[str], json_mode: bool) -> int:
    an = analyze_paths(paths)
    rep = report(an, flight_reports(paths), ras_reports(paths))
    print(json.dumps(rep, indent=2) if json_mode else format_report(rep))
    return 1 if rep["root_cause"] else 0
