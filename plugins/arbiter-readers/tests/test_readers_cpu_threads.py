"""``cpu_time`` with ``threads: true``: each thread its own engine, so the busiest thread
measures a job whose units run on one thread while others idle; with ``waiting: true`` a
thread's waits for a CPU count too."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arbiter.plugin import PluginContext
from arbiter_readers import CpuTimeReader

SPINNER = (
    "import threading, time\nthreading.Thread(target=lambda: time.sleep(60), daemon=True).start()\nwhile True: pass\n"
)


def test_each_thread_is_an_engine_and_the_busy_one_shows(tmp_path: Path) -> None:
    reader = CpuTimeReader(CpuTimeReader.Options(threads=True), PluginContext(state_dir=tmp_path, stand_in_gpu=True))
    proc = subprocess.Popen([sys.executable, "-c", SPINNER])
    try:
        time.sleep(0.3)
        first = reader.read([proc.pid])
        time.sleep(0.5)
        last = reader.read([proc.pid])
        engines = last.processes[proc.pid].busy_ns
        assert len(engines) >= 2 and all(e.startswith("thread:") for e in engines)
        interval = last.at_ns - first.at_ns
        shares = {e: (engines[e] - first.processes[proc.pid].busy_ns.get(e, 0)) / interval for e in engines}
        assert max(shares.values()) > 0.6  # the spinning main thread
        assert min(shares.values()) < 0.05  # the sleeping one
    finally:
        proc.kill()
        proc.wait()


PINNED_SPINNER = "import os\nos.sched_setaffinity(0, {%d})\nwhile True: pass\n"


def _share(reader: CpuTimeReader, pid: int, seconds: float) -> float:
    first = reader.read([pid])
    time.sleep(seconds)
    last = reader.read([pid])
    before, after = first.processes[pid].busy_ns, last.processes[pid].busy_ns
    return max(after[e] - before.get(e, 0) for e in after) / (last.at_ns - first.at_ns)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/proc/self/schedstat").exists(),
    reason="waits for a CPU are read from Linux's schedstat",
)
def test_waiting_counts_the_time_a_thread_was_ready_but_had_no_cpu(tmp_path: Path) -> None:
    # two spinners on one CPU: each runs about half the time and waits the other half;
    # counted with its waits, each wanted the engine all the time
    cpu = min(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", PINNED_SPINNER % cpu]) for _ in range(2)]
    context = PluginContext(state_dir=tmp_path, stand_in_gpu=True)
    ran = CpuTimeReader(CpuTimeReader.Options(threads=True), context)
    wanted = CpuTimeReader(CpuTimeReader.Options(threads=True, waiting=True), context)
    try:
        time.sleep(0.3)
        assert _share(ran, spinners[0].pid, 1.0) < 0.7
        assert _share(wanted, spinners[0].pid, 1.0) > 0.9
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
        ran.close()
        wanted.close()
