"""Compliance with a fake clock: 3 samples over duty + 0.1 pause a job 60 s; the third time
within an hour stops it and its name gets no duty for an hour; unreadable is held."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pytest

from arbiter.engine import codes
from arbiter.engine.compliance import trust_from_record, trust_to_record
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

POLICY = Policy(rules={}, stop_grace_s=5.0)


def job(
    measured: float | None,
    at: float | None,
    jid: str = "j1",
    max_duty: float = 0.3,
    caps: Iterable[str] = ("cooperative_throttle",),
    started: bool = True,
) -> JobObs:
    return JobObs(
        jid,
        "batch",
        1000,
        capabilities=frozenset(caps),
        max_duty=max_duty,
        started=started,
        pids=(7,),
        measured=measured,
        measured_at=at,
    )


class Run:
    """Decisions in a row, each at a time, carrying the engine state."""

    def __init__(self, policy: Policy = POLICY) -> None:
        self.state = EngineState()
        self.policy = policy
        self._last: Decision | None = None

    @property
    def last(self) -> Decision:
        assert self._last is not None, "no decision yet"
        return self._last

    def at(self, now: float, *jobs: JobObs, rules: dict[str, RuleObs] | None = None) -> Decision:
        obs = Observation(now=now, rules=rules or {}, jobs={j.job_id: j for j in jobs})
        self._last = decide(obs, self.state, self.policy, now)
        self.state = self._last.state
        return self._last

    def verdict(self, jid: str = "j1") -> JobVerdict:
        """The last decision on ``jid`` (a call, so that each one is judged afresh)."""
        return self.last.jobs[jid]

    def codes(self, jid: str = "j1") -> list[str]:
        return [r.code for r in self.verdict(jid).reasons]

    def events(self) -> list[str]:
        return [e.code for e in self.last.events]


def over_three_samples(run: Run, start: float, measured: float = 0.9, jid: str = "j1", **kw: Any) -> None:
    for i in range(3):
        run.at(start + 2 * i, job(measured, start + 2 * i, jid, **kw))


def test_three_samples_over_duty_plus_a_tenth_pause_it_from_outside_for_60s() -> None:
    run = Run()
    run.at(0.0, job(None, None))
    assert run.verdict().state == "run" and run.verdict().duty == 0.3
    run.at(2.0, job(0.9, 2.0))
    run.at(4.0, job(0.9, 4.0))
    assert run.verdict().state == "run"  # two samples are not enough
    run.at(6.0, job(0.9, 6.0))
    v = run.verdict()
    assert v.state == "paused" and v.via == "tree" and run.codes() == [codes.GPU_DUTY_EXCEEDED]
    assert codes.GPU_DUTY_EXCEEDED in run.events() and [a.op for a in run.last.actions] == ["pause"]
    run.at(65.9, job(0.0, 64.0))
    assert run.verdict().state == "paused"
    run.at(66.0, job(0.0, 66.0))
    assert run.verdict().state == "run"
    assert [a.op for a in run.last.actions] == ["resume"]


@pytest.mark.parametrize(("measured", "paused"), [(0.4, False), (0.41, True)])
def test_the_tolerance_is_a_tenth(measured: float, paused: bool) -> None:
    run = Run()
    run.at(0.0, job(None, None))
    over_three_samples(run, 2.0, measured)
    assert (run.verdict().state == "paused") is paused


def test_the_samples_must_be_in_a_row() -> None:
    run = Run()
    run.at(0.0, job(None, None))
    for t, m in ((2, 0.9), (4, 0.9), (6, 0.2), (8, 0.9), (10, 0.9)):
        run.at(t, job(m, t))
    assert run.verdict().state == "run"


def test_only_new_samples_count_not_decisions() -> None:
    run = Run()
    run.at(0.0, job(None, None))
    for t in (2.0, 2.1, 2.2, 2.3, 4.0):  # many decisions (phase changes) between two ticks
        run.at(t, job(0.9, 2.0 if t < 4 else 4.0))
    assert run.verdict().state == "run"


def test_the_third_time_within_an_hour_stops_it_and_its_name_waits_an_hour() -> None:
    run = Run()
    run.at(0.0, job(None, None))
    start = 2.0
    for strike in (1, 2):
        over_three_samples(run, start)
        assert run.verdict().state == "paused", strike
        start += 4 + 60 + 2
        run.at(start - 2, job(0.0, start - 2))
        assert run.verdict().state == "run"
    over_three_samples(run, start)
    v = run.verdict()
    assert v.state == "stopping" and v.stop_step == "asked" and run.codes() == [codes.JOB_UNTRUSTED]
    assert codes.JOB_UNTRUSTED in run.events()
    stopped = start + 4
    run.at(stopped + 5.0, job(0.9, stopped + 5.0))
    assert run.verdict().stop_step == "terminated"
    run.at(stopped + 10.0, job(0.9, stopped + 10.0))
    assert run.verdict().stop_step == "killed"

    # the next run of the same name waits for the hour
    run.at(stopped + 20.0, job(None, None, jid="j2", started=False))
    assert run.verdict("j2").state == "held" and run.codes("j2") == [codes.JOB_UNTRUSTED]
    run.at(stopped + 3599.0, job(None, None, jid="j2", started=False))
    assert run.verdict("j2").state == "held"
    run.at(stopped + 3601.0, job(None, None, jid="j2", started=False))
    assert run.verdict("j2").state == "run"


def test_strikes_older_than_an_hour_do_not_count() -> None:
    run = Run()
    run.at(0.0, job(None, None))
    over_three_samples(run, 2.0)
    run.at(70.0, job(0.0, 70.0))
    over_three_samples(run, 72.0)
    run.at(140.0, job(0.0, 140.0))
    over_three_samples(run, 3700.0)  # the first strike is more than an hour old
    assert run.verdict().state == "paused"


def test_distrust_survives_a_restart_of_the_engine_state() -> None:
    run = Run()
    run.at(0.0, job(None, None))
    t = 2.0
    for _ in range(3):
        over_three_samples(run, t)
        t += 70.0
        run.at(t - 2, job(0.0, t - 2))
    assert run.state.trust["1000:batch"].untrusted(t)
    # the daemon stores names' records with wall times, and a new daemon (another
    # monotonic origin) reads them back
    record = trust_to_record(run.state.trust["1000:batch"], now=t, now_wall=1_000_000.0)
    restored = trust_from_record(record, now=50.0, now_wall=1_000_010.0)
    after = Run()
    after.state = EngineState(trust={"1000:batch": restored})
    after.at(60.0, job(None, None, jid="j9", started=False))
    assert after.codes("j9") == [codes.JOB_UNTRUSTED]
    until = run.state.trust["1000:batch"].untrusted_until
    assert until is not None and restored.untrusted_until == pytest.approx(until - t + 40.0)


def test_one_accounts_overruns_cost_another_accounts_jobs_of_that_name_nothing() -> None:
    """Trust is kept per (owner, name): any account may name its jobs "batch"."""
    run = Run()
    run.at(0.0, job(None, None))
    t = 2.0
    for _ in range(3):
        over_three_samples(run, t)
        t += 70.0
        run.at(t - 2, job(0.0, t - 2))
    assert run.state.trust["1000:batch"].untrusted(t)
    theirs = replace(job(None, None, jid="j2", started=False), owner_uid=1001)
    mine = job(None, None, jid="j3", started=False)
    run.at(t, theirs, mine)
    assert run.codes("j3") == [codes.JOB_UNTRUSTED]
    assert codes.JOB_UNTRUSTED not in run.codes("j2") and run.verdict("j2").state == "run"


def test_a_job_whose_gpu_time_cannot_be_read_is_held() -> None:
    run = Run()
    run.at(0.0, job(None, None))
    run.at(2.0, job(None, 2.0))
    v = run.verdict()
    assert v.state == "paused" and run.codes() == [codes.GPU_DUTY_UNVERIFIED] and v.via == "tree"


def test_a_job_at_duty_one_is_not_checked() -> None:
    run = Run()
    run.at(0.0, job(None, None, max_duty=1.0))
    over_three_samples(run, 2.0, measured=1.0, max_duty=1.0)
    run.at(8.0, job(None, 8.0, max_duty=1.0))
    assert run.verdict().state == "run"


CAPS = ("cooperative_throttle", "cooperative_pause")


def told_to_pause() -> tuple[Run, dict[str, RuleObs]]:
    """A cooperative job running at duty 1, and a phase observation that pauses it."""
    run = Run(replace(POLICY, rules={"p": RulePolicy("p", during=(DuringPolicy("gpu"),))}))
    run.at(0.0, job(None, None, caps=CAPS, max_duty=1.0))
    return run, {"p": RuleObs("p", running=True, pids=frozenset({3}), phases=(SourceObs(readable=True, phase="on"),))}


def test_a_cooperative_job_still_busy_two_samples_after_being_told_to_pause_is_paused_from_outside() -> None:
    run, on = told_to_pause()
    run.at(1.0, job(None, None, caps=CAPS, max_duty=1.0), rules=on)
    assert run.verdict().via == "control"
    run.at(2.0, job(0.8, 2.0, caps=CAPS, max_duty=1.0), rules=on)
    assert run.verdict().via == "control"  # this sample began before it was told
    run.at(4.0, job(0.8, 4.0, caps=CAPS, max_duty=1.0), rules=on)
    assert run.verdict().via == "control"  # one whole sample: it may be finishing a unit
    run.at(6.0, job(0.8, 6.0, caps=CAPS, max_duty=1.0), rules=on)
    assert run.verdict().via == "tree" and [a.op for a in run.last.actions] == ["pause"]


def test_a_cooperative_job_that_obeys_stays_paused_through_its_document() -> None:
    run, on = told_to_pause()
    for t in (1.0, 2.0, 4.0, 6.0):
        run.at(t, job(0.8 if t == 2.0 else 0.0, t, caps=CAPS, max_duty=1.0), rules=on)
    assert run.verdict().via == "control"


def test_an_unreadable_job_stays_held_between_samples_and_until_one_reads() -> None:
    run = Run()
    run.at(0.0, job(None, None))
    run.at(2.0, job(None, 2.0))
    for t in (2.5, 3.0, 4.0, 6.0):  # decisions between ticks, and more unreadable samples
        run.at(t, job(None, 4.0 if t >= 4.0 else 2.0))
        assert run.verdict().state == "paused" and run.codes() == [codes.GPU_DUTY_UNVERIFIED], t
        assert "resume" not in [a.op for a in run.last.actions]
    run.at(8.0, job(0.0, 8.0))
    assert run.verdict().state == "run"


def test_strikes_of_names_without_a_job_are_forgotten_after_the_window() -> None:
    run = Run()
    run.at(0.0, job(None, None))
    over_three_samples(run, 2.0)
    assert run.state.trust["1000:batch"].strikes
    run.at(4000.0)  # no job of that name any more
    assert "1000:batch" not in run.state.trust


def test_a_sample_that_began_under_another_duty_does_not_count() -> None:
    run = Run()
    run.at(0.0, job(None, None, max_duty=0.5))
    run.at(2.0, job(0.5, 2.0, max_duty=0.5))
    run.at(5.0, job(0.5, 2.0, max_duty=0.25))  # its duty falls between two samples
    run.at(6.0, job(0.5, 6.0, max_duty=0.25))  # began at 4, under 0.5: says nothing
    run.at(8.0, job(0.5, 8.0, max_duty=0.25))
    run.at(10.0, job(0.5, 10.0, max_duty=0.25))
    assert run.verdict().state == "run"
    run.at(12.0, job(0.5, 12.0, max_duty=0.25))
    assert run.verdict().state == "paused" and run.codes() == [codes.GPU_DUTY_EXCEEDED]
