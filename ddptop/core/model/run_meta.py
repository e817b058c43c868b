"""What a launch was: a run's ``meta.json`` (written by the launcher, read by
every reader of the journal)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    """The hang detector's thresholds a person may set (``DDPTOP_FIRST_STEP_GRACE``,
    ``DDPTOP_MIN_SILENCE``, ``DDPTOP_WATCH_PATIENCE``), in seconds.  A launch
    records the ones it ran under, so that ``ddptop diagnose`` replays the run
    under them, in whatever shell it runs."""

    first_step_grace: float = 120.0
    min_silence: float = 10.0
    watch_patience: float = 30.0

    def to_dict(self) -> dict[str, float]:
        return {"first_step_grace": self.first_step_grace, "min_silence": self.min_silence,
                "watch_patience": self.watch_patience}

    @classmethod
    def from_dict(cls, d: Any) -> "Thresholds":
        """From a journal's ``meta.json`` (absent in earlier releases' journals: the defaults they ran under)."""
        if not isinstance(d, dict):
            return cls()
        ok = {k: float(v) for k, v in d.items() if k in cls.__dataclass_fields__ and isinstance(v, (int, float))
              and not isinstance(v, bool) and v >= 0}
        return cls(**ok)


@dataclass(frozen=True)
class Meta:
    run_id: str
    command: list[str]  # torchrun argv, exactly as executed
    user_command: list[str]  # what the person typed after `ddptop`
    env_set: dict[str, str]  # variables ddptop added or changed
    cwd: str
    host: str
    started: float
    log_dir: str  # where torchrun writes per-rank logs
    nproc_per_node: int | None
    node_rank: int | None
    ddptop_version: str
    gpu: str = "auto"  # auto | nvml | sim | none
    sample_interval: float = 1.0
    stall_after: float | None = None  # seconds; None: learned from the step interval
    on_stall: str = "alarm"  # alarm | kill | relaunch
    max_relaunches: int | None = None  # for --on-stall relaunch (default 3)
    notify_cmd: list | None = None  # argv run on each alarm (alarm JSON on stdin)
    inject: bool = True
    profiles: list | None = None  # names of the profiles applied, in order
    env_unset: list | None = None  # variables removed from the job's environment
    thresholds: dict | None = None  # the detector's thresholds the run was judged under (Thresholds.to_dict)
    # torchrun's own variables (PET_*) in the job's environment at launch: its options where the command gives
    # none (None: an earlier release's journal, which did not record them)
    torchrun_env: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def launch_env(self) -> dict[str, str]:
        """What the journal says of the job's environment: torchrun's PET_* variables, and what ddptop set
        (read with the command by ``launcher.launch_options``)."""
        return {**(self.torchrun_env or {}), **self.env_set}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Meta":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


class RankMap:
    """Global rank of (attempt, local rank): as the ranks said, else node_rank * nproc + local."""

    def __init__(self, node_rank: int | None = None, nproc_per_node: int | None = None):
        self.node_rank = node_rank
        self.nproc_per_node = nproc_per_node
        self._seen: dict[tuple[int, int], int] = {}

    def record(self, attempt: int, local_rank: int, rank: int) -> None:
        self._seen[(attempt, local_rank)] = rank

    def rank(self, attempt: int, local_rank: int) -> int:
        r = self._seen.get((attempt, local_rank))
        if r is not None:
            return r
        if self.node_rank is not None and self.nproc_per_node is not None:
            return self.node_rank * self.nproc_per_node + local_rank
        return local_rank
