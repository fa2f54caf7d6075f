"""Values the engine decides from and returns.  All immutable; no I/O anywhere here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Scope = Literal["gpu", "cpu", "all", "io"]
GpuJobsMode = Literal["never", "when_no_gpu_protected", "certified", "always"]
Phase = Literal["on", "off", "soon"]
SeenBy = Literal["watch", "tick"]


@dataclass(frozen=True)
class Reason:
    """Why something is held, paused, stopped or limited, and what to do about it."""

    code: str
    message: str
    remedy: str
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "remedy": self.remedy, "evidence": dict(self.evidence)}


# --- observation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceObs:
    """One source (a rule's progress source, or a ``during`` phase source) as last read."""

    readable: bool = True
    phase: Phase | None = None
    why: str = ""
    needs_helper: bool = False
    seen_by: SeenBy = "tick"
    changed_at: float = 0.0
    rate: float | None = None  # progress events per second, where known


@dataclass(frozen=True)
class RuleObs:
    rule_id: str
    running: bool = False
    pids: frozenset[int] = frozenset()
    gpu_share: float | None = 0.0  # None: its GPU time cannot be read
    gpu_why: str = ""
    phases: tuple[SourceObs, ...] = ()
    faults: tuple[str, ...] = ()  # plugin failures for this rule: treated as harm
    progress: SourceObs | None = None  # its progress source, when it has one


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
    submitted_at: float = 0.0
    user_hold: bool = False
    stop_requested_at: float | None = None

    @property
    def cooperative_pause(self) -> bool:
        return "cooperative_pause" in self.capabilities

    @property
    def uses_gpu(self) -> bool:
        return self.use != "none"


@dataclass(frozen=True)
class Observation:
    now: float
    rules: Mapping[str, RuleObs] = field(default_factory=dict)
    jobs: Mapping[str, JobObs] = field(default_factory=dict)
    invalid_files: tuple[str, ...] = ()  # rule files that were never valid
    reader_ok: bool = True
    reader_why: str = ""


# --- policy ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DuringPolicy:
    scope: Scope = "gpu"
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class RulePolicy:
    rule_id: str
    priority: int = 50
    protected: bool = False
    immediate: bool = False
    pause_fleet: Scope | None = None
    during: tuple[DuringPolicy, ...] = ()
    progress: bool = False  # it reads its program's progress from a source


@dataclass(frozen=True)
class Policy:
    gpu_jobs: GpuJobsMode = "when_no_gpu_protected"
    busy_threshold: float = 0.05
    release_after_s: float = 10.0
    stop_grace_s: float = 10.0
    rules: Mapping[str, RulePolicy] = field(default_factory=dict)


# --- state and decision ----------------------------------------------------------------------

JobStateName = Literal["held", "run", "paused", "stopping"]
PauseVia = Literal["control", "tree"]
StopStep = Literal["asked", "terminated", "killed"]


@dataclass(frozen=True)
class RuleState:
    using_gpu: bool = False
    last_busy_at: float | None = None
    using_since: float | None = None
    phases: tuple[Phase, ...] = ()


@dataclass(frozen=True)
class JobVerdict:
    job_id: str
    state: JobStateName
    duty: float = 1.0
    via: PauseVia | None = None
    stop_step: StopStep | None = None
    reasons: tuple[Reason, ...] = ()

    @property
    def admitted(self) -> bool:
        return self.state != "held"

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": self.state,
            "duty": self.duty,
            "via": self.via,
            "stop_step": self.stop_step,
            "reasons": [r.to_dict() for r in self.reasons],
        }


@dataclass(frozen=True)
class RuleVerdict:
    rule_id: str
    running: bool
    protected: bool
    using_gpu: bool
    using_since: float | None
    gpu_share: float | None
    phases: tuple[Phase, ...]
    holds: tuple[Reason, ...]  # what this rule holds back now

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule_id": self.rule_id,
            "running": self.running,
            "protected": self.protected,
            "using_gpu": self.using_gpu,
            "using_since": self.using_since,
            "gpu_share": self.gpu_share,
            "phases": list(self.phases),
            "holds": [r.to_dict() for r in self.holds],
        }


@dataclass(frozen=True)
class EngineState:
    rules: Mapping[str, RuleState] = field(default_factory=dict)
    jobs: Mapping[str, JobVerdict] = field(default_factory=dict)
    notices: frozenset[str] = frozenset()


ActionOp = Literal["pause", "resume", "control", "terminate", "kill"]


@dataclass(frozen=True)
class Action:
    """One change to apply to a job; the shell maps ``op`` to a translator."""

    job_id: str
    op: ActionOp
    state: Literal["run", "paused", "stop"] | None = None  # for ``control``
    duty: float = 1.0
    reason: str = ""


@dataclass(frozen=True)
class TimelineEvent:
    code: str
    subject: str
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    state: EngineState
    jobs: Mapping[str, JobVerdict]
    rules: Mapping[str, RuleVerdict]
    actions: tuple[Action, ...]
    events: tuple[TimelineEvent, ...]
    notices: tuple[Reason, ...] = ()  # node-wide conditions (e.g. a rule file never valid)
