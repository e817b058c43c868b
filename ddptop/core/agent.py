"""`ddptop agent`: a run's event stream as versioned JSON lines on stdout.

Runs on the node (usually started by ``ddptop attach HOST`` through the
person's own ssh); core only, no UI import.  The protocol, one JSON object a
line:

* first ``{"kind": "hello", "proto": "ddptop-agent", "version": 1, "host",
  "ddptop", "run", "run_dir", "meta"}``;
* then the run's events, exactly as ``ddptop --json`` prints them, in
  batches; each batch ends with ``{"kind": "cursor", "files": {path: offset}}``
  (also sent every few seconds as a heartbeat).  A client keeps a batch only
  once its cursor has arrived, and reconnects with ``--resume`` set to the last
  cursor: no line is lost and none is repeated, whenever the link drops;
* ``{"kind": "reply", ...}`` answers a command; ``{"kind": "error",
  "message"}`` is fatal (no such run); ``{"kind": "bye", "exit_code"}`` ends a
  finished run's stream.

Commands arrive on stdin, one JSON object a line: ``{"cmd": "stop"}``,
``{"cmd": "relaunch", "profiles": [...], "reason": "..."}``, ``{"cmd": "stacks"}``.  End of stdin
(the client went away) ends the agent; the job is never touched by that.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import sys
import threading
import time

PROTOCOL = 1
PROTO_NAME = "ddptop-agent"
HEARTBEAT = 2.0  # seconds between cursor lines when nothing happens
INTERVAL = 0.1  # seconds between polls of the journal


def encode_cursor(cursor: dict[str, int]) -> str:
    return base64.urlsafe_b64encode(json.dumps(cursor, separators=(",", ":")).encode()).decode()


def decode_cursor(s: str) -> dict[str, int]:
    d = json.loads(base64.urlsafe_b64decode(s.encode()))
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in d.items()):
        raise ValueError("a cursor maps file paths to byte offsets")
    return d


def _stdin_commands(q: "queue.SimpleQueue") -> None:
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
    q.put(None)  # end of stdin: the client is gone


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


def _foreign_session(pid: int, gpu: str, resume):
    """A torchrun job ddptop did not launch (its journal if ddptop did): (session, run name)."""
    from ddptop.core.foreign import ForeignError, ForeignSession, launched_by_ddptop, resolve_pid
    from ddptop.core.session import Session

    try:
        target = resolve_pid(pid)
        if target.torchrun is not None:
            run_dir = launched_by_ddptop(target.torchrun)
            if run_dir is not None:
                return Session.open(run_dir, resume=resume), run_dir.name
        return ForeignSession(target, gpu=gpu, resume=resume), f"pid:{target.pid}"
    except ForeignError as e:
        raise ValueError(f"--pid {pid}: {e}") from None


def main(argv: list[str]) -> int:
    import argparse

    from ddptop import __version__
    from ddptop.core import journal
    from ddptop.core.session import Session

    p = argparse.ArgumentParser(prog="ddptop agent", description="stream a run's events as JSON lines (for ddptop attach)")
    p.add_argument("--run", default="latest",
                   help="run id, run directory or `latest` (default); `pid:N`: the torchrun job with pid N, "
                        "which ddptop did not launch")
    p.add_argument("--gpu", default="auto", help="telemetry for a job ddptop did not launch (auto|sim|none)")
    p.add_argument("--resume", default="", help="a cursor from an earlier connection (opaque)")
    p.add_argument("--interval", type=float, default=INTERVAL)
    args = p.parse_args(argv)

    out = sys.stdout
    write = out.write

    def send(obj: dict) -> None:
        write(json.dumps(obj, separators=(",", ":")) + "\n")
        out.flush()

    hello = {"kind": "hello", "proto": PROTO_NAME, "version": PROTOCOL, "host": journal.hostname(),
             "ddptop": __version__, "pid": os.getpid(), "t": time.time(), "versions": software_versions()}
    foreign = re.fullmatch(r"pid[:-](\d+)", args.run)
    try:
        resume = decode_cursor(args.resume) if args.resume else None
        if foreign:
            session, run = _foreign_session(int(foreign.group(1)), args.gpu, resume)
            run = run if not run.startswith("pid:") else f"pid:{session.pid}"
            run_dir = session.run_dir
        else:
            run_dir = journal.resolve_run(args.run)
            session, run = Session.open(run_dir, resume=resume), run_dir.name
    except (journal.JournalError, ValueError) as e:
        send({**hello, "run": None})
        send({"kind": "error", "message": f"{journal.hostname()}: {e}"})
        return 2
    # "t" when sent: the client measures this node's clock against its own with it
    send({**hello, "t": time.time(), "run": run, "run_dir": str(run_dir), "meta": session.meta.to_dict()})

    cmds: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_stdin_commands, args=(cmds,), daemon=True, name="agent-stdin").start()
    last_sent = 0.0
    try:
        while True:
            while True:
                try:
                    raw = cmds.get_nowait()
                except queue.Empty:
                    break
                if raw is None:
                    return 0
                send(_command(session, raw))
            batch = session.poll()
            now = time.monotonic()
            if batch or now - last_sent >= HEARTBEAT:
                lines = [ev.to_json() for ev in batch]
                lines.append(json.dumps({"kind": "cursor", "files": session.cursor()}, separators=(",", ":")))
                write("\n".join(lines) + "\n")
                out.flush()
                last_sent = now
            if session.finished:
                bye = {"kind": "bye", "exit_code": session.exit_code}
                if hasattr(session, "attach_exit_code"):  # a job ddptop did not launch: its code is unknown
                    bye["attach_exit_code"] = session.attach_exit_code
                send(bye)
                return 0
            if not batch:
                time.sleep(args.interval)
    except (BrokenPipeError, KeyboardInterrupt):
        return 0


def _command(session, raw: bytes) -> dict:
    try:
        c = json.loads(raw)
        name = c["cmd"]
    except (ValueError, KeyError, TypeError):
        return {"kind": "reply", "cmd": None, "ok": False,
                "message": f"unreadable command {raw[:200].decode('utf-8', 'replace')!r}"}
    try:
        if name == "stop":
            ok = session.stop()
            return {"kind": "reply", "cmd": name, "ok": ok,
                    "message": "stopping the job" if ok else "the job is not running"}
        if name == "stacks":
            ok = session.dump_stacks()
            return {"kind": "reply", "cmd": name, "ok": ok,
                    "message": "capturing every rank's stack" if ok else "the job is not running"}
        if name == "relaunch":
            profiles = [str(x) for x in c.get("profiles", [])]
            ok = session.relaunch(profiles, str(c.get("reason", "asked for through ddptop attach")))
            return {"kind": "reply", "cmd": name, "ok": ok,
                    "message": (f"relaunching with {', '.join(profiles) or 'default'}" if ok
                                else "the job is not running")}
        return {"kind": "reply", "cmd": name, "ok": False, "message": f"unknown command {name!r}"}
    except Exception as e:  # a bad profile name, a journal error: answer, never die
        return {"kind": "reply", "cmd": name, "ok": False, "message": str(e)}
