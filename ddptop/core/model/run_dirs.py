"""Where runs live and what a run directory holds: the names of its files, the
runs home, and the one way a private directory is made in it.  The journal
(``ddptop.core.run.journal``) reads and writes these files; the probes that
keep stack samples and RAS answers beside a run make their directories here.
"""

from __future__ import annotations

import os
from pathlib import Path

from ddptop.core.model.settings import settings

META = "meta.json"
EVENTS = "events.jsonl"
TORCHRUN_LOG = "torchrun.log"
LOGS = "logs"
SUPERVISOR = "supervisor.json"
EXIT = "exit.json"
RELAUNCH = "relaunch.json"  # a relaunch request: {"profiles": [...], "reason": ...}, then SIGUSR1
READERS = "readers"  # readers/<pid>: an agent streaming the run to a client (gone once it has sent the end)
BEATS = "beats"  # hook.<rank> / beat.<rank>: "<step> <unix time>", rewritten in place
# the real command lines when meta.json shows them masked (secret-named options): 0600, read
# only by the supervisor (relaunch) and `ddptop fix`; no viewer, agent or event shows it
PRIVATE_ARGV = "argv.private.json"


def state_home() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "ddptop"


def runs_home() -> Path:
    override = settings().runs_dir
    return override if override is not None else state_home() / "runs"


def check_owner(path: Path) -> None:
    """Refuse a runs directory that belongs to another user: what ddptop writes
    there (commands, logs, stacks) would be theirs to read or replace."""
    try:
        uid = Path(path).stat().st_uid
    except OSError:
        return
    if uid != os.getuid():
        raise JournalError(f"{path} belongs to another user (uid {uid}), not to you (uid {os.getuid()}): ddptop keeps "
                           "runs only in a directory of yours; set DDPTOP_RUNS_DIR or use --run-dir")


def make_private_dir(path: Path) -> Path:
    """Create ``path`` and any missing parent, each mode 0700 (whatever the umask).
    Under the runs home, a home or parent of another user's is refused (JournalError)."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    home = runs_home()
    if path == home or home in path.parents:
        check_owner(home)
        check_owner(p)
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)
    return path


class JournalError(Exception):
    pass


class NoSuchRun(JournalError):
    """The run named is not there (on a node whose container restarted: gone with it)."""
