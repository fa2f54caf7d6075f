"""A reader takes its reading from the tick's process table where it can (``read_table``),
and reads for itself where it cannot."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from arbiter.daemon.observe import _read_one
from arbiter.plugin import GpuReading, KindOptions, PluginContext, ProcessGpu, ProcessInfo, Reader


class Counted(Reader):
    """Answers from the table when ``takes`` is set; counts what it was asked."""

    def __init__(self, takes: bool) -> None:
        super().__init__(KindOptions(), PluginContext(state_dir=Path(".")))
        self.takes = takes
        self.reads: list[set[int]] = []

    def read(self, pids: Collection[int]) -> GpuReading:
        self.reads.append(set(pids))
        return GpuReading(readable=True, at_ns=1)

    def read_table(self, processes: Mapping[int, ProcessInfo], at_ns: int) -> GpuReading | None:
        if not self.takes:
            return None
        return GpuReading(
            readable=True,
            at_ns=at_ns,
            processes={pid: ProcessGpu(busy_ns={"cpu": p.cpu_ns or 0}) for pid, p in processes.items()},
        )


TABLE = {5: ProcessInfo(5, 1, cpu_ns=7), 6: ProcessInfo(6, 1, cpu_ns=8)}


def test_a_reader_that_takes_the_table_is_not_asked_to_read() -> None:
    reader = Counted(takes=True)
    reading = _read_one(reader, {5, 6}, TABLE, 99)
    assert reading.at_ns == 99 and reading.processes[6].busy_ns == {"cpu": 8} and reader.reads == []


def test_a_reader_that_does_not_or_a_table_short_of_a_pid_reads() -> None:
    assert _read_one(Counted(takes=False), {5, 6}, TABLE, 99).at_ns == 1
    reader = Counted(takes=True)
    assert _read_one(reader, {5, 6, 7}, TABLE, 99).at_ns == 1 and reader.reads == [{5, 6, 7}]
    plain = Reader(KindOptions(), PluginContext(state_dir=Path(".")))  # the base class takes nothing
    assert plain.read_table(TABLE, 99) is None
