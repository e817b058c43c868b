"""Headless front end: merged, rank-prefixed text, or one JSON object a line."""

from __future__ import annotations

import signal
import sys
import time
from typing import TextIO

from ddptop.core.events import (AlarmEvent, Event, GpuEvent, GpuStatusEvent, LaunchEvent, LinkEvent, LogEvent, NoteEvent,
                                ProcEvent, RankEvent, StacksEvent, StateEvent)
from ddptop.core.jobs import JobSession


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
    if isinstance(ev, LaunchEvent):
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
    if isinstance(ev, StacksEvent):
        if ev.error and not ev.samples:
            return f"== ddptop: no stack samples: {ev.error} =="
        verdict = {True: "frozen", False: "moving (work)", None: "unclear"}[ev.hung]
        return (f"== ddptop: stacks of {len(ev.ranks)} ranks, {ev.samples} samples over {ev.span:.1f} s: {verdict}"
                + (f"; {ev.summary}" if ev.summary else "") + (f" ({ev.dir})" if ev.dir else "") + " ==")
    if isinstance(ev, NoteEvent):
        return f"== ddptop {ev.level}: {ev.message} =="
    if isinstance(ev, LinkEvent):
        s = f"== ddptop: link to {ev.node} {ev.state}"
        if ev.message:
            s += f": {ev.message}"
        if ev.retry_in is not None:
            s += f" (retrying in {ev.retry_in:g} s)"
        return s + " =="
    return f"== ddptop: {ev.to_json()} =="


def run_headless(session: JobSession, *, json_mode: bool, out: TextIO | None = None,
                 stop_on_signal: bool = True, interval: float = 0.1) -> int:
    """Print the session's events until the job ends; return what ddptop exits with.

    SIGINT/SIGTERM stop the whole job (as they would stop torchrun), and
    ddptop keeps printing until the job has really ended; a second signal
    ends the waiting.  When the job cannot be stopped from here (ddptop did
    not start it, it is no longer running, its node cannot be reached) ddptop
    says why and ends at once (exit 130); a job it did not start keeps running.
    """
    out = out or sys.stdout
    stops = 0

    def say(line: str) -> None:
        print(f"== ddptop: {line} ==", file=sys.stderr, flush=True)

    def on_signal(signum, frame):
        nonlocal stops
        stops += 1
        if stops > 1:
            raise KeyboardInterrupt
        c = session.control()
        if not c.stop:
            say(f"{c.refused}. Detaching: the job keeps running" if c.refused
                else "the job is not running: nothing to stop; ending")
            raise KeyboardInterrupt
        r = session.stop()
        if not r.ok:
            say(f"{'refused' if r.refused else 'cannot stop the job'}: {r.message}; ending")
            raise KeyboardInterrupt
        if not json_mode:
            say("stopping the job (signal %d); again to stop waiting" % signum)

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
    return session.exit_status().exit_with
