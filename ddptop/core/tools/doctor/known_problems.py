"""The known-problems database: driver, NCCL and GPU combinations with a
published bug behind them (``ddptop/data/known_problems.toml``, shipped in the
wheel), its loader and validator (:func:`load_known_problems`), the match of one
entry against this machine's facts (:func:`match_problem`: true, false, or
unknown when a fact is missing) and the row that lists the matches, and the
ones already worked around by the environment (:func:`check_known_problems`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

import ddptop
from ddptop.core.model.gpu_facts import Topology
from ddptop.core.tools.doctor.report import OK, SKIPPED, WARN, Row
from ddptop.core.tools.doctor.versions import version_cmp, version_tuple

# ddptop/data/known_problems.toml: this file is ddptop/core/doctor/known_problems.py
KNOWN_PROBLEMS = Path(ddptop.__file__).resolve().parent / "data" / "known_problems.toml"


@dataclass(frozen=True)
class KnownProblem:
    id: str
    symptom: str
    fix: str
    source: str
    driver: str | None = None
    driver_min: str | None = None
    driver_max: str | None = None
    nccl_min: str | None = None
    nccl_max: str | None = None
    gpu_name: str | None = None
    min_gpus: int = 0
    workaround_env: dict = field(default_factory=dict)
    see_also: tuple[str, ...] = ()

    def needs(self) -> set[str]:
        return {k for k in ("driver", "nccl", "gpus") if
                (k == "driver" and (self.driver or self.driver_min or self.driver_max))
                or (k == "nccl" and (self.nccl_min or self.nccl_max))
                or (k == "gpus" and (self.gpu_name or self.min_gpus))}


class KnownProblemsError(ValueError):
    pass


_KP_KEYS = {"id", "symptom", "fix", "source", "driver", "driver_min", "driver_max", "nccl_min", "nccl_max",
            "gpu_name", "min_gpus", "workaround_env", "see_also"}


def load_known_problems(path: Path = KNOWN_PROBLEMS) -> list[KnownProblem]:
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise KnownProblemsError(f"{path}: {e}") from None
    out = []
    for i, e in enumerate(doc.get("problem", [])):
        where = f"{path}: problem #{i + 1} ({e.get('id', 'no id')})"
        unknown = set(e) - _KP_KEYS
        if unknown:
            raise KnownProblemsError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        for k in ("id", "symptom", "fix", "source"):
            if not isinstance(e.get(k), str) or not e[k].strip():
                raise KnownProblemsError(f"{where}: `{k}` is required")
        if not e["source"].startswith("https://"):
            raise KnownProblemsError(f"{where}: `source` must be a public https URL")
        if not ({"driver", "driver_min", "driver_max", "nccl_min", "nccl_max", "gpu_name"} & set(e)):
            raise KnownProblemsError(f"{where}: matches nothing (give driver, nccl_min/max or gpu_name)")
        if e.get("gpu_name"):
            try:
                re.compile(e["gpu_name"])
            except re.error as err:
                raise KnownProblemsError(f"{where}: gpu_name: {err}") from None
        kw = dict(e)
        kw["see_also"] = tuple(kw.get("see_also", ()))
        out.append(KnownProblem(**kw))
    ids = [p.id for p in out]
    if len(ids) != len(set(ids)):
        raise KnownProblemsError(f"{path}: duplicate ids")
    return out


def _in_range(v: str | None, lo: str | None, hi: str | None) -> bool | None:
    """None when the version is unknown."""
    t = version_tuple(v)
    if not t:
        return None
    if lo and version_cmp(t, version_tuple(lo) or ()) < 0:
        return False
    if hi and version_cmp(t, version_tuple(hi) or ()) >= 0:
        return False
    return True


def match_problem(p: KnownProblem, driver: str | None, nccl: str | None, gpu_names: list[str] | None) -> bool | None:
    """True / False, or None when a fact it needs is unknown."""
    if p.driver is not None or p.driver_min or p.driver_max:
        if driver is None:
            return None
        if p.driver is not None and driver.strip() != p.driver:
            return False
        if (p.driver_min or p.driver_max) and not _in_range(driver, p.driver_min, p.driver_max):
            return False
    if p.nccl_min or p.nccl_max:
        r = _in_range(nccl, p.nccl_min, p.nccl_max)
        if r is None:
            return None
        if not r:
            return False
    if p.gpu_name or p.min_gpus:
        if gpu_names is None:
            return None
        if len(gpu_names) < p.min_gpus:
            return False
        if p.gpu_name and not any(re.search(p.gpu_name, n, re.I) for n in gpu_names):
            return False
    return True


def check_known_problems(problems: list[KnownProblem], topo: Topology | None, error: str | None, nccl: str | None,
                         env: dict[str, str]) -> Row:
    driver = topo.driver if topo else None
    names = [g.name for g in topo.gpus] if topo else None
    facts = f"driver {driver or '?'}, NCCL {nccl or '?'}, {len(names) if names is not None else '?'} GPU(s)"
    hits, unknown, worked = [], 0, []
    for p in problems:
        m = match_problem(p, driver, nccl, names)
        if m is None:
            unknown += 1
        elif m:
            wa = {k: v for k, v in p.workaround_env.items() if env.get(k) == str(v)}
            (worked if wa and wa == {k: str(v) for k, v in p.workaround_env.items()} else hits).append(p)
    data = {"matched": [p.id for p in hits], "worked_around": [p.id for p in worked], "entries": len(problems),
            "not_checkable": unknown}
    ev = []
    for p in hits + worked:
        ev.append(f"{p.id}: {p.symptom}")
        ev.append(f"  source: {p.source}" + (f" (see also {', '.join(p.see_also)})" if p.see_also else ""))
        if p in worked:
            ev.append("  worked around here: " + ", ".join(f"{k}={v}" for k, v in p.workaround_env.items()) + " is set")
    if unknown:
        ev.append(f"{unknown} of {len(problems)} entries need facts this machine cannot give ({facts})")
    if hits:
        return Row("Known problems", WARN, f"{len(hits)} known problem(s) match: {', '.join(p.id for p in hits)}", ev,
                   "; ".join(f"{p.id}: {p.fix}" for p in hits), data)
    if unknown == len(problems):
        why = error or "no GPU facts"
        return Row("Known problems", SKIPPED, f"nothing to match: {why}, NCCL version unknown" if not nccl else
                   f"nothing to match: {why}", ev, "", data)
    summ = f"none of {len(problems)} entries match ({facts})"
    if worked:
        summ = f"{len(worked)} match but are worked around ({', '.join(p.id for p in worked)})"
    return Row("Known problems", OK, summ, ev, "", data)
