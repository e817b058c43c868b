"""`ddptop diagnose PATH...`: the live analysis, post-mortem.

PATH may be a ddptop run directory, a torchrun --log-dir, or plain log files
(torchrun --tee output with ``[defaultN]:`` prefixes included).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ddptop.core import journal
from ddptop.core.analysis.analyzer import Analyzer
from ddptop.core.analysis.culprits import WAITED
from ddptop.core.events import LogBatch
from ddptop.core.tailer import Tailer

# "[rank3]:", "[default3]:" (torchrun --tee: the local rank), "[default1]:[rank5]:" (the global one wins)
_PREFIX_RANK = re.compile(r"^\s*(?:\[default\d+\]:\s?)?\[(?:default|rank)(\d+)\]:")
_GLOBAL_PREFIX = re.compile(r"^\s*(?:\[default\d+\]:\s?)?\[rank(\d+)\]:")
_NAME_RANK = re.compile(r"(?:rank|worker|proc|task)[_-]?(\d+)", re.IGNORECASE)
_LAST_NUMBER = re.compile(r"\d+(?=\D*$)")
# plain log files a directory may hold (SLURM's %j-%t.out, tee'd .txt, .err)
LOG_SUFFIXES = (".log", ".out", ".err", ".txt", ".stdout", ".stderr")


def _file_events(path: Path, rank: int | None, stream: str, rel: str, named: int | None = None):
    """The batches of one file.  ``rank``: the local rank its directory says
    (a torchrun --log-dir), else None; ``named``: the rank its name says
    (rank_3.log, or the number that tells it from the other files given)."""
    t = Tailer(path)
    out = []
    while True:
        before = t.pos
        out += t.read()
        if t.pos == before or t.at_eof():  # (a read with no line may be the rest of an over-long one)
            break
    out += t.flush()
    if rank is not None:
        # one rank's own file: torch's "[rankN]:" prefixes in it say its global rank (a --log-dir only
        # knows the local one, which repeats on every node)
        said = {m.group(1) for ln in out[:5000] for m in [_GLOBAL_PREFIX.match(ln.text)] if m}
        if len(said) == 1:
            rank = int(said.pop())
    elif not any(_PREFIX_RANK.match(ln.text) for ln in out):
        # no rank prefixes: its name may say which rank, else no rank is known (never a guess: a
        # dmesg or launcher log is nobody's)
        rank = named
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
    given: list[Path] = []  # plain files, read after the rest (their names say ranks together)
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
            files = rank_files(p)
            if files:
                for attempt, local_rank, stream, f in files:
                    an.feed(list(_file_events(f, local_rank, stream, str(f))))
                continue
            plain = sorted(f for f in p.rglob("*") if f.suffix.lower() in LOG_SUFFIXES and f.is_file())
            for f, named in zip(plain, ranks_by_name(plain)):
                an.feed(list(_file_events(f, None, "stdout", str(f), named)))
            continue
        if p.is_file():
            given.append(p)
            continue
        raise FileNotFoundError(f"{p}: no such file or directory")
    for f, named in zip(given, ranks_by_name(given)):
        an.feed(list(_file_events(f, None, "stdout", str(f), named)))
    return an


def rank_files(d: Path) -> list[tuple[int, int, str, Path]]:
    """(attempt, local rank, stream, path) of the rank logs torchrun's
    --log-dir layout holds under ``d``, whichever level of it ``d`` is: the
    log dir, its ``<run id>_<x>`` directory, an ``attempt_N``, or one rank's."""
    out = []
    for f in d.rglob("*.log"):  # (<rank>/stdout.log under any level, the rank's own directory included)
        if f.name not in ("stdout.log", "stderr.log") or not f.parent.name.isdigit():
            continue
        m = re.search(r"attempt_(\d+)", f.parent.parent.name)
        out.append((int(m.group(1)) if m else 0, int(f.parent.name), f.stem, f))
    return sorted(out, key=lambda x: (x[0], x[1], x[2]))


def ranks_by_name(files: list[Path]) -> list[int | None]:
    """The rank each file's name says: ``rank_3.log``, ``worker-3.out``; or,
    for files whose names differ only in their last number (SLURM's
    ``job-55120-3.out``, one per task), that number; else None."""
    keys = [_LAST_NUMBER.sub("#", f.name) for f in files]
    out: list[int | None] = []
    for f, key in zip(files, keys):
        m = _NAME_RANK.search(f.name)
        last = _LAST_NUMBER.search(f.name)
        if m:
            out.append(int(m.group(1)))
        elif last and keys.count(key) > 1 and len(last.group(0)) <= 5:
            out.append(int(last.group(0)))
        else:
            out.append(None)
    return out


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
    from ddptop.core.analysis.ras import verdict as ras_verdict

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
        v = ras_verdict(st, lambda _host, pid: by_pid.get(pid))
        out.append({"file": str(f), "version": st.version, "format": st.format, "culprits": v.culprits,
                    "verdict": v.text or "every rank launched the same collectives, none missing "
                               "(NCCL counts collectives only, not send/recv)"})
    return out


def report(an: Analyzer, flights: list[dict] | None = None, ras_answers: list[dict] | None = None) -> dict:
    from ddptop.core.analysis.culprits import failure_culprits
    from ddptop.core.signatures import collective_counters, counter_verdict

    rc = an.root_cause()
    counters = collective_counters(an.findings)
    _c, said = counter_verdict(counters)
    seen = set(an.stall.ranks) | {f.rank for f in an.findings if f.rank is not None}
    found = failure_culprits(an.findings, seen, an.last_steps,
                             [r.get("culprits") or () for r in ras_answers or []])
    return {
        "root_cause": rc.to_dict() if rc else None,
        "culprits": list(found.culprits),
        "collectives": {"per_rank": {str(r): {"last_enqueued": e, "last_completed": c}
                                     for r, (e, c) in sorted(counters.items())}, "verdict": said} if counters else None,
        "findings": [f.to_dict() for f in an.findings],
        "progress": {str(r): {"last_step": s} for r, s in sorted(an.last_steps.items())},
        "culprit_evidence": found.why,
        "flight_recorder": flights or [],
        "nccl_ras": ras_answers or [],
        # what went wrong in ddptop's own reading (a parser that failed on a line: that line was skipped)
        "notes": [n.message for n in an.notes],
    }


def format_report(rep: dict) -> str:
    out = []
    rc = rep["root_cause"]
    if rc:
        who = (f"rank {rc['rank']}" if rc["rank"] is not None else
               "torchrun" if str(rc.get("source", "")).endswith("torchrun.log") else "rank unknown")
        if rc["signature"] in WAITED and rc["rank"] is not None:
            who = f"seen first on rank {rc['rank']}, which waited for another"
        out.append(f"Root cause: {rc['signature']} ({who})")
        out.append(f"  {rc['explanation']}")
        out.append(f"  evidence: {rc['source']}:{rc['line']}: {rc['text'][:200]}")
        if rc["suggested_profiles"]:
            out.append(f"  try: {', '.join('--profile ' + p for p in rc['suggested_profiles'])}")
    elif rep["findings"]:
        out.append("Root cause: none found: only consequences (a lost peer, a stop from outside), so the process "
                   "that failed first left no error in these logs (killed: the OOM killer, the scheduler?)")
    else:
        out.append("Root cause: none found (no known failure signature in these logs)")
    if rep.get("collectives"):
        out.append(f"  collectives: {rep['collectives']['verdict']}")
    if rep.get("culprit_evidence"):
        out.append(f"  {rep['culprit_evidence']}")
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
    for note in rep.get("notes", []):
        out.append("")
        out.append(f"Note: {note}")
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
