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

from ddptop import __version__
from ddptop.core import journal

# torchrun options that take no value (kept in sync with torch's parser by
# tests/test_launcher.py::test_flag_list_matches_torchrun).
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
_PKG_ROOT = str(Path(__file__).resolve().parents[2])
_SUPERVISOR_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from ddptop.core.supervisor import main; sys.exit(main(sys.argv[2]))"
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
            flags.add(_norm(name))
            options.append(a)
            i += 1
            continue
        if eq:
            i += 1
        else:
            if i + 1 >= len(args):
                raise LaunchError(f"torchrun option {a} needs a value")
            val = args[i + 1]
            i += 2
        if name in OWNED:
            dropped += [name, val]
            values[OWNED[name]] = val
            continue
        values[_norm(name)] = val
        options += [a] if eq else [a, val]
    if i >= len(args):
        raise LaunchError("no training script given: usage is `ddptop torchrun [TORCHRUN OPTIONS] SCRIPT [ARGS]`")
    return TorchrunArgs(options, args[i], args[i + 1 :], values, flags, dropped)


def _int_or_none(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


@dataclass
class LaunchPlan:
    command: list[str]
    env_set: dict[str, str]
    log_dir: Path
    nproc_per_node: int | None
    node_rank: int | None
    notes: list[str]


INJECT_DIR = str(Path(__file__).resolve().parents[1] / "_inject")


def plan_launch(user_command: list[str], run_dir: Path, cwd: str | None = None, inject: bool = True) -> LaunchPlan:
    """Check the command and build what will run.  Raises LaunchError early."""
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
    log_dir = run_dir / journal.LOGS
    notes = []
    if targs.dropped:
        notes.append(
            "ddptop captures rank output itself and replaced "
            + " ".join(targs.dropped)
            + f" with --log-dir {log_dir} --redirects 3"
        )
    command = [
        torchrun,
        "--log-dir",
        str(log_dir),
        "--redirects",
        "3",
        *targs.options,
        targs.script,
        *targs.script_args,
    ]
    env_set = {}
    if os.environ.get("PYTHONUNBUFFERED") is None:
        env_set["PYTHONUNBUFFERED"] = "1"
    env_set["DDPTOP_BEAT_DIR"] = str(run_dir / journal.BEATS)  # where ddptop.beat() writes
    if inject:
        old = os.environ.get("PYTHONPATH")
        env_set["PYTHONPATH"] = INJECT_DIR + (os.pathsep + old if old else "")
    nproc = _int_or_none(targs.values.get("--nproc-per-node"))
    node_rank = _int_or_none(targs.values.get("--node-rank"))
    if node_rank is None and _int_or_none(targs.values.get("--nnodes")) in (None, 1):
        node_rank = 0
    return LaunchPlan(command, env_set, log_dir, nproc, node_rank, notes)


def launch(user_command: list[str], run_dir: Path | None = None, *, gpu: str = "auto",
           sample_interval: float = 1.0, stall_after: float | None = None, on_stall: str = "alarm",
           inject: bool = True, notify_cmd: list[str] | None = None) -> Path:
    """Create the journal and start the supervisor in its own session.

    Returns the run directory.  The supervisor (``ddptop.core.supervisor``)
    owns the job from then on, so the job outlives this process.
    """
    # check everything before creating anything
    plan_launch(user_command, Path(run_dir or "/nonexistent"), inject=inject)
    run_dir = journal.create_run_dir(run_dir)
    plan = plan_launch(user_command, run_dir, inject=inject)
    (run_dir / journal.BEATS).mkdir(mode=0o700)
    meta = journal.Meta(
        run_id=run_dir.name,
        command=plan.command,
        user_command=list(user_command),
        env_set=plan.env_set,
        cwd=os.getcwd(),
        host=journal.hostname(),
        started=time.time(),
        log_dir=str(plan.log_dir),
        nproc_per_node=plan.nproc_per_node,
        node_rank=plan.node_rank,
        ddptop_version=__version__,
        gpu=gpu,
        sample_interval=sample_interval,
        stall_after=stall_after,
        on_stall=on_stall,
        inject=inject,
        notify_cmd=notify_cmd,
    )
    journal.write_json(run_dir / journal.META, meta.to_dict())
    with open(run_dir / journal.EVENTS, "a", encoding="utf-8") as f:
        from ddptop.core.events import NoteEvent

        for n in plan.notes:
            f.write(NoteEvent(time.time(), "warning", n).to_json() + "\n")
    with open(run_dir / "supervisor.log", "ab") as err:
        subprocess.Popen(
            [sys.executable, "-c", _SUPERVISOR_BOOT, _PKG_ROOT, str(run_dir)],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            close_fds=True,
            cwd=meta.cwd,
        )
    return run_dir
