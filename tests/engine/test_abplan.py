"""The A/B design: windows in random order per block, washout, exclusions, collapse."""

from __future__ import annotations

import pytest

from arbiter.engine.abplan import WindowReading, block, collapsed, exclusion, exclusions_mostly_on, plan


def test_each_block_is_one_on_and_one_off_window_in_a_fixed_random_order() -> None:
    windows = plan(40, window_s=300, washout_s=60, seed="run-7")
    assert len(windows) == 80
    for b in range(40):
        arms = [w.arm for w in windows if w.block == b]
        assert sorted(arms) == ["off", "on"]
    firsts = [windows[2 * b].arm for b in range(40)]
    assert 10 < firsts.count("on") < 30  # both orders occur
    assert plan(40, 300, 60, "run-7") == windows  # a restarted daemon plans the same run
    assert [w.arm for w in plan(40, 300, 60, "run-8")] != [w.arm for w in windows]
    w = windows[3]
    assert w.start == 900 and w.measured_from == 960 and w.end == 1200


def test_a_repeated_block_keeps_its_place_in_the_order() -> None:
    assert plan(2, 300, 60, "r", first_block=5)[0].block == 5
    assert plan(2, 300, 60, "r", first_block=5)[0].arm == plan(6, 300, 60, "r")[10].arm


def test_a_window_must_outlast_its_washout() -> None:
    with pytest.raises(ValueError, match="longer than its washout"):
        plan(1, 60, 60, "r")


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
    assert "did not run" in (exclusion("on", WindowReading(100, 60, work_duty=0.3, work_ran=False), asked_duty=0.3) or "")
    assert exclusion("on", WindowReading(100, 60, work_duty=None), asked_duty=None) is None  # work holding no duty
    assert exclusion("off", WindowReading(100, 60, wall_minus_monotonic_s=1.0), asked_duty=0.3) is None


def test_collapse_and_block_rates() -> None:
    assert collapsed(WindowReading(40, 60), off_rate=100 / 60)
    assert not collapsed(WindowReading(90, 60), off_rate=100 / 60)
    b = block(WindowReading(99, 60), WindowReading(100, 60), on_first=False)
    assert b.on == pytest.approx(1.65) and b.off == pytest.approx(100 / 60) and not b.on_first


def test_exclusions_mostly_in_on_windows_are_flagged() -> None:
    assert exclusions_mostly_on(["on", "on", "off", "on"])
    assert not exclusions_mostly_on(["on", "off", "off"])
    assert not exclusions_mostly_on(["on", "on"])  # too few to say
