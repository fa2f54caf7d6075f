"""``cpu_time`` with ``threads: true``: each thread its own engine, so the busiest thread
measures a job whose units run on one thread while others idle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
