"""VRAM handoff between tenants, as pure functions.

- **Starvation**: a busy tenant is starved when the device's free VRAM plus what it holds is
  below what it needs; the shortfall is needs − free − held.  A tenant whose busy state is
  unknown counts as busy, here and everywhere below (never guess in anyone's favour).
- **The plan**, made before anything is released so it can be logged first: candidates are the
  idle reclaimable tenants of any rank and the busy reclaimable tenants ranked *strictly below*
  the demander; idle first, then lowest priority, then largest VRAM; taken in that order until
  the shortfall is covered.  A plan is carried out only when it covers the shortfall; otherwise
  nothing is released and the blockers say why.  Equal or higher priority is never interrupted.
- **Release safety**: a rule says what a busy release does to its server
  (``release_when_busy``): ``release`` (it copes, or drains by itself), ``wait`` (a busy
  candidate is counted on but released only once its probe reads idle, for at most its
  ``drain_timeout_s``; past it, it is left alone and the plan takes others) or ``skip`` (never
  a candidate while busy).  No release is ever sent that the rule says would break its server.
- **Idle release**: an idle reclaimable tenant that has held VRAM for its
  ``idle_release_after_s`` since it became idle is asked to release it.
- **The way back**: a tenant released for a handoff that declares a reacquire is woken once
  no demander needs its VRAM (:mod:`arbiter.engine.reacquire`).
- **Jobs**: where a pause gives a job's VRAM back, a running job is a candidate too, ranked
  below every tenant and busy: its release is its pause, confirmed like any release by its
  VRAM falling, and it stays paused while the tenant it gave the memory to is busy.

No I/O and no clock reads: the caller passes the views, the device's free VRAM and ``now``.

It runs past 400 lines because starvation, the plan, its order and the restore are the cases
of one decision, and its tests judge them together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from arbiter.engine import codes
from arbiter.engine import reacquire as wake
from arbiter.engine.types import Reason, Release, TenantVramState, TimelineEvent, evolve
from arbiter.engine.vramplan import GIB as GIB
from arbiter.engine.vramplan import Blocker as Blocker
from arbiter.engine.vramplan import HandoffPlan as HandoffPlan
from arbiter.engine.vramplan import Starvation as Starvation
from arbiter.engine.vramplan import TenantObs as TenantObs
from arbiter.engine.vramplan import TenantVram as TenantVram
from arbiter.engine.vramplan import gb as gb

# Why a tenant is not released (the blockers' texts).
WHY_RANKS = "busy and ranks at or above the demander"
WHY_UNKNOWN_RANKS = "its state is unknown, which counts as busy, and it ranks at or above the demander"
WHY_NO_RELEASE = "declares no release"
WHY_ENOUGH = "enough was freed without it"
WHY_COOLING = "its last release freed nothing: it is asked again after its timeout_s"
WHY_BUSY_SKIP = "busy, and a busy release would break it (release_when_busy: skip)"
WHY_DRAIN_EXPIRED = "still busy past its drain_timeout_s, and a busy release would break it (release_when_busy: wait)"


def starvation(tenant: TenantVram, free_bytes: int) -> Starvation | None:
    """The tenant's starvation, or ``None`` when it is idle, declares no need or has enough."""
    if not tenant.counts_busy or tenant.needs_bytes is None:
        return None
    free = max(0, free_bytes)
    if free + tenant.held_bytes >= tenant.needs_bytes:
        return None
    return Starvation(
        tenant.tenant_id,
        tenant.priority,
        tenant.needs_bytes,
        free,
        tenant.held_bytes,
        state_unknown=tenant.busy is None,
    )


def _order(t: TenantVram) -> tuple[int, int, int, str]:
    # idle first, then lowest priority, then largest VRAM; the id makes ties deterministic
    return (1 if t.counts_busy else 0, t.priority, -t.held_bytes, t.tenant_id)


def plan(demander: TenantVram, tenants: Iterable[TenantVram], free_bytes: int) -> HandoffPlan | None:
    """The handoff plan for ``demander`` (``None`` when it is not starved).

    ``tenants`` may include the demander itself (it is skipped).  Tenants holding no VRAM
    are neither candidates nor blockers: there is nothing to take from them.
    """
    starved = starvation(demander, free_bytes)
    if starved is None:
        return None
    eligible: list[TenantVram] = []
    blockers: list[Blocker] = []
    for t in tenants:
        if t.tenant_id == demander.tenant_id or t.held_bytes <= 0:
            continue
        if not t.reclaimable:
            blockers.append(Blocker(t.tenant_id, t.held_bytes, WHY_NO_RELEASE))
        elif t.cooling:
            blockers.append(Blocker(t.tenant_id, t.held_bytes, WHY_COOLING))
        elif t.counts_busy and t.priority >= demander.priority:
            blockers.append(Blocker(t.tenant_id, t.held_bytes, WHY_UNKNOWN_RANKS if t.busy is None else WHY_RANKS))
        elif t.counts_busy and t.when_busy == "skip":
            blockers.append(Blocker(t.tenant_id, t.held_bytes, WHY_BUSY_SKIP))
        elif t.counts_busy and t.when_busy == "wait" and t.drain_expired:
            blockers.append(Blocker(t.tenant_id, t.held_bytes, WHY_DRAIN_EXPIRED))
        else:
            eligible.append(t)
    eligible.sort(key=_order)
    need = starved.shortfall_bytes
    chosen: list[TenantVram] = []
    planned = 0
    for t in eligible:
        if planned >= need:
            break
        chosen.append(t)
        planned += t.held_bytes
    covers = planned >= need
    picked = {t.tenant_id for t in chosen}
    # a busy one whose server breaks on a busy release is counted on, and released once idle
    drains = {t.tenant_id for t in chosen if t.counts_busy and t.when_busy == "wait" and not t.releasing}
    if covers:
        blockers.extend(Blocker(t.tenant_id, t.held_bytes, WHY_ENOUGH) for t in eligible if t.tenant_id not in picked)
    return HandoffPlan(
        starvation=starved,
        candidates=tuple(t.tenant_id for t in eligible),
        release=tuple(t.tenant_id for t in chosen if not t.releasing and t.tenant_id not in drains) if covers else (),
        awaiting=tuple(t.tenant_id for t in chosen if t.releasing) if covers else (),
        reclaimable_bytes=sum(t.held_bytes for t in eligible),
        planned_bytes=planned if covers else 0,
        covers=covers,
        blockers=tuple(sorted(blockers, key=lambda b: b.tenant_id)),
        held=tuple((t.tenant_id, t.held_bytes) for t in eligible),
        draining=tuple(t.tenant_id for t in chosen if t.tenant_id in drains) if covers else (),
    )


def plans(tenants: Sequence[TenantVram], free_bytes: int) -> tuple[HandoffPlan, ...]:
    """A plan for every starved tenant, highest priority first.

    A tenant an earlier plan releases is taken out of the later ones (it is already going,
    and its VRAM goes to the demander that ranks higher), and so is a demander another plan
    releases.  The free VRAM is the same for every plan: what one plan frees is its demander's.
    """
    out: list[HandoffPlan] = []
    taken: set[str] = set()
    for demander in sorted(tenants, key=lambda t: (-t.priority, t.tenant_id)):
        if demander.tenant_id in taken:
            continue
        found = plan(demander, [t for t in tenants if t.tenant_id not in taken], free_bytes)
        if found is None:
            continue
        out.append(found)
        taken.add(demander.tenant_id)
        taken.update(found.release)
        taken.update(found.awaiting)
        taken.update(found.draining)
    return tuple(out)


@dataclass(frozen=True)
class IdleRelease:
    """An idle tenant to ask for its VRAM: it has held it idle past its limit."""

    tenant_id: str
    held_bytes: int
    idle_for_s: float
    limit_s: float

    @property
    def message(self) -> str:
        return (
            f"{self.tenant_id!r} has held {gb(self.held_bytes)} idle for {self.idle_for_s:.0f}s "
            f"(idle_release_after_s {self.limit_s:g}): asking it to release"
        )


def idle_releases(tenants: Iterable[TenantVram], now: float) -> tuple[IdleRelease, ...]:
    """The idle reclaimable tenants that have held VRAM for at least their
    ``idle_release_after_s`` since they became idle, and are not releasing already."""
    out: list[IdleRelease] = []
    for t in tenants:
        if (
            t.busy is not False
            or t.idle_since is None
            or t.idle_release_after_s is None
            or not t.reclaimable
            or t.releasing
            or t.cooling
            or t.held_bytes <= 0
        ):
            continue
        idle_for = now - t.idle_since
        if idle_for >= t.idle_release_after_s:
            out.append(IdleRelease(t.tenant_id, t.held_bytes, max(0.0, idle_for), t.idle_release_after_s))
    return tuple(sorted(out, key=lambda r: r.tenant_id))


# --- what goes on the timeline and into explain ----------------------------------------------


def plan_event(p: HandoffPlan) -> TimelineEvent:
    """The plan's own timeline entry, recorded before any release it asks for."""
    code = codes.VRAM_HANDOFF_PLANNED if p.covers else codes.VRAM_HANDOFF_BLOCKED
    return TimelineEvent(code, p.demander, p.summary(), p.to_data())


def plan_reason(p: HandoffPlan) -> Reason | None:
    """Why a starved demander stays starved (``None`` when its plan covers the shortfall)."""
    if p.covers:
        return None
    ranks = [b.tenant_id for b in p.blockers if b.why in (WHY_RANKS, WHY_UNKNOWN_RANKS)]
    no_release = [b.tenant_id for b in p.blockers if b.why == WHY_NO_RELEASE]
    unsafe = [b.tenant_id for b in p.blockers if b.why in (WHY_BUSY_SKIP, WHY_DRAIN_EXPIRED)]
    hints = []
    if unsafe:
        hints.append(f"wait until {', '.join(map(repr, unsafe))} are idle (releasing them busy would break them)")
    if ranks:
        hints.append(
            f"give {p.demander!r} a higher priority than {', '.join(map(repr, ranks))}, or wait until they are idle"
        )
    if no_release:
        hints.append(f"add a release: block to {', '.join(map(repr, no_release))} if they can give VRAM back")
    hints.append(f"or lower needs_vram_gb of {p.demander!r} if it needs less")
    return Reason(codes.VRAM_HANDOFF_BLOCKED, p.summary(), "; ".join(hints), p.to_data())


def drain_reason(tenant: str, demander: str, waited_s: float, limit_s: float) -> Reason:
    """Why a busy tenant a plan counts on is not released yet (shown on it and its demander)."""
    return Reason(
        codes.VRAM_RELEASE_DRAINING,
        f"{tenant!r} is busy, and a busy release would break it: it is released for {demander!r} once its "
        f"probe reads idle (waited {waited_s:.0f}s of its drain_timeout_s {limit_s:g})",
        f"nothing to do: it is released as soon as its requests end; past drain_timeout_s it is left alone and "
        f"other tenants are taken; give {demander!r} less needs_vram_gb if it needs less",
        {"tenant": tenant, "for": demander, "waited_s": round(waited_s, 3), "drain_timeout_s": limit_s},
    )


def idle_event(r: IdleRelease) -> TimelineEvent:
    """The request entry for an idle release."""
    return TimelineEvent(
        codes.VRAM_RELEASE_REQUESTED,
        r.tenant_id,
        r.message,
        {
            "tenant": r.tenant_id,
            "held_bytes": r.held_bytes,
            "idle_for_s": round(r.idle_for_s, 3),
            "idle_release_after_s": r.limit_s,
            "why": "idle",
        },
    )


def request_events(p: HandoffPlan, drained_s: Mapping[str, float] | None = None) -> tuple[TimelineEvent, ...]:
    """One request entry per tenant the plan releases, each naming the demander (and, for one
    waited for until idle, how long that took)."""
    drained = drained_s or {}
    return tuple(
        TimelineEvent(
            codes.VRAM_RELEASE_REQUESTED,
            t,
            f"asking {t!r} to release its VRAM for {p.demander!r} (short {gb(p.starvation.shortfall_bytes)})"
            + (f", idle after {drained[t]:.1f}s of waiting" if t in drained else ""),
            {"tenant": t, "held_bytes": p.held_by(t), "for": p.demander, "why": "handoff"}
            | ({"drained_s": round(drained[t], 3)} if t in drained else {}),
        )
        for t in p.release
    )


# --- one decision's handoff: idle tracking, plans, idle releases, confirmation ---------------

#: a release is confirmed once the tenant holds at most this share of what it held when asked
RELEASED_SHARE = 0.5
#: an idle tenant is asked again only once it holds this much more than after its last release
IDLE_REGROWTH_BYTES = 256 << 20
#: a release that had nothing to send is tried again after this long (its probe is read anew)
MOOT_RETRY_S = 1.0


#: what the handoff puts before a job's id to name it beside tenants (no rule id has a colon)
JOB_PREFIX = "job:"


def job_tenant(job_id: str) -> str:
    """The handoff's name for a job."""
    return f"{JOB_PREFIX}{job_id}"


@dataclass(frozen=True)
class Step:
    states: Mapping[str, TenantVramState]
    releases: tuple[Release, ...]
    events: tuple[TimelineEvent, ...]
    notes: Mapping[str, Reason]  # a starved tenant whose plan cannot cover, and why
    #: job tenant id → the tenant it is paused for: asked now, awaiting its VRAM falling, or
    #: released to a tenant that is still busy
    job_pauses: Mapping[str, str] = field(default_factory=dict)


def _plan_key(p: HandoffPlan) -> str:
    """What makes a plan news: a blocked plan that stays the same is logged once."""
    return (
        f"{p.covers}|{','.join(p.release)}|{','.join(p.awaiting)}|{','.join(p.draining)}|"
        f"{','.join(b.tenant_id for b in p.blockers)}"
    )


def request_over(
    st: TenantVramState, failed: bool, why: str, held: int, timeout_s: float, now: float
) -> TenantVramState:
    """What the release worker reports of a request that brings no VRAM back: a failed one
    waits its ``timeout_s``; a handoff with nothing to send, a moment; an idle one with
    nothing to send only waits for the tenant to hold more than it does now.  A wake that
    failed or had nothing to send waits out its backoff."""
    if why == wake.REACQUIRE:
        return wake.failed(st, now)
    if failed:
        return settled(st, now, timeout_s, None)
    return settled(st, now, 0.0 if why == "idle" else MOOT_RETRY_S, held)


def settled(st: TenantVramState, now: float, retry_s: float, held_after: int | None) -> TenantVramState:
    """A request is over (done, failed, or it had nothing to send): not asked again for
    ``retry_s``, and idle release waits for it to hold more than it holds now."""
    return evolve(
        st,
        requested_at=None,
        held_at_request=0,
        why="",
        retry_at=now + retry_s,
        floor=held_after if held_after is not None else st.floor,
    )


def step(
    seen: Sequence[TenantObs],
    prev: Mapping[str, TenantVramState],
    free_bytes: int | None,
    now: float,
    faulty: bool = False,
) -> Step:
    """Track idleness, confirm or time out releases asked before, plan for starved tenants,
    and ask idle ones past their limit to release.  Tenants not running are forgotten (a
    release pending for one that exited is done: its VRAM went with it).  ``faulty``: this
    observation cannot say who runs (the process table failed): nothing is concluded."""
    if faulty:
        return Step(prev, (), (), {})
    events: list[TimelineEvent] = []
    releases: list[Release] = []
    states: dict[str, TenantVramState] = {}
    running = {t.tenant_id for t in seen}
    for rid, st in prev.items():
        if st.requested_at is not None and rid not in running:
            events.append(
                TimelineEvent(
                    codes.VRAM_RELEASED,
                    rid,
                    f"{rid!r} exited {now - st.requested_at:.1f}s after it was asked to release: its VRAM went with it",
                    {"tenant": rid, "duration_s": round(now - st.requested_at, 3), "exited": True},
                )
            )
    for t in seen:
        st = prev.get(t.tenant_id, TenantVramState())
        idle_since = (st.idle_since if st.idle_since is not None else now) if t.busy is False else None
        st = evolve(st, idle_since=idle_since)
        if st.requested_at is not None and st.held_at_request > 0:
            took = now - st.requested_at
            if t.held_bytes is not None and t.held_bytes <= st.held_at_request * RELEASED_SHARE:
                events.append(
                    TimelineEvent(
                        codes.VRAM_RELEASED,
                        t.tenant_id,
                        f"{t.tenant_id!r} released {gb(st.held_at_request - t.held_bytes)} in {took:.2f}s ({st.why})",
                        {
                            "tenant": t.tenant_id,
                            "duration_s": round(took, 3),
                            "freed_bytes": st.held_at_request - t.held_bytes,
                            "held_bytes": t.held_bytes,
                            "why": st.why,
                        },
                    )
                )
                st = settled(st, now, 0.0, t.held_bytes)
            elif took >= t.timeout_s:
                still = "cannot be read" if t.held_bytes is None else gb(t.held_bytes)
                events.append(
                    TimelineEvent(
                        codes.VRAM_RELEASE_FAILED,
                        t.tenant_id,
                        f"{t.tenant_id!r} was asked to release {gb(st.held_at_request)} {took:.0f}s ago ({st.why}) and "
                        f"still holds {still}: less than half of it came back within its timeout_s {t.timeout_s:g}",
                        {
                            "tenant": t.tenant_id,
                            "held_at_request": st.held_at_request,
                            "held_bytes": t.held_bytes,
                            "timeout_s": t.timeout_s,
                            "why": st.why,
                            "remedy": "raise the release's timeout_s if its unloads wait for long requests; check that its "
                            "release: request really unloads",
                        },
                    )
                )
                st = evolve(settled(st, now, t.timeout_s, t.held_bytes), for_demander="")
        states[t.tenant_id] = st

    def asking(tenant: TenantObs, why: str, demander: str = "") -> None:
        st = states[tenant.tenant_id]
        if tenant.job:  # its release is its pause, which the caller makes
            states[tenant.tenant_id] = evolve(
                st, requested_at=now, held_at_request=tenant.held_bytes or 0, why=why, for_demander=demander
            )
            return
        releases.append(Release(tenant.tenant_id, why, tenant.held_bytes or 0, tenant.timeout_s))
        if why != "idle" and tenant.reacquire_after_s is not None:
            st = wake.asleep(st, tenant.held_bytes or 0)
        if tenant.confirm:
            states[tenant.tenant_id] = evolve(st, requested_at=now, held_at_request=tenant.held_bytes or 0, why=why)
        else:  # the request's own answer is all there is to know: just not asked again at once
            states[tenant.tenant_id] = evolve(st, retry_at=now + tenant.timeout_s, floor=tenant.held_bytes)

    def cooling(t: TenantObs) -> bool:
        st = states[t.tenant_id]
        return st.requested_at is None and st.retry_at is not None and now < st.retry_at

    def idle_worth_asking(t: TenantObs) -> bool:
        """Idle release asks again only for VRAM taken since its last release ended."""
        floor = states[t.tenant_id].floor
        return floor is None or (t.held_bytes or 0) > floor + IDLE_REGROWTH_BYTES

    views = [
        TenantVram(
            t.tenant_id,
            t.priority,
            t.busy,
            t.held_bytes or 0,
            t.reclaimable,
            t.needs_bytes,
            states[t.tenant_id].idle_since,
            # one that must be woken gives its VRAM only for a handoff: released while idle it
            # would answer errors, and nothing would bring it back on its next request
            t.idle_release_after_s if t.reclaimable and idle_worth_asking(t) and t.reacquire_after_s is None else None,
            states[t.tenant_id].requested_at is not None,
            cooling(t),
            t.when_busy,
            t.busy is not False
            and (since := states[t.tenant_id].drain_since) is not None
            and now - since >= t.drain_timeout_s,
        )
        for t in seen
    ]
    by_id = {t.tenant_id: t for t in seen}
    notes: dict[str, Reason] = {}
    planned: dict[str, str] = {}
    made = plans(views, free_bytes) if free_bytes is not None else ()
    # waited for until idle: kept while a plan still counts on it or it is left alone past its
    # drain_timeout_s and still busy (so it is not waited for again at once)
    held_back = {tid for p in made for tid in p.draining} | {
        b.tenant_id for p in made for b in p.blockers if b.why == WHY_DRAIN_EXPIRED
    }
    drained_s: dict[str, float] = {}
    for t in seen:
        since = states[t.tenant_id].drain_since
        if t.tenant_id in held_back:
            states[t.tenant_id] = evolve(states[t.tenant_id], drain_since=now if since is None else since)
        elif since is not None:
            drained_s[t.tenant_id] = now - since
            states[t.tenant_id] = evolve(states[t.tenant_id], drain_since=None)
    if free_bytes is not None:
        for p in made:
            key = _plan_key(p)
            planned[p.demander] = key
            if key != states[p.demander].plan:
                events.append(plan_event(p))  # logged before anything it asks for
            if p.covers:
                events.extend(request_events(p, drained_s))
                for tid in p.release:
                    asking(by_id[tid], f"handoff for {p.demander}", p.demander)
                for tid in p.draining:
                    since = states[tid].drain_since
                    waiting = drain_reason(
                        tid, p.demander, now - (now if since is None else since), by_id[tid].drain_timeout_s
                    )
                    notes[tid] = waiting
                    notes.setdefault(p.demander, waiting)
            else:
                reason = plan_reason(p)
                if reason is not None:
                    notes[p.demander] = reason
    asked = {r.rule_id for r in releases}
    # idle release needs no free-VRAM figure: what an idle tenant holds is enough to go on
    for idle in idle_releases([v for v in views if v.tenant_id not in asked], now):
        events.append(idle_event(idle))
        asking(by_id[idle.tenant_id], "idle")
    wakes = wake.step(seen, states, views, made, free_bytes, now)
    states = dict(wakes.states)
    events.extend(wakes.events)
    releases.extend(wakes.requests)
    for rid, note in wakes.notes.items():
        notes.setdefault(rid, note)
    for tid in states:
        states[tid] = evolve(states[tid], plan=planned.get(tid, ""))
    job_pauses: dict[str, str] = {}
    for t in seen:
        st = states[t.tenant_id]
        if not t.job or not st.for_demander:
            continue
        demander = by_id.get(st.for_demander)
        if st.requested_at is not None or (demander is not None and demander.busy is not False):
            job_pauses[t.tenant_id] = st.for_demander
        else:  # the tenant it gave its memory to is idle or gone: it may have it back
            states[t.tenant_id] = evolve(st, for_demander="")
    return Step(states, tuple(releases), tuple(events), notes, job_pauses)
