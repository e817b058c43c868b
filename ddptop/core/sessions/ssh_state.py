"""What ``ssh.RemoteSession`` and its two mixins (``ssh_stream.AgentStream``:
one connection's lines; ``ssh_restarts.NodeAttempts``: a node's attempts)
share: the session's state, declared once with its types.  ``RemoteSession``
sets it in ``__init__``."""

from __future__ import annotations

import queue
import threading
from typing import Callable

from ddptop.core.model.events import Event, StateEvent
from ddptop.core.model.run_meta import Meta
from ddptop.core.model.session_protocol import ExitStatus
from ddptop.core.sessions.transports import Transport


class RemoteState:
    host: str
    node: str
    run: str
    gpu: str | None
    versions: dict[str, str]  # the node's python/torch/NCCL, from the agent's hello
    skew: float  # our clock minus the node's, when over SKEW_MIN (else 0)
    _spawned: float | None  # when the current connection was started (our clock): its hello came after
    transport: Transport
    remote_cmd: str
    clock: Callable[[], float]
    silence: float
    restart_wait: float
    attempt: int  # the node's restarts followed so far
    meta: Meta | None
    connects: int
    _pinned: bool
    _node_before: object
    _after: float | None  # waiting for the node's next attempt: its run must have begun after this
    _waiting_since: float
    _look_said: str
    _timed_for: tuple
    _lagging: int
    _run_final: StateEvent | None
    _gen_base: int
    _gen_top: int
    _remote_dir: str
    _cursor: dict[str, int]
    _heard: float | None  # (the reader's) the time, on our clock, the node's stream has been read up to
    _exit: ExitStatus | None
    _q: queue.SimpleQueue
    _closed: threading.Event

    @property
    def launched(self) -> bool:
        """The job on the node was launched by ddptop (not watched there by pid)."""
        return not self.run.startswith("pid:")

    def _emit(self, events: list[Event]) -> None:
        raise NotImplementedError

    def _send(self, cmd: dict) -> str | None:
        raise NotImplementedError

    def _set_link(self, state: str, message: str = "", retry_in: float | None = None) -> None:
        raise NotImplementedError

    def _next_attempt(self, d: dict) -> None:
        raise NotImplementedError
