"""The factory: what a person (or a remote client, through the agent) names -> a ``JobSession``.

``open_local`` turns a run id, a run directory, ``latest`` or a pid on this
machine into a session; ``open_target`` adds the remote forms (``HOST[:RUN]``,
several hosts as one job).  The CLI, the UI and the agent use them; the
session implementations never import this module (only the protocol).

Each kind of session is imported when one is opened: a person reading a run
(``ddptop attach RUN``: a replay, the TUI's first frame) does not wait for
the pid, ssh, cluster and pod sessions to load.
"""

from __future__ import annotations

import functools

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ddptop.core.model import run_dirs
from ddptop.core.model.session_protocol import JobSession
from ddptop.core.run import journal
from ddptop.core.run.run_session import Session

# -- opening one ---------------------------------------------------------------


class OpenError(Exception):
    """What the person named cannot be watched; the message says why (and what to do).
    ``code``: ``no-run`` when a run named is not there; ``not-yet`` when none is
    there to pick (a node whose ddptop has not begun its run)."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class WatchOptions:
    """Settings for watching a job that ddptop did not launch (it has no journal to say them)."""

    gpu: str = "auto"
    stall_after: float | None = None
    sample_interval: float = 1.0


@dataclass(frozen=True)
class Opened:
    session: JobSession
    notes: tuple[str, ...] = ()  # what the person should be told on stderr (what was picked, and why)


def _local_pid(pid: int, options: WatchOptions, resume: dict[str, int] | None) -> Opened:
    from ddptop.core.sessions.pid import ForeignSession
    from ddptop.core.sessions.pid_target import ForeignError, resolve_pid
    from ddptop.core.sources.proc_torchrun import launched_by_ddptop

    try:
        target = resolve_pid(pid)
        if target.torchrun is not None:
            run_dir = launched_by_ddptop(target.torchrun)
            if run_dir is not None:
                return Opened(Session.open(run_dir, resume=resume),
                              (f"torchrun pid {target.pid} was launched by ddptop: attaching to its run {run_dir}",))
        return Opened(ForeignSession(target, gpu=options.gpu, stall_after=options.stall_after,
                                     sample_interval=options.sample_interval, resume=resume))
    except ForeignError as e:
        raise OpenError(f"--pid {pid}: {e}") from None


def parse_pid_ref(ref: str) -> int | None:
    """``pid:N`` (or ``pid-N``) -> N; anything else -> None."""
    for prefix in ("pid:", "pid-"):
        if ref.startswith(prefix) and ref[len(prefix):].isdigit():
            return int(ref[len(prefix):])
    return None


def open_launch(cmd: list[str], run_dir: str | None = None, **launch_options: object) -> Opened:
    """A job ddptop launches now (``torchrun ...``): its supervisor started, its
    run journal opened.  ``launch_options``: those of ``Session.launch``
    (gpu, profiles, on_stall ...)."""
    from ddptop.core.run.launcher import LaunchError

    try:
        return Opened(Session.launch(cmd, Path(run_dir) if run_dir else None, **launch_options))
    except (LaunchError, run_dirs.JournalError) as e:
        raise OpenError(str(e)) from None


def open_local(ref: str = "", *, pid: int | None = None, options: WatchOptions = WatchOptions(),
               resume: dict[str, int] | None = None) -> Opened:
    """A job on this machine: a run id, a run directory, ``latest``, ``pid:N``,
    or (``pid``) any process of a torchrun job.  An empty ``ref`` and no pid:
    the newest ddptop run while it runs, else the one torchrun job ddptop did
    not launch, else the newest run (finished), to read it again."""

    if pid is None and ref:
        pid = parse_pid_ref(ref)
    if pid is not None:
        return _local_pid(pid, options, resume)
    if ref:
        try:
            return Opened(Session.open(journal.resolve_run(ref), resume=resume))
        except run_dirs.JournalError as e:
            raise OpenError(str(e), "no-run" if isinstance(e, run_dirs.NoSuchRun) else "") from None
    try:
        newest: Path | None = journal.resolve_run("latest")
    except run_dirs.JournalError:
        newest = None
    if newest is None or journal.run_state(newest).final:
        from ddptop.core.sources.proc_torchrun import describe, find_torchruns

        found = find_torchruns()
        if len(found) == 1:
            p = found[0]
            opened = _local_pid(p.pid, options, resume)
            return Opened(opened.session, (f"attaching to torchrun pid {p.pid} (not launched by ddptop)",))
        if len(found) > 1:
            rows = "\n".join(describe(p) for p in found)
            raise OpenError(f"{len(found)} torchrun jobs that ddptop did not launch are running:\n"
                            f"{'PID':>8}  {'STARTED':19}  COMMAND\n{rows}\n"
                            f"pick one with `ddptop attach --pid PID`")
    if newest is None:
        raise OpenError(f"no runs under {run_dirs.runs_home()} and no torchrun job running here", "not-yet")
    try:
        return Opened(Session.open(newest, resume=resume))
    except run_dirs.JournalError as e:
        raise OpenError(str(e)) from None


@dataclass(frozen=True)
class AttachRequest:
    """What a person asked ``ddptop attach`` for."""

    targets: tuple[str, ...] = ()  # RUN, or HOST[:RUN] (several hosts: one job on several nodes)
    pid: int | None = None
    run: str | None = None  # run id on every host
    hosts: tuple[str, ...] = ()  # from --hosts-file: always remote
    ssh: tuple[str, ...] | None = None
    remote_cmd: str | None = None
    options: WatchOptions = field(default_factory=WatchOptions)
    slurm_job: str | None = None  # --slurm JOBID: its nodes (slurm_hosts), reached through srun unless via="ssh"
    slurm_hosts: tuple[str, ...] = ()
    via: str = "auto"  # auto | ssh | srun
    k8s: "K8sRequest | None" = None


@dataclass(frozen=True)
class K8sRequest:
    """``ddptop attach --k8s NAME`` (or ``-l SELECTOR``)."""

    name: str = ""
    selector: str = ""
    namespace: str = ""
    context: str = ""
    container: str = ""
    logs_only: bool = False  # follow the pods' logs (kubectl logs), for an image without ddptop
    restart_wait: float = 120.0  # seconds a pod whose run failed is waited for to come back (a next attempt)


def open_target(req: AttachRequest) -> Opened:
    """A local run, a local job by pid, or the runs on one or more remote nodes."""

    return _plan(req)()


def reaches_nodes(req: AttachRequest) -> bool:
    """Whether ``open_target(req)`` watches through links to other nodes (ssh, srun, kubectl), decided as it
    decides, without opening anything (the UI reads such a job in a process of its own).  Raises
    ``OpenError`` where ``open_target`` would, for what it can tell without opening."""

    return _plan(req).func in (_remote, _pods)


def _plan(req: AttachRequest) -> functools.partial[Opened]:
    """What ``open_target`` calls for ``req``."""

    if req.pid is not None and (req.targets or req.run or req.hosts):
        if len(req.targets) != 1 or req.run or req.hosts:
            raise OpenError("--pid takes one HOST at most (the job's node), and no RUN, --run, --hosts-file "
                            "or --slurm")
        try:
            journal.resolve_run(req.targets[0])
        except run_dirs.JournalError:
            return functools.partial(_remote, [f"{req.targets[0]}:pid:{req.pid}"], req)
        raise OpenError(f"--pid cannot be combined with a RUN ({req.targets[0]} is a ddptop run here)")
    if req.pid is not None:
        return functools.partial(open_local, pid=req.pid, options=req.options)
    if req.k8s is not None:
        return functools.partial(_pods, req)
    if not req.targets and not req.hosts and not req.slurm_hosts:
        return functools.partial(open_local, req.run or "", options=req.options)
    if len(req.targets) == 1 and not req.hosts and not req.slurm_hosts:
        ref = req.targets[0]
        if os.sep in ref or ref in ("latest", "last") or parse_pid_ref(ref) is not None:
            return functools.partial(open_local, ref, options=req.options)  # (this machine's, or an error)
        try:
            journal.resolve_run(ref)
        except run_dirs.JournalError:
            pass  # not a run here: a host
        else:
            return functools.partial(open_local, ref, options=req.options)
    return functools.partial(_remote, [*req.targets, *req.hosts], req)


FDS_PER_NODE = 4  # a node's link: its launcher's stdin, stdout and stderr pipes, and one more while it starts


def enough_files(nodes: int) -> str | None:
    """Raise this process's soft limit on open files to what ``nodes``
    links need (up to the hard limit) when it is lower: a login node's
    common 1,024 runs out at about 300 nodes (3 pipes each), and a node
    whose link cannot be opened is not watched.  What to do, in words, when even the hard
    limit is too low; None when there are enough."""
    need = FDS_PER_NODE * nodes + 64
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY or soft >= need:
            return None
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        if new > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    except (ImportError, OSError, ValueError):
        return None
    if soft >= need:
        return None
    return (f"{nodes} nodes' links need about {need} open files and this shell allows {soft} (ulimit -Hn): the "
            f"nodes past that are retried as links close; raise the limit (`ulimit -n {need}`) and attach again")


def _remote(targets: list[str], req: AttachRequest) -> Opened:
    from ddptop.core.sessions.cross_node import MultiSession
    from ddptop.core.sessions.ssh import RemoteSession, parse_target
    from ddptop.core.sessions.transports import Srun, check_host

    short = enough_files(len(targets) + len(req.slurm_hosts))
    sessions = []
    for t in targets:
        try:
            host, run = parse_target(t)
            check_host(host)
        except ValueError as e:
            raise OpenError(str(e)) from None
        if req.run and run == "latest":
            run = req.run
        sessions.append((host, run))
    opened = [RemoteSession(host, run, ssh=list(req.ssh) if req.ssh else None, remote_cmd=req.remote_cmd,
                            gpu=req.options.gpu) for host, run in sessions]
    notes = [f"attaching to {', '.join(h for h, _ in sessions)} over ssh"] if sessions else []
    if req.slurm_hosts:
        srun = shutil.which("srun")
        if req.via == "srun" and srun is None:
            raise OpenError("--via srun needs `srun` (SLURM's tools) on the PATH")
        use_srun = req.via == "srun" or (req.via == "auto" and srun is not None)
        for host in req.slurm_hosts:
            try:
                transport = Srun(str(req.slurm_job), host) if use_srun else None
                opened.append(RemoteSession(host, req.run or "latest", ssh=list(req.ssh) if req.ssh else None,
                                            remote_cmd=req.remote_cmd, gpu=req.options.gpu, transport=transport))
            except ValueError as e:
                raise OpenError(str(e)) from None
        how = f"through srun (job {req.slurm_job}, --overlap)" if use_srun else "over ssh (--via ssh)"
        notes.append(f"attaching to {', '.join(req.slurm_hosts)} {how}")
    if short:
        notes.append(short)
    if len(opened) == 1:
        return Opened(opened[0], tuple(notes))
    return Opened(MultiSession(opened, stall_after=req.options.stall_after), tuple(notes))


def _pods(req: AttachRequest) -> Opened:
    """The pods of a training job on Kubernetes, each a node, through ``kubectl exec``."""
    from ddptop.core.model.session_protocol import PodLogs
    from ddptop.core.sessions import k8s_pods as k8s
    from ddptop.core.sessions.cross_node import MultiSession
    from ddptop.core.sessions.pod_logs import PodLogsSession
    from ddptop.core.sessions.ssh import RemoteSession
    from ddptop.core.sessions.transports import Kubectl

    k = req.k8s
    assert k is not None
    try:
        what, pods = k8s.find_pods(k.name, k.selector, container=k.container, namespace=k.namespace,
                                   context=k.context)
    except (k8s.K8sError, ValueError) as e:
        raise OpenError(str(e)) from None
    found_by = k8s.job_selector(what, k.name) if k.name else k.selector  # (the pods' own labels, else these)
    if k.logs_only:

        watch = k8s.JobWatch(found_by, k.container, namespace=k.namespace, context=k.context)
        return Opened(PodLogsSession(k8s.base(namespace=k.namespace, context=k.context),
                                     PodLogs(found_by, k.namespace, k.context), pods, watch=watch.now,
                                     outlook=k8s.outlook, restart_wait=k.restart_wait),
                      (f"following the logs of {what} {k.name or k.selector} ({len(pods)} pods, each through kubectl logs -f): "
                       "LOGS ONLY (no GPU pane, no stacks, no stall alarm from silence)",))
    short = enough_files(len(pods))
    try:
        opened = [RemoteSession(p.node, req.run or "latest", remote_cmd=req.remote_cmd, gpu=req.options.gpu,
                                restart_wait=k.restart_wait,
                                transport=Kubectl(p.name, p.container, k.namespace, k.context,
                                                  watch=k8s.PodWatch(p, found_by, namespace=k.namespace,
                                                                     context=k.context)))
                  for p in pods]
    except ValueError as e:
        raise OpenError(str(e)) from None
    note = (f"attaching to {what} {k.name or k.selector}: "
            + ", ".join(f"{p.node} (pod {p.name}, container {p.container or '?'})" for p in pods)
            + " through kubectl exec")
    notes = (note, short) if short else (note,)
    if len(opened) == 1:
        return Opened(opened[0], notes)
    return Opened(MultiSession(opened, stall_after=req.options.stall_after), notes)
