"""The ``cpu_time`` stand-in reader against real busy and idle processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from arbiter.plugin import ChildWorker, GpuReading, PluginContext, ProcessInfo, Reader
from arbiter_readers import (
    CpuTimeReader,
    DrmFdinfoReader,
    MacosIoregReader,
    NvmlReader,
    arbiter_register_readers,
    cpu_time,
)
from arbiter_readers.cpu_time import NOT_ALLOWED
from arbiter_testing.waiting import wait_until


def reader(tmp_path: Path, stand_in_gpu: bool = True) -> CpuTimeReader:
    options = CpuTimeReader.Options.model_validate({"kind": "cpu_time"})
    return CpuTimeReader(options, PluginContext(state_dir=tmp_path, stand_in_gpu=stand_in_gpu))


@pytest.fixture
def busy() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def idle() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_registers_cpu_time_as_a_stand_in() -> None:
    seen: dict[str, type[Reader]] = {}
    arbiter_register_readers(lambda name, cls: seen.__setitem__(name, cls))
    assert seen == {
        "cpu_time": CpuTimeReader,
        "drm_fdinfo": DrmFdinfoReader,
        "nvml": NvmlReader,
        "macos_ioreg": MacosIoregReader,
    }
    assert CpuTimeReader.stand_in is True
    assert not any(cls.stand_in for name, cls in seen.items() if name != "cpu_time")


def test_options_take_no_fields() -> None:
    CpuTimeReader.Options.model_validate({})
    with pytest.raises(ValidationError):
        CpuTimeReader.Options.model_validate({"kind": "cpu_time", "interval": 1})


def asleep(pid: int) -> None:
    """Wait until ``pid`` is past the interpreter's start-up (CPU work of its own), asleep."""
    wait_until(lambda: psutil.Process(pid).status() == psutil.STATUS_SLEEPING, 10, f"pid {pid} to sleep")


def test_busy_time_grows_with_wall_time_for_a_busy_process(tmp_path: Path, busy: int, idle: int) -> None:
    r = reader(tmp_path)
    asleep(idle)
    started = time.monotonic_ns()
    first = r.read([busy, idle])

    def busy_ran() -> GpuReading | None:
        reading = r.read([busy, idle])
        return (
            reading
            if reading.processes[busy].busy_ns["cpu"] - first.processes[busy].busy_ns["cpu"] >= 200_000_000
            else None
        )

    # however long a loaded host takes to give the spinner 0.2 s of CPU, the sleeper gets
    # none meanwhile (0.02 s: two clock ticks of the stat line)
    second = wait_until(busy_ran, 30, "the busy child to run 0.2 s")
    ended = time.monotonic_ns()
    assert first.readable and second.readable and second.device == "cpu"
    wall_ns = second.at_ns - first.at_ns
    busy_ns = second.processes[busy].busy_ns["cpu"] - first.processes[busy].busy_ns["cpu"]
    idle_ns = second.processes[idle].busy_ns["cpu"] - first.processes[idle].busy_ns["cpu"]
    print(f"busy child: {busy_ns / wall_ns:.2f} of wall time; idle child: {idle_ns / wall_ns:.3f}")
    assert idle_ns < 20_000_000
    # one thread's CPU time never exceeds the wall time around the two reads (give or take
    # the stat line's clock tick at either end)
    assert busy_ns <= ended - started + 20_000_000


def test_vanished_processes_are_left_out(tmp_path: Path, idle: int) -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(timeout=10)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    # exits, and stays unreaped until wait()
    wait_until(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, 10, "the child to exit")
    try:
        reading = reader(tmp_path).read([idle, done.pid, zombie.pid])
    finally:
        zombie.wait(timeout=10)
    assert set(reading.processes) == {idle}


def test_not_readable_without_stand_in_gpu(tmp_path: Path, busy: int) -> None:
    reading = reader(tmp_path, stand_in_gpu=False).read([busy])
    assert not reading.readable
    assert reading.why == NOT_ALLOWED
    assert reading.processes == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_linux_fast_path_agrees_with_psutil() -> None:
    from arbiter_readers._cpustat import _busy_ns_of, _StatFiles

    files = _StatFiles(limit=1)
    for _ in range(3):  # the first read opens and keeps the descriptor, the next re-read it
        end = time.process_time() + 0.1
        while time.process_time() < end:
            pass
        ours = _busy_ns_of(files.read(os.getpid()), 1e9 / os.sysconf("SC_CLK_TCK"))
        t = psutil.Process().cpu_times()
        assert ours is not None and abs(ours / 1e9 - (t.user + t.system)) < 0.05
    assert list(files.fds) == [os.getpid()]
    files.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_kept_descriptor_reads_nothing_once_its_process_is_gone_and_the_limit_holds() -> None:
    from arbiter_readers._cpustat import _StatFiles

    files = _StatFiles(limit=1)
    first, second = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        assert files.read(first.pid) and files.read(second.pid)
        assert list(files.fds) == [first.pid]  # only one kept; the other was opened and closed
        first.kill()
        first.wait()  # reaped: its pid may now name another process, never through this descriptor
        assert files.read(first.pid) is None and files.fds == {}
        files.keep_only([second.pid])
    finally:
        second.kill()
        second.wait()
        files.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child reads /proc")
def test_the_reads_run_in_a_child_and_an_unchanged_process_is_the_same_object(
    tmp_path: Path, busy: int, idle: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_time, "READ_HERE_MOST", 0)  # as a reading of many processes is
    r = reader(tmp_path)
    asleep(idle)  # from now on its CPU time stays as it is
    try:
        first = r.read([busy, idle])
        assert r._child is not None and r._child.pid is not None and not r._child.failure
        at_ns, here = r._busy(([busy, idle], False))
        # each reading is timed where /proc was read: in the child, just before this read here
        assert first.at_ns < at_ns <= time.monotonic_ns()
        assert set(first.processes) == set(here) == {busy, idle}
        idle_ns = here[idle]
        assert isinstance(idle_ns, int)  # no threads asked for: one figure a process
        assert abs(first.processes[idle].busy_ns["cpu"] - idle_ns) < 50_000_000
        assert r.read([busy, idle]).processes[idle] is first.processes[idle]  # idle: nothing to build again
    finally:
        r.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child reads /proc")
def test_a_child_that_dies_or_answers_garbage_costs_no_reading(
    tmp_path: Path, idle: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_time, "READ_HERE_MOST", 0)  # as a reading of many processes is
    r = reader(tmp_path)
    try:
        r.read([idle])
        assert r._child is not None and r._child.pid is not None
        os.kill(r._child.pid, 9)
        reading = r.read([idle])
        assert reading.readable and set(reading.processes) == {idle}  # read here
        # killed before or after the request was written: its pipe broke, or it exited
        assert (
            "it exited" in r._child.failure or "its request pipe broke" in r._child.failure
        ) and r._child.pid is None

        liar = tmp_path / "liar.py"
        liar.write_text(
            "class Liar:\n    def __init__(self):\n        pass\n\n    def __call__(self, request):\n"
            "        return {'not a pid': 1}\n"
        )
        r._child = ChildWorker(str(liar), "Liar")
        reading = r.read([idle])
        assert reading.readable and set(reading.processes) == {idle}
        assert "something other than busy times" in r._child.failure and r._child.pid is None
    finally:
        r.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child reads /proc")
def test_a_reading_of_a_few_processes_is_read_here_without_a_child(tmp_path: Path, idle: int) -> None:
    r = reader(tmp_path)
    try:
        reading = r.read([idle])
        assert reading.readable and set(reading.processes) == {idle}
        assert r._child is not None and r._child.pid is None  # none was started for it
    finally:
        r.close()


def test_a_reading_is_taken_from_the_process_tables_cpu_times_where_it_holds_them(tmp_path: Path) -> None:
    r = reader(tmp_path)
    try:
        table = {10: ProcessInfo(10, 1, state="S", cpu_ns=5_000_000), 11: ProcessInfo(11, 1, state="Z", cpu_ns=9)}
        first = r.read_table(table, at_ns=123)
        assert first is not None and first.readable and first.at_ns == 123 and first.device == "cpu"
        assert {pid: p.busy_ns for pid, p in first.processes.items()} == {10: {"cpu": 5_000_000}}  # a zombie is gone
        again = r.read_table(table, at_ns=456)
        assert again is not None and again.processes[10] is first.processes[10]  # unchanged: nothing built again
        assert r._child is not None and r._child.pid is None  # no child was asked
        # a table without CPU times (psutil's), each thread's time, or no leave to stand in: read
        assert r.read_table({10: ProcessInfo(10, 1, state="S")}, at_ns=1) is None
        threads = CpuTimeReader(
            CpuTimeReader.Options.model_validate({"kind": "cpu_time", "threads": True}),
            PluginContext(state_dir=tmp_path, stand_in_gpu=True),
        )
        assert threads.read_table(table, at_ns=1) is None
        threads.close()
        assert reader(tmp_path, stand_in_gpu=False).read_table(table, at_ns=1) is None
    finally:
        r.close()


#: sleeps until a line comes on its stdin, then spends a fifth of a second of CPU time, says
#: so, and sleeps again
WAKES = """\
import sys, time
for _ in sys.stdin:
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    print("done", flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_idle_process_is_read_from_its_schedstat_and_its_cpu_time_when_it_ran() -> None:
    from arbiter_readers._cpustat import BusyTimes

    proc = subprocess.Popen([sys.executable, "-c", WAKES], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    times = BusyTimes(16)
    stat_reads = []
    read = times.files.read

    def counting(pid: int) -> bytes | None:
        stat_reads.append(pid)
        return read(pid)

    times.files.read = counting  # type: ignore[method-assign]
    try:
        wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_SLEEPING, 10, "the process asleep")
        first = times(([proc.pid], False))[1][proc.pid]
        assert isinstance(first, int)
        for _ in range(3):  # resting: its schedstat does not move, its stat file is not read again
            assert times(([proc.pid], False))[1][proc.pid] == first
        assert len(stat_reads) == 1
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n"
        wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_SLEEPING, 10, "the process asleep")
        after = times(([proc.pid], False))[1][proc.pid]
        assert isinstance(after, int)
        t = psutil.Process(proc.pid).cpu_times()
        assert after >= first + 150_000_000  # it ran: read again, not taken from before
        assert abs(after / 1e9 - (t.user + t.system)) < 0.02
        assert len(stat_reads) == 2
    finally:
        proc.kill()
        proc.wait()
        times.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_same_processes_asked_again_keep_their_files_without_a_look_through_them(idle: int) -> None:
    from arbiter_readers._cpustat import BusyTimes, _StatFiles

    other = subprocess.Popen(["sleep", "60"])
    times = BusyTimes(16)
    looks: list[str] = []

    def looked(kept: _StatFiles) -> Callable[[Collection[int]], None]:
        keep_only = kept.keep_only

        def look(pids: Collection[int]) -> None:
            looks.append(kept.name)
            keep_only(pids)

        return look

    for kept in (times.files, times.sched):
        kept.keep_only = looked(kept)  # type: ignore[method-assign,assignment]
    try:
        asleep(idle)
        for _ in range(3):  # a thousand idle processes a tick: nothing kept is gone through again
            assert set(times(([idle, other.pid], False))[1]) == {idle, other.pid}
        assert looks == ["stat", "schedstat"]
        assert set(times(([idle], False))[1]) == {idle}  # one no longer asked about: its files close
        assert looks == ["stat", "schedstat"] * 2
        assert other.pid not in times.files.fds and other.pid not in times.sched.fds
    finally:
        other.kill()
        other.wait()
        times.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_that_ran_between_two_told_answers_is_told_though_a_read_between_saw_it(idle: int) -> None:
    from arbiter_readers._cpustat import BusyTimes

    proc = subprocess.Popen([sys.executable, "-c", WAKES], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    times = BusyTimes(16)
    try:
        asleep(idle)
        asleep(proc.pid)
        _, whole, number, _, _ = times(([proc.pid, idle], False, -1))
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n"
        asleep(proc.pid)
        ran = times(([proc.pid, idle], False))[1][proc.pid]  # a whole read, no answer told
        assert ran != whole[proc.pid]
        _, changed, _, base, gone = times(([proc.pid, idle], False, number))  # resting since the read above
        assert base == number and changed == {proc.pid: ran} and gone == []
    finally:
        proc.kill()
        proc.wait()
        times.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_asked_against_the_answer_held_the_child_says_only_what_changed(busy: int, idle: int) -> None:
    from arbiter_readers._cpustat import BusyTimes

    times = BusyTimes(16)
    try:
        asleep(idle)
        _, whole, number, base, gone = times(([busy, idle], False, -1))
        assert base == -1 and set(whole) == {busy, idle} and gone == []
        wait_until(lambda: times(([busy, idle], False))[1][busy] != whole[busy], 10, "the busy process to run")
        _, changed, later, base, gone = times(([busy], False, number))  # told against the answer above
        assert base == number and later == number + 1 and set(changed) == {busy} and gone == [idle]
        _, again, _, base, _ = times(([busy, idle], False, 12345))  # not the answer held: whole
        assert base == -1 and set(again) == {busy, idle}
    finally:
        times.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child reads /proc")
def test_readings_made_of_what_changed_are_the_readings_in_whole(
    tmp_path: Path, busy: int, idle: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_time, "READ_HERE_MOST", 0)  # as a reading of many processes is
    r = reader(tmp_path)
    short = subprocess.Popen(["sleep", "60"])
    try:
        asleep(idle)
        for pids in ([busy, idle, short.pid], [busy, idle, short.pid], [busy, idle], [busy, idle]):
            if len(pids) == 2:
                short.kill()
                short.wait()
            reading = r.read(pids)
            _, here = r._busy((pids, False))
            assert set(reading.processes) == set(here)
            assert reading.processes[idle].busy_ns == {"cpu": here[idle]}
            now = here[busy]
            assert isinstance(now, int) and abs(reading.processes[busy].busy_ns["cpu"] - now) < 50_000_000
        assert r._child is not None and not r._child.failure and r._last_told
    finally:
        short.kill()
        short.wait()
        r.close()
