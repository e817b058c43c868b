"""The agent's wire protocol: what ``ddptop agent`` writes and ``ddptop attach HOST`` reads.

One JSON object a line, UTF-8, over the person's own ssh:

* first ``{"kind": "hello", "proto": "ddptop-agent", "version": MAJOR,
  "minor": MINOR, "host", "ddptop", "pid", "t", "versions", "run",
  "run_dir", "meta", "location"}``;
* then the run's events, exactly as ``ddptop --json`` prints them, in
  batches; each batch ends with ``{"kind": "cursor", "files": {path: offset},
  "t": when sent}`` (also sent every few seconds as a heartbeat; ``t`` since
  minor 5: the node's stream is complete up to then, which a cross-node view
  judges silences by, so that a link read late is not a silent node).  A client keeps a batch only
  once its cursor has arrived, and reconnects with ``--resume`` set to the
  last cursor: no line is lost and none is repeated, whenever the link drops;
* ``{"kind": "reply", "cmd", "ok", "refused", "message"}`` answers a
  command; ``{"kind": "error", "message", "code"}`` ends the connection
  (``code`` since minor 4: ``no-run``, the run named is not there;
  ``not-yet``, no run has begun yet, or since ``--after T``);
  ``{"kind": "bye", "exit_code", "exit": {"code", "reason", "exit_with"}}``
  ends a finished run's stream.

Commands go the other way, one JSON object a line: ``{"cmd": "stop"}``,
``{"cmd": "relaunch", "profiles": [...], "reason": "..."}``, ``{"cmd": "stacks"}``.

Log lines: an agent sends one ``log`` object per line (as ``--json``) until
the client says ``{"cmd": "accept", "kinds": ["logs"]}`` (a client sends it
only to an agent of minor 3 or later, right after the hello); the agent
answers with a ``reply`` to ``accept`` and from then on sends ``logs``
batches, the lines of one read of one file in one object.  A client takes
both forms.

Compatibility: a client accepts an agent of the same MAJOR version whatever
its MINOR (a minor version only adds kinds or fields); kinds and fields a
reader does not know are ignored, on the wire as in the journal.  A line that
cannot be read is skipped with a note, never retried: the cursor moves past it.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from ddptop import __version__

PROTO_NAME = "ddptop-agent"
MAJOR = 1  # a client and an agent of different majors cannot talk
MINOR = 5  # 1: exit status in bye, typed replies, location in hello; 2: "ras" events; 3: "logs" batches;
# 4: error codes, and `agent --after T` (the next attempt of a node whose container restarted); 5: "t" in cursors
HEARTBEAT = 2.0  # seconds between an agent's cursor lines when nothing happens, at most
BATCHES_SINCE = 3  # the first minor whose agent sends "logs" batches when asked
PROTOCOL = MAJOR  # (the "version" field: what protocol 1 agents and clients compare)
CONTROL = frozenset({"hello", "cursor", "bye", "reply", "error"})


def dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def encode_cursor(cursor: dict[str, int]) -> str:
    return base64.urlsafe_b64encode(json.dumps(cursor, separators=(",", ":")).encode()).decode()


def decode_cursor(s: str) -> dict[str, int]:
    try:
        d = json.loads(base64.urlsafe_b64decode(s.encode()))
    except (ValueError, TypeError) as e:
        raise ValueError(f"unreadable cursor ({e})") from None
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                          for k, v in d.items()):
        raise ValueError("a cursor maps file paths to byte offsets")
    return d


def hello(**fields: Any) -> dict[str, Any]:
    return {"kind": "hello", "proto": PROTO_NAME, "version": MAJOR, "minor": MINOR, **fields}


def install_hint() -> str:
    """How to install this very ddptop on another node (the agent's end of the protocol)."""
    return f"pip install 'ddptop=={__version__}'"


def check_hello(d: dict[str, Any], host: str, install_hint: str) -> str | None:
    """None when this client can talk to the agent that said ``d``; else why not."""
    if d.get("proto") != PROTO_NAME:
        return f"{host}: the remote command did not speak the ddptop agent protocol"
    if d.get("version") != MAJOR:
        return (f"{host} runs ddptop {d.get('ddptop')} (agent protocol {d.get('version')}), this ddptop speaks "
                f"protocol {MAJOR}: install a compatible version there: {install_hint}")
    return None


def parse_line(raw: bytes) -> tuple[str | None, dict[str, Any]]:
    """(kind, object) of one line; (None, {}) when it is not a JSON object with a kind."""
    try:
        d = json.loads(raw)
    except ValueError:
        return None, {}
    if not isinstance(d, dict) or not isinstance(d.get("kind"), str):
        return None, {}
    return d["kind"], d


def batch(lines: list[str], cursor: dict[str, int], t: float | None = None) -> str:
    """Events already serialised, then the cursor that commits them (``t``: when sent, the agent's clock)."""
    c: dict[str, Any] = {"kind": "cursor", "files": cursor}
    if t is not None:
        c["t"] = t
    return "".join(l + "\n" for l in lines) + dumps(c) + "\n"


def reply(cmd: str | None, ok: bool, message: str, refused: bool = False) -> dict[str, Any]:
    return {"kind": "reply", "cmd": cmd, "ok": ok, "refused": refused, "message": message}
