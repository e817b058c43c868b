"""The session protocol: the one shape every front end consumes.

A ``JobSession`` is a job seen from ddptop, whatever it is: a run ddptop
launched (read from its journal), a torchrun job ddptop did not launch
(watched by pid), a run on another node (over ssh, through ``ddptop agent``)
or several nodes of one job.  The TUI, headless/``--json`` and the agent use
only what is declared here; none of them asks which kind it holds.

* ``poll()`` returns what is new, never blocking on the job; ``finished`` is
  set once the job's final state has been returned (the last event).
* ``exit_status()`` is the one exit status of every kind of session, with the
  reason when the job's own code cannot be known.
* ``control()`` says what may be done to the job (stop, relaunch, stack
  dump, a ``ddptop fix`` search here) and why not; ``stop()``, ``relaunch()``
  and ``dump_stacks()`` answer with a ``CommandResult`` that says what
  happened.
* ``location`` is typed: a local run directory, a run on a remote host, an
  attached pid, or several nodes.
* ``cursor()`` resumes reading exactly after what ``poll()`` returned.

The factory that turns what a person names into a session is
``ddptop.core.sessions.factory`` (``open_local``, ``open_target``); the implementations
import this module, never the factory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Union

# the answer to stop / relaunch / dump_stacks: part of this protocol, defined below the probes that answer with it
from ddptop.core.model.command_result import CommandResult as CommandResult
from ddptop.core.model.events import Event, StateEvent
from ddptop.core.model.run_meta import Meta

EXIT_CRASH_SEEN = 1  # `ddptop attach` exit code: the job ended and a rank crash was seen in its output
EXIT_UNKNOWN = 3  # ... the job ended and its exit status cannot be known


# -- where the job is ----------------------------------------------------------


@dataclass(frozen=True)
class LocalRun:
    """A run ddptop launched on this machine: its journal directory."""

    run_dir: Path

    def __str__(self) -> str:
        return str(self.run_dir)

    @property
    def attach_hint(self) -> str:
        return f"ddptop attach {self.run_dir}"


@dataclass(frozen=True)
class RemoteRun:
    """A run (or a job watched by pid: ``run`` is ``pid:N``) on another node."""

    host: str
    run: str  # the run id; "latest" until the node's agent has named it
    run_dir: str = ""  # its journal directory on that node, once known
    node: str = ""  # the name it is shown under (default: host)

    def __str__(self) -> str:
        return f"{self.host}:{self.run_dir or self.run}"

    @property
    def attach_hint(self) -> str:
        return f"ddptop attach {_host_target(self.host)}:{self.run}"


@dataclass(frozen=True)
class AttachedPid:
    """A torchrun job ddptop did not launch, watched from outside on this machine."""

    pid: int
    host: str
    log_dir: str = ""  # where its rank logs are, once known

    def __str__(self) -> str:
        where = f"its rank logs are in {self.log_dir}" if self.log_dir else "no journal"
        return f"pid {self.pid} on {self.host} (ddptop did not launch this job; {where})"

    @property
    def attach_hint(self) -> str:
        return f"ddptop attach --pid {self.pid}"


@dataclass(frozen=True)
class Nodes:
    """Several nodes of one job, watched as one."""

    nodes: tuple[RemoteRun, ...]

    def __str__(self) -> str:
        return " ".join(str(n) for n in self.nodes)

    @property
    def attach_hint(self) -> str:
        return "ddptop attach " + " ".join(f"{_host_target(n.host)}:{n.run}" for n in self.nodes)


@dataclass(frozen=True)
class PodLogs:
    """Where a logs-only view reads: a selector's pods, through kubectl logs."""

    selector: str
    namespace: str = ""
    context: str = ""

    def __str__(self) -> str:
        return f"logs of pods -l {self.selector}" + (f" -n {self.namespace}" if self.namespace else "")

    @property
    def attach_hint(self) -> str:
        ns = f" -n {self.namespace}" if self.namespace else ""
        return f"ddptop attach -l {self.selector}{ns} --logs-only"


Location = Union[LocalRun, RemoteRun, AttachedPid, Nodes, PodLogs]


def _host_target(host: str) -> str:
    """An IPv6 literal in brackets, so that HOST:RUN splits back the same way."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# -- what may be done ----------------------------------------------------------


@dataclass(frozen=True)
class Control:
    """What a front end may ask of this job, and why not when it may not."""

    stop: bool
    relaunch: bool
    stacks: bool
    fix: bool = False  # `ddptop fix` can run the job's command again on this machine
    refused: str = ""  # why stop and relaunch are refused (a job ddptop did not start)
    fix_refused: str = ""  # why a fix search cannot run from here


@dataclass(frozen=True)
class ExitStatus:
    """How the job ended.  ``code``: the job's own exit code, or None when it
    cannot be known (``reason`` says why); ``exit_with``: what ddptop exits
    with (``code`` when known)."""

    code: int | None
    reason: str = ""
    exit_with: int = 1

    @classmethod
    def known(cls, code: int) -> ExitStatus:
        return cls(code, "", code)

    @classmethod
    def unknown(cls, reason: str, crash_seen: bool | None = None) -> ExitStatus:
        """``crash_seen``: None for a job that ended badly (lost, failed link):
        ddptop exits 1; else 1 when a crash was seen in its output, 3 when not."""
        if crash_seen is None:
            return cls(None, reason, 1)
        return cls(None, reason, EXIT_CRASH_SEEN if crash_seen else EXIT_UNKNOWN)

    @classmethod
    def of_final(cls, final: StateEvent | None, *, running: str = "the job has not ended") -> ExitStatus:
        """The status a final state event records (or ``running`` when there is none yet)."""
        if final is None:
            return cls.unknown(running)
        if final.exit_code is not None:
            return cls.known(final.exit_code)
        return cls.unknown(final.message or f"the job is {final.state}")

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code, "reason": self.reason, "exit_with": self.exit_with}

    @classmethod
    def from_dict(cls, d: object) -> ExitStatus | None:
        if not isinstance(d, dict):
            return None
        code, reason, exit_with = d.get("code"), d.get("reason", ""), d.get("exit_with")
        if code is not None and (not isinstance(code, int) or isinstance(code, bool)):
            return None
        if not isinstance(exit_with, int) or isinstance(exit_with, bool) or not isinstance(reason, str):
            return None
        return cls(code, reason, exit_with)


# -- the protocol --------------------------------------------------------------


class JobSession(Protocol):
    @property
    def location(self) -> Location: ...

    @property
    def meta(self) -> Meta | None:
        """The job's command and settings (None until a remote node has said)."""

    @property
    def finished(self) -> bool:
        """The final state has been returned by ``poll()``: nothing more will come."""

    @property
    def final_state(self) -> StateEvent | None: ...

    @property
    def error(self) -> str | None:
        """Why watching failed for good (an ssh link that cannot be made), else None."""

    @property
    def is_live(self) -> bool:
        """The job is (as far as can be seen) still running."""

    def poll(self) -> list[Event]: ...

    def wait(self, timeout: float) -> None:
        """Sleep until ``poll`` may have something new (a file changed, a line
        arrived) or ``timeout`` seconds pass; an implementation may end
        sooner for its own deadlines.  Front ends call it when a poll found
        nothing, instead of sleeping a fixed interval."""

    def wake(self) -> None:
        """End a ``wait`` under way now (called from another thread: a command
        came).  Where waits are short anyway, it does nothing."""

    def exit_status(self) -> ExitStatus: ...

    def control(self) -> Control: ...

    def cursor(self) -> dict[str, int]: ...

    def stop(self) -> CommandResult: ...

    def relaunch(self, profiles: list[str], reason: str = "asked for") -> CommandResult: ...

    def dump_stacks(self) -> CommandResult: ...

    def close(self) -> None:
        """Stop watching (the job itself is never touched by this)."""
