"""A node whose cluster restarts it, followed from one attempt to the next.

When a followed node's run ends without success, or cannot be read any more,
``RemoteSession`` asks the cluster (``transport.outlook``) and the agent
(``--after``: the first run begun since) for the node's next attempt, shows
it as one (a ``LaunchEvent`` with ``node_restart``) and follows it; it ends
when the cluster says no attempt will come, or none has come within
``restart_wait`` seconds while the cluster does not say one is on its way.
A mixin of ``ssh.RemoteSession``, which owns the state it reads and writes.
"""

from __future__ import annotations

import time

from ddptop.core.model.events import (
    FAILED,
    LOST,
    SUCCEEDED,
    LaunchEvent,
    NoteEvent,
    StateEvent,
)
from ddptop.core.sessions.ssh_state import RemoteState

RESTART_WAIT = 120.0  # seconds a node whose run failed is waited for, when its cluster does not say it restarts it
OVER = object()  # on the queue, with the attempt's number: the node's attempt has ended, its next one is waited for
LAG_TRIES = 5  # connections refused for a container the cluster still calls running, before that is an error
# what kubectl says when the container (or pod) it was to exec into is not running
NOT_RUNNING = ("container not found", "cannot exec into a container in a completed pod", "NotFound",
                "is not created or running", "container is not running")


class NodeAttempts(RemoteState):
    """The follow of a node's attempts (mixed into ``RemoteSession``)."""

    def _follows(self) -> bool:
        """Whether this node's attempts are followed: a cluster that says when it
        restarts the node, and a run ddptop launched (whose start time the next
        attempt's run is found after)."""
        return (self.transport.follows_restarts and self._pinned and self.meta is not None
                and isinstance(self.meta.started, (int, float)))

    def _starting(self, outcome: str, message: str) -> tuple[str, str]:
        """The first connection to a node whose cluster says how its pod is
        failed: while the pod is starting (pending, its image pulled, its
        container not yet running) or its ddptop has not begun its run yet,
        that is waited for (``restart_wait`` unless the cluster says it is on
        its way); else the outcome as it is."""
        not_running = outcome == "not-yet" or any(s in message for s in NOT_RUNNING)
        if outcome not in ("fatal", "not-yet") or not not_running:
            return outcome, message
        look = self.transport.outlook(None)
        if look is None or look.kind not in ("restarting", "same"):
            return ("fatal" if outcome == "not-yet" else outcome), message
        if not self._waiting_since or look.coming:
            self._waiting_since = time.monotonic()
        waited = time.monotonic() - self._waiting_since
        if waited >= self.restart_wait:
            return "fatal", f"{message} (waited {self.restart_wait:.0f} s for the pod's run to begin)"
        what = look.message if look.kind != "same" else "its ddptop has not begun a run yet"
        return "lost", f"waiting for the pod to start: {what}"

    def _attempt_over(self, final: StateEvent | None) -> bool:
        """The current attempt's run ended (``final``: how): True when its next
        attempt is to be waited for (not after a success, nor for a cluster
        that says nothing of restarts)."""
        if not self._follows() or final is None or final.state == SUCCEEDED:
            return False
        assert self.meta is not None
        self._after = float(self.meta.started)
        self._waiting_since = time.monotonic()
        self._timed_for = ()
        self._q.put((OVER, self.attempt))
        return True

    def _follow(self, outcome: str, message: str) -> tuple[str, str]:
        """A connection of a followed node failed (``outcome``, ``message``):
        ``next`` (look for the next attempt at once), ``end`` (none will come:
        ``message`` says why), or the outcome to go on with (``lost``: retry
        after the backoff; ``fatal``)."""
        if outcome in ("lost", "hello") and self._after is None:
            return outcome, message  # (the link dropped: the run is read on from where it was)
        not_running = outcome in ("gone", "not-yet") or any(s in message for s in NOT_RUNNING)
        if outcome == "fatal" and not not_running:
            return outcome, message  # (ddptop missing or too old there, refused by the cluster: said as it is)
        look = self.transport.outlook(self._node_before)
        if look is not None and look.kind != "same" and look.message != self._look_said:
            self._look_said = look.message  # (what the cluster says, once, in the log)
            self._emit([NoteEvent(self.clock(), "info", f"{self.node}: {look.message}", node=self.node)])
        if self._after is None:
            # the run being read could not be reached, or is not there any more (gone)
            if look is not None and outcome != "gone" and look.kind in ("same", "restarting"):
                if look.kind == "same":  # (kubectl says the container is not running; the API does not, yet)
                    self._lagging += 1
                    if self._lagging > LAG_TRIES:
                        return outcome, message
                return "lost", f"{message} ({look.message}: its run is read on once it is back)"
            if look is None and outcome != "gone":
                return ("lost" if outcome == "not-yet" else outcome), message
            # the attempt ended, and its run cannot be read: its end as the cluster says
            final = self._run_final = self._final_from(look) if look is not None else StateEvent(
                self.clock(), LOST, None, f"{message} (and the cluster could not be asked)", node=self.node)
            self._emit([final])
            if look is not None and look.kind == "ended" or not self._attempt_over(final):
                return "end", look.message if look is not None else message
            return "next", ""
        # waiting for the next attempt
        if look is not None and look.kind == "ended":
            return "end", f"no next attempt: {look.message}"
        if look is not None and (look.coming or look.kind == "restarting" and look.incarnation != self._timed_for):
            # the cluster says one is on its way, or a new container (or pod) runs: its run is waited for anew
            self._timed_for = look.incarnation
            self._waiting_since = time.monotonic()
        waited = time.monotonic() - self._waiting_since
        said = look.message if look is not None else "the cluster could not be asked"
        if waited >= self.restart_wait:
            return "end", f"no next attempt came within {self.restart_wait:.0f} s ({said})"
        return "lost", f"waiting up to {self.restart_wait - waited:.0f} s more for the next attempt ({said})"

    def _final_from(self, look) -> StateEvent:
        """An attempt's end as its cluster tells it (its run's record could not be read)."""
        code = look.exit_code
        state = SUCCEEDED if code == 0 else FAILED if code is not None else LOST
        detail = look.reason or look.message
        if look.reason == "OOMKilled":
            detail += (": the container reached its memory limit (fewer data-loader workers, or a larger "
                       "resources.limits.memory)")
        return StateEvent(self.clock(), state, code, f"as the cluster tells it: {detail}; the run's own record "
                          "could not be read", node=self.node)

    def _next_attempt(self, d: dict) -> None:
        """The hello of the node's next attempt: its run is followed from its start."""
        self.attempt += 1
        self._gen_base = self._gen_top + 1
        self._gen_top = self._gen_base
        self._cursor = {}
        self._after = None
        self._run_final = None
        self._exit = None
        self._node_before = self.transport.listed_node()
        meta = self.meta
        self._emit([LaunchEvent(self.clock(), generation=self._gen_base, node_restart=self.attempt, node=self.node,
                                profiles=tuple(meta.profiles or ()) if meta is not None else (),
                                command=tuple(meta.command) if meta is not None else (),
                                reason=f"run {d.get('run')} {self.transport.where()}")])
