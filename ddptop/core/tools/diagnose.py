"""`ddptop diagnose PATH...`: the live analysis, post-mortem.

PATH may be a ddptop run directory, a torchrun --log-dir, or plain log files
(torchrun --tee output with ``[defaultN]:`` prefixes included), and saved stack
dumps.  It reads them (``analyze_paths``, ``stacks_report``, the run's story),
builds one typed ``DiagnoseReport`` and renders it as JSON or words.

One module, though over 500 lines: it is one command's reading and its one
report; the judging lives in ``analysis/``, the finding of dumps in
``stack_files``, the run's replay in ``run_story``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ddptop.core.analysis import paste
from ddptop.core.analysis.analyzer import Analyzer
from ddptop.core.analysis.culprits import (
    WAITED,
    Culprits,
    Evidence,
    LostPeers,
    culprits_of,
    lost_peers,
)
from ddptop.core.analysis.failure_ranking import collective_counters, counter_verdict, first_failed
from ddptop.core.analysis.native_frames import is_launch
from ddptop.core.analysis.prefixes import PrefixReader
from ddptop.core.analysis.ras_verdict import verdict as ras_verdict
from ddptop.core.analysis.signature_catalog import CONSEQUENCE, INFO
from ddptop.core.analysis.signatures import Finding
from ddptop.core.analysis.stack_verdict import verdict
from ddptop.core.analysis.wording import launch_words
from ddptop.core.model import run_dirs
from ddptop.core.model.events import AlarmEvent, LogBatch
from ddptop.core.model.evidence import StackEvidence, Where, ranks_text
from ddptop.core.run import journal
from ddptop.core.sources import flight_recorder as flight
from ddptop.core.sources import ras_parse
from ddptop.core.sources import stack_files as dump_files
from ddptop.core.sources.log_tailer import Tailer
from ddptop.core.sources.stack_files import DumpSet
from ddptop.core.sources.stack_probe import source_line
from ddptop.core.tools import run_story
from ddptop.core.tools.run_story import ENDED_WORDS, RunStory

_NAME_RANK = re.compile(r"(?:rank|worker|proc|task)[_-]?(\d+)", re.IGNORECASE)
_LAST_NUMBER = re.compile(r"\d+(?=\D*$)")
# plain log files a directory may hold (SLURM's %j-%t.out, tee'd .txt, .err)
LOG_SUFFIXES = (".log", ".out", ".err", ".txt", ".stdout", ".stderr")


def _file_events(path: Path, rank: int | None, stream: str, rel: str, named: int | None = None):
    """(the physical line number of its first line, batch) for the lines of
    one file, as a paste is read (:mod:`ddptop.core.analysis.paste`: flattened lines
    split, wrapped ones joined), each line with the rank its launcher's prefix
    says (:mod:`ddptop.core.analysis.prefixes`, taken off the text).  ``rank``: the
    local rank its directory says (a torchrun --log-dir), else None;
    ``named``: the rank its name says (rank_3.log, or the number that tells it
    from the other files given)."""
    t = Tailer(path)
    raw = []
    while True:
        before = t.pos
        raw += t.read()
        if t.pos == before or t.at_eof():  # (a read with no line may be the rest of an over-long one)
            break
    raw += t.flush()
    cut = {i for i, ln in enumerate(raw) if ln.partial}
    numbered = paste.lines([ln.text for ln in raw], range(1, len(raw) + 1))
    reader = PrefixReader()
    for _n, text in numbered[:5000]:
        reader.learn(text)  # (which ambiguous prefixes the file uses, which Ray worker is which rank)
    lines = [(n, reader.split(text)) for n, text in numbered]
    if rank is not None:
        # one rank's own file: torch's "[rankN]:" prefixes in it say its global rank (a --log-dir only
        # knows the local one, which repeats on every node)
        said = {p.rank for _n, p in lines[:5000] if p.rank is not None and "torch" in p.forms}
        if len(said) == 1:
            rank = said.pop()
    elif not any(p.rank is not None for _n, p in lines):
        # no rank prefixes: its name may say which rank, else no rank is known (never a guess: a
        # dmesg, launcher log or single-file paste is nobody's)
        rank = named
    last_transient = bool(raw) and raw[-1].transient
    # consecutive lines of one rank make one batch (a batch's lines have consecutive line numbers)
    run: list[tuple[int, str]] = []
    run_rank: int | None = None
    run_host = ""

    def batch(transient: bool = False):
        return run[0][0], LogBatch(0.0, rank=run_rank, stream=stream, attempt=0, path=rel, node=run_host,
                                   offsets=tuple(0 for _ in run), texts=tuple(x for _n, x in run),
                                   partial=tuple(i for i, (n, _x) in enumerate(run) if n - 1 in cut),
                                   transient=transient)

    for i, (n, p) in enumerate(lines):
        r = rank if rank is not None else p.rank
        if run and (r != run_rank or p.host != run_host or n != run[-1][0] + 1):
            yield batch()
            run = []
        run_rank, run_host = r, p.host
        run.append((n, p.text))
    if run:
        yield batch(last_transient)


def analyze_paths(paths: list[str], read: Mapping[str, list] | None = None) -> Analyzer:
    """``read``: runs already read (``run_story.timed_events``, by path), not read again."""
    an = Analyzer(clock=lambda: 0.0, detect_stalls=False)
    # cause and consequence ordered by the lines' own time stamps; a stamp without a year (glog's) takes the
    # year the files were written
    an.read_stamps = True
    mtimes = [p.stat().st_mtime for p in map(Path, paths) if p.exists()]
    if mtimes:
        import time as _time

        an.default_year = _time.gmtime(max(mtimes)).tm_year
    given: list[Path] = []  # plain files, read after the rest (their names say ranks together)
    for p in map(Path, paths):
        if journal.is_run(p):
            # a run's lines at the times its live analysis read them (its journal's marks), so that a finding
            # is dated when it happened, not when it is read now
            events = (read or {}).get(str(p))
            for ev in events if events is not None else run_story.timed_events(p)[0]:
                an.feed([ev])
            continue
        if p.is_dir():
            files = rank_files(p)
            if files:
                for attempt, local_rank, stream, f in files:
                    _feed(an, _file_events(f, local_rank, stream, str(f)))
                continue
            plain = sorted(f for f in p.rglob("*") if f.suffix.lower() in LOG_SUFFIXES and f.is_file())
            for f, named in zip(plain, ranks_by_name(plain)):
                _feed(an, _file_events(f, None, "stdout", str(f), named))
            continue
        if p.is_file():
            given.append(p)
            continue
        raise FileNotFoundError(f"{p}: no such file or directory")
    for f, named in zip(given, ranks_by_name(given)):
        _feed(an, _file_events(f, None, "stdout", str(f), named))
    return an


def _feed(an: Analyzer, batches) -> None:
    """Each batch at its own line number (a paste's lines, split or joined, keep the file's numbers)."""
    for first, b in batches:
        an.line_no[b.path] = first - 1
        an.feed([b])


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
        st = ras_parse.parse(raw, "json" if raw.lstrip().startswith("{") else "text")
        by_pid: dict[int, int] = {}
        if p.is_dir():
            try:
                with open(p / run_dirs.EVENTS, encoding="utf-8", errors="replace") as fh:
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


@dataclass(frozen=True)
class StacksReport:
    """What saved stack dumps say (``ddptop diagnose`` on py-spy, gdb or
    pystack dumps, or a run's own samples): the live verdict, typed; its
    JSON (``to_dict``) and its words (``lines``) are both rendered from it."""

    evidence: StackEvidence
    dumps: DumpSet

    @property
    def samples(self) -> int:
        return min((len(v) for v in self.dumps.samples.values()), default=0)

    def _label(self, text: str) -> str:
        """Ranks that are pids (no rank was known) said as pids."""
        for pid in sorted(self.dumps.by_pid, reverse=True):
            text = re.sub(rf"\branks? {pid}\b", f"pid {pid}", text)
        return text

    def rank_dict(self, w: Where) -> dict:
        base = w.file.replace("\\", "/").rsplit("/", 1)[-1]
        return {"kind": w.kind, "status": w.status, "where": f"{base}:{w.line}" if w.line else base,
                "file": w.file, "line": w.line, "function": w.function, "call": w.call,
                "library": w.library, "gpu": w.gpu, "native": w.native, "native_read": w.native_read,
                "text": self._label(w.text),
                "others": list(w.others), "label": self.dumps.label(w.rank)}

    def to_dict(self) -> dict:
        v = self.evidence
        return {"hung": v.hung, "samples": self.samples, "culprits": list(v.culprits),
                "waiting": list(v.waiting), "mismatch": v.mismatch, "deadlock": v.deadlock,
                "groups": [{"ranks": list(g.ranks), "status": g.status, "kind": g.kind,
                            "text": self._label(g.text), "culprit": g.culprit} for g in v.groups],
                "ranks": {str(r): self.rank_dict(w) for r, w in sorted(v.where.items())},
                "by_pid": sorted(self.dumps.by_pid), "summary": self._label(v.summary),
                "formats": sorted(self.dumps.formats), "sources": self.dumps.sources, "notes": self.dumps.notes,
                "launching": self.launching, "suggested_profiles": ["eager-load"] if self.launching else []}

    def lines(self) -> list[str]:
        v = self.evidence
        n = self.samples
        head = (f"Stacks: {len(v.where)} process{'es' if len(v.where) != 1 else ''}, "
                f"{n} sample{'s' if n != 1 else ''} each ({', '.join(sorted(self.dumps.formats))})")
        verdict = {True: "hung", False: "no hang", None: "cannot tell whether it is hung"}[v.hung]
        if v.deadlock:
            verdict = "hung: a deadlock in the CUDA driver, no odd rank out"
        out = [head, f"  verdict: {verdict}"]
        if v.culprits:
            out.append("  odd one out: " + ", ".join(self.dumps.label(r) for r in v.culprits))
        groups = sorted(v.groups, key=lambda g: (not g.culprit, -len(g.ranks)))
        for g in groups:
            who = self._label(ranks_text(g.ranks))
            mark = "!" if g.culprit else " "
            out.append(f" {mark} {who}: {self._label(g.text)}")
        others = {r: w.others for r, w in sorted(v.where.items()) if w.others}
        for r, ths in others.items():
            for t in ths:
                out.append(f"    {self.dumps.label(r)}: {self._label(t)}")
        no_native = [r for r, w in sorted(v.where.items()) if w.status != "unknown" and not w.native_read]
        if no_native and len(no_native) < len(v.where) or (no_native and any(
                w.status == "unclear" for w in v.where.values())):
            out.append("  no native frames in the dumps of " + ", ".join(self.dumps.label(r) for r in no_native) +
                       " (py-spy without --native, or its unwinding failed): where they wait in C is not known")
        out.append(f"  summary: {self._label(v.summary)}")
        launching = self.launching
        if launching:
            out.append("  " + self._label(launch_words(launching)))
            out.append("  try: --profile eager-load" if self.evidence.hung else
                       "  if a second dump a few seconds later shows it there still (one sample cannot tell a "
                       "launch that waits from one caught on its way), try: --profile eager-load")
        out += [f"  note: {x}" for x in self.dumps.notes]
        return out

    @property
    def launching(self) -> list[int]:
        """The ranks (or pids) held inside a kernel launch (see ``native_frames.is_launch``), unless the samples
        show the job moving (a busy job is often caught launching)."""
        if self.evidence.hung is False:
            return []
        return sorted(r for r, w in self.evidence.where.items() if w.kind == "gpu-wait" and is_launch(w.native))


def stacks_report(paths: list[str], gpu_job: bool = False) -> StacksReport | None:
    """The verdict of the stack dumps among ``paths`` (see :mod:`ddptop.core.sources.stack_files`), or None."""

    ds = dump_files.load(paths)
    if ds is None:
        return None
    return StacksReport(verdict(ds.samples, source_line, gpu_job=gpu_job, no_gpu=ds.no_gpu), ds)


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="milliseconds")


def _hang(story: RunStory, an: Analyzer, rc) -> AlarmEvent | None:
    """The run's hang, when it is the root cause: ddptop saw it hang and no
    cause in its logs came before (a rank that crashed, then the others hung
    waiting for it)."""
    hang = story.hang
    if hang is None:
        return None
    rc_t = an.read_at.get(rc) if rc is not None else None
    if rc is not None and (rc_t is None or rc_t <= hang.t):
        return None
    return hang


def _ended_by(an: Analyzer, story: RunStory | None) -> dict | None:
    """Who ended the job: the run's own record (a run ddptop launched), made
    precise by what its logs say (a scheduler's stop, a stop from outside);
    for logs alone, what they say, else unknown (None)."""
    sched = next((f for f in an.findings if f.signature in ("scheduler-stopped", "scheduler-oom-kill")), None)
    outside = next((f for f in an.findings if f.signature == "outside-stop" and f.level < CONSEQUENCE), None)
    if story is not None:
        ended = story.ended_by.to_dict()
        if ended["by"] in ("job", "outside", "lost") and (sched or outside):
            by = "scheduler" if sched else "outside"
            ended.update(by=by, words=ENDED_WORDS[by])
        return ended
    if sched or outside:
        by = "scheduler" if sched else "outside"
        f = sched or outside
        assert f is not None
        return {"by": by, "words": ENDED_WORDS[by], "state": None, "exit_code": None,
                "t": an.stamped_at.get(f), "message": f.text}
    return None


@dataclass(frozen=True)
class DiagnoseReport:
    """What ``ddptop diagnose`` found, typed: its JSON (``to_dict``) and its
    words (``lines``) are both rendered from these fields."""

    root: Finding | None  # the root cause among the logs' findings
    hang: AlarmEvent | None  # the run's hang, when it is the root (a run ddptop saw hang)
    hang_replayed: bool
    found: Culprits  # the culprits, from culprits_of
    findings: tuple[Finding, ...]
    counters: Mapping[int, tuple[int, int]]  # PyTorch's per-rank collective counters
    counters_said: str
    last_steps: Mapping[int, int | None]
    job_step: int | None  # progress no rank is known for: the job's, never rank 0's
    lost: LostPeers | None  # with only consequences: who lost whom
    flights: tuple[dict, ...]
    ras: tuple[dict, ...]
    notes: tuple[str, ...]  # what went wrong in ddptop's own reading (a line a parser failed on)
    stacks: StacksReport | None
    story: RunStory | None
    ended: dict | None
    root_time: float | None = None
    root_node: str | None = None

    @property
    def culprits(self) -> list[int]:
        return list(self.hang.culprits) if self.hang is not None else list(self.found.culprits)

    def root_dict(self) -> dict | None:
        if self.hang is not None:
            h = self.hang
            where = {str(r): w.to_dict() for r, w in sorted(h.where.items())}
            return {"signature": h.id, "rank": h.culprits[0] if len(h.culprits) == 1 else None,
                    "node": h.node or None, "time": _iso(h.t), "text": h.message,
                    "explanation": h.message.split(". ", 1)[0].rstrip(".") + ".",
                    "source": "ddptop's live analysis, replayed from the run's journal" if self.hang_replayed else
                              "ddptop's live alarm, as the run recorded it",
                    "line": None, "suggested_profiles": list(h.suggested_profiles), "culprits": list(h.culprits),
                    "where": where, "replayed": self.hang_replayed}
        if self.root is None:
            return None
        return {**self.root.to_dict(), "node": self.root_node, "time": _iso(self.root_time)}

    def to_dict(self) -> dict:
        st = self.story
        return {
            "root_cause": self.root_dict(),
            "ended_by": self.ended,
            "stalls": {"replayed": [_alarm_dict(a) for a in st.stalls], "recorded": [_alarm_dict(a) for a in st.recorded],
                       "differences": list(st.differences)} if st is not None else None,
            "culprits": self.culprits,
            "collectives": {"per_rank": {str(r): {"last_enqueued": e, "last_completed": c}
                                         for r, (e, c) in sorted(self.counters.items())},
                            "verdict": self.counters_said} if self.counters else None,
            "findings": [f.to_dict() for f in self.findings],
            "progress": {str(r): {"last_step": s} for r, s in sorted(self.last_steps.items())},
            "job_progress": {"last_step": self.job_step} if self.job_step is not None else None,
            "lost_peers": self.lost.to_dict() if self.lost is not None else None,
            "culprit_evidence": self.found.why,
            "flight_recorder": list(self.flights),
            "nccl_ras": list(self.ras),
            "notes": list(self.notes),
            "stacks": self.stacks.to_dict() if self.stacks is not None else None,
        }

    def lines(self) -> list[str]:
        out: list[str] = []
        if self.stacks is not None and not self.findings and self.ended is None and not self.last_steps:
            return self.stacks.lines()  # only dumps (no training log): their verdict is the answer
        out += self._root_lines()
        if self.ended is not None:
            e = self.ended
            out.append(f"  ended by: {e['words']}" + (f": {e['message']}" if e.get("message") else ""))
        if self.story is not None:
            out += [f"  replay and live differ: {d}" for d in self.story.differences]
        if self.counters:
            out.append(f"  collectives: {self.counters_said}")
        if self.found.why and self.hang is None:
            out.append(f"  {self.found.why}")
        if self.culprits:
            out.append(f"  culprit: {', '.join(f'rank {r}' for r in self.culprits)}")
        seen: dict[tuple, list[Finding]] = {}
        for f in self.findings:
            seen.setdefault((f.signature, f.rank), []).append(f)
        if seen:
            out += ["", "Findings:"]
            for (sig, rank), fs in seen.items():
                who = f"rank {rank}" if rank is not None else "-"
                n = f" (x{len(fs)})" if len(fs) > 1 else ""
                out.append(f"  {sig:<24} {who:<8} {fs[0].source}:{fs[0].line}: {fs[0].text[:120]}{n}")
        if self.last_steps:
            out += ["", "Last training step per rank: " + ", ".join(
                f"r{r}={s if s is not None else '?'}" for r, s in sorted(self.last_steps.items()))]
        if self.job_step is not None:
            out += ["", f"Last training step (the job's: no rank prefix says whose): {self.job_step}"]
        for r in self.ras:
            out.append("")
            out.append(f"NCCL RAS ({r['file']}): unreadable: {r['error']}" if r.get("error") else
                       f"NCCL RAS ({r['file']}, NCCL {r['version'] or '?'}, {r['format']}): {r['verdict']}")
        for note in self.notes:
            out += ["", f"Note: {note}"]
        for fr in self.flights:
            out += ["", f"Flight recorder ({fr['dir']}, ranks {', '.join(map(str, fr['ranks'])) or 'none'}):"]
            out += [f"  {f}" for f in fr["findings"]] + [f"  unreadable: {p}" for p in fr["problems"]]
        if self.stacks is not None:
            out += [""] + self.stacks.lines()
        return out

    def _root_lines(self) -> list[str]:
        rc = self.root
        if self.hang is not None:
            h = self.hang
            who = ", ".join(f"rank {r}" for r in h.culprits) or "no single rank"
            out = [f"Root cause: the job hung ({h.id}; odd rank out: {who}" + (f", on {h.node}" if h.node else "")
                   + f"), at {_iso(h.t)}", f"  {h.message}",
                   "  (ddptop's live analysis, replayed from the run's journal)" if self.hang_replayed else
                   "  (ddptop's live alarm, as the run recorded it)"]
            if h.suggested_profiles:
                out.append(f"  try: {', '.join('--profile ' + p for p in h.suggested_profiles)}")
            return out
        if rc is not None:
            who = (f"rank {rc.rank}" if rc.rank is not None else
                   "outside the job" if rc.signature in ("outside-stop", "scheduler-stopped") else
                   "torchrun" if rc.source.endswith("torchrun.log") else "rank unknown")
            if rc.signature in WAITED and rc.rank is not None:
                who = f"seen first on rank {rc.rank}, which waited for another"
            out = [f"Root cause: {rc.signature} ({who})", f"  {rc.explanation}",
                   f"  evidence: {rc.source}:{rc.line}: {rc.text[:200]}"]
            if rc.detail.where and rc.signature == "rank-signal":
                out.append(f"  crashed in: {rc.detail.where} (its Python stack, as faulthandler printed it)")
            elif rc.detail.where and rc.signature != "python-exception":  # (an exception's is in its explanation)
                out.append(f"  called from: {rc.detail.where} (the failed collective's stack, as PyTorch's flight "
                           "recorder printed it)")
            for w in rc.detail.explained_by[-2:]:
                out.append(f"  because: {rc.source}:{w.line}: NCCL WARN {w.text[:200]}")
            if rc.suggested_profiles:
                out.append(f"  try: {', '.join('--profile ' + p for p in rc.suggested_profiles)}")
            return out
        if self.lost is not None and (self.lost.peers or self.lost.reported_by):
            return _lost_peer_words(self.lost.to_dict())
        if any(f.level < INFO and not f.detail.recovered for f in self.findings):
            return ["Root cause: none found: only consequences (a lost peer, a stop from outside), so the process "
                    "that failed first left no error in these logs (killed: the OOM killer, the scheduler?)"]
        if any(f.detail.recovered for f in self.findings):
            return ["Root cause: none found (the errors and warnings in these logs were followed by more training "
                    "steps of their rank: the run went on after them)"]
        return ["Root cause: none found (no known failure signature in these logs)"]


def build_report(an: Analyzer, flights: list[dict] | None = None, ras_answers: list[dict] | None = None,
                 stacks: StacksReport | None = None, story: RunStory | None = None) -> DiagnoseReport:
    """The typed report of what the analyzer (and the run's story, its dumps, its RAS answers and Flight
    Recorder dumps) found; the culprits through the one function, culprits_of."""

    rc = an.root_cause()
    counters = collective_counters(an.findings)
    _c, said = counter_verdict(counters)
    seen = an.ranks_seen() | {f.rank for f in an.findings if f.rank is not None}
    found = culprits_of(Evidence(
        failure=True, findings=tuple(an.findings), seen=frozenset(seen), last_steps=an.last_steps,
        when=an.stamped_at,
        ras_answers=tuple(tuple(r.get("culprits") or ()) for r in ras_answers or []),
        flight=tuple(tuple(fr.get("culprits") or ()) for fr in flights or []),
        # (dumps labelled by pid name processes, not ranks: they cannot be the job's culprits)
        stacks=stacks.evidence if stacks is not None and not stacks.dumps.by_pid else None))
    hang = _hang(story, an, rc) if story is not None else None
    root_time = (an.stamped_at.get(rc, an.read_at.get(rc) if story else None) if rc is not None else None)
    root_node = (an.node_of.get(rc) or None) if rc is not None else None
    first = first_failed(an.findings)
    if rc is not None and rc.rank is None and len(first) == 1 and rc.level < CONSEQUENCE:
        # an error whose lines name no rank (a console without rank prefixes), where the launcher's report names
        # the one rank that failed first: that rank's, said so
        r = first.pop()
        rc = dataclasses.replace(rc, rank=r, explanation=f"{rc.explanation} (Its lines name no rank; the "
                                 f"launcher's report says rank {r} failed first.)")
    if rc is not None and story is not None and set(rc.suggested_profiles) & story.applied:
        # (as the live alarm says it: no profile the run already had, or that its shape leaves nothing to change)
        rc = dataclasses.replace(rc, suggested_profiles=tuple(p for p in rc.suggested_profiles if p not in story.applied))
    return DiagnoseReport(
        root=rc, hang=hang, hang_replayed=bool(story and story.stalls and hang is story.stalls[0]), found=found,
        findings=tuple(an.findings), counters=counters, counters_said=said, last_steps=dict(an.last_steps),
        job_step=an.job_step, lost=lost_peers(an.findings) if rc is None and an.findings else None,
        flights=tuple(flights or ()), ras=tuple(ras_answers or ()), notes=tuple(n.message for n in an.notes),
        stacks=stacks, story=story, ended=_ended_by(an, story),
        root_time=root_time, root_node=root_node)


def report(an: Analyzer, flights: list[dict] | None = None, ras_answers: list[dict] | None = None,
           stacks: StacksReport | None = None, story: RunStory | None = None) -> dict:
    """``build_report(...)`` as the JSON ``--json`` prints."""
    return build_report(an, flights, ras_answers, stacks, story).to_dict()


def _alarm_dict(a: AlarmEvent) -> dict:
    return {"t": a.t, "time": _iso(a.t), "id": a.id, "culprits": list(a.culprits), "node": a.node,
            "message": a.message}


def format_report(rep: DiagnoseReport) -> str:
    return "\n".join(rep.lines())


def _lost_peer_words(lp: dict) -> list[str]:
    """Logs with only consequences: say where the cause is and what to collect next."""
    who = (f"rank {lp['reported_by'][0]}" if len(lp["reported_by"]) == 1 else
           f"ranks {', '.join(map(str, lp['reported_by']))}" if lp["reported_by"] else "a process")
    whom = ", ".join([f"rank {r}" for r in lp["ranks"]] + lp["peers"]) or "a peer"
    out = [f"Root cause: not in these logs: only consequences. {who[0].upper() + who[1:]} lost {whom} "
           f"({', '.join(lp['signatures'])}).",
           "  The failure is on the other side or in the network. Next: that process's own log (the rank at "
           f"{whom}: its --log-dir file or node's output), the kernel log on its node (`dmesg -T`: the OOM killer, "
           "an Xid, a NIC down), and, if every process lived, the network between the nodes (nccl-debug, `ibstat`)."]
    return out


def main(paths: list[str], json_mode: bool) -> int:
    runs = [p for p in paths if journal.is_run(Path(p))]
    timed = run_story.timed_events(runs[0]) if len(runs) == 1 else None  # (read once: the analysis and the story)
    an = analyze_paths(paths, {str(Path(runs[0])): timed[0]} if timed is not None else None)
    st = stacks_report(paths, gpu_job=an.nccl_version is not None)
    story = run_story.story(runs[0], timed) if timed is not None else None
    rep = build_report(an, flight_reports(paths), ras_reports(paths), st, story)
    print(json.dumps(rep.to_dict(), indent=2) if json_mode else format_report(rep))
    return 1 if rep.root is not None or rep.hang is not None or (st is not None and st.evidence.hung) else 0
