"""Headless front end: merged, rank-prefixed text, or one JSON object a line."""

from __future__ import annotations

import signal
import sys
from typing import TextIO

from ddptop.core.analysis.event_text import describe
from ddptop.core.model.events import Event, LogBatch
from ddptop.core.model.session_protocol import JobSession


def format_text(ev: Event) -> str | None:
    """One event as headless output (a batch of lines: its lines, newline-
    separated), or None (telemetry, progress, a progress bar's redraw: the
    journal and --json keep them)."""
    if isinstance(ev, LogBatch):
        text = ev.done_text()  # (a progress bar's redraw is left out: the completed line follows)
        if text is None:
            return None
        prefix = "[torchrun] " if ev.rank is None else f"[r{ev.rank}] "
        if ev.stream == "stderr":
            prefix = prefix[:-2] + "!] "
        # (the lines as one text, prefixed in one pass: no str a line)
        return prefix + text.replace("\n", "\n" + prefix)
    said = describe(ev)
    if said is None:
        return None
    if said.urgent:
        return f"!! ddptop {said.text}" if said.level == "alarm" else f"!! ddptop: {said.text}"
    if said.label:
        return f"== ddptop {said.label}: {said.text} =="
    return f"== ddptop: {said.text} =="


def run_headless(session: JobSession, *, json_mode: bool, out: TextIO | None = None,
                 stop_on_signal: bool = True, interval: float = 1.0) -> int:
    """Print the session's events until the job ends; return what ddptop exits with.

    SIGINT/SIGTERM stop the whole job (as they would stop torchrun), and
    ddptop keeps printing until the job has really ended; a second signal
    ends the waiting.  When the job cannot be stopped from here (ddptop did
    not start it, it is no longer running, its node cannot be reached) ddptop
    says why and ends at once (exit 130); a job it did not start keeps running.
    """
    out = out or sys.stdout
    stops = 0
    leaving = False  # end at the next turn of the loop (not inside a write: --json lines stay whole)

    def say(line: str) -> None:
        print(f"== ddptop: {line} ==", file=sys.stderr, flush=True)

    def on_signal(signum, frame):
        nonlocal stops, leaving
        stops += 1
        if leaving:
            raise KeyboardInterrupt  # asked again while leaving: at once, wherever the loop is
        if stops > 1:
            leaving = True
            return
        c = session.control()
        if not c.stop:
            say(f"{c.refused}. Detaching: the job keeps running" if c.refused
                else "the job is not running: nothing to stop; ending")
            leaving = True
            return
        r = session.stop()
        if not r.ok:
            say(f"{'refused' if r.refused else 'cannot stop the job'}: {r.message}; ending")
            leaving = True
            return
        if not json_mode:
            say("stopping the job (signal %d); again to stop waiting" % signum)

    if stop_on_signal:
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
    write = out.write
    try:
        while not session.finished:
            if leaving:
                return 130
            batch = session.poll()
            if not batch:
                session.wait(interval)  # a file event, a line over the link, or a deadline (a signal: at most this)
                continue
            if json_mode:
                write("".join(ev.json_lines() + "\n" for ev in batch if not isinstance(ev, LogBatch) or ev.texts))
            else:
                lines = [s for s in map(format_text, batch) if s is not None]
                if lines:
                    write("\n".join(lines) if len(lines) > 1 else lines[0])
                    write("\n")
            out.flush()
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # reader went away (e.g. `| head`): keep the job, stop printing
        return 141
    return session.exit_status().exit_with
