"""The run journal: one directory per launch, the source of truth.

Layout of a run directory::

    meta.json        the exact torchrun command, the env vars ddptop set, cwd, host
    events.jsonl     events written by the supervisor (state, rank), write-through
    torchrun.log     torchrun's own stdout and stderr
    logs/<id>/attempt_N/<local_rank>/{stdout,stderr}.log   every rank's output,
                     written by the rank itself (torchrun --log-dir/--redirects)
    supervisor.json  pid and start time of the supervisor that owns the job
    exit.json        the final state and exit code, written once the job ends
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ddptop.core.model.run_dirs import (
    EXIT,
    META,
    PRIVATE_ARGV,
    READERS,
    SUPERVISOR,
    JournalError,
    NoSuchRun,
    check_owner,
    make_private_dir,
    runs_home,
)
from ddptop.core.model.run_meta import Meta


def attached_dir(name: str) -> Path:
    """Where ddptop keeps what it captures of a job it did not launch (stacks)."""
    return runs_home() / "attached" / name


def new_run_id(now: float | None = None) -> str:
    now = time.time() if now is None else now
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{os.getpid() % 100000:05d}"


def create_run_dir(run_dir: Path | None) -> Path:
    """Create a fresh run directory, mode 0700.  Refuses to reuse a journal."""
    if run_dir is None:
        home = runs_home()
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        check_owner(home)
        base = new_run_id()
        run_dir = home / base
        n = 1
        while run_dir.exists():
            n += 1
            run_dir = home / f"{base}.{n}"
    run_dir = Path(run_dir).absolute()
    if (run_dir / META).exists():
        raise JournalError(f"{run_dir} already holds a ddptop run; choose another --run-dir")
    check_owner(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(run_dir, 0o700)
    return run_dir


def is_run(path: Path) -> bool:
    """Whether ``path`` is a ddptop run directory: its meta.json is ddptop's (a run id and a command), not
    another tool's file of that name (a folder of someone's logs or stack dumps may hold one)."""
    d = read_json(Path(path) / META)
    return isinstance(d, dict) and isinstance(d.get("run_id"), str) and isinstance(d.get("command"), list)


def resolve_run(ref: str) -> Path:
    """A run id, a run directory, or 'latest' -> the run directory."""
    p = Path(ref).expanduser()
    if is_run(p):
        return p.absolute()
    home = runs_home()
    if ref in ("latest", "last"):
        runs = sorted((d for d in home.glob("*") if is_run(d)), key=lambda d: d.stat().st_mtime)
        if not runs:
            raise JournalError(f"no runs under {home}")
        return runs[-1]
    if is_run(home / ref):
        return home / ref
    raise NoSuchRun(f"no ddptop run called {ref!r} (looked for {p} and under {home})")


def first_run_after(t: float) -> Path | None:
    """The first run begun after ``t`` (its meta's ``started``, this machine's
    clock), None when none has yet: the next attempt of a node whose
    container restarted.  Runs are taken in the order they began, so that
    no attempt is skipped."""
    found: list[tuple[float, Path]] = []
    for d in runs_home().glob("*"):
        meta = read_json(d / META)
        started = meta.get("started") if isinstance(meta, dict) else None
        if isinstance(started, (int, float)) and not isinstance(started, bool) and started > t:
            found.append((float(started), d))
    return min(found)[1] if found else None


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None


def write_private_argv(run_dir: Path, command: list[str], user_command: list[str]) -> None:
    fd = os.open(run_dir / PRIVATE_ARGV, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"command": list(command), "user_command": list(user_command)}, f)


def real_argv(run_dir: Path, meta: Meta) -> tuple[list[str], list[str]]:
    """(command, user_command) as typed: from the private file when meta.json
    shows them masked, else meta's own."""
    d = read_json(run_dir / PRIVATE_ARGV)
    if isinstance(d, dict) and all(isinstance(d.get(k), list) and all(isinstance(x, str) for x in d[k])
                                   for k in ("command", "user_command")):
        return list(d["command"]), list(d["user_command"])
    return list(meta.command), list(meta.user_command)


def load_meta(run_dir: Path) -> Meta:
    d = read_json(run_dir / META)
    if not isinstance(d, dict):
        raise JournalError(f"{run_dir / META} is missing or unreadable")
    try:
        meta = Meta.from_dict(d)
    except TypeError as e:
        raise JournalError(f"{run_dir / META} is damaged ({e})") from None
    return _moved(run_dir, meta)


def _moved(run_dir: Path, meta: Meta) -> Meta:
    """A run directory copied or moved elsewhere (off a cluster node, into a bug report) keeps its ranks'
    logs inside it, under the name the launch gave them, while the journal names where they were: read
    them from where they are now."""
    recorded = Path(meta.log_dir)
    if recorded.is_dir() or not recorded.name:
        return meta
    here = run_dir / recorded.name
    return replace(meta, log_dir=str(here)) if here.is_dir() else meta


_ATTEMPT_RE = re.compile(r"attempt_(\d+)$")


def rank_log_files(log_dir: Path) -> list[tuple[int, int, str, Path]]:
    """All per-rank log files under a torchrun --log-dir.

    Returns (attempt, local_rank, stream, path) sorted by attempt, rank, stream.
    """
    out = []
    if not log_dir.is_dir():
        return out
    for attempt_dir in log_dir.glob("*/attempt_*"):
        m = _ATTEMPT_RE.search(attempt_dir.name)
        if not m:
            continue
        attempt = int(m.group(1))
        for rank_dir in attempt_dir.iterdir():
            if not rank_dir.name.isdigit():
                continue
            for stream in ("stdout", "stderr"):
                f = rank_dir / f"{stream}.log"
                if f.is_file():
                    out.append((attempt, int(rank_dir.name), stream, f))
    out.sort(key=lambda x: (x[0], x[1], x[2]))
    return out


STARTUP_GRACE = 30.0  # seconds after launch in which a run without supervisor.json is still starting


def pid_matches(pid: int, create_time: float | None) -> bool:
    """``pid`` is still the process that was started at ``create_time`` (and not a zombie)."""
    import psutil

    try:
        p = psutil.Process(pid)
        if create_time is not None and abs(p.create_time() - create_time) > 0.01:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone, or not ours to look at: not the process that was started
        return False


def supervisor(run_dir: Path) -> dict | None:
    """supervisor.json, when it is there and well-formed: {"pid": int, "create_time": float|None}."""
    sup = read_json(run_dir / SUPERVISOR)
    if not isinstance(sup, dict) or not isinstance(sup.get("pid"), int) or isinstance(sup.get("pid"), bool):
        return None
    ct = sup.get("create_time")
    return {"pid": sup["pid"], "create_time": ct if isinstance(ct, (int, float)) else None}


def supervisor_alive(run_dir: Path, started: float | None) -> bool:
    """The supervisor that owns the run is running (by pid and start time; a
    run launched a moment ago, before it wrote supervisor.json, counts too,
    unless its exit.json says it has ended)."""
    sup = supervisor(run_dir)
    if sup is None:
        return (not (run_dir / SUPERVISOR).exists() and not (run_dir / EXIT).exists()
                and time.time() - (started or 0) < STARTUP_GRACE)
    return pid_matches(sup["pid"], sup["create_time"])


def add_reader(run_dir: Path) -> Path | None:
    """Say that this process (an agent) streams the run: ``readers/<pid>``
    with its start time, for ``wait_for_readers``.  None when it cannot."""
    import psutil

    try:
        d = make_private_dir(Path(run_dir) / READERS)
        f = d / str(os.getpid())
        f.write_text(json.dumps({"pid": os.getpid(), "create_time": psutil.Process().create_time()}))
        return f
    except (OSError, JournalError, psutil.Error):
        return None


def wait_for_readers(run_dir: Path, timeout: float) -> bool:
    """Until every live agent streaming the run has sent its end (removed its
    ``readers/`` file), or ``timeout`` seconds: a launching ddptop that is a
    container's first process ends the container, and the agents exec'd into
    it with it.  True when none is left."""
    deadline = time.monotonic() + timeout
    while True:
        live = []
        for f in (Path(run_dir) / READERS).glob("*"):
            d = read_json(f)
            if isinstance(d, dict) and isinstance(d.get("pid"), int) and isinstance(d.get("create_time"), (int, float)) \
                    and pid_matches(d["pid"], d["create_time"]):
                live.append(f)
        if not live:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


@dataclass(frozen=True)
class RunState:
    state: str  # running, or a final state (succeeded, failed, stopped, lost)
    exit_code: int | None = None
    message: str = ""

    @property
    def final(self) -> bool:
        return self.state != "running"


LOST_MESSAGE = "the supervisor ended without recording an exit status"


def recorded_exit(run_dir: Path) -> RunState | None:
    """The final state the supervisor recorded in exit.json, if it did."""
    ex = read_json(run_dir / EXIT)
    if not isinstance(ex, dict) or not isinstance(ex.get("state"), str):
        return None
    code = ex.get("exit_code")
    return RunState(ex["state"], code if isinstance(code, int) and not isinstance(code, bool) else None,
                    str(ex.get("message") or ""))


def run_state(run_dir: Path) -> RunState:
    """Running or how it ended, decided by the supervisor's liveness (pid and
    start time), never by the mere absence of exit.json.  Reads only."""
    rec = recorded_exit(run_dir)
    if rec is not None:
        return rec
    meta = read_json(run_dir / META)
    started = meta.get("started") if isinstance(meta, dict) else None
    if supervisor_alive(run_dir, started if isinstance(started, (int, float)) else None):
        return RunState("running")
    return RunState("lost", None, LOST_MESSAGE)


def hostname() -> str:
    return socket.gethostname()
