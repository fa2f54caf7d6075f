"""Eviction: a running job that protection keeps paused past evict_after_s is stopped, with a
reason that says why and what comes next.  A fake clock (``now`` is a number)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from arbiter.engine import codes
from arbiter.engine.decide import decide
from arbiter.engine.evict import protection
from arbiter.engine.types import (
    Decision,
    DuringPolicy,
    EngineState,
    JobObs,
    JobVerdict,
    Observation,
    Policy,
    Reason,
    RuleObs,
    RulePolicy,
    SourceObs,
)

POLICY = Policy(
    rules={"trainer": RulePolicy("trainer", protected=True)},
    release_after_s=10.0,
    stop_grace_s=5.0,
    evict_after_s=60.0,
)


def job(jid: str = "j1", **kw: Any) -> JobObs:
    return JobObs(
        jid, name="batch", owner_uid=1000, started=kw.pop("started", True), pids=(100,), run=kw.pop("run", 5.0), **kw
    )


def trainer(share: float = 0.5, running: bool = True, **kw: Any) -> RuleObs:
    return RuleObs("trainer", running=running, pids=frozenset({10}) if running else frozenset(), gpu_share=share, **kw)


NO_STATE = EngineState()


def run(
    rule: RuleObs, jobs: list[JobObs], state: EngineState = NO_STATE, now: float = 0.0, policy: Policy = POLICY
) -> Decision:
    obs = Observation(now=now, rules={"trainer": rule}, jobs={j.job_id: j for j in jobs})
    return decide(obs, state, policy, now)


def held_from(t0: float, jobs: list[JobObs], policy: Policy = POLICY) -> Decision:
    """The trainer on the GPU from ``t0``: the jobs are paused from then."""
    d = run(trainer(0.0), jobs, now=t0 - 2, policy=policy)
    return run(trainer(), jobs, d.state, now=t0, policy=policy)


def test_a_job_paused_by_protection_past_evict_after_s_is_stopped_with_a_true_reason() -> None:
    d = held_from(2.0, [job()])
    assert d.jobs["j1"].state == "paused" and d.state.held["j1"].since == 2.0
    d = run(trainer(), [job()], d.state, now=61.0)
    assert d.jobs["j1"].state == "paused"  # 59 s: not yet
    d = run(trainer(), [job()], d.state, now=62.0)
    v = d.jobs["j1"]
    assert v.state == "stopping" and v.stop_step == "terminated"  # it reads no control document
    (why,) = v.reasons
    assert why.code == codes.JOB_EVICTED
    assert "paused for 60s, past evict_after_s (60s)" in why.message and "'trainer' uses the GPU" in why.message
    assert "requeued" in why.remedy and "evict_after_s" in why.remedy
    assert why.evidence == {
        "held_s": 60.0,
        "evict_after_s": 60.0,
        "held_for": codes.PROTECTED_GPU_BUSY,
        "rule": "trainer",
    }
    # a stopped process cannot handle its stop: it is continued, its document says stop, it is ended
    assert [(a.op, a.state) for a in d.actions] == [("resume", None), ("control", "stop"), ("terminate", None)]
    (stopped,) = [e for e in d.events if e.code == codes.JOB_STOPPED]
    assert stopped.data["reasons"] == [codes.JOB_EVICTED]


def test_eviction_is_off_by_default_and_the_pause_is_still_timed() -> None:
    off = replace(POLICY, evict_after_s=None)
    assert Policy().evict_after_s is None
    d = held_from(2.0, [job()], off)
    d = run(trainer(), [job()], d.state, now=100_000.0, policy=off)
    assert d.jobs["j1"].state == "paused" and d.state.held["j1"].since == 2.0


def test_once_evicted_the_stop_goes_on_after_protection_ends_and_escalates() -> None:
    d = held_from(0.0, [job()])
    d = run(trainer(), [job()], d.state, now=60.0)
    assert d.jobs["j1"].state == "stopping"
    d = run(trainer(0.0, running=False), [job()], d.state, now=61.0)
    assert d.jobs["j1"].state == "stopping" and d.jobs["j1"].reasons[0].code == codes.JOB_EVICTED
    assert d.actions == ()  # terminated already: nothing new until the grace ends
    d = run(trainer(0.0, running=False), [job()], d.state, now=65.0)
    assert d.jobs["j1"].stop_step == "killed" and [a.op for a in d.actions] == ["kill"]
    # ended: its record goes with it
    d = run(trainer(0.0, running=False), [], d.state, now=66.0)
    assert d.state.held == {}


def test_the_stop_and_its_grace_are_for_the_run_evicted_not_one_placed_back_here() -> None:
    d = held_from(0.0, [job()])
    d = run(trainer(), [job()], d.state, now=60.0)
    assert d.jobs["j1"].stop_step == "terminated" and d.state.held["j1"].run == 5.0
    # the same run still: its stop goes on
    d = run(trainer(), [job()], d.state, now=62.0)
    assert d.jobs["j1"].state == "stopping"
    # requeued, and placed back on this node within the grace once protection has ended (its
    # root another process, perhaps with a pid of the run before): the new run is a job seen anew (it waits out release_after_s), never killed for the eviction
    for now in (63.0, 66.0):
        d = run(trainer(0.0, running=False), [job(run=63.0)], d.state, now=now)
        assert d.jobs["j1"].state == "paused" and d.state.held["j1"].evicted_at is None
        assert not {"terminate", "kill"} & {a.op for a in d.actions}
    d = run(trainer(0.0, running=False), [job(run=63.0)], d.state, now=75.0)
    assert d.jobs["j1"].state == "run" and [a.op for a in d.actions] == ["resume"]
    # placed back while protection still holds: paused, its own eviction clock from now
    d = held_from(0.0, [job()])
    d = run(trainer(), [job()], d.state, now=60.0)
    d = run(trainer(), [job(run=63.0)], d.state, now=63.0)
    assert d.jobs["j1"].state == "paused" and d.state.held["j1"].since == 63.0
    assert [a.op for a in d.actions] == ["control", "pause"]  # as any job first seen running


def test_a_job_that_reads_its_control_document_is_asked_to_stop_first() -> None:
    coop = job(capabilities=frozenset({"cooperative_pause"}))
    d = held_from(0.0, [coop])
    assert d.jobs["j1"].via == "control"
    d = run(trainer(), [coop], d.state, now=60.0)
    assert d.jobs["j1"].stop_step == "asked"
    (action,) = d.actions
    assert action.op == "control" and action.state == "stop"
    d = run(trainer(), [coop], d.state, now=65.0)
    assert d.jobs["j1"].stop_step == "terminated" and [a.op for a in d.actions] == ["terminate"]


def test_the_clock_starts_again_once_the_job_runs_again() -> None:
    d = held_from(0.0, [job()])
    d = run(trainer(), [job()], d.state, now=50.0)
    # the trainer stops using the GPU: released after release_after_s, the job runs
    for t in (52.0, 58.0, 63.0):
        d = run(trainer(0.0), [job()], d.state, now=t)
    assert d.jobs["j1"].state == "run" and "j1" not in d.state.held
    d = run(trainer(), [job()], d.state, now=70.0)
    d = run(trainer(), [job()], d.state, now=129.0)
    assert d.jobs["j1"].state == "paused" and d.state.held["j1"].since == 70.0
    assert run(trainer(), [job()], d.state, now=130.0).jobs["j1"].state == "stopping"


def test_a_phase_counts_as_protection() -> None:
    policy = replace(POLICY, rules={"trainer": RulePolicy("trainer", during=(DuringPolicy("gpu"),))})
    on = trainer(0.0, phases=(SourceObs(phase="on"),))
    d = run(trainer(0.0, phases=(SourceObs(phase="off"),)), [job()], now=0.0, policy=policy)
    d = run(on, [job()], d.state, now=1.0, policy=policy)
    assert d.jobs["j1"].reasons[0].code == codes.PROTECTION_PHASE_ON
    d = run(on, [job()], d.state, now=61.0, policy=policy)
    assert d.jobs["j1"].state == "stopping"
    assert d.jobs["j1"].reasons[0].evidence["held_for"] == codes.PROTECTION_PHASE_ON


def test_an_owners_hold_never_evicts_even_beside_protection() -> None:
    mine = job(user_hold=True)
    d = held_from(0.0, [mine])
    assert "j1" not in d.state.held
    d = run(trainer(), [mine], d.state, now=1000.0)
    assert d.jobs["j1"].state == "paused"


def test_work_not_started_waits_and_is_never_evicted() -> None:
    pending = job(started=False)
    d = held_from(0.0, [pending])
    d = run(trainer(), [pending], d.state, now=1000.0)
    assert d.jobs["j1"].state == "held" and d.state.held == {}


def test_only_the_nodes_protection_counts() -> None:
    def paused(*codes_: str) -> JobVerdict:
        return JobVerdict("j1", "paused", reasons=tuple(Reason(c, c, "") for c in codes_))

    assert protection(paused(codes.GPU_EXCLUSIVE_WAIT)) is None  # another job's exclusive use
    assert protection(paused(codes.AB_WINDOW_OFF)) is None  # a paired run: it ends by itself
    assert protection(paused(codes.GPU_DUTY_EXCEEDED)) is None  # its own fault, with its own stop
    assert protection(paused(codes.JOB_HELD_BY_USER, codes.PROTECTED_GPU_BUSY)) is None
    found = protection(paused(codes.GPU_DUTY_EXCEEDED, codes.JOB_PAUSED_FOR_VRAM))
    assert found is not None and found.code == codes.JOB_PAUSED_FOR_VRAM
    assert protection(JobVerdict("j1", "run")) is None
