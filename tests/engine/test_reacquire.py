"""The way back after a handoff release, on a fake clock: woken after the quiet period once no
demander needs the VRAM, never into a shortfall, confirmed by the VRAM rising, retried with
backoff, and never after an idle release."""

from __future__ import annotations

from dataclasses import replace

from arbiter.engine import codes
from arbiter.engine.handoff import Step, TenantObs, request_over, step
from arbiter.engine.reacquire import REACQUIRE, backoff_s
from arbiter.engine.types import TenantVramState

GIB = 1 << 30


def tenant(
    tid: str,
    priority: int,
    busy: bool | None,
    held_gb: float,
    needs_gb: float | None = None,
    after: float | None = None,
    confirm: bool = True,
) -> TenantObs:
    return TenantObs(
        tid,
        priority,
        busy,
        int(held_gb * GIB),
        True,
        None if needs_gb is None else int(needs_gb * GIB),
        30.0,
        10.0,
        True,
        reacquire_after_s=after,
        reacquire_timeout_s=20.0,
        reacquire_confirm=confirm,
    )


def codes_of(s: Step) -> list[str]:
    return [e.code for e in s.events]


def asleep_llm() -> tuple[dict[str, TenantVramState], float]:
    """vLLM (priority 50, 13 GB) put to sleep for a diffusion server (60) that needs 12 GB."""
    s = step([tenant("llm", 50, True, 13, after=10), tenant("diff", 60, True, 1.6, needs_gb=12)], {}, GIB, 0.0)
    assert [r.rule_id for r in s.releases] == ["llm"]
    s = step(
        [tenant("llm", 50, False, 0.4, after=10), tenant("diff", 60, True, 1.6, needs_gb=12)], s.states, 13 * GIB, 1.0
    )
    assert codes.VRAM_RELEASED in codes_of(s)
    assert s.states["llm"].asleep_bytes == 13 * GIB
    return dict(s.states), 1.0


def test_woken_after_the_demander_is_done_and_the_quiet_period() -> None:
    states, _ = asleep_llm()
    busy_diff = tenant("diff", 60, True, 12, needs_gb=12)
    llm = tenant("llm", 50, False, 0.4, after=10)
    # the demander holds what it needs and is busy: taking 13 GB back would leave it short
    s = step([llm, busy_diff], states, GIB, 2.0)
    assert not s.releases
    # the demander went idle and gave its VRAM back: quiet from now
    idle_diff = tenant("diff", 60, False, 0.5, needs_gb=12)
    s = step([llm, idle_diff], s.states, 23 * GIB, 5.0)
    assert not s.releases and s.states["llm"].quiet_since == 5.0
    s = step([llm, idle_diff], s.states, 23 * GIB, 14.9)
    assert not s.releases
    s = step([llm, idle_diff], s.states, 23 * GIB, 15.0)
    assert [(r.rule_id, r.why, r.held_bytes) for r in s.releases] == [("llm", REACQUIRE, 13 * GIB)]
    assert codes_of(s) == [codes.VRAM_REACQUIRE_REQUESTED]
    # asked once: not again while its VRAM comes back
    s = step([llm, idle_diff], s.states, 23 * GIB, 16.0)
    assert not s.releases
    s = step([tenant("llm", 50, False, 13, after=10), idle_diff], s.states, 10 * GIB, 17.5)
    done = [e for e in s.events if e.code == codes.VRAM_REACQUIRED]
    assert done and done[0].data["duration_s"] == 2.5
    assert s.states["llm"].asleep_bytes == 0 and s.states["llm"].waking_at is None


def test_a_demander_that_needs_it_again_resets_the_quiet_period() -> None:
    states, _ = asleep_llm()
    llm = tenant("llm", 50, False, 0.4, after=10)
    idle_diff = tenant("diff", 60, False, 0.5, needs_gb=12)
    starved = tenant("diff", 60, True, 0.5, needs_gb=24)
    s = step([llm, idle_diff], states, 23 * GIB, 2.0)
    s = step([llm, starved], s.states, 23 * GIB, 8.0)  # starved again: it still needs the VRAM
    assert s.states["llm"].quiet_since is None
    s = step([llm, idle_diff], s.states, 23 * GIB, 9.0)
    s = step([llm, idle_diff], s.states, 23 * GIB, 18.0)
    assert not s.releases  # 9 s quiet, not 10
    s = step([llm, idle_diff], s.states, 23 * GIB, 19.0)
    assert [r.why for r in s.releases] == [REACQUIRE]


def test_never_woken_into_a_shortfall_and_says_why() -> None:
    states, _ = asleep_llm()
    llm = tenant("llm", 50, False, 0.4, after=10)
    # 13 GB to take back with 10 free: not free enough, whoever else runs
    other = tenant("other", 10, True, 6, needs_gb=8)
    s = step([llm, other], states, 10 * GIB, 2.0)
    s = step([llm, other], s.states, 10 * GIB, 13.0)
    assert not s.releases
    assert s.notes["llm"].code == codes.VRAM_REACQUIRE_WAITING and "only 10.0 GB is free" in s.notes["llm"].message
    # free enough for it, but the busy tenant would be left short of its need
    needy = tenant("other", 10, True, 2, needs_gb=8)
    s = step([llm, needy], s.states, 15 * GIB, 14.0)
    assert not s.releases and "'other' is busy and needs 8.0 GB" in s.notes["llm"].message
    s = step([llm, needy], s.states, 19 * GIB, 15.0)
    assert not s.releases and s.states["llm"].quiet_since == 15.0  # quiet only from when nothing stood in the way
    s = step([llm, needy], s.states, 19 * GIB, 25.0)
    assert [r.rule_id for r in s.releases] == ["llm"]


def test_a_wake_that_does_not_come_back_fails_and_backs_off() -> None:
    states, _ = asleep_llm()
    llm = tenant("llm", 50, False, 0.4, after=10)
    s = step([llm], states, 23 * GIB, 2.0)
    s = step([llm], s.states, 23 * GIB, 12.0)
    assert s.releases
    s = step([llm], s.states, 23 * GIB, 32.0)  # its 20 s timeout passed and the VRAM did not rise
    failed = [e for e in s.events if e.code == codes.VRAM_REACQUIRE_FAILED]
    assert failed and "remedy" in failed[0].data and s.states["llm"].wake_tries == 1
    assert s.states["llm"].wake_retry_at == 32.0 + backoff_s(1)
    s = step([llm], s.states, 23 * GIB, 36.0)
    assert not s.releases and "next try in 1s" in s.notes["llm"].message
    s = step([llm], s.states, 23 * GIB, 37.0)
    assert s.releases
    # the worker says the request itself failed: the backoff doubles
    st = request_over(s.states["llm"], True, REACQUIRE, 0, 20.0, 37.5)
    assert st.wake_tries == 2 and st.wake_retry_at == 37.5 + 10.0 and st.waking_at is None
    assert [backoff_s(n) for n in (1, 2, 3, 10)] == [5.0, 10.0, 20.0, 300.0]


def test_without_confirm_the_answer_is_enough() -> None:
    sg = tenant("sg", 50, True, 13, after=0, confirm=False)
    s = step([sg, tenant("d", 60, True, 1, needs_gb=12)], {}, GIB, 0.0)
    slept = replace(sg, busy=False, held_bytes=GIB // 5)
    s = step([slept, tenant("d", 60, False, 1)], s.states, 23 * GIB, 1.0)  # released, and no quiet period
    assert [r.why for r in s.releases] == [REACQUIRE] and s.states["sg"].asleep_bytes == 0
    s = step([slept, tenant("d", 60, False, 1)], s.states, 23 * GIB, 2.0)
    assert not s.releases and not s.events  # nothing to confirm: the worker records what it answered


def test_a_tenant_that_must_be_woken_is_not_released_for_idleness_and_one_without_reacquire_is_not_woken() -> None:
    idle = tenant("llm", 50, False, 6, after=0)
    s = step([idle], {}, 10 * GIB, 0.0)
    s = step([idle], s.states, 10 * GIB, 31.0)
    assert not s.releases
    s = step([replace(idle, reacquire_after_s=None)], s.states, 10 * GIB, 62.0)
    assert [r.why for r in s.releases] == ["idle"] and s.states["llm"].asleep_bytes == 0
    plain = replace(tenant("llm", 50, True, 13), reacquire_after_s=None)
    s = step([plain, tenant("d", 60, True, 1, needs_gb=12)], {}, GIB, 0.0)
    assert s.releases and s.states["llm"].asleep_bytes == 0


def test_the_tick_is_told_when_to_look_again() -> None:
    from arbiter.engine.reacquire import newly_due, next_look

    states, _ = asleep_llm()
    llm = tenant("llm", 50, False, 0.4, after=10)
    s = step([llm], states, 23 * GIB, 2.0)  # nothing stands in the way: quiet from 2 s, due at 12 s
    assert s.states["llm"].wake_due == 12.0 and newly_due(states, s.states)
    assert next_look(s.states.values(), 5.0, 0.02, 5.0) == 7.0
    again = step([llm], s.states, 23 * GIB, 3.0)
    assert not newly_due(s.states, again.states)  # the same due time: no extra look
    asked = step([llm], again.states, 23 * GIB, 12.0)
    assert asked.releases and next_look(asked.states.values(), 12.5, 0.02, 5.0) == 0.02  # its VRAM is awaited
    assert next_look(asked.states.values(), 18.0, 0.02, 5.0) is None  # awaited long enough: ticks will do
