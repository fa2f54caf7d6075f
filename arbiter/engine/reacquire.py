"""The way back after a release, as pure functions.

Some programs do not take their memory back by themselves once asked to free it: a server
put to sleep answers errors until it is told to wake up.  A tenant whose rule declares a
``reacquire:`` is, after a release made for a handoff, *asleep* with the bytes it gave up.
It is woken (its reacquire translator is called) once:

- no demander needs that VRAM any more: no starved tenant that ranks above it, and no plan
  that counts on it, for ``reacquire_after_s`` on end (the quiet period);
- taking the bytes back leaves no busy tenant short of what it needs, and they are free now
  (the plan never wakes a tenant into a shortfall);
- its last failed try's backoff has passed (5 s, doubling to 5 minutes).

A wake counts once the tenant's VRAM is seen to rise by half of what it gave up, or fails
after the reacquire's ``timeout_s``; where the rule says ``confirm: false``, the
translator's own answer is all there is.  Such a tenant is never released for being idle:
nothing would wake it on its next request.

No I/O and no clock reads: the caller passes the views, the free VRAM and ``now``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arbiter.engine import codes
from arbiter.engine.types import Reason, Release, TenantVramState, TimelineEvent, evolve

if TYPE_CHECKING:
    from arbiter.engine.vramplan import HandoffPlan, TenantObs, TenantVram

#: the ``why`` of a request to take VRAM back (it travels as a :class:`Release`)
REACQUIRE = "reacquire"
#: a wake is confirmed once the tenant holds this share of what it gave up on top of what
#: it held when woken
WOKEN_SHARE = 0.5
BACKOFF_S = 5.0
MAX_BACKOFF_S = 300.0
GIB = 1 << 30


def _gb(n: int) -> str:
    return f"{n / GIB:.1f} GB"


def backoff_s(tries: int) -> float:
    """How long after its ``tries``-th failure in a row a wake is tried again."""
    return float(min(MAX_BACKOFF_S, BACKOFF_S * 2 ** max(0, tries - 1)))


def asleep(st: TenantVramState, held_bytes: int) -> TenantVramState:
    """A release for a handoff was asked of a tenant that can be woken: it is asleep with
    what it held (a second release while asleep keeps the larger figure)."""
    return evolve(st, asleep_bytes=max(st.asleep_bytes, held_bytes), quiet_since=None)


def failed(st: TenantVramState, now: float) -> TenantVramState:
    """A wake failed (its translator said so, or the VRAM did not come back in time):
    it stays asleep and is tried again after its backoff."""
    tries = st.wake_tries + 1
    return evolve(st, waking_at=None, held_at_wake=0, wake_tries=tries, wake_retry_at=now + backoff_s(tries))


def woken(st: TenantVramState) -> TenantVramState:
    return evolve(
        st,
        asleep_bytes=0,
        quiet_since=None,
        waking_at=None,
        held_at_wake=0,
        wake_tries=0,
        wake_retry_at=None,
        wake_due=None,
    )


def newly_due(before: Mapping[str, TenantVramState], after: Mapping[str, TenantVramState]) -> bool:
    """Whether a quiet period (or backoff) began in this decision: the tick, which waits on
    the state it saw before, must look again at when it ends."""
    return any(
        st.wake_due is not None and (before.get(rid) is None or before[rid].wake_due != st.wake_due)
        for rid, st in after.items()
    )


def next_look(states: Iterable[TenantVramState], now: float, poll_s: float, poll_for_s: float) -> float | None:
    """How soon the daemon should decide again for the way back (None: no sooner than its
    tick): at once every ``poll_s`` while a wake's VRAM is awaited (for ``poll_for_s`` at
    most), and when a quiet period or a backoff ends."""
    soonest: float | None = None
    for st in states:
        if st.waking_at is not None and now - st.waking_at < poll_for_s:
            soonest = poll_s if soonest is None else min(soonest, poll_s)
        elif st.wake_due is not None and st.asleep_bytes > 0:
            wait = max(0.0, st.wake_due - now)
            soonest = wait if soonest is None else min(soonest, wait)
    return soonest


@dataclass(frozen=True)
class Wakes:
    states: Mapping[str, TenantVramState]
    requests: tuple[Release, ...]
    events: tuple[TimelineEvent, ...]
    notes: Mapping[str, Reason]


def wanted_by(tenant: TenantObs, plans: Iterable[HandoffPlan]) -> str | None:
    """The demander that still needs the tenant's VRAM: a starved tenant that ranks above
    it, or a plan that counts on it.  None when none does."""
    for p in plans:
        counted = tenant.tenant_id in (*p.candidates, *p.release, *p.awaiting)
        if p.demander != tenant.tenant_id and (p.starvation.priority > tenant.priority or counted):
            return p.demander
    return None


def shortfall_after(tenant: TenantObs, takes: int, views: Sequence[TenantVram], free_bytes: int) -> str | None:
    """Why taking ``takes`` bytes back now would leave someone short (None: it would not)."""
    if free_bytes < takes:
        return f"only {_gb(max(0, free_bytes))} is free of the {_gb(takes)} it takes back"
    for v in views:
        if v.tenant_id == tenant.tenant_id or not v.counts_busy or v.needs_bytes is None:
            continue
        if free_bytes - takes + v.held_bytes < v.needs_bytes:
            return (
                f"{v.tenant_id!r} is busy and needs {_gb(v.needs_bytes)}; with {_gb(takes)} taken back it would "
                f"have {_gb(free_bytes - takes + v.held_bytes)}"
            )
    return None


def step(
    seen: Sequence[TenantObs],
    states: Mapping[str, TenantVramState],
    views: Sequence[TenantVram],
    plans: Sequence[HandoffPlan],
    free_bytes: int | None,
    now: float,
) -> Wakes:
    """Confirm or time out wakes asked before, and wake the tenants whose VRAM no one
    needs any more."""
    out = dict(states)
    requests: list[Release] = []
    events: list[TimelineEvent] = []
    notes: dict[str, Reason] = {}
    for t in seen:
        st = out[t.tenant_id]
        if t.reacquire_after_s is None or (st.asleep_bytes <= 0 and st.waking_at is None):
            continue
        rid = t.tenant_id
        if st.waking_at is not None:
            took = now - st.waking_at
            target = st.held_at_wake + round(st.asleep_bytes * WOKEN_SHARE)
            if t.held_bytes is not None and t.held_bytes >= target:
                events.append(_event(codes.VRAM_REACQUIRED, rid, f"{rid!r} took its VRAM back in {took:.2f}s", {
                    "tenant": rid, "duration_s": round(took, 3), "held_bytes": t.held_bytes,
                    "asleep_bytes": st.asleep_bytes,
                }))  # fmt: skip
                out[rid] = woken(st)
            elif took >= t.reacquire_timeout_s:
                st = failed(st, now)
                still = "cannot be read" if t.held_bytes is None else _gb(t.held_bytes)
                events.append(_event(codes.VRAM_REACQUIRE_FAILED, rid, (
                    f"{rid!r} was asked {took:.0f}s ago to take back the {_gb(st.asleep_bytes)} it released and holds "
                    f"{still}: half of it did not come back within the reacquire's timeout_s {t.reacquire_timeout_s:g}"
                ), {
                    "tenant": rid, "held_bytes": t.held_bytes, "asleep_bytes": st.asleep_bytes,
                    "tries": st.wake_tries, "retry_in_s": round(backoff_s(st.wake_tries), 1),
                    "remedy": "check that its reacquire: request really wakes it (its own log says why not); raise "
                    "the reacquire's timeout_s if it only loads slowly",
                }))  # fmt: skip
                out[rid] = st
            continue
        if st.requested_at is not None:
            continue  # the release itself is still on its way
        blocker = _blocker(t, st, views, plans, free_bytes)
        if blocker is not None:  # the quiet period starts again once nothing stands in the way
            out[rid] = evolve(st, quiet_since=None, wake_due=None)
            if blocker[1]:
                notes[rid] = _waiting(rid, st, blocker[0], now)
            continue
        quiet_since = st.quiet_since if st.quiet_since is not None else now
        due = max(quiet_since + t.reacquire_after_s, st.wake_retry_at or 0.0)
        st = out[rid] = evolve(st, quiet_since=quiet_since, wake_due=due)
        if now - quiet_since < t.reacquire_after_s:
            continue
        if st.wake_retry_at is not None and now < st.wake_retry_at:
            notes[rid] = _waiting(rid, st, f"its last {st.wake_tries} tries to wake it failed", now)
            continue
        requests.append(Release(rid, REACQUIRE, st.asleep_bytes, t.reacquire_timeout_s))
        events.append(_event(codes.VRAM_REACQUIRE_REQUESTED, rid, (
            f"no one needs the {_gb(st.asleep_bytes)} {rid!r} released any more (for "
            f"{now - quiet_since:.0f}s): asking it to take it back"
        ), {"tenant": rid, "asleep_bytes": st.asleep_bytes, "free_bytes": free_bytes, "tries": st.wake_tries}))  # fmt: skip
        if t.reacquire_confirm:
            out[rid] = evolve(st, waking_at=now, held_at_wake=t.held_bytes or 0, wake_due=None)
        else:  # the translator's answer is all there is to know (the worker records it)
            out[rid] = woken(st)
    return Wakes(out, tuple(requests), tuple(events), notes)


def _blocker(
    t: TenantObs, st: TenantVramState, views: Sequence[TenantVram], plans: Sequence[HandoffPlan], free_bytes: int | None
) -> tuple[str, bool] | None:
    """What stands in the way of waking ``t`` now, and whether it is worth a note (a
    demander that needs the VRAM is the handoff working as it should: no note)."""
    demander = wanted_by(t, plans)
    if demander is not None:
        return f"{demander!r} still needs the VRAM", False
    if free_bytes is None:
        return "the device's free VRAM cannot be read", True
    short = shortfall_after(t, st.asleep_bytes, views, free_bytes)
    return None if short is None else (short, True)


def _event(code: str, rid: str, message: str, data: dict[str, Any]) -> TimelineEvent:
    return TimelineEvent(code, rid, message, data)


def _waiting(rid: str, st: TenantVramState, why: str, now: float) -> Reason:
    retry = (
        "" if st.wake_retry_at is None or now >= st.wake_retry_at else f"; next try in {st.wake_retry_at - now:.0f}s"
    )
    return Reason(
        codes.VRAM_REACQUIRE_WAITING,
        f"{rid!r} released {_gb(st.asleep_bytes)} for a handoff and is not woken yet: {why}{retry}",
        "it is woken by itself once the VRAM is free and no busy tenant would be short; `arbiter timeline` "
        "shows each try (VRAM_REACQUIRE_REQUESTED, VRAM_REACQUIRED, VRAM_REACQUIRE_FAILED)",
        {"tenant": rid, "asleep_bytes": st.asleep_bytes, "tries": st.wake_tries},
    )
