"""What the decision and the paired-run engine both use: a job as observed, a timeline event.

Kept apart from :mod:`arbiter.engine.types` (which re-exports them) so that the paired-run
engine, whose state the decision's state holds, imports neither the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class JobObs:
    job_id: str
    name: str
    owner_uid: int
    use: Literal["none", "shared", "exclusive"] = "shared"
    capabilities: frozenset[str] = frozenset()
    max_duty: float = 1.0
    started: bool = False  # its command runs (pending jobs have not started)
    pids: tuple[int, ...] = ()
    #: its root process's start time (None before it starts): one run of a job id from the next
    run: float | None = None
    submitted_at: float = 0.0
    user_hold: bool = False
    stop_requested_at: float | None = None
    #: its processes' measured GPU duty over the last sample (None with measured_at set: unreadable)
    measured: float | None = None
    measured_at: float | None = None  # when that sample was taken; None: no sample yet
    vram_bytes: int | None = None  # what its processes hold, as the readers read it (None: unknown)

    @property
    def cooperative_pause(self) -> bool:
        return "cooperative_pause" in self.capabilities

    @property
    def reads_control(self) -> bool:
        """It reads its control document (so it is asked to stop before it is ended)."""
        return bool({"cooperative_pause", "cooperative_throttle"} & self.capabilities)

    @property
    def uses_gpu(self) -> bool:
        return self.use != "none"


@dataclass(frozen=True)
class TimelineEvent:
    code: str
    subject: str
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)
