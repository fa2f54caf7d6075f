"""A reading's processes are checked for garbage once: a record the reader hands back
unchanged (the very same object that passed before) is not checked again, any other is."""

from __future__ import annotations

from arbiter.daemon.observe import reading_problem
from arbiter.plugin import GpuReading, ProcessGpu


def reading(processes: dict[int, ProcessGpu]) -> GpuReading:
    return GpuReading(readable=True, at_ns=1, device="cpu", processes=processes)


def test_garbage_in_a_new_record_is_caught_beside_records_checked_before() -> None:
    idle = ProcessGpu(busy_ns={"cpu": 5})
    assert reading_problem(reading({1: idle})) == ""
    bad = ProcessGpu(busy_ns={"cpu": -1})
    assert "process 2" in reading_problem(reading({1: idle, 2: bad}), checked={1: idle})
    # an equal record that is not the same object is checked afresh
    assert "process 1" in reading_problem(reading({1: bad}), checked={1: idle})
    assert reading_problem(reading({1: idle}), checked={1: idle}) == ""
