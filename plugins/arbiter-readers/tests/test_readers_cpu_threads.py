"""``cpu_time`` with ``threads: true``: each thread its own engine, so the busiest thread
measures a job whose units run on one thread while others idle; with ``waiting: true`` a
thread's waits for a CPU count too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from arbiter.plugin import GpuReading, PluginContext, ProcessGpu
from arbiter_readers import CpuTimeReader
from arbiter_testing.waiting import wait_until

SPINNER = (
    "import threading, time\nthreading.Thread(target=lambda: time.sleep(60), daemon=True).start()\nwhile True: pass\n"
)


def busy_since(first: GpuReading, reading: GpuReading, pid: int) -> dict[str, int]:
    """Each engine's busy time between two readings, in nanoseconds."""
    before, after = first.processes[pid].busy_ns, reading.processes[pid].busy_ns
    return {e: after[e] - before.get(e, 0) for e in after}


def test_each_thread_is_an_engine_and_the_busy_one_shows(tmp_path: Path) -> None:
    reader = CpuTimeReader(CpuTimeReader.Options(threads=True), PluginContext(state_dir=tmp_path, stand_in_gpu=True))
    proc = subprocess.Popen([sys.executable, "-c", SPINNER])
    try:

        def both_threads() -> GpuReading | None:
            reading = reader.read([proc.pid])
            return reading if len(reading.processes.get(proc.pid, ProcessGpu()).busy_ns) >= 2 else None

        first = wait_until(both_threads, 10, "the spinner's second thread")

        def ran() -> GpuReading | None:
            reading = reader.read([proc.pid])
            return reading if max(busy_since(first, reading, proc.pid).values()) >= 200_000_000 else None

        # however long a loaded host takes to give the spinning thread 0.2 s of CPU, the
        # sleeping one runs not at all meanwhile (0.02 s: two clock ticks of the stat line)
        last = wait_until(ran, 30, "the spinning thread to run 0.2 s")
        engines = busy_since(first, last, proc.pid)
        assert len(engines) >= 2 and all(e.startswith("thread:") for e in engines)
        busiest = max(engines, key=engines.__getitem__)
        assert all(ns < 20_000_000 for e, ns in engines.items() if e != busiest), engines  # the sleeping one
    finally:
        proc.kill()
        proc.wait()
        reader.close()


PINNED_SPINNER = "import os\nos.sched_setaffinity(0, {%d})\nwhile True: pass\n"


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/proc/self/schedstat").exists(),
    reason="waits for a CPU are read from Linux's schedstat",
)
def test_waiting_counts_the_time_a_thread_was_ready_but_had_no_cpu(tmp_path: Path) -> None:
    # two spinners on one CPU: each runs at most about half the time (less where something
    # else wants that CPU too) and waits the rest; counted with its waits, each wanted the
    # engine all the time
    cpu = min(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", PINNED_SPINNER % cpu]) for _ in range(2)]
    context = PluginContext(state_dir=tmp_path, stand_in_gpu=True)
    ran = CpuTimeReader(CpuTimeReader.Options(threads=True), context)
    wanted = CpuTimeReader(CpuTimeReader.Options(threads=True, waiting=True), context)
    pid = spinners[0].pid
    main = f"thread:{pid}"
    try:
        # both started up and spinning on that CPU (the last thing each does first is to pin itself)
        pinned = [cpu]
        wait_until(lambda: all(psutil.Process(p.pid).cpu_affinity() == pinned for p in spinners), 10, "both pinned")
        wanted_first = wanted.read([pid])
        ran_first = ran.read([pid])

        def ran_enough() -> GpuReading | None:
            reading = ran.read([pid])
            return reading if busy_since(ran_first, reading, pid)[main] >= 300_000_000 else None

        # over the same stretch (the waits' reading around the other's), however long a
        # loaded host takes to give it 0.3 s of CPU: it waited at least about as long as it ran
        ran_last = wait_until(ran_enough, 30, "the spinner to run 0.3 s")
        wanted_last = wanted.read([pid])
        ran_ns = busy_since(ran_first, ran_last, pid)[main]
        wanted_ns = busy_since(wanted_first, wanted_last, pid)[main]
        print(f"ran {ran_ns / 1e9:.3f} s, ran or waited {wanted_ns / 1e9:.3f} s")
        assert wanted_ns > 1.5 * ran_ns
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
        ran.close()
        wanted.close()
