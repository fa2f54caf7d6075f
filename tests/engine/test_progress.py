"""Progress sources: the rate from cumulative counts, and an unreadable source counted as harm."""

from __future__ import annotations

import pytest

from arbiter.engine import codes
from arbiter.engine.decide import decide
from arbiter.engine.progress import rate
from arbiter.engine.types import (
    Decision,
    EngineState,
    GpuJobsMode,
    JobObs,
    Observation,
    Policy,
    RuleObs,
    RulePolicy,
    SourceObs,
)

RULE = RulePolicy("trainer", protected=True, progress=True)


def decide_with(
    progress: SourceObs | None, running: bool = True, mode: GpuJobsMode = "when_no_gpu_protected"
) -> Decision:
    policy = Policy(gpu_jobs=mode, rules={"trainer": RULE})
    ro = RuleObs(
        "trainer", running=running, pids=frozenset({5}) if running else frozenset(), gpu_share=0.0, progress=progress
    )
    jobs = {
        "gpu": JobObs("gpu", "batch", 1000, started=True, pids=(9,)),
        "cpu": JobObs("cpu", "crunch", 1000, use="none", started=True, pids=(8,)),
    }
    return decide(Observation(now=0.0, rules={"trainer": ro}, jobs=jobs), EngineState(), policy, 0.0)


def test_rate_over_a_window_from_cumulative_counts() -> None:
    samples = [(0.0, 0), (10.0, 50), (30.0, 150), (60.0, 300)]
    assert rate(samples, now=60.0, window_s=60.0) == pytest.approx(5.0)
    assert rate(samples, now=60.0, window_s=30.0) == pytest.approx(150 / 30)
    # no new events since the last sample: the rate falls as time passes
    assert rate(samples, now=120.0, window_s=60.0) == pytest.approx(0.0)
    assert rate(samples, now=90.0, window_s=60.0) == pytest.approx(150 / 60)


def test_a_rate_after_an_idle_minute_counts_from_when_progress_began_again() -> None:
    # 45/s for ten seconds, idle for a minute, then 45/s again: thirty seconds on, the rate is
    # the program's 45/s, not the idle minute averaged in
    before = [(t / 10, int(4.5 * t)) for t in range(0, 101)]
    after = [(70 + t / 10, 450 + int(4.5 * t)) for t in range(1, 301)]
    assert rate(before + after, now=100.0, window_s=60.0, min_span_s=20.0) == pytest.approx(45.0, rel=0.03)
    # a run started again from zero counts from its own start
    restarted = [*before, *[(70 + t / 10, int(4.5 * t)) for t in range(1, 301)]]
    assert rate(restarted, now=100.0, window_s=60.0, min_span_s=20.0) == pytest.approx(45.0, rel=0.03)
    # a program slower than one step a window keeps its slow rate
    assert rate([(0.0, 0), (100.0, 1), (200.0, 2)], now=250.0, window_s=60.0) == pytest.approx(1 / 150)


def test_rate_needs_a_span() -> None:
    assert rate([], now=5.0, window_s=60.0) is None
    assert rate([(4.5, 3)], now=5.0, window_s=60.0) is None
    assert rate([(3.0, 3)], now=5.0, window_s=60.0) == 0.0


def test_an_unreadable_progress_source_holds_gpu_work_and_says_why() -> None:
    d = decide_with(SourceObs(readable=False, why="/var/log/t.jsonl: permission denied"))
    gpu = d.jobs["gpu"]
    assert gpu.state == "paused" and [r.code for r in gpu.reasons] == [codes.PROTECTION_SOURCE_UNREADABLE]
    assert "permission denied" in gpu.reasons[0].message and "harm" in gpu.reasons[0].message
    assert gpu.reasons[0].evidence == {"rule": "trainer", "progress": True}
    assert d.jobs["cpu"].state == "run"  # harm to GPU progress holds GPU work only


def test_a_progress_source_that_needs_a_helper_says_so() -> None:
    d = decide_with(SourceObs(readable=False, why="denied", needs_helper=True))
    reason = d.jobs["gpu"].reasons[0]
    assert reason.code == codes.PROTECTION_SOURCE_NEEDS_HELPER and "arbiter helper" in reason.remedy


def test_a_progress_source_not_read_yet_counts_as_harm() -> None:
    assert d_codes(decide_with(None)) == [codes.PROTECTION_SOURCE_UNREADABLE]


def test_progress_binds_only_while_the_program_runs() -> None:
    assert decide_with(SourceObs(readable=False, why="gone"), running=False).jobs["gpu"].state == "run"


def test_a_readable_progress_source_holds_nothing() -> None:
    assert decide_with(SourceObs(readable=True, rate=3.0)).jobs["gpu"].state == "run"


def test_gpu_jobs_always_is_an_explicit_opt_out() -> None:
    assert decide_with(SourceObs(readable=False, why="x"), mode="always").jobs["gpu"].state == "run"


def d_codes(d: Decision) -> list[str]:
    return [r.code for r in d.jobs["gpu"].reasons]
