"""`ddptop agent`: a run's event stream as versioned JSON lines on stdout.

Runs on the node (usually started by ``ddptop attach HOST`` through the
person's own ssh); core only, no UI import.  It opens the job with the same
factory as the CLI (``factory.open_local``) and speaks the protocol described in
``ddptop.core.sessions.wire``.  End of stdin (the client went away) ends the agent;
the job is never touched by that.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time

from ddptop import __version__
from ddptop.core.model import run_dirs
from ddptop.core.model.events import LogBatch
from ddptop.core.model.session_protocol import AttachedPid, LocalRun
from ddptop.core.run import journal
from ddptop.core.run.run_session import Session
from ddptop.core.sessions import wire
from ddptop.core.sessions.factory import OpenError, WatchOptions, open_local
from ddptop.core.sessions.wire import decode_cursor, encode_cursor

__all__ = ["main", "decode_cursor", "encode_cursor"]

# seconds between two reads of a chatty job's journal, at least: an agent that read again as soon as it had
# sent (a line every few ms from 8 ranks) spent 12% of a core on a node; paced, the lines of those 150 ms go in
# one batch (the first line after a quiet spell still goes at once: the pace counts from the last read).
# `bench.py agent` (8 ranks, 85 lines/s): 2.3% of a core at 50 ms with the watcher looking every 2 ms, 1.6% with
# it looking every AGENT_LOOK, 0.9% at 150 ms (a line reaches an attached view up to about 0.2 s later)
AGENT_GAP = 0.15
AGENT_LOOK = AGENT_GAP / 2  # seconds between the file watcher's looks for events, at least
INTERVAL = 1.0  # seconds a wait for the run's files to change lasts at most


def _stdin_commands(q: "queue.SimpleQueue", wake) -> None:
    # raw reads (no buffered reader: a daemon thread blocked in one would
    # upset the interpreter's shutdown)
    buf = b""
    while True:
        try:
            chunk = os.read(0, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            if raw.strip():
                q.put(raw)
                wake()  # the main loop may be waiting for the run's files: answer now
    q.put(None)  # end of stdin: the client is gone
    wake()


def software_versions() -> dict[str, str]:
    """What this node runs, read from package metadata (no torch import: cheap)."""
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for name in ("torch", "nvidia-nccl-cu12", "nvidia-nccl-cu11", "nvidia-nccl-cu13"):
        try:
            out["nccl" if name.startswith("nvidia-nccl") else name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def main(argv: list[str]) -> int:
    import argparse


    p = argparse.ArgumentParser(prog="ddptop agent", description="stream a run's events as JSON lines (for ddptop attach)")
    p.add_argument("--run", default="latest",
                   help="run id, run directory or `latest` (default); `pid:N`: the torchrun job with pid N, "
                        "which ddptop did not launch")
    p.add_argument("--gpu", default="auto", help="telemetry for a job ddptop did not launch (auto|sim|none)")
    p.add_argument("--resume", default="", help="a cursor from an earlier connection (opaque)")
    p.add_argument("--after", type=float, default=None, metavar="T",
                   help="instead of --run: the first run begun after time T (this node's clock), the next attempt "
                        "of a node whose container restarted; none yet: the error code not-yet")
    p.add_argument("--interval", type=float, default=INTERVAL)
    args = p.parse_args(argv)

    out = sys.stdout
    write = out.write

    def send(obj: dict) -> None:
        write(wire.dumps(obj) + "\n")
        out.flush()


    hello = wire.hello(host=journal.hostname(), ddptop=__version__, pid=os.getpid(), t=time.time(),
                       versions=software_versions())
    ref = args.run
    if args.after is not None:
        nxt = journal.first_run_after(args.after)
        if nxt is None:
            send({**hello, "run": None})
            send({"kind": "error", "code": "not-yet", "message": f"{journal.hostname()}: no run has begun here after "
                  f"{time.strftime('%H:%M:%S', time.localtime(args.after))} (under {run_dirs.runs_home()})"})
            return 3
        ref = str(nxt)
    try:
        resume = decode_cursor(args.resume) if args.resume else None
        session = open_local(ref, options=WatchOptions(gpu=args.gpu), resume=resume).session
    except (OpenError, ValueError) as e:
        send({**hello, "run": None})
        send({"kind": "error", "message": f"{journal.hostname()}: {e}",
              **({"code": e.code} if isinstance(e, OpenError) and e.code else {})})
        return 2
    loc = session.location
    if isinstance(loc, AttachedPid):
        run, run_dir = f"pid:{loc.pid}", str(loc)
    elif isinstance(loc, LocalRun):
        run, run_dir = loc.run_dir.name, str(loc.run_dir)
    else:  # (open_local opens only jobs on this machine)
        run, run_dir = str(loc), str(loc)
    if isinstance(session, Session):
        session.min_gap = AGENT_GAP
        session.look_every = AGENT_LOOK
    meta = session.meta
    # "t" when sent: the client measures this node's clock against its own with it
    send({**hello, "t": time.time(), "run": run, "run_dir": run_dir, "location": str(loc),
          "meta": meta.to_dict() if meta is not None else None})

    # (a ddptop that launched the run waits, a moment, for this agent to send its end before it exits: in a
    # container it is the first process, and its end is the container's, and this agent's)
    reader = journal.add_reader(loc.run_dir) if isinstance(loc, LocalRun) else None
    cmds: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_stdin_commands, args=(cmds, session.wake), daemon=True, name="agent-stdin").start()
    last_sent = 0.0
    batches = False  # the client takes "logs" batches (it said so); else one "log" object a line
    try:
        while True:
            while True:
                try:
                    raw = cmds.get_nowait()
                except queue.Empty:
                    break
                if raw is None:
                    return 0
                if _accepts_batches(raw):
                    batches = True
                    send(wire.reply("accept", True, "log lines come in logs batches from now on"))
                    continue
                send(_command(session, raw))
            try:
                events = session.poll()
            except Exception as e:  # noqa: BLE001 - the agent process's loop: a bug, not bad data (the session skips that); said, never looped on
                send({"kind": "error", "message": f"{journal.hostname()}: reading the run failed: "
                                                  f"{type(e).__name__}: {e}"})
                return 1
            now = time.monotonic()
            if events or now - last_sent >= wire.HEARTBEAT:  # (a cursor alone when nothing happens)
                write(wire.batch([ev.to_json() if batches or not isinstance(ev, LogBatch) else ev.json_lines()
                                  for ev in events], session.cursor(), time.time()))
                out.flush()
                last_sent = now
            if session.finished:
                status = session.exit_status()
                send({"kind": "bye", "exit_code": status.code, "attach_exit_code": status.exit_with,
                      "exit": status.to_dict()})
                return 0
            # a file event or a deadline (at once with bytes left to read; paced by AGENT_GAP when lines flow)
            session.wait(min(args.interval, wire.HEARTBEAT))
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
    finally:
        session.close()
        if reader is not None:
            reader.unlink(missing_ok=True)


def _accepts_batches(raw: bytes) -> bool:
    """The client's ``{"cmd": "accept", "kinds": [..."logs"...]}``."""
    try:
        c = json.loads(raw)
    except ValueError:
        return False
    return (isinstance(c, dict) and c.get("cmd") == "accept" and isinstance(c.get("kinds"), list)
            and "logs" in c["kinds"])


def _command(session, raw: bytes) -> dict:
    try:
        c = json.loads(raw)
        name = c["cmd"]
    except (ValueError, KeyError, TypeError):
        return wire.reply(None, False, f"unreadable command {raw[:200].decode('utf-8', 'replace')!r}")
    try:
        if name == "stop":
            r = session.stop()
        elif name == "stacks":
            r = session.dump_stacks()
        elif name == "relaunch":
            profiles = c.get("profiles", [])
            if not isinstance(profiles, list):
                return wire.reply(name, False, "relaunch: profiles must be a list of names")
            r = session.relaunch([str(x) for x in profiles], str(c.get("reason", "asked for through ddptop attach")))
        else:
            return wire.reply(name, False, f"unknown command {name!r}")
        return wire.reply(name, r.ok, r.message, r.refused)
    except Exception as e:  # noqa: BLE001 - every command is answered (a bad profile name, a journal error), never the agent's death
        return wire.reply(name, False, str(e))
