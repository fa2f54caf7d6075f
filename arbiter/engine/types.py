"""Values the engine decides from and returns.  All immutable; no I/O anywhere here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from arbiter.engine.values import JobObs as JobObs
from arbiter.engine.values import TimelineEvent as TimelineEvent

if TYPE_CHECKING:
    from arbiter.engine.abrun import RunState


Scope = Literal["gpu", "cpu", "all", "io"]
GpuJobsMode = Literal["never", "when_no_gpu_protected", "certified", "always"]
Phase = Literal["on", "off", "soon"]
SeenBy = Literal["watch", "tick"]

_D = TypeVar("_D")


def evolve(record: _D, **changes: Any) -> _D:
    """``dataclasses.replace``, but the record itself when no field changes: a decision
    runs on every phase change over every rule and job, and most of its updates change
    nothing (each replace costs a few microseconds; there were hundreds per decision)."""
    for name, value in changes.items():
        if getattr(record, name) != value:
            return replace(record, **changes)  # type: ignore[type-var]
    return record


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
    count: int | None = None  # progress events counted so far (where the source counts)
    busy: bool | None = None  # a busy probe's answer (None: it says nothing, or cannot be read)


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
    busy: SourceObs | None = None  # its busy probe, when it has one
    vram_bytes: int | None = None  # what its processes hold (None: the readers cannot say)


@dataclass(frozen=True)
class Observation:
    now: float
    rules: Mapping[str, RuleObs] = field(default_factory=dict)
    jobs: Mapping[str, JobObs] = field(default_factory=dict)
    invalid_files: tuple[str, ...] = ()  # rule files that were never valid
    reader_ok: bool = True
    reader_why: str = ""
    certificates: tuple[CertView, ...] = ()
    memory_available: float | None = None  # share of host memory available (None: unknown)
    wall: float | None = None  # the wall clock with ``now`` (a paired run tells sleep from it)
    power: str | None = None  # the host's power source ("ac", "battery"; None: unknown)
    vram_free_bytes: int | None = None  # the device's free VRAM (None: unknown)
    node_faults: tuple[str, ...] = ()  # what kept this observation from seeing the node (no process table...)


# --- policy ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GovernorPolicy:
    """The budget governor's periods (the node config's ``governor:`` block)."""

    period_s: float = 60.0
    baseline_s: float = 60.0
    rebaseline_s: float = 1800.0
    take_back_s: float = 300.0
    grow_step: float = 0.05
    min_available: float = 0.10  # the memory guard: share of host memory


@dataclass(frozen=True)
class CertView:
    """A certificate as the engine needs it: which work at which duty, and whether it holds."""

    rule_id: str
    work: str  # "gpu" (every GPU job), "cpu", "all", or a job name
    duty: float
    valid: bool = True
    why: str = ""  # why it is not valid (expired, stale)


GovernorMode = Literal["off", "baseline", "running", "taken_back"]


@dataclass(frozen=True)
class GovernorState:
    """One rule's governor (kept across decisions, and across daemon restarts)."""

    mode: GovernorMode = "off"
    since: float | None = None  # when this mode began
    baseline: float | None = None  # the program's progress rate without GPU work
    baseline_at: float | None = None  # when that baseline was measured
    budget: float = 0.0
    level: float | None = None  # the last running budget, taken up again after a re-baseline
    ceiling: float = 0.0
    decided_at: float | None = None  # the last period's decision
    pressure: float | None = None  # 1 - rate / baseline at that decision
    take_back_until: float | None = None
    sensitivity: float | None = None  # pressure per unit of duty, smoothed over the periods seen
    probe: tuple[float, float] | None = None  # (duty, pressure) at the decision before the last


@dataclass(frozen=True)
class CompliancePolicy:
    sample_s: float = 2.0  # how long a sample of a job's measured duty lasts
    tolerance: float = 0.1  # measured duty may exceed the asked duty by this much
    over_samples: int = 3  # samples in a row over it before the job is paused
    pause_s: float = 60.0  # how long that pause lasts
    strikes_to_stop: int = 3  # pauses within strike_window_s that stop the job
    strike_window_s: float = 3600.0
    untrusted_s: float = 3600.0  # how long a stopped job's name gets no duty
    still_busy_samples: int = 2  # samples a job told to pause may go on using the GPU


@dataclass(frozen=True)
class JobCompliance:
    """One job's record (kept while the job lives)."""

    over: int = 0  # samples in a row over its duty + tolerance
    last_sample_at: float | None = None
    paused_until: float | None = None  # paused for exceeding its duty until then
    stopped_at: float | None = None  # stopped for the last strike
    busy_while_told_paused: int = 0  # samples it used the GPU after its document said paused
    told_at: float | None = None  # when its document was first seen saying paused
    measured: float | None = None  # the last sample
    unverified: bool = False  # its last sample could not be read while it needs a duty below 1
    asked: float | None = None  # the duty it was asked to hold, and since when
    asked_since: float | None = None


@dataclass(frozen=True)
class NameTrust:
    """A job name's record (kept across runs and daemon restarts)."""

    strikes: tuple[float, ...] = ()  # when its runs were paused for exceeding their duty
    untrusted_until: float | None = None

    def untrusted(self, now: float) -> bool:
        return self.untrusted_until is not None and now < self.untrusted_until


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
    max_slowdown: float = 0.05  # the governor's target
    # VRAM handoff
    reclaimable: bool = False  # it declares a release
    busy_probe: bool = False  # it has a busy probe (else: busy while it uses the GPU)
    needs_vram_bytes: int | None = None
    idle_release_after_s: float = 30.0
    release_timeout_s: float = 10.0  # for its VRAM to fall after a release is asked
    confirm: bool = True  # a release is done only when its VRAM is seen to fall
    reacquire: bool = False  # it declares a way back after a release (a reacquire whose translator loaded)
    reacquire_after_s: float = 10.0  # quiet period before it is woken
    reacquire_timeout_s: float = 30.0  # for its VRAM to come back
    reacquire_confirm: bool = True  # a wake is done only when its VRAM is seen to rise
    #: what a handoff does with it while busy: release (its server copes), wait (released once
    #: idle, for at most drain_timeout_s) or skip (never released busy: other tenants are taken)
    release_when_busy: str = "release"
    drain_timeout_s: float = 60.0
    profile: bool = False  # it has a GPU profile applied while it works on the GPU


@dataclass(frozen=True)
class Policy:
    gpu_jobs: GpuJobsMode = "when_no_gpu_protected"
    busy_threshold: float = 0.05
    release_after_s: float = 10.0
    stop_grace_s: float = 10.0
    rules: Mapping[str, RulePolicy] = field(default_factory=dict)
    compliance: CompliancePolicy = field(default_factory=CompliancePolicy)
    governor: GovernorPolicy = field(default_factory=GovernorPolicy)
    #: the pause translator gives a paused job's VRAM back (it checkpoints the job's device
    #: memory): a running job's VRAM is then releasable to a tenant short of it, by pausing it
    pause_frees_vram: bool = False
    #: a running job that protection keeps paused this long is stopped, so that work a
    #: scheduler requeues runs on another node (None: held work waits however long it takes;
    #: "auto": as long as the protecting rule's history says loses least, see engine.evict)
    evict_after_s: float | Literal["auto"] | None = None
    #: what an eviction costs a job, in seconds of its work: until it works again elsewhere,
    #: and what it loses ("auto" weighs it against how long protection lasts)
    evict_cost_s: float = 60.0


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
    #: since when its protection holds fleet work (None: it holds none now)
    holding_since: float | None = None
    #: how long its latest protections held fleet work, oldest first (``evict_after_s: auto``)
    held_spans: tuple[float, ...] = ()


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
    notes: tuple[Reason, ...] = ()  # what it waits for itself (VRAM a handoff cannot free)

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
            "notes": [r.to_dict() for r in self.notes],
        }


@dataclass(frozen=True)
class TenantVramState:
    """One tenant's VRAM handoff record."""

    idle_since: float | None = None  # when it last became idle (None: busy or unknown)
    requested_at: float | None = None  # a release asked for and not yet seen done
    held_at_request: int = 0
    why: str = ""  # "idle" or "handoff for <demander>"
    retry_at: float | None = None  # not asked again before then (its last request freed nothing, or is on its way)
    floor: int | None = None  # what it held when its last request ended (idle release waits for more)
    plan: str = ""  # its last plan as a demander (a plan is logged when it changes)
    # the way back (a rule with reacquire:)
    asleep_bytes: int = 0  # what it released for a handoff and has not taken back
    quiet_since: float | None = None  # since when no demander needs that VRAM
    waking_at: float | None = None  # a wake asked for and not yet seen done
    held_at_wake: int = 0
    wake_tries: int = 0  # wakes that failed in a row
    wake_retry_at: float | None = None
    wake_due: float | None = None  # when its quiet period (or backoff) ends: the next decision is due then
    #: a job paused to give its VRAM to this tenant: it stays paused while that tenant is busy
    for_demander: str = ""
    #: since when a handoff waits for it to be idle before releasing it (release_when_busy: wait)
    drain_since: float | None = None


@dataclass(frozen=True)
class HeldJob:
    """A running job that protection keeps paused: since when (kept across daemon restarts), and
    its eviction once decided."""

    since: float
    evicted_at: float | None = None
    reason: Reason | None = None  # why it was evicted (kept: its stop goes on after the hold ends)
    after_s: float | None = None  # how long it may stay paused, as last decided (None: no limit)
    basis: str = ""  # why that long, where evict_after_s is "auto"
    run: float | None = None  # the run its eviction stops (the job's ``run`` then)


@dataclass(frozen=True)
class Release:
    """Ask a tenant to release its VRAM (the shell calls its release translator)."""

    rule_id: str
    why: str
    held_bytes: int = 0  # what it held when asked
    timeout_s: float = 10.0  # its release's own timeout_s


@dataclass(frozen=True)
class EngineState:
    rules: Mapping[str, RuleState] = field(default_factory=dict)
    jobs: Mapping[str, JobVerdict] = field(default_factory=dict)
    notices: frozenset[str] = frozenset()
    compliance: Mapping[str, JobCompliance] = field(default_factory=dict)  # job id → its record
    trust: Mapping[str, NameTrust] = field(default_factory=dict)  # job name → its record
    governors: Mapping[str, GovernorState] = field(default_factory=dict)  # rule id → its governor
    ab: RunState | None = None  # the paired ON/OFF run in progress, or the last to end (one a node)
    vram: Mapping[str, TenantVramState] = field(default_factory=dict)  # rule id → its handoff record
    profiles: frozenset[str] = frozenset()  # rules whose GPU profile is applied
    held: Mapping[str, HeldJob] = field(default_factory=dict)  # job id → since when protection pauses it


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
class Decision:
    state: EngineState
    jobs: Mapping[str, JobVerdict]
    rules: Mapping[str, RuleVerdict]
    actions: tuple[Action, ...]
    events: tuple[TimelineEvent, ...]
    notices: tuple[Reason, ...] = ()  # node-wide conditions (e.g. a rule file never valid)
    admits_gpu: bool = True  # a new GPU job that cannot throttle would be admitted now
    ab_ended: tuple[RunState, ...] = ()  # paired runs that ended on this decision
    releases: tuple[Release, ...] = ()  # VRAM releases to ask for now
    profiles_on: tuple[str, ...] = ()  # rules whose GPU profile to apply now
    profiles_off: tuple[str, ...] = ()  # ... and to restore now
    held_by: tuple[Reason, ...] = ()  # while admits_gpu is False: what holds a new GPU job back
