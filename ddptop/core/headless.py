"""Headless front end: merged, rank-prefixed text, or one JSON object a line."""

from __future__ import annotations

import signal
import sys
import time
from typing import TextIO

from ddptop.core.events import (AlarmEvent, Event, GpuEvent, GpuStatusEvent, LogEvent, NoteEvent,
                                ProcEvent, RankEvent, StateEvent)
from ddptop.core.session import Session


def format_text(ev: Event) -> str | None:
    if isinstance(ev, LogEvent):
        if ev.transient:
            return None  # progress bars: the completed line follows
        prefix = "[torchrun]" if ev.rank is None else f"[r{ev.rank}]"
        if ev.stream == "stderr":
            prefix = prefix[:-1] + "!]"
        return f"{prefix} {ev.text}"
    if isinstance(ev, StateEvent):
        s = f"== ddptop: job {ev.state}"
        if ev.exit_code is not None:
            s += f", exit code {ev.exit_code}"
        if ev.message:
            s += f" ({ev.message})"
        return s + " =="
    if isinstance(ev, RankEvent):
        if ev.alive:
            what = "started"
        elif ev.exit_code is None:
            what = "ended"
        else:
            what = f"exited with code {ev.exit_code}"
            if ev.exit_code < 0:
                try:
                    what += f" ({signal.Signals(-ev.exit_code).name})"
                except ValueError:
                    pass
        return f"== ddptop: rank {ev.rank} (local {ev.local_rank}, pid {ev.pid}, attempt {ev.attempt}) {what} =="
    if isinstance(ev, (GpuEvent, ProcEvent)):
        return None  # telemetry every second: in --json output and the journal only
    if ev.kind == "launch":
        if ev.generation == 0:
            return None
        return (f"== ddptop: relaunch #{ev.generation} with profiles {', '.join(ev.profiles) or 'default'}"
                f" ({ev.reason}); env changes: {ev.env_diff} ==")
    if ev.kind == "progress":
        return None
    if isinstance(ev, GpuStatusEvent):
        if ev.fault:  # a driver that is there but broken is a problem, not "no GPU"
            return f"!! ddptop: GPUs not monitored, {ev.message}: {ev.fault}"
        return f"== ddptop: GPUs ({ev.backend}): {ev.message} =="
    if isinstance(ev, AlarmEvent):
        return f"!! ddptop ALARM [{ev.type}/{ev.id}] {ev.message}"
    if isinstance(ev, NoteEvent):
        return f"== ddptop {ev.level}: {ev.message} =="
    return f"== ddptop: {ev.to_json()} =="


def run_headless(session: Session, *, json_mode: bool, out: TextIO | None = None,
                 stop_on_signal: bool = True, interval: float = 0.1) -> int:
    """Print the session's events until the job ends; return its exit code.

    SIGINT/SIGTERM stop the whole job (as they would stop torchrun), and
    ddptop keeps printing until the job has really ended.  A session that
    refuses to stop its job (``control_refused``: a job ddptop did not start)
    is detached from instead: the job keeps running, the return value is 130.
    """
    out = out or sys.stdout
    stops = 0

    def on_signal(signum, frame):
        nonlocal stops
        stops += 1
        if stops == 1:
            refused = getattr(session, "control_refused", None)
            if not session.stop() and refused:
                print(f"== ddptop: {refused}. Detaching: the job keeps running ==", file=sys.stderr, flush=True)
                raise KeyboardInterrupt
            line = ("== ddptop: stopping the job (signal %d); again to stop waiting ==" % signum)
            if not json_mode:
                print(line, file=sys.stderr, flush=True)
        else:
            raise KeyboardInterrupt

    if stop_on_signal:
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
    write = out.write
    try:
        while not session.finished:
            batch = session.poll()
            if not batch:
                time.sleep(interval)
                continue
            if json_mode:
                write("".join(ev.to_json() + "\n" for ev in batch))
            else:
                lines = [s for s in map(format_text, batch) if s is not None]
                if lines:
                    write("\n".join(lines) + "\n")
            out.flush()
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # reader went away (e.g. `| head`): keep the job, stop printing
        return 141
    code = session.exit_code
    if code is None and getattr(session, "attach_exit_code", None) is not None:
        return session.attach_exit_code  # a job ddptop did not launch: 1 crash seen, 3 unknown
    return 1 if code is None else code
