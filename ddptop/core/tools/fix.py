"""`ddptop fix torchrun ...`: find the profile that gets a job going.

Runs short smoke attempts of the same command -- first as given, then under
candidate profiles ordered by what went wrong (the alarm's and the root
cause's suggestions first), then scaled down (2 ranks, then 1) -- each until it
makes K steps of progress, fails, stalls, or runs out of time.  Stops at the
first that makes progress and says exactly what to use from now on.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ddptop.core.analysis.job_state import JobState
from ddptop.core.model import run_dirs
from ddptop.core.model.events import AlarmEvent
from ddptop.core.run import journal
from ddptop.core.run.launcher import LaunchError, parse_torchrun_args
from ddptop.core.run.profiles import Profile, load_all, mask_argv
from ddptop.core.run.run_session import Session

FALLBACK_ORDER = ["p2p-off", "shm-off", "ib-off", "gloo", "fewer-workers"]


@dataclass
class Attempt:
    label: str
    profiles: list[str]
    outcome: str = ""  # progress | stalled | failed | timeout | error
    steps_per_s: float | None = None
    first_step_s: float | None = None
    detail: str = ""
    run_dir: str = ""
    suggestions: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return dict(self.__dict__, suggestions=list(self.suggestions))


def smoke(cmd: list[str], profiles: list[Profile], run_dir: Path, *, steps: int, time_limit: float,
          gpu: str, stall_after: float | None) -> Attempt:
    a = Attempt("+".join(p.name for p in profiles) or "as given", [p.name for p in profiles], run_dir=str(run_dir))
    t0 = time.time()
    try:
        s = Session.launch(cmd, run_dir, gpu=gpu, on_stall="kill", stall_after=stall_after, profiles=profiles)
    except (LaunchError, run_dirs.JournalError, OSError) as e:  # nothing was started: this attempt's outcome
        a.outcome, a.detail = "error", str(e)
        return a
    model = JobState()
    first: dict[int, tuple[float, int]] = {}
    alarms: list[AlarmEvent] = []
    stopped = False
    while not s.finished:
        batch = s.poll()
        model.apply(batch)
        alarms += [e for e in batch if isinstance(e, AlarmEvent)]
        for r, info in model.ranks.items():
            if info.last_step is not None and r not in first:
                first[r] = (info.last_step_t or time.time(), info.last_step)
        done = [r for r, info in model.ranks.items()
                if r in first and info.last_step is not None and info.last_step - first[r][1] >= steps]
        if not stopped and model.ranks and first and len(done) == len(model.ranks):
            a.outcome = "progress"
            stopped = s.stop()
        elif not stopped and time.time() - t0 > time_limit:
            a.outcome = "timeout"
            stopped = s.stop()
        if not batch:
            time.sleep(0.2)
    if first:
        a.first_step_s = round(min(t for t, _ in first.values()) - t0, 1)
        rates = []
        for r, (t, st) in first.items():
            info = model.ranks[r]
            if info.last_step_t and info.last_step_t > t and info.last_step > st:
                rates.append((info.last_step - st) / (info.last_step_t - t))
        a.steps_per_s = round(min(rates), 2) if rates else None
    stall = next((x for x in alarms if x.type == "stall"), None)
    if not a.outcome:
        if stall is not None:
            a.outcome = "stalled"
        elif model.exit_code == 0:
            a.outcome = "progress"  # finished cleanly before K steps: that works too
        else:
            a.outcome = "failed"
    cause = stall or next((x for x in alarms if x.culprits), None) or (alarms[0] if alarms else None)
    if cause is not None and a.outcome != "progress":
        a.detail = f"{cause.id}" + (f" (culprit rank {', '.join(map(str, cause.culprits))})" if cause.culprits else "")
        a.suggestions = tuple(p for x in [cause] + alarms for p in x.suggested_profiles)
    elif a.outcome == "failed":
        a.detail = f"exit code {model.exit_code}"
    return a


def _nproc(cmd: list[str]) -> int | None:

    try:
        v = parse_torchrun_args(cmd[1:]).values.get("--nproc-per-node")
        return int(v) if v else None
    except (LaunchError, ValueError):  # not a torchrun command line, or "--nproc-per-node gpu"
        return None


def search(cmd: list[str], base: list[Profile], *, steps: int = 20, time_limit: float = 180.0, gpu: str = "auto",
           stall_after: float | None = None, out=sys.stderr, root: Path | None = None) -> tuple[list[Attempt], Attempt | None]:
    known = load_all()
    root = root or journal.create_run_dir(None)
    attempts: list[Attempt] = []
    tried: set[tuple[str, ...]] = set()

    def run(extra: list[Profile]) -> Attempt:
        profs = base + extra
        key = tuple(p.name for p in profs)
        tried.add(key)
        d = root / f"attempt{len(attempts)}"
        print(f"ddptop fix: trying {'+'.join(key) or 'the command as given'} ...", file=out, flush=True)
        a = smoke(cmd, profs, d, steps=steps, time_limit=time_limit, gpu=gpu, stall_after=stall_after)
        attempts.append(a)
        print(f"ddptop fix:   {a.outcome}" + (f" ({a.detail})" if a.detail else ""), file=out, flush=True)
        return a

    a = run([])
    if a.outcome == "progress":
        return attempts, a
    order = [p for p in list(a.suggestions) + FALLBACK_ORDER if p in known and p not in ("default",)]
    seen = set()
    for name in order:
        if name in seen or name in [p.name for p in base]:
            continue
        seen.add(name)
        if a.outcome == "progress":
            break
        a = run([known[name]])
        if a.outcome == "progress":
            return attempts, a
    n = _nproc(cmd)
    for k in (2, 1):
        if n is not None and k >= n:
            continue
        scale = Profile(f"nproc-{k}", f"--nproc-per-node {k}", torchrun_args={"--nproc-per-node": str(k)})
        a = run([scale])
        if a.outcome == "progress":
            return attempts, a
    return attempts, None


def format_table(attempts: list[Attempt]) -> str:
    rows = [("profile", "outcome", "steps/s", "first step", "detail")]
    for a in attempts:
        rows.append((a.label, a.outcome, "-" if a.steps_per_s is None else f"{a.steps_per_s:g}",
                     "-" if a.first_step_s is None else f"{a.first_step_s:g} s", a.detail))
    w = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(f"{c:<{w[i]}}" for i, c in enumerate(r)).rstrip() for r in rows)


def recommendation(cmd: list[str], winner: Attempt | None, known: dict[str, Profile]) -> str:
    if winner is None:
        return "No profile made the job progress. Look at the runs above with `ddptop diagnose RUN_DIR`."
    if not winner.profiles:
        return "The command works as it is."

    cmd = mask_argv(cmd)  # printed: secret-named options' values masked
    env = {}
    for name in winner.profiles:
        p = known.get(name)
        if p is not None:
            env.update(p.env)
    lines = [f"Use from now on:  ddptop {' '.join('--profile ' + p for p in winner.profiles)} {shlex.join(cmd)}"]
    if env and all(known.get(n) and not (known[n].torchrun_args or known[n].script_args or known[n].backend or known[n].pg_timeout)
                   for n in winner.profiles):
        lines.append(f"or without ddptop:  {' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())} {shlex.join(cmd)}")
    return "\n".join(lines)


def main(cmd: list[str], base: list[Profile], *, json_mode: bool, **kw) -> int:
    attempts, winner = search(cmd, base, **kw)
    known = load_all()
    if json_mode:
        print(json.dumps({"attempts": [a.to_dict() for a in attempts],
                          "winner": winner.to_dict() if winner else None,
                          "recommendation": recommendation(cmd, winner, known)}, indent=2))
    else:
        print(format_table(attempts))
        print()
        print(recommendation(cmd, winner, known))
    return 0 if winner else 1
