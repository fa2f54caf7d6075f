"""A paired ON/OFF run stepped with a fake clock: windows, washout, exclusions, collapse,
pilot sizing, sweeps, restarts, and what the decision does with the work under test."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from arbiter.engine import codes
from arbiter.engine.abrecord import effect_changed_note
from arbiter.engine.abrun import (
    Advance,
    RunObs,
    RunSpec,
    RunState,
    abort,
    advance,
    certified_duty,
    from_record,
    start,
    summary,
    to_record,
)
from arbiter.engine.abstate import analysis
from arbiter.engine.abstats import CONFIDENCE, FIRST_LOOK_CONFIDENCE, LAST_LOOK_CONFIDENCE
from arbiter.engine.decide import decide
from arbiter.engine.types import (
    CertView,
    EngineState,
    GovernorPolicy,
    JobObs,
    JobVerdict,
    Observation,
    Policy,
    RuleObs,
    RulePolicy,
    SourceObs,
    TimelineEvent,
)

STEP = 0.5


class Program:
    """A protected program whose progress depends on whether the work runs."""

    def __init__(self, off_rate: float = 10.0, on_rate: float = 10.0) -> None:
        self.off_rate, self.on_rate = off_rate, on_rate
        self.count = 0.0


def kept(adv: Advance) -> RunState:
    """The run after a step of a run ``advance`` was given (it ends one, never drops it)."""
    assert adv.state is not None
    return adv.state


def ab(state: EngineState) -> RunState:
    """The paired run the engine carries (each test here starts one)."""
    assert state.ab is not None
    return state.ab


def arm_of(state: EngineState) -> str:
    """The arm of the paired run's window in force."""
    window = ab(state).window
    assert window is not None
    return window.arm


def spec(**kw: object) -> RunSpec:
    base = dict(
        run_id="r1",
        rule_id="p",
        work="gpu",
        duty=0.3,
        blocks=6,
        window_s=10,
        washout_s=2,
        margin=0.05,
        max_hours=1,
        seed="r1",
    )
    base.update(kw)
    return RunSpec(**base)  # type: ignore[arg-type]


def drive(
    rs: RunState,
    program: Program,
    seconds: float,
    t0: float = 0.0,
    duty: float | None = None,
    change: Callable[[dict[str, Any]], None] | None = None,
    change_from: float = 0.0,
    **sees: object,
) -> tuple[RunState, list[TimelineEvent], list[RunState], float]:
    """Step the run every STEP seconds; the program progresses by the arm in force; from
    ``change_from`` on, ``change`` edits what the run sees."""
    t = t0
    events: list[TimelineEvent] = []
    ended: list[RunState] = []
    sample = 0
    while t < t0 + seconds and rs.running:
        arm = rs.window.arm if rs.window else "on"
        program.count += (program.on_rate if arm == "on" else program.off_rate) * STEP
        t += STEP
        sample += 1
        kw: dict[str, Any] = dict(
            now=t,
            wall=1000.0 + t,
            count=int(program.count),
            pids=frozenset({7}),
            work_running=arm == "on",
            work_duty=(rs.spec.duty or 1.0 if duty is None else duty) if arm == "on" else 0.0,
            work_sample_at=t if sample % 4 == 0 else None,
        )
        kw.update(sees)
        if change is not None and t >= change_from:
            change(kw)
        adv = advance(rs, RunObs(**kw))
        events.extend(adv.events)
        ended.extend(adv.ended)
        rs = kept(adv)
    return rs, events, ended, t


def test_a_quiet_program_earns_a_pass_with_every_block_one_on_and_one_off_window() -> None:
    rs, events, ended, t = drive(start(spec(), 1000.0), Program(10, 10), 400)
    assert (
        rs.status == "done" and rs.certifies and rs.verdict in ("no slowdown shown", "slowdown smaller than the margin")
    )
    assert len(rs.blocks) == 6 and not rs.excluded
    assert [e.code for e in events].count(codes.AB_BLOCK_DONE) == 6 and events[-1].code == codes.AB_RUN_DONE
    assert ended == [rs]
    # about 6 blocks × 2 windows × 10 s, and each rate only over the measured 8 s
    assert 118 <= t <= 124
    for b in rs.blocks:
        assert 7.5 <= b.on_s <= 8.5 and abs(b.on - 10) < 1.5 and abs(b.off - 10) < 1.5
    assert {b.on_first for b in rs.blocks} == {True, False} or len(rs.blocks) < 4


def test_the_washout_is_discarded() -> None:
    """Progress during the washout (say, a warm-up burst after each switch) does not count."""
    program = Program(10, 10)
    rs = start(spec(blocks=2, pilot=2), 1000.0)
    t = 0.0
    while rs.running:
        w = rs.window
        in_washout = w is not None and t < w.measure_from
        program.count += (1000 if in_washout else 10) * STEP
        t += STEP
        rs = kept(
            advance(
                rs,
                RunObs(
                    now=t,
                    wall=1000 + t,
                    count=int(program.count),
                    pids=frozenset({7}),
                    work_running=True,
                    work_duty=0.3,
                    work_sample_at=t,
                ),
            )
        )
    assert all(abs(b.on - 10) < 1.5 and abs(b.off - 10) < 1.5 for b in rs.blocks)


def test_a_phase_change_leaves_its_block_out_and_the_block_is_repeated() -> None:
    rs, events, _, _ = drive(
        start(spec(), 1000.0), Program(), 400, change=lambda kw: kw.update(phases=("on",)), change_from=5.0
    )
    assert rs.status == "done" and len(rs.blocks) == 6
    assert rs.excluded[0].attempt == 0 and "phase" in rs.excluded[0].why
    assert 0 not in [b.attempt for b in rs.blocks]
    assert codes.AB_BLOCK_EXCLUDED in [e.code for e in events]


def test_sleep_the_power_source_a_restart_and_the_memory_guard_each_leave_a_block_out() -> None:
    cases = {
        "slept": lambda kw: kw.update(wall=kw["wall"] + 30.0),
        "power source": lambda kw: kw.update(power="battery"),
        "restarted": lambda kw: kw.update(pids=frozenset({8})),
        "memory guard": lambda kw: kw.update(memory_guard=True),
    }
    for why, change in cases.items():
        rs, _, _, _ = drive(start(spec(), 1000.0), Program(), 60, power="ac", change=change, change_from=5.0)
        assert rs.excluded, why
        assert why.split()[0] in rs.excluded[0].why, (why, rs.excluded[0].why)
        assert rs.excluded[0].attempt == 0 and all(b.attempt > 0 for b in rs.blocks)


def test_an_on_window_below_the_asked_duty_is_left_out_never_counted() -> None:
    rs, _, _, _ = drive(start(spec(), 1000.0), Program(), 60, duty=0.1)  # asked 0.3: 0.1 < 0.3 - 0.1
    assert not rs.blocks and rs.excluded and all(e.arm == "on" and "under its asked" in e.why for e in rs.excluded)


def test_idle_work_earns_nothing() -> None:
    rs, _, _, _ = drive(start(spec(duty=None), 1000.0), Program(), 60, work_running=False)
    assert not rs.blocks and rs.excluded and "did not run" in rs.excluded[0].why


def test_too_many_left_out_blocks_abort_the_run() -> None:
    rs, _events, _, _ = drive(start(spec(), 1000.0), Program(), 2000, duty=0.0)
    assert rs.status == "aborted" and "left out" in rs.why and not rs.certifies
    assert len(rs.excluded) == 2 * rs.target + 1


def test_a_collapse_in_an_on_window_stops_the_run_at_once_as_a_slowdown() -> None:
    rs, _events, _, t = drive(start(spec(), 1000.0), Program(off_rate=10, on_rate=2), 200)
    assert rs.status == "done" and rs.verdict == "slowdown" and not rs.certifies and "collapsed" in rs.why
    assert t < 40  # within the first ON window that follows an OFF one, before its end


def test_a_real_slowdown_is_found() -> None:
    rs, _, _, _ = drive(start(spec(), 1000.0), Program(off_rate=10, on_rate=8.5), 400)
    assert rs.status == "done" and rs.verdict == "slowdown" and not rs.certifies and rs.certifies is False


def test_the_pilot_sizes_the_run_and_refuses_one_that_cannot_finish_in_time() -> None:
    class Noisy(Program):
        pass

    program = Noisy(10, 10)
    rs = start(spec(max_hours=0.1, margin=0.01), 1000.0)
    t = 0.0
    flip = 0
    events: list[TimelineEvent] = []
    while rs.running and t < 2000:
        arm = rs.window.arm if rs.window else "on"
        flip += 1
        # blocks differ by ±15 %: no 1 % margin can be shown in a tenth of an hour
        wobble = 1.15 if (rs.attempt % 2) == (arm == "on") else 0.85
        program.count += 10 * wobble * STEP
        t += STEP
        adv = advance(
            rs,
            RunObs(
                now=t,
                wall=1000 + t,
                count=int(program.count),
                pids=frozenset({7}),
                work_running=True,
                work_duty=0.3,
                work_sample_at=t,
            ),
        )
        events.extend(adv.events)
        rs = kept(adv)
    assert rs.status == "refused" and len(rs.blocks) == 4 and "pilot" in rs.why


def test_a_run_past_max_hours_is_aborted() -> None:
    rs = start(spec(), 1000.0)
    rs = kept(advance(rs, RunObs(now=1, wall=1000 + 3601, count=0, pids=frozenset({7}))))
    assert rs.status == "aborted" and "max-hours" in rs.why


def test_a_sweep_runs_level_after_level_and_stops_at_the_first_that_fails() -> None:
    s = spec(run_id="s1-1", sweep_id="s1", duty=0.1, levels=(0.5, 1.0), seed="s1-1")
    rs = start(s, 1000.0)
    program = Program(10, 10)
    rs, events, ended, t = drive(rs, program, 125)  # one run: 6 blocks of two 10 s windows
    assert ended[0].spec.run_id == "s1-1" and ended[0].certifies
    assert rs.spec.run_id == "s1-2" and rs.spec.duty == 0.5 and rs.passed == (0.1,) and rs.running
    program.on_rate = 8.5  # the program now slows at 0.5
    rs, events, ended, _ = drive(rs, program, 400, t0=t)
    assert ended[-1].spec.run_id == "s1-2" and not ended[-1].certifies and rs.spec.run_id == "s1-2"
    done = [e for e in events if e.code == codes.AB_SWEEP_DONE][-1]
    assert done.data["certified_duty"] == 0.1 and done.data["passed"] == [0.1]


def test_an_aborted_run_ends_its_sweep() -> None:
    rs = abort(start(spec(sweep_id="s", run_id="s-1", levels=(0.5,)), 1000.0), "asked by uid 0", 1001.0)
    assert rs.status == "aborted" and not rs.spec.levels and not rs.certifies


def test_a_restart_keeps_the_blocks_done_and_starts_the_next_block_afresh() -> None:
    rs, _, _, _t = drive(start(spec(), 1000.0), Program(), 50)
    assert rs.blocks and rs.window is not None
    back = from_record(to_record(rs))
    assert back.blocks == rs.blocks and back.excluded == rs.excluded and back.window is None and back.first is None
    assert back.attempt >= rs.attempt
    done, _, _, _ = drive(back, Program(), 400, t0=0.0)  # a new daemon's monotonic clock starts over
    assert done.status == "done" and len(done.blocks) == 6 and done.blocks[: len(rs.blocks)] == rs.blocks


def test_the_summary_warns_when_exclusions_fall_mostly_in_on_windows() -> None:
    rs, _, _, _ = drive(start(spec(), 1000.0), Program(), 120, duty=0.0)
    s = summary(rs)
    assert s.mostly_on and s.excluded_on >= 3 and any("harm" in n for n in s.notes)


# --- the decision under a run ----------------------------------------------------------------


def observation(now: float, count: int, jobs: dict[str, JobObs], **kw: object) -> Observation:
    progress = SourceObs(readable=True, rate=10.0, count=count)
    rule = RuleObs("p", running=True, pids=frozenset({7}), gpu_share=0.5, progress=progress)
    return Observation(now=now, wall=1000 + now, rules={"p": rule}, jobs=jobs, **kw)  # type: ignore[arg-type]


POLICY = Policy(gpu_jobs="certified", rules={"p": RulePolicy("p", protected=True, progress=True)})


def test_the_run_alone_decides_for_the_work_it_covers_and_other_gpu_work_waits() -> None:
    coop = JobObs(
        "c1",
        "batch",
        0,
        capabilities=frozenset({"cooperative_throttle", "cooperative_pause"}),
        started=True,
        pids=(11,),
    )
    other = JobObs("o1", "render", 0, started=True, pids=(12,))
    cpu = JobObs("u1", "cpujob", 0, use="none", started=True, pids=(13,))
    jobs = {"c1": coop, "o1": other, "u1": cpu}
    state = EngineState(ab=start(spec(work="batch", duty=0.25), 1000.0))
    arms_seen: dict[str, Mapping[str, JobVerdict]] = {}
    count = 0
    for i in range(60):
        now = i * STEP
        count += 5
        d = decide(observation(now, count, jobs), state, POLICY, now)
        state = d.state
        arm = arm_of(state)
        arms_seen.setdefault(arm, d.jobs)
    on, off = arms_seen["on"], arms_seen["off"]
    # ON: past "protected program uses the GPU" and "not certified", at the run's duty
    assert on["c1"].state == "run" and on["c1"].duty == 0.25
    # OFF: held to measure the program without it; cooperative work pauses itself
    assert (
        off["c1"].state == "paused" and off["c1"].via == "control" and off["c1"].reasons[0].code == codes.AB_WINDOW_OFF
    )
    for verdicts in (on, off):
        assert verdicts["o1"].state == "paused" and codes.AB_RUN_MEASURING in [r.code for r in verdicts["o1"].reasons]
        assert verdicts["u1"].state == "run"  # CPU work is not what this run measures
    assert "p" not in state.governors or state.governors["p"].mode == "off"  # the governor stands down


def test_explicit_pauses_and_other_protected_programs_still_bind_during_a_run() -> None:
    coop = JobObs("c1", "batch", 0, capabilities=frozenset({"cooperative_throttle"}), started=True, pids=(11,))
    policy = Policy(
        gpu_jobs="when_no_gpu_protected",
        rules={
            "p": RulePolicy("p", protected=True, progress=True),
            "q": RulePolicy("q", protected=True),
        },
    )
    obs = observation(1.0, 10, {"c1": coop})
    obs = replace(obs, rules={**obs.rules, "q": RuleObs("q", running=True, pids=frozenset({9}), gpu_share=0.9)})
    d = decide(obs, EngineState(ab=start(spec(work="gpu"), 1000.0)), policy, 1.0)
    codes_ = [r.code for r in d.jobs["c1"].reasons]
    assert d.jobs["c1"].state == "paused" and codes.PROTECTED_GPU_BUSY in codes_
    assert all(r.evidence.get("rule") == "q" for r in d.jobs["c1"].reasons if r.code == codes.PROTECTED_GPU_BUSY)


def test_evicted_off_windows_stop_the_work_through_its_stop_path() -> None:
    job = JobObs("c1", "batch", 0, capabilities=frozenset({"cancellable"}), started=True, pids=(11,))
    state = EngineState(ab=start(spec(work="gpu", duty=None, off="evicted"), 1000.0))
    count = 0
    stopped = None
    for i in range(60):
        count += 5
        d = decide(observation(i * STEP, count, {"c1": job}), state, POLICY, i * STEP)
        state = d.state
        if arm_of(state) == "off" and d.jobs["c1"].state == "stopping":
            stopped = d
            break
    assert stopped is not None and stopped.jobs["c1"].reasons[0].code == codes.AB_WINDOW_OFF
    assert any(a.op == "terminate" for a in stopped.actions)


def test_a_passing_run_is_handed_back_ended_and_the_certificate_then_governs() -> None:
    coop = JobObs(
        "c1",
        "batch",
        0,
        capabilities=frozenset({"cooperative_throttle"}),
        started=True,
        pids=(11,),
        measured=0.3,
        measured_at=0.0,
    )
    state = EngineState(ab=start(spec(blocks=2, pilot=2, duty=0.3), 1000.0))
    count, ended = 0, tuple[RunState, ...]()
    for i in range(200):
        now = i * STEP
        count += 5
        jobs = {"c1": replace(coop, measured_at=now)}
        d = decide(observation(now, count, jobs), state, POLICY, now)
        state = d.state
        ended = ended or d.ab_ended
        if not ab(state).running:
            break
    assert ended and ended[0].certifies and not ab(state).running
    # with the run over, its certificate lets the governor run the work beside the program
    obs = observation(200.0, count, {"c1": coop}, certificates=(CertView("p", "gpu", 0.3),))
    d = decide(obs, state, POLICY, 200.0)
    assert d.state.governors["p"].mode == "baseline"
    assert math.isclose(ab(state).spec.duty or 0, 0.3)


def test_a_change_in_the_second_windows_washout_still_leaves_the_block_out() -> None:
    """Both windows of a block are judged against the reference of its first: a program that
    changes (and stays changed) between them must not be compared across the change."""
    rs = start(spec(), 1000.0)
    program = Program()
    rs, _, _, t = drive(rs, program, 10.5)  # the first window closed; the second is in its washout
    assert rs.first is not None and rs.window is not None and rs.window.second and t < rs.window.measure_from
    edits: tuple[dict[str, object], ...] = (dict(phases=("on",)), dict(power="battery"), dict(pids=frozenset({8})))
    for edit in edits:

        def change(kw: dict[str, Any], edit: dict[str, object] = edit) -> None:
            kw.update(edit)

        after, _, _, _ = drive(rs, Program(), 12, t0=t, change=change)
        assert after.excluded and after.excluded[0].attempt == rs.attempt, edit
        assert not after.blocks


def test_work_that_holds_no_duty_must_be_seen_using_the_gpu_and_certifies_what_it_used() -> None:
    idle, _, _, _ = drive(start(spec(duty=None), 1000.0), Program(), 60, duty=0.0)
    assert not idle.blocks and "never earned beside idle work" in idle.excluded[0].why
    busy, _, _, _ = drive(start(spec(duty=None), 1000.0), Program(), 400, duty=0.37)
    assert busy.certifies and certified_duty(busy) == 0.37  # what it was seen using, not 1.0
    cpu, _, _, _ = drive(start(spec(duty=None, work="cpu"), 1000.0), Program(), 400, duty=0.0)
    assert cpu.certifies  # CPU work has no GPU duty to see


def test_a_disturbed_on_window_is_left_out_never_judged_a_collapse() -> None:
    rs, _, _, _ = drive(
        start(spec(), 1000.0),
        Program(10, 10),
        400,
        change=lambda kw: kw.update(phases=("on",), count=kw["count"] // 4) if 30 <= kw["now"] < 41 else None,
    )
    assert rs.verdict != "slowdown" and rs.excluded and rs.excluded[0].arm == "on"


def test_a_run_ends_at_once_when_its_program_or_its_work_is_gone() -> None:
    gone, _, _, t = drive(
        start(spec(), 1000.0),
        Program(),
        60,
        change=lambda kw: kw.update(running=False, pids=frozenset()),
        change_from=25,
    )
    assert gone.status == "aborted" and "stopped running" in gone.why and t < 45
    no_work, _, _, t = drive(start(spec(), 1000.0), Program(), 200, work_running=False)
    assert no_work.status == "aborted" and "did not run in 2 ON windows" in no_work.why and t < 60


def test_a_runs_duty_never_lifts_another_rules_budget() -> None:
    coop = JobObs("c1", "batch", 0, capabilities=frozenset({"cooperative_throttle"}), started=True, pids=(11,))
    policy = Policy(
        gpu_jobs="certified",
        governor=GovernorPolicy(baseline_s=2, period_s=2),
        rules={
            "p": RulePolicy("p", protected=True, progress=True),
            "q": RulePolicy("q", protected=True, progress=True),
        },
    )
    state = EngineState(ab=start(spec(work="gpu", duty=0.8), 1000.0))
    duties = set()
    count = 0
    for i in range(40):
        now = i * STEP
        count += 5
        obs = observation(now, count, {"c1": coop}, certificates=(CertView("q", "gpu", 0.2),))
        q = RuleObs(
            "q",
            running=True,
            pids=frozenset({9}),
            gpu_share=0.9,
            progress=SourceObs(readable=True, rate=10.0, count=count),
        )
        obs = replace(obs, rules={**obs.rules, "q": q})
        d = decide(obs, state, policy, now)
        state = d.state
        if d.jobs["c1"].state == "run":
            duties.add(d.jobs["c1"].duty)
    assert duties and max(duties) <= 0.2  # q's governor gives at most its certificate's 0.2


def test_the_pilot_is_left_out_of_r_and_a_run_recorded_with_a_shorter_target_still_ends_analysed() -> None:
    rs, _, _, _ = drive(start(spec(), 1000.0), Program(10, 10), 400)
    assert rs.status == "done" and "drift-robust" in rs.why  # the verdict says which interval it used
    a = summary(rs).analysis
    assert a is not None and a["pilot"] == 4 and a["n"] == len(rs.blocks) - 4
    # a run recorded, past its pilot, with a target one block past it (as sizing once allowed):
    # it runs on to two blocks past the pilot, then ends analysed
    old = replace(
        rs,
        blocks=rs.blocks[:4],
        attempt=4,
        target=5,
        status="running",
        verdict="",
        why="",
        certifies=False,
        ended_wall=None,
        window=None,
        first=None,
        ref=None,
    )
    ended, _, _, _ = drive(from_record(to_record(old)), Program(10, 10), 400, t0=200.0)
    assert ended.status == "done" and len(ended.blocks) == 6 and summary(ended).analysis is not None


def test_a_run_whose_effect_changed_ends_without_a_certificate_and_says_why() -> None:
    """The program's ON rate moves from block to block: the run's interval would certify, but
    the effect changed during it, so no certificate, with the reason on the timeline."""
    moved = [0.999, 1.007, 0.998, 0.995, 1.001, 0.998, 0.999, 0.994, 1.013, 0.987, 0.998, 0.994, 0.999, 0.993]
    rs = start(spec(blocks=len(moved), margin=0.05), 1000.0)
    program = Program(off_rate=1000.0, on_rate=1000.0 * moved[0])
    events: list[TimelineEvent] = []
    t = 0.0
    while rs.running and t < 2000:
        # set within the washout of each block's first window (it lasts 4 steps), as drive samples
        # the work's duty every 4 steps
        program.on_rate = 1000.0 * moved[min(len(rs.blocks), len(moved) - 1)]
        rs, seen, _, t = drive(rs, program, 4 * STEP, t0=t)
        events.extend(seen)
    assert rs.status == "done" and len(rs.blocks) == len(moved)
    assert rs.verdict == "the effect changed" and not rs.certifies
    assert "the effect changed during the run" in rs.why
    changed = [e for e in events if e.code == codes.AB_EFFECT_CHANGED]
    assert len(changed) == 1 and changed[0].data["run"] == "r1"
    a = summary(rs).analysis
    assert a is not None and a["low"] >= 0.95  # the interval alone would have certified
    assert any(n.startswith(f"{codes.AB_EFFECT_CHANGED}: the effect changed during the run") for n in summary(rs).notes)
    # explain names it beside the rule, with the way to see the blocks; another rule's run says nothing of it
    (note,) = effect_changed_note(rs, "p")
    assert note["code"] == codes.AB_EFFECT_CHANGED and "the effect changed during the run" in note["message"]
    assert "arbiter ab show r1" in note["remedy"]
    assert effect_changed_note(rs, "other") == [] and effect_changed_note(None, "p") == []


def _run_through(effects: list[float], rs: RunState) -> tuple[RunState, list[TimelineEvent]]:
    """Drive a run whose program's ON rate follows ``effects`` block by block."""
    program = Program(off_rate=1000.0, on_rate=1000.0 * effects[0])
    events: list[TimelineEvent] = []
    t = 0.0
    while rs.running and t < 2000:
        program.on_rate = 1000.0 * effects[min(len(rs.blocks), len(effects) - 1)]
        rs, seen, _, t = drive(rs, program, 4 * STEP, t0=t)
        events.extend(seen)
    return rs, events


def test_a_run_whose_effect_wandered_from_the_margin_earns_no_certificate() -> None:
    """The effect starts at 1 − margin and wanders up in steps smaller than the block noise: the
    run's mean clears the margin and no change test sees it, but its first blocks are not shown
    within it, so no certificate, with the reason on the timeline, in the report and in explain.
    One look (the run is sized to its hours)."""
    wandered = [0.946, 0.955, 0.962, 0.977, 0.977, 0.971, 0.948, 0.974, 0.945, 0.967, 0.955, 0.988, 0.981, 0.972]
    wandered += [0.97, 0.996]
    hours = 16.9 * 2 * 10 / 3600  # 16 blocks and a little time for the slack of a real run
    rs, events = _run_through(wandered, start(spec(blocks=16, margin=0.05, max_hours=hours), 1000.0))
    assert rs.status == "done" and len(rs.blocks) == 16 and not rs.certifies and rs.verdict == "inconclusive"
    assert "over the run's first 4 blocks R = " in rs.why
    a = summary(rs).analysis
    assert a is not None and a["low"] >= 0.95 and a["ends"][0][1] < 0.95  # the mean alone would have certified
    assert [e.data["run"] for e in events if e.code == codes.AB_ENDS_NOT_SHOWN] == ["r1"]
    assert not [e for e in events if e.code == codes.AB_EFFECT_CHANGED]
    assert any(
        n.startswith(f"{codes.AB_ENDS_NOT_SHOWN}: the effect over the run's first or last 4") for n in summary(rs).notes
    )
    (note,) = effect_changed_note(rs, "p")
    assert note["code"] == codes.AB_ENDS_NOT_SHOWN and "arbiter ab show r1" in note["remedy"]
    # the remedy is one that works: a longer window spans the same hours (bench/ab_window.py)
    assert "a larger --margin does" in note["remedy"] and "averages out" not in note["remedy"]
    assert effect_changed_note(rs, "other") == []
    # an inconclusive run whose ends were not what held it back says nothing of them
    plain, events = _run_through([0.9] * 16, start(spec(blocks=16, margin=0.05, max_hours=hours), 1000.0))
    assert plain.verdict != "inconclusive" or not [e for e in events if e.code == codes.AB_ENDS_NOT_SHOWN]
    assert effect_changed_note(plain, "p") == []


def test_a_run_inconclusive_at_its_planned_end_runs_on_to_its_hours_and_is_judged_again() -> None:
    """Two looks: where the sizing planned the run to end it is inconclusive with R above
    1 − margin, so it runs on to the blocks its hours leave (at the pace it has kept, so it
    cannot outlive them) and is judged there with the last look's interval."""
    ratios = [1.05, 1.054, 1.012, 0.987, 0.977, 1.011, 0.979, 0.968, 1.016, 1.014, 1.026, 0.983, 1.01, 1.008]
    ratios += [0.966, 1.026, 1.02, 1.085]
    rs = start(spec(blocks=8, max_hours=0.1), 1000.0)
    program = Program(off_rate=1000.0, on_rate=1000.0 * ratios[0])
    events: list[TimelineEvent] = []
    t = 0.0
    while rs.running and t < 2000:
        program.on_rate = 1000.0 * ratios[min(len(rs.blocks), len(ratios) - 1)]
        rs, seen, _, t = drive(rs, program, 4 * STEP, t0=t)
        events.extend(seen)
    (sized,) = [e for e in events if e.code == codes.AB_RUN_SIZED]
    (extended,) = [e for e in events if e.code == codes.AB_RUN_EXTENDED]
    first = sized.data["blocks"]
    assert extended.data["looked"] == first == rs.looked and "inconclusive at its first look" in extended.message
    assert rs.status == "done" and len(rs.blocks) == rs.target == extended.data["blocks"] > first
    assert t <= 0.1 * 3600  # it ran on only as far as its hours allow
    a = analysis(rs)
    assert a is not None and a.confidence == LAST_LOOK_CONFIDENCE and rs.certifies
    # what a restart keeps includes the first look, so the run is judged at the same look
    assert from_record(to_record(rs)).looked == first
    # the same blocks up to the planned end, judged by the first look's interval, decided nothing
    at_first = analysis(replace(rs, blocks=rs.blocks[:first], target=first, looked=0))
    assert at_first is not None and at_first.verdict == "inconclusive" and at_first.confidence == FIRST_LOOK_CONFIDENCE


def test_a_confirmation_inconclusive_at_its_end_is_not_run_on() -> None:
    """A twin's confirmation has one look: the same blocks that make an ordinary run go on end
    it where it was planned, judged at the usual confidence."""
    ratios = [1.05, 1.054, 1.012, 0.987, 0.977, 1.011, 0.979, 0.968, 1.016, 1.014, 1.026, 0.983, 1.01, 1.008]
    rs = start(replace(spec(blocks=8, max_hours=0.1), confirms="n1.cert.json", origin="n1"), 1000.0)
    program = Program(off_rate=1000.0, on_rate=1000.0 * ratios[0])
    events: list[TimelineEvent] = []
    t = 0.0
    while rs.running and t < 2000:
        program.on_rate = 1000.0 * ratios[min(len(rs.blocks), len(ratios) - 1)]
        rs, seen, _, t = drive(rs, program, 4 * STEP, t0=t)
        events.extend(seen)
    assert rs.status == "done" and not any(e.code == codes.AB_RUN_EXTENDED for e in events)
    assert len(rs.blocks) == rs.target and rs.looked == 0
    a = analysis(rs)
    assert a is not None and a.confidence == CONFIDENCE


def test_a_run_planned_to_its_hours_end_has_one_look_at_the_usual_confidence() -> None:
    # 0.11 h is 19 blocks of two 10 s windows, with room for the steps' lateness
    rs, events, _, _ = drive(start(spec(blocks=19, max_hours=0.11), 1000.0), Program(10, 10), 450)
    assert rs.status == "done" and rs.target == 19 and not any(e.code == codes.AB_RUN_EXTENDED for e in events)
    a = analysis(rs)
    assert a is not None and a.confidence == CONFIDENCE
