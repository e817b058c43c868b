"""ddptop's settings: the one place the ``DDPTOP_*`` environment is read.

Two tables:

* ``USER``: what a person may set (where runs live, which py-spy, the ssh
  command, ...), read by ``settings()`` into one typed, frozen ``Settings``;
  a malformed value is a ``SettingError`` that names the variable and what it
  wants, never a crash deep inside a thread;
* the names ddptop itself sets, for the ranks it launches (``RANK_ENV``), for
  a ``--notify-cmd`` (``NOTIFY_ENV``) and for its benchmark's fault hooks
  (``BENCH_ENV``): named constants, so writer and reader spell them alike.

``settings()`` reads the environment each time it is called (cheap: a handful
of lookups), so a test or a caller that changes the environment sees it.
docs/usage.md lists the table.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from ddptop.core.model.run_meta import Thresholds

__all__ = ["Settings", "SettingError", "settings", "USER", "RANK_ENV", "NOTIFY_ENV", "BENCH_ENV",
           "BEAT_DIR", "PG_BACKEND", "PG_TIMEOUT", "FR_DIR"]


class SettingError(ValueError):
    """A ``DDPTOP_*`` variable holds a value ddptop cannot use."""


@dataclass(frozen=True)
class Setting:
    name: str  # the environment variable
    field: str  # the Settings field it fills
    default: str  # in words
    doc: str


USER: tuple[Setting, ...] = (
    Setting("DDPTOP_RUNS_DIR", "runs_dir", "$XDG_STATE_HOME/ddptop/runs (~/.local/state/ddptop/runs)",
            "where run journals live"),
    Setting("DDPTOP_PY_SPY", "py_spy", "py-spy on PATH, else beside this Python",
            "the py-spy to sample stacks with; empty turns stack sampling off"),
    Setting("DDPTOP_NATIVE_TIMEOUT", "native_timeout", "3",
            "seconds a native stack dump (py-spy --native) may take before it is given up for a Python-only one"),
    Setting("DDPTOP_SSH", "ssh", "ssh", "the ssh command (split like a shell would, never run by one)"),
    Setting("DDPTOP_REMOTE", "remote", "ddptop", "the ddptop command on other nodes (attach, doctor --host)"),
    Setting("DDPTOP_STOP_GRACE", "stop_grace", "10", "seconds between SIGTERM and SIGKILL when ddptop stops a job"),
    Setting("DDPTOP_FILE_EVENTS", "file_events", "on", "off (or 0, no): poll files instead of file events"),
    Setting("DDPTOP_FIRST_STEP_GRACE", "first_step_grace", "120",
            "seconds a job may take to its first training step before a silence there is a hang (model loading, "
            "data download, compilation)"),
    Setting("DDPTOP_MIN_SILENCE", "min_silence", "10",
            "the least silence, in seconds, that is a hang once steps come (the learned threshold never goes below "
            "it; an evaluation or checkpoint without steps gets three times it)"),
    Setting("DDPTOP_WATCH_PATIENCE", "watch_patience", "30",
            "seconds a job ddptop did not launch (no step hook) may show frozen stacks and no output before that is "
            "a hang"),
)


@dataclass(frozen=True)
class Settings:
    runs_dir: Path | None = None  # None: the default under $XDG_STATE_HOME
    py_spy: str | None = None  # None: find it; "": stack sampling off; else the path given
    native_timeout: float = 3.0
    ssh: tuple[str, ...] = ("ssh",)
    remote: str = "ddptop"
    stop_grace: float = 10.0
    file_events: bool = True
    first_step_grace: float = 120.0
    min_silence: float = 10.0
    watch_patience: float = 30.0


def thresholds(s: Settings | None = None) -> Thresholds:
    """The detector's thresholds among the person's settings."""
    s = settings() if s is None else s
    return Thresholds(s.first_step_grace, s.min_silence, s.watch_patience)


def _seconds(name: str, v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        raise SettingError(f"{name}={v!r}: not a number of seconds") from None
    if not x >= 0 or x == float("inf"):
        raise SettingError(f"{name}={v!r}: wants a number of seconds, 0 or more")
    return x


def _argv(name: str, v: str) -> tuple[str, ...]:
    try:
        argv = tuple(shlex.split(v))
    except ValueError as e:
        raise SettingError(f"{name}={v!r}: {e}") from None
    if not argv:
        raise SettingError(f"{name} is empty: it wants a command")
    return argv


_PARSE: dict[str, Callable[[str, str], object]] = {
    "runs_dir": lambda _n, v: Path(v) if v else None,
    "py_spy": lambda _n, v: v,
    "native_timeout": _seconds,
    "ssh": _argv,
    "remote": lambda n, v: v or "ddptop",
    "stop_grace": _seconds,
    "file_events": lambda _n, v: v.strip().lower() not in ("0", "off", "no", "false"),
    "first_step_grace": _seconds,
    "min_silence": _seconds,
    "watch_patience": _seconds,
}


def settings(env: Mapping[str, str] | None = None) -> Settings:
    """The user's settings, from ``env`` (default: this process's environment)."""
    env = os.environ if env is None else env
    values = {}
    for s in USER:
        if s.name in env:
            values[s.field] = _PARSE[s.field](s.name, env[s.name])
    return Settings(**values)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- what ddptop sets

BEAT_DIR = "DDPTOP_BEAT_DIR"  # the ranks' step hook writes its beats here (RUN/beats)
PG_BACKEND = "DDPTOP_PG_BACKEND"  # the gloo and one-GPU profiles: the backend the hook forces
PG_TIMEOUT = "DDPTOP_PG_TIMEOUT"  # a profile's process-group timeout, in seconds
FR_DIR = "DDPTOP_FR_DIR"  # the flight-recorder profile: where the hook dumps each rank's record
RANK_ENV = (BEAT_DIR, PG_BACKEND, PG_TIMEOUT, FR_DIR)

NOTIFY_ENV = ("DDPTOP_ALARM_ID", "DDPTOP_ALARM_TYPE", "DDPTOP_ALARM_MESSAGE", "DDPTOP_RUN_DIR")

BENCH_ENV = ("DDPTOP_BENCH_HANG_RANK", "DDPTOP_BENCH_FAIL_RANK", "DDPTOP_BENCH_CRASH_RANK")
