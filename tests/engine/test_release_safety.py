"""Release safety: a rule says what a busy release does to its server, and the handoff never
sends one that its rule says would break it."""

from __future__ import annotations

from arbiter.engine import codes
from arbiter.engine.handoff import WHY_BUSY_SKIP, WHY_DRAIN_EXPIRED, TenantObs, plan, step
from arbiter.engine.vramplan import GIB, TenantVram


def seen(
    tid: str, priority: int, busy: bool | None, held_gb: float, *, needs_gb: float | None = None, **kw: object
) -> TenantObs:
    return TenantObs(
        tid,
        priority,
        busy,
        int(held_gb * GIB),
        True,
        None if needs_gb is None else int(needs_gb * GIB),
        30.0,
        30.0,
        True,
        **kw,  # type: ignore[arg-type]
    )


def demander() -> TenantObs:
    return seen("render", 60, True, 1.0, needs_gb=12)


def test_a_busy_tenant_that_breaks_on_release_is_waited_for_and_released_once_idle() -> None:
    server = seen("sglang", 50, True, 13, when_busy="wait", drain_timeout_s=60.0)
    first = step([server, demander()], {}, int(1 * GIB), 100.0)
    assert first.releases == ()  # never released while busy
    assert first.notes["sglang"].code == codes.VRAM_RELEASE_DRAINING
    assert "'render'" in first.notes["sglang"].message
    assert first.notes["render"].code == codes.VRAM_RELEASE_DRAINING
    still = step([server, demander()], first.states, int(1 * GIB), 110.0)
    assert still.releases == ()
    idle = step([seen("sglang", 50, False, 13, when_busy="wait"), demander()], still.states, int(1 * GIB), 112.5)
    assert [r.rule_id for r in idle.releases] == ["sglang"]
    asked = [e for e in idle.events if e.code == codes.VRAM_RELEASE_REQUESTED]
    assert asked[0].data["drained_s"] == 12.5


def test_a_tenant_busy_past_its_drain_timeout_is_left_alone_and_others_are_taken() -> None:
    server = seen("sglang", 50, True, 13, when_busy="wait", drain_timeout_s=5.0)
    other = seen("vllm", 40, True, 13)
    first = step([server, other, demander()], {}, int(1 * GIB), 100.0)
    # idle first, then lowest priority: vllm (40) is taken before sglang and covers alone
    assert [r.rule_id for r in first.releases] == ["vllm"]
    alone = step([server, demander()], {}, int(1 * GIB), 100.0)
    assert alone.releases == ()
    late = step([server, demander()], alone.states, int(1 * GIB), 105.0)
    assert late.releases == ()
    assert late.notes["render"].code == codes.VRAM_HANDOFF_BLOCKED
    assert WHY_DRAIN_EXPIRED in late.notes["render"].message
    assert "idle" in late.notes["render"].remedy
    # once idle it is released after all
    idle = step([seen("sglang", 50, False, 13, when_busy="wait"), demander()], late.states, int(1 * GIB), 106.0)
    assert [r.rule_id for r in idle.releases] == ["sglang"]


def test_skip_never_releases_a_busy_or_unknown_tenant_and_says_why() -> None:
    for busy in (True, None):
        t = TenantVram("sglang", 50, busy, 13 * GIB, True, when_busy="skip")
        d = TenantVram("render", 60, True, 1 * GIB, True, needs_bytes=12 * GIB)
        p = plan(d, [t, d], 1 * GIB)
        assert p is not None and not p.covers and p.release == ()
        assert [(b.tenant_id, b.why) for b in p.blockers] == [("sglang", WHY_BUSY_SKIP)]
    idle = TenantVram("sglang", 50, False, 13 * GIB, True, when_busy="skip")
    p = plan(d, [idle, d], 1 * GIB)
    assert p is not None and p.release == ("sglang",)


def test_release_keeps_todays_behaviour_a_busy_lower_ranked_tenant_is_released() -> None:
    s = step([seen("vllm", 50, True, 13), demander()], {}, int(1 * GIB), 100.0)
    assert [r.rule_id for r in s.releases] == ["vllm"]
