"""A job's VRAM in the handoff plan, where the pause translator gives it back (a checkpoint
of the job's device memory): a running job ranks below every tenant, its release is its
pause, the readers confirm it, and it stays paused while the tenant it gave way to is busy."""

from __future__ import annotations

from dataclasses import replace

from arbiter.engine import codes
from arbiter.engine.decide import decide
from arbiter.engine.handoff import TenantObs, job_tenant, step
from arbiter.engine.types import EngineState, JobObs, Observation, Policy, RuleObs, RulePolicy, SourceObs

GIB = 1 << 30


def job_seen(job_id: str, held_gb: float) -> TenantObs:
    return TenantObs(job_tenant(job_id), -1, True, int(held_gb * GIB), True, None, 0.0, 60.0, True, job=True)


def demander(busy: bool = True) -> TenantObs:
    return TenantObs("render", 60, busy, int(1.6 * GIB), True, 12 * GIB, 30.0, 10.0, True)


def test_a_job_is_released_by_its_pause_confirmed_and_kept_paused_while_the_demander_is_busy() -> None:
    first = step([job_seen("j1", 13), demander()], {}, free_bytes=1 * GIB, now=100.0)
    assert first.releases == ()  # nothing to ask a program: the job's pause is its release
    assert first.job_pauses == {job_tenant("j1"): "render"}
    planned = next(e for e in first.events if e.code == codes.VRAM_HANDOFF_PLANNED)
    assert job_tenant("j1") in planned.data["release"]
    freed = step([job_seen("j1", 0), demander()], first.states, 14 * GIB, 101.5)
    done = [e for e in freed.events if e.code == codes.VRAM_RELEASED]
    assert done and done[0].subject == job_tenant("j1") and done[0].data["duration_s"] == 1.5
    assert freed.job_pauses == {job_tenant("j1"): "render"}  # the render still needs that memory
    idle = step([job_seen("j1", 0), demander(busy=False)], freed.states, 14 * GIB, 130.0)
    assert idle.job_pauses == {} and idle.states[job_tenant("j1")].for_demander == ""


def test_a_job_whose_pause_frees_nothing_fails_like_any_release_and_may_run_again() -> None:
    first = step([job_seen("j1", 13), demander()], {}, 1 * GIB, 100.0)
    late = step([job_seen("j1", 13), demander()], first.states, 1 * GIB, 161.0)
    assert [e.code for e in late.events if e.code == codes.VRAM_RELEASE_FAILED]
    assert late.job_pauses == {}  # cooling: not counted on, and not kept paused for nothing


def test_a_job_ranks_below_every_tenant() -> None:
    llm = TenantObs("llm", 50, True, 13 * GIB, True, None, 30.0, 10.0, True)
    first = step([job_seen("j1", 13), llm, demander()], {}, 1 * GIB, 100.0)
    assert first.job_pauses == {job_tenant("j1"): "render"} and first.releases == ()


def observation(job_vram_gb: float, free_gb: float, render_busy: bool = True) -> Observation:
    return Observation(
        now=1.0,
        vram_free_bytes=int(free_gb * GIB),
        rules={
            "render": RuleObs(
                "render",
                running=True,
                pids=frozenset({6}),
                gpu_share=0.0,
                busy=SourceObs(readable=True, busy=render_busy),
                vram_bytes=int(1.6 * GIB),
            )
        },
        jobs={"j1": JobObs("j1", "train", 1000, started=True, pids=(7,), vram_bytes=int(job_vram_gb * GIB))},
    )


POLICY = Policy(
    rules={"render": RulePolicy("render", priority=60, busy_probe=True, needs_vram_bytes=12 * GIB)},
    pause_frees_vram=True,
)


def test_the_decision_pauses_the_job_for_the_tenant_and_resumes_it_once_that_one_is_idle() -> None:
    d = decide(observation(13, 1), EngineState(), POLICY, 1.0)
    verdict = d.jobs["j1"]
    assert verdict.state == "paused" and verdict.via == "tree"
    assert verdict.reasons[0].code == codes.JOB_PAUSED_FOR_VRAM and "'render'" in verdict.reasons[0].message
    assert ("j1", "pause") in [(a.job_id, a.op) for a in d.actions] and d.releases == ()
    freed = decide(replace(observation(0, 14), now=2.0), d.state, POLICY, 2.0)
    assert freed.jobs["j1"].state == "paused"
    assert [e.subject for e in freed.events if e.code == codes.VRAM_RELEASED] == ["j1"]  # listed under the job
    idle = decide(replace(observation(0, 14, render_busy=False), now=3.0), freed.state, POLICY, 3.0)
    assert idle.jobs["j1"].state == "run" and ("j1", "resume") in [(a.job_id, a.op) for a in idle.actions]


def test_without_a_pause_that_frees_vram_the_job_is_left_alone() -> None:
    d = decide(observation(13, 1), EngineState(), replace(POLICY, pause_frees_vram=False), 1.0)
    assert d.jobs["j1"].state == "run"
    assert any(e.code == codes.VRAM_HANDOFF_BLOCKED for e in d.events)


def test_a_cooperative_job_pauses_itself_which_frees_nothing_so_it_is_not_counted() -> None:
    obs = observation(13, 1)
    coop = replace(obs.jobs["j1"], capabilities=frozenset({"cooperative_pause"}))
    d = decide(replace(obs, jobs={"j1": coop}), EngineState(), POLICY, 1.0)
    assert d.jobs["j1"].state == "run"
