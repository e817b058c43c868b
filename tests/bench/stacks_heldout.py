"""Score `ddptop diagnose` on the held-out stack dumps of hung ranks: a measurement, not a test.

    python tests/bench/stacks_heldout.py [--verbose] [--data DIR] [--jobs N] [CASE ...]

For every case of DIR/expected.json (default: tests/data/heldout/stacks next to
this script; an object keyed by case slug), runs
`python -m ddptop diagnose --json PATH` and `python -m ddptop diagnose PATH`
with this interpreter (PATH = DIR / the case's "path"), in the current
directory and environment (so `PYTHONPATH=/some/checkout` scores that
checkout's code), and checks the expectations against rep["stacks"]:

  hung                rep["stacks"]["hung"] == expected (true, false or null)
  culprits            sorted(rep["stacks"]["culprits"]) == sorted(expected)
  ranks[R]            rep["stacks"]["ranks"][R]["kind"] == expected kind, per R
  deadlock_in_driver  when true: the text report contains "deadlock"
  text_contains       each lowercase substring is in the lowercased text report

A case is right when every check passes. Prints one line per case (never the
dump text nor the report text; --verbose adds the failed checks and the values
got), then per-class scores and the total. A report without a "stacks" object
fails its checks rather than crashing the scorer. Always exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[1] / "data" / "heldout" / "stacks"
TIMEOUT = 60


def run(args: list[str]) -> tuple[int | None, str, str]:
    try:
        p = subprocess.run([sys.executable, "-m", "ddptop", "diagnose", *args],
                           capture_output=True, text=True, timeout=TIMEOUT)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out, f"timed out after {TIMEOUT} s"
    except OSError as e:
        return None, "", f"could not run: {e}"


def _sorted(v):
    try:
        return sorted(v)
    except TypeError:
        return v


def check_case(name: str, case: dict, data: Path) -> dict:
    path = str(data / case["path"])
    rc_j, out_j, err_j = run(["--json", "--", path])
    rc_t, out_t, err_t = run(["--", path])
    error = ""
    rep = None
    try:
        rep = json.loads(out_j)
        if not isinstance(rep, dict):
            raise ValueError("not an object")
    except ValueError as e:
        error = f"--json gave no JSON (exit {rc_j}): {e}; stderr: {err_j.strip()[-200:]}"
        rep = None
    if rc_t is None or (not out_t.strip() and err_t.strip()):
        error += f" text report failed (exit {rc_t}): {err_t.strip()[-200:]}"
    text = out_t.lower()

    checks: list[tuple[str, bool, str]] = []

    def add(check: str, ok: bool, got) -> None:
        checks.append((check, ok, "" if ok else f"got {got!r}"))

    st = rep.get("stacks") if isinstance(rep, dict) else None
    if not isinstance(st, dict):
        why = "no report" if rep is None else "no 'stacks' object"
        st = None

    # hung
    if st is None:
        add("hung", False, why)
    else:
        got = st.get("hung", "<missing>")
        add("hung", got is case["hung"] if isinstance(case["hung"], bool) or case["hung"] is None
            else got == case["hung"], got)

    # culprits
    if "culprits" in case:
        if st is None:
            add("culprits", False, why)
        else:
            got = st.get("culprits", "<missing>")
            add("culprits", isinstance(got, list) and _sorted(got) == sorted(case["culprits"]), got)

    # ranks[R].kind
    for r, kind in sorted((case.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
        label = f"ranks[{r}]"
        if st is None:
            add(label, False, why)
            continue
        ranks = st.get("ranks")
        entry = ranks.get(str(r)) if isinstance(ranks, dict) else None
        got = entry.get("kind") if isinstance(entry, dict) else None
        add(label, got == kind, got if isinstance(ranks, dict) else "no 'ranks' object")

    # deadlock_in_driver => "deadlock" in the text report
    if case.get("deadlock_in_driver"):
        add("deadlock_in_driver", "deadlock" in text, "no 'deadlock' in the text report")

    # text_contains
    if case.get("text_contains"):
        missing = [s for s in case["text_contains"] if s.lower() not in text]
        add("text_contains", not missing, f"missing {missing}")

    return {"name": name, "case": case, "checks": checks, "error": error.strip()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="directory holding expected.json and cases/")
    ap.add_argument("--verbose", "-v", action="store_true", help="print the failed checks and the values got")
    ap.add_argument("--jobs", "-j", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("cases", nargs="*", help="only these case slugs")
    a = ap.parse_args()
    data = a.data.resolve()
    try:
        cases = json.loads((data / "expected.json").read_text())
    except (OSError, ValueError) as e:
        print(f"cannot read {data / 'expected.json'}: {e}")
        return 0
    if a.cases:
        unknown = [c for c in a.cases if c not in cases]
        if unknown:
            print(f"unknown cases (ignored): {', '.join(unknown)}")
        cases = {k: v for k, v in cases.items() if k in a.cases}
    where = subprocess.run([sys.executable, "-c", "import ddptop; print(ddptop.__file__)"],
                           capture_output=True, text=True).stdout.strip()
    print(f"ddptop under test: {where or '(not importable)'}")
    print(f"data: {data} ({len(cases)} cases)")
    print()
    with ThreadPoolExecutor(max(1, a.jobs)) as ex:
        results = list(ex.map(lambda kv: check_case(kv[0], kv[1], data), cases.items()))

    per_class: dict[str, list[int]] = {}
    full = n_ok = n_checks = 0
    for res in results:
        c = res["case"]
        passed = sum(ok for _, ok, _ in res["checks"])
        total = len(res["checks"])
        ok_all = passed == total and not res["error"]
        n_ok += passed
        n_checks += total
        full += ok_all
        s = per_class.setdefault(str(c.get("class")), [0, 0, 0, 0])
        s[0] += ok_all
        s[1] += 1
        s[2] += passed
        s[3] += total
        print(f"{'RIGHT' if ok_all else 'WRONG'}  {res['name']:<40} [{c.get('class')}] {passed}/{total} checks")
        if a.verbose:
            for check, ok, got in res["checks"]:
                if not ok:
                    print(f"      - {check}: want {_want(c, check)!r}, {got}")
            if res["error"]:
                print(f"      ! {res['error']}")

    print()
    print("per class:")
    for k in sorted(per_class, key=lambda k: (k == "control", k)):
        s = per_class[k]
        print(f"  {k:<20} {s[0]}/{s[1]} cases right, {s[2]}/{s[3]} checks")
    pct = 100.0 * full / len(results) if results else 0.0
    print()
    print(f"total: {full}/{len(results)} cases right ({pct:.0f}%), {n_ok}/{n_checks} checks passed")
    return 0


def _want(case: dict, check: str):
    if check.startswith("ranks["):
        return (case.get("ranks") or {}).get(check[6:-1])
    if check == "deadlock_in_driver":
        return True
    return case.get(check)


if __name__ == "__main__":
    sys.exit(main())
