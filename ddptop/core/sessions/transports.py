"""How a remote session reaches ``ddptop agent`` on a node: the one seam
under :class:`~ddptop.core.sessions.ssh.RemoteSession`.

* :class:`Ssh`: the person's own ssh (``ssh HOST 'ddptop agent ...'``; the
  remote shell gets every word quoted);
* :class:`Srun`: a step inside a SLURM job's allocation, for clusters where
  ssh to compute nodes is not allowed (``srun --jobid J --overlap --nodelist
  NODE --nodes 1 --ntasks 1 ddptop agent ...``);
* :class:`Kubectl`: a command in a pod's container (``kubectl [--context C]
  [-n NS] exec -i POD -c CONTAINER -- ddptop agent ...``; the user's
  kubeconfig applies).

Everything else (framing, cursors, resume without loss or duplicates,
reconnect with backoff, link states, commands through the link) is the
session's and the same for all three.  srun and kubectl run no shell: each
word is its own argv element, and every name that comes from a person or a
cluster is checked before it is used, so none can become an option.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Protocol

# a host as ssh gets it; a SLURM node; a SLURM job id (an array task: 123_4, a het job: 123+1); a Kubernetes
# object name (DNS-1123) and a context name (kubeconfig allows more, but never a leading '-' or a space)
_SLURM_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SLURM_JOB = re.compile(r"\d+(?:_\d+)?(?:\+\d+)?")
K8S_NAME = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?")
_K8S_CONTEXT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@/=-]{0,252}")


def checked(value: str, rx: re.Pattern, what: str) -> str:
    """``value`` when it is a well-formed ``what``; else ValueError (never an option, never a space)."""
    if not isinstance(value, str) or not rx.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not a valid name: refused")
    return value


def check_host(host: str) -> str:
    """A host name as ssh will get it: never one that ssh would take for an option."""
    if host.startswith("-"):
        raise ValueError(f"host name {host!r} begins with '-': refused (ssh would read it as an option)")
    if any(c.isspace() or ord(c) < 32 for c in host):
        raise ValueError(f"host name {host!r} contains white space or control characters: refused")
    return host


def check_command(words: list[str]) -> list[str]:
    """The agent's command words for a launcher that runs no shell: the program must not look like an option."""
    if not words or words[0].startswith("-"):
        raise ValueError(f"remote ddptop command {shlex.join(words)!r} must start with the program: refused")
    return words


def remote_command(words: list[str]) -> str:
    """The command line a remote shell runs: every word quoted, so that no
    user text is expanded there, except a leading ``~/`` or ``$HOME/`` of the
    first word, which means the remote home (``~/venv/bin/ddptop``)."""
    first, rest = (words[0], words[1:]) if words else ("", [])
    for home in ("~/", "$HOME/", "${HOME}/"):
        if first.startswith(home):
            return " ".join(['"$HOME"/' + shlex.quote(first[len(home):])] + [shlex.quote(w) for w in rest])
    return shlex.join(words)


SSH_OPTIONS = ("-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")
# ssh's own failures that retrying cannot fix
_SSH_FATAL = ("Permission denied", "Host key verification failed", "Could not resolve hostname",
              "Bad configuration option", "no such identity", "REMOTE HOST IDENTIFICATION HAS CHANGED",
              "hostname contains invalid characters", "Bad port", "Unsupported option", "Bad owner or permissions",
              "Can't open user config file", "garbage at end of line", "Bad escape character")
# srun's answers that retrying cannot fix (the job is gone, or the step is refused for good)
_SRUN_FATAL = ("Invalid job id", "Job has already finished", "job has already completed", "Access/permission denied",
               "invalid node name", "Requested node configuration is not available", "not in this job",
               "Invalid node name specified", "unrecognized option", "invalid option")
# kubectl's answers that retrying cannot fix
_KUBECTL_FATAL = ("NotFound", "Forbidden", "Unauthorized", "error: unable to upgrade connection: container not found",
                  "container not found", "does not have a host assigned", "no context exists", "unknown flag",
                  "invalid configuration", "error: You must be logged in", "cannot exec into a container in a completed pod")


class _NoRestarts:
    """A transport to nodes no cluster tells of: their restarts are not followed (a host is a host; a
    requeued SLURM job is a new allocation: attach again)."""

    follows_restarts = False

    def listed_node(self) -> None:
        return None

    def outlook(self, before: object) -> None:
        return None


@dataclass(frozen=True)
class Ssh(_NoRestarts):
    """The person's own ssh (config, keys, agent and ProxyJump all apply)."""

    host: str
    ssh: tuple[str, ...] = ("ssh",)
    kind: str = field(default="ssh", init=False)

    def __post_init__(self) -> None:
        check_host(self.host)

    def argv(self, words: list[str]) -> list[str]:
        return [*self.ssh, *SSH_OPTIONS, "--", self.host, remote_command(words)]

    def label(self) -> str:
        return f"ssh {self.host}"

    def fatal(self, rc: int, err: str) -> str | None:
        if rc == 255 and any(s in err for s in _SSH_FATAL):
            return f"check that `ssh {self.host} true` works without a prompt"
        return None

    def where(self) -> str:
        return f"on {self.host} (a non-interactive ssh shell's PATH)"

    def install(self, hint: str) -> str:
        return f"Install it there: {hint}"


@dataclass(frozen=True)
class Srun(_NoRestarts):
    """A step in a SLURM job's allocation, on one of its nodes (for clusters
    without ssh to compute nodes).  ``--overlap`` shares the job's resources
    with its running step, as SLURM's documentation says to for monitoring."""

    jobid: str
    node: str
    srun: tuple[str, ...] = ("srun",)
    kind: str = field(default="srun", init=False)

    def __post_init__(self) -> None:
        checked(self.jobid, _SLURM_JOB, "SLURM job id")
        checked(self.node, _SLURM_NODE, "SLURM node")

    def argv(self, words: list[str]) -> list[str]:
        return [*self.srun, f"--jobid={self.jobid}", "--overlap", f"--nodelist={self.node}", "--nodes=1",
                "--ntasks=1", *check_command(words)]

    def label(self) -> str:
        return f"srun --jobid={self.jobid} --nodelist={self.node}"

    def fatal(self, rc: int, err: str) -> str | None:
        if any(s.lower() in err.lower() for s in _SRUN_FATAL):
            return f"check that `srun --jobid={self.jobid} --overlap --nodelist={self.node} true` works"
        return None

    def where(self) -> str:
        return f"on {self.node} (in job {self.jobid}'s environment)"

    def install(self, hint: str) -> str:
        return f"Install it where the job's nodes can run it: {hint}"


def kubectl_base(kubectl: tuple[str, ...] = ("kubectl",), namespace: str = "", context: str = "") -> list[str]:
    """kubectl with the person's context and namespace (both checked: never an option)."""
    if namespace:
        checked(namespace, K8S_NAME, "namespace")
    if context:
        checked(context, _K8S_CONTEXT, "context")
    return [*kubectl, *(["--context", context] if context else []), *(["--namespace", namespace] if namespace else [])]


class NodeWatch(Protocol):
    """What a cluster says of one node (``k8s.PodWatch``)."""

    def now(self) -> Any:
        """The node's pod now (its ``name``), or None."""

    def outlook(self, before: object) -> Any:
        """Whether the node gets another attempt (a ``k8s.Outlook``), or None."""


@dataclass(frozen=True)
class Kubectl:
    """A command in a pod's container (``kubectl exec``), with the person's
    kubeconfig, ``--context`` and namespace.  ``watch``, when given, lists
    the node's pod as it is now (``k8s.PodWatch``): asked at each connection (a
    pod that was recreated has a new name), and for the node's ``outlook``
    when its run ends or cannot be reached (the container restarts: the next
    attempt of the node)."""

    pod: str
    container: str = ""
    namespace: str = ""
    context: str = ""
    kubectl: tuple[str, ...] = ("kubectl",)
    watch: NodeWatch | None = field(default=None, compare=False)
    kind: str = field(default="kubectl", init=False)
    # the last connection's pod: [its name, as the cluster listed it then (None: not listed)]
    _used: list = field(default_factory=list, compare=False, repr=False)

    @property
    def current(self) -> str:
        """The pod the last connection went to (a recreated pod has a new name)."""
        return self._used[0] if self._used else self.pod

    def __post_init__(self) -> None:
        checked(self.pod, K8S_NAME, "pod")
        if self.container:
            checked(self.container, K8S_NAME, "container")
        if self.namespace:
            checked(self.namespace, K8S_NAME, "namespace")
        if self.context:
            checked(self.context, _K8S_CONTEXT, "context")

    def base(self) -> list[str]:
        """kubectl with the person's context and namespace."""
        return kubectl_base(self.kubectl, self.namespace, self.context)

    @property
    def follows_restarts(self) -> bool:
        """The cluster can say when the node's container restarts (a next attempt to follow)."""
        return self.watch is not None

    def listed_node(self) -> Any:
        """The node's pod as the cluster listed it for the last connection,
        which is now for the run that connection found (listed now when no
        connection was made; None: not known)."""
        if self._used:
            return self._used[1]
        return self.watch.now() if self.watch is not None else None

    def outlook(self, before: object) -> Any:
        """What the cluster says of the node against its pod ``before``, as the
        attempt began (``k8s.Outlook``); None: the cluster could not be asked."""
        return self.watch.outlook(before) if self.watch is not None else None

    def argv(self, words: list[str]) -> list[str]:
        pod, now = self.pod, None
        if self.watch is not None:
            now = self.watch.now()
            pod = checked(now.name if now is not None else self.pod, K8S_NAME, "pod")
        self._used[:] = [pod, now]
        return [*self.base(), "exec", "-i", pod, *(["-c", self.container] if self.container else []), "--",
                *check_command(words)]

    def label(self) -> str:
        return f"kubectl exec {self.current}" + (f" -c {self.container}" if self.container else "")

    def fatal(self, rc: int, err: str) -> str | None:
        if any(s in err for s in _KUBECTL_FATAL):
            return "check that `" + shlex.join([*self.base(), "exec", self.current, "--", "true"]) + "` works"
        return None

    def where(self) -> str:
        return f"in pod {self.current}'s container{' ' + self.container if self.container else ''}"

    def install(self, hint: str) -> str:
        return (f"Add it to the training image ({hint} in its Dockerfile), or follow the pods' logs without it: "
                "ddptop attach --k8s NAME --logs-only")


Transport = Ssh | Srun | Kubectl

# what a launcher says when the program it was to run does not exist
NOT_FOUND = ("command not found", "No such file or directory", "executable file not found", "No module named ddptop",
             "exec: \"", "execve(): ")
