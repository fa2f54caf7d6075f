"""``cpu_time`` with ``threads: true``: each thread its own engine, so the busiest thread
measures a job whose units run on one thread while others idle."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from arbiter.plugin import PluginContext
from arbiter_readers import CpuTimeReader

SPINNER = (
    "import threading, time\n"
    "threading.Thread(target=lambda: time.sleep(60), daemon=True).start()\n"
    "while True: pass\n"
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
