"""PyTorch flight-recorder dumps: read them, say which rank diverged.

Each rank's flight recorder keeps its last collectives (sequence number per
process group, op, sizes, state).  Dumps land in ``RUN/flight/rank_<N>``: NCCL's
watchdog writes them on a timeout (``TORCH_FR_DUMP_ON_TIMEOUT``), and ddptop's
hook writes them when the supervisor asks at a stall (this works for gloo too).

``analyse`` compares the ranks' last collectives per process group: a rank
behind the others never entered the collective they wait in (the odd rank out
of a hang); ranks at the same sequence number with different ops or sizes ran
different code (a collective mismatch).  torch's own ``torchfrtrace`` is run
too when installed (``run_torchfrtrace``); its output is kept next to the dumps.

Dumps are pickles written by torch: they are read with an unpickler that
refuses every class, so only plain data (dicts, lists, strings, numbers) loads.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "rank_"
# what reading a damaged or foreign dump raises: the file, its JSON, or the unpickler on bytes that are not a
# pickle of plain data (truncated: EOFError; garbage opcodes: UnpicklingError, or the others the pickle docs name)
DUMP_ERRORS = (OSError, ValueError, EOFError, pickle.UnpicklingError, TypeError, KeyError, IndexError,
               OverflowError, RecursionError)


class _PlainData(pickle.Unpickler):
    def find_class(self, module, name):  # noqa: D401 - plain data only
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a flight-recorder dump")


def load_dump(path: Path) -> dict:
    """One rank's dump (torch's pickle, or the JSON form)."""
    data = Path(path).read_bytes()
    if data[:1] in (b"{", b"["):
        d = json.loads(data)
    else:
        d = _PlainData(io.BytesIO(data)).load()
    if not isinstance(d, dict) or not isinstance(d.get("entries", []), list):
        raise ValueError("not a flight-recorder dump (no entries list)")
    return d


def load_dir(d: Path) -> tuple[dict[int, dict], list[str]]:
    """{rank: dump} for every ``rank_<N>`` file in ``d``, and the problems met."""
    dumps: dict[int, dict] = {}
    problems = []
    try:
        names = sorted(os.listdir(d))
    except OSError as e:
        return {}, [f"{d}: {e.strerror or e}"]
    for name in names:
        m = re.fullmatch(PREFIX + r"(\d+)", name)
        if not m:
            continue
        try:
            dumps[int(m.group(1))] = load_dump(Path(d) / name)
        except DUMP_ERRORS as e:
            problems.append(f"{name}: unreadable ({type(e).__name__}: {e})")
    return dumps, problems


@dataclass
class Last:
    """A rank's last collective on one process group."""

    seq: int
    op: str
    sizes: str
    state: str


@dataclass
class FlightReport:
    ranks: list[int]
    culprits: list[int] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return "; ".join(self.findings)


def _pg_key(e: dict) -> str:
    """A process group as a person knows it: its name and description (torch 2.11 writes ("0", "") for the
    default group: then its name alone).  One with no name (on an H100, the gloo helper group of
    TORCH_DISTRIBUTED_DEBUG=DETAIL, whose pg_id 0 is the default group's too) is said as unnamed."""
    pg = e.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        name = str(pg[0])
        desc = str(pg[1]) if len(pg) > 1 and pg[1] else ""
        if not name:
            return f"(unnamed{', ' + desc if desc else ''}, id {e.get('pg_id', '?')})"
        return f"{name} ({desc})" if desc and desc != name else name
    return str(e.get("pg_id", "?"))


def last_collectives(dump: dict) -> dict[str, Last]:
    out: dict[str, Last] = {}
    for e in dump.get("entries", []):
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        seq = e.get("collective_seq_id")
        if not isinstance(seq, int):
            continue
        key = _pg_key(e)
        if key not in out or seq >= out[key].seq:
            out[key] = Last(seq, str(e.get("profiling_name", "?")), json.dumps(e.get("input_sizes")),
                            str(e.get("state", "?")))
    return out


def _who(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def analyse(dumps: dict[int, dict], expected: list[int] | None = None) -> FlightReport:
    """What the ranks' last collectives say (see the module doc)."""
    rep = FlightReport(sorted(dumps))
    missing = sorted(set(expected or []) - set(dumps))
    if missing:
        rep.findings.append(f"no dump from {_who(missing)} (it did not answer: dead, or stuck outside Python)")
        rep.culprits += missing
    if not dumps:
        return rep
    lasts = {r: last_collectives(d) for r, d in dumps.items()}
    pgs = sorted({pg for l in lasts.values() for pg in l})
    if not pgs:
        rep.findings.append("no collective recorded yet on any rank")
        return rep
    agree = []
    for pg in pgs:
        per = {r: l[pg] for r, l in lasts.items() if pg in l}
        top = max(x.seq for x in per.values())
        behind = sorted(r for r, x in per.items() if x.seq < top)
        absent = sorted(r for r in lasts if pg not in lasts[r])
        if behind or absent:
            ahead = sorted(r for r, x in per.items() if x.seq == top)
            ex = per[ahead[0]]
            parts = []
            for r in behind:
                x = per[r]
                parts.append(f"rank {r} stopped at #{x.seq} ({x.op} {x.sizes}, {x.state})")
            for r in absent:
                parts.append(f"rank {r} never used it")
            rep.findings.append(
                f"process group {pg}: {_who(ahead)} {'is' if len(ahead) == 1 else 'are'} in collective #{top} "
                f"({ex.op} {ex.sizes}); "
                + "; ".join(parts) + f": {_who(behind + absent)} never joined")
            rep.culprits += [r for r in behind + absent if r not in rep.culprits]
            continue
        kinds = {(x.op, x.sizes) for x in per.values()}
        if len(kinds) > 1:
            groups: dict[tuple, list[int]] = {}
            for r, x in per.items():
                groups.setdefault((x.op, x.sizes), []).append(r)
            main = max(groups.values(), key=len)
            odd = sorted(r for rs in groups.values() if rs is not main for r in rs)
            rep.findings.append(
                f"process group {pg}: collective #{top} differs between ranks: "
                + "; ".join(f"{_who(rs)} {op} {sz}" for (op, sz), rs in sorted(groups.items(), key=lambda g: g[1]))
                + " (the ranks ran different code, or a DDP parameter mismatch)")
            rep.culprits += [r for r in odd if r not in rep.culprits]
        else:
            x = next(iter(per.values()))
            agree.append(f"process group {pg} at #{top} ({x.op}, {x.state})")
    if agree and not rep.culprits:
        rep.findings.append("every rank is at the same collective: " + ", ".join(agree)
                            + "; not a collective mismatch (compare the ranks' stacks)")
    return rep


TORCHFRTRACE_TIMEOUT = 60.0  # seconds torch's analyser may take


def run_torchfrtrace(d: Path, timeout: float = TORCHFRTRACE_TIMEOUT) -> tuple[Path | None, str]:
    """Run torch's analyser on the dumps; (path of its output or None, a one-line summary)."""
    exe = shutil.which("torchfrtrace")
    argv = [exe] if exe else [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]
    path = Path(d) / "torchfrtrace.txt"
    out_path: Path | None = path
    try:
        r = subprocess.run([*argv, str(d), "-p", PREFIX], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"torchfrtrace did not finish in {timeout:g} s"
    except OSError as e:
        return None, f"torchfrtrace could not run: {e}"
    text = (r.stdout or "") + (("\n" + r.stderr) if r.stderr else "")
    try:
        path.write_text(text)
    except OSError:
        out_path = None
    lines = [l for l in text.splitlines() if l.strip() and "tabulate" not in l]
    if r.returncode != 0:
        if "No module named" in text and "flight_recorder" in text:
            return out_path, "torchfrtrace is not available in this torch"
        return out_path, f"torchfrtrace failed (exit {r.returncode}): {lines[-1][:200] if lines else 'no output'}"
    return out_path, f"torchfrtrace: {lines[0][:200]}" if lines else "torchfrtrace: no findings"
