"""The values the VRAM handoff plans with: tenants as seen, starvation, plans and blockers.

Kept apart from :mod:`arbiter.engine.handoff` (which names them too) so that the way back
(:mod:`arbiter.engine.reacquire`), which the handoff calls, can name them without importing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: "GB" in rule files and messages means GiB, as GPU tools show VRAM
GIB = 1 << 30


def gb(n: int) -> str:
    """Bytes as messages show them."""
    return f"{n / GIB:.1f} GB"


@dataclass(frozen=True)
class TenantVram:
    """One tenant as the handoff sees it.

    ``busy`` is ``None`` when its busy probe could not be read: that counts as busy.
    ``needs_bytes`` is its ``needs_vram_gb`` (``None``: it declares no need, so it is never
    starved).  ``idle_since`` is when it last became idle (``None`` while busy or unknown);
    ``idle_release_after_s`` is ``None`` for a tenant never released for being idle.
    ``releasing`` says a release was already asked for and its VRAM has not fallen yet: it is
    not asked again, and what it holds counts as on its way.
    """

    tenant_id: str
    priority: int
    busy: bool | None
    held_bytes: int
    reclaimable: bool
    needs_bytes: int | None = None
    idle_since: float | None = None
    idle_release_after_s: float | None = None
    releasing: bool = False
    cooling: bool = False  # its last release freed nothing: not asked again yet
    #: what a handoff does with it while it counts busy: "release", "wait" (released once idle)
    #: or "skip" (never released busy)
    when_busy: str = "release"
    #: it has been waited for past its drain_timeout_s and is still busy: left alone
    drain_expired: bool = False

    @property
    def counts_busy(self) -> bool:
        return self.busy is not False


@dataclass(frozen=True)
class Starvation:
    """A busy tenant that cannot get the VRAM it needs: needs > free + held."""

    tenant_id: str
    priority: int
    needs_bytes: int
    free_bytes: int
    held_bytes: int
    state_unknown: bool = False  # it counts as busy because its state could not be read

    @property
    def shortfall_bytes(self) -> int:
        return self.needs_bytes - self.free_bytes - self.held_bytes


@dataclass(frozen=True)
class Blocker:
    """A tenant holding VRAM that the plan does not release, and why."""

    tenant_id: str
    held_bytes: int
    why: str


@dataclass(frozen=True)
class HandoffPlan:
    """What to release for one starved demander, decided before anything is released.

    ``candidates`` are every tenant the demander may take VRAM from, in the order they would
    be taken.  ``release`` is what to ask now (empty unless ``covers``); ``awaiting`` are
    candidates already releasing whose VRAM the plan counts on; ``draining`` are busy
    candidates released only once idle (``release_when_busy: wait``), counted on too.  ``blockers`` are the tenants
    holding VRAM that are left alone, each with why.
    """

    starvation: Starvation
    candidates: tuple[str, ...]
    release: tuple[str, ...]
    awaiting: tuple[str, ...]
    reclaimable_bytes: int  # what all candidates together hold
    planned_bytes: int  # what the tenants in release + awaiting hold
    covers: bool
    blockers: tuple[Blocker, ...]
    #: (tenant, bytes held) of every candidate
    held: tuple[tuple[str, int], ...] = ()
    draining: tuple[str, ...] = ()

    @property
    def demander(self) -> str:
        return self.starvation.tenant_id

    def held_by(self, tenant_id: str) -> int:
        return dict(self.held).get(tenant_id, 0)

    def summary(self) -> str:
        s = self.starvation
        head = (
            f"{s.tenant_id!r} needs {gb(s.needs_bytes)} but has {gb(s.held_bytes)} with {gb(s.free_bytes)} free "
            f"(short {gb(s.shortfall_bytes)})"
            + (" and its state is unknown, so it counts as busy" if s.state_unknown else "")
        )
        blocked = "; ".join(f"{b.tenant_id!r} ({gb(b.held_bytes)}): {b.why}" for b in self.blockers)
        if self.covers:
            asked = ", ".join(repr(t) for t in self.release) or "nothing new"
            text = (
                f"{head}: releasing {asked}"
                + (f", awaiting {', '.join(repr(t) for t in self.awaiting)}" if self.awaiting else "")
                + (
                    f", waiting for {', '.join(repr(t) for t in self.draining)} to be idle first"
                    if self.draining
                    else ""
                )
            )
            return text + (f"; left alone: {blocked}" if blocked else "")
        return (
            f"{head}: releasing nothing, the tenants that may give VRAM back hold only "
            f"{gb(self.reclaimable_bytes)}" + (f"; blockers: {blocked}" if blocked else "")
        )

    def to_data(self) -> dict[str, Any]:
        s = self.starvation
        return {
            "demander": s.tenant_id,
            "priority": s.priority,
            "needs_bytes": s.needs_bytes,
            "free_bytes": s.free_bytes,
            "held_bytes": s.held_bytes,
            "shortfall_bytes": s.shortfall_bytes,
            "state_unknown": s.state_unknown,
            "candidates": list(self.candidates),
            "release": list(self.release),
            "awaiting": list(self.awaiting),
            "draining": list(self.draining),
            "reclaimable_bytes": self.reclaimable_bytes,
            "planned_bytes": self.planned_bytes,
            "covers": self.covers,
            "blockers": [{"tenant": b.tenant_id, "held_bytes": b.held_bytes, "why": b.why} for b in self.blockers],
        }


@dataclass(frozen=True)
class TenantObs:
    """One running tenant as this decision sees it (``busy`` None: unknown)."""

    tenant_id: str
    priority: int
    busy: bool | None
    held_bytes: int | None  # None: the readers cannot say
    reclaimable: bool
    needs_bytes: int | None
    idle_release_after_s: float
    timeout_s: float
    confirm: bool
    reacquire_after_s: float | None = None  # None: it declares no way back
    reacquire_timeout_s: float = 30.0
    reacquire_confirm: bool = True
    job: bool = False  # a job, released by pausing it (its id is ``job_tenant(job id)``)
    when_busy: str = "release"  # its rule's release_when_busy
    drain_timeout_s: float = 60.0
