"""The VRAM handoff plan and idle release (SPEC section 7) with a fake clock: starvation and
its shortfall, candidates and their order, a plan carried out only when it covers the
shortfall, blockers and why, unknown state counting as busy, the SPEC section 1 failure
replayed, and idle tenants released past ``idle_release_after_s``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from arbiter.engine import codes
from arbiter.engine.decide import decide
from arbiter.engine.handoff import (
    GIB,
    WHY_ENOUGH,
    WHY_NO_RELEASE,
    WHY_RANKS,
    WHY_UNKNOWN_RANKS,
    TenantObs,
    TenantVram,
    idle_event,
    idle_releases,
    plan,
    plan_event,
    plan_reason,
    plans,
    request_events,
    starvation,
    step,
)
from arbiter.engine.types import EngineState, Observation, Policy, RuleObs, RulePolicy, SourceObs


def gb(x: float) -> int:
    return int(x * GIB)


class Clock:
    """A fake clock: the engine reads none, the test moves this one."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> float:
        self.t += s
        return self.t


def llm(busy: bool | None = True, held: float = 13, **kw: Any) -> TenantVram:
    return TenantVram("llm-server", 50, busy, gb(held), True, **kw)


def diffusion(busy: bool | None = True, held: float = 1.6, needs: float | None = 12, **kw: Any) -> TenantVram:
    return TenantVram(
        "diffusion-server",
        60,
        busy,
        gb(held),
        True,
        needs_bytes=None if needs is None else gb(needs),
        **kw,
    )


# --- starvation ---------------------------------------------------------------------------


def test_starved_when_free_plus_held_is_below_needs_and_the_shortfall() -> None:
    s = starvation(diffusion(), gb(1))
    assert s is not None
    assert s.shortfall_bytes == gb(12) - gb(1) - gb(1.6)
    assert not s.state_unknown


@pytest.mark.parametrize(
    ("free", "held", "starved"),
    [
        (gb(10), gb(2), False),  # exactly enough
        (gb(10) - 1, gb(2), True),  # one byte short
        (0, gb(12), False),
        (gb(20), 0, False),
    ],
)
def test_starvation_boundary(free: int, held: int, starved: bool) -> None:
    tenant = replace(diffusion(), held_bytes=held)
    found = starvation(tenant, free)
    assert (found is not None) is starved
    if found is not None:
        assert found.shortfall_bytes == 1


def test_an_idle_tenant_or_one_without_needs_is_never_starved() -> None:
    assert starvation(diffusion(busy=False), 0) is None
    assert starvation(diffusion(needs=None), 0) is None


def test_unknown_state_counts_as_busy_for_the_demander() -> None:
    s = starvation(diffusion(busy=None), gb(1))
    assert s is not None and s.state_unknown
    p = plan(diffusion(busy=None), [llm()], gb(1))
    assert p is not None and "unknown" in p.summary()


def test_negative_free_is_read_as_none_free() -> None:
    s = starvation(diffusion(), -5)
    assert s is not None and s.free_bytes == 0


# --- the SPEC section 1 failure -----------------------------------------------------------


def test_spec_section_1_failure_replayed_the_demander_still_gets_its_memory() -> None:
    """An LLM server (priority 50) yields, reloads 13 GB two seconds later and is busy; the
    diffusion job (priority 60) starved at 1.6 GB is planned the memory again, instead of a
    "never interrupt busy work" rule leaving it squeezed for the whole run."""
    clock = Clock()
    free = gb(24 - 13 - 1.6)  # a 24 GB card: the LLM holds 13, diffusion squeezed into 1.6
    first = plan(diffusion(), [llm(), diffusion()], free)
    assert first is not None and first.covers and first.release == ("llm-server",)
    assert [e.code for e in request_events(first)] == [codes.VRAM_RELEASE_REQUESTED]

    # the release is asked; while it is on its way the tick plans again: nothing new to ask
    clock.advance(0.5)
    waiting = plan(diffusion(), [llm(releasing=True)], free)
    assert waiting is not None and waiting.covers and waiting.release == () and waiting.awaiting == ("llm-server",)

    # it yields (VRAM falls), then two seconds later a request reloads it and it is busy again
    clock.advance(0.5)
    assert plan(diffusion(held=12), [llm(held=0, busy=False)], gb(24 - 12)) is None  # diffusion has what it needs
    clock.advance(2.0)
    reloaded = plan(diffusion(held=1.6), [llm(held=13, busy=True)], gb(24 - 13 - 1.6))
    assert reloaded is not None and reloaded.covers and reloaded.release == ("llm-server",), (
        "a busy tenant ranked below the demander is asked again, however recently it yielded"
    )
    assert clock() == 1003.0


def test_equal_priority_is_never_preempted() -> None:
    peer = TenantVram("other-diffusion", 60, True, gb(13), True)
    p = plan(diffusion(), [peer], gb(1))
    assert p is not None and not p.covers and p.release == ()
    assert [(b.tenant_id, b.why) for b in p.blockers] == [("other-diffusion", WHY_RANKS)]
    higher = replace(peer, priority=90)
    p2 = plan(diffusion(), [higher], gb(1))
    assert p2 is not None and p2.release == () and p2.blockers[0].why == WHY_RANKS


def test_unknown_state_counts_as_busy_for_a_candidate() -> None:
    unknown_peer = TenantVram("peer", 60, None, gb(13), True)
    p = plan(diffusion(), [unknown_peer], gb(1))
    assert p is not None and p.release == () and p.blockers[0].why == WHY_UNKNOWN_RANKS
    unknown_lower = replace(unknown_peer, priority=10)
    p2 = plan(diffusion(), [unknown_lower], gb(1))
    assert p2 is not None and p2.release == ("peer",)


def test_a_plan_that_cannot_cover_the_shortfall_releases_nothing() -> None:
    small = TenantVram("embedder", 10, False, gb(2), True)
    fixed = TenantVram("desktop", 90, True, gb(1), False)
    peer = TenantVram("renderer", 70, True, gb(8), True)
    p = plan(diffusion(), [small, fixed, peer], gb(1))
    assert p is not None
    assert not p.covers and p.release == () and p.awaiting == () and p.planned_bytes == 0
    assert p.candidates == ("embedder",) and p.reclaimable_bytes == gb(2)
    assert {b.tenant_id: b.why for b in p.blockers} == {"desktop": WHY_NO_RELEASE, "renderer": WHY_RANKS}
    event = plan_event(p)
    assert event.code == codes.VRAM_HANDOFF_BLOCKED and event.subject == "diffusion-server"
    assert "releasing nothing" in event.message and event.data["covers"] is False
    reason = plan_reason(p)
    assert reason is not None and reason.code == codes.VRAM_HANDOFF_BLOCKED
    assert "'renderer'" in reason.remedy and "release:" in reason.remedy
    assert request_events(p) == ()


# --- candidates and order -----------------------------------------------------------------


def test_order_idle_first_then_lowest_priority_then_largest_vram_and_stop_once_covered() -> None:
    tenants = [
        TenantVram("busy-low", 5, True, gb(20), True),
        TenantVram("idle-high", 95, False, gb(1), True),  # idle tenants of any rank are candidates
        TenantVram("idle-low-small", 10, False, gb(2), True),
        TenantVram("idle-low-big", 10, False, gb(4), True),
        TenantVram("busy-mid", 40, True, gb(6), True),
    ]
    p = plan(diffusion(), tenants, gb(1))  # shortfall 9.4 GB
    assert p is not None
    assert p.candidates == ("idle-low-big", "idle-low-small", "idle-high", "busy-low", "busy-mid")
    assert p.covers and p.release == ("idle-low-big", "idle-low-small", "idle-high", "busy-low")
    assert p.planned_bytes == gb(4 + 2 + 1 + 20)
    assert [(b.tenant_id, b.why) for b in p.blockers] == [("busy-mid", WHY_ENOUGH)]
    assert p.held_by("busy-low") == gb(20)
    assert plan_reason(p) is None
    assert plan_event(p).code == codes.VRAM_HANDOFF_PLANNED
    assert [e.subject for e in request_events(p)] == list(p.release)
    assert request_events(p)[0].data == {
        "tenant": "idle-low-big",
        "held_bytes": gb(4),
        "for": "diffusion-server",
        "why": "handoff",
    }


def test_stops_at_the_first_tenant_that_covers() -> None:
    tenants = [TenantVram("idle-a", 10, False, gb(10), True), TenantVram("idle-b", 20, False, gb(10), True)]
    p = plan(diffusion(), tenants, gb(1))
    assert p is not None and p.release == ("idle-a",)
    assert [(b.tenant_id, b.why) for b in p.blockers] == [("idle-b", WHY_ENOUGH)]


def test_a_tenant_holding_nothing_is_neither_candidate_nor_blocker_and_the_demander_is_skipped() -> None:
    empty = TenantVram("empty", 10, False, 0, True)
    p = plan(diffusion(), [diffusion(), empty, llm()], gb(1))
    assert p is not None and p.candidates == ("llm-server",) and p.blockers == ()


def test_not_starved_means_no_plan() -> None:
    assert plan(diffusion(), [llm()], gb(20)) is None
    assert plan(diffusion(busy=False), [llm()], 0) is None


def test_plans_for_several_demanders_highest_first_without_taking_a_tenant_twice() -> None:
    top = TenantVram("top", 80, True, 0, True, needs_bytes=gb(8))
    mid = TenantVram("mid", 60, True, 0, True, needs_bytes=gb(8))
    idle = TenantVram("idle", 10, False, gb(9), True)
    low = TenantVram("low", 20, True, gb(9), True)
    out = plans([mid, idle, top, low], 0)
    assert [(p.demander, p.release) for p in out] == [("top", ("idle",)), ("mid", ("low",))]


def test_plans_skip_a_demander_another_plan_releases() -> None:
    top = TenantVram("top", 80, True, 0, True, needs_bytes=gb(8))
    lower = TenantVram("lower", 60, True, gb(9), True, needs_bytes=gb(20))
    out = plans([top, lower], 0)
    assert [(p.demander, p.release) for p in out] == [("top", ("lower",))]


def test_plan_summary_and_data_name_the_numbers() -> None:
    p = plan(diffusion(), [llm()], gb(1))
    assert p is not None
    assert p.to_data()["shortfall_bytes"] == gb(12) - gb(1) - gb(1.6)
    assert "needs 12.0 GB" in p.summary() and "'llm-server'" in p.summary()


# --- idle release -------------------------------------------------------------------------


def test_idle_tenants_past_their_limit_are_released() -> None:
    clock = Clock()
    idle_llm = llm(busy=False, idle_since=clock(), idle_release_after_s=0)
    idle_diff = diffusion(busy=False, held=6, idle_since=clock(), idle_release_after_s=30)
    assert [r.tenant_id for r in idle_releases([idle_llm, idle_diff], clock())] == ["llm-server"]
    clock.advance(29.9)
    assert [r.tenant_id for r in idle_releases([idle_llm, idle_diff], clock())] == ["llm-server"]
    clock.advance(0.1)
    out = idle_releases([idle_llm, idle_diff], clock())
    assert [r.tenant_id for r in out] == ["diffusion-server", "llm-server"]
    assert out[0].idle_for_s == pytest.approx(30.0) and out[0].held_bytes == gb(6)
    event = idle_event(out[0])
    assert event.code == codes.VRAM_RELEASE_REQUESTED and "idle for 30s" in event.message
    assert event.data["why"] == "idle"


def test_idle_release_skips_busy_unknown_unreclaimable_releasing_empty_and_unlimited() -> None:
    clock = Clock()
    base = TenantVram("t", 50, False, gb(1), True, idle_since=clock(), idle_release_after_s=5)
    later = clock.advance(60)
    assert len(idle_releases([base], later)) == 1
    for other in (
        replace(base, busy=True),
        replace(base, busy=None),
        replace(base, reclaimable=False),
        replace(base, releasing=True),
        replace(base, held_bytes=0),
        replace(base, idle_release_after_s=None),
        replace(base, idle_since=None),
    ):
        assert idle_releases([other], later) == (), other


def test_becoming_idle_again_restarts_the_wait() -> None:
    clock = Clock()
    t = TenantVram("t", 50, False, gb(1), True, idle_since=clock(), idle_release_after_s=10)
    clock.advance(8)
    t = replace(t, idle_since=clock())  # it was busy in between: the caller passes the new time
    assert idle_releases([t], clock.advance(9)) == ()
    assert len(idle_releases([t], clock.advance(1))) == 1


# --- one decision's handoff step, with a fake clock ------------------------------------------


def seen(
    tid: str,
    priority: int,
    busy: bool | None,
    held_gb: float | None,
    reclaimable: bool = True,
    needs_gb: float | None = None,
    idle_after: float = 30.0,
    timeout: float = 10.0,
    confirm: bool = True,
) -> TenantObs:
    return TenantObs(
        tid,
        priority,
        busy,
        None if held_gb is None else int(held_gb * GIB),
        reclaimable,
        None if needs_gb is None else int(needs_gb * GIB),
        idle_after,
        timeout,
        confirm,
    )


def test_a_starved_demander_gets_its_release_then_the_readers_confirm_it() -> None:
    tenants = [seen("llm", 50, True, 13), seen("diffusion", 60, True, 1.6, needs_gb=12)]
    first = step(tenants, {}, free_bytes=int(1 * GIB), now=100.0)
    assert [r.rule_id for r in first.releases] == ["llm"] and first.releases[0].why == "handoff for diffusion"
    assert [e.code for e in first.events] == [codes.VRAM_HANDOFF_PLANNED, codes.VRAM_RELEASE_REQUESTED]
    assert first.states["llm"].requested_at == 100.0
    # still holding a moment later: nothing new is asked, the plan awaits it
    again = step(tenants, first.states, int(1 * GIB), 100.5)
    assert not again.releases and not [e for e in again.events if e.code == codes.VRAM_RELEASE_REQUESTED]
    freed = step([seen("llm", 50, False, 0.3), tenants[1]], again.states, int(13.7 * GIB), 101.25)
    done = [e for e in freed.events if e.code == codes.VRAM_RELEASED]
    assert done and done[0].data["duration_s"] == 1.25 and freed.states["llm"].requested_at is None


def test_a_release_that_frees_nothing_fails_after_its_timeout_and_is_not_asked_again_at_once() -> None:
    tenants = [seen("llm", 50, True, 13, timeout=5), seen("diffusion", 60, True, 1.6, needs_gb=12)]
    s = step(tenants, {}, int(1 * GIB), 0.0)
    s = step(tenants, s.states, int(1 * GIB), 5.0)
    failed = [e for e in s.events if e.code == codes.VRAM_RELEASE_FAILED]
    assert failed and "still holds 13.0 GB" in failed[0].message and "timeout_s" in failed[0].data["remedy"]
    assert not s.releases  # cooling down
    later = step(tenants, s.states, int(1 * GIB), 10.5)
    assert [r.rule_id for r in later.releases] == ["llm"]


def test_a_plan_that_cannot_cover_is_logged_once_releases_nothing_and_says_why() -> None:
    tenants = [seen("llm", 70, True, 13), seen("diffusion", 60, True, 1.6, needs_gb=12)]
    s = step(tenants, {}, int(1 * GIB), 0.0)
    assert not s.releases and [e.code for e in s.events] == [codes.VRAM_HANDOFF_BLOCKED]
    assert "ranks at or above" in s.notes["diffusion"].message and s.notes["diffusion"].remedy
    s2 = step(tenants, s.states, int(1 * GIB), 1.0)
    assert not s2.events  # the same blocked plan is not logged again


def test_an_idle_tenant_is_asked_after_idle_release_after_s_and_a_fire_and_forget_one_is_not_tracked() -> None:
    tenants = [seen("diffusion", 60, False, 6, idle_after=30)]
    s = step(tenants, {}, int(10 * GIB), 0.0)
    assert not s.releases
    s = step(tenants, s.states, int(10 * GIB), 29.0)
    assert not s.releases
    s = step(tenants, s.states, int(10 * GIB), 30.0)
    assert [(r.rule_id, r.why) for r in s.releases] == [("diffusion", "idle")]
    quick = step([seen("x", 50, False, 2, idle_after=0, confirm=False)], {}, int(10 * GIB), 0.0)
    assert quick.releases and quick.states["x"].requested_at is None


def test_a_tenant_that_exits_while_releasing_has_released() -> None:
    tenants = [seen("llm", 50, True, 13), seen("diffusion", 60, True, 1.6, needs_gb=12)]
    s = step(tenants, {}, int(1 * GIB), 0.0)
    gone = step([tenants[1]], s.states, int(14 * GIB), 2.0)
    assert [e.data.get("exited") for e in gone.events if e.code == codes.VRAM_RELEASED] == [True]


def test_the_decision_asks_for_releases_and_applies_a_working_tenants_profile() -> None:
    policy = Policy(
        rules={
            "llm": RulePolicy("llm", priority=50, reclaimable=True, busy_probe=True, profile=True),
            "diffusion": RulePolicy("diffusion", priority=60, busy_probe=True, needs_vram_bytes=12 * GIB),
        }
    )
    busy = SourceObs(readable=True, busy=True)
    obs = Observation(
        now=1.0,
        vram_free_bytes=1 * GIB,
        rules={
            "llm": RuleObs("llm", running=True, pids=frozenset({5}), gpu_share=0.5, busy=busy, vram_bytes=13 * GIB),
            "diffusion": RuleObs(
                "diffusion", running=True, pids=frozenset({6}), gpu_share=0.0, busy=busy, vram_bytes=int(1.6 * GIB)
            ),
        },
    )
    d = decide(obs, EngineState(), policy, 1.0)
    assert [r.rule_id for r in d.releases] == ["llm"] and d.profiles_on == ("llm",)
    idle = replace(obs, rules={**obs.rules, "llm": replace(obs.rules["llm"], gpu_share=0.0)})
    later = decide(replace(idle, now=30.0), d.state, replace(policy, release_after_s=10.0), 30.0)
    assert later.profiles_off == ("llm",)
    # a busy probe that cannot be read is unknown, which counts as busy
    unknown = replace(obs, rules={**obs.rules, "llm": replace(obs.rules["llm"], busy=SourceObs(readable=False))})
    u = decide(unknown, EngineState(), policy, 1.0)
    assert [r.rule_id for r in u.releases] == ["llm"]  # below the demander: asked all the same


def test_a_tenant_cooling_after_a_failed_release_blocks_and_is_never_counted_on() -> None:
    tenants = [
        seen("a", 40, True, 6, timeout=5),
        seen("b", 45, True, 6, timeout=5),
        seen("d", 60, True, 1, needs_gb=12),
    ]
    s = step(tenants, {}, int(1 * GIB), 0.0)
    assert sorted(r.rule_id for r in s.releases) == ["a", "b"]
    s = step(tenants, s.states, int(1 * GIB), 5.0)  # neither freed anything
    assert {e.data["tenant"] for e in s.events if e.code == codes.VRAM_RELEASE_FAILED} == {"a", "b"}
    again = step(tenants, s.states, int(1 * GIB), 6.0)
    assert not again.releases and "asked again after" in again.notes["d"].message


def test_idle_release_asks_again_only_for_vram_taken_since_and_a_fire_and_forget_one_waits() -> None:
    s = step([seen("x", 50, False, 6, idle_after=0)], {}, int(10 * GIB), 0.0)
    s = step([seen("x", 50, False, 0.4, idle_after=0)], s.states, int(10 * GIB), 1.0)  # its context stays
    assert [e.code for e in s.events] == [codes.VRAM_RELEASED]
    for t in (2.0, 30.0, 300.0):
        s = step([seen("x", 50, False, 0.4, idle_after=0)], s.states, int(10 * GIB), t)
        assert not s.releases  # nothing new to ask for
    s = step([seen("x", 50, False, 6, idle_after=0)], s.states, int(10 * GIB), 301.0)
    assert s.releases  # it loaded again
    quiet = step([seen("q", 50, False, 2, idle_after=0, confirm=False, timeout=10)], {}, int(10 * GIB), 0.0)
    assert quiet.releases
    for t in (0.001, 0.5, 9.0):
        quiet = step([seen("q", 50, False, 2, idle_after=0, confirm=False, timeout=10)], quiet.states, int(10 * GIB), t)
        assert not quiet.releases


def test_nothing_is_concluded_from_an_observation_that_cannot_see_who_runs() -> None:
    tenants = [seen("llm", 50, True, 13), seen("diffusion", 60, True, 1.6, needs_gb=12)]
    s = step(tenants, {}, int(1 * GIB), 0.0)
    blind = step([], s.states, int(1 * GIB), 1.0, faulty=True)
    assert blind.states == s.states and not blind.events and not blind.releases


def test_idle_release_needs_no_free_vram_figure() -> None:
    s = step([seen("x", 50, False, 6, idle_after=0)], {}, None, 0.0)
    assert [r.rule_id for r in s.releases] == ["x"]
