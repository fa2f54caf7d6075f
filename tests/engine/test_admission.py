"""Admission, holds, pauses and their reasons, with a fake clock (``now`` is a number)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from arbiter.engine import codes
from arbiter.engine.decide import decide
from arbiter.engine.types import (
    Decision,
    DuringPolicy,
    EngineState,
    JobObs,
    JobVerdict,
    Observation,
    Policy,
    RuleObs,
    RulePolicy,
    SourceObs,
)

PROTECTED = RulePolicy("trainer", protected=True)
POLICY = Policy(rules={"trainer": PROTECTED}, busy_threshold=0.05, release_after_s=10.0, stop_grace_s=5.0)


def job(
    jid: str = "j1",
    *,
    started: bool = True,
    use: Literal["none", "shared", "exclusive"] = "shared",
    caps: tuple[str, ...] = (),
    **kw: Any,
) -> JobObs:
    return JobObs(
        jid, name="batch", owner_uid=1000, use=use, capabilities=frozenset(caps), started=started, pids=(100,), **kw
    )


def busy(share: float | None = 0.5, running: bool = True, **kw: Any) -> RuleObs:
    return RuleObs("trainer", running=running, pids=frozenset({10}) if running else frozenset(), gpu_share=share, **kw)


NO_STATE = EngineState()


def run(
    obs_rules: dict[str, RuleObs],
    jobs: list[JobObs],
    state: EngineState = NO_STATE,
    policy: Policy = POLICY,
    now: float = 0.0,
) -> Decision:
    obs = Observation(now=now, rules=obs_rules, jobs={j.job_id: j for j in jobs})
    return decide(obs, state, policy, now)


def codes_of(verdict: JobVerdict) -> list[str]:
    return [r.code for r in verdict.reasons]


def test_job_runs_at_duty_one_when_nothing_is_protected() -> None:
    d = run({"trainer": busy(running=False)}, [job()])
    assert d.jobs["j1"].state == "run" and d.jobs["j1"].duty == 1.0


def test_max_duty_caps_an_admitted_gpu_job() -> None:
    d = run({}, [job(max_duty=0.4)])
    assert d.jobs["j1"].duty == 0.4


def test_protected_program_on_gpu_pauses_a_plain_job_by_tree_with_a_reason() -> None:
    d0 = run({"trainer": busy(0.0)}, [job()])
    d1 = run({"trainer": busy(0.5)}, [job()], state=d0.state, now=2)
    v = d1.jobs["j1"]
    assert v.state == "paused" and v.via == "tree"
    assert codes_of(v) == [codes.PROTECTED_GPU_BUSY]
    assert v.reasons[0].remedy and v.reasons[0].evidence["rule"] == "trainer"
    assert [a.op for a in d1.actions] == ["pause"]
    assert codes.JOB_PAUSED in [e.code for e in d1.events]
    assert codes.PROTECTION_GPU_ON in [e.code for e in d1.events]


def test_cooperative_job_is_paused_through_its_control_document() -> None:
    coop = job(caps=("cooperative_throttle", "cooperative_pause"))
    d0 = run({}, [coop])
    d1 = run({"trainer": busy(0.5)}, [coop], state=d0.state, now=2)
    assert d1.jobs["j1"].via == "control"
    (action,) = d1.actions
    assert action.op == "control" and action.state == "paused"


def test_release_waits_release_after_s_below_threshold() -> None:
    d = run({"trainer": busy(0.5)}, [job()], now=0)
    for t in (2, 4, 6, 8):
        d = run({"trainer": busy(0.01)}, [job()], state=d.state, now=t)
        assert d.jobs["j1"].state == "paused", t
    d = run({"trainer": busy(0.01)}, [job()], state=d.state, now=10)
    assert d.jobs["j1"].state == "run"
    assert [a.op for a in d.actions] == ["resume"]
    assert codes.JOB_RESUMED in [e.code for e in d.events]


def test_program_exit_releases_after_release_after_s() -> None:
    d = run({"trainer": busy(0.9)}, [job()], now=0)
    d = run({"trainer": busy(running=False)}, [job()], state=d.state, now=9.9)
    assert d.jobs["j1"].state == "paused"
    assert d.rules["trainer"].holds[0].evidence == {"rule": "trainer", "release_after_s": 10.0}
    d = run({"trainer": busy(running=False)}, [job()], state=d.state, now=10)
    assert d.jobs["j1"].state == "run"


def test_bursts_shorter_than_release_do_not_flap() -> None:
    d = run({}, [job()], now=0)
    switches = 0
    for step in range(60):  # one minute of 1 s bursts, sampled every second
        share = 0.9 if step % 2 == 0 else 0.0
        before = d.jobs["j1"].state
        d = run({"trainer": busy(share)}, [job()], state=d.state, now=float(step))
        switches += before != d.jobs["j1"].state
    assert switches <= 2


def test_unreadable_gpu_time_counts_as_using_it() -> None:
    d = run({"trainer": busy(None, gpu_why="no reader")}, [job()])
    v = d.jobs["j1"]
    assert v.state == "paused" and "cannot be read" in v.reasons[0].message


def test_plugin_fault_counts_as_harm() -> None:
    d = run({"trainer": busy(0.0, faults=("matcher process timed out",))}, [job()])
    assert d.jobs["j1"].state == "paused"


def test_cpu_job_is_not_held_by_gpu_use() -> None:
    d = run({"trainer": busy(0.9)}, [job(use="none")])
    assert d.jobs["j1"].state == "run"


def test_pending_job_is_not_admitted_while_protected_program_uses_gpu() -> None:
    d = run({"trainer": busy(0.9)}, [job(started=False)])
    assert d.jobs["j1"].state == "held" and not d.jobs["j1"].admitted
    assert d.actions == ()
    assert [e.code for e in d.events] == [codes.PROTECTION_GPU_ON, codes.JOB_HELD]
    d = run({"trainer": busy(running=False)}, [job(started=False)], state=d.state, now=10)
    assert d.jobs["j1"].state == "run"
    assert [(a.op, a.state) for a in d.actions] == [("control", "run")]
    assert codes.JOB_ADMITTED in [e.code for e in d.events]


def test_mode_never_holds_gpu_work_and_always_ignores_protection() -> None:
    d = run({}, [job()], policy=replace(POLICY, gpu_jobs="never"))
    assert codes_of(d.jobs["j1"]) == [codes.GPU_JOBS_NEVER]
    d = run({"trainer": busy(0.9)}, [job()], policy=replace(POLICY, gpu_jobs="always"))
    assert d.jobs["j1"].state == "run"


def test_certified_without_certificate_behaves_as_default_and_says_so() -> None:
    d = run({"trainer": busy(0.9)}, [job()], policy=replace(POLICY, gpu_jobs="certified"))
    v = d.jobs["j1"]
    assert v.state == "paused"
    assert codes_of(v) == [codes.PROTECTED_GPU_BUSY, codes.GPU_NOT_CERTIFIED]
    assert v.reasons[1].remedy == "arbiter ab sweep --rule trainer"


def test_unprotected_tenant_holds_nothing() -> None:
    policy = replace(POLICY, rules={"llm": RulePolicy("llm")})
    d = run({"llm": RuleObs("llm", running=True, gpu_share=0.9)}, [job()], policy=policy)
    assert d.jobs["j1"].state == "run"


def test_rule_pause_fleet_binds_while_program_runs_by_scope() -> None:
    policy = replace(POLICY, rules={"game": RulePolicy("game", pause_fleet="cpu")})
    obs = {"game": RuleObs("game", running=True, gpu_share=0.0)}
    d = run(obs, [job("g"), job("c", use="none")], policy=policy)
    assert d.jobs["g"].state == "run"
    assert d.jobs["c"].state == "paused" and codes_of(d.jobs["c"]) == [codes.RULE_PAUSE_FLEET]
    d = run({"game": RuleObs("game")}, [job("g"), job("c", use="none")], state=d.state, policy=policy, now=1)
    assert d.jobs["c"].state == "run"


def _phase_policy(scope: str = "gpu") -> Policy:
    return replace(POLICY, rules={"trainer": RulePolicy("trainer", immediate=True, during=(DuringPolicy(scope),))})  # type: ignore[arg-type]


def test_phase_on_pauses_scope_and_off_releases_at_once() -> None:
    policy = _phase_policy("all")
    on = busy(0.0, phases=(SourceObs(phase="on", seen_by="watch"),))
    d = run({"trainer": on}, [job("g"), job("c", use="none")], policy=policy)
    assert {v.state for v in d.jobs.values()} == {"paused"}
    (ev,) = [e for e in d.events if e.code == codes.PROTECTION_PHASE_ON]
    assert ev.data["seen_by"] == "watch"
    off = busy(0.0, phases=(SourceObs(phase="off"),))
    d = run({"trainer": off}, [job("g"), job("c", use="none")], state=d.state, policy=policy, now=0.1)
    assert {v.state for v in d.jobs.values()} == {"run"}
    assert codes.PROTECTION_PHASE_OFF in [e.code for e in d.events]


def test_phase_binds_only_while_program_runs() -> None:
    obs = busy(running=False, phases=(SourceObs(phase="on"),))
    d = run({"trainer": obs}, [job()], policy=_phase_policy())
    assert d.jobs["j1"].state == "run"


def test_unreadable_phase_counts_as_on_with_source_code() -> None:
    obs = busy(0.0, phases=(SourceObs(readable=False, why="no such file"),))
    d = run({"trainer": obs}, [job()], policy=_phase_policy())
    assert codes.PROTECTION_SOURCE_UNREADABLE in codes_of(d.jobs["j1"])
    obs = busy(0.0, phases=(SourceObs(readable=False, why="home folder", needs_helper=True),))
    d = run({"trainer": obs}, [job()], policy=_phase_policy())
    assert codes.PROTECTION_SOURCE_NEEDS_HELPER in codes_of(d.jobs["j1"])


def test_phase_soon_stops_new_starts_pauses_cooperative_keeps_plain_running() -> None:
    soon = busy(0.0, phases=(SourceObs(phase="soon"),))
    coop = job("coop", caps=("cooperative_pause",))
    plain = job("plain")
    pending = job("new", started=False)
    d = run({"trainer": soon}, [coop, plain, pending], policy=_phase_policy())
    assert d.jobs["coop"].state == "paused" and d.jobs["coop"].via == "control"
    assert d.jobs["plain"].state == "run" and codes_of(d.jobs["plain"]) == [codes.PROTECTION_PHASE_SOON]
    assert d.jobs["new"].state == "held"


def test_exclusive_waits_for_tenants_and_jobs_and_then_holds_others() -> None:
    policy = replace(POLICY, rules={"llm": RulePolicy("llm")})
    ex = job("ex", use="exclusive", started=False, submitted_at=1)
    d = run({"llm": RuleObs("llm", running=True, gpu_share=0.5)}, [ex], policy=policy)
    assert codes_of(d.jobs["ex"]) == [codes.GPU_EXCLUSIVE_WAIT]
    d = run({}, [job("other", submitted_at=0), ex], policy=policy)
    assert d.jobs["ex"].state == "held"
    d = run({}, [ex, job("later", started=False, submitted_at=2)], policy=policy)
    assert d.jobs["ex"].state == "run"
    assert d.jobs["later"].state == "held" and d.jobs["later"].reasons[0].evidence["exclusive_job"] == "ex"


def test_never_valid_rule_file_holds_gpu_work() -> None:
    obs = Observation(now=0, jobs={"j1": job(), "c": job("c", use="none")}, invalid_files=("tenants.d/bad.yaml",))
    d = decide(obs, EngineState(), POLICY, 0)
    assert codes_of(d.jobs["j1"]) == [codes.CONFIG_REJECTED] and d.jobs["c"].state == "run"
    why = d.jobs["j1"].reasons[0]
    # it says why all GPU work waits, not only that it does, and names the file in the remedy
    assert "which program it protects cannot be known" in why.message
    assert "arbiter check tenants.d/bad.yaml" in why.remedy
    assert [n.code for n in d.notices] == [codes.CONFIG_REJECTED]
    assert codes.CONFIG_REJECTED in [e.code for e in d.events]
    d2 = decide(replace(obs, now=2), d.state, POLICY, 2)
    assert codes.CONFIG_REJECTED not in [e.code for e in d2.events]  # once, not every tick


def test_user_hold_and_resume() -> None:
    d = run({}, [job(user_hold=True)])
    assert codes_of(d.jobs["j1"]) == [codes.JOB_HELD_BY_USER]
    d = run({}, [job()], state=d.state, now=1)
    assert d.jobs["j1"].state == "run" and [a.op for a in d.actions] == ["resume"]


def test_stop_of_plain_job_terminates_then_kills_after_grace() -> None:
    d = run({}, [job()])
    d = run({}, [job(stop_requested_at=1.0)], state=d.state, now=1.0)
    assert [a.op for a in d.actions] == ["control", "terminate"]
    d = run({}, [job(stop_requested_at=1.0)], state=d.state, now=5.9)
    assert d.actions == ()
    d = run({}, [job(stop_requested_at=1.0)], state=d.state, now=6.0)
    assert [a.op for a in d.actions] == ["kill"]
    assert codes.JOB_STOPPED in codes_of(d.jobs["j1"])


def test_stop_of_cooperative_job_asks_first_and_resumes_a_tree_paused_one() -> None:
    coop = job(caps=("cooperative_pause",))
    d = run({}, [coop])
    d = run({}, [replace(coop, stop_requested_at=0.0)], state=d.state, now=0)
    assert [(a.op, a.state) for a in d.actions] == [("control", "stop")]
    d = run({}, [replace(coop, stop_requested_at=0.0)], state=d.state, now=5)
    assert [a.op for a in d.actions] == ["terminate"]
    d = run({}, [replace(coop, stop_requested_at=0.0)], state=d.state, now=10)
    assert [a.op for a in d.actions] == ["kill"]
    plain = job()
    d = run({"trainer": busy(0.9)}, [plain])
    d = run({"trainer": busy(0.9)}, [replace(plain, stop_requested_at=1.0)], state=d.state, now=1)
    assert [a.op for a in d.actions] == ["resume", "control", "terminate"]


def test_job_found_running_after_restart_is_reconciled() -> None:
    d = run({"trainer": busy(0.9)}, [job()])  # no previous verdict: as after a restart
    assert [(a.op, a.state) for a in d.actions] == [("control", "run"), ("pause", None)]
    d = run({"trainer": busy(running=False)}, [job()], state=d.state, now=10)
    assert [a.op for a in d.actions] == ["resume"]  # and its document already says run
    coop = job(caps=("cooperative_pause",))
    d = run({"trainer": busy(0.9)}, [coop])
    assert [(a.op, a.state) for a in d.actions] == [("control", "paused")]


def test_fault_counts_as_harm_even_when_no_process_is_seen() -> None:
    # a process table that cannot be read shows nothing running: that must not admit work
    d = run({"trainer": busy(running=False, faults=("process table: no answer",))}, [job()], policy=_phase_policy())
    assert d.jobs["j1"].state == "paused"
    assert d.rules["trainer"].phases == ("on",)
