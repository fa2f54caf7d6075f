"""A decision at rest: one that the same observation gives again at any later time, so the
decision thread may keep it on a quiet tick; every clock the engine keeps running says no.
A fake clock (``now`` is a number)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from arbiter.engine.decide import decide
from arbiter.engine.rest import at_rest, same_input
from arbiter.engine.types import (
    Decision,
    DuringPolicy,
    EngineState,
    JobObs,
    Observation,
    Policy,
    RuleObs,
    RulePolicy,
    SourceObs,
    TenantVramState,
)

POLICY = Policy(
    rules={"game": RulePolicy("game", protected=True, during=(DuringPolicy(),))},
    release_after_s=10.0,
    stop_grace_s=5.0,
    evict_after_s=60.0,
)
LATER = (0.5, 5.0, 9.99, 10.0, 60.0, 3600.0, 86400.0)


def observe(now: float, share: float = 0.0, running: bool = True, phase: str = "off", **kw: Any) -> Observation:
    rule = RuleObs(
        "game",
        running=running,
        pids=frozenset({10}) if running else frozenset(),
        gpu_share=share,
        phases=(SourceObs(readable=True, phase=phase, changed_at=1.0),),  # type: ignore[arg-type]
    )
    return Observation(now=now, rules={"game": rule}, wall=1e9 + now, memory_available=0.5, **kw)


def settle(obs_at: Any, start: float = 0.0) -> tuple[EngineState, Decision]:
    """Decide on the same input a few times, as ticks would."""
    decision = decide(obs_at(start), EngineState(), POLICY, start)
    for k in range(1, 4):
        state, decision = decision.state, decide(obs_at(start + k), decision.state, POLICY, start + k)
    return state, decision


def same(a: Decision, b: Decision) -> bool:
    return replace(a, events=()) == replace(b, events=()) and not b.events and not b.actions


def test_a_quiet_node_at_rest_decides_the_same_at_any_later_time() -> None:
    for running in (True, False):
        before, decision = settle(lambda now, r=running: observe(now, running=r))
        assert at_rest(before, decision, POLICY)
        for later in LATER:
            again = decide(observe(3 + later, running=running), decision.state, POLICY, 3 + later)
            assert same(decision, again), later


def test_a_program_that_stopped_using_the_gpu_is_not_at_rest_its_release_is_on_the_clock() -> None:
    busy = decide(observe(0, share=0.9), EngineState(), POLICY, 0)
    before, decision = busy.state, decide(observe(1, share=0.0), busy.state, POLICY, 1)
    assert decision.state == before  # nothing changed on this decision...
    assert not at_rest(before, decision, POLICY)  # ...but the release after 10 s runs
    released = decide(observe(11, share=0.0), decision.state, POLICY, 11)
    assert not released.state.rules["game"].using_gpu and decision.state.rules["game"].using_gpu


def test_a_held_job_is_not_at_rest_its_eviction_is_on_the_clock() -> None:
    job = JobObs("j1", name="batch", owner_uid=1000, started=True, pids=(100,))
    before, decision = settle(lambda now: observe(now, phase="on", jobs={"j1": job}))
    assert not at_rest(before, decision, POLICY)
    later = decide(observe(100, phase="on", jobs={"j1": job}), decision.state, POLICY, 100)
    assert later.actions  # evicted once evict_after_s passed


def test_a_tenant_whose_handoff_clock_runs_is_not_at_rest() -> None:
    before, decision = settle(lambda now: observe(now))
    clocks = [
        TenantVramState(requested_at=1.0),
        TenantVramState(retry_at=1.0),
        TenantVramState(quiet_since=1.0),
        TenantVramState(wake_due=1.0),
        TenantVramState(drain_since=1.0),
    ]
    for clock in clocks:
        state = replace(decision.state, vram={"game": clock})
        assert not at_rest(state, replace(decision, state=state), POLICY), clock
    assert before.vram["game"].idle_since is not None  # idle, but it releases nothing after an idle spell
    assert at_rest(before, decision, POLICY)
    releasing = replace(
        POLICY, rules={"game": replace(POLICY.rules["game"], reclaimable=True, idle_release_after_s=30.0)}
    )
    assert not at_rest(before, decision, releasing)


def test_the_same_input_is_all_but_the_time_and_what_only_a_governor_reads() -> None:
    assert same_input(observe(1), replace(observe(7), memory_available=0.9, power="battery"))
    assert not same_input(observe(1), observe(1, share=0.2))
    assert not same_input(observe(1), observe(1, phase="on"))
    assert not same_input(observe(1), observe(1, running=False))
