"""The answer to a command given to a job: stop, relaunch, dump its stacks.

Part of the session protocol (``ddptop.core.model.session_protocol`` declares the
commands and re-exports it), defined here, below both the sessions and the
probes that carry a command out (a stack capture answers with one), so that
neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CommandResult:
    """The answer to stop / relaunch / dump_stacks.  ``bool(result)`` is ``ok``."""

    ok: bool
    message: str = ""
    refused: bool = False  # not allowed for this job (as opposed to: it could not be done now)

    def __bool__(self) -> bool:
        return self.ok
