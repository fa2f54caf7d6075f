"""The shapes of arbiter's data: node config, rule files, job manifests, the wire protocol.

Every ``{kind: ...}`` block is validated twice: here as a :class:`KindBlock` (it names a
kind), then against the options model its plugin registered (see :mod:`arbiter.config.rules`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, field_validator, model_validator

from arbiter.config.locate import default_state_dir

GpuJobsMode = Literal["never", "when_no_gpu_protected", "certified", "always"]
Scope = Literal["gpu", "cpu", "all", "io"]
Capability = Literal["cooperative_throttle", "cooperative_pause", "cancellable", "progress_events"]
Platform = Literal["darwin", "linux", "windows"]
Share = Annotated[float, Field(ge=0.0, le=1.0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KindBlock(BaseModel):
    """A plugin block: ``kind`` names the plugin kind, the other fields are its options."""

    model_config = ConfigDict(extra="allow")
    kind: str

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class MatchBlock(KindBlock):
    kind: str = "process"


# --- node config ---------------------------------------------------------------------------


def default_tenants_dirs() -> list[str]:
    if os.geteuid() == 0:
        return ["/etc/arbiter/tenants.d"]
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return [str(Path(base) / "arbiter" / "tenants.d")]


class GovernorConfig(Strict):
    period_s: float = Field(60, gt=0)
    baseline_s: float = Field(60, gt=0)
    rebaseline_s: float = Field(1800, gt=0)
    take_back_s: float = Field(300, ge=0)
    grow_step: float = Field(0.05, gt=0, le=1)


class ComplianceConfig(Strict):
    """How jobs holding a duty below 1 are verified (SPEC section 5, "Compliance")."""

    sample_s: float = Field(2.0, gt=0, le=60, description="how long each sample of a job's measured duty lasts")
    tolerance: Share = Field(0.1, description="measured duty may exceed the asked duty by this much")
    over_samples: int = Field(3, ge=1, description="samples in a row over it before the job is paused")
    pause_s: float = Field(60.0, ge=0, description="how long that pause lasts")
    strikes_to_stop: int = Field(3, ge=1, description="pauses within strike_window_s that stop the job")
    strike_window_s: float = Field(3600.0, gt=0)
    untrusted_s: float = Field(3600.0, ge=0, description="how long a stopped job's name gets no duty")
    still_busy_samples: int = Field(2, ge=1, description="samples a job told to pause may go on using the GPU")


class MemoryGuardConfig(Strict):
    min_available: Share = 0.10


class HttpConfig(Strict):
    listen: str = "127.0.0.1:7807"
    enabled: bool = True

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError("listen must be HOST:PORT, e.g. 127.0.0.1:7807 (port 0 picks a free port)")
        return value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


class NodeConfig(Strict):
    """``arbiter.yaml``: how this node shares its GPU."""

    gpu_jobs: GpuJobsMode = "when_no_gpu_protected"
    tick_s: float = Field(2.0, gt=0, le=60)
    gpu_busy_threshold: Share = 0.05
    gpu_release_after_s: float = Field(10.0, ge=0)
    tenants_dirs: list[str] = Field(default_factory=default_tenants_dirs)
    readers: list[str | KindBlock] = Field(
        default_factory=list,
        description="reader kinds tried in order; empty: every installed reader of a real GPU, in name order",
    )
    stand_in_gpu: bool = False
    governor: GovernorConfig = Field(default_factory=GovernorConfig)
    memory_guard: MemoryGuardConfig = Field(default_factory=MemoryGuardConfig)
    compliance: ComplianceConfig = Field(default_factory=ComplianceConfig)
    admin_group: str = "arbiter"
    plugins: list[str] = Field(default_factory=list)
    disable_plugins: list[str] = Field(default_factory=list)
    state_dir: str = Field(default_factory=default_state_dir)
    http: HttpConfig = Field(default_factory=HttpConfig)
    translators: dict[Literal["pause", "control", "terminate"], list[str]] = Field(
        default_factory=dict,
        description="translator kinds to use per action, in order; default: every installed one that declares it",
    )
    stop_grace_s: float = Field(10.0, ge=0)
    plugin_timeout_s: float = Field(5.0, gt=0)

    def reader_blocks(self) -> list[KindBlock]:
        return [KindBlock(kind=r) if isinstance(r, str) else r for r in self.readers]

    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser()

    def tenants_paths(self) -> list[Path]:
        return [Path(d).expanduser() for d in self.tenants_dirs]


# --- rule files ----------------------------------------------------------------------------


class PauseFleet(Strict):
    scope: Scope = "gpu"


class Protect(Strict):
    metric: Literal["progress_rate", "gpu_share"] = "progress_rate"
    max_slowdown: float = Field(0.05, gt=0, lt=1)
    source: KindBlock | None = None

    @model_validator(mode="after")
    def _source_for_rate(self) -> Protect:
        if self.metric == "progress_rate" and self.source is None:
            raise ValueError("metric progress_rate needs a source (where the program's progress is read)")
        return self


class During(Strict):
    source: KindBlock
    pause_fleet: PauseFleet = Field(default_factory=PauseFleet)
    tags: list[str] = Field(default_factory=list)


class Rule(Strict):
    """One tenant: how to recognise it, how much it matters, and what protects it."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    extends: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=64,
        description=(
            "the id of a rule in another rule file of the tenants dirs that this file builds on: write only "
            "the fields that change, and every other field, including ones a later version adds to that "
            "file, comes from it. Mappings merge key by key (a plugin block whose kind changes is replaced "
            "whole); lists, values and null replace. The base then no longer loads by itself, and the rule "
            "keeps the base's id unless this file sets its own id. A base can be extended once; an "
            "extension can itself be extended."
        ),
    )
    kind: Literal["llm", "diffusion", "desktop", "trainer", "other"] = "other"
    enabled: bool = True
    priority: int = Field(50, ge=0, le=1000)
    match: MatchBlock
    immediate: bool = False
    protect: Protect | None = None
    during: list[During] = Field(default_factory=list)
    pause_fleet: PauseFleet | None = None
    busy: KindBlock | None = None
    release: KindBlock | None = None
    events: KindBlock | None = None
    needs_vram_gb: float | None = Field(None, ge=0)
    idle_release_after_s: float = Field(30, ge=0)
    profile: KindBlock | None = None
    throttle: KindBlock | None = None
    notes: str = ""

    @property
    def protected(self) -> bool:
        return self.protect is not None


# --- jobs ------------------------------------------------------------------------------------


class GpuUse(Strict):
    use: Literal["none", "shared", "exclusive"] = "shared"
    apis_any: list[str] = Field(default_factory=list)
    in_container: bool = False
    max_duty: float = Field(1.0, gt=0, le=1)

    @model_validator(mode="after")
    def _apis_need_gpu(self) -> GpuUse:
        if self.apis_any and self.use == "none":
            raise ValueError("apis_any needs use: shared or use: exclusive (a job that uses no GPU needs no GPU API)")
        return self


class Manifest(Strict):
    """What a job declares about itself."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    capabilities: list[Capability] = Field(default_factory=list)
    gpu: GpuUse = Field(default_factory=GpuUse)
    variants: dict[Platform, GpuUse] = Field(default_factory=dict)

    def gpu_for(self, platform: str) -> GpuUse:
        """The GPU needs on ``platform``: a variant replaces ``gpu`` whole."""
        return self.variants.get(platform, self.gpu)  # type: ignore[call-overload]


# --- the wire protocol -----------------------------------------------------------------------


class ControlDocument(Strict):
    """The control document the daemon writes for a job (path in ``ARBITER_CONTROL``)."""

    v: Literal[1] = 1
    seq: int = Field(ge=0)
    state: Literal["run", "paused", "stop"]
    gpu_duty: Share
    reason: str = ""


class _Event(Strict):
    t: float


class PhaseEvent(_Event):
    event: Literal["phase"]
    phase: str


class ProgressEvent(_Event):
    event: Literal["progress"]
    done: int = Field(ge=0)
    total: int | None = Field(None, ge=0)


class MetricEvent(_Event):
    event: Literal["metric"]
    name: str
    busy: float = Field(ge=0)
    duty: Share
    device: Literal["gpu", "cpu"] = "gpu"


class StopAckEvent(_Event):
    event: Literal["stop_ack"]


class JobEvent(RootModel[Annotated[PhaseEvent | ProgressEvent | MetricEvent | StopAckEvent, Field(discriminator="event")]]):
    """One line of a job's events file (path in ``ARBITER_EVENTS``)."""
