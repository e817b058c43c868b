"""Turn `torchrun ARGS SCRIPT ARGS` into the command ddptop runs, and start it.

ddptop passes the person's torchrun arguments through unchanged and adds only
``--log-dir RUN/logs --redirects 3`` so that every rank writes its own stdout
and stderr straight into the run journal, plus ``PYTHONUNBUFFERED=1`` in the
environment so the lines printed just before a hang are in the file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import ddptop
from ddptop import __version__
from ddptop.core.model import run_dirs
from ddptop.core.model.events import NoteEvent
from ddptop.core.model.run_meta import Meta
from ddptop.core.model.settings import BEAT_DIR, PG_BACKEND, PG_TIMEOUT, thresholds
from ddptop.core.run import journal
from ddptop.core.run.profiles import is_secret, mask_argv, mask_env, rewrite_script_args
from ddptop.core.sources.proc_torchrun import (
    TORCHRUN_FLAGS,
    TorchrunOptions,
    parse_torchrun_options,
    scan_torchrun_args,
)
from ddptop.core.sources.ras_client import free_port

# the options ddptop sets itself (their values are replaced, with a note)
OWNED = {
    "--log-dir": "log_dir",
    "--log_dir": "log_dir",
    "--redirects": "redirects",
    "-r": "redirects",
    "--tee": "tee",
    "-t": "tee",
}


# start the supervisor from this very ddptop, installed or not, without
# touching the PYTHONPATH that the job inherits
_PKG_ROOT = str(Path(ddptop.__file__).resolve().parents[1])
_SUPERVISOR_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from ddptop.core.run.supervisor import main; sys.exit(main(sys.argv[2]))"
)


class LaunchError(Exception):
    """A launch that cannot start; the message says why and what to do."""


@dataclass
class TorchrunArgs:
    options: list[str]  # torchrun options, as given, minus those ddptop owns
    script: str
    script_args: list[str]
    values: dict[str, str] = field(default_factory=dict)  # --opt -> value (normalised name)
    flags: set[str] = field(default_factory=set)
    dropped: list[str] = field(default_factory=list)  # owned options the person gave


def _norm(opt: str) -> str:
    return opt.replace("_", "-")


def parse_torchrun_args(args: list[str]) -> TorchrunArgs:
    options: list[str] = []
    values: dict[str, str] = {}
    flags: set[str] = set()
    dropped: list[str] = []
    opts, i, lacking = scan_torchrun_args(args)
    if lacking:
        raise LaunchError(f"torchrun option {lacking} needs a value")
    for name, val, tokens in opts:
        if val is None:
            flags.add(_norm(name))
            options += tokens
        elif name in OWNED:
            dropped += [name, val]
            values[OWNED[name]] = val
        else:
            values[_norm(name)] = val
            options += tokens
    if i >= len(args):
        raise LaunchError("no training script given: usage is `ddptop torchrun [TORCHRUN OPTIONS] SCRIPT [ARGS]`")
    return TorchrunArgs(options, args[i], args[i + 1 :], values, flags, dropped)


def launch_options(command: list[str] | tuple[str, ...], env: Mapping[str, str]) -> TorchrunOptions | None:
    """A launch command's torchrun options (``parse_torchrun_options``: its own, else torchrun's ``PET_*``
    variables in ``env``; a finished run's: ``Meta.launch_env()``); None when it names no script (not a
    command it can read)."""
    o = parse_torchrun_options(list(command[1:]), dict(env))
    return o if o.script else None


def _int_or_none(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


@dataclass
class LaunchPlan:
    command: list[str]
    env_set: dict[str, str]
    env_unset: list[str]
    log_dir: Path
    nproc_per_node: int | None
    node_rank: int | None
    notes: list[str]


INJECT_DIR = str(Path(ddptop.__file__).resolve().parent / "_inject")


def _override_options(options: list[str], overrides: dict[str, str]) -> list[str]:
    """Replace the values of torchrun options (any spelling), appending missing ones."""
    out = list(options)
    for opt, val in overrides.items():
        want = _norm(opt)
        done = False
        i = 0
        while i < len(out):
            name, eq, _ = out[i].partition("=")
            if _norm(name) == want and name not in TORCHRUN_FLAGS:
                if eq:
                    out[i] = f"{name}={val}"
                elif i + 1 < len(out):
                    out[i + 1] = val
                done = True
                i += 1 if eq else 2
                continue
            i += 1
        if not done:
            out += [opt, val]
    return out


def plan_launch(user_command: list[str], run_dir: Path, cwd: str | None = None, inject: bool = True,
                profiles: list | None = None, ras_addr: str | None = None) -> LaunchPlan:
    """Check the command and build what will run.  Raises LaunchError early.
    ``ras_addr``: NCCL's RAS address to keep (a relaunch); by default a free
    local port, unless the user set NCCL_RAS_ADDR or turned RAS off."""
    if not user_command or Path(user_command[0]).name != "torchrun":
        raise LaunchError("expected `ddptop [OPTIONS] torchrun [TORCHRUN OPTIONS] SCRIPT [ARGS]`")
    cwd = cwd or os.getcwd()
    exe = user_command[0]
    if os.sep in exe:
        torchrun = exe if os.access(exe, os.X_OK) else None
    else:
        torchrun = shutil.which(exe)
    if torchrun is None:
        raise LaunchError(
            f"{exe}: not found on PATH. Install PyTorch (`pip install torch`) or activate "
            "the environment that has it, then try again. Nothing was started."
        )
    targs = parse_torchrun_args(user_command[1:])
    if "module" not in targs.flags and "-m" not in targs.flags:
        if "no-python" in targs.flags:
            if shutil.which(targs.script) is None and not os.access(
                os.path.join(cwd, targs.script), os.X_OK
            ):
                raise LaunchError(f"{targs.script}: no such executable. Nothing was started.")
        elif not os.path.isfile(os.path.join(cwd, targs.script)):
            raise LaunchError(f"{targs.script}: no such file (in {cwd}). Nothing was started.")
    log_dir = run_dir / run_dirs.LOGS
    notes = []
    if targs.dropped:
        notes.append(
            "ddptop captures rank output itself and replaced "
            + " ".join(targs.dropped)
            + f" with --log-dir {log_dir} --redirects 3"
        )
    options, script_args = targs.options, targs.script_args
    env_set: dict[str, str] = {}
    env_unset: list[str] = []
    for prof in profiles or ():
        for k, v in prof.env_for(run_dir).items():
            env_set[k] = v
            if k in env_unset:
                env_unset.remove(k)
        for k in prof.unset:
            env_set.pop(k, None)
            env_unset.append(k)
        options = _override_options(options, prof.torchrun_args)
        for k, v in prof.torchrun_args.items():
            targs.values[_norm(k)] = v
        script_args = rewrite_script_args(script_args, prof.script_args)
        if prof.backend or prof.pg_timeout:
            if not inject:
                raise LaunchError(f"profile {prof.name!r} overrides init_process_group through ddptop's hook, "
                                  "which --no-inject turns off")
            if prof.backend:
                env_set[PG_BACKEND] = prof.backend
            if prof.pg_timeout:
                env_set[PG_TIMEOUT] = str(prof.pg_timeout)
    command = [
        torchrun,
        "--log-dir",
        str(log_dir),
        "--redirects",
        "3",
        *options,
        targs.script,
        *script_args,
    ]
    if os.environ.get("PYTHONUNBUFFERED") is None:
        env_set["PYTHONUNBUFFERED"] = "1"
    if ("NCCL_RAS_ADDR" not in env_set and os.environ.get("NCCL_RAS_ADDR") is None
            and env_set.get("NCCL_RAS_ENABLE", os.environ.get("NCCL_RAS_ENABLE")) != "0"):
        # NCCL's RAS port, one per launch: two jobs on a node would otherwise share 28028 and
        # a query could land on the other job's processes (a relaunch keeps the first's)

        env_set["NCCL_RAS_ADDR"] = ras_addr or f"127.0.0.1:{free_port()}"
    env_set[BEAT_DIR] = str(run_dir / run_dirs.BEATS)  # where ddptop.beat() writes
    if inject:
        old = os.environ.get("PYTHONPATH")
        env_set["PYTHONPATH"] = INJECT_DIR + (os.pathsep + old if old else "")
    # the job's shape: its options, else torchrun's PET_* variables in the environment it gets (a Kubeflow
    # PyTorchJob's pod, a script that exports them)
    shape = parse_torchrun_options(command[1:], job_environment(env_set, env_unset))
    nproc = _int_or_none(shape.nproc_per_node)
    node_rank = _int_or_none(shape.node_rank)
    if node_rank is None and _int_or_none(shape.nnodes) in (None, 1):
        node_rank = 0
    return LaunchPlan(command, env_set, env_unset, log_dir, nproc, node_rank, notes)


def job_environment(env_set: Mapping[str, str], env_unset: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """The environment a launch's torchrun gets: this one, with what ddptop sets and unsets."""
    env = {**os.environ, **env_set}
    for k in env_unset:
        env.pop(k, None)
    return env


def torchrun_variables(env: Mapping[str, str]) -> dict[str, str]:
    """torchrun's own variables (``PET_*``: each of its options, where the command gives none) in ``env``."""
    return {k: v for k, v in env.items() if k.startswith("PET_")}


def launch(user_command: list[str], run_dir: Path | None = None, *, gpu: str = "auto",
           sample_interval: float = 1.0, stall_after: float | None = None, on_stall: str = "alarm",
           inject: bool = True, notify_cmd: list[str] | None = None, profiles: list | None = None,
           max_relaunches: int | None = None) -> Path:
    """Create the journal and start the supervisor in its own session.

    Returns the run directory.  The supervisor (``ddptop.core.run.supervisor``)
    owns the job from then on, so the job outlives this process.
    """
    # check everything before creating anything
    plan_launch(user_command, Path(run_dir or "/nonexistent"), inject=inject, profiles=profiles)
    run_dir = journal.create_run_dir(run_dir)
    plan = plan_launch(user_command, run_dir, inject=inject, profiles=profiles)
    if any(k.startswith(("TORCH_FR_DUMP", "TORCH_NCCL_DEBUG_INFO")) for k in plan.env_set):
        (run_dir / "flight").mkdir(mode=0o700, exist_ok=True)
    (run_dir / run_dirs.BEATS).mkdir(mode=0o700)
    shown_command, shown_user = mask_argv(plan.command), mask_argv(user_command)
    if shown_command != list(plan.command) or shown_user != list(user_command):
        journal.write_private_argv(run_dir, plan.command, user_command)  # the real ones, 0600
    meta = Meta(
        run_id=run_dir.name,
        command=shown_command,  # secret-named options' values masked
        user_command=shown_user,
        env_set=mask_env(plan.env_set),  # secrets never reach the journal in clear
        torchrun_env=mask_env(torchrun_variables(job_environment(plan.env_set, plan.env_unset))),
        cwd=os.getcwd(),
        host=journal.hostname(),
        started=time.time(),
        log_dir=str(plan.log_dir),
        nproc_per_node=plan.nproc_per_node,
        node_rank=plan.node_rank,
        ddptop_version=__version__,
        thresholds=thresholds().to_dict(),
        gpu=gpu,
        sample_interval=sample_interval,
        stall_after=stall_after,
        on_stall=on_stall,
        inject=inject,
        notify_cmd=notify_cmd,
        profiles=[p.name for p in profiles or ()],
        env_unset=plan.env_unset,
        max_relaunches=max_relaunches,
    )
    journal.write_json(run_dir / run_dirs.META, meta.to_dict())
    with open(run_dir / run_dirs.EVENTS, "a", encoding="utf-8") as f:

        for n in plan.notes:
            f.write(NoteEvent(time.time(), "warning", n).to_json() + "\n")
    # secret values travel to the supervisor in its environment, not in the journal
    sup_env = dict(os.environ)
    sup_env.update({k: v for k, v in plan.env_set.items() if is_secret(k)})
    with open(run_dir / "supervisor.log", "ab") as err:
        subprocess.Popen(
            [sys.executable, "-c", _SUPERVISOR_BOOT, _PKG_ROOT, str(run_dir)],
            env=sup_env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            close_fds=True,
            cwd=meta.cwd,
        )
    return run_dir
