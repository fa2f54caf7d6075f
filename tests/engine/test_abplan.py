"""The A/B design: windows in random order per block, washout, exclusions, collapse."""

from __future__ import annotations

import pytest

from arbiter.engine.abplan import WindowReading, collapsed, exclusion, exclusions_mostly_on, order


def test_each_block_is_one_on_and_one_off_window_in_a_fixed_random_order() -> None:
    orders = [order("run-7", b) for b in range(40)]
    assert all(sorted(o) == ["off", "on"] for o in orders)
    assert 10 < [o[0] for o in orders].count("on") < 30  # both orders occur
    assert [order("run-7", b) for b in range(40)] == orders  # a restarted daemon keeps the same order
    assert [order("run-8", b) for b in range(40)] != orders


@pytest.mark.parametrize(
    ("reading", "why"),
    [
        (WindowReading(100, 60, phase_changed=True, work_duty=0.3), "phase"),
        (WindowReading(100, 60, program_restarted=True, work_duty=0.3), "restarted"),
        (WindowReading(100, 60, wall_minus_monotonic_s=30.0, work_duty=0.3), "slept"),
        (WindowReading(100, 60, power_changed=True, work_duty=0.3), "power source"),
        (WindowReading(100, 60, memory_guard=True, work_duty=0.3), "memory guard"),
        (WindowReading(100, 60, work_duty=0.15), "never earned beside idle work"),
        (WindowReading(100, 60, work_duty=None), "could not be measured"),
    ],
)
def test_exclusions_say_why(reading: WindowReading, why: str) -> None:
    assert why in (exclusion("on", reading, asked_duty=0.3) or "")


def test_a_window_that_counts() -> None:
    assert exclusion("on", WindowReading(100, 60, work_duty=0.25), asked_duty=0.3) is None
    assert "under half" in (exclusion("on", WindowReading(100, 60, work_duty=0.0), asked_duty=0.1) or "")  # idle at 0.1
    assert "did not run" in (
        exclusion("on", WindowReading(100, 60, work_duty=0.3, work_ran=False), asked_duty=0.3) or ""
    )
    # work that holds no duty must still be seen using the GPU; CPU work has no GPU duty to see
    assert "could not be measured" in (exclusion("on", WindowReading(100, 60, work_duty=None), asked_duty=None) or "")
    assert "idle work" in (exclusion("on", WindowReading(100, 60, work_duty=0.01), asked_duty=None) or "")
    assert exclusion("on", WindowReading(100, 60, work_duty=0.6), asked_duty=None) is None
    assert exclusion("on", WindowReading(100, 60, work_duty=None), asked_duty=None, needs_duty=False) is None
    assert exclusion("off", WindowReading(100, 60, wall_minus_monotonic_s=1.0), asked_duty=0.3) is None


def test_collapse() -> None:
    assert collapsed(WindowReading(40, 60), off_rate=100 / 60)
    assert not collapsed(WindowReading(90, 60), off_rate=100 / 60)
    assert WindowReading(99, 60).rate == pytest.approx(1.65)


def test_exclusions_mostly_in_on_windows_are_flagged() -> None:
    assert exclusions_mostly_on(["on", "on", "off", "on"])
    assert not exclusions_mostly_on(["on", "off", "off"])
    assert not exclusions_mostly_on(["on", "on"])  # too few to say
