"""What a job says and is told: its manifest, the control document the daemon writes for it and
the lines of its events file (the node config and rule files are in :mod:`arbiter.config.models`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, RootModel, StringConstraints, model_validator

from arbiter.config.models import Capability, Platform, Share, Strict

# --- jobs ------------------------------------------------------------------------------------


class GpuUse(Strict):
    use: Literal["none", "shared", "exclusive"] = Field(
        "shared", description="none, shared, or exclusive (runs only while no other tenant or job uses the GPU)"
    )
    apis_any: list[str] = Field(
        default_factory=list, description="GPU APIs it can use, any one will do (as `arbiter gpu-apis` names them)"
    )
    in_container: bool = Field(False, description="it runs in a container: the API must be usable from containers")
    max_duty: float = Field(1.0, gt=0, le=1, description="the most duty it ever gets")

    @model_validator(mode="after")
    def _apis_need_gpu(self) -> GpuUse:
        if self.apis_any and self.use == "none":
            raise ValueError("apis_any needs use: shared or use: exclusive (a job that uses no GPU needs no GPU API)")
        return self


class Manifest(Strict):
    """What a job declares about itself."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=64,
        description="the kind of work; trust is kept per owner and name",
    )
    capabilities: list[Capability] = Field(default_factory=list, description="what it does on its own when asked")
    gpu: GpuUse = Field(default_factory=GpuUse, description="what it needs of the GPU")
    variants: dict[Platform, GpuUse] = Field(
        default_factory=dict, description="per platform, a gpu block that replaces gpu whole"
    )

    def gpu_for(self, platform: str) -> GpuUse:
        """The GPU needs on ``platform``: a variant replaces ``gpu`` whole."""
        return next((gpu for name, gpu in self.variants.items() if name == platform), self.gpu)


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


#: what a job says of itself is shown to every account (status, explain, the page): short,
#: on one line, and without control characters (no terminal escape reaches a reader's screen)
JobText = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f\x7f-\x9f]*$")]


class PhaseEvent(_Event):
    event: Literal["phase"]
    phase: JobText


class ProgressEvent(_Event):
    event: Literal["progress"]
    done: int = Field(ge=0)
    total: int | None = Field(None, ge=0)


class MetricEvent(_Event):
    event: Literal["metric"]
    name: JobText
    busy: float = Field(ge=0)
    duty: Share
    device: Literal["gpu", "cpu"] = "gpu"
    waited: float = Field(
        0.0, ge=0, description="the share of the window its units took without running (waiting for a CPU, stopped)"
    )


class StopAckEvent(_Event):
    event: Literal["stop_ack"]


class JobEvent(
    RootModel[Annotated[PhaseEvent | ProgressEvent | MetricEvent | StopAckEvent, Field(discriminator="event")]]
):
    """One line of a job's events file (path in ``ARBITER_EVENTS``)."""
