"""What a launch was: a run's ``meta.json`` (written by the launcher, read by
every reader of the journal)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Meta":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})
