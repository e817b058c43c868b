"""The doctor's report: a :class:`Row` per check (name, status, one-line
summary, evidence, advice and machine-readable data), the four statuses, the
exit code the rows map to (0 ok or skipped, 1 a warning, 2 a failure), the
counts per status, and the two ways a list of rows is shown: the aligned text
table of ``ddptop doctor`` and the JSON of ``ddptop doctor --json``.  Every
check module builds its rows from here; nothing here reads the machine.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Iterable

OK, WARN, FAIL, SKIPPED = "ok", "warn", "fail", "skipped"


@dataclass
class Row:
    name: str
    status: str  # ok | warn | fail | skipped
    summary: str  # one line
    evidence: list[str] = field(default_factory=list)  # what was read, with numbers
    advice: str = ""  # what to do ("" when nothing)
    data: dict = field(default_factory=dict)  # machine-readable details for --json

    def to_dict(self) -> dict:
        return asdict(self)


def exit_code(rows: Iterable[Row]) -> int:
    st = {r.status for r in rows}
    return 2 if FAIL in st else 1 if WARN in st else 0


def summary(rows: list[Row]) -> dict:
    out = {s: sum(r.status == s for r in rows) for s in (OK, WARN, FAIL, SKIPPED)}
    out["exit_code"] = exit_code(rows)
    return out


def format_rows(rows: list[Row]) -> str:
    w = max(len(r.name) for r in rows)
    lines = [f"{'STATUS':<8} {'CHECK':<{w}}  SUMMARY"]
    for r in rows:
        lines.append(f"{r.status:<8} {r.name:<{w}}  {r.summary}")
        pad = " " * 11
        lines += [pad + e for e in r.evidence]
        if r.advice:
            lines.append(pad + "-> " + r.advice)
    s = summary(rows)
    lines.append(f"\n{s['ok']} ok, {s['warn']} warn, {s['fail']} fail, {s['skipped']} skipped (exit {s['exit_code']})")
    return "\n".join(lines)


def to_json(rows: list[Row]) -> str:
    return json.dumps({"rows": [r.to_dict() for r in rows], "summary": summary(rows)}, indent=2)
