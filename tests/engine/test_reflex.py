"""The reflex: what a phase change does at once, before the whole decision; and that the
whole decision that follows agrees with it."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from arbiter.engine import codes
from arbiter.engine.decide import decide
from arbiter.engine.reflex import Reflex, reflex
from arbiter.engine.types import (
    Decision,
    DuringPolicy,
    EngineState,
    JobObs,
    Observation,
    Phase,
    Policy,
    RuleObs,
    RulePolicy,
    SourceObs,
)

BASE_STATE = EngineState()
BASE = Policy(busy_threshold=0.05, release_after_s=10.0, stop_grace_s=5.0)


def policy(scope: str = "all", immediate: bool = True, pause_fleet: str | None = None) -> Policy:
    rules = {
        "game": RulePolicy("game", immediate=immediate, during=(DuringPolicy(scope),)),  # type: ignore[arg-type]
        "other": RulePolicy("other", pause_fleet=pause_fleet),  # type: ignore[arg-type]
    }
    return replace(BASE, rules=rules)


def job(
    jid: str,
    *,
    use: Literal["none", "shared", "exclusive"] = "shared",
    caps: tuple[str, ...] = (),
    started: bool = True,
) -> JobObs:
    return JobObs(jid, name=jid, owner_uid=1000, use=use, capabilities=frozenset(caps), started=started, pids=(100,))


JOBS = [job("gpu"), job("cpu", use="none"), job("coop", caps=("cooperative_pause",)), job("pending", started=False)]


def observe(
    phase: Phase | None, readable: bool = True, running: bool = True, other_running: bool = False
) -> Observation:
    game = RuleObs(
        "game",
        running=running,
        pids=frozenset({10}) if running else frozenset(),
        gpu_share=0.0,
        phases=(SourceObs(readable=readable, phase=phase, why="" if readable else "gone"),),
    )
    other = RuleObs(
        "other", running=other_running, pids=frozenset({11}) if other_running else frozenset(), gpu_share=0.0
    )
    return Observation(now=0.0, rules={"game": game, "other": other}, jobs={j.job_id: j for j in JOBS})


def source(phase: Phase | None, readable: bool = True) -> SourceObs:
    return SourceObs(readable=readable, phase=phase, why="" if readable else "gone")


def tree_paused(decision: Decision) -> set[str]:
    return {jid for jid, v in decision.jobs.items() if v.state == "paused" and v.via == "tree"}


def test_a_phase_turning_on_pauses_at_once_what_the_decision_then_pauses_by_tree() -> None:
    for scope, expected in (("all", {"gpu", "cpu"}), ("gpu", {"gpu"}), ("cpu", {"cpu"})):
        pol = policy(scope)
        obs = observe("off")
        last = decide(obs, decide(obs, BASE_STATE, pol, 0.0).state, pol, 0.0)
        now_on = reflex(obs, last, pol, "game", 0, source("on"))
        assert set(now_on.pause) == expected and now_on.resume == ()
        after = decide(observe("on"), last.state, pol, 0.1)
        assert tree_paused(after) == expected, scope  # the whole decision agrees
        if scope != "cpu":
            assert after.jobs["coop"].via == "control"  # a cooperative job: the decision tells it


def test_a_phase_turning_off_resumes_what_it_alone_held() -> None:
    pol = policy("all", pause_fleet="cpu")
    held = observe("on", other_running=True)  # another rule holds the cpu job too
    last = decide(held, BASE_STATE, pol, 0.0)
    assert tree_paused(last) == {"gpu", "cpu"}
    off = reflex(held, last, pol, "game", 0, source("off"))
    assert off == Reflex(resume=("gpu",))
    after = decide(observe("off", other_running=True), last.state, pol, 0.1)
    assert after.jobs["gpu"].state == "run" and after.jobs["cpu"].state == "paused"
    assert [r.code for r in after.jobs["cpu"].reasons] == [codes.RULE_PAUSE_FLEET]


def test_an_unreadable_phase_counts_as_on_and_its_return_resumes() -> None:
    pol = policy("gpu")
    obs = observe("off")
    last = decide(obs, BASE_STATE, pol, 0.0)
    assert reflex(obs, last, pol, "game", 0, source(None, readable=False)).pause == ("gpu",)
    gone = observe(None, readable=False)
    last = decide(gone, last.state, pol, 0.1)
    assert tree_paused(last) == {"gpu"}
    assert reflex(gone, last, pol, "game", 0, source("off")).resume == ("gpu",)


def test_no_reflex_for_a_rule_not_immediate_a_soon_phase_or_another_source() -> None:
    obs = observe("off")
    pol = policy("all", immediate=False)
    last = decide(obs, BASE_STATE, pol, 0.0)
    assert reflex(obs, last, pol, "game", 0, source("on")) == Reflex()
    pol = policy("all")
    last = decide(obs, BASE_STATE, pol, 0.0)
    assert reflex(obs, last, pol, "game", 0, source("soon")) == Reflex()
    assert reflex(obs, last, pol, "game", 1, source("on")) == Reflex()  # no such during block
    assert reflex(obs, last, pol, "game", -1, source("on")) == Reflex()  # its progress source
    assert reflex(obs, last, pol, "nobody", 0, source("on")) == Reflex()


def test_a_phase_of_a_program_that_is_not_running_pauses_nothing() -> None:
    pol = policy("all")
    obs = observe("off", running=False)
    last = decide(obs, BASE_STATE, pol, 0.0)
    assert reflex(obs, last, pol, "game", 0, source("on")) == Reflex()


def test_the_jobs_using_the_most_gpu_time_are_paused_first() -> None:
    pol = policy("all")
    jobs = [
        replace(job(name), measured=duty)
        for name, duty in (("light", 0.1), ("unread", None), ("heavy", 0.8), ("mid", 0.4))
    ]
    obs = replace(observe("off"), jobs={j.job_id: j for j in jobs})
    last = decide(obs, decide(obs, BASE_STATE, pol, 0.0).state, pol, 0.0)
    assert reflex(obs, last, pol, "game", 0, source("on")).pause == ("heavy", "mid", "light", "unread")
