"""The budget governor with a fake clock: baseline → start → grow/halve → take back (each
trigger) → recover; re-baseline at the last level; clamp; several rules; jobs joining and
leaving; a restart in every state."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

import pytest

from arbiter.engine import codes
from arbiter.engine.compliance import trust_key
from arbiter.engine.decide import decide
from arbiter.engine.governor import from_record, step_back, to_record
from arbiter.engine.types import (
    CertView,
    Decision,
    EngineState,
    GovernorPolicy,
    GovernorState,
    JobObs,
    JobVerdict,
    NameTrust,
    Observation,
    Policy,
    RuleObs,
    RulePolicy,
    SourceObs,
)

GP = GovernorPolicy(period_s=60, baseline_s=60, rebaseline_s=1800, take_back_s=300, grow_step=0.05)
RULES = {"trainer": RulePolicy("trainer", protected=True, progress=True, max_slowdown=0.05)}
POLICY = Policy(gpu_jobs="certified", rules=RULES, governor=GP)
CERT = CertView("trainer", "gpu", 0.5)
COOP = ("cooperative_throttle", "cooperative_pause")


def coop(jid: str = "c1", name: str = "batch") -> JobObs:
    return JobObs(jid, name, 1000, capabilities=frozenset(COOP), started=True, pids=(9,))


def plain(jid: str = "p1") -> JobObs:
    return JobObs(jid, "render", 1000, started=True, pids=(8,))


def trainer(rate: float | None, rid: str = "trainer") -> RuleObs:
    progress = SourceObs(readable=rate is not None, rate=rate, why="" if rate is not None else "gone")
    return RuleObs(rid, running=True, pids=frozenset({5}), gpu_share=0.6, progress=progress)


class Gov:
    def __init__(self, policy: Policy = POLICY) -> None:
        self.policy = policy
        self.state = EngineState()
        self._d: Decision | None = None

    @property
    def d(self) -> Decision:
        assert self._d is not None, "no decision yet"
        return self._d

    def at(
        self,
        now: float,
        rate: float | None,
        jobs: Iterable[JobObs] = (),
        certs: Iterable[CertView] = (CERT,),
        memory: float | None = None,
        rules: dict[str, RuleObs] | None = None,
    ) -> Decision:
        obs = Observation(
            now=now,
            rules=rules or {"trainer": trainer(rate)},
            jobs={j.job_id: j for j in jobs},
            certificates=tuple(certs),
            memory_available=memory,
        )
        self._d = decide(obs, self.state, self.policy, now)
        self.state = self._d.state
        return self._d

    def gov(self) -> GovernorState:
        """The protected rule's governor now (a call, so that each one is judged afresh)."""
        return self.state.governors["trainer"]

    def events(self) -> list[str]:
        return [e.code for e in self.d.events if e.code.startswith("GPU_DUTY")]

    def job(self, jid: str = "c1") -> JobVerdict:
        return self.d.jobs[jid]


ONE_COOP = (coop(),)


def started(g: Gov, jobs: Iterable[JobObs] = ONE_COOP, rate: float = 10.0) -> None:
    g.at(0, rate, jobs)
    g.at(60, rate, jobs)


def test_baseline_first_then_the_ceiling() -> None:
    g = Gov()
    g.at(0, 10.0, [coop()])
    assert g.events() == [codes.GPU_DUTY_BASELINE] and g.gov().mode == "baseline"
    assert g.job().state == "paused" and g.job().reasons[0].code == codes.GPU_DUTY_BASELINE
    g.at(59.9, 10.0, [coop()])
    assert g.gov().mode == "baseline"
    g.at(60, 10.0, [coop()])
    assert g.events() == [codes.GPU_DUTY_START] and g.gov().baseline == 10.0
    assert g.job().state == "run" and g.job().duty == 0.5


def test_step_back_by_the_overshoot_then_grow_toward_the_aim() -> None:
    g = Gov()
    started(g)
    g.at(119, 9.0, [coop()])
    assert g.gov().budget == 0.5  # no decision before a period has passed
    g.at(120, 9.6, [coop()])  # pressure 4 %: 0.08 per unit of duty puts the aim (4.5 %) past the ceiling
    assert g.gov().budget == 0.5 and g.events() == [] and g.gov().sensitivity == pytest.approx(0.08)
    g.at(180, 9.4, [coop()])  # pressure 6 % ≥ target: back by the overshoot, aiming at 3.75 %
    assert g.gov().budget == pytest.approx(0.5 * 0.0375 / 0.06, abs=1e-4) and g.events() == [codes.GPU_DUTY_HALVE]
    assert g.job().duty == g.gov().budget and "aiming at 3.8%" in g.d.events[0].message
    assert g.gov().sensitivity == pytest.approx(0.12)  # that period's alone: the load may have changed
    g.at(240, 9.8, [coop()])  # 2 %: the smoothed sensitivity says 0.46 reaches the aim; one grow_step a period
    assert g.gov().sensitivity == pytest.approx(0.6 * 0.12 + 0.4 * 0.02 / 0.3125)
    assert g.gov().budget == pytest.approx(0.3625) and g.events() == [codes.GPU_DUTY_GROW]
    for t in (300, 360, 420, 480):
        g.at(t, 10.0, [coop()])
    assert g.gov().budget == 0.5  # grown back, never above the ceiling
    g.at(540, 10.0, [coop()])
    assert g.gov().budget == 0.5 and g.events() == []


def test_between_the_aim_and_the_target_the_budget_eases_toward_the_aim() -> None:
    g = Gov()
    started(g)
    g.at(120, 9.52, [coop()])  # 4.8 %: under the target, over the aim
    assert g.events() == [codes.GPU_DUTY_HALVE] and "eases" in g.d.events[0].message
    assert g.gov().budget == pytest.approx(0.045 / (0.048 / 0.5), abs=1e-4)


def test_a_step_back_past_a_knee_takes_the_line_between_the_last_two_periods() -> None:
    # no slowdown until 0.3, then 0.25 per unit: at 0.35 the pressure is 2.5 %, at 0.4 it is 5 %
    assert step_back(0.4, 0.05, (0.35, 0.025), 0.0375) == pytest.approx(0.375)
    assert step_back(0.4, 0.05, None, 0.0375) == pytest.approx(0.3)  # through the origin
    assert step_back(0.4, 0.05, (0.39, 0.025), 0.0375) == pytest.approx(0.3)  # too close to mean a slope
    assert step_back(0.4, 0.05, (0.35, 0.04), 0.0375) == pytest.approx(0.3)  # the period before was over the aim


def test_a_take_back_or_a_baseline_forgets_the_period_before() -> None:
    g = Gov()
    started(g)
    g.at(120, 9.8, [coop()])
    assert g.gov().probe == pytest.approx((0.5, 0.02))
    g.at(180, 5.0, [coop()])  # taken back: the next step back must not draw a line to a stale period
    assert g.gov().mode == "taken_back" and g.gov().probe is None


def program(curve: Callable[[float], float], load: float = 1.0) -> Callable[[float], float]:
    """The protected program's rate under a budget, on a slowdown curve."""
    return lambda budget: 10.0 * (1 - load * curve(budget))


@pytest.mark.parametrize(
    ("curve", "oracle"),
    [
        (lambda d: max(0.0, 0.25 * (d - 0.2)), 0.4),  # paced frames: slack, then linear
        (lambda d: 0.15 * d, 1 / 3),  # free-running: proportional
        (lambda d: 0.4 * d * d, 0.125**0.5),  # convex
    ],
    ids=["paced", "free", "convex"],
)
def test_it_settles_near_the_highest_safe_duty_and_answers_a_load_step_within_a_period(
    curve: Callable[[float], float], oracle: float
) -> None:
    g = Gov(replace(POLICY, rules={"trainer": RULES["trainer"]}))
    cert = CertView("trainer", "gpu", 0.8)
    g.at(0, 10.0, [coop()], certs=[cert])
    rate = program(curve)
    t = 60
    for _ in range(40):
        g.at(t, rate(g.gov().budget if g.gov().mode == "running" else 0.0), [coop()], certs=[cert])
        t += 60
    steady = g.gov().budget
    assert g.gov().mode == "running" and 0.85 * oracle <= steady <= oracle
    assert curve(steady) < 0.05
    heavier = program(curve, load=1.6)
    g.at(t, heavier(steady), [coop()], certs=[cert])  # the load steps up: over the target at once
    pressure = g.gov().pressure
    assert pressure is not None and pressure >= 0.05 and g.events() == [codes.GPU_DUTY_HALVE]
    g.at(t + 60, heavier(g.gov().budget), [coop()], certs=[cert])
    pressure = g.gov().pressure
    assert pressure is not None and pressure < 0.05  # one period later it is back under the target


@pytest.mark.parametrize(
    ("rate", "memory", "target", "why"),
    [
        (8.9, None, 0.05, "pressure 11% > twice the target"),
        (4.9, None, 0.3, "under half the baseline (pressure 51% < 2 x 30%)"),
        (10.0, 0.05, 0.05, "the memory guard"),
    ],
)
def test_each_take_back_trigger_then_recovery(rate: float, memory: float | None, target: float, why: str) -> None:
    policy = replace(POLICY, rules={"trainer": replace(RULES["trainer"], max_slowdown=target)})
    g = Gov(policy)
    started(g)
    g.at(120, rate, [coop()], memory=memory)
    assert g.events() == [codes.GPU_DUTY_TAKE_BACK], why
    assert g.gov().budget == 0 and g.job().state == "paused" and g.job().reasons[0].code == codes.GPU_DUTY_TAKE_BACK
    g.at(419, 10.0, [coop()])
    assert g.gov().mode == "taken_back"
    g.at(420, 10.0, [coop()])
    assert g.events() == [codes.GPU_DUTY_START] and g.gov().budget == 0.25  # half the level taken back
    assert g.job().state == "run" and g.job().duty == 0.25


def test_an_unreadable_progress_source_gives_zero_until_it_reads() -> None:
    g = Gov()
    started(g)
    g.at(70, None, [coop()])
    assert g.job().state == "paused"
    assert codes.PROTECTION_SOURCE_UNREADABLE in [r.code for r in g.job().reasons]
    g.at(80, 10.0, [coop()])
    assert g.job().state == "run" and g.job().duty == 0.5


def test_no_baseline_is_taken_while_progress_cannot_be_read() -> None:
    g = Gov()
    g.at(0, None, [coop()])
    g.at(60, None, [coop()])
    assert g.gov().mode == "baseline" and g.job().state == "paused"
    g.at(61, 10.0, [coop()])
    assert g.gov().mode == "running"


def test_rebaseline_every_rebaseline_s_and_start_at_the_last_level() -> None:
    g = Gov()
    started(g)
    g.at(120, 9.5, [coop()])  # 5 %: back by the overshoot to 0.375
    g.at(1860, 9.7, [coop()])  # the baseline taken at 60 is 1800 s old
    assert codes.GPU_DUTY_BASELINE in g.events() and g.gov().mode == "baseline" and g.job().state == "paused"
    g.at(1920, 9.0, [coop()])
    assert g.events() == [codes.GPU_DUTY_START] and g.gov().budget == 0.375 and g.gov().baseline == 9.0


def test_a_lower_certificate_clamps_and_none_valid_means_not_certified() -> None:
    g = Gov()
    started(g)
    g.at(70, 10.0, [coop()], certs=[CertView("trainer", "gpu", 0.5, valid=False), CertView("trainer", "gpu", 0.2)])
    assert g.events() == [codes.GPU_DUTY_CLAMP] and g.gov().budget == 0.2 and g.job().duty == 0.2
    g.at(80, 10.0, [coop()], certs=[CertView("trainer", "gpu", 0.5, valid=False, why="expired")])
    assert g.job().state == "paused"
    assert [r.code for r in g.job().reasons] == [codes.PROTECTED_GPU_BUSY, codes.GPU_NOT_CERTIFIED]
    assert "arbiter ab sweep --rule trainer" in g.job().reasons[1].remedy


def test_a_certificate_covers_its_work_only() -> None:
    g = Gov()
    named = CertView("trainer", "batch", 0.4)
    g.at(0, 10.0, [coop()], certs=[named])
    g.at(60, 10.0, [coop()], certs=[named])
    assert g.job().duty == 0.4
    g.at(61, 10.0, [coop(), coop("c2", name="other")], certs=[named])  # not covered: no valid ceiling
    assert g.job().state == "paused" and codes.GPU_NOT_CERTIFIED in [r.code for r in g.job().reasons]


def test_work_that_cannot_throttle_waits_beside_the_protected_program() -> None:
    g = Gov()
    started(g, jobs=(coop(), plain()))
    assert g.job("c1").state == "run" and g.job("c1").duty == 0.5
    assert g.job("p1").state == "paused" and g.job("p1").reasons[0].code == codes.PROTECTED_GPU_BUSY


def test_equal_shares_as_jobs_join_and_leave() -> None:
    g = Gov()
    started(g)
    g.at(61, 10.0, [coop(), coop("c2")])
    assert g.job("c1").duty == 0.25 and g.job("c2").duty == 0.25
    g.at(62, 10.0, [coop("c2")])
    assert g.job("c2").duty == 0.5


def test_the_node_budget_is_the_minimum_over_rules() -> None:
    rules = {**RULES, "renderer": RulePolicy("renderer", protected=True, progress=True)}
    g = Gov(replace(POLICY, rules=rules))
    certs = [CERT, CertView("renderer", "gpu", 0.3)]
    both = {"trainer": trainer(10.0), "renderer": trainer(5.0, "renderer")}
    g.at(0, None, [coop()], certs=certs, rules=both)
    g.at(60, None, [coop()], certs=certs, rules=both)
    assert g.state.governors["renderer"].budget == 0.3 and g.job().duty == 0.3


def test_the_governor_stands_down_when_the_program_stops_using_the_gpu() -> None:
    g = Gov()
    started(g)
    idle = RuleObs("trainer", running=False, gpu_share=0.0)
    g.policy = replace(POLICY, release_after_s=0.0)
    g.at(100, None, [coop()], rules={"trainer": idle})
    assert g.gov().mode == "off" and g.job().duty == 1.0  # nothing protected uses the GPU
    g.at(200, 10.0, [coop()])  # back within rebaseline_s of its baseline: no new baseline
    assert g.gov().mode == "running" and g.gov().budget == 0.5


@pytest.mark.parametrize("moment", ["baseline", "running", "halved", "taken_back"])
def test_a_restart_in_every_state_resumes_where_it_was(moment: str) -> None:
    def drive(g: Gov) -> None:
        g.at(0, 10.0, [coop()])
        if moment == "baseline":
            return
        g.at(60, 10.0, [coop()])
        if moment == "halved":
            g.at(120, 9.5, [coop()])
        elif moment == "taken_back":
            g.at(120, 5.0, [coop()])

    a = Gov()
    drive(a)
    record = to_record(a.gov(), now=130.0, now_wall=5_000.0)
    b = Gov()
    b.state = EngineState(
        governors={"trainer": from_record(record, now=30.0, now_wall=5_000.0)}
    )  # another clock origin
    assert (b.state.governors["trainer"].sensitivity, b.state.governors["trainer"].probe) == (
        a.gov().sensitivity,
        a.gov().probe,
    )  # what the search has learnt survives the restart
    for t_a in (131.0, 200.0, 500.0):
        a.at(t_a, 9.8, [coop()])
        b.at(t_a - 100.0, 9.8, [coop()])
        assert (b.gov().mode, b.gov().budget, b.job().state, b.job().duty) == (
            a.gov().mode,
            a.gov().budget,
            a.job().state,
            a.job().duty,
        )


def test_a_take_back_survives_a_moment_without_a_governor() -> None:
    g = Gov()
    started(g)
    g.at(120, 5.0, [coop()])
    assert g.gov().mode == "taken_back"
    g.at(121, 10.0, [coop()], certs=[])  # a certificate unreadable for one tick
    g.at(122, 10.0, [coop()])
    assert g.gov().mode == "taken_back" and g.job().state == "paused"
    g.at(420, 10.0, [coop()])
    assert g.gov().mode == "running" and g.gov().budget == 0.25


def test_a_pending_job_no_certificate_covers_waits_and_the_running_one_keeps_its_duty() -> None:
    g = Gov()
    named = CertView("trainer", "batch", 0.4)
    g.at(0, 10.0, [coop()], certs=[named])
    g.at(60, 10.0, [coop()], certs=[named])
    newcomer = replace(coop("c2", name="other"), started=False)
    g.at(61, 10.0, [coop(), newcomer], certs=[named])
    assert g.job("c1").state == "run" and g.job("c1").duty == 0.4
    assert g.job("c2").state == "held" and g.job("c2").reasons[0].code == codes.PROTECTED_GPU_BUSY


def test_an_untrusted_name_waits_under_a_certificate_and_says_so_first() -> None:
    g = Gov()
    g.state = replace(g.state, trust={trust_key(coop()): NameTrust((1.0, 2.0, 3.0), untrusted_until=600.0)})
    g.at(0, 10.0, [coop()])
    g.at(60, 10.0, [coop()])
    reasons = g.job("c1").reasons
    assert g.job("c1").state == "paused" and [r.code for r in reasons] == [
        codes.JOB_UNTRUSTED,
        codes.PROTECTED_GPU_BUSY,
    ]
    distrust, busy = reasons
    # when it ends, and that the budget is what it may not have; the program's hold no longer
    # offers the budget as a way out
    assert "9 min" in distrust.message and "under the budget" in distrust.message
    assert "trusted again in 9 min" in distrust.remedy and distrust.evidence["untrusted_for_s"] == 540.0
    assert "under the budget" not in busy.remedy and busy.remedy.startswith("nothing to do: it runs once")
    # a trusted name's run beside it is under the budget, and its hold says so
    other = coop("c2", name="other")
    g.at(61, 10.0, [coop(), other])
    assert g.job("c2").state == "run"

    # once the program no longer uses the GPU, distrust holds nothing (no duty to trust it with)
    quiet = replace(trainer(10.0), gpu_share=0.0, running=False)
    g.at(200, 10.0, [coop()], rules={"trainer": quiet})
    assert g.job("c1").state == "run" and g.job("c1").duty == 1.0
    # and once the distrust ends, it runs under the budget beside the program again
    g.at(601, 10.0, [coop()])
    assert g.job("c1").state == "run" and g.job("c1").duty < 1.0
