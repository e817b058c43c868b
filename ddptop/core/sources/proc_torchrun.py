"""torchrun from outside: its processes, its options, and what a rank process is.

* recognising a torchrun (elastic agent) process from its command line, and
  whether ddptop launched it (:func:`torchrun_args`, :func:`is_torchrun`,
  :func:`launched_by_ddptop`);
* finding this user's running torchrun jobs, their ranks and data-loader
  workers (:func:`find_torchruns`, :func:`torchrun_jobs`,
  :func:`job_workers`: ``ddptop attach`` and the doctor's CPU budget);
* torchrun's options, from its arguments or its ``PET_*`` variables
  (:func:`parse_torchrun_options`);
* the one definition of a rank process (:func:`is_rank`, :func:`rank_env`),
  used by the supervisor of a launched job and by the pid session.

Nothing here starts, stops or signals a process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ddptop.core.model import run_dirs
from ddptop.core.model.settings import BEAT_DIR
from ddptop.core.sources.proc_tree import alive

__all__ = ["RANK_VARS", "JobWorkers", "TorchrunOptions", "describe", "find_torchruns", "is_rank", "is_torchrun",
           "job_workers", "launched_by_ddptop", "parse_torchrun_options", "rank_env", "running_job_workers",
           "torchrun_args", "torchrun_jobs"]

_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_SCRIPTS = ("/torch/distributed/run.py", "/torch/distributed/launch.py")
# torchrun options read here (normalised: no dashes, "_" for "-"), and the PET_* variable of each
_OPTIONS = ("log_dir", "redirects", "tee", "nproc_per_node", "nnodes", "node_rank", "rdzv_id")
_SHORT = {"-r": "redirects", "-t": "tee"}
# what a rank's environment says about it (rank_env keeps these)
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "CUDA_VISIBLE_DEVICES",
             "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID")


# torchrun options that take no value (kept in sync with torch's parser by
# tests/unit/test_launcher.py::test_flag_list_matches_torchrun).
TORCHRUN_FLAGS = frozenset(
    {
        "--standalone",
        "--no-python",
        "--no_python",
        "-m",
        "--module",
        "--run-path",
        "--run_path",
        "--virtual-local-rank",
        "--virtual_local_rank",
        "-h",
        "--help",
    }
)


def scan_torchrun_args(args: list[str]) -> tuple[list[tuple[str, str | None, list[str]]], int, str | None]:
    """torchrun's options as (name, value or None for a flag, the tokens as
    written), the index of the first argument after them (the script), and the
    option left without its value at the end of ``args`` (None if none was)."""
    opts: list[tuple[str, str | None, list[str]]] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a == "-":
            break
        name, eq, val = a.partition("=")
        if name in TORCHRUN_FLAGS:
            opts.append((name, None, [a]))
            i += 1
        elif eq:
            opts.append((name, val, [a]))
            i += 1
        elif i + 1 >= len(args):
            return opts, i, a
        else:
            opts.append((name, args[i + 1], [a, args[i + 1]]))
            i += 2
    return opts, i, None


# -- recognising torchrun -------------------------------------------------------


def torchrun_args(cmdline: list[str]) -> list[str] | None:
    """The arguments given to torchrun if ``cmdline`` is a torchrun (elastic
    agent) process: ``torchrun ...``, ``python .../bin/torchrun ...``,
    ``python -m torch.distributed.run ...`` (or ``.launch``).  None otherwise."""
    if not cmdline:
        return None
    if os.path.basename(cmdline[0]) == "torchrun":
        return list(cmdline[1:])
    if not os.path.basename(cmdline[0]).startswith("python"):
        return None  # a wrapper (timeout, nohup -> exec'd, srun...) is not torchrun itself
    if len(cmdline) > 1 and os.path.basename(cmdline[1]) == "torchrun":
        return list(cmdline[2:])
    i = 1
    while i < len(cmdline):
        a = cmdline[i]
        if a == "-m":
            return list(cmdline[i + 2:]) if i + 1 < len(cmdline) and cmdline[i + 1] in _MODULES else None
        if a.startswith("-m"):
            return list(cmdline[i + 1:]) if a[2:] in _MODULES else None
        if a == "-c":
            return None  # python -c CODE
        if not a.startswith("-"):
            return list(cmdline[i + 1:]) if a.endswith(_SCRIPTS) else None  # python SCRIPT
        i += 2 if a in ("-X", "-W", "--check-hash-based-pycs") else 1
    return None


def is_torchrun(proc: psutil.Process) -> bool:
    try:
        return torchrun_args(proc.cmdline()) is not None
    except psutil.Error:
        return False


def launched_by_ddptop(proc: psutil.Process) -> Path | None:
    """The run directory of a torchrun that ddptop launched, else None."""
    try:
        beats = proc.environ().get(BEAT_DIR)
    except (psutil.Error, OSError):
        beats = None
    if beats:
        run = Path(beats).parent
        if (run / run_dirs.META).is_file():
            return run
    try:
        parent = proc.parent()
        pcmd = parent.cmdline() if parent is not None else []
    except psutil.Error:
        pcmd = []
    if any("ddptop.core.run.supervisor" in a for a in pcmd) and pcmd and (Path(pcmd[-1]) / run_dirs.META).is_file():
        return Path(pcmd[-1])
    return None


def find_torchruns() -> list[psutil.Process]:
    """This user's running torchrun processes that ddptop did not launch, oldest first."""
    out = []
    for p in reversed(torchrun_jobs()):
        try:
            if alive(p) and launched_by_ddptop(p) is None:
                out.append(p)
        except psutil.Error:
            continue
    return out


# -- a running job's ranks and data-loader workers (ddptop doctor's CPU budget) --


@dataclass
class JobWorkers:
    torchrun_pid: int
    ranks: int
    workers_per_rank: int  # the most data-loader (child) processes any rank has


def torchrun_jobs(uid: int | None = None) -> list[psutil.Process]:
    """This user's running torchrun processes, newest first, those ddptop
    launched too (the doctor counts the workers of any job, wherever it was
    started; :func:`find_torchruns` keeps those ddptop did not launch)."""
    uid = os.getuid() if uid is None else uid
    out = []
    for p in psutil.process_iter(["cmdline", "uids", "create_time"]):
        try:
            uids = p.info.get("uids")
            if uids is None or uids.real != uid or p.pid == os.getpid():
                continue
            if torchrun_args(p.info.get("cmdline") or []) is not None:
                out.append(p)
        except psutil.Error:
            continue
    out.sort(key=lambda p: (p.info.get("create_time") or 0, p.pid), reverse=True)
    return out


def job_workers(proc: psutil.Process) -> JobWorkers | None:
    """A torchrun's ranks (its children) and the most child processes (data-loader workers) any rank has."""
    try:
        ranks = proc.children()
    except psutil.Error:
        return None
    per = []
    for r in ranks:
        try:
            per.append(len(r.children(recursive=True)))
        except psutil.Error:
            per.append(0)
    return JobWorkers(proc.pid, len(ranks), max(per, default=0))


def running_job_workers() -> JobWorkers | None:
    """The ranks and workers of this user's newest running torchrun, None when none runs."""
    jobs = torchrun_jobs()
    return job_workers(jobs[0]) if jobs else None


def describe(proc: psutil.Process, width: int = 100) -> str:
    """``PID  STARTED  COMMAND`` for a listing."""
    try:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(proc.create_time()))
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        started, cmd = "?", "(gone)"
    if len(cmd) > width:
        cmd = cmd[: width - 3] + "..."
    return f"{proc.pid:>8}  {started}  {cmd}"


# -- rank processes -------------------------------------------------------------


def is_rank(env: Mapping[str, str], *, under_torchrun: bool = True) -> bool:
    """Whether a process with environment ``env`` is a rank process.

    A rank of a torchrun job has both ``RANK`` and ``LOCAL_RANK``: torchrun's
    elastic agent (``LocalElasticAgent._start_workers``) sets both, with
    ``WORLD_SIZE``, ``GROUP_RANK``, ``LOCAL_WORLD_SIZE`` and
    ``TORCHELASTIC_RESTART_COUNT``, in every worker's environment.  A child of
    torchrun without both is not one of its workers.

    ``under_torchrun=False`` is for a process with no torchrun above it
    (started by srun, mpirun or a script), attached by pid as a one-rank job:
    such launchers set ``RANK`` but need not set ``LOCAL_RANK``, so only
    ``RANK`` is required there (the pid session then takes the local rank to be
    the rank).
    """
    return "RANK" in env and (not under_torchrun or "LOCAL_RANK" in env)


def local_rank(env: Mapping[str, str], *, virtual: bool = False) -> int | None:
    """A worker's local rank (the index of its ``attempt_N/<local rank>/``
    log directory): ``LOCAL_RANK``, except under torchrun's
    ``--virtual-local-rank``, where every worker's ``LOCAL_RANK`` is 0 (each
    sees its own GPU as device 0): there it is ``RANK`` less the node's first
    global rank, ``GROUP_RANK`` x ``LOCAL_WORLD_SIZE`` (torchrun gives each
    node's workers consecutive ranks).  None when the environment does not say."""
    def num(k: str) -> int | None:
        try:
            return int(env[k])
        except (KeyError, ValueError):
            return None
    local = num("LOCAL_RANK")
    rank, group, width = num("RANK"), num("GROUP_RANK"), num("LOCAL_WORLD_SIZE")
    if virtual and rank is not None and group is not None and width:
        derived = rank - group * width
        if 0 <= derived < width:
            return derived
    return local


def virtual_local_rank(args: list[str]) -> bool:
    """torchrun's arguments (before the script) ask for ``--virtual-local-rank``."""

    opts, _, _ = scan_torchrun_args(args)
    return any(name in ("--virtual-local-rank", "--virtual_local_rank") for name, _, _ in opts)


def rank_env(proc: psutil.Process, *, under_torchrun: bool = True) -> dict[str, str] | None:
    """The :data:`RANK_VARS` in ``proc``'s environment if it is a rank
    process (:func:`is_rank`); None when it is not, or its environment cannot
    be read."""
    try:
        env = proc.environ()
    except (psutil.Error, OSError):
        return None
    if not is_rank(env, under_torchrun=under_torchrun):
        return None
    return {k: env[k] for k in RANK_VARS if k in env}


# -- torchrun's options ---------------------------------------------------------


@dataclass
class TorchrunOptions:
    log_dir: str | None = None
    redirects: str | None = None
    tee: str | None = None
    nproc_per_node: str | None = None
    nnodes: str | None = None
    node_rank: str | None = None
    rdzv_id: str | None = None
    script: list[str] = field(default_factory=list)  # the training script and its arguments


def parse_torchrun_options(args: list[str], env: dict[str, str] | None = None) -> TorchrunOptions:
    """The options ddptop needs, from torchrun's arguments (``--x v``, ``--x=v``,
    ``--x_y`` spellings) or else from torchrun's ``PET_*`` variables."""

    opts, i, _lacking = scan_torchrun_args(args)  # (a job that runs has every value it needs)
    got: dict[str, str] = {}
    for name, val, _tokens in opts:
        key = _SHORT.get(name) or name.lstrip("-").replace("-", "_")
        if val is not None and key in _OPTIONS:
            got[key] = val
    env = env or {}
    for key in _OPTIONS:
        if key not in got and env.get("PET_" + key.upper()):
            got[key] = env["PET_" + key.upper()]
    return TorchrunOptions(**got, script=list(args[i:]))
